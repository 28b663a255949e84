-- A write of results that promotes a blocked job its own fetch would lease
-- next inserts that job already leased to the writing host. Before, the
-- promotion inserted it available (a row and its fetch-index entry) and the
-- fetch in the same call leased it at once (a second row version, with
-- entries in the running indexes): on a limited key that is one update per
-- hand-off, and on two cores the hand-off waits for it.
--
-- Fetch order is kept exactly: a promoted job is leased in its insert only
-- when the fetch would have leased it, that is when fewer than max_jobs of
-- the available jobs this host serves come before it (priority, then run
-- time, then id; a promoted job becomes available now, so it comes after
-- every available job of its priority, which this counts conservatively).
-- The fetch then leases what budget is left, which covers every available
-- job ahead of those. A promoted job with a while_executing unique key is
-- left to the fetch, which takes its claim.

-- The priorities of the first max_jobs available jobs a fetch of these
-- queues and job types would read, locked by others or not (so a promotion
-- placed after them errs toward the fetch). The plan is pinned as the
-- fetch's is: an ordered read of jobs_fetch, never a sort of every
-- available job.
CREATE FUNCTION jobhost.fetch_ahead(queues text[], job_types text[], max_jobs bigint)
RETURNS SETOF smallint
LANGUAGE sql STABLE
SET enable_sort = off
AS $$
    SELECT j.priority FROM jobhost.jobs j
    WHERE j.state = 'available' AND j.queue = ANY(queues) AND j.job = ANY(job_types)
    ORDER BY j.priority, j.run_at, j.id
    LIMIT max_jobs
$$;

-- Slots given back (first in 0004_concurrency as release_slots, which now
-- calls this). With max_jobs > 0, the promoted jobs the writing host's
-- fetch would lease first go in running, leased to host for their type's
-- lease; they are returned in leased, and their number is counted in
-- promoted like every promotion.
CREATE FUNCTION jobhost.release_slots_leasing(
    job_types text[], slot_keys text[],
    queues text[], fetch_types text[], fetch_leases integer[], max_jobs bigint, host text,
    OUT promoted integer, OUT leased jobhost.jobs[]
)
LANGUAGE plpgsql AS $$
DECLARE
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
    servable AS (
        SELECT m.*, s.lease_secs AS lease_for,
               s.lease_secs IS NOT NULL AND m.queue = ANY(queues)
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
             concurrency_key, batch_id, parent_id, errors, progress,
             lease_token, lease_secs, lease_expires_at, host_id)
        SELECT p.id, p.job, p.queue, p.priority, p.payload,
               CASE WHEN p.lease THEN 'running' ELSE 'available' END,
               p.attempt + CASE WHEN p.lease THEN 1 ELSE 0 END, p.max_attempts, now(),
               p.enqueued_at, CASE WHEN p.lease THEN now() ELSE p.started_at END,
               p.concurrency_key, p.batch_id, p.parent_id, p.errors, p.progress,
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
    SELECT count(*)::integer, coalesce(array_agg(i.j) FILTER (WHERE (i.j).state = 'running'), '{}')
    INTO promoted, leased
    FROM inserted i;

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
END;
$$;

-- Every other caller gives slots back without leasing (first in 0004).
CREATE OR REPLACE FUNCTION jobhost.release_slots(job_types text[], slot_keys text[]) RETURNS integer
LANGUAGE sql AS $$
    SELECT r.promoted FROM jobhost.release_slots_leasing(job_types, slot_keys, '{}', '{}', '{}', 0, '') r;
$$;

-- jobhost.finish_runs (first in 0004_concurrency, then 0012), now leasing
-- promotions in their insert and fetching only for the budget they leave.
-- The rest is unchanged: see 0004 for what it writes, locks and returns,
-- and 0012 for what it announces.
CREATE OR REPLACE FUNCTION jobhost.finish_runs(
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
$$;
