-- jobhost.notify_available: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0012_quiet_promotions.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.notify_available() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF current_setting('jobhost.promotions_unannounced', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM new_jobs WHERE state = 'available') THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
    RETURN NULL;
END;
$$;
