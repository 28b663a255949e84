-- jobhost.batch_close: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0009_batches.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.batch_close(batch bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE jobhost.batches SET closed_at = now() WHERE id = batch AND closed_at IS NULL;
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM jobhost.batches WHERE id = batch) THEN
        RAISE EXCEPTION 'batch % does not exist', batch USING ERRCODE = '22023';
    END IF;
    RETURN false;
END;
$$;
