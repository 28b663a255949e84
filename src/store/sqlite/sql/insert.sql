-- Inserts new jobs into jobs with the ids they were given (job::place).
-- $1 is a JSON array of {id, job, queue, priority, payload, state,
-- max_attempts, run_at, concurrency_key?, parent_id?, batch_id?}; $2 is
-- now. The batches were counted first (batch::add_members).
INSERT INTO jobs (id, job, queue, priority, payload, state, max_attempts, run_at, enqueued_at, concurrency_key,
                  parent_id, batch_id)
SELECT i.value ->> 'id', i.value ->> 'job', i.value ->> 'queue', i.value ->> 'priority', i.value -> 'payload',
       i.value ->> 'state', i.value ->> 'max_attempts', i.value ->> 'run_at', $2, i.value ->> 'concurrency_key',
       i.value ->> 'parent_id', i.value ->> 'batch_id'
FROM json_each($1) i
