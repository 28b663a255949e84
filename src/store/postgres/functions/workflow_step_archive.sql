-- jobhost.workflow_step_archive: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0043_claims_found_by_key_functions.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.workflow_step_archive(step jobhost.workflow_steps, state text, reason text) RETURNS void
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
