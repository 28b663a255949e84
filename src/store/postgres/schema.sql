--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: jobhost; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA jobhost;


--
-- Name: step_release; Type: TYPE; Schema: jobhost; Owner: -
--

CREATE TYPE jobhost.step_release AS (
	id bigint,
	job_id bigint,
	job text,
	queue text,
	priority smallint,
	delay_ms bigint,
	payload jsonb,
	verdict text,
	reason text,
	config jsonb
);


--
-- Name: admit(bigint[], boolean); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.admit(job_ids bigint[], enqueuer_waiting boolean) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    admitted integer;
    key_jobs text[];
    key_names text[];
    key_counts integer[];
    key_limits integer[];
    key_taken integer[];
    key_conflicts text[];
    available bigint[];
    parked bigint[];
    discarded bigint[];
    reasons text[];
BEGIN
    WITH unkeyed AS (
        UPDATE jobhost.jobs SET state = 'available'
        WHERE id = ANY(job_ids) AND concurrency_key IS NULL AND state <> 'available'
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM jobhost.jobs WHERE id = ANY(job_ids) AND concurrency_key IS NULL)
    INTO admitted;

    -- The keys, in (job, key) order, with how many of the jobs each has
    -- (aggregated from a sorted subquery: one sort instead of one per array).
    SELECT array_agg(w.job), array_agg(w.key), array_agg(w.n)
    INTO key_jobs, key_names, key_counts
    FROM (
        SELECT j.job, j.concurrency_key AS key, count(*)::integer AS n
        FROM jobhost.jobs j
        WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL
        GROUP BY 1, 2
        ORDER BY 1, 2
    ) w;
    IF key_jobs IS NULL THEN
        RETURN admitted;
    END IF;
    SELECT g.slot_limits, g.taken, g.on_conflicts INTO key_limits, key_taken, key_conflicts
    FROM jobhost.take_slots(key_jobs, key_names, key_counts, enqueuer_waiting) g;

    WITH ranked AS (
        SELECT j.id, j.job, j.concurrency_key AS key,
               row_number() OVER (PARTITION BY j.job, j.concurrency_key ORDER BY j.priority, j.run_at, j.id) AS place
        FROM jobhost.jobs j
        WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL
    ), judged AS (
        SELECT r.id, r.job, r.key, r.place, t.ord, t.slot_limit, r.place <= t.taken AS admitted, t.on_conflict
        FROM ranked r
        JOIN unnest(key_jobs, key_names, key_limits, key_taken, key_conflicts)
            WITH ORDINALITY AS t(job, key, slot_limit, taken, on_conflict, ord)
            ON t.job = r.job AND t.key = r.key
    )
    SELECT array_agg(j.id) FILTER (WHERE j.admitted),
           array_agg(j.id ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict NOT IN ('discard', 'raise')),
           array_agg(j.id ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict IN ('discard', 'raise')),
           array_agg(format('concurrency limit reached: all %s slots of key "%s" are taken', j.slot_limit, j.key)
                     ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict IN ('discard', 'raise'))
    INTO available, parked, discarded, reasons
    FROM judged j;

    IF available IS NOT NULL THEN
        UPDATE jobhost.jobs SET state = 'available' WHERE id = ANY(available) AND state <> 'available';
        admitted := admitted + cardinality(available);
    END IF;
    IF discarded IS NOT NULL THEN
        PERFORM jobhost.discard_each(discarded, reasons);
    END IF;
    IF parked IS NOT NULL THEN
        PERFORM jobhost.park(parked);
    END IF;
    RETURN admitted;
END;
$$;


--
-- Name: archive_ended(); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.archive_ended() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    ids bigint[];
    batch_count bigint;
    waited boolean;
    stepped boolean;
    claimed boolean;
    keyed boolean;
    carried boolean;
    ended text;
    job_ids bigint[];
    job_states text[];
    job_results jsonb[];
    job_ended_at timestamptz[];
BEGIN
    -- The ids as an array: a transition table has no statistics, and a
    -- join with it may scan a whole table; `= ANY` probes the index.
    WITH a AS MATERIALIZED (
        SELECT array_agg(a.id) AS ids, count(DISTINCT a.batch_id) AS batches,
               bool_or(a.unique_key IS NOT NULL) AS keyed, bool_and(a.key_carried) AS carried
        FROM archived a
    )
    SELECT a.ids, a.batches, a.keyed, a.carried,
           EXISTS (SELECT 1 FROM jobhost.job_waits w WHERE w.job_id = ANY(a.ids)),
           -- Probes of the steps' unique job index, one an id (`IS TRUE`
           -- keeps the partial index of live steps out of the plan: it
           -- would read every live step for every write, plain ones too).
           EXISTS (SELECT 1 FROM jobhost.workflow_steps s
                   WHERE s.job_id = ANY(a.ids) AND (s.ended_state IS NULL) IS TRUE),
           a.keyed OR NOT a.carried
               OR EXISTS (SELECT 1 FROM jobhost.unique_keys k WHERE k.job_id = ANY(a.ids))
               OR EXISTS (SELECT 1 FROM jobhost.unique_claims c WHERE c.job_id = ANY(a.ids) AND NOT c.attached)
    FROM a
    INTO ids, batch_count, keyed, carried, waited, stepped, claimed;
    IF batch_count > 0 THEN
        -- One row needs no order; several are locked in id order first.
        IF batch_count > 1 THEN
            PERFORM 1 FROM jobhost.batches b
            WHERE b.id IN (SELECT a.batch_id FROM archived a WHERE a.batch_id IS NOT NULL)
            ORDER BY b.id
            FOR UPDATE;
        END IF;
        UPDATE jobhost.batches b
        SET completed = b.completed + d.completed,
            failed = b.failed + d.failed,
            discarded = b.discarded + d.discarded,
            cancelled = b.cancelled + d.cancelled
        FROM (
            SELECT a.batch_id,
                   count(*) FILTER (WHERE a.state = 'completed') AS completed,
                   count(*) FILTER (WHERE a.state = 'failed') AS failed,
                   count(*) FILTER (WHERE a.state = 'discarded') AS discarded,
                   count(*) FILTER (WHERE a.state = 'cancelled') AS cancelled
            FROM archived a
            WHERE a.batch_id IS NOT NULL
            GROUP BY a.batch_id
        ) d
        WHERE b.id = d.batch_id;
    END IF;
    IF waited THEN
        SELECT string_agg(DISTINCT w.job_id::text, ',') INTO ended
        FROM jobhost.job_waits w WHERE w.job_id = ANY(ids);
        DELETE FROM jobhost.job_waits w WHERE w.job_id = ANY(ids);
        -- A payload past the limit says only "look": waiters read the archive.
        PERFORM pg_notify('jobhost_finished', CASE WHEN octet_length(ended) < 7900 THEN ended ELSE '' END);
    END IF;
    IF stepped THEN
        -- Handed on as arrays: joined with the transition table, each step
        -- row rescanned all of it (whole archived rows, payloads and logs).
        SELECT array_agg(a.id), array_agg(a.state),
               array_agg(CASE WHEN a.state = 'completed' THEN coalesce(a.output, 'null'::jsonb)
                              ELSE coalesce(a.errors -> -1 -> 'error', 'null'::jsonb) END),
               array_agg(a.finished_at)
        INTO job_ids, job_states, job_results, job_ended_at
        FROM archived a;
        PERFORM jobhost.workflow_jobs_ended(job_ids, job_states, job_results, job_ended_at);
    END IF;
    IF claimed THEN
        IF keyed THEN
            -- Probes of the primary key by the keys (an array, as the ids
            -- above); the claimant must be the archived job itself.
            DELETE FROM jobhost.unique_claims c
            WHERE c.unique_key = ANY(ARRAY(SELECT a.unique_key FROM archived a WHERE a.unique_key IS NOT NULL))
              AND (c.unique_key, c.job, c.job_id) IN (SELECT a.unique_key, a.job, a.id FROM archived a);
        END IF;
        DELETE FROM jobhost.unique_claims c WHERE c.job_id = ANY(ids) AND NOT c.attached;
        IF NOT carried THEN
            DELETE FROM jobhost.unique_claims c
            WHERE c.job_id = ANY(ARRAY(SELECT a.id FROM archived a WHERE NOT a.key_carried)) AND c.attached;
        END IF;
        DELETE FROM jobhost.unique_keys k WHERE k.job_id = ANY(ids);
    END IF;
    RETURN NULL;
END;
$$;


--
-- Name: archive_flag_late(); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.archive_flag_late() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.finished_at < date_trunc('minute', clock_timestamp()) THEN
        INSERT INTO jobhost.history_late (minute) VALUES (date_trunc('minute', NEW.finished_at))
        ON CONFLICT (minute) DO UPDATE SET minute = EXCLUDED.minute;
    END IF;
    RETURN NULL;
END;
$$;


