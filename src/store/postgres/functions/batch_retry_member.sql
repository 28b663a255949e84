-- jobhost.batch_retry_member: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0009_batches.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.batch_retry_member(member bigint, batch bigint, ended_state text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE jobhost.batches
    SET completed = completed - (ended_state = 'completed')::int,
        failed = failed - (ended_state = 'failed')::int,
        discarded = discarded - (ended_state = 'discarded')::int,
        cancelled = cancelled - (ended_state = 'cancelled')::int
    WHERE id = batch AND finished_at IS NULL;
    IF NOT FOUND THEN
        UPDATE jobhost.jobs SET batch_id = NULL WHERE id = member;
    END IF;
END;
$$;
