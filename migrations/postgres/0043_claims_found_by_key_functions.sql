-- Claims found by their key (0041 says why): the claims' index by job id
-- goes, a host's enqueue attaches its claims to its jobs' rows, and every
-- function that moves a job between `jobs`, `blocked_jobs` and the archive
-- carries the key with it.
--
-- A claim is attached only if its job's row holds its key from the first
-- insert on: `claim_new_keys(..., attach => true)` then
-- `insert_jobs(..., unique_keys)`, as a host of this release calls them
-- for the jobs it writes. Their old signatures keep working through the
-- defaults (`attach => false`, no keys): a host of the previous release
-- takes unattached claims, found as before, by job id, through the
-- partial index 0042 built.
--
-- What must hold: a row that moves (park, promotion, release of a slot)
-- keeps its key, and an archive insert says it carried the key
-- (`key_carried`). A move that dropped the key would leave an attached
-- claim behind; an archive insert that does not say so costs a scan of
-- the attached claims, and is answered correctly. The host's cancel and
-- quarantine statements carry it too (src/store/postgres/sql/); its
-- retry from the archive writes no key, and `reclaim_unique` takes an
-- unattached claim.
--
-- Locks: the claims' table for a moment (an index dropped), under the
-- migration runner's short lock timeout.

DO $$
BEGIN
    IF NOT coalesce((SELECT i.indisvalid
                     FROM pg_index i
                     JOIN pg_class c ON c.oid = i.indexrelid
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = 'jobhost' AND c.relname = 'unique_claims_unattached'), false) THEN
        DROP INDEX IF EXISTS jobhost.unique_claims_unattached;
        CREATE INDEX unique_claims_unattached ON jobhost.unique_claims (job_id) WHERE NOT attached;
    END IF;
END;
$$;

DROP INDEX jobhost.unique_claims_job_id;

-- A run's end gives back a while_executing claim bound to its token; such
-- claims are never attached (a fetch takes them), so the partial index
-- finds them.
CREATE OR REPLACE FUNCTION jobhost.release_unique_run() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM jobhost.unique_claims c
    WHERE c.job_id = OLD.id AND c.lease_token = OLD.lease_token AND NOT c.attached;
    RETURN NULL;
END;
$$;

-- claim_new_keys (0038) with `attach`: claims of a host that writes their
-- keys on its jobs' rows.
DROP FUNCTION jobhost.claim_new_keys(text[], text[], boolean[]);
CREATE FUNCTION jobhost.claim_new_keys(job_types text[], unique_keys text[], while_executing boolean[],
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
            LEFT JOIN jobhost.unique_claims c ON c.job = l.job AND c.unique_key = l.unique_key;
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

-- insert_jobs (0030) with `unique_keys`: each job's attached key, written
-- on its row wherever the gate puts it.
DROP FUNCTION jobhost.insert_jobs(text[], text[], smallint[], jsonb[], integer[], timestamptz[], bigint[], text[],
                                  bigint[], bigint[], bigint[], timestamptz[]);
CREATE FUNCTION jobhost.insert_jobs(jobs text[], queues text[], priorities smallint[], payloads jsonb[], attempts integer[], ats timestamp with time zone[], delays bigint[], concurrency_keys text[], parents bigint[], chosen_ids bigint[], batches bigint[], planned timestamp with time zone[], unique_keys text[] DEFAULT NULL::text[])
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
    -- first `taken` jobs due now, by priority then arrival, get its slots).
    -- One pass: the jobs joined to their keys, in input order. Only when a
    -- key takes some of its jobs but not all are the jobs ranked within
    -- their keys first (a sort on the keys; otherwise a key's jobs all go
    -- the same way); without limited jobs due now (a plain enqueue) every
    -- job goes into jobs and nothing is decided.
    IF key_jobs IS NOT NULL THEN
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

    IF places IS NULL OR 'jobs' = ANY(places) THEN
        INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, max_attempts, run_at, concurrency_key,
                                  parent_id, batch_id, unique_key)
        SELECT u.id, u.job, u.queue, u.priority, u.payload,
               CASE WHEN u.due > now() THEN 'scheduled' ELSE 'available' END,
               u.max_attempts, greatest(u.due, now()), u.key, u.parent_id, u.batch_id, u.unique_key
        FROM unnest(ids, jobs, queues, priorities, payloads, attempts, dues, concurrency_keys, parents, batches, places,
                    unique_keys)
            WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, due, key, parent_id, batch_id, place,
                                 unique_key, ord)
        WHERE u.place IS NULL OR u.place = 'jobs'
        ORDER BY u.ord;
    END IF;
    IF 'blocked' = ANY(places) THEN
        INSERT INTO jobhost.blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
                                          concurrency_key, batch_id, parent_id, errors, unique_key)
        SELECT u.id, u.job, u.queue, u.priority, u.payload, 0, u.max_attempts, now(), u.key, u.batch_id,
               u.parent_id, '[]', u.unique_key
        FROM unnest(ids, jobs, queues, priorities, payloads, attempts, concurrency_keys, parents, batches, places,
                    unique_keys)
            WITH ORDINALITY AS u(id, job, queue, priority, payload, max_attempts, key, parent_id, batch_id, place,
                                 unique_key, ord)
        WHERE u.place = 'blocked'
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


