-- Per-key concurrency limits: semaphores, parked jobs, and the gate that
-- every path to "runnable" goes through (a new enqueue, a delayed or
-- retrying job that has come due, the promotion of a parked job).
--
-- The invariant everything here keeps: a job with a concurrency key holds
-- one slot of its (job, key) semaphore exactly while it is in jobhost.jobs
-- as 'available' or 'running'. So a slot is taken only together with that
-- state change and given back only by the transaction that moves the job
-- out of it (to the archive, or back to 'scheduled' to wait).
--
-- Lock order, so transactions do not deadlock: job rows first, then
-- semaphore rows in (job, key) order. Parked rows are only ever locked with
-- SKIP LOCKED, so they never make anyone wait. Two paths take semaphores in
-- two ordered passes and may, rarely, deadlock with another transaction; the
-- server then aborts one, and a worker retries an aborted write (SQLSTATE
-- class 40 is not a refusal): a completion that also enqueues limited
-- children, and a release that meets a semaphore row deleted by hand.

-- One row per (job type, key) with slots taken; deleted when the last is given back.
CREATE TABLE jobhost.semaphores (
    job        text        NOT NULL,
    key        text        NOT NULL,
    holders    integer     NOT NULL CHECK (holders >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job, key)
);

-- Jobs waiting for a slot of their key. Nothing expires them: the only ways
-- out are promotion and an operator's cancel.
CREATE TABLE jobhost.blocked_jobs (
    id              bigint PRIMARY KEY,
    job             text        NOT NULL,
    queue           text        NOT NULL,
    priority        smallint    NOT NULL,
    payload         jsonb       NOT NULL,
    attempt         integer     NOT NULL,
    max_attempts    integer     NOT NULL,
    enqueued_at     timestamptz NOT NULL,
    started_at      timestamptz,
    concurrency_key text        NOT NULL,
    batch_id        bigint,
    parent_id       bigint,
    errors          jsonb       NOT NULL,
    progress        jsonb,
    parked_at       timestamptz NOT NULL DEFAULT now()
);

-- Promotion order within a key: highest priority (lowest number) first, then oldest.
CREATE INDEX blocked_jobs_next ON jobhost.blocked_jobs (job, concurrency_key, priority, parked_at, id);

-- The repair sweep counts the live holders of every key.
CREATE INDEX jobs_holders ON jobhost.jobs (job, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND state IN ('available', 'running');

-- A job type's current limit; unlimited (the largest integer) when the
-- type no longer declares one, so jobs keyed under an old version still
-- count their slots but are never held back.
CREATE FUNCTION jobhost.slot_limit(job_type text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT (t.config -> 'concurrency' ->> 'limit')::integer FROM jobhost.job_types t WHERE t.name = job_type),
        2147483647)
$$;

-- Takes one of slot_limit slots of (job, key) by a guarded upsert and
-- returns true, or returns false when all are taken. Either way the row stays
-- locked until the caller commits (ON CONFLICT DO UPDATE locks the row even
-- when its WHERE is false). The sweep's promotions, one job at a time, use it.
CREATE FUNCTION jobhost.take_slot(job_type text, slot_key text, slot_limit integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    taken boolean;
BEGIN
    INSERT INTO jobhost.semaphores AS s (job, key, holders) VALUES (job_type, slot_key, 1)
    ON CONFLICT (job, key) DO UPDATE SET holders = s.holders + 1, updated_at = now()
    WHERE s.holders < slot_limit
    RETURNING true INTO taken;
    RETURN coalesce(taken, false);
END;
$$;

-- Moves jobs from jobhost.jobs to the parked table, keeping each payload
-- document as it is.
CREATE FUNCTION jobhost.park(job_ids bigint[]) RETURNS void
LANGUAGE sql AS $$
    WITH moved AS (DELETE FROM jobhost.jobs WHERE id = ANY(job_ids) RETURNING *)
    INSERT INTO jobhost.blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
                                      started_at, concurrency_key, batch_id, parent_id, errors, progress)
    SELECT id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
           started_at, concurrency_key, batch_id, parent_id, errors, progress
    FROM moved
$$;

