-- jobhost.claim_and_insert_jobs: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0044_claim_and_insert.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.claim_and_insert_jobs(jobs text[], queues text[], priorities smallint[], payloads jsonb[], attempts integer[], ats timestamp with time zone[], delays bigint[], concurrency_keys text[], parents bigint[], batches bigint[], planned timestamp with time zone[], unique_keys text[], while_executing boolean[], OUT ids bigint[], OUT claimants bigint[]) RETURNS record
    LANGUAGE plpgsql
    AS $$
BEGIN
    SELECT c.ids, c.claimants INTO ids, claimants
    FROM jobhost.claim_new_keys(jobs, unique_keys, while_executing, attach => true) c;

    -- Every job has a key and won its claim (claim_new_keys then answers
    -- with the ids themselves), none `while_executing`: all are written,
    -- each carrying the key it holds.
    IF claimants = ids AND NOT true = ANY(while_executing) THEN
        PERFORM jobhost.insert_jobs(jobs, queues, priorities, payloads, attempts, ats, delays, concurrency_keys,
                                    parents, ids, batches, planned, unique_keys);
        RETURN;
    END IF;

    -- Otherwise only the jobs holding their claim or having none, in input
    -- order; a `while_executing` job carries no key on its row.
    PERFORM jobhost.insert_jobs(f.jobs, f.queues, f.priorities, f.payloads, f.attempts, f.ats, f.delays,
                                f.concurrency_keys, f.parents, f.ids, f.batches, f.planned, f.unique_keys)
    FROM (
        SELECT array_agg(u.job) AS jobs, array_agg(u.queue) AS queues, array_agg(u.priority) AS priorities,
               array_agg(u.payload) AS payloads, array_agg(u.attempt) AS attempts, array_agg(u.at) AS ats,
               array_agg(u.delay) AS delays, array_agg(u.concurrency_key) AS concurrency_keys,
               array_agg(u.parent) AS parents, array_agg(u.id) AS ids, array_agg(u.batch) AS batches,
               array_agg(u.plan) AS planned,
               array_agg(CASE WHEN u.we THEN NULL ELSE u.unique_key END) AS unique_keys
        FROM (
            SELECT *
            FROM unnest(jobs, queues, priorities, payloads, attempts, ats, delays, concurrency_keys, parents,
                        batches, planned, unique_keys, while_executing, ids, claimants)
                WITH ORDINALITY AS u(job, queue, priority, payload, attempt, at, delay, concurrency_key, parent,
                                     batch, plan, unique_key, we, id, claimant, ord)
            WHERE u.claimant IS NULL OR u.claimant = u.id
            ORDER BY u.ord
        ) u
    ) f
    WHERE f.jobs IS NOT NULL;
END;
$$;
