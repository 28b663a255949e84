-- jobhost.park: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0043_claims_found_by_key_functions.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.park(job_ids bigint[]) RETURNS void
    LANGUAGE sql
    AS $$
    WITH moved AS (DELETE FROM jobhost.jobs WHERE id = ANY(job_ids) RETURNING *)
    INSERT INTO jobhost.blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
                                      started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key)
    SELECT id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
           started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key
    FROM moved
$$;
