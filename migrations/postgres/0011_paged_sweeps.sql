-- The sweep of blocked jobs and the semaphore repair page through keys, so
-- one pass costs the same with 20 keys or 100,000 and with a thousand or a
-- million blocked jobs. A host's maintenance keeps its place (the last
-- (job, key) it visited) in memory and starts again from the first key when
-- a pass reaches the end.
--
-- Every read here is an index range scan: the next key of blocked_jobs after
-- a place is one probe of blocked_jobs_next (job, concurrency_key, ...), so
-- the distinct keys of a page are read by a recursive "skip scan" that costs
-- one probe per key however many jobs each key has blocked; the next key
-- held by live jobs, and a key's live holders, come from jobs_holders
-- (job, concurrency_key) the same way; semaphores are read by their primary
-- key. No new index is needed. The functions joining a page of keys to a
-- table turn hash and merge joins off: with a thousand keys the planner
-- would rather hash the whole semaphores table than probe it a thousand
-- times, a cost that grows with the table.
--
-- The functions of 0004_concurrency with the same names and no place
-- (promotable_keys(max_keys), repair_semaphores()) stay, for hosts of the
-- previous version still running in the fleet during an upgrade.

-- The keys with blocked jobs after (after_job, after_key) in (job, key)
-- order, at most max_keys, each with whether it could take a slot now (no
-- semaphore row, or fewer holders than the limit). A place of ('', '')
-- starts from the first key: a job type's name is never empty.
--
-- Why paging cannot starve a key (guarantee 4): each pass visits the next
-- max_keys keys whatever their state, so a key with a free slot is reached
-- within ceil(keys / max_keys) passes of any host, however many busy keys
-- come before it; busy keys cost one probe each and never hold the page back.
CREATE FUNCTION jobhost.promotable_keys(after_job text, after_key text, max_keys integer)
RETURNS TABLE (job text, key text, promotable boolean)
LANGUAGE sql STABLE
SET enable_hashjoin = off
SET enable_mergejoin = off
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

-- The repair's next page: the keys after (after_job, after_key) in (job,
-- key) order that have a semaphore row or live holders, at most max_keys.
CREATE FUNCTION jobhost.semaphore_page(after_job text, after_key text, max_keys integer)
RETURNS TABLE (job text, key text)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE live AS (
        (SELECT j.job, j.concurrency_key AS key FROM jobhost.jobs j
         WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
           AND (j.job, j.concurrency_key) > (after_job, after_key)
         ORDER BY j.job, j.concurrency_key
         LIMIT 1)
        UNION ALL
        SELECT n.job, n.key
        FROM live l
        CROSS JOIN LATERAL (
            SELECT j.job, j.concurrency_key AS key FROM jobhost.jobs j
            WHERE j.concurrency_key IS NOT NULL AND j.state IN ('available', 'running')
              AND (j.job, j.concurrency_key) > (l.job, l.key)
            ORDER BY j.job, j.concurrency_key
            LIMIT 1
        ) n
    )
    SELECT u.job, u.key
    FROM ((SELECT s.job, s.key FROM jobhost.semaphores s
           WHERE (s.job, s.key) > (after_job, after_key)
           ORDER BY s.job, s.key
           LIMIT max_keys)
          UNION
          (SELECT l.job, l.key FROM live l LIMIT max_keys)) u
    ORDER BY u.job, u.key
    LIMIT max_keys
$$;

-- repair_semaphores of 0004_concurrency over one page of keys (from
-- semaphore_page), each (job_types[i], slot_keys[i]) read by its own index
-- probes. Sets each semaphore's holder count to the number of live jobs that
-- hold its slots, where the two disagree (after rows were changed or
-- deleted by hand), and recreates missing rows. Rows in use right now are
-- skipped and checked on the next pass over them: whoever holds one is
-- changing it consistently. Returns what it changed.
CREATE FUNCTION jobhost.repair_semaphores(job_types text[], slot_keys text[])
RETURNS TABLE (job text, key text, recorded integer, actual integer)
LANGUAGE plpgsql
SET enable_hashjoin = off
SET enable_mergejoin = off
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
