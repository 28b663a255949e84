-- The keys with blocked jobs after ($1, $2) in (job, key) order, at most
-- $3, each with whether it could take a slot now (no semaphore row, or fewer
-- holders than the limit): (job, key, promotable). Each step of the
-- recursion finds the next key with a few probes of blocked_jobs_next
-- (job, concurrency_key, ...), however many jobs a key has blocked: the
-- next key of the same job type, else the first key of the next type. (A
-- row value compared with another row's columns is not a range SQLite
-- searches an index by; equality on job then a range on the key is.) The
-- recursion starts at the place itself (step 0) and stops when the page is full.
WITH RECURSIVE page(job, key, n) AS (
    SELECT $1, $2, 0
    UNION ALL
    SELECT coalesce((SELECT b.job FROM blocked_jobs b
                     WHERE b.job = p.job AND b.concurrency_key > p.key LIMIT 1),
                    (SELECT b.job FROM blocked_jobs b WHERE b.job > p.job ORDER BY b.job LIMIT 1)),
           coalesce((SELECT b.concurrency_key FROM blocked_jobs b
                     WHERE b.job = p.job AND b.concurrency_key > p.key ORDER BY b.concurrency_key LIMIT 1),
                    (SELECT b.concurrency_key FROM blocked_jobs b
                     WHERE b.job = (SELECT b2.job FROM blocked_jobs b2 WHERE b2.job > p.job ORDER BY b2.job LIMIT 1)
                     ORDER BY b.concurrency_key LIMIT 1)),
           p.n + 1
    FROM page p
    WHERE p.job IS NOT NULL AND p.n < $3
)
SELECT p.job, p.key,
       s.job IS NULL
       OR s.holders < coalesce((SELECT json_extract(t.config, '$.concurrency.limit')
                                FROM job_types t WHERE t.name = p.job), 2147483647)
FROM page p
LEFT JOIN semaphores s ON s.job = p.job AND s.key = p.key
WHERE p.n > 0 AND p.job IS NOT NULL
ORDER BY p.job, p.key
