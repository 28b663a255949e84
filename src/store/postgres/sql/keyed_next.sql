-- The clock of a pass ($1, or its transaction's start: before its scan's
-- snapshot), and the earliest time a keyed schedule of a type a live host
-- serves must be looked at, found through the (job, look_at) index one
-- served type at a time.
SELECT coalesce($1::timestamptz, now()) AS now,
       (SELECT min(next.look_at)
        FROM (SELECT DISTINCT served_job FROM jobhost.hosts h, unnest(h.job_types) AS served_job
              WHERE h.last_seen_at >= now() - $2 * h.heartbeat_ms * interval '1 millisecond') served,
             LATERAL (SELECT s.look_at FROM jobhost.keyed_schedules s
                      WHERE s.job = served.served_job AND s.look_at IS NOT NULL AND NOT s.paused
                      ORDER BY s.look_at LIMIT 1) next) AS next_look
