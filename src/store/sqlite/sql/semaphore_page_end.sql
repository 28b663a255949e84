-- The last key of the repair's next page: the keys after ($1, $2) in
-- (job, key) order that have a semaphore row or live holders, at most $3;
-- with whether more keys follow it: (job, key, more). No row when no key
-- follows. Semaphores are read by their primary key; live holders' keys a
-- few probes of jobs_holders per key, by a recursion as in
-- promotable_keys.sql.
WITH RECURSIVE live(job, key, n) AS (
    SELECT $1, $2, 0
    UNION ALL
    SELECT coalesce((SELECT j.job FROM jobs j
                     WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
                       AND j.job = l.job AND j.concurrency_key > l.key LIMIT 1),
                    (SELECT j.job FROM jobs j
                     WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
                       AND j.job > l.job ORDER BY j.job LIMIT 1)),
           coalesce((SELECT j.concurrency_key FROM jobs j
                     WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
                       AND j.job = l.job AND j.concurrency_key > l.key ORDER BY j.concurrency_key LIMIT 1),
                    (SELECT j.concurrency_key FROM jobs j
                     WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
                       AND j.job = (SELECT j2.job FROM jobs j2
                                    WHERE j2.concurrency_key IS NOT NULL AND j2.state IN ('available', 'running')
                                      AND j2.job > l.job ORDER BY j2.job LIMIT 1)
                     ORDER BY j.concurrency_key LIMIT 1)),
           l.n + 1
    FROM live l
    WHERE l.job IS NOT NULL AND l.n <= $3
),
keys AS (
    SELECT job, key FROM (
        SELECT * FROM (SELECT s.job, s.key FROM semaphores s WHERE (s.job, s.key) > ($1, $2)
                       ORDER BY s.job, s.key LIMIT $3 + 1)
        UNION
        SELECT l.job, l.key FROM live l WHERE l.n > 0 AND l.job IS NOT NULL)
    ORDER BY job, key
    LIMIT $3 + 1
),
numbered AS (
    SELECT job, key, row_number() OVER (ORDER BY job, key) AS n, count(*) OVER () AS total FROM keys
)
SELECT job, key, total > $3 FROM numbered WHERE n = min(total, $3)
