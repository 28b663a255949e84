-- jobhost.enqueue_many: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0040_enqueue_many_fewer_passes.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.enqueue_many(jobs jsonb) RETURNS TABLE(ord bigint, id bigint, duplicate boolean)
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
