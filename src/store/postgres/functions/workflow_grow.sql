-- jobhost.workflow_grow: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
--
-- The steps a run added to its own workflow, in the transaction that is
-- about to archive the run (one round trip; the host called five
-- statements before). Nothing is added unless the run's step is live and
-- its job still holds the run's lease (an ending written twice adds
-- nothing the second time). Each new step is stored as `STEP/NAME` and
-- waits for the run's step (policy cancel) and for the new steps its
-- `after` names (`inner_steps`/`inner_deps`, 1-based positions in the
-- arrays, each with its policy); each live step waiting for the run's
-- step waits for every new step too, under its policy for the run's step,
-- so the count-down that follows releases none of them before the new
-- steps end. Locks: the run's step row, then its dependents' rows in id
-- order, as the count-down takes them.

CREATE OR REPLACE FUNCTION jobhost.workflow_grow(grown_job bigint, grown_lease bigint, names text[], jobs text[], payloads jsonb[], queues text[], priorities smallint[], delays_ms bigint[], inner_steps integer[], inner_deps integer[], inner_policies text[]) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    own_id bigint;
    own_workflow bigint;
    own_name text;
    added bigint[];
    dependents bigint[];
    dependent_policies text[];
BEGIN
    SELECT s.id, s.workflow_id, s.name INTO own_id, own_workflow, own_name
    FROM jobhost.workflow_steps s JOIN jobhost.jobs j ON j.id = s.job_id
    WHERE s.job_id = grown_job AND j.lease_token = grown_lease AND (s.ended_state IS NULL) IS TRUE
    FOR UPDATE OF s;
    IF own_id IS NULL THEN
        RETURN;
    END IF;
    WITH stored AS (
        INSERT INTO jobhost.workflow_steps (workflow_id, name, job, payload, queue, priority, delay_ms, pending)
        SELECT own_workflow, own_name || '/' || n.name, n.job, n.payload, n.queue, n.priority, n.delay_ms,
               1 + coalesce(i.deps, 0)
        FROM unnest(names, jobs, payloads, queues, priorities, delays_ms) WITH ORDINALITY
            AS n(name, job, payload, queue, priority, delay_ms, position)
        LEFT JOIN (SELECT i.step, count(*)::integer AS deps FROM unnest(inner_steps) AS i(step) GROUP BY i.step) i
            ON i.step = n.position
        RETURNING id, name
    )
    SELECT array_agg(s.id ORDER BY n.position) INTO added
    FROM stored s JOIN unnest(names) WITH ORDINALITY AS n(name, position) ON s.name = own_name || '/' || n.name;
    SELECT coalesce(array_agg(d.id ORDER BY d.id), '{}'), coalesce(array_agg(d.if_failed ORDER BY d.id), '{}')
    INTO dependents, dependent_policies
    FROM (
        SELECT s.id, e.if_failed
        FROM jobhost.workflow_edges e JOIN jobhost.workflow_steps s ON s.id = e.step_id
        WHERE e.dep_id = own_id AND (s.ended_state IS NULL) IS TRUE
        ORDER BY s.id
        FOR UPDATE OF s
    ) d;
    INSERT INTO jobhost.workflow_edges (step_id, dep_id, if_failed)
    SELECT a.id, own_id, 'cancel' FROM unnest(added) AS a(id)
    UNION ALL
    SELECT added[i.step], added[i.dep], i.policy FROM unnest(inner_steps, inner_deps, inner_policies) AS i(step, dep, policy)
    UNION ALL
    SELECT d.id, a.id, d.policy FROM unnest(added) AS a(id) CROSS JOIN unnest(dependents, dependent_policies) AS d(id, policy);
    IF cardinality(dependents) > 0 THEN
        UPDATE jobhost.workflow_steps s SET pending = s.pending + cardinality(added) WHERE s.id = ANY(dependents);
    END IF;
END;
$$;
