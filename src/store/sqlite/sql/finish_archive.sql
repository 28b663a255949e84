-- Moves the runs that end for good to the archive, each matched on
-- (id, lease token): a token that changed (the job was taken over) matches
-- nothing (guarantee 5). $1 is a JSON array of
-- {id, lease_token, state, output?, error?, log, progress?}; $2 is now, $3 the
-- same as text, the time an error entry records.
--
-- Two statements, sent as one: the second takes the same runs out of
-- `jobs`, matched the same way, so the move costs one round trip to the
-- connection's thread.
INSERT INTO archive (id, job, queue, priority, payload, state, attempt, max_attempts, output, errors, log, progress,
                     enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id)
SELECT j.id, j.job, j.queue, j.priority, j.payload, i.value ->> 'state', j.attempt, j.max_attempts,
       i.value -> 'output',
       CASE WHEN i.value -> 'error' IS NULL THEN j.errors
            ELSE json_insert(j.errors, '$[#]', json_set(i.value -> 'error', '$.at', $3)) END,
       i.value -> 'log', coalesce(i.value -> 'progress', j.progress),
       j.enqueued_at, j.started_at, $2, j.host_id, j.concurrency_key, j.batch_id, j.parent_id
FROM json_each($1) i
JOIN jobs j ON j.id = i.value ->> 'id' AND j.lease_token = i.value ->> 'lease_token'
RETURNING id, job, concurrency_key, batch_id;

DELETE FROM jobs
WHERE (id, lease_token) IN (SELECT i.value ->> 'id', i.value ->> 'lease_token' FROM json_each($1) i);
