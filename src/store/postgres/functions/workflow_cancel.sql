-- jobhost.workflow_cancel: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0023_workflows.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.workflow_cancel(workflow bigint) RETURNS bigint[]
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
