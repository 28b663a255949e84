-- jobhost.release_slots: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0013_promotions_leased.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.release_slots(job_types text[], slot_keys text[]) RETURNS integer
    LANGUAGE sql
    AS $$
    SELECT r.promoted FROM jobhost.release_slots_leasing(job_types, slot_keys, '{}', '{}', '{}', 0, '') r;
$$;
