-- jobhost.promote_due: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0004_concurrency.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.promote_due(due_by timestamp with time zone, max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    due_ids bigint[];
    admitted integer;
BEGIN
    SELECT array_agg(d.id) INTO due_ids FROM (
        SELECT id FROM jobhost.jobs
        WHERE state = 'scheduled' AND run_at <= due_by
        ORDER BY run_at
        LIMIT max_jobs
        FOR UPDATE SKIP LOCKED
    ) d;
    IF due_ids IS NULL THEN
        RETURN 0;
    END IF;
    admitted := jobhost.admit(due_ids, false);
    IF admitted > 0 THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
    RETURN cardinality(due_ids);
END;
$$;
