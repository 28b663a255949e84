-- jobhost.promote_parked: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0043_claims_found_by_key_functions.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.promote_parked(job_type text, slot_key text) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    slot_limit integer := jobhost.slot_limit(job_type);
    next_id bigint;
    moved integer := 0;
BEGIN
    LOOP
        SELECT b.id INTO next_id FROM jobhost.blocked_jobs b
        WHERE b.job = job_type AND b.concurrency_key = slot_key
        ORDER BY b.priority, b.parked_at, b.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        EXIT WHEN next_id IS NULL OR NOT jobhost.take_slot(job_type, slot_key, slot_limit);
        WITH p AS (DELETE FROM jobhost.blocked_jobs WHERE id = next_id RETURNING *)
        INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, attempt, max_attempts, run_at,
                                  enqueued_at, started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key)
        SELECT id, job, queue, priority, payload, 'available', attempt, max_attempts, now(),
               enqueued_at, started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key
        FROM p;
        moved := moved + 1;
    END LOOP;
    RETURN moved;
END;
$$;
