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

-- THE GATE, as in 0004 (read its comment for the rules), in five steps:
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
    key_held integer[];
    key_limits integer[];
    key_taken integer[];
    empty_keys integer;
    guarded integer;
    available bigint[];
    parked bigint[];
    discarded bigint[];
    reasons text[];
    refusal text;
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
    -- Locks them in that order, reading their holders (sorted the same
    -- way, so the arrays stay aligned).
    WITH locked AS (
        INSERT INTO jobhost.semaphores AS s (job, key, holders)
        SELECT k.job, k.key, 0 FROM unnest(key_jobs, key_names) AS k(job, key) ORDER BY k.job, k.key
        ON CONFLICT (job, key) DO UPDATE SET updated_at = now()
        RETURNING s.job, s.key, s.holders
    )
    SELECT array_agg(l.holders ORDER BY l.job, l.key) INTO key_held FROM locked l;
    -- Each key's limit (as jobhost.slot_limit: unlimited when its type no
    -- longer declares one) and the slots it takes.
    SELECT array_agg(d.slot_limit ORDER BY d.ord),
           array_agg(least(greatest(d.slot_limit - d.held, 0), d.n) ORDER BY d.ord),
           count(*) FILTER (WHERE d.held = 0 AND d.slot_limit < 1)
    INTO key_limits, key_taken, empty_keys
    FROM (
        SELECT k.ord, k.held, k.n,
               coalesce((t.config -> 'concurrency' ->> 'limit')::integer, 2147483647) AS slot_limit
        FROM unnest(key_jobs, key_held, key_counts) WITH ORDINALITY AS k(job, held, n, ord)
        LEFT JOIN jobhost.job_types t ON t.name = k.job
    ) d;


    UPDATE jobhost.semaphores s SET holders = s.holders + t.taken
    FROM unnest(key_jobs, key_names, key_limits, key_taken) AS t(job, key, slot_limit, taken)
    WHERE t.taken > 0 AND s.job = t.job AND s.key = t.key AND s.holders + t.taken <= t.slot_limit;
    GET DIAGNOSTICS guarded = ROW_COUNT;
    IF guarded <> (SELECT count(*) FROM unnest(key_taken) AS t(taken) WHERE t.taken > 0) THEN
        RAISE EXCEPTION 'semaphores changed under their locks: % of % keys took their slots', guarded,
            (SELECT count(*) FROM unnest(key_taken) AS t(taken) WHERE t.taken > 0);
    END IF;
    IF empty_keys > 0 THEN
        -- Only with a corrupt limit below 1; the rows this gate created go.
        DELETE FROM jobhost.semaphores s
        USING unnest(key_jobs, key_names, key_limits) AS t(job, key, slot_limit)
        WHERE t.slot_limit < 1 AND s.job = t.job AND s.key = t.key AND s.holders = 0;
    END IF;

    WITH ranked AS (
        SELECT j.id, j.job, j.concurrency_key AS key,
               row_number() OVER (PARTITION BY j.job, j.concurrency_key ORDER BY j.priority, j.run_at, j.id) AS place
        FROM jobhost.jobs j
        WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL
    ), judged AS (
        SELECT r.id, r.job, r.key, r.place, t.ord, t.slot_limit, r.place <= t.taken AS admitted,
               coalesce(c.config -> 'concurrency' ->> 'on_conflict', 'block') AS on_conflict
        FROM ranked r
        JOIN unnest(key_jobs, key_names, key_limits, key_taken) WITH ORDINALITY AS t(job, key, slot_limit, taken, ord)
            ON t.job = r.job AND t.key = r.key
        LEFT JOIN jobhost.job_types c ON c.name = r.job
    )
    SELECT array_agg(j.id) FILTER (WHERE j.admitted),
           array_agg(j.id ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict NOT IN ('discard', 'raise')),
           array_agg(j.id ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict IN ('discard', 'raise')),
           array_agg(format('concurrency limit reached: all %s slots of key "%s" are taken', j.slot_limit, j.key)
                     ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict IN ('discard', 'raise')),
           (array_agg(format('job "%s" refused: concurrency limit reached: all %s slots of key "%s" are taken',
                             j.job, j.slot_limit, j.key)
                      ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict = 'raise'))[1]
    INTO available, parked, discarded, reasons, refusal
    FROM judged j;

    IF enqueuer_waiting AND refusal IS NOT NULL THEN
        RAISE EXCEPTION '%', refusal USING ERRCODE = 'JHL01';
    END IF;

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
