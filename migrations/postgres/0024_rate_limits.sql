-- Rate limits (docs/rate-limits.md, guarantee 15): at most `limit` runs of
-- one key start in any window of `period`, by the database's clock. A start
-- is a lease handed to a host, so the check sits where leases are made:
-- jobhost.fetch. A job the fetch picks but cannot start now goes back to
-- wait (scheduled, its attempt untouched, its concurrency slot given back)
-- until the instant a start frees up for it, and every host is told so
-- (`jobhost_due`), so no host polls for it.
--
-- A key's row holds its latest starts, oldest first, at most `limit` of
-- them: the window. Fetches of one key serialize on that row (job rows,
-- then rate keys in (job, key) order, then semaphores: the lock order of
-- 0016_lock_order with rate keys between job rows and semaphores). A
-- throttle (a run told "slow down" by the service it called) holds the
-- whole key until `throttled_until`, for types with a rate limit or
-- without; its key is the rate key, else the concurrency key, else the
-- job name.

CREATE TABLE jobhost.rate_keys (
    job             text        NOT NULL,
    key             text        NOT NULL,
    -- The key's latest starts, oldest first; at most the type's limit.
    starts          timestamptz[] NOT NULL DEFAULT '{}',
    -- When the key's latest enqueued jobs may start (ms since the epoch,
    -- the database's clock), at most `limit` of them: an enqueue plans its
    -- jobs after these, so a backlog waits scheduled over the coming
    -- windows instead of filling the fetch order ahead of other keys.
    planned         bigint[]    NOT NULL DEFAULT '{}',
    -- No run of the key starts before this.
    throttled_until timestamptz,
    -- How many throttles the key has had, and jobs sent back to wait.
    throttles       bigint      NOT NULL DEFAULT 0,
    deferred        bigint      NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job, key)
);
CREATE INDEX rate_keys_throttled ON jobhost.rate_keys (job, throttled_until) WHERE throttled_until IS NOT NULL;

-- Whether a job type's starts are counted: it declares a rate limit, or
-- one of its keys is throttled now.
CREATE FUNCTION jobhost.rate_governed(job_type text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = job_type AND t.config ? 'rate_limit')
        OR EXISTS (SELECT 1 FROM jobhost.rate_keys r
                   WHERE r.job = job_type AND r.throttled_until IS NOT NULL AND r.throttled_until > now())
$$;

