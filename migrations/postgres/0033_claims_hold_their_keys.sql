-- An until_executed job's key is its claim: jobhost.unique_keys now holds
-- the keys of while_executing jobs only.
--
-- unique_keys recorded every live unique job's key by job id, but on
-- PostgreSQL only the while_executing rows were ever read (the fetch and
-- the promotions look for a running holder of the key; nothing looks up an
-- until_executed job's key by its id): an until_executed job holds its
-- claim (type, key, job id) from its enqueue until it is archived, and the
-- archive's trigger gives the claim back by job id (index
-- unique_claims_job_id), as before. Each until_executed job now writes one
-- row (its claim) where it wrote two, and archiving one deletes one.
--
-- The writers below are re-created whole, as CREATE OR REPLACE requires,
-- each changed only where it records a key: enqueue_as (last in
-- 0023_workflows.sql), enqueue_many (0031_enqueue_many_times.sql),
-- reclaim_unique (0007_uniqueness.sql) and claim_new_keys
-- (0032_plain_claims.sql). A while_executing job's key is recorded as
-- before; it is claimed only when a run starts. The rows of live
-- until_executed jobs are deleted: their claims stay. A row an enqueue
-- still writes while this migration runs (the functions change when it
-- commits) is harmless: nothing reads it, and the archive deletes it.
--
-- SQLite does the same (its 0021_claims_hold_their_keys.sql).

CREATE OR REPLACE FUNCTION jobhost.enqueue_as(
    new_id bigint,
    job text,
    payload jsonb,
    queue text DEFAULT NULL,
    priority smallint DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    batch_id bigint DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
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
$$;

CREATE OR REPLACE FUNCTION jobhost.enqueue_many(jobs jsonb)
RETURNS TABLE (ord bigint, id bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
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
            WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(e.value) k
                         WHERE k NOT IN ('job', 'payload', 'queue', 'priority', 'run_at', 'batch_id', 'traceparent'))
                THEN 'has an unknown field (known: job, payload, queue, priority, run_at, batch_id, traceparent)'
            WHEN jsonb_typeof(e.value -> 'job') IS DISTINCT FROM 'string' THEN 'has no "job" name'
            WHEN t.name IS NULL
                THEN format('unknown job type "%s": no host has loaded a component for it', e.value ->> 'job')
            WHEN jsonb_typeof(e.value -> 'payload') IS DISTINCT FROM 'object'
                THEN format('payload of job "%s" must be a JSON object', e.value ->> 'job')
            WHEN octet_length((e.value -> 'payload')::text) > max_payload_bytes
                THEN format('payload of job "%s" is %s bytes of JSON, more than the largest accepted, %s bytes',
                            e.value ->> 'job', octet_length((e.value -> 'payload')::text), max_payload_bytes)
            WHEN coalesce(e.value ->> 'queue', t.config ->> 'queue') !~ '^[a-z0-9_.-]{1,128}$'
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
    SELECT array_agg(p.job ORDER BY p.ord), array_agg(p.payload ORDER BY p.ord), array_agg(p.queue ORDER BY p.ord),
           array_agg(p.priority ORDER BY p.ord), array_agg(p.due ORDER BY p.ord),
           array_agg(p.max_attempts ORDER BY p.ord), array_agg(p.concurrency_key ORDER BY p.ord),
           array_agg(p.unique_key ORDER BY p.ord), array_agg(p.while_executing ORDER BY p.ord),
           array_agg(p.on_duplicate ORDER BY p.ord), array_agg(p.batch_id ORDER BY p.ord),
           array_agg(p.traceparent ORDER BY p.ord)
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
    ) p;
    ids := ARRAY(SELECT nextval('jobhost.job_ids') FROM generate_series(1, n) ORDER BY 1);

    -- Claims, for the until-executed keys: claimants[k] is the job holding
    -- element k's key (its own id when it won), 0 without a claim. (Arrays
    -- are read by unnest, not by subscript: a subscript into an array of
    -- text walks it from the start.)
    SELECT array_agg(p.k ORDER BY p.k), array_agg(p.job ORDER BY p.k), array_agg(p.unique_key ORDER BY p.k),
           array_agg(p.id ORDER BY p.k)
    INTO claim_at, claim_jobs, claim_keys, claim_ids
    FROM unnest(names, unique_keys, while_executing, ids) WITH ORDINALITY AS p(job, unique_key, while_executing, id, k)
    WHERE p.unique_key IS NOT NULL AND NOT p.while_executing;
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

    -- The new jobs' while_executing keys and trace contexts, and the jobs
    -- themselves through the gate (jobhost.insert_jobs: the limited jobs
    -- due now are admitted, blocked or discarded as they are written). The
    -- keys go first: a job the gate discards is archived, and the archive
    -- takes its key with it.
    INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
    SELECT p.id, p.job, p.unique_key, true
    FROM unnest(ids, names, unique_keys, while_executing, claimants)
        AS p(id, job, unique_key, while_executing, claimant)
    WHERE p.unique_key IS NOT NULL AND p.while_executing AND p.claimant IN (0, p.id);
    PERFORM jobhost.insert_jobs(
        array_agg(p.job ORDER BY p.k), array_agg(p.queue ORDER BY p.k), array_agg(p.priority ORDER BY p.k),
        array_agg(p.payload ORDER BY p.k), array_agg(p.max_attempts ORDER BY p.k), array_agg(p.due ORDER BY p.k),
        array_agg(0::bigint ORDER BY p.k), array_agg(p.concurrency_key ORDER BY p.k),
        array_agg(NULL::bigint ORDER BY p.k), array_agg(p.id ORDER BY p.k), array_agg(p.batch_id ORDER BY p.k),
        array_agg(NULL::timestamptz ORDER BY p.k))
    FROM unnest(ids, names, queues, priorities, payloads, dues, attempts, concurrency_keys, batch_ids, claimants)
        WITH ORDINALITY AS p(id, job, queue, priority, payload, due, max_attempts, concurrency_key, batch_id,
                             claimant, k)
    WHERE p.claimant IN (0, p.id);
    INSERT INTO jobhost.job_traces (job_id, traceparent)
    SELECT p.id, p.traceparent
    FROM unnest(ids, traces, claimants) AS p(id, traceparent, claimant)
    WHERE p.traceparent IS NOT NULL AND p.claimant IN (0, p.id);

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
$$;

