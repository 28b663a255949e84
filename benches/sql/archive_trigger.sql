-- What the archive's statement trigger (jobhost.archive_ended) costs a
-- result write that holds no claim, batch, waiter or workflow step (most
-- writes): 2,000 one-row archive inserts, each its own statement as a
-- serial host's writes are, and one insert of 1,000 rows, five times each.
-- Run against a scratch database that `jobhost migrate` has migrated,
-- never a live one: it empties the archive and the claims.
--
--   psql -d jobhost_scratch -f benches/sql/archive_trigger.sql
--
-- The rows say they carried their key (`key_carried`, 0041), as every
-- archive insert of this release does; on a database before 0041, drop
-- that column from both inserts. Medians and minimums in ms.

SET client_min_messages = warning;
TRUNCATE jobhost.archive, jobhost.unique_claims, jobhost.unique_keys;
CREATE TEMP TABLE timed (kind text, ms float8);
DO $$
DECLARE
    started timestamptz;
    base bigint := 10000000;
BEGIN
    FOR round IN 1..5 LOOP
        started := clock_timestamp();
        FOR i IN 1..2000 LOOP
            INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, enqueued_at,
                                         key_carried)
            VALUES (base + round * 100000 + i, 'item', 'default', 0, '{}', 'completed', 1, 3, now(), true);
        END LOOP;
        INSERT INTO timed VALUES ('2,000 one-row archive inserts', extract(epoch FROM clock_timestamp() - started) * 1000);
        started := clock_timestamp();
        INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, enqueued_at,
                                     key_carried)
        SELECT base + round * 100000 + 50000 + i, 'item', 'default', 0, '{}', 'completed', 1, 3, now(), true
        FROM generate_series(1, 1000) i;
        INSERT INTO timed VALUES ('one insert of 1,000 rows', extract(epoch FROM clock_timestamp() - started) * 1000);
    END LOOP;
END $$;

SELECT kind, round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2) AS median_ms,
       round(min(ms)::numeric, 2) AS min_ms
FROM timed GROUP BY kind ORDER BY kind;
TRUNCATE jobhost.archive;
