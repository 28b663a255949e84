-- A host's bulk enqueue of unique jobs in one round trip: the claims
-- (`claim_new_keys`, attached) and the jobs that won them (`insert_jobs`)
-- in one call, instead of a call for each with the ids coming back to the
-- host in between. Same statements, in the same order, in the caller's
-- transaction: claims in key order first, then the gate's keys, then the
-- rows; so the lock order and who wins a key are as before.
--
-- A job is written when it holds its claim (its claimant is itself) or has
-- no claim to hold (no key, or a `while_executing` key, claimed only by a
-- run); a duplicate is not, and the host answers it with the holder the
-- call returns. A host sends a bulk enqueue here while its calls find no
-- duplicate (a call of duplicates would send every payload for nothing),
-- and only when every unique job of it skips its duplicates and none is
-- rate-limited: a `replace` rewrites the waiting holder, and a `raise`
-- refuses the call, before the call's jobs are written; a rate-limited
-- job's start is planned for the jobs written alone. Otherwise it calls
-- the two functions apart, as before (src/store/postgres/unique.rs,
-- `ClaimPath`).
--
-- Nothing existing changes: hosts of the previous release call the two
-- functions as they did.
CREATE FUNCTION jobhost.claim_and_insert_jobs(
    jobs text[], queues text[], priorities smallint[], payloads jsonb[], attempts integer[], ats timestamptz[],
    delays bigint[], concurrency_keys text[], parents bigint[], batches bigint[], planned timestamptz[],
    unique_keys text[], while_executing boolean[],
    OUT ids bigint[], OUT claimants bigint[]
) RETURNS record
LANGUAGE plpgsql AS $$
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
