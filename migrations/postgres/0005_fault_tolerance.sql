-- What a fleet needs to keep its guarantees under faults and bad rows.

-- Each host records its own heartbeat interval, so liveness is judged by
-- the interval the host promised rather than one fixed window for the fleet.
-- Rows of hosts from before this migration take the default interval.
ALTER TABLE jobhost.hosts ADD COLUMN heartbeat_ms integer NOT NULL DEFAULT 5000 CHECK (heartbeat_ms > 0);

-- A concurrency key is indexed (semaphores, parked jobs, holders), and an
-- index entry has a size limit: a longer key would be stored by an enqueue
-- and then fail every statement that indexes it, on every host. The host
-- refuses such keys at its own enqueue paths; this refuses them from any
-- other writer (the SQL enqueue among them). NOT VALID: rows written before
-- it are left to maintenance, which fails a row it cannot process.
ALTER TABLE jobhost.jobs ADD CONSTRAINT concurrency_key_at_most_1024_bytes
    CHECK (octet_length(concurrency_key) <= 1024) NOT VALID;

-- A job keeps the errors of its newest attempts only, so a job with many
-- attempts cannot grow its row towards the size limit of a jsonb value.
CREATE FUNCTION jobhost.keep_newest_errors() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.errors := (
        SELECT jsonb_agg(x.e ORDER BY x.n)
        FROM jsonb_array_elements(NEW.errors) WITH ORDINALITY AS x(e, n)
        WHERE x.n > jsonb_array_length(NEW.errors) - 25
    );
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_keep_newest_errors
    BEFORE INSERT OR UPDATE OF errors ON jobhost.jobs
    FOR EACH ROW WHEN (jsonb_array_length(NEW.errors) > 25)
    EXECUTE FUNCTION jobhost.keep_newest_errors();

CREATE TRIGGER blocked_jobs_keep_newest_errors
    BEFORE INSERT OR UPDATE OF errors ON jobhost.blocked_jobs
    FOR EACH ROW WHEN (jsonb_array_length(NEW.errors) > 25)
    EXECUTE FUNCTION jobhost.keep_newest_errors();

CREATE TRIGGER archive_keep_newest_errors
    BEFORE INSERT OR UPDATE OF errors ON jobhost.archive
    FOR EACH ROW WHEN (jsonb_array_length(NEW.errors) > 25)
    EXECUTE FUNCTION jobhost.keep_newest_errors();

-- Queues an operator paused: no host leases a job from them (jobs already
-- running finish). A row per paused queue; resuming deletes it.
CREATE TABLE jobhost.queue_pauses (
    name      text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);

-- The queues of a fetch that are not paused. Every fetch (jobhost.fetch and
-- the fetch of jobhost.finish_runs) is given its queues through this, so a
-- pause is seen by the next statement of every host.
CREATE FUNCTION jobhost.unpaused(queues text[]) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(q), '{}')
    FROM unnest(queues) AS q
    WHERE NOT EXISTS (SELECT 1 FROM jobhost.queue_pauses p WHERE p.name = q)
$$;

-- An operator asked to cancel this running job. The host running it learns
-- it from its next lease renewal, stops the guest and archives the job as
-- cancelled in the transaction that gives back its slot; if that host is
-- gone, the lease's expiry archives it as cancelled instead of redelivering it.
ALTER TABLE jobhost.jobs ADD COLUMN cancel_requested_at timestamptz;

