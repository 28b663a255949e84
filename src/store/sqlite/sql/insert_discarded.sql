-- Writes new jobs the gate discarded straight into the archive (rows as
-- insert.sql reads them, each with its error entry in `discarded`; $2 is
-- now). The archive's triggers count them in their batches and give back
-- their unique keys, as for any discarded job.
INSERT INTO archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, enqueued_at,
                     finished_at, concurrency_key, batch_id, parent_id)
SELECT i.value ->> 'id', i.value ->> 'job', i.value ->> 'queue', i.value ->> 'priority', i.value -> 'payload',
       'discarded', 0, i.value ->> 'max_attempts', json_array(json(i.value -> 'discarded')), $2, $2,
       i.value ->> 'concurrency_key', i.value ->> 'batch_id', i.value ->> 'parent_id'
FROM json_each($1) i