-- Moves jobs from jobhost.jobs to the archive as discarded, noting why.
CREATE FUNCTION jobhost.discard(job_ids bigint[], reason text) RETURNS void
LANGUAGE sql AS $$
    WITH moved AS (DELETE FROM jobhost.jobs WHERE id = ANY(job_ids) RETURNING *)
    INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                                 enqueued_at, started_at, finished_at, concurrency_key, batch_id, parent_id)
    SELECT id, job, queue, priority, payload, 'discarded', attempt, max_attempts,
           errors || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', now(), 'error', reason)),
           progress, enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id
    FROM moved
$$;

-- THE GATE. Decides the jobs (rows of jobhost.jobs, new or come due) that
-- are to become runnable now. A job without a key becomes available. For
-- each key, in (job, key) order so concurrent gates never deadlock: an
-- upsert locks the key's semaphore row (creating it if need be) and holds
-- it until the caller commits, so a holder giving its slot back at this
-- moment waits, and then sees whatever this gate parked; the key's free
-- slots (limit minus holders) go to its jobs in priority then arrival
-- order, by a guarded update (holders + taken <= limit); the rest meet the
-- type's on_conflict: 'block' parks them, 'discard' archives them as
-- discarded, 'raise' aborts the caller's transaction with SQLSTATE JHL01
-- when an enqueuer is waiting for the answer (enqueuer_waiting), and
-- discards them otherwise (a delayed job coming due has nobody to tell).
-- Returns how many jobs became available.
CREATE FUNCTION jobhost.admit(job_ids bigint[], enqueuer_waiting boolean) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    k record;
    slot_limit integer;
    held integer;
    taken integer;
    guarded integer;
    on_conflict text;
    reason text;
    admitted integer;
    refused bigint[];
BEGIN
    UPDATE jobhost.jobs SET state = 'available'
    WHERE id = ANY(job_ids) AND concurrency_key IS NULL AND state <> 'available';
    SELECT count(*) INTO admitted FROM jobhost.jobs WHERE id = ANY(job_ids) AND concurrency_key IS NULL;
    FOR k IN
        SELECT j.job, j.concurrency_key AS key,
               array_agg(j.id ORDER BY j.priority, j.run_at, j.id) AS ids
        FROM jobhost.jobs j
        WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL
        GROUP BY 1, 2
        ORDER BY 1, 2
    LOOP
        slot_limit := jobhost.slot_limit(k.job);
        INSERT INTO jobhost.semaphores AS s (job, key, holders) VALUES (k.job, k.key, 0)
        ON CONFLICT (job, key) DO UPDATE SET updated_at = now()
        RETURNING s.holders INTO held;
        taken := least(greatest(slot_limit - held, 0), cardinality(k.ids));
        IF taken > 0 THEN
            UPDATE jobhost.semaphores s SET holders = s.holders + taken
            WHERE s.job = k.job AND s.key = k.key AND s.holders + taken <= slot_limit;
            GET DIAGNOSTICS guarded = ROW_COUNT;
            IF guarded <> 1 THEN
                RAISE EXCEPTION 'semaphore of key "%" changed under its lock', k.key;
            END IF;
            UPDATE jobhost.jobs SET state = 'available' WHERE id = ANY(k.ids[1:taken]) AND state <> 'available';
            admitted := admitted + taken;
        ELSIF held = 0 THEN
            -- Only with a corrupt limit below 1; the row this gate created goes.
            DELETE FROM jobhost.semaphores s WHERE s.job = k.job AND s.key = k.key AND s.holders = 0;
        END IF;
        CONTINUE WHEN taken = cardinality(k.ids);
        refused := k.ids[taken + 1:];
        SELECT coalesce(t.config -> 'concurrency' ->> 'on_conflict', 'block') INTO on_conflict
        FROM jobhost.job_types t WHERE t.name = k.job;
        reason := format('concurrency limit reached: all %s slots of key "%s" are taken', slot_limit, k.key);
        IF on_conflict = 'raise' AND enqueuer_waiting THEN
            RAISE EXCEPTION 'job "%" refused: %', k.job, reason USING ERRCODE = 'JHL01';
        ELSIF on_conflict IN ('discard', 'raise') THEN
            PERFORM jobhost.discard(refused, reason);
        ELSE
            PERFORM jobhost.park(refused);
        END IF;
    END LOOP;
    RETURN admitted;
END;
$$;