--
-- Name: audit_write(text, text, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.audit_write(audit_action text, audit_object text, audit_outcome text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    actor text := coalesce(current_setting('jobhost.actor', true), '');
BEGIN
    IF actor = '-' THEN
        RETURN;
    END IF;
    IF actor = '' THEN
        INSERT INTO jobhost.audit (via, who, address, user_agent, action, object, outcome)
        VALUES ('sql', session_user, host(inet_client_addr()),
                left(nullif(current_setting('application_name', true), ''), 200),
                audit_action, audit_object, audit_outcome);
    ELSE
        INSERT INTO jobhost.audit (via, who, address, user_agent, action, object, outcome)
        SELECT a.via, a.who, a.address, a.user_agent, audit_action, audit_object, audit_outcome
        FROM jsonb_to_record(actor::jsonb) AS a(via text, who text, address text, user_agent text);
    END IF;
END
$$;


--
-- Name: batch_add_members(bigint[], boolean[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.batch_add_members(batch_ids bigint[], closed_ok boolean[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    wanted record;
    found_batch record;
BEGIN
    FOR wanted IN
        SELECT m.batch_id, count(*) AS n, bool_and(m.closed_ok) AS closed_ok
        FROM unnest(batch_ids, closed_ok) AS m(batch_id, closed_ok)
        WHERE m.batch_id IS NOT NULL
        GROUP BY m.batch_id
        ORDER BY m.batch_id
    LOOP
        SELECT b.id, b.closed_at INTO found_batch FROM jobhost.batches b WHERE b.id = wanted.batch_id FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'batch % does not exist', wanted.batch_id USING ERRCODE = '22023';
        END IF;
        IF found_batch.closed_at IS NOT NULL AND NOT wanted.closed_ok THEN
            RAISE EXCEPTION 'batch % is closed: it takes no more jobs', wanted.batch_id USING ERRCODE = '22023';
        END IF;
        UPDATE jobhost.batches SET total = total + wanted.n WHERE id = wanted.batch_id;
    END LOOP;
END;
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: batches; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.batches (
    id bigint NOT NULL,
    label text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    closed_at timestamp with time zone,
    total bigint DEFAULT 0 NOT NULL,
    completed bigint DEFAULT 0 NOT NULL,
    failed bigint DEFAULT 0 NOT NULL,
    discarded bigint DEFAULT 0 NOT NULL,
    cancelled bigint DEFAULT 0 NOT NULL,
    on_finish text,
    on_success text,
    on_failure text,
    callback_payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    finished_at timestamp with time zone,
    callback_jobs jsonb DEFAULT '{}'::jsonb NOT NULL,
    callback_errors jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT batches_callback_payload_check CHECK ((jsonb_typeof(callback_payload) = 'object'::text)),
    CONSTRAINT batches_label_check CHECK ((octet_length(label) <= 256))
);


--
-- Name: batch_callback_payload(jobhost.batches); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.batch_callback_payload(b jobhost.batches) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT b.callback_payload || jsonb_build_object('_batch', jsonb_build_object(
        'id', b.id,
        'label', b.label,
        'succeeded', b.failed + b.discarded = 0,
        'total', b.total,
        'completed', b.completed,
        'failed', b.failed,
        'discarded', b.discarded,
        'cancelled', b.cancelled))
$$;


--
-- Name: batch_close(bigint); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.batch_close(batch bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE jobhost.batches SET closed_at = now() WHERE id = batch AND closed_at IS NULL;
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM jobhost.batches WHERE id = batch) THEN
        RAISE EXCEPTION 'batch % does not exist', batch USING ERRCODE = '22023';
    END IF;
    RETURN false;
END;
$$;


--
-- Name: batch_open(text, text, text, text, jsonb); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.batch_open(label text DEFAULT NULL::text, on_finish text DEFAULT NULL::text, on_success text DEFAULT NULL::text, on_failure text DEFAULT NULL::text, callback_payload jsonb DEFAULT '{}'::jsonb) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_variable
DECLARE
    callback text;
    new_id bigint;
BEGIN
    FOREACH callback IN ARRAY ARRAY[on_finish, on_success, on_failure] LOOP
        IF callback IS NOT NULL AND NOT EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = callback) THEN
            RAISE EXCEPTION 'unknown job type "%": no host has loaded a component for it', callback
                USING ERRCODE = '22023';
        END IF;
    END LOOP;
    IF callback_payload IS NULL OR jsonb_typeof(callback_payload) <> 'object' THEN
        RAISE EXCEPTION 'a batch''s callback payload must be a JSON object' USING ERRCODE = '22023';
    END IF;
    INSERT INTO jobhost.batches (label, on_finish, on_success, on_failure, callback_payload)
    VALUES (label, on_finish, on_success, on_failure, callback_payload)
    RETURNING id INTO new_id;
    RETURN new_id;
END;
$$;


--
-- Name: batch_retry_member(bigint, bigint, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.batch_retry_member(member bigint, batch bigint, ended_state text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE jobhost.batches
    SET completed = completed - (ended_state = 'completed')::int,
        failed = failed - (ended_state = 'failed')::int,
        discarded = discarded - (ended_state = 'discarded')::int,
        cancelled = cancelled - (ended_state = 'cancelled')::int
    WHERE id = batch AND finished_at IS NULL;
    IF NOT FOUND THEN
        UPDATE jobhost.jobs SET batch_id = NULL WHERE id = member;
    END IF;
END;
$$;


--
-- Name: batch_settle(); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.batch_settle() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    b jobhost.batches;
    payload jsonb;
    kind text;
    callback text;
    jobs jsonb := '{}';
    errors jsonb := '{}';
BEGIN
    UPDATE jobhost.batches
    SET finished_at = now()
    WHERE id = NEW.id AND finished_at IS NULL AND closed_at IS NOT NULL
      AND completed + failed + discarded + cancelled >= total
    RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    payload := jobhost.batch_callback_payload(b);
    FOR kind, callback IN
        SELECT k, t FROM (VALUES
            ('on_finish', b.on_finish),
            ('on_success', CASE WHEN b.failed + b.discarded = 0 THEN b.on_success END),
            ('on_failure', CASE WHEN b.failed + b.discarded > 0 THEN b.on_failure END)) AS c(k, t)
        WHERE t IS NOT NULL
    LOOP
        BEGIN
            jobs := jobs || jsonb_build_object(kind, jobhost.enqueue(callback, payload));
        EXCEPTION
            WHEN serialization_failure OR deadlock_detected THEN
                RAISE;
            WHEN OTHERS THEN
                errors := errors || jsonb_build_object(kind, SQLERRM);
        END;
    END LOOP;
    UPDATE jobhost.batches SET callback_jobs = jobs, callback_errors = errors WHERE id = b.id;
    RETURN NULL;
END;
$$;


--
-- Name: calendar_of(jsonb); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.calendar_of(config jsonb, OUT cron text, OUT time_zone text) RETURNS record
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE jsonb_typeof(config -> 'schedule')
               WHEN 'string' THEN config ->> 'schedule'
               WHEN 'object' THEN config -> 'schedule' ->> 'cron'
           END,
           CASE jsonb_typeof(config -> 'schedule')
               WHEN 'string' THEN 'UTC'
               WHEN 'object' THEN coalesce(config -> 'schedule' ->> 'time_zone', 'UTC')
           END
$$;


--
-- Name: claim_and_insert_jobs(text[], text[], smallint[], jsonb[], integer[], timestamp with time zone[], bigint[], text[], bigint[], bigint[], timestamp with time zone[], text[], boolean[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.claim_and_insert_jobs(jobs text[], queues text[], priorities smallint[], payloads jsonb[], attempts integer[], ats timestamp with time zone[], delays bigint[], concurrency_keys text[], parents bigint[], batches bigint[], planned timestamp with time zone[], unique_keys text[], while_executing boolean[], OUT ids bigint[], OUT claimants bigint[]) RETURNS record
    LANGUAGE plpgsql
    AS $$
BEGIN
    SELECT c.ids, c.claimants INTO ids, claimants
    FROM jobhost.claim_new_keys(jobs, unique_keys, while_executing, attach => true) c;

    -- Every job has a key and won its claim (claim_new_keys then answers
    -- with the ids themselves), none `while_executing`: all are written,
    -- each carrying the key it holds.
    IF claimants = ids AND NOT true = ANY(while_executing) THEN
        PERFORM jobhost.insert_jobs(jobs, queues, priorities, payloads, attempts, ats, delays, concurrency_keys,
                                    parents, ids, batches, planned, unique_keys);
        RETURN;
    END IF;

    -- Otherwise only the jobs holding their claim or having none, in input
    -- order; a `while_executing` job carries no key on its row.
    PERFORM jobhost.insert_jobs(f.jobs, f.queues, f.priorities, f.payloads, f.attempts, f.ats, f.delays,
                                f.concurrency_keys, f.parents, f.ids, f.batches, f.planned, f.unique_keys)
    FROM (
        SELECT array_agg(u.job) AS jobs, array_agg(u.queue) AS queues, array_agg(u.priority) AS priorities,
               array_agg(u.payload) AS payloads, array_agg(u.attempt) AS attempts, array_agg(u.at) AS ats,
               array_agg(u.delay) AS delays, array_agg(u.concurrency_key) AS concurrency_keys,
               array_agg(u.parent) AS parents, array_agg(u.id) AS ids, array_agg(u.batch) AS batches,
               array_agg(u.plan) AS planned,
               array_agg(CASE WHEN u.we THEN NULL ELSE u.unique_key END) AS unique_keys
        FROM (
            SELECT *
            FROM unnest(jobs, queues, priorities, payloads, attempts, ats, delays, concurrency_keys, parents,
                        batches, planned, unique_keys, while_executing, ids, claimants)
                WITH ORDINALITY AS u(job, queue, priority, payload, attempt, at, delay, concurrency_key, parent,
                                     batch, plan, unique_key, we, id, claimant, ord)
            WHERE u.claimant IS NULL OR u.claimant = u.id
            ORDER BY u.ord
        ) u
    ) f
    WHERE f.jobs IS NOT NULL;
END;
$$;


--
-- Name: claim_new_keys(text[], text[], boolean[], boolean); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.claim_new_keys(job_types text[], unique_keys text[], while_executing boolean[], attach boolean DEFAULT false, OUT ids bigint[], OUT claimants bigint[]) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    lost_ords bigint[];
    lost_jobs text[];
    lost_keys text[];
    lost_ids bigint[];
    found_ords bigint[] := '{}';
    found_claimants bigint[] := '{}';
    read_ords bigint[];
    read_claimants bigint[];
    won bigint[];
    tries integer := 0;
    all_won boolean := false;
BEGIN
    SELECT coalesce(array_agg(s.id), '{}') INTO ids
    FROM (SELECT nextval('jobhost.job_ids') AS id FROM generate_series(1, coalesce(cardinality(job_types), 0))
          ORDER BY 1) s;

    IF jobhost.claims_likely_new(job_types, unique_keys, while_executing) THEN
        BEGIN
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id, attached)
            SELECT u.job, u.unique_key, u.id, attach
            FROM unnest(job_types, unique_keys, ids, while_executing) AS u(job, unique_key, id, we)
            WHERE u.unique_key IS NOT NULL AND NOT u.we
            ORDER BY u.job, u.unique_key, u.id;
            all_won := true;
        EXCEPTION WHEN unique_violation THEN
            all_won := false;
        END;
    END IF;

    IF NOT all_won THEN
        WITH claimed AS (
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id, attached)
            SELECT u.job, u.unique_key, u.id, attach
            FROM unnest(job_types, unique_keys, ids, while_executing) AS u(job, unique_key, id, we)
            WHERE u.unique_key IS NOT NULL AND NOT u.we
            ORDER BY u.job, u.unique_key, u.id
            ON CONFLICT DO NOTHING
            RETURNING job_id
        )
        SELECT coalesce(array_agg(job_id), '{}') INTO won FROM claimed;
        SELECT array_agg(u.ord), array_agg(u.job), array_agg(u.unique_key), array_agg(u.id)
        INTO lost_ords, lost_jobs, lost_keys, lost_ids
        FROM unnest(job_types, unique_keys, ids, while_executing) WITH ORDINALITY AS u(job, unique_key, id, we, ord)
        WHERE u.unique_key IS NOT NULL AND NOT u.we AND NOT EXISTS (SELECT 1 FROM unnest(won) AS w(id) WHERE w.id = u.id);

        WHILE lost_ords IS NOT NULL LOOP
            SELECT array_agg(l.ord) FILTER (WHERE c.job_id IS NOT NULL),
                   array_agg(c.job_id) FILTER (WHERE c.job_id IS NOT NULL),
                   array_agg(l.ord) FILTER (WHERE c.job_id IS NULL),
                   array_agg(l.job) FILTER (WHERE c.job_id IS NULL),
                   array_agg(l.unique_key) FILTER (WHERE c.job_id IS NULL),
                   array_agg(l.id) FILTER (WHERE c.job_id IS NULL)
            INTO read_ords, read_claimants, lost_ords, lost_jobs, lost_keys, lost_ids
            FROM unnest(lost_ords, lost_jobs, lost_keys, lost_ids) AS l(ord, job, unique_key, id)
            LEFT JOIN (
                -- Each lost key read once (a call of duplicates of one key reads one claim).
                SELECT k.job, k.unique_key, c.job_id
                FROM (SELECT DISTINCT u.job, u.unique_key FROM unnest(lost_jobs, lost_keys) AS u(job, unique_key)) k
                CROSS JOIN LATERAL (
                    SELECT c.job_id FROM jobhost.unique_claims c
                    WHERE c.job = k.job AND c.unique_key = k.unique_key OFFSET 0
                ) c
            ) c ON c.job = l.job AND c.unique_key = l.unique_key;
            found_ords := found_ords || coalesce(read_ords, '{}');
            found_claimants := found_claimants || coalesce(read_claimants, '{}');
            EXIT WHEN lost_ords IS NULL;
            -- Released between the claim and the read: claim them again.
            tries := tries + 1;
            IF tries >= 100 THEN
                RAISE EXCEPTION 'uniqueness keys kept being released while they were claimed' USING ERRCODE = '40001';
            END IF;
            WITH claimed AS (
                INSERT INTO jobhost.unique_claims (job, unique_key, job_id, attached)
                SELECT l.job, l.unique_key, l.id, attach
                FROM unnest(lost_jobs, lost_keys, lost_ids) AS l(job, unique_key, id)
                ORDER BY l.job, l.unique_key, l.id
                ON CONFLICT DO NOTHING
                RETURNING job_id
            )
            SELECT coalesce(array_agg(job_id), '{}') INTO won FROM claimed;
            SELECT array_agg(l.ord), array_agg(l.job), array_agg(l.unique_key), array_agg(l.id)
            INTO lost_ords, lost_jobs, lost_keys, lost_ids
            FROM unnest(lost_ords, lost_jobs, lost_keys, lost_ids) AS l(ord, job, unique_key, id)
            WHERE NOT EXISTS (SELECT 1 FROM unnest(won) AS w(id) WHERE w.id = l.id);
        END LOOP;
    END IF;

    -- A job with a key is written unless another job holds its key.
    IF all_won AND array_position(unique_keys, NULL) IS NULL THEN
        claimants := ids;
    ELSE
        SELECT coalesce(array_agg(CASE WHEN u.unique_key IS NULL THEN NULL ELSE coalesce(f.claimant, u.id) END
                                  ORDER BY u.ord), '{}')
        INTO claimants
        FROM unnest(unique_keys, ids) WITH ORDINALITY AS u(unique_key, id, ord)
        LEFT JOIN unnest(found_ords, found_claimants) AS f(ord, claimant) ON f.ord = u.ord;
    END IF;

    IF true = ANY(while_executing) THEN
        INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
        SELECT u.id, u.job, u.unique_key, true
        FROM unnest(ids, job_types, unique_keys, while_executing) AS u(id, job, unique_key, we)
        WHERE u.unique_key IS NOT NULL AND u.we;
    END IF;
END;
$$;


--
-- Name: claim_unique(text[], text[], bigint[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.claim_unique(job_types text[], unique_keys text[], job_ids bigint[]) RETURNS TABLE(ord bigint, claimant bigint)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    holders bigint[];
    held integer;
    tries integer := 0;
BEGIN
    IF jobhost.claims_likely_new(job_types, unique_keys, NULL) THEN
        BEGIN
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
            SELECT u.job, u.unique_key, u.id
            FROM unnest(job_types, unique_keys, job_ids) AS u(job, unique_key, id)
            ORDER BY u.job, u.unique_key, u.id;
            holders := job_ids;
        EXCEPTION WHEN unique_violation THEN
            holders := NULL;
        END;
    END IF;
    WHILE holders IS NULL LOOP
        INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
        SELECT u.job, u.unique_key, u.id
        FROM unnest(job_types, unique_keys, job_ids) AS u(job, unique_key, id)
        ORDER BY u.job, u.unique_key, u.id
        ON CONFLICT DO NOTHING;
        SELECT array_agg(c.job_id ORDER BY u.n), count(c.job_id) INTO holders, held
        FROM unnest(job_types, unique_keys) WITH ORDINALITY AS u(job, unique_key, n)
        LEFT JOIN (
            -- Each key read once (a call of duplicates of one key reads one claim).
            SELECT k.job, k.unique_key, c.job_id
            FROM (SELECT DISTINCT d.job, d.unique_key FROM unnest(job_types, unique_keys) AS d(job, unique_key)) k
            CROSS JOIN LATERAL (
                SELECT c.job_id FROM jobhost.unique_claims c
                WHERE c.job = k.job AND c.unique_key = k.unique_key OFFSET 0
            ) c
        ) c ON c.job = u.job AND c.unique_key = u.unique_key;
        EXIT WHEN held = cardinality(job_types);
        holders := NULL;
        tries := tries + 1;
        IF tries >= 100 THEN
            RAISE EXCEPTION 'uniqueness keys kept being released while they were claimed' USING ERRCODE = '40001';
        END IF;
    END LOOP;
    RETURN QUERY SELECT h.n, h.holder FROM unnest(holders) WITH ORDINALITY AS h(holder, n);
END;
$$;


--
-- Name: claims_likely_new(text[], text[], boolean[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.claims_likely_new(job_types text[], unique_keys text[], while_executing boolean[]) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT cardinality(job_types) >= 64
       AND NOT EXISTS (
            SELECT 1
            FROM generate_series(1, cardinality(job_types), greatest(cardinality(job_types) / 32, 1)) AS i(at)
            WHERE EXISTS (SELECT 1 FROM jobhost.unique_claims c
                          WHERE c.unique_key = unique_keys[i.at] AND c.job = job_types[i.at]))
       AND CASE WHEN array_position(unique_keys, NULL) IS NULL
                     AND coalesce(NOT (true = ANY(coalesce(while_executing, '{}'))), false)
                THEN cardinality(unique_keys) >= 64
                ELSE (SELECT count(*)
                      FROM unnest(unique_keys, while_executing) AS u(unique_key, we)
                      WHERE u.unique_key IS NOT NULL AND NOT coalesce(u.we, false)) >= 64
           END
$$;


--
-- Name: discard(bigint[], text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.discard(job_ids bigint[], reason text) RETURNS void
    LANGUAGE sql
    AS $$
    WITH moved AS (DELETE FROM jobhost.jobs WHERE id = ANY(job_ids) RETURNING *)
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                                 enqueued_at, started_at, finished_at, concurrency_key, batch_id, parent_id, unique_key, key_carried)
    SELECT id, job, queue, priority, payload, 'discarded', attempt, max_attempts,
           errors || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', now(), 'error', reason)),
           progress, enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id, unique_key, true
    FROM moved
$$;


--
-- Name: discard_each(bigint[], text[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.discard_each(job_ids bigint[], reasons text[]) RETURNS void
    LANGUAGE sql
    AS $$
    WITH why AS (SELECT * FROM unnest(job_ids, reasons) AS w(id, reason)),
    moved AS (DELETE FROM jobhost.jobs j USING why w WHERE j.id = w.id RETURNING j.*, w.reason)
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                                 enqueued_at, started_at, finished_at, concurrency_key, batch_id, parent_id, unique_key, key_carried)
    SELECT id, job, queue, priority, payload, 'discarded', attempt, max_attempts,
           errors || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', now(), 'error', reason)),
           progress, enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id, unique_key, true
    FROM moved
$$;


--
-- Name: enqueue(text, jsonb, text, smallint, timestamp with time zone, bigint, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.enqueue(job text, payload jsonb, queue text DEFAULT NULL::text, priority smallint DEFAULT NULL::smallint, run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, batch_id bigint DEFAULT NULL::bigint, traceparent text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql
    AS $_$
#variable_conflict use_variable
DECLARE
    new_id bigint := nextval('jobhost.job_ids');
    stored bigint;
BEGIN
    IF traceparent IS NOT NULL AND traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION 'traceparent "%" is not a W3C trace context: 00-<32 hex>-<16 hex>-<2 hex>, lowercase',
            traceparent USING ERRCODE = '22023';
    END IF;
    stored := jobhost.enqueue_as(new_id, job, payload, queue, priority, run_at, batch_id);
    IF traceparent IS NOT NULL AND stored = new_id THEN
        INSERT INTO jobhost.job_traces (job_id, traceparent) VALUES (new_id, traceparent);
    END IF;
    RETURN stored;
END;
$_$;


--
-- Name: enqueue_as(bigint, text, jsonb, text, smallint, timestamp with time zone, bigint); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.enqueue_as(new_id bigint, job text, payload jsonb, queue text DEFAULT NULL::text, priority smallint DEFAULT NULL::smallint, run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, batch_id bigint DEFAULT NULL::bigint) RETURNS bigint
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


--
-- Name: enqueue_many(jsonb); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.enqueue_many(jobs jsonb) RETURNS TABLE(ord bigint, id bigint, duplicate boolean)
    LANGUAGE plpgsql
    AS $_$
#variable_conflict use_column
DECLARE
    -- The database's setting, like the host's --max-payload (1 MiB unless set).
    max_payload_bytes bigint :=
        coalesce(nullif(current_setting('jobhost.max_payload_bytes', true), '')::bigint, 1048576);
    bad record;
    n integer;
    names text[];
    payloads jsonb[];
    queues text[];
    priorities smallint[];
    dues timestamptz[];
    attempts integer[];
    concurrency_keys text[];
    unique_keys text[];
    while_executing boolean[];
    on_duplicate text[];
    batch_ids bigint[];
    traces text[];
    ids bigint[];
    claim_at bigint[];
    claim_jobs text[];
    claim_keys text[];
    claim_ids bigint[];
    claimants bigint[];
    batch_members bigint[];
    dup record;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        RAISE EXCEPTION 'jobs must be a JSON array of objects such as {"job": "mail", "payload": {}}'
            USING ERRCODE = '22023';
    END IF;
    n := jsonb_array_length(jobs);
    IF n = 0 THEN
        RETURN;
    END IF;

    -- The first bad element, named by its position: nothing is stored.
    SELECT v.ord, v.reason INTO bad
    FROM (
        SELECT e.ord, CASE
            WHEN jsonb_typeof(e.value) <> 'object' THEN 'is not an object'
            WHEN e.value - ARRAY['job', 'payload', 'queue', 'priority', 'run_at', 'batch_id', 'traceparent'] <> '{}'
                THEN 'has an unknown field (known: job, payload, queue, priority, run_at, batch_id, traceparent)'
            WHEN jsonb_typeof(e.value -> 'job') IS DISTINCT FROM 'string' THEN 'has no "job" name'
            WHEN t.name IS NULL
                THEN format('unknown job type "%s": no host has loaded a component for it', e.value ->> 'job')
            WHEN jsonb_typeof(e.value -> 'payload') IS DISTINCT FROM 'object'
                THEN format('payload of job "%s" must be a JSON object', e.value ->> 'job')
            WHEN octet_length((e.value -> 'payload')::text) > max_payload_bytes
                THEN format('payload of job "%s" is %s bytes of JSON, more than the largest accepted, %s bytes',
                            e.value ->> 'job', octet_length((e.value -> 'payload')::text), max_payload_bytes)
            WHEN coalesce(e.value ->> 'queue', t.config ->> 'queue') !~ '^[a-z0-9_.-]+$'
                 OR length(coalesce(e.value ->> 'queue', t.config ->> 'queue')) > 128
                THEN format('queue "%s" must be 1 to 128 characters of a-z, 0-9, _, . and -', e.value ->> 'queue')
            WHEN e.value ? 'priority' AND (jsonb_typeof(e.value -> 'priority') <> 'number'
                                          OR (e.value ->> 'priority') !~ '^-?[0-9]{1,5}$'
                                          OR abs((e.value ->> 'priority')::integer) > 32767)
                THEN 'has a "priority" that is not a whole number from -32768 to 32767'
            WHEN e.value ? 'run_at' AND jsonb_typeof(e.value -> 'run_at') <> 'string'
                THEN 'has a "run_at" that is not a time such as "2026-12-24T18:00:00Z"'
            WHEN e.value ? 'batch_id' AND (jsonb_typeof(e.value -> 'batch_id') <> 'number'
                                          OR (e.value ->> 'batch_id') !~ '^[0-9]{1,18}$')
                THEN 'has a "batch_id" that is not a batch''s id'
            WHEN e.value ? 'traceparent'
                 AND coalesce(e.value ->> 'traceparent', '') !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                THEN format('traceparent "%s" is not a W3C trace context: 00-<32 hex>-<16 hex>-<2 hex>, lowercase',
                            e.value ->> 'traceparent')
            END AS reason
        FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord)
        LEFT JOIN jobhost.job_types t ON t.name = e.value ->> 'job'
    ) v
    WHERE v.reason IS NOT NULL
    ORDER BY v.ord
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'job % of %: %', bad.ord, n, bad.reason USING ERRCODE = '22023';
    END IF;

    -- Every "run_at" read as a time in one pass; when one cannot be, the
    -- first such is found and named by its position (the pass's own error
    -- would not say which). The search, one cast at a time, runs only then.
    BEGIN
        PERFORM (e.value ->> 'run_at')::timestamptz
        FROM jsonb_array_elements(jobs) AS e(value)
        WHERE e.value ? 'run_at';
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR invalid_time_zone_displacement_value THEN
        FOR bad IN
            SELECT e.ord, e.value ->> 'run_at' AS reason
            FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord)
            WHERE e.value ? 'run_at'
            ORDER BY e.ord
        LOOP
            BEGIN
                PERFORM bad.reason::timestamptz;
            EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow
                           OR invalid_time_zone_displacement_value THEN
                RAISE EXCEPTION 'job % of %: "run_at" % is not a time such as "2026-12-24T18:00:00Z"',
                    bad.ord, n, to_jsonb(bad.reason) USING ERRCODE = '22023';
            END;
        END LOOP;
        RAISE;
    END;

    -- Each job as jobhost.enqueue_as prepares it, with its keys rendered.
    SELECT array_agg(p.job), array_agg(p.payload), array_agg(p.queue), array_agg(p.priority), array_agg(p.due),
           array_agg(p.max_attempts), array_agg(p.concurrency_key), array_agg(p.unique_key),
           array_agg(p.while_executing), array_agg(p.on_duplicate), array_agg(p.batch_id), array_agg(p.traceparent)
    INTO names, payloads, queues, priorities, dues, attempts, concurrency_keys, unique_keys, while_executing,
         on_duplicate, batch_ids, traces
    FROM (
        SELECT e.ord, e.value ->> 'job' AS job, e.value -> 'payload' AS payload,
               coalesce(e.value ->> 'queue', t.config ->> 'queue') AS queue,
               coalesce((e.value ->> 'priority')::smallint, (t.config ->> 'priority')::smallint) AS priority,
               greatest(coalesce((e.value ->> 'run_at')::timestamptz, now()), now()) AS due,
               (t.config ->> 'max_attempts')::integer AS max_attempts,
               CASE WHEN jsonb_typeof(t.config -> 'concurrency') = 'object'
                    THEN jobhost.render_key(t.config -> 'concurrency' ->> 'key', e.value -> 'payload') END
                   AS concurrency_key,
               CASE WHEN jsonb_typeof(t.config -> 'unique') = 'object'
                    THEN jobhost.render_key(t.config -> 'unique' ->> 'key', e.value -> 'payload') END AS unique_key,
               coalesce(t.config -> 'unique' ->> 'strategy' = 'while_executing', false) AS while_executing,
               coalesce(t.config -> 'unique' ->> 'on_duplicate', 'skip') AS on_duplicate,
               (e.value ->> 'batch_id')::bigint AS batch_id,
               e.value ->> 'traceparent' AS traceparent
        FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, ord)
        JOIN jobhost.job_types t ON t.name = e.value ->> 'job'
        ORDER BY e.ord
    ) p;
    ids := ARRAY(SELECT nextval('jobhost.job_ids') FROM generate_series(1, n) ORDER BY 1);

    -- Claims, for the until-executed keys: claimants[k] is the job holding
    -- element k's key (its own id when it won), 0 without a claim. (Arrays
    -- are read by unnest, not by subscript: a subscript into an array of
    -- text walks it from the start.)
    SELECT array_agg(p.k), array_agg(p.job), array_agg(p.unique_key), array_agg(p.id)
    INTO claim_at, claim_jobs, claim_keys, claim_ids
    FROM (
        SELECT p.k, p.job, p.unique_key, p.id
        FROM unnest(names, unique_keys, while_executing, ids) WITH ORDINALITY AS p(job, unique_key, while_executing, id, k)
        WHERE p.unique_key IS NOT NULL AND NOT p.while_executing
        ORDER BY p.k
    ) p;
    IF claim_at IS NULL THEN
        claimants := array_fill(0::bigint, ARRAY[n]);
    ELSE
        SELECT array_agg(coalesce(c.claimant, 0) ORDER BY k.k) INTO claimants
        FROM generate_series(1, n) AS k(k)
        LEFT JOIN (
            SELECT a.at, c.claimant
            FROM unnest(claim_at) WITH ORDINALITY AS a(at, pos)
            JOIN jobhost.claim_unique(claim_jobs, claim_keys, claim_ids) c ON c.ord = a.pos
        ) c ON c.at = k.k;
    END IF;

    -- Duplicates whose type does more than answer with the holder, in
    -- input order: raise refuses the call, replace gives a waiting holder
    -- this job's payload and time.
    IF claim_at IS NOT NULL THEN
        FOR dup IN
            SELECT p.k, p.job, p.unique_key, p.on_duplicate, p.payload, p.due, p.concurrency_key, p.claimant
            FROM unnest(names, unique_keys, on_duplicate, payloads, dues, concurrency_keys, claimants, ids)
                WITH ORDINALITY AS p(job, unique_key, on_duplicate, payload, due, concurrency_key, claimant, id, k)
            WHERE p.claimant <> 0 AND p.claimant <> p.id AND p.on_duplicate IN ('raise', 'replace')
            ORDER BY p.k
        LOOP
            IF dup.on_duplicate = 'replace' THEN
                PERFORM jobhost.replace_waiting(dup.claimant, dup.payload, dup.due, dup.concurrency_key);
            ELSIF dup.claimant = ANY(ids) THEN
                RAISE EXCEPTION 'job "%": two jobs of this enqueue have the unique key "%"', dup.job, dup.unique_key
                    USING ERRCODE = 'JHU01';
            ELSE
                RAISE EXCEPTION 'job "%" with unique key "%" is a duplicate of job %', dup.job, dup.unique_key,
                    dup.claimant USING ERRCODE = 'JHU01';
            END IF;
        END LOOP;
    END IF;

    -- The new jobs' while_executing keys and trace contexts, and the jobs
    -- themselves through the gate (jobhost.insert_jobs: the limited jobs
    -- due now are admitted, blocked or discarded as they are written). The
    -- keys go first: a job the gate discards is archived, and the archive
    -- takes its key with it.
    IF true = ANY(while_executing) THEN
        INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
        SELECT p.id, p.job, p.unique_key, true
        FROM unnest(ids, names, unique_keys, while_executing, claimants)
            AS p(id, job, unique_key, while_executing, claimant)
        WHERE p.unique_key IS NOT NULL AND p.while_executing AND p.claimant IN (0, p.id);
    END IF;
    PERFORM jobhost.insert_jobs(
        array_agg(p.job), array_agg(p.queue), array_agg(p.priority), array_agg(p.payload), array_agg(p.max_attempts),
        array_agg(p.due), array_agg(0::bigint), array_agg(p.concurrency_key), array_agg(NULL::bigint),
        array_agg(p.id), array_agg(p.batch_id), array_agg(NULL::timestamptz))
    FROM (
        SELECT p.*
        FROM unnest(ids, names, queues, priorities, payloads, dues, attempts, concurrency_keys, batch_ids, claimants)
            WITH ORDINALITY AS p(id, job, queue, priority, payload, due, max_attempts, concurrency_key, batch_id,
                                 claimant, k)
        WHERE p.claimant IN (0, p.id)
        ORDER BY p.k
    ) p;
    IF cardinality(array_remove(traces, NULL)) > 0 THEN
        INSERT INTO jobhost.job_traces (job_id, traceparent)
        SELECT p.id, p.traceparent
        FROM unnest(ids, traces, claimants) AS p(id, traceparent, claimant)
        WHERE p.traceparent IS NOT NULL AND p.claimant IN (0, p.id);
    END IF;

    -- The batches' counts (after the gate: a result takes a key before a
    -- batch, and so does this).
    batch_members := ARRAY(
        SELECT p.batch_id FROM unnest(batch_ids, ids, claimants) AS p(batch_id, id, claimant)
        WHERE p.claimant IN (0, p.id) AND p.batch_id IS NOT NULL);
    IF cardinality(batch_members) > 0 THEN
        PERFORM jobhost.batch_add_members(batch_members, array_fill(false, ARRAY[cardinality(batch_members)]));
    END IF;

    RETURN QUERY
    SELECT p.k, CASE WHEN p.claimant = 0 THEN p.id ELSE p.claimant END, p.claimant NOT IN (0, p.id)
    FROM unnest(ids, claimants) WITH ORDINALITY AS p(id, claimant, k)
    ORDER BY p.k;
END;
$_$;


--
-- Name: event_matches(jsonb, jsonb); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.event_matches(wanted jsonb, payload jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM jsonb_each_text(wanted) m
        WHERE jsonb_typeof(payload -> m.key) IS DISTINCT FROM 'string'
              AND jsonb_typeof(payload -> m.key) IS DISTINCT FROM 'number'
              AND jsonb_typeof(payload -> m.key) IS DISTINCT FROM 'boolean'
           OR (payload ->> m.key) IS DISTINCT FROM m.value
    )
$$;


--
-- Name: event_send(text, jsonb, text, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.event_send(event_key text, event_payload jsonb, idempotency text DEFAULT NULL::text, event_source text DEFAULT 'sql'::text, OUT id bigint, OUT released integer, OUT duplicate boolean) RETURNS record
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


--
-- Name: expire_leases(timestamp with time zone, bigint[], integer); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.expire_leases(due_by timestamp with time zone, only_ids bigint[], max_jobs integer, OUT requeued integer, OUT failed integer, OUT held_back integer) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    expired bigint[];
    ending bigint[];
    keyed bigint[];
    with_semaphore bigint[];
    keys_locked bigint[];
    batched bigint[];
    batch_ids bigint[];
    batches_locked bigint[];
    waiting bigint[];
    freed_jobs text[];
    freed_keys text[];
BEGIN
    requeued := 0;
    failed := 0;
    held_back := 0;
    SELECT coalesce(array_agg(e.id), '{}') INTO expired FROM (
        SELECT j.id FROM jobhost.jobs j
        WHERE j.state = 'running' AND j.lease_expires_at < due_by
          AND (only_ids IS NULL OR j.id = ANY(only_ids))
        ORDER BY j.lease_expires_at
        LIMIT max_jobs
        FOR UPDATE SKIP LOCKED
    ) e;
    IF cardinality(expired) = 0 THEN
        RETURN;
    END IF;
    -- The jobs this expiry ends, and what each needs locked.
    SELECT coalesce(array_agg(j.id), '{}'),
           coalesce(array_agg(j.id) FILTER (WHERE j.concurrency_key IS NOT NULL), '{}'),
           coalesce(array_agg(j.id) FILTER (WHERE j.batch_id IS NOT NULL), '{}'),
           coalesce(array_agg(DISTINCT j.batch_id) FILTER (WHERE j.batch_id IS NOT NULL), '{}')
    INTO ending, keyed, batched, batch_ids
    FROM jobhost.jobs j
    WHERE j.id = ANY(expired) AND jobhost.expiry_ends(j);
    IF cardinality(keyed) > 0 THEN
        SELECT coalesce(array_agg(l.id), '{}') INTO keys_locked FROM (
            SELECT j.id FROM jobhost.jobs j
            JOIN jobhost.semaphores s ON s.job = j.job AND s.key = j.concurrency_key
            WHERE j.id = ANY(keyed)
            ORDER BY s.job, s.key
            FOR UPDATE OF s SKIP LOCKED
        ) l;
        -- A key whose row is missing (deleted by hand) has nothing to wait for.
        SELECT coalesce(array_agg(j.id), '{}') INTO with_semaphore
        FROM jobhost.jobs j JOIN jobhost.semaphores s ON s.job = j.job AND s.key = j.concurrency_key
        WHERE j.id = ANY(keyed);
        waiting := ARRAY(SELECT unnest(with_semaphore) EXCEPT SELECT unnest(keys_locked));
    ELSE
        waiting := '{}';
    END IF;
    IF cardinality(batch_ids) > 0 THEN
        SELECT coalesce(array_agg(l.id), '{}') INTO batches_locked FROM (
            SELECT b.id FROM jobhost.batches b
            WHERE b.id = ANY(batch_ids)
            ORDER BY b.id
            FOR UPDATE OF b SKIP LOCKED
        ) l;
        waiting := waiting || ARRAY(
            SELECT j.id FROM jobhost.jobs j
            JOIN jobhost.batches b ON b.id = j.batch_id
            WHERE j.id = ANY(batched) AND b.id <> ALL(batches_locked));
    END IF;
    IF cardinality(waiting) > 0 THEN
        SELECT count(DISTINCT w) INTO held_back FROM unnest(waiting) AS w;
        expired := ARRAY(SELECT unnest(expired) EXCEPT SELECT unnest(waiting));
    END IF;
    WITH noted AS (
        SELECT j.id, jobhost.expiry_ends(j) AS spent,
               j.cancel_requested_at IS NOT NULL AS cancelled,
               NOT jobhost.expiry_charges(j) AS refund,
               j.errors || jsonb_build_array(jsonb_build_object(
                   'attempt', j.attempt, 'at', now(),
                   'error', CASE WHEN jobhost.expiry_charges(j)
                                 THEN format('lease expired: host %s stopped during the run, attempt %s of %s',
                                             j.host_id, j.attempt, j.max_attempts)
                                 ELSE format('lease expired before host %s started the run: attempt %s given back',
                                             j.host_id, j.attempt)
                            END
                            || CASE WHEN j.cancel_requested_at IS NOT NULL
                                    THEN '; cancelled by an operator while running' ELSE '' END)) AS errors
        FROM jobhost.jobs j
        WHERE j.id = ANY(expired)
    ),
    gone AS (
        DELETE FROM jobhost.jobs j USING noted n
        WHERE j.id = n.id AND n.spent
        RETURNING j.*, n.errors AS new_errors, n.cancelled
    ),
    archived AS (
        INSERT INTO jobhost.archive
            (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
             enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id, unique_key,
             key_carried)
        SELECT id, job, queue, priority, payload, CASE WHEN cancelled THEN 'cancelled' ELSE 'failed' END,
               attempt, max_attempts, new_errors, progress,
               enqueued_at, started_at, now(), host_id, concurrency_key, batch_id, parent_id, unique_key, true
        FROM gone
        RETURNING id, job, concurrency_key
    ),
    back AS (
        UPDATE jobhost.jobs j
        SET state = 'available', run_at = now(), errors = n.errors,
            attempt = j.attempt - n.refund::int, unconfirmed_expiries = j.unconfirmed_expiries + n.refund::int,
            lease_token = NULL, lease_secs = NULL, lease_expires_at = NULL, host_id = NULL
        FROM noted n
        WHERE j.id = n.id AND NOT n.spent
        RETURNING j.id
    )
    SELECT (SELECT count(*) FROM back), (SELECT count(*) FROM archived),
           (SELECT coalesce(array_agg(a.job), '{}') FROM archived a WHERE a.concurrency_key IS NOT NULL),
           (SELECT coalesce(array_agg(a.concurrency_key), '{}') FROM archived a WHERE a.concurrency_key IS NOT NULL)
    INTO requeued, failed, freed_jobs, freed_keys;
    IF cardinality(freed_jobs) > 0 THEN
        PERFORM jobhost.release_slots(freed_jobs, freed_keys);
    END IF;
    IF requeued > 0 THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
END;
$$;


--
-- Name: job_ids; Type: SEQUENCE; Schema: jobhost; Owner: -
--

CREATE SEQUENCE jobhost.job_ids
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: jobs; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.jobs (
    id bigint DEFAULT nextval('jobhost.job_ids'::regclass) NOT NULL,
    job text NOT NULL,
    queue text NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    payload jsonb NOT NULL,
    state text NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    enqueued_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    lease_token bigint,
    lease_secs integer,
    lease_expires_at timestamp with time zone,
    host_id text,
    concurrency_key text,
    batch_id bigint,
    parent_id bigint,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    progress jsonb,
    cancel_requested_at timestamp with time zone,
    confirmed_token bigint,
    unconfirmed_expiries smallint DEFAULT 0 NOT NULL,
    unique_key text,
    CONSTRAINT jobs_check CHECK (((state = 'running'::text) = (lease_token IS NOT NULL))),
    CONSTRAINT jobs_errors_check CHECK ((jsonb_typeof(errors) = 'array'::text)),
    CONSTRAINT jobs_max_attempts_check CHECK ((max_attempts >= 1)),
    CONSTRAINT jobs_state_check CHECK ((state = ANY (ARRAY['scheduled'::text, 'available'::text, 'running'::text])))
);


--
-- Name: expiry_charges(jobhost.jobs); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.expiry_charges(j jobhost.jobs) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT j.confirmed_token IS NOT DISTINCT FROM j.lease_token OR j.unconfirmed_expiries >= 3
$$;


--
-- Name: expiry_ends(jobhost.jobs); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.expiry_ends(j jobhost.jobs) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT j.cancel_requested_at IS NOT NULL OR (jobhost.expiry_charges(j) AND j.attempt >= j.max_attempts)
$$;


--
-- Name: fetch(text[], text[], integer[], bigint, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost."fetch"(queues text[], job_types text[], lease_secs integer[], max_jobs bigint, host text) RETURNS SETOF jobhost.jobs
    LANGUAGE plpgsql
    SET enable_sort TO 'off'
    SET jit TO 'off'
    AS $$
DECLARE
    chosen bigint[];
    sent_back bigint[] := '{}';
BEGIN
    SELECT coalesce(array_agg(c.id), '{}') INTO chosen
    FROM (
        SELECT j.id
        FROM jobhost.jobs j
        WHERE j.state = 'available'
          AND j.queue = ANY(queues)
          AND j.job = ANY(job_types)
          AND NOT EXISTS (
              SELECT 1
              FROM jobhost.unique_keys k
              JOIN jobhost.unique_claims c ON c.job = k.job AND c.unique_key = k.unique_key
              WHERE k.job_id = j.id AND k.while_executing)
        ORDER BY j.priority, j.run_at, j.id
        LIMIT max_jobs
        FOR UPDATE OF j SKIP LOCKED
    ) c;
    IF cardinality(chosen) = 0 THEN
        RETURN;
    END IF;
    -- Two index probes, whatever the number of types served.
    IF EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = ANY(job_types) AND t.config ? 'rate_limit')
       OR EXISTS (SELECT 1 FROM jobhost.rate_keys r
                  WHERE r.job = ANY(job_types) AND r.throttled_until IS NOT NULL AND r.throttled_until > now()) THEN
        sent_back := jobhost.rate_start(chosen);
    END IF;

    RETURN QUERY
    WITH picked AS (
        SELECT j.id, j.job FROM jobhost.jobs j
        WHERE j.id = ANY(chosen) AND NOT j.id = ANY(sent_back)
    ),
    tokens AS (
        SELECT p.id, p.job, nextval('jobhost.lease_tokens') AS token FROM picked p
    ),
    exclusive AS (
        SELECT t.id, t.token, k.job, k.unique_key
        FROM tokens t
        JOIN jobhost.unique_keys k ON k.job_id = t.id AND k.while_executing
    ),
    claimed AS (
        INSERT INTO jobhost.unique_claims (job, unique_key, job_id, lease_token)
        SELECT e.job, e.unique_key, e.id, e.token FROM exclusive e
        ORDER BY e.job, e.unique_key, e.id
        ON CONFLICT DO NOTHING
        RETURNING job_id
    ),
    leases AS (
        SELECT t.id, t.token, s.lease_secs
        FROM tokens t
        JOIN unnest(job_types, lease_secs) AS s(job, lease_secs) ON s.job = t.job
        WHERE t.id NOT IN (SELECT e.id FROM exclusive e)
           OR t.id IN (SELECT c.job_id FROM claimed c)
    )
    UPDATE jobhost.jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        lease_token = l.token,
        lease_secs = l.lease_secs,
        lease_expires_at = now() + l.lease_secs * interval '1 second',
        host_id = host,
        started_at = now()
    FROM leases l
    WHERE j.id = l.id
    RETURNING j.*;
END;
$$;


--
-- Name: fetch_ahead(text[], text[], bigint); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.fetch_ahead(queues text[], job_types text[], max_jobs bigint) RETURNS SETOF smallint
    LANGUAGE plpgsql STABLE
    SET enable_sort TO 'off'
    AS $$
BEGIN
    RETURN QUERY
    SELECT j.priority FROM jobhost.jobs j
    WHERE j.state = 'available' AND j.queue = ANY(queues) AND j.job = ANY(job_types)
    ORDER BY j.priority, j.run_at, j.id
    LIMIT max_jobs;
END;
$$;


--
-- Name: finish_runs(bigint[], bigint[], text[], jsonb[], jsonb[], jsonb[], jsonb[], bigint[], bigint[], bigint[], integer[], jsonb[], jsonb[], text[], text[], integer[], bigint, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.finish_runs(archive_ids bigint[], archive_tokens bigint[], archive_states text[], outputs jsonb[], archive_errors jsonb[], logs jsonb[], archive_progress jsonb[], requeue_ids bigint[], requeue_tokens bigint[], delays_ms bigint[], refunds integer[], requeue_errors jsonb[], requeue_progress jsonb[], queues text[] DEFAULT '{}'::text[], fetch_types text[] DEFAULT '{}'::text[], fetch_leases integer[] DEFAULT '{}'::integer[], max_jobs bigint DEFAULT 0, host text DEFAULT ''::text) RETURNS TABLE(written bigint[], any_available boolean, id bigint, lease_token bigint, job text, queue text, payload jsonb, attempt integer, max_attempts integer, enqueued_at timestamp with time zone, batch_id bigint, concurrency_key text, lease_secs integer)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    archived bigint[];
    freed_jobs text[];
    freed_keys text[];
    requeued bigint[];
    waiting_jobs text[];
    waiting_keys text[];
    available_now boolean;
    promoted integer := 0;
    leased jobhost.jobs[] := '{}';
    promoted_leased integer := 0;
    fetched jobhost.jobs[];
    left_available boolean := false;
BEGIN
    archived := '{}';
    freed_jobs := '{}';
    freed_keys := '{}';
    requeued := '{}';
    waiting_jobs := '{}';
    waiting_keys := '{}';
    available_now := false;
    IF cardinality(archive_ids) > 0 THEN
        WITH input AS (
            SELECT *
            FROM unnest(archive_ids, archive_tokens, archive_states, outputs, archive_errors, logs, archive_progress)
                AS i(id, lease_token, state, output, error, log, progress)
        ),
        ended AS (
            DELETE FROM jobhost.jobs j
            USING input i
            WHERE j.id = i.id AND j.lease_token = i.lease_token
            RETURNING j.*
        ),
        moved AS (
            INSERT INTO jobhost.archive
                (id, job, queue, priority, payload, state, attempt, max_attempts, output, errors, log, progress,
                 enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id, unique_key,
                 key_carried)
            SELECT e.id, e.job, e.queue, e.priority, e.payload, i.state, e.attempt, e.max_attempts, i.output,
                   CASE WHEN i.error IS NULL THEN e.errors
                        ELSE e.errors || jsonb_build_array(i.error || jsonb_build_object('at', now())) END,
                   i.log, coalesce(i.progress, e.progress),
                   e.enqueued_at, e.started_at, now(), e.host_id, e.concurrency_key, e.batch_id, e.parent_id,
                   e.unique_key, true
            FROM ended e
            JOIN input i ON i.id = e.id
            RETURNING id, job, concurrency_key
        )
        SELECT coalesce(array_agg(m.id), '{}'),
               coalesce(array_agg(m.job) FILTER (WHERE m.concurrency_key IS NOT NULL), '{}'),
               coalesce(array_agg(m.concurrency_key) FILTER (WHERE m.concurrency_key IS NOT NULL), '{}')
        INTO archived, freed_jobs, freed_keys
        FROM moved m;
    END IF;

    IF cardinality(requeue_ids) > 0 THEN
        WITH input AS (
            SELECT *
            FROM unnest(requeue_ids, requeue_tokens, delays_ms, refunds, requeue_errors, requeue_progress)
                AS i(id, lease_token, delay_ms, refund, error, progress)
        ),
        back AS (
            UPDATE jobhost.jobs j
            SET state = CASE WHEN i.delay_ms > 0 THEN 'scheduled' ELSE 'available' END,
                run_at = now() + i.delay_ms * interval '1 millisecond',
                attempt = j.attempt - i.refund,
                errors = CASE WHEN i.error IS NULL THEN j.errors
                              ELSE j.errors || jsonb_build_array(i.error || jsonb_build_object('at', now())) END,
                progress = coalesce(i.progress, j.progress),
                lease_token = NULL,
                lease_secs = NULL,
                lease_expires_at = NULL,
                host_id = NULL
            FROM input i
            WHERE j.id = i.id AND j.lease_token = i.lease_token
            RETURNING j.id, j.state, j.job, j.concurrency_key
        )
        SELECT coalesce(array_agg(b.id), '{}'),
               coalesce(array_agg(b.job) FILTER (WHERE b.state = 'scheduled' AND b.concurrency_key IS NOT NULL), '{}'),
               coalesce(array_agg(b.concurrency_key) FILTER (WHERE b.state = 'scheduled' AND b.concurrency_key IS NOT NULL),
                        '{}'),
               coalesce(bool_or(b.state = 'available'), false)
        INTO requeued, waiting_jobs, waiting_keys, available_now
        FROM back b;
    END IF;

    IF cardinality(freed_jobs) + cardinality(waiting_jobs) > 0 THEN
        -- What the fetch below would lease of these promotions goes in
        -- leased already; nobody is woken for the rest yet (see
        -- notify_available and 0012).
        IF max_jobs > 0 THEN
            PERFORM set_config('jobhost.promotions_unannounced', 'on', true);
        END IF;
        SELECT r.promoted, r.leased INTO promoted, leased
        FROM jobhost.release_slots_leasing(freed_jobs || waiting_jobs, freed_keys || waiting_keys,
                                           queues, fetch_types, fetch_leases, max_jobs, host) r;
        promoted_leased := cardinality(leased);
        PERFORM set_config('jobhost.promotions_unannounced', '', true);
    END IF;
    IF available_now THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
    written := archived || requeued;
    IF max_jobs > 0 THEN
        IF max_jobs > cardinality(leased) THEN
            SELECT array_agg(f) INTO fetched
            FROM jobhost.fetch(queues, fetch_types, fetch_leases, max_jobs - cardinality(leased), host) f;
            leased := leased || coalesce(fetched, '{}');
        END IF;
        IF promoted > promoted_leased THEN
            -- A promoted job left available (the host's budget was spent, or
            -- the job's queue is one this host does not serve) is announced
            -- now. Any available job on a key this call freed counts: a
            -- needless wake-up costs one empty fetch, a missed one a
            -- promoted job waiting for the next poll.
            SELECT EXISTS (
                SELECT 1 FROM jobhost.jobs j
                JOIN unnest(freed_jobs || waiting_jobs, freed_keys || waiting_keys) AS f(job, key)
                    ON j.job = f.job AND j.concurrency_key = f.key
                WHERE j.state = 'available'
            ) INTO left_available;
            IF left_available THEN
                PERFORM pg_notify('jobhost_available', '');
            END IF;
        END IF;
    ELSE
        left_available := promoted > 0;
    END IF;
    -- Whether the writing host should look for more: only what it did not lease.
    any_available := available_now OR left_available;
    IF cardinality(leased) > 0 THEN
        RETURN QUERY
        SELECT written, any_available, j.id, j.lease_token, j.job, j.queue, j.payload, j.attempt, j.max_attempts,
               j.enqueued_at, j.batch_id, j.concurrency_key, j.lease_secs
        FROM unnest(leased) j;
        RETURN;
    END IF;
    RETURN QUERY SELECT written, any_available, NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::jsonb,
                        NULL::integer, NULL::integer, NULL::timestamptz, NULL::bigint, NULL::text, NULL::integer;
END;
$$;


--
-- Name: finish_runs_unless_locked(bigint[], bigint[], bigint[], bigint[], text[], jsonb[], jsonb[], jsonb[], jsonb[], bigint[], bigint[], bigint[], integer[], jsonb[], jsonb[], text[], text[], integer[], bigint, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.finish_runs_unless_locked(keyed_ids bigint[], keyed_tokens bigint[], archive_ids bigint[], archive_tokens bigint[], archive_states text[], outputs jsonb[], archive_errors jsonb[], logs jsonb[], archive_progress jsonb[], requeue_ids bigint[], requeue_tokens bigint[], delays_ms bigint[], refunds integer[], requeue_errors jsonb[], requeue_progress jsonb[], queues text[], fetch_types text[], fetch_leases integer[], max_jobs bigint, host text) RETURNS TABLE(deferred bigint[], written bigint[], any_available boolean, id bigint, lease_token bigint, job text, queue text, payload jsonb, attempt integer, max_attempts integer, enqueued_at timestamp with time zone, batch_id bigint, concurrency_key text, lease_secs integer)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    keyed bigint[];
    keys_locked bigint[] := '{}';
    batched bigint[];
    batch_ids bigint[];
    batches_locked bigint[] := '{}';
    previous_timeout text;
    held_back bigint[] := '{}';
BEGIN
    IF cardinality(keyed_ids) > 0 THEN
        -- Every current run of the plan is locked first, in id order, and
        -- the ones among keyed_ids say what else each needs locked. Job
        -- rows come first in every path that ends a job: this transaction
        -- never holds a key or a batch while it waits for a job row (an
        -- expiry holding one ends it quickly and waits for nothing).
        SELECT coalesce(array_agg(j.id) FILTER (WHERE j.concurrency_key IS NOT NULL), '{}'),
               coalesce(array_agg(j.id) FILTER (WHERE j.batch_id IS NOT NULL), '{}'),
               coalesce(array_agg(DISTINCT j.batch_id) FILTER (WHERE j.batch_id IS NOT NULL), '{}')
        INTO keyed, batched, batch_ids
        FROM (
            SELECT j.id, j.concurrency_key, j.batch_id
            FROM jobhost.jobs j
            JOIN unnest(archive_ids || requeue_ids, archive_tokens || requeue_tokens) AS r(run_id, run_token)
                ON r.run_id = j.id AND r.run_token = j.lease_token
            ORDER BY j.id
            FOR UPDATE OF j
        ) j
        WHERE j.id = ANY(keyed_ids);
        IF cardinality(keyed) > 0 THEN
            SELECT coalesce(array_agg(l.id), '{}') INTO keys_locked FROM (
                SELECT j.id FROM jobhost.jobs j
                JOIN jobhost.semaphores s ON s.job = j.job AND s.key = j.concurrency_key
                WHERE j.id = ANY(keyed)
                ORDER BY s.job, s.key
                FOR UPDATE OF s SKIP LOCKED
            ) l;
        END IF;
        IF cardinality(batch_ids) > 0 THEN
            -- Another host's result holds a batch's row for a moment: wait
            -- for it, briefly. Only a lock held longer (an application's
            -- open transaction) defers results: a deferred result costs a
            -- second write, and members of one batch end on many hosts at once.
            previous_timeout := current_setting('lock_timeout');
            BEGIN
                PERFORM set_config('lock_timeout', '50ms', true);
                PERFORM 1 FROM jobhost.batches b WHERE b.id = ANY(batch_ids) ORDER BY b.id FOR UPDATE;
                batches_locked := batch_ids;
            EXCEPTION WHEN lock_not_available THEN
                SELECT coalesce(array_agg(l.id), '{}') INTO batches_locked FROM (
                    SELECT b.id FROM jobhost.batches b
                    WHERE b.id = ANY(batch_ids)
                    ORDER BY b.id
                    FOR UPDATE OF b SKIP LOCKED
                ) l;
            END;
            PERFORM set_config('lock_timeout', previous_timeout, true);
        END IF;
        -- Usually every key and batch was free: nothing more to read.
        IF cardinality(keys_locked) < cardinality(keyed) OR cardinality(batches_locked) < cardinality(batch_ids) THEN
            SELECT coalesce(array_agg(DISTINCT j.id), '{}') INTO held_back
            FROM jobhost.jobs j
            WHERE (j.id = ANY(keyed) AND j.id <> ALL(keys_locked))
               OR (j.id = ANY(batched) AND j.batch_id <> ALL(batches_locked));
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


--
-- Name: insert_jobs(text[], text[], smallint[], jsonb[], integer[], timestamp with time zone[], bigint[], text[], bigint[], bigint[], bigint[], timestamp with time zone[], text[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.insert_jobs(jobs text[], queues text[], priorities smallint[], payloads jsonb[], attempts integer[], ats timestamp with time zone[], delays bigint[], concurrency_keys text[], parents bigint[], chosen_ids bigint[], batches bigint[], planned timestamp with time zone[], unique_keys text[] DEFAULT NULL::text[]) RETURNS bigint[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    ids bigint[];
    dues timestamptz[];
    key_jobs text[];
    key_names text[];
    key_counts integer[];
    key_limits integer[];
    key_taken integer[];
    key_conflicts text[];
    places text[];
    reasons text[];
    ranks bigint[];
    sole_place text;
BEGIN
    IF coalesce(cardinality(jobs), 0) = 0 THEN
        RETURN ARRAY[]::bigint[];
    END IF;
    -- Ids (taken in input order) and due times.
    SELECT array_agg(u.id), array_agg(u.due) INTO ids, dues
    FROM (
        SELECT coalesce(u.id, nextval('jobhost.job_ids')) AS id,
               greatest(coalesce(u.at, now() + u.delay_ms * interval '1 millisecond'), u.planned) AS due
        FROM (
            SELECT * FROM unnest(chosen_ids, ats, delays, planned) WITH ORDINALITY AS u(id, at, delay_ms, planned, ord)
            ORDER BY u.ord
        ) u
    ) u;

    -- The keys of the limited jobs due now, in (job, key) order.
    SELECT array_agg(w.job), array_agg(w.key), array_agg(w.n)
    INTO key_jobs, key_names, key_counts
    FROM (
        SELECT u.job, u.key, count(*)::integer AS n
        FROM (
            -- Sorted, then counted: one sort of the jobs, where counting
            -- first by hashing and then sorting the keys costs more when
            -- most keys are distinct (a sync of one job a key).
            SELECT u.job, u.key
            FROM unnest(jobs, concurrency_keys, dues) AS u(job, key, due)
            WHERE u.key IS NOT NULL AND u.due <= now()
            ORDER BY 1, 2
        ) u
        GROUP BY 1, 2
        ORDER BY 1, 2
    ) w;

    IF key_jobs IS NOT NULL THEN
        SELECT g.slot_limits, g.taken, g.on_conflicts INTO key_limits, key_taken, key_conflicts
        FROM jobhost.take_slots(key_jobs, key_names, key_counts, true) g;
    END IF;

    -- Where each job goes: jobs, blocked_jobs or the archive (its key's
    -- first `taken` jobs due now, by priority then arrival, get its slots).
    -- A call whose jobs all go one way is not decided job by job: without
    -- limited jobs due now (a plain enqueue), or with every one admitted
    -- (new keys, most likely), all go into jobs; with every job limited,
    -- due now and blocked (keys whose slots are all held, on_conflict
    -- block), all go to blocked_jobs. Otherwise one pass joins the jobs to
    -- their keys, in input order; only when a key takes some of its jobs
    -- but not all are the jobs ranked within their keys first (a sort on
    -- the keys; otherwise a key's jobs all go the same way).
    IF key_jobs IS NULL OR key_taken = key_counts THEN
        sole_place := 'jobs';
    ELSIF 0 = ALL(key_taken) AND 'block' = ALL(key_conflicts)
          AND (SELECT sum(n) FROM unnest(key_counts) AS n) = cardinality(jobs) THEN
        sole_place := 'blocked';
    ELSE
        IF EXISTS (SELECT FROM unnest(key_taken, key_counts) AS t(taken, n) WHERE t.taken > 0 AND t.taken < t.n) THEN
            SELECT array_agg(r.rank ORDER BY r.ord) INTO ranks
            FROM (
                SELECT v.ord, row_number() OVER (PARTITION BY v.job, v.key, v.due <= now() ORDER BY v.priority, v.id) AS rank
                FROM unnest(jobs, concurrency_keys, priorities, ids, dues) WITH ORDINALITY AS v(job, key, priority, id, due, ord)
            ) r;
        END IF;
        SELECT array_agg(p.place), array_agg(p.reason) INTO places, reasons
        FROM (
            SELECT v.ord,
                   CASE WHEN k.job IS NULL OR coalesce(ranks[v.ord::integer], 1) <= k.taken THEN 'jobs'
                        WHEN k.on_conflict IN ('discard', 'raise') THEN 'archive'
                        ELSE 'blocked' END AS place,
                   CASE WHEN k.job IS NOT NULL AND coalesce(ranks[v.ord::integer], 1) > k.taken
                             AND k.on_conflict IN ('discard', 'raise')
                        THEN format('concurrency limit reached: all %s slots of key "%s" are taken', k.slot_limit, k.key)
                   END AS reason
            FROM unnest(jobs, concurrency_keys, dues) WITH ORDINALITY AS v(job, key, due, ord)
            LEFT JOIN unnest(key_jobs, key_names, key_limits, key_taken, key_conflicts)
                AS k(job, key, slot_limit, taken, on_conflict) ON k.job = v.job AND k.key = v.key AND v.due <= now()
            ORDER BY v.ord
        ) p;
    END IF;

    IF sole_place = 'jobs' OR 'jobs' = ANY(places) THEN
        INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, max_attempts, run_at, concurrency_key,
                                  parent_id, batch_id, unique_key)
        SELECT u.id, u.job, u.queue, u.priority, u.payload,
               CASE WHEN u.due > now() THEN 'scheduled' ELSE 'available' END,
               u.max_attempts, greatest(u.due, now()), u.key, u.parent_id, u.batch_id, u.unique_key
        FROM unnest(ids, jobs, queues, priorities, payloads, attempts, dues, concurrency_keys, parents, batches, places,
                    unique_keys)
            WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, due, key, parent_id, batch_id, place,
                                 unique_key, ord)
        WHERE coalesce(u.place, sole_place) = 'jobs'
        ORDER BY u.ord;
    END IF;
    IF sole_place = 'blocked' OR 'blocked' = ANY(places) THEN
        INSERT INTO jobhost.blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
                                          concurrency_key, batch_id, parent_id, errors, unique_key)
        SELECT u.id, u.job, u.queue, u.priority, u.payload, 0, u.max_attempts, now(), u.key, u.batch_id,
               u.parent_id, '[]', u.unique_key
        FROM unnest(ids, jobs, queues, priorities, payloads, attempts, concurrency_keys, parents, batches, places,
                    unique_keys)
            WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, key, parent_id, batch_id, place,
                                 unique_key, ord)
        WHERE coalesce(u.place, sole_place) = 'blocked'
        ORDER BY u.ord;
    END IF;
    IF 'archive' = ANY(places) THEN
        INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                     enqueued_at, finished_at, concurrency_key, batch_id, parent_id, unique_key,
                                     key_carried)
        SELECT u.id, u.job, u.queue, u.priority, u.payload, 'discarded', 0, u.max_attempts,
               jsonb_build_array(jsonb_build_object('attempt', 0, 'at', now(), 'error', u.reason)),
               now(), now(), u.key, u.batch_id, u.parent_id, u.unique_key, true
        FROM unnest(ids, jobs, queues, priorities, payloads, attempts, concurrency_keys, parents, batches, places,
                    reasons, unique_keys)
            WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, key, parent_id, batch_id, place,
                                 reason, unique_key, ord)
        WHERE u.place = 'archive'
        ORDER BY u.ord;
    END IF;
    RETURN ids;
END;
$$;


--
-- Name: job_types_forward_only(); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.job_types_forward_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    incoming bigint;
    stored   bigint;
BEGIN
    INSERT INTO jobhost.job_type_digests (name, digest) VALUES (NEW.name, NEW.digest)
        ON CONFLICT (name, digest) DO NOTHING;
    IF TG_OP = 'UPDATE' AND NEW.digest IS DISTINCT FROM OLD.digest THEN
        SELECT seq INTO incoming FROM jobhost.job_type_digests WHERE name = NEW.name AND digest = NEW.digest;
        SELECT seq INTO stored FROM jobhost.job_type_digests WHERE name = OLD.name AND digest = OLD.digest;
        IF incoming < stored THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN NEW;
END;
$$;


--
-- Name: keep_newest_errors(); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.keep_newest_errors() RETURNS trigger
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


--
-- Name: key_renders(text, jsonb); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.key_renders(template text, payload jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT jsonb_typeof(payload) = 'object'
       AND NOT EXISTS (
           SELECT 1
           FROM regexp_matches(replace(replace(template, '{{', ''), '}}', ''), '\{([^{}]*)\}', 'g') AS m(field)
           WHERE coalesce(jsonb_typeof(payload -> m.field[1]), 'null') NOT IN ('string', 'number', 'boolean'))
$$;


--
-- Name: lock_for_ending(bigint[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.lock_for_ending(job_ids bigint[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM 1 FROM jobhost.jobs j WHERE j.id = ANY(job_ids) ORDER BY j.id FOR UPDATE;
    PERFORM 1 FROM jobhost.semaphores s
    WHERE (s.job, s.key) IN (SELECT j.job, j.concurrency_key FROM jobhost.jobs j
                             WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL)
    ORDER BY s.job, s.key
    FOR UPDATE;
    PERFORM 1 FROM jobhost.batches b
    WHERE b.id IN (SELECT j.batch_id FROM jobhost.jobs j WHERE j.id = ANY(job_ids)
                   UNION SELECT p.batch_id FROM jobhost.blocked_jobs p WHERE p.id = ANY(job_ids))
    ORDER BY b.id
    FOR UPDATE;
END;
$$;


--
-- Name: match_one(jsonb); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.match_one(wanted jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT CASE WHEN count(*) = 1 THEN jsonb_build_array(min(m.key), min(m.value))::text END
    FROM jsonb_each_text(wanted) m
$$;


--
-- Name: notify_available(); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.notify_available() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF current_setting('jobhost.promotions_unannounced', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM new_jobs WHERE state = 'available') THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
    RETURN NULL;
END;
$$;


--
-- Name: park(bigint[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.park(job_ids bigint[]) RETURNS void
    LANGUAGE sql
    AS $$
    WITH moved AS (DELETE FROM jobhost.jobs WHERE id = ANY(job_ids) RETURNING *)
    INSERT INTO jobhost.blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
                                      started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key)
    SELECT id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
           started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key
    FROM moved
$$;


--
-- Name: promotable_keys(integer); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.promotable_keys(max_keys integer) RETURNS TABLE(job text, key text)
    LANGUAGE sql STABLE
    AS $$
    SELECT b.job, b.concurrency_key
    FROM jobhost.blocked_jobs b
    LEFT JOIN jobhost.semaphores s ON s.job = b.job AND s.key = b.concurrency_key
    WHERE s.job IS NULL OR s.holders < jobhost.slot_limit(b.job)
    GROUP BY b.job, b.concurrency_key
    ORDER BY min(b.parked_at)
    LIMIT max_keys
$$;


--
-- Name: promotable_keys(text, text, integer); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.promotable_keys(after_job text, after_key text, max_keys integer) RETURNS TABLE(job text, key text, promotable boolean)
    LANGUAGE sql STABLE
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
    WITH RECURSIVE page AS (
        (SELECT b.job, b.concurrency_key AS key FROM jobhost.blocked_jobs b
         WHERE (b.job, b.concurrency_key) > (after_job, after_key)
         ORDER BY b.job, b.concurrency_key
         LIMIT 1)
        UNION ALL
        SELECT n.job, n.key
        FROM page p
        CROSS JOIN LATERAL (
            SELECT b.job, b.concurrency_key AS key FROM jobhost.blocked_jobs b
            WHERE (b.job, b.concurrency_key) > (p.job, p.key)
            ORDER BY b.job, b.concurrency_key
            LIMIT 1
        ) n
    ),
    -- The recursion stops as soon as the page is full.
    keys AS (SELECT p.job, p.key FROM page p LIMIT max_keys)
    SELECT k.job, k.key, s.job IS NULL OR s.holders < jobhost.slot_limit(k.job)
    FROM keys k
    LEFT JOIN jobhost.semaphores s ON s.job = k.job AND s.key = k.key
    ORDER BY k.job, k.key
$$;


--
-- Name: promote_due(timestamp with time zone, integer); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.promote_due(due_by timestamp with time zone, max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    due_ids bigint[];
    admitted integer;
BEGIN
    SELECT array_agg(d.id) INTO due_ids FROM (
        SELECT id FROM jobhost.jobs
        WHERE state = 'scheduled' AND run_at <= due_by
        ORDER BY run_at
        LIMIT max_jobs
        FOR UPDATE SKIP LOCKED
    ) d;
    IF due_ids IS NULL THEN
        RETURN 0;
    END IF;
    admitted := jobhost.admit(due_ids, false);
    IF admitted > 0 THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
    RETURN cardinality(due_ids);
END;
$$;


--
-- Name: promote_parked(text, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.promote_parked(job_type text, slot_key text) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    slot_limit integer := jobhost.slot_limit(job_type);
    next_id bigint;
    moved integer := 0;
BEGIN
    LOOP
        SELECT b.id INTO next_id FROM jobhost.blocked_jobs b
        WHERE b.job = job_type AND b.concurrency_key = slot_key
        ORDER BY b.priority, b.parked_at, b.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        EXIT WHEN next_id IS NULL OR NOT jobhost.take_slot(job_type, slot_key, slot_limit);
        WITH p AS (DELETE FROM jobhost.blocked_jobs WHERE id = next_id RETURNING *)
        INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, attempt, max_attempts, run_at,
                                  enqueued_at, started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key)
        SELECT id, job, queue, priority, payload, 'available', attempt, max_attempts, now(),
               enqueued_at, started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key
        FROM p;
        moved := moved + 1;
    END LOOP;
    RETURN moved;
END;
$$;


--
-- Name: rate_governed(text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.rate_governed(job_type text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = job_type AND t.config ? 'rate_limit')
        OR EXISTS (SELECT 1 FROM jobhost.rate_keys r
                   WHERE r.job = job_type AND r.throttled_until IS NOT NULL AND r.throttled_until > now());
END;
$$;


--
-- Name: rate_key(jsonb, text, jsonb, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.rate_key(config jsonb, job_type text, payload jsonb, concurrency_key text) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE
        WHEN NOT config ? 'rate_limit' THEN coalesce(concurrency_key, job_type)
        WHEN jobhost.key_renders(config -> 'rate_limit' ->> 'key', payload)
            THEN jobhost.render_key(config -> 'rate_limit' ->> 'key', payload)
        ELSE job_type
    END
$$;


--
-- Name: rate_start(bigint[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.rate_start(picked bigint[]) RETURNS bigint[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    ids bigint[];
    types text[];
    keys text[];
    limits bigint[];
    periods interval[];
    ranks bigint[];
    sent_back bigint[];
    freed_types text[];
    freed_keys text[];
    locked_types text[];
    locked_keys text[];
    passed_over bigint[];
BEGIN
    -- The governed jobs among those picked, with their keys and their
    -- rank within their key in fetch order. Of a type without a rate
    -- limit, only a throttled key's jobs are governed.
    SELECT array_agg(c.id), array_agg(c.job), array_agg(c.key), array_agg(c.lim), array_agg(c.period),
           array_agg(c.rank)
    INTO ids, types, keys, limits, periods, ranks
    FROM (
        SELECT g.*, row_number() OVER (PARTITION BY g.job, g.key ORDER BY g.priority, g.run_at, g.id) AS rank
        FROM (
            SELECT j.id, j.job, j.priority, j.run_at,
                   jobhost.rate_key(t.config, j.job, j.payload, j.concurrency_key) AS key,
                   (t.config -> 'rate_limit' ->> 'limit')::bigint AS lim,
                   (t.config -> 'rate_limit' ->> 'period_ms')::bigint * interval '1 millisecond' AS period
            FROM unnest(picked) AS p(id)
            JOIN jobhost.jobs j ON j.id = p.id
            JOIN jobhost.job_types t ON t.name = j.job
        ) g
        WHERE g.lim IS NOT NULL
           OR EXISTS (SELECT 1 FROM jobhost.rate_keys r
                      WHERE r.job = g.job AND r.key = g.key AND r.throttled_until > now())
    ) c;
    IF ids IS NULL THEN
        RETURN '{}';
    END IF;

    -- The keys' rows, created if new, then locked in (job, key) order,
    -- passing over those another transaction holds.
    INSERT INTO jobhost.rate_keys (job, key)
    SELECT DISTINCT u.job, u.key FROM unnest(types, keys) AS u(job, key) ORDER BY 1, 2
    ON CONFLICT DO NOTHING;
    SELECT array_agg(l.job), array_agg(l.key) INTO locked_types, locked_keys
    FROM (
        SELECT r.job, r.key FROM jobhost.rate_keys r
        WHERE (r.job, r.key) IN (SELECT u.job, u.key FROM unnest(types, keys) AS u(job, key))
        ORDER BY r.job, r.key
        FOR UPDATE SKIP LOCKED
    ) l;
    SELECT coalesce(array_agg(c.id), '{}') INTO passed_over
    FROM unnest(ids, types, keys) AS c(id, job, key)
    WHERE (c.job, c.key) NOT IN (SELECT * FROM unnest(coalesce(locked_types, '{}'), coalesce(locked_keys, '{}')));

    WITH candidates AS (
        SELECT c.* FROM unnest(ids, types, keys, limits, periods, ranks) AS c(id, job, key, lim, period, rank)
        WHERE (c.job, c.key) IN (SELECT * FROM unnest(locked_types, locked_keys))
    ),
    wanted AS (
        SELECT c.job, c.key, max(c.lim) AS lim, max(c.period) AS period, count(*) AS n
        FROM candidates c GROUP BY 1, 2
    ),
    windows AS (
        SELECT w.job, w.key, w.lim, w.period, w.n, r.deferred,
               array(SELECT s FROM unnest(r.starts) AS s
                     WHERE s > now() - coalesce(w.period, interval '0') ORDER BY s) AS recent,
               CASE WHEN r.throttled_until > now() THEN r.throttled_until END AS until,
               r.starts AS stored
        FROM wanted w
        JOIN jobhost.rate_keys r ON r.job = w.job AND r.key = w.key
    ),
    decided AS (
        SELECT d.*,
               CASE WHEN d.lim IS NULL THEN d.stored ELSE d.recent || array_fill(now(), ARRAY[d.started::integer]) END
                   AS after
        FROM (
            SELECT w.*,
                   CASE WHEN w.until IS NOT NULL THEN 0
                        WHEN w.lim IS NULL THEN w.n
                        ELSE least(greatest(w.lim - cardinality(w.recent), 0), w.n) END AS started
            FROM windows w
        ) d
    ),
    counted AS (
        UPDATE jobhost.rate_keys r
        SET starts = d.after, throttled_until = d.until, deferred = d.deferred + (d.n - d.started), updated_at = now()
        FROM decided d
        WHERE r.job = d.job AND r.key = d.key
    ),
    waiting AS (
        SELECT c.id,
               greatest(
                   coalesce(d.until, now()),
                   CASE WHEN d.lim IS NULL THEN now()
                        WHEN cardinality(d.after) + (c.rank - d.started) - d.lim <= 0 THEN now()
                        ELSE coalesce(d.after[(((cardinality(d.after) + (c.rank - d.started) - d.lim - 1) % d.lim) + 1)::integer],
                                      now())
                             + d.period * (1 + (cardinality(d.after) + (c.rank - d.started) - d.lim - 1) / d.lim)
                   END) AS at
        FROM candidates c
        JOIN decided d ON d.job = c.job AND d.key = c.key
        WHERE c.rank > d.started
    ),
    moved AS (
        UPDATE jobhost.jobs j SET state = 'scheduled', run_at = w.at
        FROM waiting w
        WHERE j.id = w.id
        RETURNING j.id, j.job, j.concurrency_key
    )
    SELECT coalesce(array_agg(m.id), '{}'),
           array_agg(m.job ORDER BY m.job, m.concurrency_key) FILTER (WHERE m.concurrency_key IS NOT NULL),
           array_agg(m.concurrency_key ORDER BY m.job, m.concurrency_key) FILTER (WHERE m.concurrency_key IS NOT NULL)
    INTO sent_back, freed_types, freed_keys
    FROM moved m;

    IF cardinality(sent_back) > 0 THEN
        -- A waiting job holds no slot (guarantee 7); the semaphores come
        -- after every rate key in the lock order.
        IF freed_types IS NOT NULL THEN
            PERFORM jobhost.release_slots(freed_types, freed_keys);
        END IF;
        PERFORM pg_notify('jobhost_due', '');
    END IF;
    RETURN sent_back || passed_over;
END;
$$;


--
-- Name: rate_throttle(bigint, bigint, bigint); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.rate_throttle(job_id bigint, run_token bigint, delay_ms bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    throttled_job text;
    throttled_key text;
BEGIN
    SELECT j.job, jobhost.rate_key(t.config, j.job, j.payload, j.concurrency_key)
    INTO throttled_job, throttled_key
    FROM jobhost.jobs j
    JOIN jobhost.job_types t ON t.name = j.job
    WHERE j.id = job_id AND j.lease_token = run_token AND j.state = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO jobhost.rate_keys AS r (job, key, throttled_until, throttles)
    VALUES (throttled_job, throttled_key, now() + delay_ms * interval '1 millisecond', 1)
    ON CONFLICT (job, key) DO UPDATE
    SET throttled_until = greatest(r.throttled_until, excluded.throttled_until),
        throttles = r.throttles + 1,
        updated_at = now();
    RETURN true;
END;
$$;


--
-- Name: reclaim_unique(bigint); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.reclaim_unique(revived_id bigint) RETURNS void
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


--
-- Name: release_slots(text[], text[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.release_slots(job_types text[], slot_keys text[]) RETURNS integer
    LANGUAGE sql
    AS $$
    SELECT r.promoted FROM jobhost.release_slots_leasing(job_types, slot_keys, '{}', '{}', '{}', 0, '') r;
$$;


--
-- Name: release_slots_leasing(text[], text[], text[], text[], integer[], bigint, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.release_slots_leasing(job_types text[], slot_keys text[], queues text[], fetch_types text[], fetch_leases integer[], max_jobs bigint, host text, OUT promoted integer, OUT leased jobhost.jobs[]) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    orphan record;
    keys_freed integer;
    keys_held integer;
    emptied integer;
BEGIN
    PERFORM 1 FROM jobhost.semaphores s
    WHERE (s.job, s.key) IN (SELECT t.job, t.key FROM unnest(job_types, slot_keys) AS t(job, key))
    ORDER BY s.job, s.key
    FOR UPDATE;

    WITH freed AS (
        SELECT t.job, t.key, count(*)::integer AS n
        FROM unnest(job_types, slot_keys) AS t(job, key)
        WHERE t.key IS NOT NULL
        GROUP BY 1, 2
    ),
    room AS (
        SELECT s.job, s.key, f.n,
               greatest(coalesce((t.config -> 'concurrency' ->> 'limit')::integer, 2147483647)
                        - greatest(s.holders - f.n, 0), 0) AS free
        FROM jobhost.semaphores s
        JOIN freed f ON f.job = s.job AND f.key = s.key
        LEFT JOIN jobhost.job_types t ON t.name = s.job
    ),
    chosen AS (
        SELECT p.id
        FROM room r
        CROSS JOIN LATERAL (
            SELECT b.id FROM jobhost.blocked_jobs b
            WHERE b.job = r.job AND b.concurrency_key = r.key
            ORDER BY b.priority, b.parked_at, b.id
            LIMIT r.free
            FOR UPDATE SKIP LOCKED
        ) p
        WHERE r.free > 0
    ),
    moved AS (
        DELETE FROM jobhost.blocked_jobs b USING chosen c WHERE b.id = c.id RETURNING b.*
    ),
    servable AS MATERIALIZED (
        -- Materialized: placed reads `servable` twice, and inlined each
        -- read would call rate_governed again.
        SELECT m.*, s.lease_secs AS lease_for,
               s.lease_secs IS NOT NULL AND m.queue = ANY(queues)
               AND NOT jobhost.rate_governed(m.job)
               AND NOT EXISTS (SELECT 1 FROM jobhost.unique_keys k WHERE k.job_id = m.id AND k.while_executing)
                   AS servable
        FROM moved m
        LEFT JOIN unnest(fetch_types, fetch_leases) AS s(job, lease_secs) ON s.job = m.job
    ),
    ahead AS MATERIALIZED (
        -- Read only when there is a servable promotion to place.
        SELECT a.priority FROM jobhost.fetch_ahead(queues, fetch_types, max_jobs) AS a(priority)
    ),
    placed AS (
        -- A servable promotion's place in the fetch: the servable promotions
        -- before it, and the available jobs of its priority or before.
        SELECT v.*,
               v.servable AND max_jobs > 0
               AND (row_number() OVER (PARTITION BY v.servable ORDER BY v.priority, v.id) - 1)
                   + (SELECT count(*) FROM ahead a WHERE a.priority <= v.priority)
                   < max_jobs AS lease
        FROM servable v
    ),
    inserted AS (
        INSERT INTO jobhost.jobs AS j
            (id, job, queue, priority, payload, state, attempt, max_attempts, run_at, enqueued_at, started_at,
             concurrency_key, batch_id, parent_id, errors, progress, unique_key,
             lease_token, lease_secs, lease_expires_at, host_id)
        SELECT p.id, p.job, p.queue, p.priority, p.payload,
               CASE WHEN p.lease THEN 'running' ELSE 'available' END,
               p.attempt + CASE WHEN p.lease THEN 1 ELSE 0 END, p.max_attempts, now(),
               p.enqueued_at, CASE WHEN p.lease THEN now() ELSE p.started_at END,
               p.concurrency_key, p.batch_id, p.parent_id, p.errors, p.progress, p.unique_key,
               CASE WHEN p.lease THEN nextval('jobhost.lease_tokens') END,
               CASE WHEN p.lease THEN p.lease_for END,
               CASE WHEN p.lease THEN now() + p.lease_for * interval '1 second' END,
               CASE WHEN p.lease THEN host END
        FROM placed p
        RETURNING j
    ),
    taken AS (
        SELECT (i.j).job, (i.j).concurrency_key AS key, count(*)::integer AS n FROM inserted i GROUP BY 1, 2
    ),
    counted AS (
        -- Runs whether or not it is read, like every data-modifying WITH.
        UPDATE jobhost.semaphores s
        SET holders = greatest(s.holders - r.n, 0) + coalesce(t.n, 0), updated_at = now()
        FROM room r
        LEFT JOIN taken t ON t.job = r.job AND t.key = r.key
        WHERE s.job = r.job AND s.key = r.key
    )
    SELECT count(*)::integer, coalesce(array_agg(i.j) FILTER (WHERE (i.j).state = 'running'), '{}'),
           (SELECT count(*)::integer FROM freed), (SELECT count(*)::integer FROM room)
    INTO promoted, leased, keys_freed, keys_held
    FROM inserted i;

    DELETE FROM jobhost.semaphores s
    USING unnest(job_types, slot_keys) AS t(job, key)
    WHERE s.job = t.job AND s.key = t.key AND s.holders = 0;
    GET DIAGNOSTICS emptied = ROW_COUNT;

    -- A freed key is left without a row only when the DELETE just emptied
    -- it or it had none when the promotion began (see the header).
    IF emptied = 0 AND keys_held = keys_freed THEN
        RETURN;
    END IF;
    FOR orphan IN
        SELECT DISTINCT t.job, t.key FROM unnest(job_types, slot_keys) AS t(job, key)
        WHERE t.key IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM jobhost.semaphores s WHERE s.job = t.job AND s.key = t.key)
        ORDER BY 1, 2
    LOOP
        promoted := promoted + jobhost.promote_parked(orphan.job, orphan.key);
    END LOOP;
END;
$$;


--
-- Name: release_unique_run(); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.release_unique_run() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM jobhost.unique_claims c
    WHERE c.job_id = OLD.id AND c.lease_token = OLD.lease_token AND NOT c.attached;
    RETURN NULL;
END;
$$;


--
-- Name: render_key(text, jsonb); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.render_key(template text, payload jsonb) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
    AS $$
DECLARE
    rendered text := '';
    i integer := 1;
    n integer := length(template);
    c text;
    close_at integer;
    field text;
    value jsonb;
BEGIN
    WHILE i <= n LOOP
        c := substr(template, i, 1);
        IF c = '{' AND substr(template, i + 1, 1) = '{' THEN
            rendered := rendered || '{';
            i := i + 2;
        ELSIF c = '}' AND substr(template, i + 1, 1) = '}' THEN
            rendered := rendered || '}';
            i := i + 2;
        ELSIF c = '{' THEN
            close_at := strpos(substr(template, i + 1), '}');
            field := substr(template, i + 1, close_at - 1);
            value := payload -> field;
            IF value IS NULL OR jsonb_typeof(value) = 'null' THEN
                RAISE EXCEPTION 'payload has no field "%" for key "%"', field, template USING ERRCODE = '22023';
            ELSIF jsonb_typeof(value) IN ('object', 'array') THEN
                RAISE EXCEPTION 'field "%" for key "%" must be a string, number or boolean', field, template
                    USING ERRCODE = '22023';
            END IF;
            rendered := rendered || (payload ->> field);
            i := i + close_at + 1;
        ELSE
            rendered := rendered || c;
            i := i + 1;
        END IF;
    END LOOP;
    RETURN rendered;
END;
$$;


--
-- Name: repair_semaphores(); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.repair_semaphores() RETURNS TABLE(job text, key text, recorded integer, actual integer)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    locked_jobs text[];
    locked_keys text[];
BEGIN
    -- Locking first, then counting in later statements (which see every
    -- commit made before the locks were granted) keeps the count exact.
    SELECT array_agg(l.job), array_agg(l.key) INTO locked_jobs, locked_keys
    FROM (SELECT s.job, s.key FROM jobhost.semaphores s ORDER BY s.job, s.key FOR UPDATE SKIP LOCKED) l;
    RETURN QUERY
    WITH fixes AS (
        SELECT s.job, s.key, s.holders AS recorded, coalesce(live.n, 0)::integer AS actual
        FROM jobhost.semaphores s
        JOIN unnest(locked_jobs, locked_keys) AS k(job, key) ON k.job = s.job AND k.key = s.key
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM jobhost.jobs j
            WHERE j.job = s.job AND j.concurrency_key = s.key AND j.state IN ('available', 'running')
        ) live
        WHERE s.holders <> live.n
    ),
    fixed AS (
        UPDATE jobhost.semaphores s SET holders = f.actual, updated_at = now()
        FROM fixes f WHERE s.job = f.job AND s.key = f.key
        RETURNING s.job
    )
    SELECT f.job, f.key, f.recorded, f.actual FROM fixes f;
    -- Holders whose row is gone get a row with their count. A gate creating
    -- the same row at this moment wins (DO NOTHING); the next pass checks it.
    RETURN QUERY
    WITH live AS (
        SELECT j.job, j.concurrency_key AS key, count(*)::integer AS n
        FROM jobhost.jobs j
        WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
          AND NOT EXISTS (SELECT 1 FROM jobhost.semaphores s WHERE s.job = j.job AND s.key = j.concurrency_key)
        GROUP BY 1, 2
    ),
    created AS (
        INSERT INTO jobhost.semaphores AS s (job, key, holders)
        SELECT live.job, live.key, live.n FROM live
        ON CONFLICT DO NOTHING
        RETURNING s.job, s.key, s.holders
    )
    SELECT c.job, c.key, 0, c.holders FROM created c;
END;
$$;


--
-- Name: repair_semaphores(text[], text[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.repair_semaphores(job_types text[], slot_keys text[]) RETURNS TABLE(job text, key text, recorded integer, actual integer)
    LANGUAGE plpgsql
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    locked_jobs text[];
    locked_keys text[];
BEGIN
    -- Locks the page's semaphore rows, in (job, key) order as every
    -- multi-key transaction takes them, skipping rows in use. Locking first,
    -- then counting in later statements (which see every commit made before
    -- the locks were granted) keeps the count exact.
    SELECT array_agg(l.job), array_agg(l.key) INTO locked_jobs, locked_keys
    FROM (SELECT s.job, s.key FROM unnest(job_types, slot_keys) AS p(job, key)
          JOIN jobhost.semaphores s ON s.job = p.job AND s.key = p.key
          ORDER BY s.job, s.key
          FOR UPDATE OF s SKIP LOCKED) l;
    RETURN QUERY
    WITH fixes AS (
        SELECT s.job, s.key, s.holders AS recorded, coalesce(live.n, 0)::integer AS actual
        FROM unnest(locked_jobs, locked_keys) AS k(job, key)
        JOIN jobhost.semaphores s ON s.job = k.job AND s.key = k.key
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM jobhost.jobs j
            WHERE j.job = s.job AND j.concurrency_key = s.key AND j.state IN ('available', 'running')
        ) live
        WHERE s.holders <> live.n
    ),
    fixed AS (
        UPDATE jobhost.semaphores s SET holders = f.actual, updated_at = now()
        FROM fixes f WHERE s.job = f.job AND s.key = f.key
        RETURNING s.job
    )
    SELECT f.job, f.key, f.recorded, f.actual FROM fixes f;
    -- The page's holders whose row is gone get a row with their count. A
    -- gate creating the same row at this moment wins (DO NOTHING); the next
    -- pass over the page checks it.
    RETURN QUERY
    WITH live AS (
        SELECT p.job, p.key, live.n
        FROM unnest(job_types, slot_keys) AS p(job, key)
        CROSS JOIN LATERAL (
            SELECT count(*)::integer AS n FROM jobhost.jobs j
            WHERE j.job = p.job AND j.concurrency_key = p.key AND j.state IN ('available', 'running')
        ) live
        WHERE live.n > 0
          AND NOT EXISTS (SELECT 1 FROM jobhost.semaphores s WHERE s.job = p.job AND s.key = p.key)
    ),
    created AS (
        INSERT INTO jobhost.semaphores AS s (job, key, holders)
        SELECT live.job, live.key, live.n FROM live
        ORDER BY live.job, live.key
        ON CONFLICT DO NOTHING
        RETURNING s.job, s.key, s.holders
    )
    SELECT c.job, c.key, 0, c.holders FROM created c;
END;
$$;


--
-- Name: replace_waiting(bigint, jsonb, timestamp with time zone, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.replace_waiting(claimant bigint, new_payload jsonb, due timestamp with time zone, new_key text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE jobhost.jobs j
    SET payload = new_payload,
        run_at = greatest(due, now()),
        state = CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END
    WHERE j.id = claimant AND j.state IN ('scheduled', 'available')
      AND j.concurrency_key IS NULL AND new_key IS NULL;
    IF FOUND THEN
        IF due <= now() THEN
            PERFORM pg_notify('jobhost_available', '');
        END IF;
        RETURN true;
    END IF;
    UPDATE jobhost.jobs j SET payload = new_payload
    WHERE j.id = claimant AND j.state IN ('scheduled', 'available') AND j.concurrency_key = new_key;
    RETURN FOUND;
END;
$$;


--
-- Name: schedule_remove(text, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.schedule_remove(schedule_job text, schedule_key text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    removed boolean;
BEGIN
    DELETE FROM jobhost.keyed_schedules s WHERE s.job = schedule_job AND s.key = schedule_key;
    removed := FOUND;
    PERFORM jobhost.audit_write('schedule.remove', 'schedule ' || schedule_job || '/' || schedule_key,
                                CASE WHEN removed THEN 'removed' ELSE 'absent' END);
    RETURN removed;
END
$$;


--
-- Name: schedule_upsert(text, text, text, text, jsonb, text, bigint, integer, timestamp with time zone, timestamp with time zone, boolean, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.schedule_upsert(schedule_job text, schedule_key text, schedule_cron text, schedule_time_zone text DEFAULT 'UTC'::text, schedule_payload jsonb DEFAULT '{}'::jsonb, schedule_overlap text DEFAULT 'allow'::text, schedule_jitter_ms bigint DEFAULT 0, schedule_backfill integer DEFAULT 1, schedule_starts_at timestamp with time zone DEFAULT NULL::timestamp with time zone, schedule_ends_at timestamp with time zone DEFAULT NULL::timestamp with time zone, schedule_paused boolean DEFAULT NULL::boolean, schedule_note text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql
    AS $_$
DECLARE
    overlap text := replace(coalesce(schedule_overlap, 'allow'), '-', '_');
    fields text[] := regexp_split_to_array(btrim(coalesce(schedule_cron, '')), '\s+');
    max_payload_bytes bigint :=
        coalesce(nullif(current_setting('jobhost.max_payload_bytes', true), '')::bigint, 1048576);
    earliest constant timestamptz := '0001-01-01 00:00:00+00';
    latest constant timestamptz := '9999-12-31 00:00:00+00';
    created boolean;
    changed_at timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = schedule_job) THEN
        RAISE EXCEPTION 'invalid schedule: job: no job type % is registered', coalesce(quote_literal(schedule_job), 'null')
            USING ERRCODE = '22023';
    END IF;
    IF schedule_key IS NULL OR schedule_key = '' THEN
        RAISE EXCEPTION 'invalid schedule: key: must not be empty (the empty key is the schedule the job type declares)'
            USING ERRCODE = '22023';
    END IF;
    IF char_length(schedule_key) > 200 OR schedule_key ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid schedule: key: at most 200 characters, none of them control characters'
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(fields) NOT IN (5, 6) OR EXISTS (SELECT 1 FROM unnest(fields) f WHERE f !~ '^[0-9A-Za-z*?/,#-]+$') THEN
        RAISE EXCEPTION 'invalid schedule: cron: % is not a cron expression of five fields, or six with seconds first',
            coalesce(quote_literal(schedule_cron), 'null') USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM jobhost.time_zones z WHERE z.name = schedule_time_zone) THEN
        RAISE EXCEPTION 'invalid schedule: time_zone: % is not an IANA time zone such as ''Europe/Berlin''',
            coalesce(quote_literal(schedule_time_zone), 'null') USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(schedule_payload) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'invalid schedule: payload: must be a JSON object, got %', coalesce(jsonb_typeof(schedule_payload), 'null')
            USING ERRCODE = '22023';
    END IF;
    IF schedule_payload ? '_tick' OR schedule_payload ? '_schedule' THEN
        RAISE EXCEPTION 'invalid schedule: payload: may not have a "_tick" or "_schedule" field: the host adds them'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(schedule_payload::text) > max_payload_bytes THEN
        RAISE EXCEPTION 'invalid schedule: payload: % bytes of JSON, more than the largest accepted, % bytes',
            octet_length(schedule_payload::text), max_payload_bytes USING ERRCODE = '22023';
    END IF;
    IF overlap NOT IN ('allow', 'skip', 'buffer_one') THEN
        RAISE EXCEPTION 'invalid schedule: overlap: % is not one of allow, skip, buffer-one', quote_literal(schedule_overlap)
            USING ERRCODE = '22023';
    END IF;
    IF schedule_jitter_ms IS NULL OR schedule_jitter_ms NOT BETWEEN 0 AND 86400000 THEN
        RAISE EXCEPTION 'invalid schedule: jitter: must be between 0 and a day' USING ERRCODE = '22023';
    END IF;
    IF schedule_backfill IS NULL OR schedule_backfill NOT BETWEEN 0 AND 1000 THEN
        RAISE EXCEPTION 'invalid schedule: backfill: must be between 0 and 1000' USING ERRCODE = '22023';
    END IF;
    IF schedule_starts_at NOT BETWEEN earliest AND latest THEN
        RAISE EXCEPTION 'invalid schedule: starts_at: must be a time between the years 1 and 9999' USING ERRCODE = '22023';
    END IF;
    IF schedule_ends_at NOT BETWEEN earliest AND latest THEN
        RAISE EXCEPTION 'invalid schedule: ends_at: must be a time between the years 1 and 9999' USING ERRCODE = '22023';
    END IF;
    IF schedule_ends_at <= schedule_starts_at THEN
        RAISE EXCEPTION 'invalid schedule: ends_at: must be after starts_at' USING ERRCODE = '22023';
    END IF;
    IF char_length(coalesce(schedule_note, '')) > 1000 THEN
        RAISE EXCEPTION 'invalid schedule: note: is longer than 1000 characters' USING ERRCODE = '22023';
    END IF;

    changed_at := clock_timestamp();
    INSERT INTO jobhost.keyed_schedules AS s
        (job, key, cron, time_zone, payload, overlap, jitter_ms, backfill, starts_at, ends_at, paused, note)
    VALUES (schedule_job, schedule_key, btrim(schedule_cron), schedule_time_zone, schedule_payload, overlap,
            schedule_jitter_ms, schedule_backfill, schedule_starts_at, schedule_ends_at,
            coalesce(schedule_paused, false), coalesce(schedule_note, ''))
    ON CONFLICT (job, key) DO UPDATE SET
        cron = EXCLUDED.cron, time_zone = EXCLUDED.time_zone, payload = EXCLUDED.payload,
        overlap = EXCLUDED.overlap, jitter_ms = EXCLUDED.jitter_ms, backfill = EXCLUDED.backfill,
        starts_at = EXCLUDED.starts_at, ends_at = EXCLUDED.ends_at,
        paused = coalesce(schedule_paused, s.paused), note = coalesce(schedule_note, s.note),
        -- The old calendar's ticks after its cursor (and its start) up to
        -- now (and its end) stay due, unless it was paused.
        handovers = CASE
            WHEN NOT s.paused
                 AND (s.cron, s.time_zone, s.starts_at) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.time_zone, EXCLUDED.starts_at)
                 AND greatest(s.last_tick, s.since, s.starts_at - interval '1 millisecond')
                     < least(greatest(changed_at, s.last_tick, s.since), s.ends_at)
                THEN (CASE WHEN jsonb_array_length(s.handovers) >= 16 THEN s.handovers - 0 ELSE s.handovers END)
                     || jsonb_build_array(jsonb_build_object(
                            'cron', s.cron, 'time_zone', s.time_zone,
                            'from', greatest(s.last_tick, s.since, s.starts_at - interval '1 millisecond'),
                            'until', least(greatest(changed_at, s.last_tick, s.since), s.ends_at)))
            ELSE s.handovers END,
        since = CASE
            WHEN (s.cron, s.time_zone, s.starts_at) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.time_zone, EXCLUDED.starts_at)
                 OR (s.paused AND NOT coalesce(schedule_paused, s.paused))
                THEN greatest(changed_at, s.last_tick, s.since)
            ELSE s.since END,
        -- A paused schedule keeps nothing buffered or asked for, to start later.
        buffered_tick = CASE WHEN coalesce(schedule_paused, s.paused) THEN NULL ELSE s.buffered_tick END,
        triggered_at = CASE WHEN coalesce(schedule_paused, s.paused) THEN NULL ELSE s.triggered_at END,
        -- Looked at again now, never later than it was due.
        look_at = least(s.look_at, now()), error = NULL, updated_at = now()
    RETURNING xmax = 0 INTO created;
    PERFORM jobhost.audit_write('schedule.set', 'schedule ' || schedule_job || '/' || schedule_key,
                                CASE WHEN created THEN 'created' ELSE 'replaced' END);
    RETURN created;
END
$_$;


--
-- Name: schedules_follow_registration(); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.schedules_follow_registration() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    declared record;
BEGIN
    SELECT * INTO declared FROM jobhost.calendar_of(NEW.config);
    IF declared.cron IS NULL THEN
        DELETE FROM jobhost.schedules WHERE job = NEW.name;
        RETURN NULL;
    END IF;
    INSERT INTO jobhost.schedules (job, cron, time_zone, since)
    VALUES (NEW.name, declared.cron, declared.time_zone, clock_timestamp())
    ON CONFLICT (job) DO UPDATE
        SET cron = excluded.cron, time_zone = excluded.time_zone,
            since = greatest(excluded.since, jobhost.schedules.last_tick, jobhost.schedules.since),
            last_tick = NULL
        WHERE (jobhost.schedules.cron, jobhost.schedules.time_zone)
              IS DISTINCT FROM (excluded.cron, excluded.time_zone);
    RETURN NULL;
END;
$$;


--
-- Name: semaphore_page(text, text, integer); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.semaphore_page(after_job text, after_key text, max_keys integer) RETURNS TABLE(job text, key text)
    LANGUAGE sql STABLE
    AS $$
    WITH RECURSIVE live AS (
        (SELECT j.job, j.concurrency_key AS key FROM jobhost.jobs j
         WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
           AND (j.job, j.concurrency_key) > (after_job, after_key)
         ORDER BY j.job, j.concurrency_key
         LIMIT 1)
        UNION ALL
        SELECT n.job, n.key
        FROM live l
        CROSS JOIN LATERAL (
            SELECT j.job, j.concurrency_key AS key FROM jobhost.jobs j
            WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
              AND (j.job, j.concurrency_key) > (l.job, l.key)
            ORDER BY j.job, j.concurrency_key
            LIMIT 1
        ) n
    )
    SELECT u.job, u.key
    FROM ((SELECT s.job, s.key FROM jobhost.semaphores s
           WHERE (s.job, s.key) > (after_job, after_key)
           ORDER BY s.job, s.key
           LIMIT max_keys)
          UNION
          (SELECT l.job, l.key FROM live l LIMIT max_keys)) u
    ORDER BY u.job, u.key
    LIMIT max_keys
$$;


--
-- Name: send_event(text, jsonb, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.send_event(event_key text, payload jsonb DEFAULT '{}'::jsonb, idempotency_key text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE sql
    AS $$
    SELECT (jobhost.event_send(event_key, payload, idempotency_key, 'sql')).id
$$;


--
-- Name: slot_limit(text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.slot_limit(job_type text) RETURNS integer
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(
        (SELECT (t.config -> 'concurrency' ->> 'limit')::integer FROM jobhost.job_types t WHERE t.name = job_type),
        2147483647)
$$;


--
-- Name: take_slot(text, text, integer); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.take_slot(job_type text, slot_key text, slot_limit integer) RETURNS boolean
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


--
-- Name: take_slots(text[], text[], integer[], boolean); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.take_slots(key_jobs text[], key_names text[], key_counts integer[], enqueuer_waiting boolean, OUT slot_limits integer[], OUT taken integer[], OUT on_conflicts text[]) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    created_jobs text[];
    created_keys text[];
    read_holders integer[];
    fresh boolean[];
    locked_rows bigint;
    held integer[];
    adding integer[];
    refusal text;
    taking integer;
    lowest integer;
    guarded integer;
BEGIN
    -- Every key's row locked in key order, with its holders read as it is
    -- locked. When every key of a large call has a row, one SELECT ... FOR
    -- UPDATE does both (a row another transaction holds is waited for and
    -- read as that transaction left it), in a block of its own: if a key
    -- has no row, the rows it took are given back with the block's
    -- subtransaction before anything else is locked, so keys are still
    -- only ever waited for in order. (Small calls skip it: a transaction
    -- enqueuing job by job would pile up a subtransaction per call, and
    -- past 64 every other session's snapshot pays for them.)
    -- A call whose first, middle or last key has no row (new keys, most
    -- likely) goes straight to the upsert, without locking the others first.
    IF cardinality(key_jobs) >= 64 AND (
        SELECT count(*) = 3
        FROM unnest(ARRAY[1, (cardinality(key_jobs) + 1) / 2, cardinality(key_jobs)]) AS i(at)
        JOIN jobhost.semaphores s ON s.job = key_jobs[i.at] AND s.key = key_names[i.at]
    ) THEN
        BEGIN
            SELECT array_agg(l.holders ORDER BY k.ord), count(*) INTO read_holders, locked_rows
            FROM unnest(key_jobs, key_names) WITH ORDINALITY AS k(job, key, ord)
            CROSS JOIN LATERAL (
                SELECT s.holders FROM jobhost.semaphores s WHERE s.job = k.job AND s.key = k.key FOR UPDATE
            ) l;
            IF locked_rows < cardinality(key_jobs) THEN
                RAISE EXCEPTION 'a key has no semaphore row yet' USING ERRCODE = 'JHK01';
            END IF;
            fresh := array_fill(false, ARRAY[cardinality(key_jobs)]);
        EXCEPTION WHEN SQLSTATE 'JHK01' THEN
            read_holders := NULL;
        END;
    END IF;
    -- Otherwise one upsert creates or locks every key's row in order (a key
    -- it creates holds the slots its jobs take; one that exists is locked
    -- without being rewritten), and a statement of its own reads the
    -- holders the transactions it waited for committed.
    IF read_holders IS NULL THEN
        WITH created AS (
            INSERT INTO jobhost.semaphores AS s (job, key, holders)
            SELECT k.job, k.key,
                   least(greatest(coalesce((t.config -> 'concurrency' ->> 'limit')::integer, 2147483647), 0), k.n)
            FROM unnest(key_jobs, key_names, key_counts) AS k(job, key, n)
            LEFT JOIN jobhost.job_types t ON t.name = k.job
            ORDER BY k.job, k.key
            ON CONFLICT (job, key) DO UPDATE SET updated_at = now() WHERE false
            RETURNING s.job, s.key
        )
        SELECT array_agg(c.job), array_agg(c.key) INTO created_jobs, created_keys FROM created c;
        IF cardinality(created_jobs) = cardinality(key_jobs) THEN
            -- Every key is new: nothing to read.
            read_holders := array_fill(0, ARRAY[cardinality(key_jobs)]);
            fresh := array_fill(true, ARRAY[cardinality(key_jobs)]);
        ELSE
            SELECT array_agg(coalesce(s.holders, 0) ORDER BY k.ord), array_agg(c.job IS NOT NULL ORDER BY k.ord)
            INTO read_holders, fresh
            FROM unnest(key_jobs, key_names) WITH ORDINALITY AS k(job, key, ord)
            LEFT JOIN unnest(created_jobs, created_keys) AS c(job, key) ON c.job = k.job AND c.key = k.key
            LEFT JOIN LATERAL (
                SELECT s.holders FROM jobhost.semaphores s WHERE s.job = k.job AND s.key = k.key OFFSET 0
            ) s ON true;
        END IF;
    END IF;
    SELECT array_agg(d.held), array_agg(d.slot_limit), array_agg(d.taken), array_agg(d.on_conflict),
           array_agg(CASE WHEN d.created THEN 0 ELSE d.taken END),
           (array_agg(format('job "%s" refused: concurrency limit reached: all %s slots of key "%s" are taken',
                             d.job, d.slot_limit, d.key))
               FILTER (WHERE d.on_conflict = 'raise' AND d.held + d.n > d.slot_limit))[1],
           count(*) FILTER (WHERE d.taken > 0 AND NOT d.created), min(d.slot_limit)
    INTO held, slot_limits, taken, on_conflicts, adding, refusal, taking, lowest
    FROM (
        SELECT k.ord, k.job, k.key, k.n, k.created, l.held, l.slot_limit, l.on_conflict,
               least(greatest(l.slot_limit - l.held, 0), k.n) AS taken
        FROM unnest(key_jobs, key_names, key_counts, read_holders, fresh)
            WITH ORDINALITY AS k(job, key, n, holders, created, ord)
        -- Each of the call's types' limit read from its config once, not
        -- once a key (and no other type's config read at all).
        LEFT JOIN (
            SELECT t.name, (t.config -> 'concurrency' ->> 'limit')::integer AS slot_limit,
                   t.config -> 'concurrency' ->> 'on_conflict' AS on_conflict
            FROM jobhost.job_types t
            WHERE t.name IN (SELECT DISTINCT n.name FROM unnest(key_jobs) AS n(name))
            OFFSET 0
        ) t ON t.name = k.job
        CROSS JOIN LATERAL (
            -- A key this call created had no holders before it.
            SELECT CASE WHEN k.created THEN 0 ELSE k.holders END AS held,
                   coalesce(t.slot_limit, 2147483647) AS slot_limit,
                   coalesce(t.on_conflict, 'block') AS on_conflict
        ) l
        ORDER BY k.ord
    ) d;
    IF enqueuer_waiting AND refusal IS NOT NULL THEN
        RAISE EXCEPTION '%', refusal USING ERRCODE = 'JHL01';
    END IF;
    IF taking > 0 THEN
        UPDATE jobhost.semaphores s SET holders = s.holders + t.adding
        FROM unnest(key_jobs, key_names, slot_limits, adding) AS t(job, key, slot_limit, adding)
        WHERE t.adding > 0 AND s.job = t.job AND s.key = t.key AND s.holders + t.adding <= t.slot_limit;
        GET DIAGNOSTICS guarded = ROW_COUNT;
        IF guarded <> taking THEN
            RAISE EXCEPTION 'semaphores changed under their locks: % of % keys took their slots', guarded, taking;
        END IF;
    END IF;
    -- Only with a corrupt limit below 1: the rows this call created (with no
    -- holders) go.
    IF lowest < 1 THEN
        DELETE FROM jobhost.semaphores s
        USING unnest(key_jobs, key_names, slot_limits, held) AS t(job, key, slot_limit, held)
        WHERE t.slot_limit < 1 AND t.held = 0 AND s.job = t.job AND s.key = t.key AND s.holders = 0;
    END IF;
END;
$$;


--
-- Name: unpaused(text[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.unpaused(queues text[]) RETURNS text[]
    LANGUAGE plpgsql STABLE
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(q), '{}')
            FROM unnest(queues) AS q
            WHERE NOT EXISTS (SELECT 1 FROM jobhost.queue_pauses p WHERE p.name = q));
END;
$$;


--
-- Name: workflow_cancel(bigint); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_cancel(workflow bigint) RETURNS bigint[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    step jobhost.workflow_steps;
    reason text := 'its workflow was cancelled';
    ended bigint[] := '{}';
    live bigint[];
BEGIN
    UPDATE jobhost.workflows SET cancelled_at = coalesce(cancelled_at, now()) WHERE id = workflow;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    FOR step IN
        SELECT * FROM jobhost.workflow_steps s
        WHERE s.workflow_id = workflow AND s.job_id IS NULL AND s.ended_state IS NULL
        ORDER BY s.id
        FOR UPDATE
    LOOP
        UPDATE jobhost.workflow_steps
        SET job_id = nextval('jobhost.job_ids'), released_at = now(), ended_state = 'cancelled',
            result = to_jsonb(reason), ended_at = now()
        WHERE id = step.id
        RETURNING * INTO step;
        PERFORM jobhost.workflow_step_archive(step, 'cancelled', reason);
        ended := ended || step.id;
    END LOOP;
    -- Their waits end with them: an event or a timeout later finds nothing to end.
    UPDATE jobhost.workflow_waits w SET ended_by = 'skipped', ended_at = now()
    WHERE w.step_id = ANY(ended) AND w.ended_by IS NULL;
    UPDATE jobhost.workflow_steps s SET wait = 'ended' WHERE s.id = ANY(ended) AND s.wait IS NOT NULL;
    PERFORM jobhost.workflow_steps_ended(ended);
    SELECT coalesce(array_agg(s.job_id ORDER BY s.id), '{}') INTO live
    FROM jobhost.workflow_steps s
    WHERE s.workflow_id = workflow AND s.ended_state IS NULL AND s.job_id IS NOT NULL;
    RETURN live;
END;
$$;


--
-- Name: workflow_create(jsonb, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_create(steps jsonb, label text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql
    AS $_$
#variable_conflict use_variable
DECLARE
    total integer;
    bad record;
    queue_order integer[];
    cursor_at integer := 1;
    current integer;
    dependent integer;
    left_over integer;
    new_id bigint;
    roots bigint[];
    cycle_names text;
    -- The database's setting, like the host's --max-payload (1 MiB unless set).
    max_payload_bytes bigint :=
        coalesce(nullif(current_setting('jobhost.max_payload_bytes', true), '')::bigint, 1048576);
BEGIN
    IF jsonb_typeof(steps) IS DISTINCT FROM 'array' OR jsonb_array_length(steps) = 0 THEN
        RAISE EXCEPTION 'invalid workflow: a workflow needs at least one step' USING ERRCODE = '22023';
    END IF;
    total := jsonb_array_length(steps);
    IF total > 10000 THEN
        RAISE EXCEPTION 'invalid workflow: % steps, more than the most a workflow has, 10000', total
            USING ERRCODE = '22023';
    END IF;
    CREATE TEMP TABLE workflow_new ON COMMIT DROP AS
    SELECT s.n::integer AS n, s.step ->> 'name' AS name, s.step ->> 'job' AS job,
           coalesce(s.step -> 'payload', '{}') AS payload, s.step ->> 'queue' AS queue,
           (s.step ->> 'priority')::smallint AS priority, coalesce((s.step ->> 'delay_ms')::bigint, 0) AS delay_ms,
           coalesce(s.step -> 'after', '[]') AS after, coalesce(s.step ->> 'if_failed', 'cancel') AS if_failed,
           s.step -> 'wait' AS wait, 0 AS pending
    FROM jsonb_array_elements(steps) WITH ORDINALITY AS s(step, n);
    SELECT * INTO bad FROM workflow_new w
    WHERE w.name IS NULL OR w.name !~ '^[A-Za-z0-9_.:-]{1,128}$' LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid workflow: step name % must be 1 to 128 letters, digits, ''_'', ''-'', ''.'' or '':''',
            coalesce(bad.name, 'null') USING ERRCODE = '22023';
    END IF;
    SELECT w.name INTO bad FROM workflow_new w GROUP BY w.name HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid workflow: two steps are named "%"', bad.name USING ERRCODE = '22023';
    END IF;
    SELECT w.name, w.job INTO bad FROM workflow_new w
    WHERE NOT EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = w.job) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid workflow: step "%": unknown job type "%"', bad.name, bad.job USING ERRCODE = '22023';
    END IF;
    SELECT w.name INTO bad FROM workflow_new w
    WHERE jsonb_typeof(w.payload) <> 'object' OR w.payload ? '_deps' OR w.payload ? '_deps_failed'
       OR octet_length(w.payload::text) > max_payload_bytes
       OR w.if_failed NOT IN ('cancel', 'run', 'fail') OR jsonb_typeof(w.after) <> 'array'
       OR w.queue !~ '^[a-z0-9_.-]{1,128}$' LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid workflow: step "%": its payload must be an object of at most % bytes without _deps, '
                        'its queue a valid name, its after an array and its if_failed cancel, run or fail',
            bad.name, max_payload_bytes USING ERRCODE = '22023';
    END IF;
    -- A wait (docs/workflows.md): one of event, sleep_ms and until; an
    -- event's options only with an event; its match rendered from the
    -- payload below (a field the payload lacks raises there, unless the
    -- step has dependencies whose outputs may hold it).
    SELECT w.name INTO bad FROM workflow_new w
    WHERE w.wait IS NOT NULL AND jsonb_typeof(w.wait) <> 'null' AND (
        jsonb_typeof(w.wait) <> 'object'
        OR (w.wait ? 'event')::integer + (w.wait ? 'sleep_ms')::integer + (w.wait ? 'until')::integer <> 1
        OR EXISTS (SELECT 1 FROM jsonb_object_keys(w.wait) k
                   WHERE k NOT IN ('event', 'match', 'timeout_ms', 'on_timeout', 'lookback_ms', 'sleep_ms', 'until'))
        OR (NOT w.wait ? 'event' AND w.wait ?| ARRAY['match', 'timeout_ms', 'on_timeout', 'lookback_ms'])
        OR (w.wait ? 'event' AND (jsonb_typeof(w.wait -> 'event') <> 'string'
                                  OR octet_length(w.wait ->> 'event') NOT BETWEEN 1 AND 256
                                  OR (w.wait ->> 'event') ~ '[[:cntrl:]]'))
        OR coalesce(w.wait ->> 'on_timeout', 'fail') NOT IN ('cancel', 'run', 'fail')
        OR (w.wait ? 'match' AND (jsonb_typeof(w.wait -> 'match') <> 'object'
                                  OR EXISTS (SELECT 1 FROM jsonb_each(w.wait -> 'match') m
                                             WHERE jsonb_typeof(m.value) <> 'string'
                                                OR (m.value #>> '{}')
                                                   !~ '^([^{}]|\{\{|\}\}|\{[A-Za-z0-9_-]+\})+$')))
        OR EXISTS (SELECT 1 FROM unnest(ARRAY['timeout_ms', 'lookback_ms', 'sleep_ms']) f
                   WHERE w.wait ? f AND (jsonb_typeof(w.wait -> f) <> 'number'
                                         OR (w.wait ->> f)::numeric NOT BETWEEN 0 AND 3153600000000))
        OR (w.wait ? 'until' AND jsonb_typeof(w.wait -> 'until') <> 'string')
    ) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid workflow: step "%": its wait has exactly one of event, sleep_ms and until; match, '
                        'timeout_ms, on_timeout (cancel, run or fail) and lookback_ms only with an event; an event key '
                        'of 1 to 256 bytes; match fields of template strings; milliseconds from 0 to 100 years', bad.name
            USING ERRCODE = '22023';
    END IF;
    CREATE TEMP TABLE workflow_new_edges ON COMMIT DROP AS
    SELECT w.n AS step_n, d.n AS dep_n, w.name AS step_name,
           coalesce(a.dep ->> 'step', a.dep #>> '{}') AS dep_name,
           coalesce(a.dep ->> 'if_failed', w.if_failed) AS if_failed
    FROM workflow_new w
    CROSS JOIN jsonb_array_elements(w.after) AS a(dep)
    LEFT JOIN workflow_new d ON d.name = coalesce(a.dep ->> 'step', a.dep #>> '{}');
    SELECT * INTO bad FROM workflow_new_edges e WHERE e.dep_n IS NULL OR e.dep_n = e.step_n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid workflow: step "%" waits for "%", which is not another step of it',
            bad.step_name, bad.dep_name USING ERRCODE = '22023';
    END IF;
    SELECT e.step_name, e.dep_name INTO bad FROM workflow_new_edges e
    GROUP BY e.step_name, e.dep_name HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid workflow: step "%" names "%" twice', bad.step_name, bad.dep_name
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO bad FROM workflow_new_edges e WHERE e.if_failed NOT IN ('cancel', 'run', 'fail') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'invalid workflow: step "%": if_failed must be cancel, run or fail', bad.step_name
            USING ERRCODE = '22023';
    END IF;
    -- Dependencies first (Kahn's algorithm); a step left over is on or behind a cycle.
    UPDATE workflow_new w SET pending = c.n FROM (
        SELECT e.step_n, count(*) AS n FROM workflow_new_edges e GROUP BY e.step_n
    ) c WHERE w.n = c.step_n;
    CREATE INDEX ON workflow_new_edges (dep_n);
    SELECT coalesce(array_agg(w.n ORDER BY w.n), '{}') INTO queue_order FROM workflow_new w WHERE w.pending = 0;
    WHILE cursor_at <= cardinality(queue_order) LOOP
        current := queue_order[cursor_at];
        cursor_at := cursor_at + 1;
        FOR dependent IN SELECT e.step_n FROM workflow_new_edges e WHERE e.dep_n = current ORDER BY e.step_n LOOP
            UPDATE workflow_new w SET pending = w.pending - 1 WHERE w.n = dependent RETURNING w.pending INTO left_over;
            IF left_over = 0 THEN
                queue_order := queue_order || dependent;
            END IF;
        END LOOP;
    END LOOP;
    IF cardinality(queue_order) < total THEN
        SELECT string_agg(w.name, ', ' ORDER BY w.n) INTO cycle_names FROM workflow_new w WHERE w.pending > 0;
        RAISE EXCEPTION 'invalid workflow: its steps wait for each other in a cycle (on or behind it: %)', cycle_names
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO jobhost.workflows (label) VALUES (label) RETURNING id INTO new_id;
    INSERT INTO jobhost.workflow_steps (workflow_id, name, job, payload, queue, priority, delay_ms, pending, wait)
    SELECT new_id, w.name, w.job, w.payload, w.queue, w.priority, w.delay_ms, jsonb_array_length(w.after),
           CASE WHEN jsonb_typeof(w.wait) = 'object' THEN 'waiting' END
    FROM unnest(queue_order) WITH ORDINALITY AS o(n, position)
    JOIN workflow_new w ON w.n = o.n
    ORDER BY o.position;
    -- A match naming a field the payload lacks is rendered when the wait
    -- is armed, from the payload and the dependencies' outputs, for a step
    -- that has dependencies; without them, render_key raises here.
    INSERT INTO jobhost.workflow_waits (step_id, key, match, match_later, sleep_ms, until, timeout_ms, on_timeout,
                                        lookback_ms)
    SELECT s.id, w.wait ->> 'event',
           CASE WHEN later.templates IS NULL
                THEN coalesce((SELECT jsonb_object_agg(m.key, jobhost.render_key(m.value, w.payload))
                               FROM jsonb_each_text(w.wait -> 'match') m), '{}')
                ELSE '{}' END,
           later.templates,
           (w.wait ->> 'sleep_ms')::bigint, (w.wait ->> 'until')::timestamptz, (w.wait ->> 'timeout_ms')::bigint,
           coalesce(w.wait ->> 'on_timeout', 'fail'), coalesce((w.wait ->> 'lookback_ms')::bigint, 0)
    FROM workflow_new w
    JOIN jobhost.workflow_steps s ON s.workflow_id = new_id AND s.name = w.name
    CROSS JOIN LATERAL (
        SELECT CASE WHEN jsonb_array_length(w.after) > 0
                         AND EXISTS (SELECT 1 FROM jsonb_each_text(w.wait -> 'match') m
                                     WHERE NOT jobhost.key_renders(m.value, w.payload))
                    THEN w.wait -> 'match' END AS templates
    ) later
    WHERE jsonb_typeof(w.wait) = 'object';
    UPDATE jobhost.workflow_waits ww SET match_one = jobhost.match_one(ww.match)
    FROM jobhost.workflow_steps s
    WHERE s.workflow_id = new_id AND ww.step_id = s.id AND ww.match <> '{}';
    INSERT INTO jobhost.workflow_edges (step_id, dep_id, if_failed)
    SELECT s.id, d.id, e.if_failed
    FROM workflow_new_edges e
    JOIN jobhost.workflow_steps s ON s.workflow_id = new_id AND s.name = e.step_name
    JOIN jobhost.workflow_steps d ON d.workflow_id = new_id AND d.name = e.dep_name;
    SELECT array_agg(s.id ORDER BY s.id) INTO roots FROM jobhost.workflow_steps s
    WHERE s.workflow_id = new_id AND s.pending = 0;
    PERFORM jobhost.workflow_steps_ended(jobhost.workflow_release(roots));
    DROP TABLE workflow_new_edges;
    DROP TABLE workflow_new;
    RETURN new_id;
END;
$_$;


--
-- Name: workflow_grow(bigint, bigint, text[], text[], jsonb[], text[], smallint[], bigint[], integer[], integer[], text[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_grow(grown_job bigint, grown_lease bigint, names text[], jobs text[], payloads jsonb[], queues text[], priorities smallint[], delays_ms bigint[], inner_steps integer[], inner_deps integer[], inner_policies text[]) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    own_id bigint;
    own_workflow bigint;
    own_name text;
    added bigint[];
    dependents bigint[];
    dependent_policies text[];
BEGIN
    SELECT s.id, s.workflow_id, s.name INTO own_id, own_workflow, own_name
    FROM jobhost.workflow_steps s JOIN jobhost.jobs j ON j.id = s.job_id
    WHERE s.job_id = grown_job AND j.lease_token = grown_lease AND (s.ended_state IS NULL) IS TRUE
    FOR UPDATE OF s;
    IF own_id IS NULL THEN
        RETURN;
    END IF;
    WITH stored AS (
        INSERT INTO jobhost.workflow_steps (workflow_id, name, job, payload, queue, priority, delay_ms, pending)
        SELECT own_workflow, own_name || '/' || n.name, n.job, n.payload, n.queue, n.priority, n.delay_ms,
               1 + coalesce(i.deps, 0)
        FROM unnest(names, jobs, payloads, queues, priorities, delays_ms) WITH ORDINALITY
            AS n(name, job, payload, queue, priority, delay_ms, position)
        LEFT JOIN (SELECT i.step, count(*)::integer AS deps FROM unnest(inner_steps) AS i(step) GROUP BY i.step) i
            ON i.step = n.position
        RETURNING id, name
    )
    SELECT array_agg(s.id ORDER BY n.position) INTO added
    FROM stored s JOIN unnest(names) WITH ORDINALITY AS n(name, position) ON s.name = own_name || '/' || n.name;
    SELECT coalesce(array_agg(d.id ORDER BY d.id), '{}'), coalesce(array_agg(d.if_failed ORDER BY d.id), '{}')
    INTO dependents, dependent_policies
    FROM (
        SELECT s.id, e.if_failed
        FROM jobhost.workflow_edges e JOIN jobhost.workflow_steps s ON s.id = e.step_id
        WHERE e.dep_id = own_id AND (s.ended_state IS NULL) IS TRUE
        ORDER BY s.id
        FOR UPDATE OF s
    ) d;
    INSERT INTO jobhost.workflow_edges (step_id, dep_id, if_failed)
    SELECT a.id, own_id, 'cancel' FROM unnest(added) AS a(id)
    UNION ALL
    SELECT added[i.step], added[i.dep], i.policy FROM unnest(inner_steps, inner_deps, inner_policies) AS i(step, dep, policy)
    UNION ALL
    SELECT d.id, a.id, d.policy FROM unnest(added) AS a(id) CROSS JOIN unnest(dependents, dependent_policies) AS d(id, policy);
    IF cardinality(dependents) > 0 THEN
        UPDATE jobhost.workflow_steps s SET pending = s.pending + cardinality(added) WHERE s.id = ANY(dependents);
    END IF;
END;
$$;


--
-- Name: workflow_jobs_ended(bigint[], text[], jsonb[], timestamp with time zone[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_jobs_ended(job_ids bigint[], states text[], results jsonb[], instants timestamp with time zone[]) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    ended bigint[];
BEGIN
    WITH done AS (
        UPDATE jobhost.workflow_steps s
        SET ended_state = a.state, result = a.result, ended_at = a.instant
        FROM unnest(job_ids, states, results, instants) AS a(job_id, state, result, instant)
        -- `IS TRUE`: the partial index of live steps is no path here (a
        -- plan made while it looked small would read every live step).
        -- The join alone: with `= ANY(job_ids)` too, a plan could read the
        -- arrays whole again for each step.
        WHERE s.job_id = a.job_id AND (s.ended_state IS NULL) IS TRUE
        RETURNING s.id
    )
    SELECT coalesce(array_agg(d.id), '{}') INTO ended FROM done d;
    IF cardinality(ended) > 0 THEN
        PERFORM jobhost.workflow_steps_ended(ended);
    END IF;
END;
$$;


--
-- Name: workflow_release(bigint[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_release(ready bigint[]) RETURNS bigint[]
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    max_payload_bytes bigint :=
        coalesce(nullif(current_setting('jobhost.max_payload_bytes', true), '')::bigint, 1048576);
    -- Arrays, not a table: a step discarded by its gate ends inside this
    -- call, and its dependents are released by a nested call.
    releasing jobhost.step_release[];
    gated jobhost.step_release;
    changed_ids bigint[] := '{}';
    changed_verdicts text[] := '{}';
    changed_reasons text[] := '{}';
    claimant bigint;
    ended bigint[];
    arming bigint[];
    ended_waiting bigint[] := '{}';
BEGIN
    -- Nothing ready: no statement (its insert would still run the jobs' trigger).
    IF cardinality(ready) = 0 THEN
        RETURN '{}';
    END IF;
    WITH candidates AS (
        SELECT s.* FROM jobhost.workflow_steps s
        -- Found by id: `IS TRUE` keeps the job index (whose NULLs are every
        -- step not yet released) out of the plan.
        WHERE s.id = ANY(ready) AND s.pending = 0 AND (s.job_id IS NULL) IS TRUE
          AND s.wait IS DISTINCT FROM 'waiting' AND s.wait IS DISTINCT FROM 'armed'
        ORDER BY s.id
        FOR UPDATE
    ),
    -- Each candidate's dependencies aggregated by themselves (grouping
    -- the candidates by their columns sorted every payload and config).
    judged AS (
        SELECT c.id, c.job, c.queue, c.priority, c.delay_ms, t.config,
               c.payload || deps.added || coalesce(waited.added, '{}') AS payload,
               CASE WHEN w.cancelled_at IS NOT NULL THEN 'cancel'
                    WHEN deps.verdict = 'run' AND waited.verdict IS NOT NULL THEN waited.verdict
                    ELSE deps.verdict END AS verdict,
               CASE WHEN w.cancelled_at IS NOT NULL THEN 'its workflow was cancelled'
                    WHEN deps.verdict = 'run' AND waited.verdict IS NOT NULL THEN waited.reason
                    ELSE deps.reason END AS reason
        FROM candidates c
        JOIN jobhost.workflows w ON w.id = c.workflow_id
        LEFT JOIN jobhost.job_types t ON t.name = c.job
        -- How its wait ended, for a step that had one: the event's payload,
        -- or the timeout's policy.
        LEFT JOIN LATERAL (
            SELECT CASE WHEN ww.ended_by = 'event' THEN jsonb_build_object('_event', ev.payload) END AS added,
                   CASE WHEN ww.ended_by = 'timeout' AND ww.on_timeout <> 'run' THEN ww.on_timeout
                        WHEN ww.ended_by = 'unmatched' THEN 'fail' END AS verdict,
                   CASE WHEN ww.ended_by = 'unmatched'
                        THEN format('its wait for event "%s" could not render its match: a field it names is in '
                                    'neither its payload nor its dependencies'' outputs', ww.key)
                        ELSE format('its wait for event "%s" timed out', ww.key) END AS reason
            FROM jobhost.workflow_waits ww
            LEFT JOIN jobhost.events ev ON ev.id = ww.event_id
            WHERE c.wait = 'ended' AND ww.step_id = c.id
        ) waited ON true
        CROSS JOIN LATERAL (
            SELECT CASE WHEN count(*) = 0 THEN '{}'::jsonb ELSE jsonb_build_object('_deps',
                       jsonb_object_agg(d.name, CASE WHEN d.ended_state = 'completed' THEN d.result
                                        ELSE jsonb_build_object('state', d.ended_state, 'error', d.result) END)) END
                   || CASE WHEN bool_or(d.ended_state <> 'completed') THEN jsonb_build_object('_deps_failed',
                       jsonb_agg(d.name ORDER BY d.id) FILTER (WHERE d.ended_state <> 'completed')) ELSE '{}'::jsonb END
                       AS added,
                   CASE
                       WHEN bool_or(d.ended_state <> 'completed' AND e.if_failed = 'fail') THEN 'fail'
                       WHEN bool_or(d.ended_state <> 'completed' AND e.if_failed = 'cancel') THEN 'cancel'
                       ELSE 'run'
                   END AS verdict,
                   string_agg(format('dependency "%s" %s%s', d.name,
                                     CASE d.ended_state WHEN 'failed' THEN 'failed' WHEN 'discarded' THEN 'was discarded'
                                                        ELSE 'was cancelled' END,
                                     CASE WHEN d.result IS NOT NULL AND d.result <> 'null'
                                          THEN ': ' || (d.result #>> '{}') ELSE '' END),
                              '; ' ORDER BY d.id) FILTER (WHERE d.ended_state <> 'completed' AND e.if_failed <> 'run')
                       AS reason
            FROM jobhost.workflow_edges e
            JOIN jobhost.workflow_steps d ON d.id = e.dep_id
            WHERE e.step_id = c.id
        ) deps
    ),
    checked AS (
        SELECT j.id, j.job, j.queue, j.priority, j.delay_ms, j.payload, j.config,
               CASE WHEN j.verdict <> 'run' THEN j.verdict
                    WHEN j.config IS NULL OR octet_length(j.payload::text) > max_payload_bytes THEN 'fail'
                    ELSE 'run' END AS verdict,
               CASE WHEN j.verdict <> 'run' THEN j.reason
                    WHEN j.config IS NULL
                        THEN format('unknown job type "%s": no host has loaded a component for it', j.job)
                    WHEN octet_length(j.payload::text) > max_payload_bytes
                        THEN format('payload of job "%s" is %s bytes of JSON with its _deps, more than the largest '
                                    'accepted, %s bytes', j.job, octet_length(j.payload::text), max_payload_bytes)
               END AS reason
        FROM judged j
    ),
    -- Numbered in step order (nextval after the sort); `plain`: runs, and
    -- its type has no gate to pass and nothing to claim.
    numbered AS MATERIALIZED (
        SELECT c.*, nextval('jobhost.job_ids') AS job_id,
               c.verdict = 'run' AND jsonb_typeof(c.config -> 'concurrency') IS DISTINCT FROM 'object'
                   AND jsonb_typeof(c.config -> 'unique') IS DISTINCT FROM 'object' AS plain
        FROM checked c
        ORDER BY c.id
    ),
    marked AS (
        UPDATE jobhost.workflow_steps s SET job_id = n.job_id, released_at = now()
        FROM numbered n
        WHERE s.id = n.id
    ),
    -- Plain types: inserted here, in the statement that decides them.
    inserted AS (
        INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, max_attempts, run_at)
        SELECT n.job_id, n.job, coalesce(n.queue, n.config ->> 'queue'),
               coalesce(n.priority, (n.config ->> 'priority')::smallint), n.payload,
               CASE WHEN n.delay_ms > 0 THEN 'scheduled' ELSE 'available' END,
               (n.config ->> 'max_attempts')::integer, now() + n.delay_ms * interval '1 millisecond'
        FROM numbered n
        WHERE n.plain
        ORDER BY n.id
    )
    -- The rest (rarely any) go on: gated types, and steps that will not run.
    SELECT coalesce(array_agg(ROW(n.id, n.job_id, n.job, n.queue, n.priority, n.delay_ms,
                                  n.payload, n.verdict, n.reason, n.config)::jobhost.step_release ORDER BY n.id)
                        FILTER (WHERE NOT n.plain), '{}'),
           -- Ready, but waiting for a time or an event: armed below.
           (SELECT array_agg(s.id ORDER BY s.id) FROM jobhost.workflow_steps s
            WHERE s.id = ANY(ready) AND s.wait = 'waiting' AND s.pending = 0 AND (s.job_id IS NULL) IS TRUE)
    INTO releasing, arming
    FROM numbered n;
    IF arming IS NOT NULL THEN
        -- Those whose waits ended at once are released now; a step that
        -- does not run ends, and is counted down by the caller.
        ended_waiting := jobhost.workflow_release(jobhost.workflow_waits_arm(arming));
    END IF;
    IF cardinality(releasing) = 0 THEN
        RETURN ended_waiting;
    END IF;
    -- Limited or unique types: the gate and the claim, one step at a time.
    FOREACH gated IN ARRAY releasing LOOP
        CONTINUE WHEN gated.verdict <> 'run'
            OR (jsonb_typeof(gated.config -> 'concurrency') IS DISTINCT FROM 'object'
                AND jsonb_typeof(gated.config -> 'unique') IS DISTINCT FROM 'object');
        BEGIN
            claimant := jobhost.enqueue_as(gated.job_id, gated.job, gated.payload, gated.queue, gated.priority,
                                           now() + gated.delay_ms * interval '1 millisecond');
            IF claimant IS DISTINCT FROM gated.job_id THEN
                changed_ids := changed_ids || gated.id;
                changed_verdicts := changed_verdicts || 'discard'::text;
                changed_reasons := changed_reasons || format('a duplicate of unique job %s', claimant);
            END IF;
        EXCEPTION
            WHEN serialization_failure OR deadlock_detected OR lock_not_available OR query_canceled THEN
                RAISE;
            WHEN OTHERS THEN
                changed_ids := changed_ids || gated.id;
                changed_verdicts := changed_verdicts || 'fail'::text;
                changed_reasons := changed_reasons || SQLERRM;
        END;
    END LOOP;
    IF cardinality(changed_ids) > 0 THEN
        SELECT array_agg(ROW(r.id, r.job_id, r.job, r.queue, r.priority, r.delay_ms, r.payload,
                             coalesce(c.verdict, r.verdict), coalesce(c.reason, r.reason), r.config)::jobhost.step_release
                         ORDER BY r.id)
        INTO releasing
        FROM unnest(releasing) r
        LEFT JOIN unnest(changed_ids, changed_verdicts, changed_reasons) AS c(id, verdict, reason) ON c.id = r.id;
    END IF;
    -- The steps that will not run end now, straight into the archive
    -- (rarely: an insert of no rows would still run the archive's trigger).
    IF NOT EXISTS (SELECT 1 FROM unnest(releasing) r WHERE r.verdict <> 'run') THEN
        RETURN ended_waiting;
    END IF;
    UPDATE jobhost.workflow_steps s
    SET ended_state = CASE r.verdict WHEN 'fail' THEN 'failed' WHEN 'discard' THEN 'discarded' ELSE 'cancelled' END,
        result = to_jsonb(r.reason), ended_at = now()
    FROM unnest(releasing) r
    WHERE s.id = r.id AND r.verdict <> 'run';
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                 enqueued_at, finished_at, key_carried)
    SELECT r.job_id, r.job, coalesce(r.queue, r.config ->> 'queue', 'default'),
           coalesce(r.priority, (r.config ->> 'priority')::smallint, 0), s.payload, s.ended_state, 0,
           coalesce((r.config ->> 'max_attempts')::integer, 1),
           jsonb_build_array(jsonb_build_object('attempt', 0, 'at', now(), 'error', r.reason)), now(), now(), true
    FROM unnest(releasing) r JOIN jobhost.workflow_steps s ON s.id = r.id
    WHERE r.verdict <> 'run'
    ORDER BY r.id;
    SELECT coalesce(array_agg(r.id ORDER BY r.id), '{}') INTO ended FROM unnest(releasing) r WHERE r.verdict <> 'run';
    RETURN ended || ended_waiting;
END;
$$;


--
-- Name: workflow_steps; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.workflow_steps (
    id bigint NOT NULL,
    workflow_id bigint NOT NULL,
    name text NOT NULL,
    job text NOT NULL,
    payload jsonb NOT NULL,
    queue text,
    priority smallint,
    delay_ms bigint DEFAULT 0 NOT NULL,
    pending integer NOT NULL,
    job_id bigint,
    released_at timestamp with time zone,
    ended_state text,
    result jsonb,
    ended_at timestamp with time zone,
    wait text,
    CONSTRAINT workflow_steps_ended_state_check CHECK ((ended_state = ANY (ARRAY['completed'::text, 'failed'::text, 'discarded'::text, 'cancelled'::text]))),
    CONSTRAINT workflow_steps_payload_check CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT workflow_steps_pending_check CHECK ((pending >= 0)),
    CONSTRAINT workflow_steps_wait_check CHECK ((wait = ANY (ARRAY['waiting'::text, 'armed'::text, 'ended'::text])))
)
WITH (fillfactor='70');


--
-- Name: workflow_step_archive(jobhost.workflow_steps, text, text); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_step_archive(step jobhost.workflow_steps, state text, reason text) RETURNS void
    LANGUAGE sql
    AS $$
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                 enqueued_at, finished_at, key_carried)
    SELECT step.job_id, step.job,
           coalesce(step.queue, t.config ->> 'queue', 'default'),
           coalesce(step.priority, (t.config ->> 'priority')::smallint, 0),
           step.payload, state, 0, coalesce((t.config ->> 'max_attempts')::integer, 1),
           jsonb_build_array(jsonb_build_object('attempt', 0, 'at', now(), 'error', reason)),
           now(), now(), true
    FROM (SELECT 1) one LEFT JOIN jobhost.job_types t ON t.name = step.job
$$;


--
-- Name: workflow_steps_ended(bigint[]); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_steps_ended(ended bigint[]) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    ready bigint[];
BEGIN
    WHILE cardinality(ended) > 0 LOOP
        -- One statement: the dependents are locked in id order before any
        -- is changed (two writes counting down one join take its row in one
        -- order), then counted down.
        WITH counted AS (
            SELECT e.step_id, count(*)::integer AS n
            FROM jobhost.workflow_edges e
            WHERE e.dep_id = ANY(ended)
            GROUP BY e.step_id
        ),
        locked AS (
            SELECT s.id, c.n FROM jobhost.workflow_steps s JOIN counted c ON c.step_id = s.id
            ORDER BY s.id
            FOR UPDATE OF s
        ),
        counted_down AS (
            UPDATE jobhost.workflow_steps s SET pending = s.pending - l.n
            FROM locked l
            WHERE s.id = l.id
            RETURNING s.id, s.pending, s.job_id
        )
        SELECT coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.pending = 0 AND d.job_id IS NULL), '{}')
        INTO ready
        FROM counted_down d;
        ended := jobhost.workflow_release(ready);
    END LOOP;
END;
$$;


--
-- Name: workflow_waits_arm(bigint[], boolean); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_waits_arm(steps bigint[], wait_for_senders boolean DEFAULT false) RETURNS bigint[]
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    AS $$
DECLARE
    w record;
    ended bigint[] := '{}';
    armed timestamptz;
    due timestamptz;
    found_event bigint;
    source jsonb;
    rendered jsonb;
BEGIN
    FOR w IN
        SELECT ww.*, s.workflow_id FROM jobhost.workflow_steps s
        JOIN jobhost.workflow_waits ww ON ww.step_id = s.id
        WHERE s.id = ANY(steps) AND s.wait = 'waiting' AND s.pending = 0 AND s.job_id IS NULL
          AND ww.armed_at IS NULL AND ww.ended_by IS NULL
        ORDER BY s.id
        FOR UPDATE OF s, ww
    LOOP
        IF EXISTS (SELECT 1 FROM jobhost.workflows f WHERE f.id = w.workflow_id AND f.cancelled_at IS NOT NULL)
           OR EXISTS (SELECT 1 FROM jobhost.workflow_edges e JOIN jobhost.workflow_steps d ON d.id = e.dep_id
                      WHERE e.step_id = w.step_id AND d.ended_state <> 'completed' AND e.if_failed <> 'run') THEN
            UPDATE jobhost.workflow_waits SET ended_by = 'skipped', ended_at = now() WHERE step_id = w.step_id;
            ended := ended || w.step_id;
            CONTINUE;
        END IF;
        IF w.key IS NULL THEN
            due := coalesce(w.until, now() + w.sleep_ms * interval '1 millisecond');
            UPDATE jobhost.workflow_waits
            SET armed_at = now(), due_at = due,
                ended_by = CASE WHEN due <= now() THEN 'time' END,
                ended_at = CASE WHEN due <= now() THEN now() END
            WHERE step_id = w.step_id;
            IF due <= now() THEN
                ended := ended || w.step_id;
            ELSE
                UPDATE jobhost.workflow_steps SET wait = 'armed' WHERE id = w.step_id;
            END IF;
            CONTINUE;
        END IF;
        -- A match kept for now: rendered from the step's payload and its
        -- dependencies' outputs (the first, in their order, that has a
        -- field), or, naming a field none has, the wait ends unmatched.
        IF w.match_later IS NOT NULL THEN
            SELECT (SELECT coalesce(jsonb_object_agg(o.key, o.value), '{}')
                    FROM (SELECT DISTINCT ON (kv.key) kv.key, kv.value
                          FROM jobhost.workflow_edges e JOIN jobhost.workflow_steps d ON d.id = e.dep_id
                          CROSS JOIN LATERAL jsonb_each(CASE WHEN jsonb_typeof(d.result) = 'object'
                                                             THEN d.result ELSE '{}' END) kv
                          WHERE e.step_id = w.step_id AND d.ended_state = 'completed'
                          ORDER BY kv.key, d.id) o) || s.payload
            INTO source
            FROM jobhost.workflow_steps s WHERE s.id = w.step_id;
            rendered := NULL;
            IF NOT EXISTS (SELECT 1 FROM jsonb_each_text(w.match_later) m
                           WHERE NOT jobhost.key_renders(m.value, source)) THEN
                -- A template its creation let through that still does not
                -- render (its shape is checked there) ends the wait too,
                -- rather than the result write that armed it.
                BEGIN
                    rendered := (SELECT jsonb_object_agg(m.key, jobhost.render_key(m.value, source))
                                 FROM jsonb_each_text(w.match_later) m);
                EXCEPTION WHEN data_exception THEN
                    rendered := NULL;
                END;
            END IF;
            -- A key's most bytes, as every rendered key (src/template.rs).
            IF rendered IS NULL OR EXISTS (SELECT 1 FROM jsonb_each_text(rendered) r WHERE octet_length(r.value) > 1024)
            THEN
                UPDATE jobhost.workflow_waits SET ended_by = 'unmatched', ended_at = now(), armed_at = now()
                WHERE step_id = w.step_id;
                ended := ended || w.step_id;
                CONTINUE;
            END IF;
            w.match := rendered;
            UPDATE jobhost.workflow_waits SET match = w.match, match_one = jobhost.match_one(w.match),
                                              match_later = NULL
            WHERE step_id = w.step_id;
        END IF;
        IF wait_for_senders THEN
            BEGIN
                PERFORM pg_advisory_xact_lock(hashtextextended('jobhost.event ' || w.key, 0));
            EXCEPTION WHEN lock_not_available THEN
                -- A sender still holds the key: the next pass, and the others first.
                UPDATE jobhost.workflow_waits SET due_at = now() + interval '1 second' WHERE step_id = w.step_id;
                CONTINUE;
            END;
        ELSIF NOT pg_try_advisory_xact_lock(hashtextextended('jobhost.event ' || w.key, 0)) THEN
            UPDATE jobhost.workflow_waits
            SET due_at = now(), deferred_in = pg_current_snapshot(), deferred_by = pg_current_xact_id()
            WHERE step_id = w.step_id;
            CONTINUE;
        END IF;
        -- After the lock, in a statement of its own: it sees every event
        -- committed by a sender that held the key before.
        armed := clock_timestamp();
        found_event := NULL;
        IF w.deferred_in IS NOT NULL THEN
            SELECT e.id INTO found_event FROM jobhost.events e
            WHERE e.key = w.key
              AND (e.sent_by = w.deferred_by OR NOT pg_visible_in_snapshot(e.sent_by, w.deferred_in))
              AND jobhost.event_matches(w.match, e.payload)
            ORDER BY e.id
            LIMIT 1;
        END IF;
        IF found_event IS NULL AND w.lookback_ms > 0 THEN
            SELECT e.id INTO found_event FROM jobhost.events e
            WHERE e.key = w.key AND e.sent_at >= armed - w.lookback_ms * interval '1 millisecond'
              AND jobhost.event_matches(w.match, e.payload)
            ORDER BY e.sent_at DESC, e.id DESC
            LIMIT 1;
        END IF;
        UPDATE jobhost.workflow_waits
        SET armed_at = armed, due_at = armed + w.timeout_ms * interval '1 millisecond',
            ended_by = CASE WHEN found_event IS NOT NULL THEN 'event' END,
            ended_at = CASE WHEN found_event IS NOT NULL THEN armed END,
            event_id = found_event
        WHERE step_id = w.step_id;
        IF found_event IS NOT NULL THEN
            UPDATE jobhost.events SET released = released + 1 WHERE id = found_event;
            ended := ended || w.step_id;
        ELSE
            UPDATE jobhost.workflow_steps SET wait = 'armed' WHERE id = w.step_id;
        END IF;
    END LOOP;
    IF cardinality(ended) > 0 THEN
        UPDATE jobhost.workflow_steps SET wait = 'ended' WHERE id = ANY(ended);
    END IF;
    RETURN ended;
END;
$$;


--
-- Name: workflow_waits_arm_late(timestamp with time zone, integer); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_waits_arm_late(at timestamp with time zone, batch integer) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    SET lock_timeout TO '200ms'
    AS $$
DECLARE
    late bigint[];
    ended bigint[];
BEGIN
    SELECT coalesce(array_agg(d.id ORDER BY d.id), '{}') INTO late
    FROM (
        SELECT s.id FROM jobhost.workflow_waits w
        JOIN jobhost.workflow_steps s ON s.id = w.step_id
        WHERE w.ended_by IS NULL AND w.due_at <= at AND w.armed_at IS NULL
        ORDER BY w.due_at
        LIMIT batch
        FOR UPDATE OF s SKIP LOCKED
    ) d;
    IF cardinality(late) = 0 THEN
        RETURN 0;
    END IF;
    ended := jobhost.workflow_waits_arm(late, true);
    PERFORM jobhost.workflow_steps_ended(jobhost.workflow_release(ended));
    RETURN (SELECT count(*) FROM jobhost.workflow_waits w WHERE w.step_id = ANY(late) AND w.armed_at IS NOT NULL);
END;
$$;


--
-- Name: workflow_waits_due(timestamp with time zone, integer); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_waits_due(at timestamp with time zone, batch integer) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    AS $$
DECLARE
    sleeps bigint[];
    timeouts bigint[];
BEGIN
    SELECT coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.key IS NULL), '{}'),
           coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.key IS NOT NULL), '{}')
    INTO sleeps, timeouts
    FROM (
        SELECT s.id, w.key FROM jobhost.workflow_waits w
        JOIN jobhost.workflow_steps s ON s.id = w.step_id
        WHERE w.ended_by IS NULL AND w.due_at <= at AND w.armed_at IS NOT NULL
        ORDER BY w.due_at
        LIMIT batch
        FOR UPDATE OF s SKIP LOCKED
    ) d;
    RETURN jobhost.workflow_waits_end(sleeps, 'time') + jobhost.workflow_waits_end(timeouts, 'timeout');
END;
$$;


--
-- Name: workflow_waits_end(bigint[], text, bigint); Type: FUNCTION; Schema: jobhost; Owner: -
--

CREATE FUNCTION jobhost.workflow_waits_end(steps bigint[], how text, event bigint DEFAULT NULL::bigint) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    done bigint[];
BEGIN
    IF cardinality(steps) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM jobhost.workflow_steps s WHERE s.id = ANY(steps) ORDER BY s.id FOR UPDATE;
    WITH ended AS (
        UPDATE jobhost.workflow_waits w
        SET ended_by = how, ended_at = now(), event_id = event
        WHERE w.step_id = ANY(steps) AND w.ended_by IS NULL AND w.armed_at IS NOT NULL
        RETURNING w.step_id
    )
    SELECT coalesce(array_agg(e.step_id ORDER BY e.step_id), '{}') INTO done FROM ended e;
    IF cardinality(done) = 0 THEN
        RETURN 0;
    END IF;
    UPDATE jobhost.workflow_steps SET wait = 'ended' WHERE id = ANY(done);
    PERFORM jobhost.workflow_steps_ended(jobhost.workflow_release(done));
    RETURN cardinality(done);
END;
$$;


--
-- Name: _sqlx_migrations; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost._sqlx_migrations (
    version bigint NOT NULL,
    description text NOT NULL,
    installed_on timestamp with time zone DEFAULT now() NOT NULL,
    success boolean NOT NULL,
    checksum bytea NOT NULL,
    execution_time bigint NOT NULL
);


--
-- Name: access_tokens; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.access_tokens (
    name text NOT NULL,
    digest text NOT NULL,
    role text NOT NULL,
    queues text[],
    payloads boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    created_by text NOT NULL,
    expires_at timestamp with time zone,
    revoked_at timestamp with time zone,
    last_used_at timestamp with time zone,
    CONSTRAINT access_tokens_name_check CHECK ((name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'::text)),
    CONSTRAINT access_tokens_queues_check CHECK (((cardinality(queues) >= 1) AND (cardinality(queues) <= 100))),
    CONSTRAINT access_tokens_role_check CHECK ((role = ANY (ARRAY['read'::text, 'operate'::text, 'deploy'::text, 'admin'::text])))
);


--
-- Name: archive; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.archive (
    id bigint NOT NULL,
    job text NOT NULL,
    queue text NOT NULL,
    priority smallint NOT NULL,
    payload jsonb NOT NULL,
    state text NOT NULL,
    attempt integer NOT NULL,
    max_attempts integer NOT NULL,
    output jsonb,
    errors jsonb DEFAULT '[]'::jsonb NOT NULL,
    log jsonb,
    progress jsonb,
    enqueued_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone DEFAULT now() NOT NULL,
    host_id text,
    concurrency_key text,
    batch_id bigint,
    parent_id bigint,
    unique_key text,
    key_carried boolean DEFAULT false NOT NULL,
    CONSTRAINT archive_state_check CHECK ((state = ANY (ARRAY['completed'::text, 'failed'::text, 'discarded'::text, 'cancelled'::text])))
);


--
-- Name: audit; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.audit (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    via text NOT NULL,
    who text NOT NULL,
    address text,
    user_agent text,
    action text NOT NULL,
    object text NOT NULL,
    outcome text NOT NULL,
    count bigint DEFAULT 1 NOT NULL,
    CONSTRAINT audit_count_check CHECK ((count >= 1)),
    CONSTRAINT audit_via_check CHECK ((via = ANY (ARRAY['api'::text, 'dashboard'::text, 'cli'::text, 'sql'::text, 'library'::text, 'webhook'::text])))
);


--
-- Name: audit_id_seq; Type: SEQUENCE; Schema: jobhost; Owner: -
--

ALTER TABLE jobhost.audit ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME jobhost.audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: batches_id_seq; Type: SEQUENCE; Schema: jobhost; Owner: -
--

ALTER TABLE jobhost.batches ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME jobhost.batches_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: blocked_jobs; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.blocked_jobs (
    id bigint NOT NULL,
    job text NOT NULL,
    queue text NOT NULL,
    priority smallint NOT NULL,
    payload jsonb NOT NULL,
    attempt integer NOT NULL,
    max_attempts integer NOT NULL,
    enqueued_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone,
    concurrency_key text NOT NULL,
    batch_id bigint,
    parent_id bigint,
    errors jsonb NOT NULL,
    progress jsonb,
    parked_at timestamp with time zone DEFAULT now() NOT NULL,
    unique_key text
);


--
-- Name: component_sources; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.component_sources (
    digest text NOT NULL,
    job_type text NOT NULL,
    bytes bytea NOT NULL,
    config jsonb NOT NULL,
    uploaded_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT component_sources_config_check CHECK ((jsonb_typeof(config) = 'object'::text)),
    CONSTRAINT component_sources_digest_check CHECK ((digest ~ '^[0-9a-f]{64}$'::text))
);


--
-- Name: deployments; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.deployments (
    id bigint NOT NULL,
    job_type text NOT NULL,
    digest text,
    action text NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT deployments_action_check CHECK ((action = ANY (ARRAY['deploy'::text, 'rollback'::text, 'undeploy'::text]))),
    CONSTRAINT deployments_check CHECK (((action = 'undeploy'::text) = (digest IS NULL)))
);


--
-- Name: deployments_id_seq; Type: SEQUENCE; Schema: jobhost; Owner: -
--

ALTER TABLE jobhost.deployments ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME jobhost.deployments_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: events; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.events (
    id bigint NOT NULL,
    key text NOT NULL,
    payload jsonb NOT NULL,
    idempotency_key text,
    source text DEFAULT 'sql'::text NOT NULL,
    sent_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    sent_by xid8 DEFAULT pg_current_xact_id() NOT NULL,
    released integer DEFAULT 0 NOT NULL,
    jobs jsonb DEFAULT '[]'::jsonb NOT NULL,
    CONSTRAINT events_idempotency_key_check CHECK (((octet_length(idempotency_key) >= 1) AND (octet_length(idempotency_key) <= 256))),
    CONSTRAINT events_key_check CHECK (((octet_length(key) >= 1) AND (octet_length(key) <= 256))),
    CONSTRAINT events_payload_check CHECK ((jsonb_typeof(payload) = 'object'::text))
);


--
-- Name: events_id_seq; Type: SEQUENCE; Schema: jobhost; Owner: -
--

ALTER TABLE jobhost.events ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME jobhost.events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: function_sources; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.function_sources (
    name text NOT NULL,
    sha256 text NOT NULL,
    generation bigint NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: history; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.history (
    minute timestamp with time zone NOT NULL,
    queue text NOT NULL,
    job text NOT NULL,
    completed bigint DEFAULT 0 NOT NULL,
    failed bigint DEFAULT 0 NOT NULL,
    discarded bigint DEFAULT 0 NOT NULL,
    cancelled bigint DEFAULT 0 NOT NULL,
    runs bigint DEFAULT 0 NOT NULL,
    run_p50_ms double precision,
    run_p95_ms double precision,
    run_max_ms double precision,
    waits bigint DEFAULT 0 NOT NULL,
    wait_p50_ms double precision,
    wait_p95_ms double precision,
    available bigint,
    blocked bigint,
    scheduled bigint
);


--
-- Name: history_late; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.history_late (
    minute timestamp with time zone NOT NULL
);


--
-- Name: history_marks; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.history_marks (
    name text NOT NULL,
    upto timestamp with time zone NOT NULL
);


--
-- Name: history_retries; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.history_retries (
    minute timestamp with time zone NOT NULL,
    queue text NOT NULL,
    job text NOT NULL,
    retried bigint NOT NULL
);


--
-- Name: hosts; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.hosts (
    id text NOT NULL,
    hostname text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    job_types text[] DEFAULT '{}'::text[] NOT NULL,
    heartbeat_ms integer DEFAULT 5000 NOT NULL,
    digests jsonb DEFAULT '{}'::jsonb NOT NULL,
    watcher_error text,
    CONSTRAINT hosts_digests_check CHECK ((jsonb_typeof(digests) = 'object'::text)),
    CONSTRAINT hosts_heartbeat_ms_check CHECK ((heartbeat_ms > 0))
);


--
-- Name: http_sessions; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.http_sessions (
    digest text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    last_seen_at timestamp with time zone DEFAULT now() NOT NULL,
    token_name text
);


--
-- Name: job_traces; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.job_traces (
    job_id bigint NOT NULL,
    traceparent text NOT NULL,
    CONSTRAINT job_traces_traceparent_check CHECK ((traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'::text))
);


--
-- Name: job_type_digests; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.job_type_digests (
    name text NOT NULL,
    digest text NOT NULL,
    seq bigint NOT NULL,
    first_registered_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: job_type_digests_seq_seq; Type: SEQUENCE; Schema: jobhost; Owner: -
--

ALTER TABLE jobhost.job_type_digests ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME jobhost.job_type_digests_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: job_types; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.job_types (
    name text NOT NULL,
    config jsonb NOT NULL,
    digest text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: job_waits; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.job_waits (
    id bigint NOT NULL,
    job_id bigint NOT NULL,
    waited_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: job_waits_id_seq; Type: SEQUENCE; Schema: jobhost; Owner: -
--

ALTER TABLE jobhost.job_waits ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME jobhost.job_waits_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: keyed_schedules; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.keyed_schedules (
    job text NOT NULL,
    key text NOT NULL,
    cron text NOT NULL,
    time_zone text DEFAULT 'UTC'::text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    overlap text DEFAULT 'allow'::text NOT NULL,
    jitter_ms bigint DEFAULT 0 NOT NULL,
    backfill integer DEFAULT 1 NOT NULL,
    starts_at timestamp with time zone,
    ends_at timestamp with time zone,
    paused boolean DEFAULT false NOT NULL,
    note text DEFAULT ''::text NOT NULL,
    since timestamp with time zone DEFAULT now() NOT NULL,
    last_tick timestamp with time zone,
    last_job bigint,
    buffered_tick timestamp with time zone,
    skipped bigint DEFAULT 0 NOT NULL,
    triggered_at timestamp with time zone,
    look_at timestamp with time zone DEFAULT now(),
    handovers jsonb DEFAULT '[]'::jsonb NOT NULL,
    next_tick timestamp with time zone,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT keyed_schedules_backfill_check CHECK (((backfill >= 0) AND (backfill <= 1000))),
    CONSTRAINT keyed_schedules_check CHECK ((ends_at > starts_at)),
    CONSTRAINT keyed_schedules_cron_check CHECK (((char_length(cron) >= 1) AND (char_length(cron) <= 200))),
    CONSTRAINT keyed_schedules_ends_at_check CHECK (((ends_at >= '0001-01-01 00:00:00+00'::timestamp with time zone) AND (ends_at <= '9999-12-31 00:00:00+00'::timestamp with time zone))),
    CONSTRAINT keyed_schedules_handovers_check CHECK ((jsonb_typeof(handovers) = 'array'::text)),
    CONSTRAINT keyed_schedules_jitter_ms_check CHECK (((jitter_ms >= 0) AND (jitter_ms <= 86400000))),
    CONSTRAINT keyed_schedules_key_check CHECK (((key <> ''::text) AND (char_length(key) <= 200))),
    CONSTRAINT keyed_schedules_note_check CHECK ((char_length(note) <= 1000)),
    CONSTRAINT keyed_schedules_overlap_check CHECK ((overlap = ANY (ARRAY['allow'::text, 'skip'::text, 'buffer_one'::text]))),
    CONSTRAINT keyed_schedules_payload_check CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT keyed_schedules_starts_at_check CHECK (((starts_at >= '0001-01-01 00:00:00+00'::timestamp with time zone) AND (starts_at <= '9999-12-31 00:00:00+00'::timestamp with time zone)))
);


--
-- Name: lease_tokens; Type: SEQUENCE; Schema: jobhost; Owner: -
--

CREATE SEQUENCE jobhost.lease_tokens
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: outbound_grants; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.outbound_grants (
    job_type text NOT NULL,
    origin text NOT NULL,
    methods text[] DEFAULT '{}'::text[] NOT NULL,
    secrets text[] DEFAULT '{}'::text[] NOT NULL,
    private boolean DEFAULT false NOT NULL,
    idempotency_key boolean DEFAULT false NOT NULL,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    connect_timeout_ms bigint,
    first_byte_timeout_ms bigint,
    between_bytes_timeout_ms bigint,
    secrets_in text[] DEFAULT '{}'::text[] NOT NULL,
    secret_headers text[] DEFAULT '{}'::text[] NOT NULL,
    CONSTRAINT outbound_grants_between_bytes_timeout_ms_check CHECK ((between_bytes_timeout_ms > 0)),
    CONSTRAINT outbound_grants_connect_timeout_ms_check CHECK ((connect_timeout_ms > 0)),
    CONSTRAINT outbound_grants_first_byte_timeout_ms_check CHECK ((first_byte_timeout_ms > 0)),
    CONSTRAINT outbound_grants_secrets_in_check CHECK ((secrets_in <@ ARRAY['query'::text, 'body'::text]))
);


--
-- Name: outbound_secrets; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.outbound_secrets (
    name text NOT NULL,
    key_id text NOT NULL,
    nonce bytea NOT NULL,
    ciphertext bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: queue_pauses; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.queue_pauses (
    name text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: rate_keys; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.rate_keys (
    job text NOT NULL,
    key text NOT NULL,
    starts timestamp with time zone[] DEFAULT '{}'::timestamp with time zone[] NOT NULL,
    planned bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    throttled_until timestamp with time zone,
    throttles bigint DEFAULT 0 NOT NULL,
    deferred bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: schedule_looks; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.schedule_looks (
    job text NOT NULL,
    looked_at timestamp with time zone NOT NULL,
    passed_at timestamp with time zone NOT NULL
);


--
-- Name: schedules; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.schedules (
    job text NOT NULL,
    cron text NOT NULL,
    time_zone text NOT NULL,
    since timestamp with time zone DEFAULT now() NOT NULL,
    last_tick timestamp with time zone,
    looked_at timestamp with time zone,
    CONSTRAINT schedules_check CHECK ((last_tick > since))
);


--
-- Name: semaphores; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.semaphores (
    job text NOT NULL,
    key text NOT NULL,
    holders integer NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT semaphores_holders_check CHECK ((holders >= 0))
);


--
-- Name: time_zones; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.time_zones (
    name text NOT NULL
);


--
-- Name: type_variables; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.type_variables (
    job_type text NOT NULL,
    name text NOT NULL,
    value text NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: unique_claims; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.unique_claims (
    job text NOT NULL,
    unique_key text NOT NULL,
    job_id bigint NOT NULL,
    lease_token bigint,
    claimed_at timestamp with time zone DEFAULT now() NOT NULL,
    attached boolean DEFAULT false NOT NULL
);


--
-- Name: unique_keys; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.unique_keys (
    job_id bigint NOT NULL,
    job text NOT NULL,
    unique_key text NOT NULL,
    while_executing boolean NOT NULL,
    CONSTRAINT unique_keys_unique_key_check CHECK ((octet_length(unique_key) <= 1024))
);


--
-- Name: webhooks; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.webhooks (
    name text NOT NULL,
    event_key text NOT NULL,
    style text NOT NULL,
    secret text NOT NULL,
    tolerance_secs integer DEFAULT 300 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT webhooks_event_key_check CHECK (((octet_length(event_key) >= 1) AND (octet_length(event_key) <= 256))),
    CONSTRAINT webhooks_name_check CHECK ((name ~ '^[A-Za-z0-9_.-]{1,64}$'::text)),
    CONSTRAINT webhooks_style_check CHECK ((style = ANY (ARRAY['stripe'::text, 'github'::text, 'standard'::text]))),
    CONSTRAINT webhooks_tolerance_secs_check CHECK ((tolerance_secs > 0))
);


--
-- Name: workflow_edges; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.workflow_edges (
    step_id bigint NOT NULL,
    dep_id bigint NOT NULL,
    if_failed text NOT NULL,
    CONSTRAINT workflow_edges_if_failed_check CHECK ((if_failed = ANY (ARRAY['cancel'::text, 'run'::text, 'fail'::text])))
);


--
-- Name: workflow_step_states; Type: VIEW; Schema: jobhost; Owner: -
--

CREATE VIEW jobhost.workflow_step_states AS
 SELECT s.id,
    s.workflow_id,
    s.name,
    s.job,
    s.payload,
    s.queue,
    s.priority,
    s.delay_ms,
    s.pending,
    s.job_id,
    s.released_at,
    s.ended_state,
    s.result,
    s.ended_at,
        CASE
            WHEN (s.ended_state IS NOT NULL) THEN s.ended_state
            WHEN (s.job_id IS NULL) THEN 'waiting'::text
            WHEN (j.state IS NOT NULL) THEN j.state
            WHEN (EXISTS ( SELECT 1
               FROM jobhost.blocked_jobs b
              WHERE (b.id = s.job_id))) THEN 'blocked'::text
            ELSE 'waiting'::text
        END AS state
   FROM (jobhost.workflow_steps s
     LEFT JOIN jobhost.jobs j ON ((j.id = s.job_id)));


--
-- Name: workflow_steps_id_seq; Type: SEQUENCE; Schema: jobhost; Owner: -
--

ALTER TABLE jobhost.workflow_steps ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME jobhost.workflow_steps_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: workflow_waits; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.workflow_waits (
    step_id bigint NOT NULL,
    key text,
    match jsonb DEFAULT '{}'::jsonb NOT NULL,
    match_one text,
    sleep_ms bigint,
    until timestamp with time zone,
    timeout_ms bigint,
    on_timeout text DEFAULT 'fail'::text NOT NULL,
    lookback_ms bigint DEFAULT 0 NOT NULL,
    armed_at timestamp with time zone,
    due_at timestamp with time zone,
    ended_by text,
    ended_at timestamp with time zone,
    event_id bigint,
    deferred_in pg_snapshot,
    deferred_by xid8,
    match_later jsonb,
    CONSTRAINT workflow_waits_check CHECK (((key IS NULL) = ((sleep_ms IS NOT NULL) OR (until IS NOT NULL)))),
    CONSTRAINT workflow_waits_ended_by_check CHECK ((ended_by = ANY (ARRAY['event'::text, 'time'::text, 'timeout'::text, 'skipped'::text, 'unmatched'::text]))),
    CONSTRAINT workflow_waits_key_check CHECK (((octet_length(key) >= 1) AND (octet_length(key) <= 256))),
    CONSTRAINT workflow_waits_lookback_ms_check CHECK ((lookback_ms >= 0)),
    CONSTRAINT workflow_waits_match_check CHECK ((jsonb_typeof(match) = 'object'::text)),
    CONSTRAINT workflow_waits_match_later_check CHECK ((jsonb_typeof(match_later) = 'object'::text)),
    CONSTRAINT workflow_waits_on_timeout_check CHECK ((on_timeout = ANY (ARRAY['cancel'::text, 'run'::text, 'fail'::text]))),
    CONSTRAINT workflow_waits_sleep_ms_check CHECK ((sleep_ms >= 0)),
    CONSTRAINT workflow_waits_timeout_ms_check CHECK ((timeout_ms >= 0))
);


--
-- Name: workflows; Type: TABLE; Schema: jobhost; Owner: -
--

CREATE TABLE jobhost.workflows (
    id bigint NOT NULL,
    label text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    cancelled_at timestamp with time zone,
    CONSTRAINT workflows_label_check CHECK ((octet_length(label) <= 256))
);


--
-- Name: workflows_id_seq; Type: SEQUENCE; Schema: jobhost; Owner: -
--

ALTER TABLE jobhost.workflows ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME jobhost.workflows_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: _sqlx_migrations _sqlx_migrations_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost._sqlx_migrations
    ADD CONSTRAINT _sqlx_migrations_pkey PRIMARY KEY (version);


--
-- Name: access_tokens access_tokens_digest_key; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.access_tokens
    ADD CONSTRAINT access_tokens_digest_key UNIQUE (digest);


--
-- Name: access_tokens access_tokens_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.access_tokens
    ADD CONSTRAINT access_tokens_pkey PRIMARY KEY (name);


--
-- Name: archive archive_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.archive
    ADD CONSTRAINT archive_pkey PRIMARY KEY (id);


--
-- Name: audit audit_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.audit
    ADD CONSTRAINT audit_pkey PRIMARY KEY (id);


--
-- Name: batches batches_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.batches
    ADD CONSTRAINT batches_pkey PRIMARY KEY (id);


--
-- Name: blocked_jobs blocked_jobs_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.blocked_jobs
    ADD CONSTRAINT blocked_jobs_pkey PRIMARY KEY (id);


--
-- Name: component_sources component_sources_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.component_sources
    ADD CONSTRAINT component_sources_pkey PRIMARY KEY (digest);


--
-- Name: jobs concurrency_key_at_most_1024_bytes; Type: CHECK CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE jobhost.jobs
    ADD CONSTRAINT concurrency_key_at_most_1024_bytes CHECK ((octet_length(concurrency_key) <= 1024)) NOT VALID;


--
-- Name: deployments deployments_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.deployments
    ADD CONSTRAINT deployments_pkey PRIMARY KEY (id);


--
-- Name: events events_idempotency_key_key; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.events
    ADD CONSTRAINT events_idempotency_key_key UNIQUE (idempotency_key);


--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (id);


--
-- Name: function_sources function_sources_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.function_sources
    ADD CONSTRAINT function_sources_pkey PRIMARY KEY (name);


--
-- Name: history_late history_late_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.history_late
    ADD CONSTRAINT history_late_pkey PRIMARY KEY (minute);


--
-- Name: history_marks history_marks_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.history_marks
    ADD CONSTRAINT history_marks_pkey PRIMARY KEY (name);


--
-- Name: history history_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.history
    ADD CONSTRAINT history_pkey PRIMARY KEY (minute, queue, job);


--
-- Name: history_retries history_retries_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.history_retries
    ADD CONSTRAINT history_retries_pkey PRIMARY KEY (minute, queue, job);


--
-- Name: hosts hosts_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.hosts
    ADD CONSTRAINT hosts_pkey PRIMARY KEY (id);


--
-- Name: http_sessions http_sessions_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.http_sessions
    ADD CONSTRAINT http_sessions_pkey PRIMARY KEY (digest);


--
-- Name: job_traces job_traces_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.job_traces
    ADD CONSTRAINT job_traces_pkey PRIMARY KEY (job_id);


--
-- Name: job_type_digests job_type_digests_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.job_type_digests
    ADD CONSTRAINT job_type_digests_pkey PRIMARY KEY (name, digest);


--
-- Name: job_types job_types_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.job_types
    ADD CONSTRAINT job_types_pkey PRIMARY KEY (name);


--
-- Name: job_waits job_waits_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.job_waits
    ADD CONSTRAINT job_waits_pkey PRIMARY KEY (id);


--
-- Name: jobs jobs_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);


--
-- Name: keyed_schedules keyed_schedules_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.keyed_schedules
    ADD CONSTRAINT keyed_schedules_pkey PRIMARY KEY (job, key);


--
-- Name: outbound_grants outbound_grants_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.outbound_grants
    ADD CONSTRAINT outbound_grants_pkey PRIMARY KEY (job_type, origin);


--
-- Name: outbound_secrets outbound_secrets_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.outbound_secrets
    ADD CONSTRAINT outbound_secrets_pkey PRIMARY KEY (name);


--
-- Name: queue_pauses queue_pauses_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.queue_pauses
    ADD CONSTRAINT queue_pauses_pkey PRIMARY KEY (name);


--
-- Name: rate_keys rate_keys_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.rate_keys
    ADD CONSTRAINT rate_keys_pkey PRIMARY KEY (job, key);


--
-- Name: schedule_looks schedule_looks_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.schedule_looks
    ADD CONSTRAINT schedule_looks_pkey PRIMARY KEY (job);


--
-- Name: schedules schedules_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (job);


--
-- Name: semaphores semaphores_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.semaphores
    ADD CONSTRAINT semaphores_pkey PRIMARY KEY (job, key);


--
-- Name: time_zones time_zones_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.time_zones
    ADD CONSTRAINT time_zones_pkey PRIMARY KEY (name);


--
-- Name: type_variables type_variables_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.type_variables
    ADD CONSTRAINT type_variables_pkey PRIMARY KEY (job_type, name);


--
-- Name: unique_claims unique_claims_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.unique_claims
    ADD CONSTRAINT unique_claims_pkey PRIMARY KEY (unique_key, job);


--
-- Name: unique_keys unique_keys_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.unique_keys
    ADD CONSTRAINT unique_keys_pkey PRIMARY KEY (job_id);


--
-- Name: webhooks webhooks_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.webhooks
    ADD CONSTRAINT webhooks_pkey PRIMARY KEY (name);


--
-- Name: workflow_edges workflow_edges_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.workflow_edges
    ADD CONSTRAINT workflow_edges_pkey PRIMARY KEY (step_id, dep_id);


--
-- Name: workflow_steps workflow_steps_job_id_key; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.workflow_steps
    ADD CONSTRAINT workflow_steps_job_id_key UNIQUE (job_id);


--
-- Name: workflow_steps workflow_steps_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.workflow_steps
    ADD CONSTRAINT workflow_steps_pkey PRIMARY KEY (id);


--
-- Name: workflow_steps workflow_steps_workflow_id_name_key; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.workflow_steps
    ADD CONSTRAINT workflow_steps_workflow_id_name_key UNIQUE (workflow_id, name);


--
-- Name: workflow_waits workflow_waits_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.workflow_waits
    ADD CONSTRAINT workflow_waits_pkey PRIMARY KEY (step_id);


--
-- Name: workflows workflows_pkey; Type: CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.workflows
    ADD CONSTRAINT workflows_pkey PRIMARY KEY (id);


--
-- Name: archive_batch; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX archive_batch ON jobhost.archive USING btree (batch_id) WHERE (batch_id IS NOT NULL);


--
-- Name: archive_finished; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX archive_finished ON jobhost.archive USING btree (finished_at);


--
-- Name: archive_job_state; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX archive_job_state ON jobhost.archive USING btree (job, state, finished_at);


--
-- Name: audit_at; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX audit_at ON jobhost.audit USING btree (at);


--
-- Name: batches_finished; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX batches_finished ON jobhost.batches USING btree (finished_at) WHERE (finished_at IS NOT NULL);


--
-- Name: blocked_jobs_batch; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX blocked_jobs_batch ON jobhost.blocked_jobs USING btree (batch_id) WHERE (batch_id IS NOT NULL);


--
-- Name: blocked_jobs_next; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX blocked_jobs_next ON jobhost.blocked_jobs USING btree (job, concurrency_key, priority, parked_at, id);


--
-- Name: deployments_by_type; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX deployments_by_type ON jobhost.deployments USING btree (job_type, id DESC);


--
-- Name: events_key_sent; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX events_key_sent ON jobhost.events USING btree (key, sent_at);


--
-- Name: events_sent; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX events_sent ON jobhost.events USING btree (sent_at);


--
-- Name: history_job; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX history_job ON jobhost.history USING btree (job, minute);


--
-- Name: history_retries_job; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX history_retries_job ON jobhost.history_retries USING btree (job, minute);


--
-- Name: job_waits_job; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX job_waits_job ON jobhost.job_waits USING btree (job_id);


--
-- Name: jobs_batch; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX jobs_batch ON jobhost.jobs USING btree (batch_id) WHERE (batch_id IS NOT NULL);


--
-- Name: jobs_due; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX jobs_due ON jobhost.jobs USING btree (run_at) WHERE (state = 'scheduled'::text);


--
-- Name: jobs_fetch; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX jobs_fetch ON jobhost.jobs USING btree (priority, run_at, id) WHERE (state = 'available'::text);


--
-- Name: jobs_holders; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX jobs_holders ON jobhost.jobs USING btree (job, concurrency_key) WHERE ((concurrency_key IS NOT NULL) AND (state = ANY (ARRAY['available'::text, 'running'::text])));


--
-- Name: jobs_host; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX jobs_host ON jobhost.jobs USING btree (host_id) WHERE (state = 'running'::text);


--
-- Name: jobs_leases; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX jobs_leases ON jobhost.jobs USING btree (lease_expires_at) WHERE (state = 'running'::text);


--
-- Name: keyed_schedules_due; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX keyed_schedules_due ON jobhost.keyed_schedules USING btree (job, look_at) WHERE ((look_at IS NOT NULL) AND (NOT paused));


--
-- Name: rate_keys_throttled; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX rate_keys_throttled ON jobhost.rate_keys USING btree (job, throttled_until) WHERE (throttled_until IS NOT NULL);


--
-- Name: unique_claims_unattached; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX unique_claims_unattached ON jobhost.unique_claims USING btree (job_id) WHERE (NOT attached);


--
-- Name: workflow_edges_dep; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX workflow_edges_dep ON jobhost.workflow_edges USING btree (dep_id);


--
-- Name: workflow_steps_live; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX workflow_steps_live ON jobhost.workflow_steps USING btree (workflow_id) WHERE (ended_state IS NULL);


--
-- Name: workflow_waits_open_due; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX workflow_waits_open_due ON jobhost.workflow_waits USING btree (due_at) WHERE ((ended_by IS NULL) AND (due_at IS NOT NULL));


--
-- Name: workflow_waits_open_key; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX workflow_waits_open_key ON jobhost.workflow_waits USING btree (key, match_one) WHERE ((ended_by IS NULL) AND (armed_at IS NOT NULL) AND (key IS NOT NULL));


--
-- Name: workflows_created; Type: INDEX; Schema: jobhost; Owner: -
--

CREATE INDEX workflows_created ON jobhost.workflows USING btree (created_at);


--
-- Name: archive archive_ended; Type: TRIGGER; Schema: jobhost; Owner: -
--

CREATE TRIGGER archive_ended AFTER INSERT ON jobhost.archive REFERENCING NEW TABLE AS archived FOR EACH STATEMENT EXECUTE FUNCTION jobhost.archive_ended();


--
-- Name: archive archive_flag_late; Type: TRIGGER; Schema: jobhost; Owner: -
--

CREATE CONSTRAINT TRIGGER archive_flag_late AFTER INSERT ON jobhost.archive DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION jobhost.archive_flag_late();


--
-- Name: archive archive_keep_newest_errors; Type: TRIGGER; Schema: jobhost; Owner: -
--

CREATE TRIGGER archive_keep_newest_errors BEFORE INSERT OR UPDATE OF errors ON jobhost.archive FOR EACH ROW WHEN ((jsonb_array_length(new.errors) > 25)) EXECUTE FUNCTION jobhost.keep_newest_errors();


--
-- Name: batches batches_settle; Type: TRIGGER; Schema: jobhost; Owner: -
--

CREATE CONSTRAINT TRIGGER batches_settle AFTER INSERT OR UPDATE OF total, completed, failed, discarded, cancelled, closed_at ON jobhost.batches DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new.closed_at IS NOT NULL) AND (new.finished_at IS NULL))) EXECUTE FUNCTION jobhost.batch_settle();


--
-- Name: blocked_jobs blocked_jobs_keep_newest_errors; Type: TRIGGER; Schema: jobhost; Owner: -
--

CREATE TRIGGER blocked_jobs_keep_newest_errors BEFORE INSERT OR UPDATE OF errors ON jobhost.blocked_jobs FOR EACH ROW WHEN ((jsonb_array_length(new.errors) > 25)) EXECUTE FUNCTION jobhost.keep_newest_errors();


--
-- Name: job_types job_types_forward_only; Type: TRIGGER; Schema: jobhost; Owner: -
--

CREATE TRIGGER job_types_forward_only BEFORE INSERT OR UPDATE ON jobhost.job_types FOR EACH ROW EXECUTE FUNCTION jobhost.job_types_forward_only();


--
-- Name: job_types job_types_schedules; Type: TRIGGER; Schema: jobhost; Owner: -
--

CREATE TRIGGER job_types_schedules AFTER INSERT OR UPDATE OF config ON jobhost.job_types FOR EACH ROW EXECUTE FUNCTION jobhost.schedules_follow_registration();


--
-- Name: jobs jobs_keep_newest_errors; Type: TRIGGER; Schema: jobhost; Owner: -
--

CREATE TRIGGER jobs_keep_newest_errors BEFORE INSERT OR UPDATE OF errors ON jobhost.jobs FOR EACH ROW WHEN ((jsonb_array_length(new.errors) > 25)) EXECUTE FUNCTION jobhost.keep_newest_errors();


--
-- Name: jobs jobs_notify_insert; Type: TRIGGER; Schema: jobhost; Owner: -
--

CREATE TRIGGER jobs_notify_insert AFTER INSERT ON jobhost.jobs REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION jobhost.notify_available();


--
-- Name: jobs jobs_release_unique_run; Type: TRIGGER; Schema: jobhost; Owner: -
--

CREATE TRIGGER jobs_release_unique_run AFTER UPDATE OF lease_token ON jobhost.jobs FOR EACH ROW WHEN (((old.lease_token IS NOT NULL) AND (old.lease_token IS DISTINCT FROM new.lease_token))) EXECUTE FUNCTION jobhost.release_unique_run();


--
-- Name: deployments deployments_digest_fkey; Type: FK CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.deployments
    ADD CONSTRAINT deployments_digest_fkey FOREIGN KEY (digest) REFERENCES jobhost.component_sources(digest);


--
-- Name: http_sessions http_sessions_token_name_fkey; Type: FK CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.http_sessions
    ADD CONSTRAINT http_sessions_token_name_fkey FOREIGN KEY (token_name) REFERENCES jobhost.access_tokens(name) ON DELETE CASCADE;


--
-- Name: workflow_edges workflow_edges_dep_id_fkey; Type: FK CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.workflow_edges
    ADD CONSTRAINT workflow_edges_dep_id_fkey FOREIGN KEY (dep_id) REFERENCES jobhost.workflow_steps(id) ON DELETE CASCADE;


--
-- Name: workflow_edges workflow_edges_step_id_fkey; Type: FK CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.workflow_edges
    ADD CONSTRAINT workflow_edges_step_id_fkey FOREIGN KEY (step_id) REFERENCES jobhost.workflow_steps(id) ON DELETE CASCADE;


--
-- Name: workflow_steps workflow_steps_workflow_id_fkey; Type: FK CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.workflow_steps
    ADD CONSTRAINT workflow_steps_workflow_id_fkey FOREIGN KEY (workflow_id) REFERENCES jobhost.workflows(id) ON DELETE CASCADE;


--
-- Name: workflow_waits workflow_waits_step_id_fkey; Type: FK CONSTRAINT; Schema: jobhost; Owner: -
--

ALTER TABLE ONLY jobhost.workflow_waits
    ADD CONSTRAINT workflow_waits_step_id_fkey FOREIGN KEY (step_id) REFERENCES jobhost.workflow_steps(id) ON DELETE CASCADE;


--
-- PostgreSQL database dump complete
--


