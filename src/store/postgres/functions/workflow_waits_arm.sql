-- jobhost.workflow_waits_arm: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
--
-- Arms the waits of steps whose dependencies have all ended (the release
-- passes such steps here instead of releasing them) and returns the steps
-- whose waits ended at once, for the caller to release: a sleep already
-- due; an event wait that finds a matching event in its look back; a wait
-- not waited for, because its workflow was cancelled or a dependency did
-- not complete under a policy that ends the step.
--
-- An event wait is armed only while it holds its key's lock (an advisory
-- lock on the key's hash, exclusive), which every sender of that key
-- holds shared until its transaction ends (send_event). So an event is
-- either committed before the wait is armed, and then seen by its look
-- back, or sent after, and then sees the wait: never neither (DESIGN
-- guarantee 17). On the result write's path (`wait_for_senders` false) a
-- key whose sender is still in its transaction is not waited for: its
-- wait is left unarmed and due now, with the database's snapshot, and
-- maintenance arms it (workflow_waits_arm_late), waiting briefly for the
-- key, one wait at a time. An event whose transaction that snapshot saw in
-- progress, or that began after it, came after the dependencies ended:
-- the earliest such match ends the wait when it is armed, whatever its
-- look back. So does one sent later by the deferring transaction itself
-- (a run's own `events.send`, written with the completion that ended the
-- dependency), which its own snapshot cannot tell apart from a committed
-- one: it is recognized by its transaction id (`deferred_by`).

CREATE OR REPLACE FUNCTION jobhost.workflow_waits_arm(steps bigint[], wait_for_senders boolean DEFAULT false)
    RETURNS bigint[]
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
