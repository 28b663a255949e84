-- A bulk enqueue reads only its own keys' rows, and decides its gate in
-- less work, with the same answers, locks and lock order.
--
-- The planner joined a call's keys to the whole semaphores table, or the
-- whole claims table, by hashing it: a call of 5,000 keys read every row,
-- so its cost grew with the number of keys held anywhere (100,000
-- semaphore rows: 25 ms to lock a call's keys, 12 ms by index). Each of
-- these reads is now a nested loop of index probes over the call's keys
-- (a lateral subquery, which the planner cannot turn into a hash join),
-- each distinct key probed once:
--   take_slots (0030): the lock of every key's row, in key order, and the
--     holders read after the upsert;
--   claim_new_keys (0043): the holders of the keys a call lost;
--   claim_unique (0032, the SQL bulk enqueue's claims): the holders read
--     after the claims.
--
-- take_slots also reads each job type's limit from its config once a
-- call, not once a key. insert_jobs (0043) counts a call's keys after one
-- sort of its jobs, and writes a call whose jobs all go one way (every
-- limited job admitted, or every job blocked) without deciding each
-- job's place.

CREATE OR REPLACE FUNCTION jobhost.take_slots(
    key_jobs text[], key_names text[], key_counts integer[], enqueuer_waiting boolean,
    OUT slot_limits integer[], OUT taken integer[], OUT on_conflicts text[]
)
LANGUAGE plpgsql AS $$
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

CREATE OR REPLACE FUNCTION jobhost.insert_jobs(jobs text[], queues text[], priorities smallint[], payloads jsonb[], attempts integer[], ats timestamp with time zone[], delays bigint[], concurrency_keys text[], parents bigint[], chosen_ids bigint[], batches bigint[], planned timestamp with time zone[], unique_keys text[] DEFAULT NULL::text[])
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $function$
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
    ranks bigint[];
    sole_place text;
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
        FROM (
            -- Sorted, then counted: one sort of the jobs, where counting
            -- first by hashing and then sorting the keys costs more when
            -- most keys are distinct (a sync of one job a key).
            SELECT u.job, u.key
            FROM unnest(jobs, concurrency_keys, dues) AS u(job, key, due)
            WHERE u.key IS NOT NULL AND u.due <= now()
            ORDER BY 1, 2
        ) u
        GROUP BY 1, 2
        ORDER BY 1, 2
    ) w;

    IF key_jobs IS NOT NULL THEN
        SELECT g.slot_limits, g.taken, g.on_conflicts INTO key_limits, key_taken, key_conflicts
        FROM jobhost.take_slots(key_jobs, key_names, key_counts, true) g;
    END IF;

    -- Where each job goes: jobs, blocked_jobs or the archive (its key's
    -- first `taken` jobs due now, by priority then arrival, get its slots).
    -- A call whose jobs all go one way is not decided job by job: without
    -- limited jobs due now (a plain enqueue), or with every one admitted
    -- (new keys, most likely), all go into jobs; with every job limited,
    -- due now and blocked (keys whose slots are all held, on_conflict
    -- block), all go to blocked_jobs. Otherwise one pass joins the jobs to
    -- their keys, in input order; only when a key takes some of its jobs
    -- but not all are the jobs ranked within their keys first (a sort on
    -- the keys; otherwise a key's jobs all go the same way).
    IF key_jobs IS NULL OR key_taken = key_counts THEN
        sole_place := 'jobs';
    ELSIF 0 = ALL(key_taken) AND 'block' = ALL(key_conflicts)
          AND (SELECT sum(n) FROM unnest(key_counts) AS n) = cardinality(jobs) THEN
        sole_place := 'blocked';
    ELSE
        IF EXISTS (SELECT FROM unnest(key_taken, key_counts) AS t(taken, n) WHERE t.taken > 0 AND t.taken < t.n) THEN
            SELECT array_agg(r.rank ORDER BY r.ord) INTO ranks
            FROM (
                SELECT v.ord, row_number() OVER (PARTITION BY v.job, v.key, v.due <= now() ORDER BY v.priority, v.id) AS rank
                FROM unnest(jobs, concurrency_keys, priorities, ids, dues) WITH ORDINALITY AS v(job, key, priority, id, due, ord)
            ) r;
        END IF;
        SELECT array_agg(p.place), array_agg(p.reason) INTO places, reasons
        FROM (
            SELECT v.ord,
                   CASE WHEN k.job IS NULL OR coalesce(ranks[v.ord::integer], 1) <= k.taken THEN 'jobs'
                        WHEN k.on_conflict IN ('discard', 'raise') THEN 'archive'
                        ELSE 'blocked' END AS place,
                   CASE WHEN k.job IS NOT NULL AND coalesce(ranks[v.ord::integer], 1) > k.taken
                             AND k.on_conflict IN ('discard', 'raise')
                        THEN format('concurrency limit reached: all %s slots of key "%s" are taken', k.slot_limit, k.key)
                   END AS reason
            FROM unnest(jobs, concurrency_keys, dues) WITH ORDINALITY AS v(job, key, due, ord)
            LEFT JOIN unnest(key_jobs, key_names, key_limits, key_taken, key_conflicts)
                AS k(job, key, slot_limit, taken, on_conflict) ON k.job = v.job AND k.key = v.key AND v.due <= now()
            ORDER BY v.ord
        ) p;
    END IF;

    IF sole_place = 'jobs' OR 'jobs' = ANY(places) THEN
        INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, max_attempts, run_at, concurrency_key,
                                  parent_id, batch_id, unique_key)
        SELECT u.id, u.job, u.queue, u.priority, u.payload,
               CASE WHEN u.due > now() THEN 'scheduled' ELSE 'available' END,
               u.max_attempts, greatest(u.due, now()), u.key, u.parent_id, u.batch_id, u.unique_key
        FROM unnest(ids, jobs, queues, priorities, payloads, attempts, dues, concurrency_keys, parents, batches, places,
                    unique_keys)
            WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, due, key, parent_id, batch_id, place,
                                 unique_key, ord)
        WHERE coalesce(u.place, sole_place) = 'jobs'
        ORDER BY u.ord;
    END IF;
    IF sole_place = 'blocked' OR 'blocked' = ANY(places) THEN
        INSERT INTO jobhost.blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
                                          concurrency_key, batch_id, parent_id, errors, unique_key)
        SELECT u.id, u.job, u.queue, u.priority, u.payload, 0, u.max_attempts, now(), u.key, u.batch_id,
               u.parent_id, '[]', u.unique_key
        FROM unnest(ids, jobs, queues, priorities, payloads, attempts, concurrency_keys, parents, batches, places,
                    unique_keys)
            WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, key, parent_id, batch_id, place,
                                 unique_key, ord)
        WHERE coalesce(u.place, sole_place) = 'blocked'
        ORDER BY u.ord;
    END IF;
    IF 'archive' = ANY(places) THEN
        INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                     enqueued_at, finished_at, concurrency_key, batch_id, parent_id, unique_key,
                                     key_carried)
        SELECT u.id, u.job, u.queue, u.priority, u.payload, 'discarded', 0, u.max_attempts,
               jsonb_build_array(jsonb_build_object('attempt', 0, 'at', now(), 'error', u.reason)),
               now(), now(), u.key, u.batch_id, u.parent_id, u.unique_key, true
        FROM unnest(ids, jobs, queues, priorities, payloads, attempts, concurrency_keys, parents, batches, places,
                    reasons, unique_keys)
            WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, key, parent_id, batch_id, place,
                                 reason, unique_key, ord)
        WHERE u.place = 'archive'
        ORDER BY u.ord;
    END IF;
    RETURN ids;
