-- jobhost.expiry_charges: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0017_confirmed_leases.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.expiry_charges(j jobhost.jobs) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT j.confirmed_token IS NOT DISTINCT FROM j.lease_token OR j.unconfirmed_expiries >= 3
$$;