-- Promotes parked jobs of one key while it has free slots, highest priority
-- then oldest first, each taking its slot through take_slot (so a promotion
-- can never over-admit). A parked row locked by someone else (an operator's
-- cancel, another promotion) is skipped, never waited for. Returns how many moved.
CREATE FUNCTION jobhost.promote_parked(job_type text, slot_key text) RETURNS integer
LANGUAGE plpgsql AS $$
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
                                  enqueued_at, started_at, concurrency_key, batch_id, parent_id, errors, progress)
        SELECT id, job, queue, priority, payload, 'available', attempt, max_attempts, now(),
               enqueued_at, started_at, concurrency_key, batch_id, parent_id, errors, progress
        FROM p;
        moved := moved + 1;
    END LOOP;
    RETURN moved;
END;
$$;

-- Gives back one slot per (job, key) pair listed (a pair listed twice gives
-- two), and in the same transaction hands the freed slots to parked jobs,
-- set-based for the whole batch:
--   1. lock the keys' semaphore rows, in (job, key) order, so concurrent
--      releases never deadlock; a gate holding a row (it may be parking a
--      job) is waited for;
--   2. in a later statement, whose snapshot therefore sees every job such a
--      gate parked, count each key's free slots under that lock (limit minus
--      the holders that remain) and move at most that many parked jobs per
--      key, highest priority then oldest, to available; parked rows locked
--      by someone else are skipped, never waited for. The holder count is
--      set in the same statement, so a promotion never over-admits;
--   3. delete the rows left with no holders.
-- A key whose row is missing (deleted by hand) is promoted through
-- take_slot, one job at a time. Returns how many parked jobs were promoted.
CREATE FUNCTION jobhost.release_slots(job_types text[], slot_keys text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    promoted integer;
    orphan record;
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
               greatest(jobhost.slot_limit(s.job) - greatest(s.holders - f.n, 0), 0) AS free
        FROM jobhost.semaphores s
        JOIN freed f ON f.job = s.job AND f.key = s.key
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
    inserted AS (
        INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, attempt, max_attempts, run_at,
                                  enqueued_at, started_at, concurrency_key, batch_id, parent_id, errors, progress)
        SELECT id, job, queue, priority, payload, 'available', attempt, max_attempts, now(),
               enqueued_at, started_at, concurrency_key, batch_id, parent_id, errors, progress
        FROM moved
        RETURNING job, concurrency_key
    ),
    taken AS (
        SELECT i.job, i.concurrency_key AS key, count(*)::integer AS n FROM inserted i GROUP BY 1, 2
    ),
    counted AS (
        -- Runs whether or not it is read, like every data-modifying WITH.
        UPDATE jobhost.semaphores s
        SET holders = greatest(s.holders - r.n, 0) + coalesce(t.n, 0), updated_at = now()
        FROM room r
        LEFT JOIN taken t ON t.job = r.job AND t.key = r.key
        WHERE s.job = r.job AND s.key = r.key
    )
    SELECT count(*)::integer INTO promoted FROM inserted;

    DELETE FROM jobhost.semaphores s
    USING unnest(job_types, slot_keys) AS t(job, key)
    WHERE s.job = t.job AND s.key = t.key AND s.holders = 0;

    FOR orphan IN
        SELECT DISTINCT t.job, t.key FROM unnest(job_types, slot_keys) AS t(job, key)
        WHERE t.key IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM jobhost.semaphores s WHERE s.job = t.job AND s.key = t.key)
        ORDER BY 1, 2
    LOOP
        promoted := promoted + jobhost.promote_parked(orphan.job, orphan.key);
    END LOOP;
    RETURN promoted;
END;
$$;

-- Keys that have parked jobs and could take a slot now (no semaphore row,
-- or fewer holders than the limit), oldest parked job first. The sweep
-- promotes these, so a crowd of keys whose slots are all busy is never read
-- past the parked table's grouping and cannot starve a key with a free slot.
CREATE FUNCTION jobhost.promotable_keys(max_keys integer)
RETURNS TABLE (job text, key text)
LANGUAGE sql STABLE AS $$
    SELECT b.job, b.concurrency_key
    FROM jobhost.blocked_jobs b
    LEFT JOIN jobhost.semaphores s ON s.job = b.job AND s.key = b.concurrency_key
    WHERE s.job IS NULL OR s.holders < jobhost.slot_limit(b.job)
    GROUP BY b.job, b.concurrency_key
    ORDER BY min(b.parked_at)
    LIMIT max_keys
