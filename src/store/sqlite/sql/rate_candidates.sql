-- The jobs a fetch of these job types ($1, a JSON array of [name,
-- lease_secs]) and queues ($2) would pick, up to $3, in fetch order (as
-- sql/fetch.sql picks them), with what their rate key is rendered from:
-- the type's declared rate limit (JSON, or null) and the job's concurrency
-- key. Read under the write lock, so the fetch that follows sees the same.
WITH types AS (
    SELECT t.value ->> 0 AS job FROM json_each($1) t
)
SELECT j.id, j.job, j.payload, j.concurrency_key, jt.config -> '$.rate_limit' AS rate_limit
FROM jobs j
JOIN types ty ON ty.job = j.job
JOIN job_types jt ON jt.name = j.job
LEFT JOIN unique_keys k ON k.job_id = j.id AND k.while_executing
WHERE j.state = 'available' AND j.queue IN (SELECT q.value FROM json_each($2) q)
  AND j.queue NOT IN (SELECT p.name FROM queue_pauses p)
  AND NOT EXISTS (SELECT 1 FROM unique_claims c WHERE c.job = k.job AND c.unique_key = k.unique_key)
ORDER BY j.priority, j.run_at, j.id
LIMIT +$3
