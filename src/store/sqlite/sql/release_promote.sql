-- Promotes blocked jobs into free slots: $1 is a JSON array of
-- [job, key, free slots], $2 the time. Each key's jobs are walked in
-- promotion order (highest priority, then oldest) one index seek of
-- blocked_jobs_next at a time, as many as the key has free slots, so the
-- cost follows the jobs promoted and never the jobs parked.
WITH RECURSIVE
    wanted (job, key, free) AS (
        SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each($1)
    ),
    walk (job, key, free, taken, id, priority, parked_at) AS (
        SELECT w.job, w.key, w.free, 1, b.id, b.priority, b.parked_at
        FROM wanted w
        JOIN blocked_jobs b ON b.id = (
            SELECT id FROM blocked_jobs
            WHERE job = w.job AND concurrency_key = w.key
            ORDER BY priority, parked_at, id LIMIT 1)
        WHERE w.free > 0
        UNION ALL
        SELECT n.job, n.key, n.free, n.taken + 1, b.id, b.priority, b.parked_at
        FROM walk n
        JOIN blocked_jobs b ON b.id = (
            SELECT id FROM blocked_jobs
            WHERE job = n.job AND concurrency_key = n.key
              AND (priority, parked_at, id) > (n.priority, n.parked_at, n.id)
            ORDER BY priority, parked_at, id LIMIT 1)
        WHERE n.taken < n.free
    )
INSERT INTO jobs (id, job, queue, priority, payload, state, attempt, max_attempts, run_at, enqueued_at,
                  started_at, concurrency_key, batch_id, parent_id, errors, progress)
SELECT id, job, queue, priority, payload, 'available', attempt, max_attempts, $2, enqueued_at,
       started_at, concurrency_key, batch_id, parent_id, errors, progress
FROM blocked_jobs WHERE id IN (SELECT id FROM walk)
RETURNING id, job, concurrency_key
