-- jobhost.expiry_ends: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0017_confirmed_leases.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.expiry_ends(j jobhost.jobs) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT j.cancel_requested_at IS NOT NULL OR (jobhost.expiry_charges(j) AND j.attempt >= j.max_attempts)
$$;
