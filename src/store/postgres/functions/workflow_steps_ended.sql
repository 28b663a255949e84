-- jobhost.workflow_steps_ended: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0023_workflows.sql hold its earlier copies as history.
--
-- Counts ended steps down in their dependents and releases each dependent
-- whose count reaches zero (workflow_release), wave by wave: two
-- statements a wave, the count-down and the release. Each statement here
-- is planned for the call's own ids, and here and in the release never
-- with a sequential scan: the steps table is rewritten row by row as
-- steps run, so its statistics lag and its pages hold dead rows; a plan
-- that thought it small read all of it for every result write. (A plan
-- kept for a session fits one size of call: one made for a few ids reads
-- a 10,000-step fan-out's ids once per step.)

CREATE OR REPLACE FUNCTION jobhost.workflow_steps_ended(ended bigint[]) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    ready bigint[];
BEGIN
    WHILE cardinality(ended) > 0 LOOP
        -- One statement: the dependents are locked in id order before any
        -- is changed (two writes counting down one join take its row in one
        -- order), then counted down.
        WITH counted AS (
            SELECT e.step_id, count(*)::integer AS n
            FROM jobhost.workflow_edges e
            WHERE e.dep_id = ANY(ended)
            GROUP BY e.step_id
        ),
        locked AS (
            SELECT s.id, c.n FROM jobhost.workflow_steps s JOIN counted c ON c.step_id = s.id
            ORDER BY s.id
            FOR UPDATE OF s
        ),
        counted_down AS (
            UPDATE jobhost.workflow_steps s SET pending = s.pending - l.n
            FROM locked l
            WHERE s.id = l.id
            RETURNING s.id, s.pending, s.job_id
        )
        SELECT coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.pending = 0 AND d.job_id IS NULL), '{}')
        INTO ready
        FROM counted_down d;
        ended := jobhost.workflow_release(ready);
    END LOOP;
END;
$$;
