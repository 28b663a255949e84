-- jobhost.job_types_forward_only: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0006_forward_registration.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.job_types_forward_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    incoming bigint;
    stored   bigint;
BEGIN
    INSERT INTO jobhost.job_type_digests (name, digest) VALUES (NEW.name, NEW.digest)
        ON CONFLICT (name, digest) DO NOTHING;
    IF TG_OP = 'UPDATE' AND NEW.digest IS DISTINCT FROM OLD.digest THEN
        SELECT seq INTO incoming FROM jobhost.job_type_digests WHERE name = NEW.name AND digest = NEW.digest;
        SELECT seq INTO stored FROM jobhost.job_type_digests WHERE name = OLD.name AND digest = OLD.digest;
        IF incoming < stored THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN NEW;
END;
$$;