-- The functions that move jobs, as before, with the key carried.
CREATE OR REPLACE FUNCTION jobhost.park(job_ids bigint[])
 RETURNS void
 LANGUAGE sql
AS $function$
    WITH moved AS (DELETE FROM jobhost.jobs WHERE id = ANY(job_ids) RETURNING *)
    INSERT INTO jobhost.blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
                                      started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key)
    SELECT id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
           started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key
    FROM moved
$function$;

CREATE OR REPLACE FUNCTION jobhost.promote_parked(job_type text, slot_key text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    slot_limit integer := jobhost.slot_limit(job_type);
    next_id bigint;
    moved integer := 0;
BEGIN
    LOOP
        SELECT b.id INTO next_id FROM jobhost.blocked_jobs b
        WHERE b.job = job_type AND b.concurrency_key = slot_key
        ORDER BY b.priority, b.parked_at, b.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED;
        EXIT WHEN next_id IS NULL OR NOT jobhost.take_slot(job_type, slot_key, slot_limit);
        WITH p AS (DELETE FROM jobhost.blocked_jobs WHERE id = next_id RETURNING *)
        INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, attempt, max_attempts, run_at,
                                  enqueued_at, started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key)
        SELECT id, job, queue, priority, payload, 'available', attempt, max_attempts, now(),
               enqueued_at, started_at, concurrency_key, batch_id, parent_id, errors, progress, unique_key
        FROM p;
        moved := moved + 1;
    END LOOP;
    RETURN moved;
END;
$function$;

CREATE OR REPLACE FUNCTION jobhost.release_slots_leasing(job_types text[], slot_keys text[], queues text[], fetch_types text[], fetch_leases integer[], max_jobs bigint, host text, OUT promoted integer, OUT leased jobhost.jobs[])
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    orphan record;
    keys_freed integer;
    keys_held integer;
    emptied integer;