$$;

-- Sets each semaphore's holder count to the number of live jobs that hold
-- its slots, where the two disagree (after rows were changed or deleted by
-- hand), and recreates missing rows. Rows in use right now are skipped and
-- checked on the next pass: whoever holds one is changing it consistently.
-- Returns what it changed.
CREATE FUNCTION jobhost.repair_semaphores()
RETURNS TABLE (job text, key text, recorded integer, actual integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    locked_jobs text[];
    locked_keys text[];
BEGIN
    -- Locking first, then counting in later statements (which see every
    -- commit made before the locks were granted) keeps the count exact.
    SELECT array_agg(l.job), array_agg(l.key) INTO locked_jobs, locked_keys
    FROM (SELECT s.job, s.key FROM jobhost.semaphores s ORDER BY s.job, s.key FOR UPDATE SKIP LOCKED) l;
    RETURN QUERY
    WITH fixes AS (
        SELECT s.job, s.key, s.holders AS recorded, coalesce(live.n, 0)::integer AS actual
        FROM jobhost.semaphores s
        JOIN unnest(locked_jobs, locked_keys) AS k(job, key) ON k.job = s.job AND k.key = s.key
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM jobhost.jobs j
            WHERE j.job = s.job AND j.concurrency_key = s.key AND j.state IN ('available', 'running')
        ) live
        WHERE s.holders <> live.n
    ),
    fixed AS (
        UPDATE jobhost.semaphores s SET holders = f.actual, updated_at = now()
        FROM fixes f WHERE s.job = f.job AND s.key = f.key
        RETURNING s.job
    )
    SELECT f.job, f.key, f.recorded, f.actual FROM fixes f;
    -- Holders whose row is gone get a row with their count. A gate creating
    -- the same row at this moment wins (DO NOTHING); the next pass checks it.
    RETURN QUERY
    WITH live AS (
        SELECT j.job, j.concurrency_key AS key, count(*)::integer AS n
        FROM jobhost.jobs j
        WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
          AND NOT EXISTS (SELECT 1 FROM jobhost.semaphores s WHERE s.job = j.job AND s.key = j.concurrency_key)
        GROUP BY 1, 2
    ),
    created AS (
        INSERT INTO jobhost.semaphores AS s (job, key, holders)
        SELECT live.job, live.key, live.n FROM live
        ON CONFLICT DO NOTHING
        RETURNING s.job, s.key, s.holders
    )
    SELECT c.job, c.key, 0, c.holders FROM created c;
END;
$$;

