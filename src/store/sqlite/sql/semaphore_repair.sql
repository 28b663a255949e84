-- Over the keys after ($1, $2) up to and including ($3, $4): semaphores
-- whose holder count disagrees with the live jobs holding their slots, and
-- keys held by live jobs with no semaphore row: (job, key, recorded,
-- actual). Range scans of the semaphores' primary key and of jobs_holders.
SELECT job, key, recorded, actual FROM (
    SELECT s.job, s.key, s.holders AS recorded,
           (SELECT count(*) FROM jobs j
            WHERE j.job = s.job AND j.concurrency_key = s.key
              AND j.state IN ('available', 'running')) AS actual
    FROM semaphores s
    WHERE (s.job, s.key) > ($1, $2) AND (s.job, s.key) <= ($3, $4))
WHERE recorded <> actual
UNION ALL
SELECT j.job, j.concurrency_key, 0, count(*) FROM jobs j
WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
  AND (j.job, j.concurrency_key) > ($1, $2) AND (j.job, j.concurrency_key) <= ($3, $4)
  AND NOT EXISTS (SELECT 1 FROM semaphores s WHERE s.job = j.job AND s.key = j.concurrency_key)
GROUP BY 1, 2
ORDER BY 1, 2