-- Whether a key template renders from a payload: every placeholder names
-- a top-level field holding a string, number or boolean (as
-- jobhost.render_key needs, which raises otherwise). Plain SQL, so asking
-- costs no subtransaction, as an exception handler would on every call.
CREATE FUNCTION jobhost.key_renders(template text, payload jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT jsonb_typeof(payload) = 'object'
       AND NOT EXISTS (
           SELECT 1
           FROM regexp_matches(replace(replace(template, '{{', ''), '}}', ''), '\{([^{}]*)\}', 'g') AS m(field)
           WHERE coalesce(jsonb_typeof(payload -> m.field[1]), 'null') NOT IN ('string', 'number', 'boolean'))
$$;

-- The key a job's starts are counted under: its rate key, rendered from
-- its payload, when its type has a rate limit; else its concurrency key;
-- else its type. A payload that no longer renders the template (an SQL
-- enqueue does not check it; the host's enqueue does) counts under the
-- job name, so it is limited with the type as a whole, never unlimited.
CREATE FUNCTION jobhost.rate_key(config jsonb, job_type text, payload jsonb, concurrency_key text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT config ? 'rate_limit' THEN coalesce(concurrency_key, job_type)
        WHEN jobhost.key_renders(config -> 'rate_limit' ->> 'key', payload)
            THEN jobhost.render_key(config -> 'rate_limit' ->> 'key', payload)
        ELSE job_type
    END
$$;

-- Of the jobs a fetch picked (their rows locked), starts those whose key
-- has room now, in fetch order, recording each start in its key's window,
-- and sends the others back to wait: returns their ids. The q-th job of a
-- key that cannot start is scheduled for the instant its start frees up
-- if the starts already made run on time (the oldest start in the window
-- plus the period, then the next, cycling), never before a throttle ends.
-- Set-based: a handful of statements however many keys the fetch met.
-- A key whose row another transaction holds (another fetch of it, an
-- application's open transaction) is passed over with SKIP LOCKED: its
-- jobs are neither started nor sent back, only left available for a later
-- fetch, so a held key never stalls a fetch (guarantee 13). The ids
-- returned are every picked job not to lease: sent back or passed over.
CREATE FUNCTION jobhost.rate_start(picked bigint[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    types text[];
    keys text[];
    limits bigint[];
    periods interval[];
    ranks bigint[];
    sent_back bigint[];
    freed_types text[];
    freed_keys text[];
    locked_types text[];
    locked_keys text[];
    passed_over bigint[];
BEGIN
    -- The governed jobs among those picked, with their keys and their
    -- rank within their key in fetch order. Of a type without a rate
    -- limit, only a throttled key's jobs are governed.
    SELECT array_agg(c.id), array_agg(c.job), array_agg(c.key), array_agg(c.lim), array_agg(c.period),
           array_agg(c.rank)
    INTO ids, types, keys, limits, periods, ranks
    FROM (
        SELECT g.*, row_number() OVER (PARTITION BY g.job, g.key ORDER BY g.priority, g.run_at, g.id) AS rank
        FROM (
            SELECT j.id, j.job, j.priority, j.run_at,
                   jobhost.rate_key(t.config, j.job, j.payload, j.concurrency_key) AS key,
                   (t.config -> 'rate_limit' ->> 'limit')::bigint AS lim,
                   (t.config -> 'rate_limit' ->> 'period_ms')::bigint * interval '1 millisecond' AS period
            FROM unnest(picked) AS p(id)
            JOIN jobhost.jobs j ON j.id = p.id
            JOIN jobhost.job_types t ON t.name = j.job
        ) g
        WHERE g.lim IS NOT NULL
           OR EXISTS (SELECT 1 FROM jobhost.rate_keys r
                      WHERE r.job = g.job AND r.key = g.key AND r.throttled_until > now())
    ) c;
    IF ids IS NULL THEN
        RETURN '{}';
    END IF;

    -- The keys' rows, created if new, then locked in (job, key) order,
    -- passing over those another transaction holds.
    INSERT INTO jobhost.rate_keys (job, key)
    SELECT DISTINCT u.job, u.key FROM unnest(types, keys) AS u(job, key) ORDER BY 1, 2
    ON CONFLICT DO NOTHING;
    SELECT array_agg(l.job), array_agg(l.key) INTO locked_types, locked_keys
    FROM (
        SELECT r.job, r.key FROM jobhost.rate_keys r
        WHERE (r.job, r.key) IN (SELECT u.job, u.key FROM unnest(types, keys) AS u(job, key))
        ORDER BY r.job, r.key
        FOR UPDATE SKIP LOCKED
    ) l;
    SELECT coalesce(array_agg(c.id), '{}') INTO passed_over
    FROM unnest(ids, types, keys) AS c(id, job, key)
    WHERE (c.job, c.key) NOT IN (SELECT * FROM unnest(coalesce(locked_types, '{}'), coalesce(locked_keys, '{}')));

    WITH candidates AS (
        SELECT c.* FROM unnest(ids, types, keys, limits, periods, ranks) AS c(id, job, key, lim, period, rank)
        WHERE (c.job, c.key) IN (SELECT * FROM unnest(locked_types, locked_keys))
    ),
    wanted AS (
        SELECT c.job, c.key, max(c.lim) AS lim, max(c.period) AS period, count(*) AS n
        FROM candidates c GROUP BY 1, 2
    ),
    windows AS (
        SELECT w.job, w.key, w.lim, w.period, w.n, r.deferred,
               array(SELECT s FROM unnest(r.starts) AS s
                     WHERE s > now() - coalesce(w.period, interval '0') ORDER BY s) AS recent,
               CASE WHEN r.throttled_until > now() THEN r.throttled_until END AS until,
               r.starts AS stored
        FROM wanted w
        JOIN jobhost.rate_keys r ON r.job = w.job AND r.key = w.key
    ),
    decided AS (
        SELECT d.*,
               CASE WHEN d.lim IS NULL THEN d.stored ELSE d.recent || array_fill(now(), ARRAY[d.started::integer]) END
                   AS after
        FROM (
            SELECT w.*,
                   CASE WHEN w.until IS NOT NULL THEN 0
                        WHEN w.lim IS NULL THEN w.n
                        ELSE least(greatest(w.lim - cardinality(w.recent), 0), w.n) END AS started
            FROM windows w
        ) d
    ),
    counted AS (
        UPDATE jobhost.rate_keys r
        SET starts = d.after, throttled_until = d.until, deferred = d.deferred + (d.n - d.started), updated_at = now()
        FROM decided d
        WHERE r.job = d.job AND r.key = d.key
    ),
    waiting AS (
        SELECT c.id,
               greatest(
                   coalesce(d.until, now()),
                   CASE WHEN d.lim IS NULL THEN now()
                        WHEN cardinality(d.after) + (c.rank - d.started) - d.lim <= 0 THEN now()
                        ELSE coalesce(d.after[(((cardinality(d.after) + (c.rank - d.started) - d.lim - 1) % d.lim) + 1)::integer],
                                      now())
                             + d.period * (1 + (cardinality(d.after) + (c.rank - d.started) - d.lim - 1) / d.lim)
                   END) AS at
        FROM candidates c
        JOIN decided d ON d.job = c.job AND d.key = c.key
        WHERE c.rank > d.started
    ),
    moved AS (
        UPDATE jobhost.jobs j SET state = 'scheduled', run_at = w.at
        FROM waiting w
        WHERE j.id = w.id
        RETURNING j.id, j.job, j.concurrency_key
    )
    SELECT coalesce(array_agg(m.id), '{}'),
           array_agg(m.job ORDER BY m.job, m.concurrency_key) FILTER (WHERE m.concurrency_key IS NOT NULL),
           array_agg(m.concurrency_key ORDER BY m.job, m.concurrency_key) FILTER (WHERE m.concurrency_key IS NOT NULL)
    INTO sent_back, freed_types, freed_keys
    FROM moved m;

    IF cardinality(sent_back) > 0 THEN
        -- A waiting job holds no slot (guarantee 7); the semaphores come
        -- after every rate key in the lock order.
        IF freed_types IS NOT NULL THEN
            PERFORM jobhost.release_slots(freed_types, freed_keys);
        END IF;
        PERFORM pg_notify('jobhost_due', '');
    END IF;
    RETURN sent_back || passed_over;
END;
$$;

-- The fetch (first in 0003_fetch_function, then 0007_uniqueness): the jobs
-- it picks pass the rate check first when a type it serves is rate
-- governed; those sent back to wait are not leased.
CREATE OR REPLACE FUNCTION jobhost.fetch(
    queues text[],
    job_types text[],
    lease_secs integer[],
    max_jobs bigint,
    host text
) RETURNS SETOF jobhost.jobs
LANGUAGE plpgsql
SET enable_sort = off
SET jit = off
AS $$
DECLARE
    chosen bigint[];
    sent_back bigint[] := '{}';
BEGIN
    SELECT coalesce(array_agg(c.id), '{}') INTO chosen
    FROM (
        SELECT j.id
        FROM jobhost.jobs j
        WHERE j.state = 'available'
          AND j.queue = ANY(queues)
          AND j.job = ANY(job_types)
          AND NOT EXISTS (
              SELECT 1
              FROM jobhost.unique_keys k
              JOIN jobhost.unique_claims c ON c.job = k.job AND c.unique_key = k.unique_key
              WHERE k.job_id = j.id AND k.while_executing)
        ORDER BY j.priority, j.run_at, j.id
        LIMIT max_jobs
        FOR UPDATE OF j SKIP LOCKED
    ) c;
    IF cardinality(chosen) = 0 THEN
        RETURN;
    END IF;
    -- Two index probes, whatever the number of types served.
    IF EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = ANY(job_types) AND t.config ? 'rate_limit')
       OR EXISTS (SELECT 1 FROM jobhost.rate_keys r
                  WHERE r.job = ANY(job_types) AND r.throttled_until IS NOT NULL AND r.throttled_until > now()) THEN
        sent_back := jobhost.rate_start(chosen);
    END IF;

    RETURN QUERY
    WITH picked AS (
        SELECT j.id, j.job FROM jobhost.jobs j
        WHERE j.id = ANY(chosen) AND NOT j.id = ANY(sent_back)
    ),
    tokens AS (
        SELECT p.id, p.job, nextval('jobhost.lease_tokens') AS token FROM picked p
    ),
    exclusive AS (
        SELECT t.id, t.token, k.job, k.unique_key
        FROM tokens t
        JOIN jobhost.unique_keys k ON k.job_id = t.id AND k.while_executing
    ),
    claimed AS (
        INSERT INTO jobhost.unique_claims (job, unique_key, job_id, lease_token)
        SELECT e.job, e.unique_key, e.id, e.token FROM exclusive e
        ORDER BY e.job, e.unique_key, e.id
        ON CONFLICT DO NOTHING
        RETURNING job_id
    ),
    leases AS (
        SELECT t.id, t.token, s.lease_secs
        FROM tokens t
        JOIN unnest(job_types, lease_secs) AS s(job, lease_secs) ON s.job = t.job
        WHERE t.id NOT IN (SELECT e.id FROM exclusive e)
           OR t.id IN (SELECT c.job_id FROM claimed c)
    )
    UPDATE jobhost.jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        lease_token = l.token,
        lease_secs = l.lease_secs,
        lease_expires_at = now() + l.lease_secs * interval '1 second',
        host_id = host,
        started_at = now()
    FROM leases l
    WHERE j.id = l.id
    RETURNING j.*;
END;
$$;

-- Slots given back (first in 0013_promotions_leased): a promoted job of a
-- rate-governed type is never leased here, where no window is counted; the
-- fetch that follows leases it, or sends it back to wait.
CREATE OR REPLACE FUNCTION jobhost.release_slots_leasing(
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

-- A throttle: the run (job_id, lease_token) was told "slow down"; its key
-- starts nothing until delay_ms from now. Only a current run throttles
-- (a stale one's lease matches nothing), and a throttle never shortens
-- one already set. Returns whether the run held its lease.
CREATE FUNCTION jobhost.rate_throttle(job_id bigint, run_token bigint, delay_ms bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    throttled_job text;
    throttled_key text;
BEGIN
    SELECT j.job, jobhost.rate_key(t.config, j.job, j.payload, j.concurrency_key)
    INTO throttled_job, throttled_key
    FROM jobhost.jobs j
    JOIN jobhost.job_types t ON t.name = j.job
    WHERE j.id = job_id AND j.lease_token = run_token AND j.state = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO jobhost.rate_keys AS r (job, key, throttled_until, throttles)
    VALUES (throttled_job, throttled_key, now() + delay_ms * interval '1 millisecond', 1)
    ON CONFLICT (job, key) DO UPDATE
    SET throttled_until = greatest(r.throttled_until, excluded.throttled_until),
        throttles = r.throttles + 1,
        updated_at = now();
    RETURN true;
END;
$$;
