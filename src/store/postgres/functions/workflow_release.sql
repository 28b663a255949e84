-- jobhost.workflow_release: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0043_claims_found_by_key_functions.sql hold its earlier copies as history.
--
-- No sequential scan, as in workflow_steps_ended (which calls it for each
-- wave): a workflow's creation calls it directly for its first steps. One
-- statement decides the steps, marks them released and inserts the jobs
-- of the plain types (the common case); gated types and steps that will
-- not run follow, one at a time. A step with a wait that has not ended is
-- not released: its wait is armed instead (workflow_waits_arm), and its
-- end releases it (workflow_waits_end), with the event's payload under
-- `_event`, or by the wait's `on_timeout` when it timed out.

CREATE OR REPLACE FUNCTION jobhost.workflow_release(ready bigint[]) RETURNS bigint[]
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
