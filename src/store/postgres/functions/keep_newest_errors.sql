-- jobhost.keep_newest_errors: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0005_fault_tolerance.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.keep_newest_errors() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.errors := (
        SELECT jsonb_agg(x.e ORDER BY x.n)
        FROM jsonb_array_elements(NEW.errors) WITH ORDINALITY AS x(e, n)
        WHERE x.n > jsonb_array_length(NEW.errors) - 25
    );
    RETURN NEW;
END;
$$;
