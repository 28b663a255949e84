-- The keyed schedules due by the clock ($1, or the statement's), of job
-- types a live host serves (it renewed its row within $3 of its own
-- heartbeats), oldest due first, at most $2, their rows locked until the
-- pass commits and skipped by other hosts' passes. With each: its type's
-- configuration and the fleet's latest pass over the type. Whether the job
-- of its latest tick is still live is read after, in a statement of its
-- own: this one's snapshot may predate the pass that enqueued that job
-- (the locked row itself is read as that pass left it).
WITH clock AS (SELECT coalesce($1::timestamptz, statement_timestamp()) AS now),
served AS (
    SELECT coalesce(array_agg(DISTINCT served_job), '{}') AS jobs
    FROM jobhost.hosts h, unnest(h.job_types) AS served_job
    WHERE h.last_seen_at >= now() - $3 * h.heartbeat_ms * interval '1 millisecond'
)
SELECT clock.now, s.job, s.key, s.cron, s.time_zone, s.payload, s.overlap, s.jitter_ms, s.backfill,
       s.starts_at, s.ends_at, s.note, s.since, s.last_tick, s.buffered_tick, s.triggered_at,
       s.handovers, s.last_job, t.config, l.looked_at, l.passed_at
FROM clock, served, jobhost.keyed_schedules s
JOIN jobhost.job_types t ON t.name = s.job
LEFT JOIN jobhost.schedule_looks l ON l.job = s.job
WHERE s.job = ANY (served.jobs) AND s.look_at <= clock.now AND NOT s.paused
ORDER BY s.look_at
LIMIT $2
FOR UPDATE OF s SKIP LOCKED