BEGIN
    PERFORM 1 FROM jobhost.semaphores s
    WHERE (s.job, s.key) IN (SELECT t.job, t.key FROM unnest(job_types, slot_keys) AS t(job, key))
    ORDER BY s.job, s.key
    FOR UPDATE;

    WITH freed AS (
        SELECT t.job, t.key, count(*)::integer AS n
        FROM unnest(job_types, slot_keys) AS t(job, key)
        WHERE t.key IS NOT NULL
        GROUP BY 1, 2
    ),
    room AS (
        SELECT s.job, s.key, f.n,
               greatest(coalesce((t.config -> 'concurrency' ->> 'limit')::integer, 2147483647)
                        - greatest(s.holders - f.n, 0), 0) AS free
        FROM jobhost.semaphores s
        JOIN freed f ON f.job = s.job AND f.key = s.key
        LEFT JOIN jobhost.job_types t ON t.name = s.job
    ),
    chosen AS (
        SELECT p.id
        FROM room r
        CROSS JOIN LATERAL (
            SELECT b.id FROM jobhost.blocked_jobs b
            WHERE b.job = r.job AND b.concurrency_key = r.key
            ORDER BY b.priority, b.parked_at, b.id
            LIMIT r.free
            FOR UPDATE SKIP LOCKED
        ) p
        WHERE r.free > 0
    ),
    moved AS (
        DELETE FROM jobhost.blocked_jobs b USING chosen c WHERE b.id = c.id RETURNING b.*
    ),
    servable AS MATERIALIZED (
        -- Materialized: placed reads `servable` twice, and inlined each
        -- read would call rate_governed again.
        SELECT m.*, s.lease_secs AS lease_for,
               s.lease_secs IS NOT NULL AND m.queue = ANY(queues)
               AND NOT jobhost.rate_governed(m.job)
               AND NOT EXISTS (SELECT 1 FROM jobhost.unique_keys k WHERE k.job_id = m.id AND k.while_executing)
                   AS servable
        FROM moved m
        LEFT JOIN unnest(fetch_types, fetch_leases) AS s(job, lease_secs) ON s.job = m.job
    ),
    ahead AS MATERIALIZED (
        -- Read only when there is a servable promotion to place.
        SELECT a.priority FROM jobhost.fetch_ahead(queues, fetch_types, max_jobs) AS a(priority)
    ),
    placed AS (
        -- A servable promotion's place in the fetch: the servable promotions
        -- before it, and the available jobs of its priority or before.
        SELECT v.*,
               v.servable AND max_jobs > 0
               AND (row_number() OVER (PARTITION BY v.servable ORDER BY v.priority, v.id) - 1)
                   + (SELECT count(*) FROM ahead a WHERE a.priority <= v.priority)
                   < max_jobs AS lease
        FROM servable v
    ),
    inserted AS (
        INSERT INTO jobhost.jobs AS j
            (id, job, queue, priority, payload, state, attempt, max_attempts, run_at, enqueued_at, started_at,
             concurrency_key, batch_id, parent_id, errors, progress, unique_key,
             lease_token, lease_secs, lease_expires_at, host_id)
        SELECT p.id, p.job, p.queue, p.priority, p.payload,
               CASE WHEN p.lease THEN 'running' ELSE 'available' END,
               p.attempt + CASE WHEN p.lease THEN 1 ELSE 0 END, p.max_attempts, now(),
               p.enqueued_at, CASE WHEN p.lease THEN now() ELSE p.started_at END,
               p.concurrency_key, p.batch_id, p.parent_id, p.errors, p.progress, p.unique_key,
               CASE WHEN p.lease THEN nextval('jobhost.lease_tokens') END,
               CASE WHEN p.lease THEN p.lease_for END,
               CASE WHEN p.lease THEN now() + p.lease_for * interval '1 second' END,
               CASE WHEN p.lease THEN host END
        FROM placed p
        RETURNING j
    ),
    taken AS (
        SELECT (i.j).job, (i.j).concurrency_key AS key, count(*)::integer AS n FROM inserted i GROUP BY 1, 2
    ),
    counted AS (
        -- Runs whether or not it is read, like every data-modifying WITH.
        UPDATE jobhost.semaphores s
        SET holders = greatest(s.holders - r.n, 0) + coalesce(t.n, 0), updated_at = now()
        FROM room r
        LEFT JOIN taken t ON t.job = r.job AND t.key = r.key
        WHERE s.job = r.job AND s.key = r.key
    )
    SELECT count(*)::integer, coalesce(array_agg(i.j) FILTER (WHERE (i.j).state = 'running'), '{}'),
           (SELECT count(*)::integer FROM freed), (SELECT count(*)::integer FROM room)
    INTO promoted, leased, keys_freed, keys_held
    FROM inserted i;

    DELETE FROM jobhost.semaphores s
    USING unnest(job_types, slot_keys) AS t(job, key)
    WHERE s.job = t.job AND s.key = t.key AND s.holders = 0;
    GET DIAGNOSTICS emptied = ROW_COUNT;

    -- A freed key is left without a row only when the DELETE just emptied
    -- it or it had none when the promotion began (see the header).
    IF emptied = 0 AND keys_held = keys_freed THEN
        RETURN;
    END IF;
    FOR orphan IN
        SELECT DISTINCT t.job, t.key FROM unnest(job_types, slot_keys) AS t(job, key)
        WHERE t.key IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM jobhost.semaphores s WHERE s.job = t.job AND s.key = t.key)
        ORDER BY 1, 2
    LOOP
        promoted := promoted + jobhost.promote_parked(orphan.job, orphan.key);
    END LOOP;
END;
$function$;

CREATE OR REPLACE FUNCTION jobhost.discard(job_ids bigint[], reason text)
 RETURNS void
 LANGUAGE sql
AS $function$
    WITH moved AS (DELETE FROM jobhost.jobs WHERE id = ANY(job_ids) RETURNING *)
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                                 enqueued_at, started_at, finished_at, concurrency_key, batch_id, parent_id, unique_key, key_carried)
    SELECT id, job, queue, priority, payload, 'discarded', attempt, max_attempts,
           errors || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', now(), 'error', reason)),
           progress, enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id, unique_key, true
    FROM moved
$function$;

CREATE OR REPLACE FUNCTION jobhost.discard_each(job_ids bigint[], reasons text[])
 RETURNS void
 LANGUAGE sql
AS $function$
    WITH why AS (SELECT * FROM unnest(job_ids, reasons) AS w(id, reason)),
    moved AS (DELETE FROM jobhost.jobs j USING why w WHERE j.id = w.id RETURNING j.*, w.reason)
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                                 enqueued_at, started_at, finished_at, concurrency_key, batch_id, parent_id, unique_key, key_carried)
    SELECT id, job, queue, priority, payload, 'discarded', attempt, max_attempts,
           errors || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', now(), 'error', reason)),
           progress, enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id, unique_key, true
    FROM moved
$function$;

