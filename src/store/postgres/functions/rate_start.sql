-- jobhost.rate_start: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0024_rate_limits.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.rate_start(picked bigint[]) RETURNS bigint[]
    LANGUAGE plpgsql
    AS $$
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
