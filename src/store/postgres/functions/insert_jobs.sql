-- jobhost.insert_jobs: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0045_bulk_enqueue_by_index.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.insert_jobs(jobs text[], queues text[], priorities smallint[], payloads jsonb[], attempts integer[], ats timestamp with time zone[], delays bigint[], concurrency_keys text[], parents bigint[], chosen_ids bigint[], batches bigint[], planned timestamp with time zone[], unique_keys text[] DEFAULT NULL::text[]) RETURNS bigint[]
    LANGUAGE plpgsql
    AS $$
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
$$;