-- Scheduled jobs that have come due pass the gate. Locks: the due rows,
-- SKIP LOCKED, so concurrent sweeps split them; then their semaphores in order.
CREATE FUNCTION jobhost.promote_due(due_by timestamptz, max_jobs integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    due_ids bigint[];
    admitted integer;
BEGIN
    SELECT array_agg(d.id) INTO due_ids FROM (
        SELECT id FROM jobhost.jobs
        WHERE state = 'scheduled' AND run_at <= due_by
        ORDER BY run_at
        LIMIT max_jobs
        FOR UPDATE SKIP LOCKED
    ) d;
    IF due_ids IS NULL THEN
        RETURN 0;
    END IF;
    admitted := jobhost.admit(due_ids, false);
    IF admitted > 0 THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
    RETURN cardinality(due_ids);
END;
$$;

-- The SQL enqueue goes through the same gate as every other.
CREATE OR REPLACE FUNCTION jobhost.enqueue(
    job text,
    payload jsonb,
    queue text DEFAULT NULL,
    priority smallint DEFAULT NULL,
    run_at timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    config jsonb;
    new_id bigint;
    due timestamptz := greatest(coalesce(run_at, now()), now());
    chosen_queue text;
BEGIN
    SELECT t.config INTO config FROM jobhost.job_types t WHERE t.name = job;
    IF config IS NULL THEN
        RAISE EXCEPTION 'unknown job type "%": no host has loaded a component for it', job USING ERRCODE = '22023';
    END IF;
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION 'payload of job "%" must be a JSON object', job USING ERRCODE = '22023';
    END IF;
    chosen_queue := coalesce(queue, config ->> 'queue');
    IF chosen_queue !~ '^[a-z0-9_.-]{1,128}$' THEN
        RAISE EXCEPTION 'queue "%" must be 1 to 128 characters of a-z, 0-9, _, . and -', chosen_queue
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO jobhost.jobs (job, queue, priority, payload, state, max_attempts, run_at, concurrency_key)
    VALUES (
        job,
        chosen_queue,
        coalesce(priority, (config ->> 'priority')::smallint),
        payload,
        CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END,
        (config ->> 'max_attempts')::integer,
        due,
        CASE WHEN jsonb_typeof(config -> 'concurrency') = 'object'
             THEN jobhost.render_key(config -> 'concurrency' ->> 'key', payload) END
    )
    RETURNING id INTO new_id;
    IF due <= now() THEN
        PERFORM jobhost.admit(ARRAY[new_id], true);
    END IF;
    RETURN new_id;
END;
$$;

-- Writes a batch of finished runs in one statement: the ones that end for
-- good go to the archive, the others back to wait (scheduled after a
-- backoff or snooze, available at once for a hand-back). Every row matches
-- on (id, lease token); a token that changed (another host owns the job
-- now) matches nothing and touches nothing (guarantee 5). Slots of jobs that
-- ended or went back to wait are given back, and parked jobs promoted into
-- them, in the same transaction (guarantees 1, 4 and 7); a job available
-- again at once keeps its slot. Locks: the matched job rows, then their
-- semaphores in order.
--
-- Then, when max_jobs > 0, it leases up to max_jobs available jobs to the
-- writing host as jobhost.fetch does: the jobs its finished runs made room
-- for (a parked job promoted into a freed slot among them) start without
-- another round trip. Returns one row per leased job, or a single row of
-- NULL job columns when none was; every row carries the ids written and
-- whether any job became available (a requeue or a promotion), for waking
-- idle hosts.
CREATE FUNCTION jobhost.finish_runs(
    archive_ids bigint[], archive_tokens bigint[], archive_states text[], outputs jsonb[], archive_errors jsonb[],
    logs jsonb[], archive_progress jsonb[],
    requeue_ids bigint[], requeue_tokens bigint[], delays_ms bigint[], refunds integer[], requeue_errors jsonb[],
    requeue_progress jsonb[],
    queues text[] DEFAULT '{}', fetch_types text[] DEFAULT '{}', fetch_leases integer[] DEFAULT '{}',
    max_jobs bigint DEFAULT 0, host text DEFAULT ''
)
RETURNS TABLE (
    written bigint[], any_available boolean, id bigint, lease_token bigint, job text, queue text, payload jsonb,
    attempt integer, max_attempts integer, enqueued_at timestamptz, batch_id bigint, concurrency_key text,
    lease_secs integer
)
LANGUAGE plpgsql AS $$
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
                 enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id)
            SELECT e.id, e.job, e.queue, e.priority, e.payload, i.state, e.attempt, e.max_attempts, i.output,
                   CASE WHEN i.error IS NULL THEN e.errors
                        ELSE e.errors || jsonb_build_array(i.error || jsonb_build_object('at', now())) END,
                   i.log, coalesce(i.progress, e.progress),
                   e.enqueued_at, e.started_at, now(), e.host_id, e.concurrency_key, e.batch_id, e.parent_id
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
        promoted := jobhost.release_slots(freed_jobs || waiting_jobs, freed_keys || waiting_keys);
    END IF;
    IF available_now THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
    written := archived || requeued;
    any_available := available_now OR promoted > 0;
    IF max_jobs > 0 THEN
        RETURN QUERY
        SELECT written, any_available, j.id, j.lease_token, j.job, j.queue, j.payload, j.attempt, j.max_attempts,
               j.enqueued_at, j.batch_id, j.concurrency_key, j.lease_secs
        FROM jobhost.fetch(queues, fetch_types, fetch_leases, max_jobs, host) j;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT written, any_available, NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::jsonb,
                        NULL::integer, NULL::integer, NULL::timestamptz, NULL::bigint, NULL::text, NULL::integer;
END;
$$;
