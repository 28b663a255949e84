-- Every key with holders or blocked jobs: its limit, holder count, the
-- jobs holding its slots, and how many jobs are blocked and for how long
-- ($1 is now, in ms).
WITH keys AS (
    SELECT job, key FROM semaphores
    UNION
    SELECT job, concurrency_key FROM blocked_jobs
)
SELECT k.job, k.key,
       (SELECT json_extract(t.config, '$.concurrency.limit') FROM job_types t WHERE t.name = k.job)
           AS "limit",
       coalesce(s.holders, 0) AS holders,
       (SELECT coalesce(json_group_array(json_object('id', h.id, 'state', h.state, 'host_id', h.host_id)),
                        '[]')
        FROM (SELECT j.id, j.state, j.host_id FROM jobs j
              WHERE j.job = k.job AND j.concurrency_key = k.key AND j.state IN ('available', 'running')
              ORDER BY j.id) h) AS holding,
       (SELECT count(*) FROM blocked_jobs b WHERE b.job = k.job AND b.concurrency_key = k.key) AS blocked,
       (SELECT ($1 - min(b.parked_at)) / 1000.0 FROM blocked_jobs b
        WHERE b.job = k.job AND b.concurrency_key = k.key) AS oldest
FROM keys k
LEFT JOIN semaphores s ON s.job = k.job AND s.key = k.key
ORDER BY k.job, k.key
