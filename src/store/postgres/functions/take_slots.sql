-- jobhost.take_slots: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0045_bulk_enqueue_by_index.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.take_slots(key_jobs text[], key_names text[], key_counts integer[], enqueuer_waiting boolean, OUT slot_limits integer[], OUT taken integer[], OUT on_conflicts text[]) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    created_jobs text[];
    created_keys text[];
    read_holders integer[];
    fresh boolean[];
    locked_rows bigint;
    held integer[];
    adding integer[];
    refusal text;
    taking integer;
    lowest integer;
    guarded integer;
BEGIN
    -- Every key's row locked in key order, with its holders read as it is
    -- locked. When every key of a large call has a row, one SELECT ... FOR
    -- UPDATE does both (a row another transaction holds is waited for and
    -- read as that transaction left it), in a block of its own: if a key
    -- has no row, the rows it took are given back with the block's
    -- subtransaction before anything else is locked, so keys are still
    -- only ever waited for in order. (Small calls skip it: a transaction
    -- enqueuing job by job would pile up a subtransaction per call, and
    -- past 64 every other session's snapshot pays for them.)
    -- A call whose first, middle or last key has no row (new keys, most
    -- likely) goes straight to the upsert, without locking the others first.
    IF cardinality(key_jobs) >= 64 AND (
        SELECT count(*) = 3
        FROM unnest(ARRAY[1, (cardinality(key_jobs) + 1) / 2, cardinality(key_jobs)]) AS i(at)
        JOIN jobhost.semaphores s ON s.job = key_jobs[i.at] AND s.key = key_names[i.at]
    ) THEN
        BEGIN
            SELECT array_agg(l.holders ORDER BY k.ord), count(*) INTO read_holders, locked_rows
            FROM unnest(key_jobs, key_names) WITH ORDINALITY AS k(job, key, ord)
            CROSS JOIN LATERAL (
                SELECT s.holders FROM jobhost.semaphores s WHERE s.job = k.job AND s.key = k.key FOR UPDATE
            ) l;
            IF locked_rows < cardinality(key_jobs) THEN
                RAISE EXCEPTION 'a key has no semaphore row yet' USING ERRCODE = 'JHK01';
            END IF;
            fresh := array_fill(false, ARRAY[cardinality(key_jobs)]);
        EXCEPTION WHEN SQLSTATE 'JHK01' THEN
            read_holders := NULL;
        END;
    END IF;
    -- Otherwise one upsert creates or locks every key's row in order (a key
    -- it creates holds the slots its jobs take; one that exists is locked
    -- without being rewritten), and a statement of its own reads the
    -- holders the transactions it waited for committed.
    IF read_holders IS NULL THEN
        WITH created AS (
            INSERT INTO jobhost.semaphores AS s (job, key, holders)
            SELECT k.job, k.key,
                   least(greatest(coalesce((t.config -> 'concurrency' ->> 'limit')::integer, 2147483647), 0), k.n)
            FROM unnest(key_jobs, key_names, key_counts) AS k(job, key, n)
            LEFT JOIN jobhost.job_types t ON t.name = k.job
            ORDER BY k.job, k.key
            ON CONFLICT (job, key) DO UPDATE SET updated_at = now() WHERE false
            RETURNING s.job, s.key
        )
        SELECT array_agg(c.job), array_agg(c.key) INTO created_jobs, created_keys FROM created c;
        IF cardinality(created_jobs) = cardinality(key_jobs) THEN
            -- Every key is new: nothing to read.
            read_holders := array_fill(0, ARRAY[cardinality(key_jobs)]);
            fresh := array_fill(true, ARRAY[cardinality(key_jobs)]);
        ELSE
            SELECT array_agg(coalesce(s.holders, 0) ORDER BY k.ord), array_agg(c.job IS NOT NULL ORDER BY k.ord)
            INTO read_holders, fresh
            FROM unnest(key_jobs, key_names) WITH ORDINALITY AS k(job, key, ord)
            LEFT JOIN unnest(created_jobs, created_keys) AS c(job, key) ON c.job = k.job AND c.key = k.key
            LEFT JOIN LATERAL (
                SELECT s.holders FROM jobhost.semaphores s WHERE s.job = k.job AND s.key = k.key OFFSET 0
            ) s ON true;
        END IF;
    END IF;
    SELECT array_agg(d.held), array_agg(d.slot_limit), array_agg(d.taken), array_agg(d.on_conflict),
           array_agg(CASE WHEN d.created THEN 0 ELSE d.taken END),
           (array_agg(format('job "%s" refused: concurrency limit reached: all %s slots of key "%s" are taken',
                             d.job, d.slot_limit, d.key))
               FILTER (WHERE d.on_conflict = 'raise' AND d.held + d.n > d.slot_limit))[1],
           count(*) FILTER (WHERE d.taken > 0 AND NOT d.created), min(d.slot_limit)
    INTO held, slot_limits, taken, on_conflicts, adding, refusal, taking, lowest
    FROM (
        SELECT k.ord, k.job, k.key, k.n, k.created, l.held, l.slot_limit, l.on_conflict,
               least(greatest(l.slot_limit - l.held, 0), k.n) AS taken
        FROM unnest(key_jobs, key_names, key_counts, read_holders, fresh)
            WITH ORDINALITY AS k(job, key, n, holders, created, ord)
        -- Each of the call's types' limit read from its config once, not
        -- once a key (and no other type's config read at all).
        LEFT JOIN (
            SELECT t.name, (t.config -> 'concurrency' ->> 'limit')::integer AS slot_limit,
                   t.config -> 'concurrency' ->> 'on_conflict' AS on_conflict
            FROM jobhost.job_types t
            WHERE t.name IN (SELECT DISTINCT n.name FROM unnest(key_jobs) AS n(name))
            OFFSET 0
        ) t ON t.name = k.job
        CROSS JOIN LATERAL (
            -- A key this call created had no holders before it.
            SELECT CASE WHEN k.created THEN 0 ELSE k.holders END AS held,
                   coalesce(t.slot_limit, 2147483647) AS slot_limit,
                   coalesce(t.on_conflict, 'block') AS on_conflict
        ) l
        ORDER BY k.ord
    ) d;
    IF enqueuer_waiting AND refusal IS NOT NULL THEN
        RAISE EXCEPTION '%', refusal USING ERRCODE = 'JHL01';
    END IF;
    IF taking > 0 THEN
        UPDATE jobhost.semaphores s SET holders = s.holders + t.adding
        FROM unnest(key_jobs, key_names, slot_limits, adding) AS t(job, key, slot_limit, adding)
        WHERE t.adding > 0 AND s.job = t.job AND s.key = t.key AND s.holders + t.adding <= t.slot_limit;
        GET DIAGNOSTICS guarded = ROW_COUNT;
        IF guarded <> taking THEN
            RAISE EXCEPTION 'semaphores changed under their locks: % of % keys took their slots', guarded, taking;
        END IF;
    END IF;
    -- Only with a corrupt limit below 1: the rows this call created (with no
    -- holders) go.
    IF lowest < 1 THEN
        DELETE FROM jobhost.semaphores s
        USING unnest(key_jobs, key_names, slot_limits, held) AS t(job, key, slot_limit, held)
        WHERE t.slot_limit < 1 AND t.held = 0 AND s.job = t.job AND s.key = t.key AND s.holders = 0;
    END IF;
END;
$$;
