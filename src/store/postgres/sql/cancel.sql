-- Cancels a waiting, available or blocked job ($1): it goes to the archive
-- as cancelled. Returns its type and, for an available limited job, the key
-- whose slot it held, for the caller to give back in the same transaction.
-- The job's unique key goes with it, so its claim is found (0043).
-- Locks: the job's row.
WITH cancelled AS (
    DELETE FROM jobhost.jobs WHERE id = $1 AND state IN ('scheduled', 'available')
    RETURNING *, state = 'available' AS held_slot
),
unblocked AS (
    DELETE FROM jobhost.blocked_jobs WHERE id = $1
    RETURNING id, job, queue, priority, payload, attempt, max_attempts, errors, progress, enqueued_at,
              started_at, concurrency_key, batch_id, parent_id, unique_key, false AS held_slot
),
gone AS (
    SELECT id, job, queue, priority, payload, attempt, max_attempts, errors, progress, enqueued_at,
           started_at, concurrency_key, batch_id, parent_id, unique_key, held_slot
    FROM cancelled
    UNION ALL
    SELECT * FROM unblocked
),
archived AS (
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                 progress, enqueued_at, started_at, finished_at, concurrency_key, batch_id,
                                 parent_id, unique_key, key_carried)
    SELECT id, job, queue, priority, payload, 'cancelled', attempt, max_attempts, errors, progress,
           enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id, unique_key, true
    FROM gone
)
SELECT job, CASE WHEN held_slot THEN concurrency_key END FROM gone
