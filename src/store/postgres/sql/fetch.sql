-- Leases up to $4 available jobs of the served queues ($1) and job types
-- ($2, with lease lengths $3) to host $5.
-- Locks: the chosen job rows, FOR UPDATE SKIP LOCKED, so concurrent
-- fetchers never wait on each other and never take the same job. The
-- partial index jobs_fetch is already in fetch order, so this reads the
-- first matching rows and stops.
WITH picked AS (
    SELECT j.id
    FROM jobhost.jobs j
    WHERE j.state = 'available'
      AND j.queue = ANY($1::text[])
      AND j.job = ANY($2::text[])
    ORDER BY j.priority, j.run_at, j.id
    LIMIT $4
    FOR UPDATE SKIP LOCKED
),
leases AS (
    SELECT p.id, s.lease_secs
    FROM picked p
    JOIN jobhost.jobs j ON j.id = p.id
    JOIN unnest($2::text[], $3::int[]) AS s(job, lease_secs) ON s.job = j.job
)
UPDATE jobhost.jobs j
SET state = 'running',
    attempt = j.attempt + 1,
    lease_token = nextval('jobhost.lease_tokens'),
    lease_secs = l.lease_secs,
    lease_expires_at = now() + l.lease_secs * interval '1 second',
    host_id = $5,
    started_at = now()
FROM leases l
WHERE j.id = l.id
RETURNING j.id, j.lease_token, j.job, j.queue, j.payload, j.attempt, j.max_attempts,
          j.enqueued_at, j.batch_id, j.concurrency_key, j.lease_secs