END;
$function$;


CREATE OR REPLACE FUNCTION jobhost.claim_new_keys(job_types text[], unique_keys text[], while_executing boolean[],
                                       attach boolean DEFAULT false, OUT ids bigint[], OUT claimants bigint[])
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    lost_ords bigint[];
    lost_jobs text[];
    lost_keys text[];
    lost_ids bigint[];
    found_ords bigint[] := '{}';
    found_claimants bigint[] := '{}';
    read_ords bigint[];
    read_claimants bigint[];
    won bigint[];
    tries integer := 0;
    all_won boolean := false;
BEGIN
    SELECT coalesce(array_agg(s.id), '{}') INTO ids
    FROM (SELECT nextval('jobhost.job_ids') AS id FROM generate_series(1, coalesce(cardinality(job_types), 0))
          ORDER BY 1) s;

    IF jobhost.claims_likely_new(job_types, unique_keys, while_executing) THEN
        BEGIN
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id, attached)
            SELECT u.job, u.unique_key, u.id, attach
            FROM unnest(job_types, unique_keys, ids, while_executing) AS u(job, unique_key, id, we)
            WHERE u.unique_key IS NOT NULL AND NOT u.we
            ORDER BY u.job, u.unique_key, u.id;
            all_won := true;
        EXCEPTION WHEN unique_violation THEN
            all_won := false;
        END;
    END IF;

    IF NOT all_won THEN
        WITH claimed AS (
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id, attached)
            SELECT u.job, u.unique_key, u.id, attach
            FROM unnest(job_types, unique_keys, ids, while_executing) AS u(job, unique_key, id, we)
            WHERE u.unique_key IS NOT NULL AND NOT u.we
            ORDER BY u.job, u.unique_key, u.id
            ON CONFLICT DO NOTHING
            RETURNING job_id
        )
        SELECT coalesce(array_agg(job_id), '{}') INTO won FROM claimed;
        SELECT array_agg(u.ord), array_agg(u.job), array_agg(u.unique_key), array_agg(u.id)
        INTO lost_ords, lost_jobs, lost_keys, lost_ids
        FROM unnest(job_types, unique_keys, ids, while_executing) WITH ORDINALITY AS u(job, unique_key, id, we, ord)
        WHERE u.unique_key IS NOT NULL AND NOT u.we AND NOT EXISTS (SELECT 1 FROM unnest(won) AS w(id) WHERE w.id = u.id);

        WHILE lost_ords IS NOT NULL LOOP
            SELECT array_agg(l.ord) FILTER (WHERE c.job_id IS NOT NULL),
                   array_agg(c.job_id) FILTER (WHERE c.job_id IS NOT NULL),
                   array_agg(l.ord) FILTER (WHERE c.job_id IS NULL),
                   array_agg(l.job) FILTER (WHERE c.job_id IS NULL),
                   array_agg(l.unique_key) FILTER (WHERE c.job_id IS NULL),
                   array_agg(l.id) FILTER (WHERE c.job_id IS NULL)
            INTO read_ords, read_claimants, lost_ords, lost_jobs, lost_keys, lost_ids
            FROM unnest(lost_ords, lost_jobs, lost_keys, lost_ids) AS l(ord, job, unique_key, id)
            LEFT JOIN (
                -- Each lost key read once (a call of duplicates of one key reads one claim).
                SELECT k.job, k.unique_key, c.job_id
                FROM (SELECT DISTINCT u.job, u.unique_key FROM unnest(lost_jobs, lost_keys) AS u(job, unique_key)) k
                CROSS JOIN LATERAL (
                    SELECT c.job_id FROM jobhost.unique_claims c
                    WHERE c.job = k.job AND c.unique_key = k.unique_key OFFSET 0
                ) c
            ) c ON c.job = l.job AND c.unique_key = l.unique_key;
            found_ords := found_ords || coalesce(read_ords, '{}');
            found_claimants := found_claimants || coalesce(read_claimants, '{}');
            EXIT WHEN lost_ords IS NULL;
            -- Released between the claim and the read: claim them again.
            tries := tries + 1;
            IF tries >= 100 THEN
                RAISE EXCEPTION 'uniqueness keys kept being released while they were claimed' USING ERRCODE = '40001';
            END IF;
            WITH claimed AS (
                INSERT INTO jobhost.unique_claims (job, unique_key, job_id, attached)
                SELECT l.job, l.unique_key, l.id, attach
                FROM unnest(lost_jobs, lost_keys, lost_ids) AS l(job, unique_key, id)
                ORDER BY l.job, l.unique_key, l.id
                ON CONFLICT DO NOTHING
                RETURNING job_id
            )
            SELECT coalesce(array_agg(job_id), '{}') INTO won FROM claimed;
            SELECT array_agg(l.ord), array_agg(l.job), array_agg(l.unique_key), array_agg(l.id)
            INTO lost_ords, lost_jobs, lost_keys, lost_ids
            FROM unnest(lost_ords, lost_jobs, lost_keys, lost_ids) AS l(ord, job, unique_key, id)
            WHERE NOT EXISTS (SELECT 1 FROM unnest(won) AS w(id) WHERE w.id = l.id);
        END LOOP;
    END IF;

    -- A job with a key is written unless another job holds its key.
    IF all_won AND array_position(unique_keys, NULL) IS NULL THEN
        claimants := ids;
    ELSE
        SELECT coalesce(array_agg(CASE WHEN u.unique_key IS NULL THEN NULL ELSE coalesce(f.claimant, u.id) END
                                  ORDER BY u.ord), '{}')
        INTO claimants
        FROM unnest(unique_keys, ids) WITH ORDINALITY AS u(unique_key, id, ord)
        LEFT JOIN unnest(found_ords, found_claimants) AS f(ord, claimant) ON f.ord = u.ord;
    END IF;

    IF true = ANY(while_executing) THEN
        INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
        SELECT u.id, u.job, u.unique_key, true
        FROM unnest(ids, job_types, unique_keys, while_executing) AS u(id, job, unique_key, we)
        WHERE u.unique_key IS NOT NULL AND u.we;
    END IF;
