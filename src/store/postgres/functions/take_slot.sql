-- jobhost.take_slot: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0004_concurrency.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.take_slot(job_type text, slot_key text, slot_limit integer) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    taken boolean;
BEGIN
    INSERT INTO jobhost.semaphores AS s (job, key, holders) VALUES (job_type, slot_key, 1)
    ON CONFLICT (job, key) DO UPDATE SET holders = s.holders + 1, updated_at = now()
    WHERE s.holders < slot_limit
    RETURNING true INTO taken;
    RETURN coalesce(taken, false);
END;
$$;
