-- Writes new jobs the gate blocked straight into blocked_jobs (rows as
-- insert.sql reads them; $2 is now): never inserted into jobs, they hold
-- no slot and wait for one as any blocked job.
INSERT INTO blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at, concurrency_key,
                          batch_id, parent_id, errors, parked_at)
SELECT i.value ->> 'id', i.value ->> 'job', i.value ->> 'queue', i.value ->> 'priority', i.value -> 'payload', 0,
       i.value ->> 'max_attempts', $2, i.value ->> 'concurrency_key', i.value ->> 'batch_id', i.value ->> 'parent_id',
       '[]', $2
FROM json_each($1) i