CREATE OR REPLACE FUNCTION jobhost.reclaim_unique(revived_id bigint) RETURNS void
LANGUAGE plpgsql AS $$
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

CREATE OR REPLACE FUNCTION jobhost.claim_new_keys(
    job_types text[], unique_keys text[], while_executing boolean[],
    OUT ids bigint[], OUT claimants bigint[]
)
LANGUAGE plpgsql AS $$
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
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
            SELECT u.job, u.unique_key, u.id
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
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
            SELECT u.job, u.unique_key, u.id
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
            LEFT JOIN jobhost.unique_claims c ON c.job = l.job AND c.unique_key = l.unique_key;
            found_ords := found_ords || coalesce(read_ords, '{}');
            found_claimants := found_claimants || coalesce(read_claimants, '{}');
            EXIT WHEN lost_ords IS NULL;
            -- Released between the claim and the read: claim them again.
            tries := tries + 1;
            IF tries >= 100 THEN
                RAISE EXCEPTION 'uniqueness keys kept being released while they were claimed' USING ERRCODE = '40001';
            END IF;
            WITH claimed AS (
                INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
                SELECT l.job, l.unique_key, l.id
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
    SELECT coalesce(array_agg(CASE WHEN u.unique_key IS NULL THEN NULL ELSE coalesce(f.claimant, u.id) END
                              ORDER BY u.ord), '{}')
    INTO claimants
    FROM unnest(unique_keys, ids) WITH ORDINALITY AS u(unique_key, id, ord)
    LEFT JOIN unnest(found_ords, found_claimants) AS f(ord, claimant) ON f.ord = u.ord;

    INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
    SELECT u.id, u.job, u.unique_key, true
    FROM unnest(ids, job_types, unique_keys, while_executing) AS u(id, job, unique_key, we)
    WHERE u.unique_key IS NOT NULL AND u.we;
END;
$$;

DELETE FROM jobhost.unique_keys WHERE NOT while_executing;
