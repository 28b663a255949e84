-- One statement trigger on the archive instead of three.
--
-- An archive insert fired jobhost.archived (0009_batches: batch counts,
-- waiters told), jobhost.workflow_archived (0023_workflows: the job's step
-- ended) and jobhost.release_unique_archived (0007_uniqueness: claims given
-- back): three PL/pgSQL frames and five statements for every result write,
-- each set up and run even when no archived job belongs to a batch, is
-- waited for, is a workflow step or holds a claim, which is most writes.
-- jobhost.archive_ended does the same work in one frame: one statement
-- asks which of the four apply to the archived jobs (index probes by job
-- id), and only those run. Measured in BENCHMARKS.md, "One archive
-- trigger".
--
-- What it does, and in which order, is what the three triggers did, which
-- fired in name order: batches counted (their rows locked in id order),
-- waiters told, workflow steps ended (their dependents released, which may
-- archive more jobs, firing this trigger again for those), and the jobs'
-- uniqueness claims and keys deleted last. The probes see what the
-- deletes and the update would have seen: the rows for an archived job
-- are written by transactions that committed before it was archived (its
-- enqueue, its fetch, a waiter that then reads the archive), and the
-- transaction archiving it holds its row.

CREATE FUNCTION jobhost.archive_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    batch_count bigint;
    waited boolean;
    stepped boolean;
    claimed boolean;
    ended text;
    ended_steps bigint[];
BEGIN
    -- The ids as an array: a transition table has no statistics, and a
    -- join with it may scan a whole table; `= ANY` probes the index.
    WITH a AS MATERIALIZED (SELECT array_agg(a.id) AS ids, count(DISTINCT a.batch_id) AS batches FROM archived a)
    SELECT a.ids, a.batches,
           EXISTS (SELECT 1 FROM jobhost.job_waits w WHERE w.job_id = ANY(a.ids)),
           EXISTS (SELECT 1 FROM jobhost.workflow_steps s WHERE s.job_id = ANY(a.ids) AND s.ended_state IS NULL),
           EXISTS (SELECT 1 FROM jobhost.unique_keys k WHERE k.job_id = ANY(a.ids))
               OR EXISTS (SELECT 1 FROM jobhost.unique_claims c WHERE c.job_id = ANY(a.ids))
    FROM a
    INTO ids, batch_count, waited, stepped, claimed;
    IF batch_count > 0 THEN
        -- One row needs no order; several are locked in id order first.
        IF batch_count > 1 THEN
            PERFORM 1 FROM jobhost.batches b
            WHERE b.id IN (SELECT a.batch_id FROM archived a WHERE a.batch_id IS NOT NULL)
            ORDER BY b.id
            FOR UPDATE;
        END IF;
        UPDATE jobhost.batches b
        SET completed = b.completed + d.completed,
            failed = b.failed + d.failed,
            discarded = b.discarded + d.discarded,
            cancelled = b.cancelled + d.cancelled
        FROM (
            SELECT a.batch_id,
                   count(*) FILTER (WHERE a.state = 'completed') AS completed,
                   count(*) FILTER (WHERE a.state = 'failed') AS failed,
                   count(*) FILTER (WHERE a.state = 'discarded') AS discarded,
                   count(*) FILTER (WHERE a.state = 'cancelled') AS cancelled
            FROM archived a
            WHERE a.batch_id IS NOT NULL
            GROUP BY a.batch_id
        ) d
        WHERE b.id = d.batch_id;
    END IF;
    IF waited THEN
        SELECT string_agg(DISTINCT w.job_id::text, ',') INTO ended
        FROM jobhost.job_waits w WHERE w.job_id = ANY(ids);
        DELETE FROM jobhost.job_waits w WHERE w.job_id = ANY(ids);
        -- A payload past the limit says only "look": waiters read the archive.
        PERFORM pg_notify('jobhost_finished', CASE WHEN octet_length(ended) < 7900 THEN ended ELSE '' END);
    END IF;
    IF stepped THEN
        WITH done AS (
            UPDATE jobhost.workflow_steps s
            SET ended_state = a.state,
                result = CASE WHEN a.state = 'completed' THEN coalesce(a.output, 'null'::jsonb)
                              ELSE coalesce(a.errors -> -1 -> 'error', 'null'::jsonb) END,
                ended_at = a.finished_at
            FROM archived a
            WHERE s.job_id = ANY(ids) AND s.job_id = a.id AND s.ended_state IS NULL
            RETURNING s.id
        )
        SELECT coalesce(array_agg(id), '{}') INTO ended_steps FROM done;
        IF cardinality(ended_steps) > 0 THEN
            PERFORM jobhost.workflow_steps_ended(ended_steps);
        END IF;
    END IF;
    IF claimed THEN
        DELETE FROM jobhost.unique_claims c WHERE c.job_id = ANY(ids);
        DELETE FROM jobhost.unique_keys k WHERE k.job_id = ANY(ids);
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER archive_counts_batches ON jobhost.archive;
DROP TRIGGER archive_ends_workflow_steps ON jobhost.archive;
DROP TRIGGER archive_releases_unique ON jobhost.archive;
CREATE TRIGGER archive_ended AFTER INSERT ON jobhost.archive
    REFERENCING NEW TABLE AS archived
    FOR EACH STATEMENT EXECUTE FUNCTION jobhost.archive_ended();
DROP FUNCTION jobhost.archived();
DROP FUNCTION jobhost.workflow_archived();
DROP FUNCTION jobhost.release_unique_archived();
