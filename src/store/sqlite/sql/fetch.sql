-- Leases up to $3 available jobs of the given queues ($2, a JSON array, less
-- the paused ones) and
-- job types ($1, a JSON array of [name, lease_secs]) to host $4, in fetch
-- order (priority, then run time, then id); only those of $6 (a JSON array
-- of ids: the ones a rate-governed fetch may start, see `rate::admit`)
-- unless it is null. The caller holds the write lock, so no other fetch
-- can pick the same rows.
--
-- Two statements, sent as one round trip to the connection's thread: the
-- first reserves $3 lease tokens (those no job takes are never used), the
-- second leases jobs with tokens base + 1, base + 2, ..., and says of each
-- whether it has a while_executing key, whose claim the caller then takes.
--
-- The limit is `+$3`, not `$3`: SQLite plans a statement whose LIMIT is a
-- bare parameter with the value bound and plans it again whenever the value
-- changes, and a host's budget changes from one fetch to the next. Not
-- knowing the limit, the planner could scan every job for the final
-- update; `jobs.id IN picked` keeps it to looking the picked rows up by id.
UPDATE counters SET value = value + $3 WHERE name = 'lease_token';

WITH types AS (
    SELECT t.value ->> 0 AS job, t.value ->> 1 AS lease_secs FROM json_each($1) t
),
candidates AS MATERIALIZED (
    SELECT j.id, ty.lease_secs, j.priority, j.run_at, k.job AS exclusive_job, k.unique_key AS exclusive_key
    FROM jobs j
    JOIN types ty ON ty.job = j.job
    LEFT JOIN unique_keys k ON k.job_id = j.id AND k.while_executing
    WHERE j.state = 'available' AND j.queue IN (SELECT q.value FROM json_each($2) q)
      AND j.queue NOT IN (SELECT p.name FROM queue_pauses p)
      -- A while_executing job whose key a run holds is passed over, in place.
      AND NOT EXISTS (SELECT 1 FROM unique_claims c WHERE c.job = k.job AND c.unique_key = k.unique_key)
      AND ($6 IS NULL OR j.id IN (SELECT r.value FROM json_each($6) r))
    ORDER BY j.priority, j.run_at, j.id
    LIMIT +$3
),
picked AS (
    SELECT c.id, c.lease_secs, row_number() OVER (ORDER BY c.priority, c.run_at, c.id) AS n
    FROM candidates c
    -- Of two while_executing jobs of one key, only the first is leased.
    WHERE NOT EXISTS (
        SELECT 1 FROM candidates e
        WHERE e.exclusive_job = c.exclusive_job AND e.exclusive_key = c.exclusive_key
          AND (e.priority, e.run_at, e.id) < (c.priority, c.run_at, c.id))
)
UPDATE jobs
SET state = 'running',
    attempt = jobs.attempt + 1,
    lease_token = (SELECT value - $3 FROM counters WHERE name = 'lease_token') + p.n,
    lease_secs = p.lease_secs,
    lease_expires_at = $5 + p.lease_secs * 1000,
    host_id = $4,
    started_at = $5
FROM picked p
WHERE jobs.id = p.id AND jobs.id IN (SELECT id FROM picked)
RETURNING jobs.id, jobs.lease_token, jobs.job, jobs.queue, jobs.payload, jobs.attempt, jobs.max_attempts,
          jobs.enqueued_at, jobs.batch_id, jobs.concurrency_key, jobs.lease_secs,
          EXISTS (SELECT 1 FROM unique_keys k WHERE k.job_id = jobs.id AND k.while_executing) AS while_executing
