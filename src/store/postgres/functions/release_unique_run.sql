-- jobhost.release_unique_run: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0043_claims_found_by_key_functions.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.release_unique_run() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM jobhost.unique_claims c
    WHERE c.job_id = OLD.id AND c.lease_token = OLD.lease_token AND NOT c.attached;
    RETURN NULL;
END;
$$;
