-- The gate set-based (first in 0004_concurrency): the same rules and the
-- same lock order, in a fixed number of statements for any number of keys
-- instead of four or five per key. A bulk enqueue of limited jobs over many
-- keys paid a PL/pgSQL loop turn per key; now it pays per batch.

-- Archives jobs as discarded, each with its own reason (discard takes one
-- reason for all).
CREATE FUNCTION jobhost.discard_each(job_ids bigint[], reasons text[]) RETURNS void
LANGUAGE sql AS $$
    WITH why AS (SELECT * FROM unnest(job_ids, reasons) AS w(id, reason)),
    moved AS (DELETE FROM jobhost.jobs j USING why w WHERE j.id = w.id RETURNING j.*, w.reason)
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                                 enqueued_at, started_at, finished_at, concurrency_key, batch_id, parent_id)
    SELECT id, job, queue, priority, payload, 'discarded', attempt, max_attempts,
           errors || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', now(), 'error', reason)),
           progress, enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id
    FROM moved
$$;

-- Creates or locks the semaphore row of each key, in (job, key) order
-- (the rows of an INSERT ... SELECT ... ORDER BY are written, and so
-- locked, in that order), each until the caller commits. A row that exists
-- is locked without being rewritten: ON CONFLICT DO UPDATE locks the row
-- even when its WHERE is false, and writes nothing then.
CREATE FUNCTION jobhost.lock_keys(key_jobs text[], key_names text[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO jobhost.semaphores AS s (job, key, holders)
    SELECT k.job, k.key, 0 FROM unnest(key_jobs, key_names) AS k(job, key) ORDER BY k.job, k.key
    ON CONFLICT (job, key) DO UPDATE SET updated_at = now() WHERE false
$$;

-- The holders of each key, in input order: read after lock_keys, in a
-- statement of its own, so it sees what the transactions it waited for
-- committed.
CREATE FUNCTION jobhost.key_holders(key_jobs text[], key_names text[]) RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT array_agg(coalesce(s.holders, 0) ORDER BY k.ord)
    FROM unnest(key_jobs, key_names) WITH ORDINALITY AS k(job, key, ord)
    LEFT JOIN jobhost.semaphores s ON s.job = k.job AND s.key = k.key
$$;

-- Steps 2 and 3 of the gate below, shared with insert_jobs: for keys in
-- (job, key) order and how many jobs each brings, locks the keys, reads
-- their holders, and takes each key's free slots (limit minus holders, no
-- more than its jobs) by one guarded update. With an enqueuer waiting, a
-- key whose type says 'raise' and that cannot take all its jobs refuses
-- the call first (SQLSTATE JHL01, the first such key in key order).
-- Returns, per key in the same order, its limit (as jobhost.slot_limit:
-- unlimited when its type no longer declares one), the slots it took and
-- its type's on_conflict.
CREATE FUNCTION jobhost.take_slots(
    key_jobs text[], key_names text[], key_counts integer[], enqueuer_waiting boolean,
    OUT slot_limits integer[], OUT taken integer[], OUT on_conflicts text[]
)
LANGUAGE plpgsql AS $$
DECLARE
    held integer[];
    refusal text;
    guarded integer;
BEGIN
    PERFORM jobhost.lock_keys(key_jobs, key_names);
    held := jobhost.key_holders(key_jobs, key_names);
    SELECT array_agg(d.slot_limit ORDER BY d.ord),
           array_agg(least(greatest(d.slot_limit - d.held, 0), d.n) ORDER BY d.ord),
           array_agg(d.on_conflict ORDER BY d.ord),
           (array_agg(format('job "%s" refused: concurrency limit reached: all %s slots of key "%s" are taken',
                             d.job, d.slot_limit, d.key) ORDER BY d.ord)
               FILTER (WHERE d.on_conflict = 'raise' AND d.held + d.n > d.slot_limit))[1]
    INTO slot_limits, taken, on_conflicts, refusal
    FROM (
        SELECT k.ord, k.job, k.key, k.held, k.n,
               coalesce((t.config -> 'concurrency' ->> 'limit')::integer, 2147483647) AS slot_limit,
               coalesce(t.config -> 'concurrency' ->> 'on_conflict', 'block') AS on_conflict
        FROM unnest(key_jobs, key_names, held, key_counts) WITH ORDINALITY AS k(job, key, held, n, ord)
        LEFT JOIN jobhost.job_types t ON t.name = k.job
    ) d;
    IF enqueuer_waiting AND refusal IS NOT NULL THEN
        RAISE EXCEPTION '%', refusal USING ERRCODE = 'JHL01';
    END IF;
    UPDATE jobhost.semaphores s SET holders = s.holders + t.taken
    FROM unnest(key_jobs, key_names, slot_limits, taken) AS t(job, key, slot_limit, taken)
    WHERE t.taken > 0 AND s.job = t.job AND s.key = t.key AND s.holders + t.taken <= t.slot_limit;
    GET DIAGNOSTICS guarded = ROW_COUNT;
    IF guarded <> (SELECT count(*) FROM unnest(taken) AS t(taken) WHERE t.taken > 0) THEN
        RAISE EXCEPTION 'semaphores changed under their locks: % keys took their slots', guarded;
    END IF;
    -- Only with a corrupt limit below 1: the rows this call created go.
    DELETE FROM jobhost.semaphores s
    USING unnest(key_jobs, key_names, slot_limits, held) AS t(job, key, slot_limit, held)
    WHERE t.slot_limit < 1 AND t.held = 0 AND s.job = t.job AND s.key = t.key AND s.holders = 0;
END;
$$;

-- THE GATE, as in 0004 (read its comment for the rules), in five steps
-- (2 and 3 are jobhost.take_slots above, which insert_jobs shares):
--  1. jobs without a key become available;
--  2. one upsert creates or locks the semaphore row of every key, in
--     (job, key) order (the rows of an INSERT ... SELECT ... ORDER BY are
--     written, and so locked, in that order), so concurrent gates never
--     deadlock, and reads each key's holders under its lock;
--  3. each key's free slots (limit minus holders, no more than its jobs)
--     are taken by one guarded update over all keys (holders + taken <=
--     limit; every row is locked by step 2, so the guard failing means the
--     schema is broken, and the gate says so);
--  4. each key's first jobs in priority then arrival order, as many as it
--     took, become available;
--  5. the rest meet their type's on_conflict: 'raise' with an enqueuer
--     waiting aborts with SQLSTATE JHL01 naming the first such key in key
--     order, 'discard' (and 'raise' with nobody waiting) archives them as
--     discarded with their key's reason, 'block' parks them.
-- Returns how many jobs became available.
CREATE OR REPLACE FUNCTION jobhost.admit(job_ids bigint[], enqueuer_waiting boolean) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    admitted integer;
    key_jobs text[];
    key_names text[];
    key_counts integer[];
    key_limits integer[];
    key_taken integer[];
    key_conflicts text[];
    available bigint[];
    parked bigint[];
    discarded bigint[];
    reasons text[];
BEGIN
    WITH unkeyed AS (
        UPDATE jobhost.jobs SET state = 'available'
        WHERE id = ANY(job_ids) AND concurrency_key IS NULL AND state <> 'available'
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM jobhost.jobs WHERE id = ANY(job_ids) AND concurrency_key IS NULL)
    INTO admitted;

    -- The keys, in (job, key) order, with how many of the jobs each has
    -- (aggregated from a sorted subquery: one sort instead of one per array).
    SELECT array_agg(w.job), array_agg(w.key), array_agg(w.n)
    INTO key_jobs, key_names, key_counts
    FROM (
        SELECT j.job, j.concurrency_key AS key, count(*)::integer AS n
        FROM jobhost.jobs j
        WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL
        GROUP BY 1, 2
        ORDER BY 1, 2
    ) w;
    IF key_jobs IS NULL THEN
        RETURN admitted;
    END IF;
    SELECT g.slot_limits, g.taken, g.on_conflicts INTO key_limits, key_taken, key_conflicts
    FROM jobhost.take_slots(key_jobs, key_names, key_counts, enqueuer_waiting) g;

    WITH ranked AS (
        SELECT j.id, j.job, j.concurrency_key AS key,
               row_number() OVER (PARTITION BY j.job, j.concurrency_key ORDER BY j.priority, j.run_at, j.id) AS place
        FROM jobhost.jobs j
        WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL
    ), judged AS (
        SELECT r.id, r.job, r.key, r.place, t.ord, t.slot_limit, r.place <= t.taken AS admitted, t.on_conflict
        FROM ranked r
        JOIN unnest(key_jobs, key_names, key_limits, key_taken, key_conflicts)
            WITH ORDINALITY AS t(job, key, slot_limit, taken, on_conflict, ord)
            ON t.job = r.job AND t.key = r.key
    )
    SELECT array_agg(j.id) FILTER (WHERE j.admitted),
           array_agg(j.id ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict NOT IN ('discard', 'raise')),
           array_agg(j.id ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict IN ('discard', 'raise')),
           array_agg(format('concurrency limit reached: all %s slots of key "%s" are taken', j.slot_limit, j.key)
                     ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict IN ('discard', 'raise'))
    INTO available, parked, discarded, reasons
    FROM judged j;

    IF available IS NOT NULL THEN
        UPDATE jobhost.jobs SET state = 'available' WHERE id = ANY(available) AND state <> 'available';
        admitted := admitted + cardinality(available);
    END IF;
    IF discarded IS NOT NULL THEN
        PERFORM jobhost.discard_each(discarded, reasons);
    END IF;
    IF parked IS NOT NULL THEN
        PERFORM jobhost.park(parked);
    END IF;
    RETURN admitted;
END;
$$;

-- Writes new jobs with the gate decided before they are written (the
-- enqueue's insert, until now a plain insert into jobs followed by
-- jobhost.admit): a limited job due now that gets a slot goes into jobs
-- as available, one that does not goes straight to blocked_jobs (or to the
-- archive as discarded, with its key's reason), so a blocked job is
-- written once instead of being inserted, deleted and inserted again. The
-- rules are the gate's (jobhost.admit above): keys locked by one upsert
-- in (job, key) order, each key's free slots to its jobs by priority then
-- arrival, a 'raise' key refusing the whole call (SQLSTATE JHL01) before
-- anything is written. New rows are invisible to every other transaction,
-- so taking the keys before writing them keeps the lock order (rows, then
-- keys in order) for everything another transaction can wait on.
-- The arrays are the enqueue's prepared jobs (src/store/postgres/job.rs):
-- a job is due at its time (`ats`) or after its delay, and not before the
-- time its rate limit's plan gave it; `chosen_ids` are the ids a call with
-- unique jobs took before claiming their keys (null: the sequence's next).
-- Returns the jobs' ids in input order.
CREATE FUNCTION jobhost.insert_jobs(
    jobs text[], queues text[], priorities smallint[], payloads jsonb[], attempts integer[], ats timestamptz[],
    delays bigint[], concurrency_keys text[], parents bigint[], chosen_ids bigint[], batches bigint[],
    planned timestamptz[]
) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    dues timestamptz[];
    key_jobs text[];
    key_names text[];
    key_counts integer[];
    key_limits integer[];
    key_taken integer[];
    key_conflicts text[];
    places text[];
    reasons text[];
BEGIN
    IF coalesce(cardinality(jobs), 0) = 0 THEN
        RETURN ARRAY[]::bigint[];
    END IF;
    -- Ids (taken in input order) and due times.
    SELECT array_agg(u.id), array_agg(u.due) INTO ids, dues
    FROM (
        SELECT coalesce(u.id, nextval('jobhost.job_ids')) AS id,
               greatest(coalesce(u.at, now() + u.delay_ms * interval '1 millisecond'), u.planned) AS due
        FROM (
            SELECT * FROM unnest(chosen_ids, ats, delays, planned) WITH ORDINALITY AS u(id, at, delay_ms, planned, ord)
            ORDER BY u.ord
        ) u
    ) u;

    -- The keys of the limited jobs due now, in (job, key) order.
    SELECT array_agg(w.job), array_agg(w.key), array_agg(w.n)
    INTO key_jobs, key_names, key_counts
    FROM (
        SELECT u.job, u.key, count(*)::integer AS n
        FROM unnest(jobs, concurrency_keys, dues) AS u(job, key, due)
        WHERE u.key IS NOT NULL AND u.due <= now()
        GROUP BY 1, 2
        ORDER BY 1, 2
    ) w;

    IF key_jobs IS NOT NULL THEN
        SELECT g.slot_limits, g.taken, g.on_conflicts INTO key_limits, key_taken, key_conflicts
        FROM jobhost.take_slots(key_jobs, key_names, key_counts, true) g;
    END IF;

    -- Where each job goes: jobs, blocked_jobs or the archive (its key's
    -- first `taken` jobs by priority then arrival get its slots).
    SELECT array_agg(coalesce(r.place, 'jobs') ORDER BY u.ord), array_agg(r.reason ORDER BY u.ord)
    INTO places, reasons
    FROM unnest(jobs) WITH ORDINALITY AS u(job, ord)
    LEFT JOIN (
        SELECT g.ord,
               CASE WHEN g.rank <= k.taken THEN 'jobs'
                    WHEN k.on_conflict IN ('discard', 'raise') THEN 'archive'
                    ELSE 'blocked' END AS place,
               format('concurrency limit reached: all %s slots of key "%s" are taken', k.slot_limit, k.key) AS reason
        FROM (
            SELECT v.ord, v.job, v.key,
                   row_number() OVER (PARTITION BY v.job, v.key ORDER BY v.priority, v.id) AS rank
            FROM unnest(jobs, concurrency_keys, priorities, ids, dues) WITH ORDINALITY AS v(job, key, priority, id, due, ord)
            WHERE v.key IS NOT NULL AND v.due <= now()
        ) g
        JOIN unnest(key_jobs, key_names, key_limits, key_taken, key_conflicts)
            AS k(job, key, slot_limit, taken, on_conflict) ON k.job = g.job AND k.key = g.key
    ) r ON r.ord = u.ord;

    INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, max_attempts, run_at, concurrency_key,
                              parent_id, batch_id)
    SELECT u.id, u.job, u.queue, u.priority, u.payload,
           CASE WHEN u.due > now() THEN 'scheduled' ELSE 'available' END,
           u.max_attempts, greatest(u.due, now()), u.key, u.parent_id, u.batch_id
    FROM unnest(ids, jobs, queues, priorities, payloads, attempts, dues, concurrency_keys, parents, batches, places)
        WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, due, key, parent_id, batch_id, place, ord)
    WHERE u.place = 'jobs'
    ORDER BY u.ord;
    IF 'blocked' = ANY(places) THEN
        INSERT INTO jobhost.blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
                                          concurrency_key, batch_id, parent_id, errors)
        SELECT u.id, u.job, u.queue, u.priority, u.payload, 0, u.max_attempts, now(), u.key, u.batch_id,
               u.parent_id, '[]'
        FROM unnest(ids, jobs, queues, priorities, payloads, attempts, concurrency_keys, parents, batches, places)
            WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, key, parent_id, batch_id, place, ord)
        WHERE u.place = 'blocked'
        ORDER BY u.ord;
    END IF;
    IF 'archive' = ANY(places) THEN
        INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                     enqueued_at, finished_at, concurrency_key, batch_id, parent_id)
        SELECT u.id, u.job, u.queue, u.priority, u.payload, 'discarded', 0, u.max_attempts,
               jsonb_build_array(jsonb_build_object('attempt', 0, 'at', now(), 'error', u.reason)),
               now(), now(), u.key, u.batch_id, u.parent_id
        FROM unnest(ids, jobs, queues, priorities, payloads, attempts, concurrency_keys, parents, batches, places,
                    reasons)
            WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, key, parent_id, batch_id, place,
                                 reason, ord)
        WHERE u.place = 'archive'
        ORDER BY u.ord;
    END IF;
    RETURN ids;
END;
$$;
