-- jobhost.enqueue_as: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0033_claims_hold_their_keys.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.enqueue_as(new_id bigint, job text, payload jsonb, queue text DEFAULT NULL::text, priority smallint DEFAULT NULL::smallint, run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, batch_id bigint DEFAULT NULL::bigint) RETURNS bigint
    LANGUAGE plpgsql
    AS $_$
#variable_conflict use_variable
DECLARE
    config jsonb;
    claimant bigint;
    due timestamptz := greatest(coalesce(run_at, now()), now());
    chosen_queue text;
    concurrency_key text;
    unique_key text;
    while_executing boolean;
    on_duplicate text;
    payload_bytes bigint;
    -- The database's setting, like the host's --max-payload (1 MiB unless set).
    max_payload_bytes bigint :=
        coalesce(nullif(current_setting('jobhost.max_payload_bytes', true), '')::bigint, 1048576);
BEGIN
    SELECT t.config INTO config FROM jobhost.job_types t WHERE t.name = job;
    IF config IS NULL THEN
        RAISE EXCEPTION 'unknown job type "%": no host has loaded a component for it', job USING ERRCODE = '22023';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'payload of job "%" must be a JSON object', job USING ERRCODE = '22023';
    END IF;
    payload_bytes := octet_length(payload::text);
    IF payload_bytes > max_payload_bytes THEN
        RAISE EXCEPTION 'payload of job "%" is % bytes of JSON, more than the largest accepted, % bytes',
            job, payload_bytes, max_payload_bytes USING ERRCODE = '22023';
    END IF;
    chosen_queue := coalesce(queue, config ->> 'queue');
    IF chosen_queue !~ '^[a-z0-9_.-]{1,128}$' THEN
        RAISE EXCEPTION 'queue "%" must be 1 to 128 characters of a-z, 0-9, _, . and -', chosen_queue
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(config -> 'concurrency') = 'object' THEN
        concurrency_key := jobhost.render_key(config -> 'concurrency' ->> 'key', payload);
    END IF;
    IF jsonb_typeof(config -> 'unique') = 'object' THEN
        unique_key := jobhost.render_key(config -> 'unique' ->> 'key', payload);
        while_executing := config -> 'unique' ->> 'strategy' = 'while_executing';
        on_duplicate := coalesce(config -> 'unique' ->> 'on_duplicate', 'skip');
        IF NOT while_executing THEN
            SELECT c.claimant INTO claimant
            FROM jobhost.claim_unique(ARRAY[job], ARRAY[unique_key], ARRAY[new_id]) c;
            IF claimant IS DISTINCT FROM new_id THEN
                IF on_duplicate = 'raise' THEN
                    RAISE EXCEPTION 'job "%" with unique key "%" is a duplicate of job %', job, unique_key, claimant
                        USING ERRCODE = 'JHU01';
                ELSIF on_duplicate = 'replace' THEN
                    PERFORM jobhost.replace_waiting(claimant, payload, due, concurrency_key);
                END IF;
                RETURN claimant;
            END IF;
        END IF;
    END IF;
    INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, max_attempts, run_at, concurrency_key,
                              batch_id)
    VALUES (
        new_id,
        job,
        chosen_queue,
        coalesce(priority, (config ->> 'priority')::smallint),
        payload,
        CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END,
        (config ->> 'max_attempts')::integer,
        due,
        concurrency_key,
        batch_id
    );
    IF while_executing THEN
        INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
        VALUES (new_id, job, unique_key, true);
    END IF;
    IF due <= now() THEN
        PERFORM jobhost.admit(ARRAY[new_id], true);
    END IF;
    IF batch_id IS NOT NULL THEN
        PERFORM jobhost.batch_add_members(ARRAY[batch_id], ARRAY[false]);
    END IF;
    RETURN new_id;
END;
$_$;
