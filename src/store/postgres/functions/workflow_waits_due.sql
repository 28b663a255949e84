-- jobhost.workflow_waits_due: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
--
-- Maintenance: ends up to `batch` armed waits due by `at` (the database's
-- clock unless a test gives one), a sleep by its time and an event wait by
-- its timeout, releasing their steps; returns how many it ended. Steps
-- another transaction holds are passed over (SKIP LOCKED) for the next
-- pass; an event that holds one first ends its wait, and this then ends
-- nothing there. Found through the open waits' index by due instant, so a
-- pass costs what is due, not what waits.

CREATE OR REPLACE FUNCTION jobhost.workflow_waits_due(at timestamptz, batch integer) RETURNS integer
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

-- Maintenance: arms up to `batch` waits the release left unarmed (a sender
-- of their key was in its transaction), waiting for such senders to end
-- for at most 200 ms a wait (a sender that keeps its key longer holds
-- back only its own key's waits, which come last in the next pass; new
-- senders of the key queue behind the wait for no longer). Returns how
-- many it armed.
CREATE OR REPLACE FUNCTION jobhost.workflow_waits_arm_late(at timestamptz, batch integer) RETURNS integer
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
