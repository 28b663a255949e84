-- jobhost.workflow_waits_end: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
--
-- Ends the armed waits of these steps that have not ended, by `how`
-- (event, time or timeout; `event` names the event), and releases their
-- steps in the same transaction; returns how many it ended. Each wait ends
-- once (DESIGN guarantee 17): the steps' rows are locked in id order
-- first, as every path that ends or releases a step locks them, and a wait
-- already ended when its lock is granted is passed over, so of an event
-- and a timeout (or two events) at once, the second ends nothing.

CREATE OR REPLACE FUNCTION jobhost.workflow_waits_end(steps bigint[], how text, event bigint DEFAULT NULL)
    RETURNS integer
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
