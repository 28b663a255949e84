-- jobhost.event_send, jobhost.send_event: their current definitions.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
--
-- Sends an event in the caller's transaction: stores it, enqueues one job
-- of each type subscribed to its key (`on_events`, with the event's
-- payload; a type whose enqueue is refused, by its payload or a `raise`
-- limit, is recorded in `events.jobs` with the reason instead, and the
-- event still sent), and ends every armed wait for its key whose match its
-- payload holds, releasing their steps. A transaction that rolls back sends nothing; one that commits
-- sends it once. With an idempotency key already used, nothing is stored
-- or released and the first event's id comes back (`duplicate`).
--
-- The key's lock is held shared until the transaction ends, so a wait for
-- the key is armed either before (this statement's scan sees it) or after
-- (its look back sees this event): DESIGN guarantee 17. That needs each
-- statement's own snapshot: under REPEATABLE READ or SERIALIZABLE the scan
-- could miss a wait armed after the transaction began, so those refuse.

CREATE OR REPLACE FUNCTION jobhost.event_send(event_key text, event_payload jsonb, idempotency text DEFAULT NULL,
                                              event_source text DEFAULT 'sql',
                                              OUT id bigint, OUT released integer, OUT duplicate boolean)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    AS $$
#variable_conflict use_variable
DECLARE
    open_waits bigint[];
    subscriber text;
    config jsonb;
    unrendered text;
    job_id bigint;
    jobs jsonb := '[]';
    max_payload_bytes bigint :=
        coalesce(nullif(current_setting('jobhost.max_payload_bytes', true), '')::bigint, 1048576);
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'jobhost.send_event needs a READ COMMITTED transaction, not %',
            upper(current_setting('transaction_isolation')) USING ERRCODE = '0A000';
    END IF;
    IF event_key IS NULL OR octet_length(event_key) NOT BETWEEN 1 AND 256 OR event_key ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid event: event key "%" must be 1 to 256 bytes without control characters',
            coalesce(event_key, 'null') USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(event_payload) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'invalid event: an event''s payload must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF octet_length(event_payload::text) > max_payload_bytes THEN
        RAISE EXCEPTION 'invalid event: an event''s payload is % bytes of JSON, more than the most accepted, %',
            octet_length(event_payload::text), max_payload_bytes USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('jobhost.event ' || event_key, 0));
    INSERT INTO jobhost.events AS e (key, payload, idempotency_key, source)
    VALUES (event_key, event_payload, idempotency, event_source)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING e.id INTO id;
    IF id IS NULL THEN
        SELECT e.id, e.released INTO id, released FROM jobhost.events e WHERE e.idempotency_key = idempotency;
        duplicate := true;
        RETURN;
    END IF;
    duplicate := false;
    -- One job per subscribed type, in this transaction: exactly once per
    -- event and type. A refusal is the type's, not the sender's: a key its
    -- payload cannot render is found before the enqueue; a type that may
    -- refuse at its enqueue (a `raise` limit or uniqueness) is enqueued in
    -- a subtransaction of its own, and only such a type: a run sending many
    -- events would otherwise take a subtransaction id for each, past the
    -- 64 a backend caches, which slows every snapshot in the cluster.
    FOR subscriber, config IN
        SELECT t.name, t.config FROM jobhost.job_types t WHERE t.config -> 'on_events' ? event_key ORDER BY t.name
    LOOP
        unrendered := (SELECT k FROM unnest(ARRAY[config -> 'concurrency' ->> 'key', config -> 'unique' ->> 'key',
                                                   config -> 'rate_limit' ->> 'key']) k
                       WHERE k IS NOT NULL AND NOT jobhost.key_renders(k, event_payload) LIMIT 1);
        IF unrendered IS NOT NULL THEN
            jobs := jobs || jsonb_build_object('job', subscriber, 'error',
                format('the event''s payload cannot render its key "%s"', unrendered));
        ELSIF config -> 'concurrency' ->> 'on_conflict' = 'raise' OR config -> 'unique' ->> 'on_duplicate' = 'raise' THEN
            BEGIN
                job_id := jobhost.enqueue(subscriber, event_payload);
                jobs := jobs || jsonb_build_object('job', subscriber, 'id', job_id);
            EXCEPTION WHEN SQLSTATE '22023' OR SQLSTATE 'JHU01' OR SQLSTATE 'JHL01' THEN
                jobs := jobs || jsonb_build_object('job', subscriber, 'error', SQLERRM);
            END;
        ELSE
            job_id := jobhost.enqueue(subscriber, event_payload);
            jobs := jobs || jsonb_build_object('job', subscriber, 'id', job_id);
        END IF;
    END LOOP;
    IF jobs <> '[]' THEN
        UPDATE jobhost.events e SET jobs = jobs WHERE e.id = id;
    END IF;
    -- Waits matching one field are found by the event's own fields (an
    -- index probe each); the rest (no field, or several) are checked.
    SELECT coalesce(array_agg(f.step_id ORDER BY f.step_id), '{}') INTO open_waits
    FROM (
        SELECT w.step_id FROM jobhost.workflow_waits w
        WHERE w.key = event_key AND w.ended_by IS NULL AND w.armed_at IS NOT NULL
          AND w.match_one IN (SELECT jsonb_build_array(p.key, p.value)::text
                              FROM jsonb_each_text(event_payload) p
                              WHERE jsonb_typeof(event_payload -> p.key) IN ('string', 'number', 'boolean'))
        UNION ALL
        SELECT w.step_id FROM jobhost.workflow_waits w
        WHERE w.key = event_key AND w.ended_by IS NULL AND w.armed_at IS NOT NULL AND w.match_one IS NULL
          AND jobhost.event_matches(w.match, event_payload)
    ) f;
    released := jobhost.workflow_waits_end(open_waits, 'event', id);
    IF released > 0 THEN
        UPDATE jobhost.events e SET released = released WHERE e.id = id;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION jobhost.send_event(event_key text, payload jsonb DEFAULT '{}', idempotency_key text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE sql
    AS $$
    SELECT (jobhost.event_send(event_key, payload, idempotency_key, 'sql')).id
$$;
