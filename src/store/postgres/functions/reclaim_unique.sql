-- jobhost.reclaim_unique: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0033_claims_hold_their_keys.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.reclaim_unique(revived_id bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    job_type text;
    job_payload jsonb;
    config jsonb;
    key text;
    while_executing boolean;
    claimant bigint;
BEGIN
    SELECT j.job, j.payload INTO job_type, job_payload FROM jobhost.jobs j WHERE j.id = revived_id;
    SELECT t.config INTO config FROM jobhost.job_types t WHERE t.name = job_type;
    IF jsonb_typeof(config -> 'unique') IS DISTINCT FROM 'object' THEN
        RETURN;
    END IF;
    key := jobhost.render_key(config -> 'unique' ->> 'key', job_payload);
    while_executing := config -> 'unique' ->> 'strategy' = 'while_executing';
    IF while_executing THEN
        INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
        VALUES (revived_id, job_type, key, true);
        RETURN;
    END IF;
    SELECT c.claimant INTO claimant FROM jobhost.claim_unique(ARRAY[job_type], ARRAY[key], ARRAY[revived_id]) c;
    IF claimant IS DISTINCT FROM revived_id THEN
        RAISE EXCEPTION 'job % cannot be retried while job % holds its unique key "%"', revived_id, claimant, key
            USING ERRCODE = 'JHU01';
    END IF;
END;
$$;
