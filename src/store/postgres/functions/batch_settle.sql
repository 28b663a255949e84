-- jobhost.batch_settle: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0009_batches.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.batch_settle() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    b jobhost.batches;
    payload jsonb;
    kind text;
    callback text;
    jobs jsonb := '{}';
    errors jsonb := '{}';
BEGIN
    UPDATE jobhost.batches
    SET finished_at = now()
    WHERE id = NEW.id AND finished_at IS NULL AND closed_at IS NOT NULL
      AND completed + failed + discarded + cancelled >= total
    RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    payload := jobhost.batch_callback_payload(b);
    FOR kind, callback IN
        SELECT k, t FROM (VALUES
            ('on_finish', b.on_finish),
            ('on_success', CASE WHEN b.failed + b.discarded = 0 THEN b.on_success END),
            ('on_failure', CASE WHEN b.failed + b.discarded > 0 THEN b.on_failure END)) AS c(k, t)
        WHERE t IS NOT NULL
    LOOP
        BEGIN
            jobs := jobs || jsonb_build_object(kind, jobhost.enqueue(callback, payload));
        EXCEPTION
            WHEN serialization_failure OR deadlock_detected THEN
                RAISE;
            WHEN OTHERS THEN
                errors := errors || jsonb_build_object(kind, SQLERRM);
        END;
    END LOOP;
    UPDATE jobhost.batches SET callback_jobs = jobs, callback_errors = errors WHERE id = b.id;
    RETURN NULL;
END;
$$;
