-- Sends runs back to wait: a retry after its backoff, a snooze, or a run the
-- host stopped (which gives its attempt back). A job due now becomes
-- available at once; otherwise it is scheduled and the due-job sweep picks it up.
-- Locks: the matched job rows; a stale lease token matches nothing.
-- Returns each job's new state with its type and key: a limited job that
-- goes back to wait gives up its slot.
WITH input AS (
    SELECT *
    FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::int[], $5::jsonb[], $6::jsonb[])
        AS i(id, lease_token, delay_ms, refund, error, progress)
)
UPDATE jobhost.jobs j
SET state = CASE WHEN i.delay_ms > 0 THEN 'scheduled' ELSE 'available' END,
    run_at = now() + i.delay_ms * interval '1 millisecond',
    attempt = j.attempt - i.refund,
    errors = CASE WHEN i.error IS NULL THEN j.errors
                  ELSE j.errors || jsonb_build_array(i.error || jsonb_build_object('at', now())) END,
    progress = coalesce(i.progress, j.progress),
    lease_token = NULL,
    lease_secs = NULL,
    lease_expires_at = NULL,
    host_id = NULL
FROM input i
WHERE j.id = i.id AND j.lease_token = i.lease_token
RETURNING j.id, j.state, j.job, j.concurrency_key
