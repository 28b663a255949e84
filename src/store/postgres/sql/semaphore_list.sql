-- Every key with holders or blocked jobs: its limit, holder count, the
-- jobs holding its slots, and how many jobs are blocked and for how long.
WITH keys AS (
    SELECT job, key FROM jobhost.semaphores
    UNION
    SELECT DISTINCT job, concurrency_key FROM jobhost.blocked_jobs
)
SELECT k.job, k.key,
       (SELECT (t.config -> 'concurrency' ->> 'limit')::integer
        FROM jobhost.job_types t WHERE t.name = k.job) AS "limit",
       coalesce(s.holders, 0) AS holders,
       coalesce((SELECT jsonb_agg(jsonb_build_object('id', j.id, 'state', j.state, 'host_id', j.host_id)
                                  ORDER BY j.id)
                 FROM jobhost.jobs j
                 WHERE j.job = k.job AND j.concurrency_key = k.key
                   AND j.state IN ('available', 'running')), '[]') AS holding,
       (SELECT count(*) FROM jobhost.blocked_jobs b
        WHERE b.job = k.job AND b.concurrency_key = k.key) AS blocked,
       (SELECT extract(epoch FROM now() - min(b.parked_at))::float8
        FROM jobhost.blocked_jobs b
        WHERE b.job = k.job AND b.concurrency_key = k.key) AS oldest_blocked_secs
FROM keys k
LEFT JOIN jobhost.semaphores s ON s.job = k.job AND s.key = k.key
ORDER BY k.job, k.key