CREATE OR REPLACE FUNCTION jobhost.expire_leases(due_by timestamp with time zone, only_ids bigint[], max_jobs integer, OUT requeued integer, OUT failed integer, OUT held_back integer)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    expired bigint[];
    ending bigint[];
    keyed bigint[];
    with_semaphore bigint[];
    keys_locked bigint[];
    batched bigint[];
    batch_ids bigint[];
    batches_locked bigint[];
    waiting bigint[];
    freed_jobs text[];
    freed_keys text[];
BEGIN
    requeued := 0;
    failed := 0;
    held_back := 0;
    SELECT coalesce(array_agg(e.id), '{}') INTO expired FROM (
        SELECT j.id FROM jobhost.jobs j
        WHERE j.state = 'running' AND j.lease_expires_at < due_by
          AND (only_ids IS NULL OR j.id = ANY(only_ids))
        ORDER BY j.lease_expires_at
        LIMIT max_jobs
        FOR UPDATE SKIP LOCKED
    ) e;
    IF cardinality(expired) = 0 THEN
        RETURN;
    END IF;
    -- The jobs this expiry ends, and what each needs locked.
    SELECT coalesce(array_agg(j.id), '{}'),
           coalesce(array_agg(j.id) FILTER (WHERE j.concurrency_key IS NOT NULL), '{}'),
           coalesce(array_agg(j.id) FILTER (WHERE j.batch_id IS NOT NULL), '{}'),
           coalesce(array_agg(DISTINCT j.batch_id) FILTER (WHERE j.batch_id IS NOT NULL), '{}')
    INTO ending, keyed, batched, batch_ids
    FROM jobhost.jobs j
    WHERE j.id = ANY(expired) AND jobhost.expiry_ends(j);
    IF cardinality(keyed) > 0 THEN
        SELECT coalesce(array_agg(l.id), '{}') INTO keys_locked FROM (
            SELECT j.id FROM jobhost.jobs j
            JOIN jobhost.semaphores s ON s.job = j.job AND s.key = j.concurrency_key
            WHERE j.id = ANY(keyed)
            ORDER BY s.job, s.key
            FOR UPDATE OF s SKIP LOCKED
        ) l;
        -- A key whose row is missing (deleted by hand) has nothing to wait for.
        SELECT coalesce(array_agg(j.id), '{}') INTO with_semaphore
        FROM jobhost.jobs j JOIN jobhost.semaphores s ON s.job = j.job AND s.key = j.concurrency_key
        WHERE j.id = ANY(keyed);
        waiting := ARRAY(SELECT unnest(with_semaphore) EXCEPT SELECT unnest(keys_locked));
    ELSE
        waiting := '{}';
    END IF;
    IF cardinality(batch_ids) > 0 THEN
        SELECT coalesce(array_agg(l.id), '{}') INTO batches_locked FROM (
            SELECT b.id FROM jobhost.batches b
            WHERE b.id = ANY(batch_ids)
            ORDER BY b.id
            FOR UPDATE OF b SKIP LOCKED
        ) l;
        waiting := waiting || ARRAY(
            SELECT j.id FROM jobhost.jobs j
            JOIN jobhost.batches b ON b.id = j.batch_id
            WHERE j.id = ANY(batched) AND b.id <> ALL(batches_locked));
    END IF;
    IF cardinality(waiting) > 0 THEN
        SELECT count(DISTINCT w) INTO held_back FROM unnest(waiting) AS w;
        expired := ARRAY(SELECT unnest(expired) EXCEPT SELECT unnest(waiting));
    END IF;
    WITH noted AS (
        SELECT j.id, jobhost.expiry_ends(j) AS spent,
               j.cancel_requested_at IS NOT NULL AS cancelled,
               NOT jobhost.expiry_charges(j) AS refund,
               j.errors || jsonb_build_array(jsonb_build_object(
                   'attempt', j.attempt, 'at', now(),
                   'error', CASE WHEN jobhost.expiry_charges(j)
                                 THEN format('lease expired: host %s stopped during the run, attempt %s of %s',
                                             j.host_id, j.attempt, j.max_attempts)
                                 ELSE format('lease expired before host %s started the run: attempt %s given back',
                                             j.host_id, j.attempt)
                            END
                            || CASE WHEN j.cancel_requested_at IS NOT NULL
                                    THEN '; cancelled by an operator while running' ELSE '' END)) AS errors
        FROM jobhost.jobs j
        WHERE j.id = ANY(expired)
    ),
    gone AS (
        DELETE FROM jobhost.jobs j USING noted n
        WHERE j.id = n.id AND n.spent
        RETURNING j.*, n.errors AS new_errors, n.cancelled
    ),
    archived AS (
        INSERT INTO jobhost.archive
            (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
             enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id, unique_key,
             key_carried)
        SELECT id, job, queue, priority, payload, CASE WHEN cancelled THEN 'cancelled' ELSE 'failed' END,
               attempt, max_attempts, new_errors, progress,
               enqueued_at, started_at, now(), host_id, concurrency_key, batch_id, parent_id, unique_key, true
        FROM gone
        RETURNING id, job, concurrency_key
    ),
    back AS (
        UPDATE jobhost.jobs j
        SET state = 'available', run_at = now(), errors = n.errors,
            attempt = j.attempt - n.refund::int, unconfirmed_expiries = j.unconfirmed_expiries + n.refund::int,
            lease_token = NULL, lease_secs = NULL, lease_expires_at = NULL, host_id = NULL
        FROM noted n
        WHERE j.id = n.id AND NOT n.spent
        RETURNING j.id
    )
    SELECT (SELECT count(*) FROM back), (SELECT count(*) FROM archived),
           (SELECT coalesce(array_agg(a.job), '{}') FROM archived a WHERE a.concurrency_key IS NOT NULL),
           (SELECT coalesce(array_agg(a.concurrency_key), '{}') FROM archived a WHERE a.concurrency_key IS NOT NULL)
    INTO requeued, failed, freed_jobs, freed_keys;
    IF cardinality(freed_jobs) > 0 THEN
        PERFORM jobhost.release_slots(freed_jobs, freed_keys);
    END IF;
    IF requeued > 0 THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
