-- Ends runs for good: moves each job whose lease token still matches from
-- the live table to the archive, appending the attempt's error if any.
-- Locks: the matched job rows (DELETE); a row whose token changed (another
-- host owns it now) is not matched and stays untouched (guarantee 5).
-- Returns each archived job's type and key: the slot it gave up.
WITH input AS (
    SELECT *
    FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::jsonb[], $5::jsonb[], $6::jsonb[], $7::jsonb[])
        AS i(id, lease_token, state, output, error, log, progress)
),
ended AS (
    DELETE FROM jobhost.jobs j
    USING input i
    WHERE j.id = i.id AND j.lease_token = i.lease_token
    RETURNING j.*
)
INSERT INTO jobhost.archive
    (id, job, queue, priority, payload, state, attempt, max_attempts, output, errors, log, progress,
     enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id)
SELECT e.id, e.job, e.queue, e.priority, e.payload, i.state, e.attempt, e.max_attempts, i.output,
       CASE WHEN i.error IS NULL THEN e.errors
            ELSE e.errors || jsonb_build_array(i.error || jsonb_build_object('at', now())) END,
       i.log, coalesce(i.progress, e.progress),
       e.enqueued_at, e.started_at, now(), e.host_id, e.concurrency_key, e.batch_id, e.parent_id
FROM ended e
JOIN input i ON i.id = e.id
RETURNING id, job, concurrency_key