END;
$function$;


CREATE OR REPLACE FUNCTION jobhost.claim_unique(job_types text[], unique_keys text[], job_ids bigint[])
RETURNS TABLE (ord bigint, claimant bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    holders bigint[];
    held integer;
    tries integer := 0;
BEGIN
    IF jobhost.claims_likely_new(job_types, unique_keys, NULL) THEN
        BEGIN
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
            SELECT u.job, u.unique_key, u.id
            FROM unnest(job_types, unique_keys, job_ids) AS u(job, unique_key, id)
            ORDER BY u.job, u.unique_key, u.id;
            holders := job_ids;
        EXCEPTION WHEN unique_violation THEN
            holders := NULL;
        END;
    END IF;
    WHILE holders IS NULL LOOP
        INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
        SELECT u.job, u.unique_key, u.id
        FROM unnest(job_types, unique_keys, job_ids) AS u(job, unique_key, id)
        ORDER BY u.job, u.unique_key, u.id
        ON CONFLICT DO NOTHING;
        SELECT array_agg(c.job_id ORDER BY u.n), count(c.job_id) INTO holders, held
        FROM unnest(job_types, unique_keys) WITH ORDINALITY AS u(job, unique_key, n)
        LEFT JOIN (
            -- Each key read once (a call of duplicates of one key reads one claim).
            SELECT k.job, k.unique_key, c.job_id
            FROM (SELECT DISTINCT d.job, d.unique_key FROM unnest(job_types, unique_keys) AS d(job, unique_key)) k
            CROSS JOIN LATERAL (
                SELECT c.job_id FROM jobhost.unique_claims c
                WHERE c.job = k.job AND c.unique_key = k.unique_key OFFSET 0
            ) c
        ) c ON c.job = u.job AND c.unique_key = u.unique_key;
        EXIT WHEN held = cardinality(job_types);
        holders := NULL;
        tries := tries + 1;
        IF tries >= 100 THEN
            RAISE EXCEPTION 'uniqueness keys kept being released while they were claimed' USING ERRCODE = '40001';
        END IF;
    END LOOP;
    RETURN QUERY SELECT h.n, h.holder FROM unnest(holders) WITH ORDINALITY AS h(holder, n);
END;
$$;