END;
$function$;

CREATE OR REPLACE FUNCTION jobhost.finish_runs(archive_ids bigint[], archive_tokens bigint[], archive_states text[], outputs jsonb[], archive_errors jsonb[], logs jsonb[], archive_progress jsonb[], requeue_ids bigint[], requeue_tokens bigint[], delays_ms bigint[], refunds integer[], requeue_errors jsonb[], requeue_progress jsonb[], queues text[] DEFAULT '{}'::text[], fetch_types text[] DEFAULT '{}'::text[], fetch_leases integer[] DEFAULT '{}'::integer[], max_jobs bigint DEFAULT 0, host text DEFAULT ''::text)
 RETURNS TABLE(written bigint[], any_available boolean, id bigint, lease_token bigint, job text, queue text, payload jsonb, attempt integer, max_attempts integer, enqueued_at timestamp with time zone, batch_id bigint, concurrency_key text, lease_secs integer)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    archived bigint[];
    freed_jobs text[];
    freed_keys text[];
    requeued bigint[];
    waiting_jobs text[];
    waiting_keys text[];
    available_now boolean;
    promoted integer := 0;
    leased jobhost.jobs[] := '{}';
    promoted_leased integer := 0;
    fetched jobhost.jobs[];
    left_available boolean := false;
BEGIN
    archived := '{}';
    freed_jobs := '{}';
    freed_keys := '{}';
    requeued := '{}';
    waiting_jobs := '{}';
    waiting_keys := '{}';
    available_now := false;
    IF cardinality(archive_ids) > 0 THEN
        WITH input AS (
            SELECT *
            FROM unnest(archive_ids, archive_tokens, archive_states, outputs, archive_errors, logs, archive_progress)
                AS i(id, lease_token, state, output, error, log, progress)
        ),
        ended AS (
            DELETE FROM jobhost.jobs j
            USING input i
            WHERE j.id = i.id AND j.lease_token = i.lease_token
            RETURNING j.*
        ),
        moved AS (
            INSERT INTO jobhost.archive
                (id, job, queue, priority, payload, state, attempt, max_attempts, output, errors, log, progress,
                 enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id, unique_key,
                 key_carried)
            SELECT e.id, e.job, e.queue, e.priority, e.payload, i.state, e.attempt, e.max_attempts, i.output,
                   CASE WHEN i.error IS NULL THEN e.errors
                        ELSE e.errors || jsonb_build_array(i.error || jsonb_build_object('at', now())) END,
                   i.log, coalesce(i.progress, e.progress),
                   e.enqueued_at, e.started_at, now(), e.host_id, e.concurrency_key, e.batch_id, e.parent_id,
                   e.unique_key, true
            FROM ended e
            JOIN input i ON i.id = e.id
            RETURNING id, job, concurrency_key
        )
        SELECT coalesce(array_agg(m.id), '{}'),
               coalesce(array_agg(m.job) FILTER (WHERE m.concurrency_key IS NOT NULL), '{}'),
               coalesce(array_agg(m.concurrency_key) FILTER (WHERE m.concurrency_key IS NOT NULL), '{}')
        INTO archived, freed_jobs, freed_keys
        FROM moved m;
    END IF;

    IF cardinality(requeue_ids) > 0 THEN
        WITH input AS (
            SELECT *
            FROM unnest(requeue_ids, requeue_tokens, delays_ms, refunds, requeue_errors, requeue_progress)
                AS i(id, lease_token, delay_ms, refund, error, progress)
        ),
        back AS (
            UPDATE jobhost.jobs j
            SET state = CASE WHEN i.delay_ms > 0 THEN 'scheduled' ELSE 'available' END,
                run_at = now() + i.delay_ms * interval '1 millisecond',
                attempt = j.attempt - i.refund,
                errors = CASE WHEN i.error IS NULL THEN j.errors
                              ELSE j.errors || jsonb_build_array(i.error || jsonb_build_object('at', now())) END,
                progress = coalesce(i.progress, j.progress),
                lease_token = NULL,
                lease_secs = NULL,
                lease_expires_at = NULL,
                host_id = NULL
            FROM input i
            WHERE j.id = i.id AND j.lease_token = i.lease_token
            RETURNING j.id, j.state, j.job, j.concurrency_key
        )
        SELECT coalesce(array_agg(b.id), '{}'),
               coalesce(array_agg(b.job) FILTER (WHERE b.state = 'scheduled' AND b.concurrency_key IS NOT NULL), '{}'),
               coalesce(array_agg(b.concurrency_key) FILTER (WHERE b.state = 'scheduled' AND b.concurrency_key IS NOT NULL),
                        '{}'),
               coalesce(bool_or(b.state = 'available'), false)
        INTO requeued, waiting_jobs, waiting_keys, available_now
        FROM back b;
    END IF;

    IF cardinality(freed_jobs) + cardinality(waiting_jobs) > 0 THEN
        -- What the fetch below would lease of these promotions goes in
        -- leased already; nobody is woken for the rest yet (see
        -- notify_available and 0012).
        IF max_jobs > 0 THEN
            PERFORM set_config('jobhost.promotions_unannounced', 'on', true);
        END IF;
        SELECT r.promoted, r.leased INTO promoted, leased
        FROM jobhost.release_slots_leasing(freed_jobs || waiting_jobs, freed_keys || waiting_keys,
                                           queues, fetch_types, fetch_leases, max_jobs, host) r;
        promoted_leased := cardinality(leased);
        PERFORM set_config('jobhost.promotions_unannounced', '', true);
    END IF;
    IF available_now THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
    written := archived || requeued;
    IF max_jobs > 0 THEN
        IF max_jobs > cardinality(leased) THEN
            SELECT array_agg(f) INTO fetched
            FROM jobhost.fetch(queues, fetch_types, fetch_leases, max_jobs - cardinality(leased), host) f;
            leased := leased || coalesce(fetched, '{}');
        END IF;
        IF promoted > promoted_leased THEN
            -- A promoted job left available (the host's budget was spent, or
            -- the job's queue is one this host does not serve) is announced
            -- now. Any available job on a key this call freed counts: a
            -- needless wake-up costs one empty fetch, a missed one a
            -- promoted job waiting for the next poll.
            SELECT EXISTS (
                SELECT 1 FROM jobhost.jobs j
                JOIN unnest(freed_jobs || waiting_jobs, freed_keys || waiting_keys) AS f(job, key)
                    ON j.job = f.job AND j.concurrency_key = f.key
                WHERE j.state = 'available'
            ) INTO left_available;
            IF left_available THEN
                PERFORM pg_notify('jobhost_available', '');
            END IF;
        END IF;
    ELSE
        left_available := promoted > 0;
    END IF;
    -- Whether the writing host should look for more: only what it did not lease.
    any_available := available_now OR left_available;
    IF cardinality(leased) > 0 THEN
        RETURN QUERY
        SELECT written, any_available, j.id, j.lease_token, j.job, j.queue, j.payload, j.attempt, j.max_attempts,
               j.enqueued_at, j.batch_id, j.concurrency_key, j.lease_secs
        FROM unnest(leased) j;
        RETURN;
    END IF;
    RETURN QUERY SELECT written, any_available, NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::jsonb,
                        NULL::integer, NULL::integer, NULL::timestamptz, NULL::bigint, NULL::text, NULL::integer;
END;
$function$;

CREATE OR REPLACE FUNCTION jobhost.workflow_release(ready bigint[])
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $function$
DECLARE
    max_payload_bytes bigint :=
        coalesce(nullif(current_setting('jobhost.max_payload_bytes', true), '')::bigint, 1048576);
    -- Arrays, not a table: a step discarded by its gate ends inside this
    -- call, and its dependents are released by a nested call.
    releasing jobhost.step_release[];
    gated jobhost.step_release;
    changed_ids bigint[] := '{}';
    changed_verdicts text[] := '{}';
    changed_reasons text[] := '{}';
    claimant bigint;
    ended bigint[];
BEGIN
    WITH candidates AS (
        SELECT s.* FROM jobhost.workflow_steps s
        WHERE s.id = ANY(ready) AND s.pending = 0 AND s.job_id IS NULL
        ORDER BY s.id
        FOR UPDATE
    ),
    judged AS (
        SELECT c.id, c.job, c.queue, c.priority, c.delay_ms, t.config,
               c.payload || CASE WHEN count(d.id) = 0 THEN '{}'::jsonb ELSE jsonb_build_object('_deps',
                   jsonb_object_agg(d.name, CASE WHEN d.ended_state = 'completed' THEN d.result
                                    ELSE jsonb_build_object('state', d.ended_state, 'error', d.result) END)
                   FILTER (WHERE d.id IS NOT NULL)) END
               || CASE WHEN bool_or(d.ended_state <> 'completed') THEN jsonb_build_object('_deps_failed',
                   jsonb_agg(d.name ORDER BY d.id) FILTER (WHERE d.ended_state <> 'completed')) ELSE '{}'::jsonb END
                   AS payload,
               CASE
                   WHEN w.cancelled_at IS NOT NULL THEN 'cancel'
                   WHEN bool_or(d.ended_state <> 'completed' AND e.if_failed = 'fail') THEN 'fail'
                   WHEN bool_or(d.ended_state <> 'completed' AND e.if_failed = 'cancel') THEN 'cancel'
                   ELSE 'run'
               END AS verdict,
               CASE WHEN w.cancelled_at IS NOT NULL THEN 'its workflow was cancelled' ELSE
               string_agg(format('dependency "%s" %s%s', d.name,
                                 CASE d.ended_state WHEN 'failed' THEN 'failed' WHEN 'discarded' THEN 'was discarded'
                                                    ELSE 'was cancelled' END,
                                 CASE WHEN d.result IS NOT NULL AND d.result <> 'null'
                                      THEN ': ' || (d.result #>> '{}') ELSE '' END),
                          '; ' ORDER BY d.id) FILTER (WHERE d.ended_state <> 'completed' AND e.if_failed <> 'run')
               END AS reason
        FROM candidates c
        JOIN jobhost.workflows w ON w.id = c.workflow_id
        LEFT JOIN jobhost.job_types t ON t.name = c.job
        LEFT JOIN jobhost.workflow_edges e ON e.step_id = c.id
        LEFT JOIN jobhost.workflow_steps d ON d.id = e.dep_id
        GROUP BY c.id, c.job, c.queue, c.priority, c.delay_ms, c.payload, t.config, w.cancelled_at
    ),
    checked AS (
        SELECT j.id, j.job, j.queue, j.priority, j.delay_ms, j.payload, j.config,
               CASE WHEN j.verdict <> 'run' THEN j.verdict
                    WHEN j.config IS NULL OR octet_length(j.payload::text) > max_payload_bytes THEN 'fail'
                    ELSE 'run' END AS verdict,
               CASE WHEN j.verdict <> 'run' THEN j.reason
                    WHEN j.config IS NULL
                        THEN format('unknown job type "%s": no host has loaded a component for it', j.job)
                    WHEN octet_length(j.payload::text) > max_payload_bytes
                        THEN format('payload of job "%s" is %s bytes of JSON with its _deps, more than the largest '
                                    'accepted, %s bytes', j.job, octet_length(j.payload::text), max_payload_bytes)
               END AS reason
        FROM judged j
    )
    SELECT coalesce(array_agg(ROW(c.id, nextval('jobhost.job_ids'), c.job, c.queue, c.priority, c.delay_ms,
                                  c.payload, c.verdict, c.reason, c.config)::jobhost.step_release ORDER BY c.id), '{}')
    INTO releasing
    FROM checked c;
    IF cardinality(releasing) = 0 THEN
        RETURN '{}';
    END IF;
    UPDATE jobhost.workflow_steps s SET job_id = r.job_id, released_at = now()
    FROM unnest(releasing) r WHERE s.id = r.id;
    -- Plain types: one insert, no gate to pass, nothing to claim.
    INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, max_attempts, run_at)
    SELECT r.job_id, r.job, coalesce(r.queue, r.config ->> 'queue'),
           coalesce(r.priority, (r.config ->> 'priority')::smallint), r.payload,
           CASE WHEN r.delay_ms > 0 THEN 'scheduled' ELSE 'available' END,
           (r.config ->> 'max_attempts')::integer, now() + r.delay_ms * interval '1 millisecond'
    FROM unnest(releasing) r
    WHERE r.verdict = 'run'
      AND jsonb_typeof(r.config -> 'concurrency') IS DISTINCT FROM 'object'
      AND jsonb_typeof(r.config -> 'unique') IS DISTINCT FROM 'object'
    ORDER BY r.id;
    -- Limited or unique types: the gate and the claim, one step at a time.
    FOREACH gated IN ARRAY releasing LOOP
        CONTINUE WHEN gated.verdict <> 'run'
            OR (jsonb_typeof(gated.config -> 'concurrency') IS DISTINCT FROM 'object'
                AND jsonb_typeof(gated.config -> 'unique') IS DISTINCT FROM 'object');
        BEGIN
            claimant := jobhost.enqueue_as(gated.job_id, gated.job, gated.payload, gated.queue, gated.priority,
                                           now() + gated.delay_ms * interval '1 millisecond');
            IF claimant IS DISTINCT FROM gated.job_id THEN
                changed_ids := changed_ids || gated.id;
                changed_verdicts := changed_verdicts || 'discard'::text;
                changed_reasons := changed_reasons || format('a duplicate of unique job %s', claimant);
            END IF;
        EXCEPTION
            WHEN serialization_failure OR deadlock_detected OR lock_not_available OR query_canceled THEN
                RAISE;
            WHEN OTHERS THEN
                changed_ids := changed_ids || gated.id;
                changed_verdicts := changed_verdicts || 'fail'::text;
                changed_reasons := changed_reasons || SQLERRM;
        END;
    END LOOP;
    IF cardinality(changed_ids) > 0 THEN
        SELECT array_agg(ROW(r.id, r.job_id, r.job, r.queue, r.priority, r.delay_ms, r.payload,
                             coalesce(c.verdict, r.verdict), coalesce(c.reason, r.reason), r.config)::jobhost.step_release
                         ORDER BY r.id)
        INTO releasing
        FROM unnest(releasing) r
        LEFT JOIN unnest(changed_ids, changed_verdicts, changed_reasons) AS c(id, verdict, reason) ON c.id = r.id;
    END IF;
    -- The steps that will not run end now, straight into the archive.
    UPDATE jobhost.workflow_steps s
    SET ended_state = CASE r.verdict WHEN 'fail' THEN 'failed' WHEN 'discard' THEN 'discarded' ELSE 'cancelled' END,
        result = to_jsonb(r.reason), ended_at = now()
    FROM unnest(releasing) r
    WHERE s.id = r.id AND r.verdict <> 'run';
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                 enqueued_at, finished_at, key_carried)
    SELECT r.job_id, r.job, coalesce(r.queue, r.config ->> 'queue', 'default'),
           coalesce(r.priority, (r.config ->> 'priority')::smallint, 0), s.payload, s.ended_state, 0,
           coalesce((r.config ->> 'max_attempts')::integer, 1),
           jsonb_build_array(jsonb_build_object('attempt', 0, 'at', now(), 'error', r.reason)), now(), now(), true
    FROM unnest(releasing) r JOIN jobhost.workflow_steps s ON s.id = r.id
    WHERE r.verdict <> 'run'
    ORDER BY r.id;
    SELECT coalesce(array_agg(r.id ORDER BY r.id), '{}') INTO ended FROM unnest(releasing) r WHERE r.verdict <> 'run';
    RETURN ended;
END;
$function$;

CREATE OR REPLACE FUNCTION jobhost.workflow_step_archive(step jobhost.workflow_steps, state text, reason text)
 RETURNS void
 LANGUAGE sql
AS $function$
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                 enqueued_at, finished_at, key_carried)
    SELECT step.job_id, step.job,
           coalesce(step.queue, t.config ->> 'queue', 'default'),
           coalesce(step.priority, (t.config ->> 'priority')::smallint, 0),
           step.payload, state, 0, coalesce((t.config ->> 'max_attempts')::integer, 1),
           jsonb_build_array(jsonb_build_object('attempt', 0, 'at', now(), 'error', reason)),
           now(), now(), true
    FROM (SELECT 1) one LEFT JOIN jobhost.job_types t ON t.name = step.job
$function$;


-- The archive's trigger (0036), finding claims three ways: an archived row
-- with a key, by the claims' primary key; any archived job, among the
-- unattached claims by its id; and only a row whose statement did not
-- carry the key (a host of the previous release), among the attached
-- claims by a scan. Whether any of these applies is answered with the
-- trigger's other questions, in its one statement.
CREATE OR REPLACE FUNCTION jobhost.archive_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    batch_count bigint;
    waited boolean;
    stepped boolean;
    claimed boolean;
    keyed boolean;
    carried boolean;
    ended text;
    ended_steps bigint[];
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
           EXISTS (SELECT 1 FROM jobhost.workflow_steps s WHERE s.job_id = ANY(a.ids) AND s.ended_state IS NULL),
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