-- The SQL enqueue holds payloads to a size, as every host enqueue does: the
-- setting jobhost.max_payload_bytes (e.g. ALTER DATABASE app SET
-- jobhost.max_payload_bytes = '4194304'), 1 MiB by default. Restated in
-- full: a function body cannot be patched.
CREATE OR REPLACE FUNCTION jobhost.enqueue(
    job text,
    payload jsonb,
    queue text DEFAULT NULL,
    priority smallint DEFAULT NULL,
    run_at timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    config jsonb;
    new_id bigint;
    due timestamptz := greatest(coalesce(run_at, now()), now());
    chosen_queue text;
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
    INSERT INTO jobhost.jobs (job, queue, priority, payload, state, max_attempts, run_at, concurrency_key)
    VALUES (
        job,
        chosen_queue,
        coalesce(priority, (config ->> 'priority')::smallint),
        payload,
        CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END,
        (config ->> 'max_attempts')::integer,
        due,
        CASE WHEN jsonb_typeof(config -> 'concurrency') = 'object'
             THEN jobhost.render_key(config -> 'concurrency' ->> 'key', payload) END
    )
    RETURNING id INTO new_id;
    IF due <= now() THEN
        PERFORM jobhost.admit(ARRAY[new_id], true);
    END IF;
    RETURN new_id;
END;
$$;

-- jobhost.finish_runs, except for the runs among keyed_ids (with their
-- lease tokens) whose key's semaphore another transaction holds right now:
-- those are left out and returned as deferred, so one key's lock (an
-- application's open transaction holding a jobhost.enqueue of that key)
-- never holds back a batch of results. A run whose lease is gone is not
-- deferred: finish_runs finds it a duplicate. One round trip, as before.
-- Locks: the keyed runs' semaphores in key order, SKIP LOCKED; they stay
-- locked until commit, for the release finish_runs does.
CREATE FUNCTION jobhost.finish_runs_unless_locked(
    keyed_ids bigint[], keyed_tokens bigint[],
    archive_ids bigint[], archive_tokens bigint[], archive_states text[], outputs jsonb[], archive_errors jsonb[],
    logs jsonb[], archive_progress jsonb[],
    requeue_ids bigint[], requeue_tokens bigint[], delays_ms bigint[], refunds integer[], requeue_errors jsonb[],
    requeue_progress jsonb[],
    queues text[], fetch_types text[], fetch_leases integer[], max_jobs bigint, host text
)
RETURNS TABLE (
    deferred bigint[], written bigint[], any_available boolean, id bigint, lease_token bigint, job text, queue text,
    payload jsonb, attempt integer, max_attempts integer, enqueued_at timestamptz, batch_id bigint,
    concurrency_key text, lease_secs integer
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    locked bigint[];
    held_back bigint[] := '{}';
BEGIN
    IF cardinality(keyed_ids) > 0 THEN
        SELECT coalesce(array_agg(l.id), '{}') INTO locked FROM (
            SELECT j.id FROM jobhost.jobs j
            JOIN jobhost.semaphores s ON s.job = j.job AND s.key = j.concurrency_key
            WHERE j.id = ANY(keyed_ids)
            ORDER BY s.job, s.key
            FOR UPDATE OF s SKIP LOCKED
        ) l;
        -- Usually every key was free: nothing more to read.
        IF cardinality(locked) < cardinality(keyed_ids) THEN
            SELECT coalesce(array_agg(j.id), '{}') INTO held_back
            FROM jobhost.jobs j
            JOIN unnest(keyed_ids, keyed_tokens) AS r(run_id, run_token)
                ON r.run_id = j.id AND r.run_token = j.lease_token
            WHERE j.id <> ALL(locked);
        END IF;
    END IF;
    IF cardinality(held_back) > 0 THEN
        SELECT coalesce(array_agg(i.a_id ORDER BY i.n), '{}'), coalesce(array_agg(i.a_token ORDER BY i.n), '{}'),
               coalesce(array_agg(i.a_state ORDER BY i.n), '{}'), coalesce(array_agg(i.a_output ORDER BY i.n), '{}'),
               coalesce(array_agg(i.a_error ORDER BY i.n), '{}'), coalesce(array_agg(i.a_log ORDER BY i.n), '{}'),
               coalesce(array_agg(i.a_progress ORDER BY i.n), '{}')
        INTO archive_ids, archive_tokens, archive_states, outputs, archive_errors, logs, archive_progress
        FROM unnest(archive_ids, archive_tokens, archive_states, outputs, archive_errors, logs, archive_progress)
            WITH ORDINALITY AS i(a_id, a_token, a_state, a_output, a_error, a_log, a_progress, n)
        WHERE i.a_id <> ALL(held_back);
        SELECT coalesce(array_agg(i.r_id ORDER BY i.n), '{}'), coalesce(array_agg(i.r_token ORDER BY i.n), '{}'),
               coalesce(array_agg(i.r_delay ORDER BY i.n), '{}'), coalesce(array_agg(i.r_refund ORDER BY i.n), '{}'),
               coalesce(array_agg(i.r_error ORDER BY i.n), '{}'), coalesce(array_agg(i.r_progress ORDER BY i.n), '{}')
        INTO requeue_ids, requeue_tokens, delays_ms, refunds, requeue_errors, requeue_progress
        FROM unnest(requeue_ids, requeue_tokens, delays_ms, refunds, requeue_errors, requeue_progress)
            WITH ORDINALITY AS i(r_id, r_token, r_delay, r_refund, r_error, r_progress, n)
        WHERE i.r_id <> ALL(held_back);
    END IF;
    RETURN QUERY
    SELECT held_back, f.*
    FROM jobhost.finish_runs(archive_ids, archive_tokens, archive_states, outputs, archive_errors, logs,
                             archive_progress, requeue_ids, requeue_tokens, delays_ms, refunds, requeue_errors,
                             requeue_progress, queues, fetch_types, fetch_leases, max_jobs, host) f;
END;
$$;
