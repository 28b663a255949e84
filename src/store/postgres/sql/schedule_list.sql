-- Every schedule with its job type's configuration, and whether a live host
-- serves the type (it renewed its row within $2 of its own heartbeats, by
-- the database's clock), with the clock ticks are read by: $1, or the
-- database's. One row of nulls but the clock when there is no schedule, so
-- the clock always comes back. Reads only; locks nothing.
WITH clock AS (SELECT coalesce($1::timestamptz, now()) AS now)
SELECT clock.now, s.job, s.since, s.last_tick, t.config, s.looked_at,
       EXISTS (SELECT 1 FROM jobhost.hosts h
               WHERE s.job = ANY (h.job_types)
                 AND h.last_seen_at >= now() - $2 * h.heartbeat_ms * interval '1 millisecond') AS served
FROM clock
LEFT JOIN (jobhost.schedules s JOIN jobhost.job_types t ON t.name = s.job) ON true
ORDER BY s.job
