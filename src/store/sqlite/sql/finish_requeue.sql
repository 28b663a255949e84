-- Sends runs back to wait, each matched on (id, lease token): scheduled
-- after a backoff or snooze, available at once for a hand-back. $1 is a
-- JSON array of {id, lease_token, delay_ms, refund, error?, progress?}; $2 is now, $3 the
-- same as text, the time an error entry records.
UPDATE jobs
SET state = CASE WHEN i.value ->> 'delay_ms' > 0 THEN 'scheduled' ELSE 'available' END,
    run_at = $2 + (i.value ->> 'delay_ms'),
    attempt = jobs.attempt - (i.value ->> 'refund'),
    errors = CASE WHEN i.value -> 'error' IS NULL THEN jobs.errors
                  ELSE json_insert(jobs.errors, '$[#]', json_set(i.value -> 'error', '$.at', $3)) END,
    progress = coalesce(i.value -> 'progress', jobs.progress),
    lease_token = NULL,
    lease_secs = NULL,
    lease_expires_at = NULL,
    host_id = NULL
FROM json_each($1) i
WHERE jobs.id = i.value ->> 'id' AND jobs.lease_token = i.value ->> 'lease_token'
RETURNING jobs.id, jobs.state, jobs.job, jobs.concurrency_key
