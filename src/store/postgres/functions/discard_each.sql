-- jobhost.discard_each: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0043_claims_found_by_key_functions.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.discard_each(job_ids bigint[], reasons text[]) RETURNS void
    LANGUAGE sql
    AS $$
    WITH why AS (SELECT * FROM unnest(job_ids, reasons) AS w(id, reason)),
    moved AS (DELETE FROM jobhost.jobs j USING why w WHERE j.id = w.id RETURNING j.*, w.reason)
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                                 enqueued_at, started_at, finished_at, concurrency_key, batch_id, parent_id, unique_key, key_carried)
    SELECT id, job, queue, priority, payload, 'discarded', attempt, max_attempts,
           errors || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', now(), 'error', reason)),
           progress, enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id, unique_key, true
    FROM moved
$$;
