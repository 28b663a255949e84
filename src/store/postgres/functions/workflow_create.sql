-- jobhost.workflow_create: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0023_workflows.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.workflow_create(steps jsonb, label text DEFAULT NULL::text) RETURNS bigint
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
