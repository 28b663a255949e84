-- jobhost.promotable_keys: its current definitions (every signature hosts call).
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0011_paged_sweeps.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.promotable_keys(max_keys integer) RETURNS TABLE(job text, key text)
    LANGUAGE sql STABLE
    AS $$
    SELECT b.job, b.concurrency_key
    FROM jobhost.blocked_jobs b
    LEFT JOIN jobhost.semaphores s ON s.job = b.job AND s.key = b.concurrency_key
    WHERE s.job IS NULL OR s.holders < jobhost.slot_limit(b.job)
    GROUP BY b.job, b.concurrency_key
    ORDER BY min(b.parked_at)
    LIMIT max_keys
$$;


CREATE OR REPLACE FUNCTION jobhost.promotable_keys(after_job text, after_key text, max_keys integer) RETURNS TABLE(job text, key text, promotable boolean)
    LANGUAGE sql STABLE
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
    WITH RECURSIVE page AS (
        (SELECT b.job, b.concurrency_key AS key FROM jobhost.blocked_jobs b
         WHERE (b.job, b.concurrency_key) > (after_job, after_key)
         ORDER BY b.job, b.concurrency_key
         LIMIT 1)
        UNION ALL
        SELECT n.job, n.key
        FROM page p
        CROSS JOIN LATERAL (
            SELECT b.job, b.concurrency_key AS key FROM jobhost.blocked_jobs b
            WHERE (b.job, b.concurrency_key) > (p.job, p.key)
            ORDER BY b.job, b.concurrency_key
            LIMIT 1
        ) n
    ),
    -- The recursion stops as soon as the page is full.
    keys AS (SELECT p.job, p.key FROM page p LIMIT max_keys)
    SELECT k.job, k.key, s.job IS NULL OR s.holders < jobhost.slot_limit(k.job)
    FROM keys k
    LEFT JOIN jobhost.semaphores s ON s.job = k.job AND s.key = k.key
    ORDER BY k.job, k.key
$$;
