-- jobhost.archive_ended: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0043_claims_found_by_key_functions.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.archive_ended() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    ids bigint[];
    batch_count bigint;
    waited boolean;
    stepped boolean;
    claimed boolean;
    keyed boolean;
    carried boolean;
    ended text;
    job_ids bigint[];
    job_states text[];
    job_results jsonb[];
    job_ended_at timestamptz[];
BEGIN
    -- The ids as an array: a transition table has no statistics, and a
    -- join with it may scan a whole table; `= ANY` probes the index.
    WITH a AS MATERIALIZED (
        SELECT array_agg(a.id) AS ids, count(DISTINCT a.batch_id) AS batches,
               bool_or(a.unique_key IS NOT NULL) AS keyed, bool_and(a.key_carried) AS carried
        FROM archived a
    )
    SELECT a.ids, a.batches, a.keyed, a.carried,
           EXISTS (SELECT 1 FROM jobhost.job_waits w WHERE w.job_id = ANY(a.ids)),
           -- Probes of the steps' unique job index, one an id (`IS TRUE`
           -- keeps the partial index of live steps out of the plan: it
           -- would read every live step for every write, plain ones too).
           EXISTS (SELECT 1 FROM jobhost.workflow_steps s
                   WHERE s.job_id = ANY(a.ids) AND (s.ended_state IS NULL) IS TRUE),
           a.keyed OR NOT a.carried
               OR EXISTS (SELECT 1 FROM jobhost.unique_keys k WHERE k.job_id = ANY(a.ids))
               OR EXISTS (SELECT 1 FROM jobhost.unique_claims c WHERE c.job_id = ANY(a.ids) AND NOT c.attached)
    FROM a
    INTO ids, batch_count, keyed, carried, waited, stepped, claimed;
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
        -- Handed on as arrays: joined with the transition table, each step
        -- row rescanned all of it (whole archived rows, payloads and logs).
        SELECT array_agg(a.id), array_agg(a.state),
               array_agg(CASE WHEN a.state = 'completed' THEN coalesce(a.output, 'null'::jsonb)
                              ELSE coalesce(a.errors -> -1 -> 'error', 'null'::jsonb) END),
               array_agg(a.finished_at)
        INTO job_ids, job_states, job_results, job_ended_at
        FROM archived a;
        PERFORM jobhost.workflow_jobs_ended(job_ids, job_states, job_results, job_ended_at);
    END IF;
    IF claimed THEN
        IF keyed THEN
            -- Probes of the primary key by the keys (an array, as the ids
            -- above); the claimant must be the archived job itself.
            DELETE FROM jobhost.unique_claims c
            WHERE c.unique_key = ANY(ARRAY(SELECT a.unique_key FROM archived a WHERE a.unique_key IS NOT NULL))
              AND (c.unique_key, c.job, c.job_id) IN (SELECT a.unique_key, a.job, a.id FROM archived a);
        END IF;
        DELETE FROM jobhost.unique_claims c WHERE c.job_id = ANY(ids) AND NOT c.attached;
        IF NOT carried THEN
            DELETE FROM jobhost.unique_claims c
            WHERE c.job_id = ANY(ARRAY(SELECT a.id FROM archived a WHERE NOT a.key_carried)) AND c.attached;
        END IF;
        DELETE FROM jobhost.unique_keys k WHERE k.job_id = ANY(ids);
    END IF;
    RETURN NULL;
END;
$$;
