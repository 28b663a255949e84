-- jobhost.lock_for_ending: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0016_lock_order.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.lock_for_ending(job_ids bigint[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM 1 FROM jobhost.jobs j WHERE j.id = ANY(job_ids) ORDER BY j.id FOR UPDATE;
    PERFORM 1 FROM jobhost.semaphores s
    WHERE (s.job, s.key) IN (SELECT j.job, j.concurrency_key FROM jobhost.jobs j
                             WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL)
    ORDER BY s.job, s.key
    FOR UPDATE;
    PERFORM 1 FROM jobhost.batches b
    WHERE b.id IN (SELECT j.batch_id FROM jobhost.jobs j WHERE j.id = ANY(job_ids)
                   UNION SELECT p.batch_id FROM jobhost.blocked_jobs p WHERE p.id = ANY(job_ids))
    ORDER BY b.id
    FOR UPDATE;
END;
$$;
