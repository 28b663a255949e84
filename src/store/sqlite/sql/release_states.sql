-- The keys a release gives slots back to: $1 is a JSON array of
-- [job, key, slots freed]. Each with its holders recorded and its type's
-- limit (NULL when the type no longer declares one).
SELECT k.value ->> 0, k.value ->> 1, k.value ->> 2,
       coalesce(s.holders, 0), json_extract(t.config, '$.concurrency.limit')
FROM json_each($1) k
LEFT JOIN semaphores s ON s.job = k.value ->> 0 AND s.key = k.value ->> 1
LEFT JOIN job_types t ON t.name = k.value ->> 0
