-- jobhost.semaphore_page: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0011_paged_sweeps.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.semaphore_page(after_job text, after_key text, max_keys integer) RETURNS TABLE(job text, key text)
    LANGUAGE sql STABLE
    AS $$
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
