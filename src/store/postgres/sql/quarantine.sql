-- Moves a live job ($1) to the archive as failed with a reason ($2) as its
-- newest error, keeping its earlier errors when $3 is true. Its unique key
-- goes with it, so its claim is found (0043).
WITH gone AS (DELETE FROM jobhost.jobs WHERE id = $1 RETURNING *)
INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                             progress, enqueued_at, started_at, finished_at, host_id, concurrency_key,
                             batch_id, parent_id, unique_key, key_carried)
SELECT id, job, queue, priority, payload, 'failed', attempt, max_attempts,
       CASE WHEN $3 THEN errors ELSE '[]'::jsonb END
           || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', now(), 'error', $2::text)),
       progress, enqueued_at, started_at, now(), host_id, concurrency_key, batch_id, parent_id, unique_key, true
FROM gone
