-- The keys a gate decides: $1 is a JSON array of [job, key]. Each with its
-- holders recorded, its type's limit (NULL when the type no longer
-- declares one) and its type's on_conflict (NULL: block).
SELECT k.value ->> 0 AS job, k.value ->> 1 AS key, coalesce(s.holders, 0) AS holders,
       json_extract(t.config, '$.concurrency.limit') AS "limit",
       json_extract(t.config, '$.concurrency.on_conflict') AS on_conflict
FROM json_each($1) k
LEFT JOIN semaphores s ON s.job = k.value ->> 0 AND s.key = k.value ->> 1
LEFT JOIN job_types t ON t.name = k.value ->> 0
