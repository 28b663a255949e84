-- Batches newest first ($1 one id, or null for all; $2 at most this many),
-- with what is read from their live members: how many run now, and the sum
-- of the fractions of work their latest progress reports (done / total).
SELECT b.id, b.label, b.created_at, b.closed_at, b.finished_at, b.total, b.completed, b.failed, b.discarded,
       b.cancelled, b.on_finish, b.on_success, b.on_failure, b.callback_payload, b.callback_jobs,
       b.callback_errors,
       (SELECT count(*) FROM jobhost.jobs j WHERE j.batch_id = b.id AND j.state = 'running') AS running,
       (SELECT coalesce(sum(least(1.0, greatest(0.0,
                    (l.progress ->> 'done')::float8 / nullif((l.progress ->> 'total')::float8, 0)))), 0)::float8
        FROM (SELECT j.progress FROM jobhost.jobs j WHERE j.batch_id = b.id AND j.progress IS NOT NULL
              UNION ALL
              SELECT k.progress FROM jobhost.blocked_jobs k WHERE k.batch_id = b.id AND k.progress IS NOT NULL) l
       ) AS live_done
FROM jobhost.batches b
WHERE $1::bigint IS NULL OR b.id = $1
ORDER BY b.id DESC
LIMIT $2
