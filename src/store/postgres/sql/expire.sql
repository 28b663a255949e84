-- Rescues jobs whose host stopped renewing their lease: back to available
-- with a note of what happened, or to the archive as failed when the
-- attempt that expired was the last (as cancelled when an operator asked
-- to cancel it: a cancelled job is never redelivered). The database clock decides (guarantee 10).
-- A requeued job keeps its concurrency slot (it is redelivered, and nothing
-- else may run beside it); a failed one's slot is returned for release.
-- Locks: expired running rows, SKIP LOCKED, so sweeps on several hosts
-- split the work instead of queueing behind each other. $2, when not null,
-- limits the sweep to those jobs (maintenance isolating a row it cannot process).
WITH expired AS (
    SELECT id
    FROM jobhost.jobs
    WHERE state = 'running' AND lease_expires_at < coalesce($1, now())
      AND ($2::bigint[] IS NULL OR id = ANY($2))
    ORDER BY lease_expires_at
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
),
noted AS (
    SELECT j.id, j.attempt >= j.max_attempts OR j.cancel_requested_at IS NOT NULL AS spent,
           j.cancel_requested_at IS NOT NULL AS cancelled,
           j.errors || jsonb_build_array(jsonb_build_object(
               'attempt', j.attempt, 'at', now(),
               'error', format('lease expired: host %s stopped during the run, attempt %s of %s',
                               j.host_id, j.attempt, j.max_attempts)
                        || CASE WHEN j.cancel_requested_at IS NOT NULL
                                THEN '; cancelled by an operator while running' ELSE '' END)) AS errors
    FROM jobhost.jobs j JOIN expired x ON x.id = j.id
),
failed AS (
    DELETE FROM jobhost.jobs j USING noted n
    WHERE j.id = n.id AND n.spent
    RETURNING j.*, n.errors AS new_errors, n.cancelled
),
archived AS (
    INSERT INTO jobhost.archive
        (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
         enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id)
    SELECT id, job, queue, priority, payload, CASE WHEN cancelled THEN 'cancelled' ELSE 'failed' END,
           attempt, max_attempts, new_errors, progress,
           enqueued_at, started_at, now(), host_id, concurrency_key, batch_id, parent_id
    FROM failed
    RETURNING id, job, concurrency_key
),
requeued AS (
    UPDATE jobhost.jobs j
    SET state = 'available', run_at = now(), errors = n.errors,
        lease_token = NULL, lease_secs = NULL, lease_expires_at = NULL, host_id = NULL
    FROM noted n
    WHERE j.id = n.id AND NOT n.spent
    RETURNING j.id
)
SELECT (SELECT count(*) FROM requeued),
       (SELECT count(*) FROM archived),
       (SELECT coalesce(array_agg(job), '{}') FROM archived WHERE concurrency_key IS NOT NULL),
       (SELECT coalesce(array_agg(concurrency_key), '{}') FROM archived WHERE concurrency_key IS NOT NULL)
