-- jobhost.workflow_jobs_ended: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
--
-- The archive's trigger hands on the jobs it archived (ids, end states,
-- results: an output, or the last error; end instants); those that are
-- workflow steps end as steps here, and their dependents are counted down
-- and released (workflow_steps_ended). Planned for each call's arrays,
-- never with a sequential scan: the steps are found by their jobs' index.

CREATE OR REPLACE FUNCTION jobhost.workflow_jobs_ended(job_ids bigint[], states text[], results jsonb[], instants timestamptz[]) RETURNS void
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
