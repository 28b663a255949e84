-- jobhost.replace_waiting: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0007_uniqueness.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.replace_waiting(claimant bigint, new_payload jsonb, due timestamp with time zone, new_key text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE jobhost.jobs j
    SET payload = new_payload,
        run_at = greatest(due, now()),
        state = CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END
    WHERE j.id = claimant AND j.state IN ('scheduled', 'available')
      AND j.concurrency_key IS NULL AND new_key IS NULL;
    IF FOUND THEN
        IF due <= now() THEN
            PERFORM pg_notify('jobhost_available', '');
        END IF;
        RETURN true;
    END IF;
    UPDATE jobhost.jobs j SET payload = new_payload
    WHERE j.id = claimant AND j.state IN ('scheduled', 'available') AND j.concurrency_key = new_key;
    RETURN FOUND;
END;
$$;
