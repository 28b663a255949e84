-- jobhost.repair_semaphores: its current definitions (every signature hosts call).
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0011_paged_sweeps.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.repair_semaphores() RETURNS TABLE(job text, key text, recorded integer, actual integer)
    LANGUAGE plpgsql
    AS $$
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


CREATE OR REPLACE FUNCTION jobhost.repair_semaphores(job_types text[], slot_keys text[]) RETURNS TABLE(job text, key text, recorded integer, actual integer)
    LANGUAGE plpgsql
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
#variable_conflict use_column
DECLARE
    locked_jobs text[];
    locked_keys text[];
BEGIN
    -- Locks the page's semaphore rows, in (job, key) order as every
    -- multi-key transaction takes them, skipping rows in use. Locking first,
    -- then counting in later statements (which see every commit made before
    -- the locks were granted) keeps the count exact.
    SELECT array_agg(l.job), array_agg(l.key) INTO locked_jobs, locked_keys
    FROM (SELECT s.job, s.key FROM unnest(job_types, slot_keys) AS p(job, key)
          JOIN jobhost.semaphores s ON s.job = p.job AND s.key = p.key
          ORDER BY s.job, s.key
          FOR UPDATE OF s SKIP LOCKED) l;
    RETURN QUERY
    WITH fixes AS (
        SELECT s.job, s.key, s.holders AS recorded, coalesce(live.n, 0)::integer AS actual
        FROM unnest(locked_jobs, locked_keys) AS k(job, key)
        JOIN jobhost.semaphores s ON s.job = k.job AND s.key = k.key
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
    -- The page's holders whose row is gone get a row with their count. A
    -- gate creating the same row at this moment wins (DO NOTHING); the next
    -- pass over the page checks it.
    RETURN QUERY
    WITH live AS (
        SELECT p.job, p.key, live.n
        FROM unnest(job_types, slot_keys) AS p(job, key)
        CROSS JOIN LATERAL (
            SELECT count(*)::integer AS n FROM jobhost.jobs j
            WHERE j.job = p.job AND j.concurrency_key = p.key AND j.state IN ('available', 'running')
        ) live
        WHERE live.n > 0
          AND NOT EXISTS (SELECT 1 FROM jobhost.semaphores s WHERE s.job = p.job AND s.key = p.key)
    ),
    created AS (
        INSERT INTO jobhost.semaphores AS s (job, key, holders)
        SELECT live.job, live.key, live.n FROM live
        ORDER BY live.job, live.key
        ON CONFLICT DO NOTHING
        RETURNING s.job, s.key, s.holders
    )
    SELECT c.job, c.key, 0, c.holders FROM created c;
END;
$$;
