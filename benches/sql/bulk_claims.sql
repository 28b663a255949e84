-- Where a bulk enqueue of new unique keys spends its server time, call by
-- call (BENCHMARKS.md, issue 40's passes). Run against a scratch database
-- that `jobhost migrate` has migrated, never a live one: it empties the
-- queue's tables.
--
--   psql -d jobhost_scratch -f benches/sql/bulk_claims.sql
--
-- Twenty rounds of 5,000 jobs with new keys ("0", "1", … as the bulk bench
-- sends them): a plain insert_jobs call, then a unique call's two,
-- claim_new_keys and insert_jobs with the ids it chose (as a host calls
-- them since 0043: claims attached, keys on the rows). Then the claims'
-- insert alone into copies of unique_claims that differ in their indexes.
-- Medians and minimums in ms.

SET client_min_messages = warning;
TRUNCATE jobhost.jobs, jobhost.unique_claims, jobhost.unique_keys, jobhost.job_traces;
-- Logged tables, as the claims are (a temporary table writes no WAL).
DROP SCHEMA IF EXISTS bench_claims CASCADE;
CREATE SCHEMA bench_claims;
SET search_path = bench_claims;
CREATE TEMP TABLE timed (kind text, ms float8);
CREATE TABLE claims_type_key_by_id (LIKE jobhost.unique_claims INCLUDING DEFAULTS);
ALTER TABLE claims_type_key_by_id ADD PRIMARY KEY (job, unique_key);
CREATE INDEX ON claims_type_key_by_id (job_id);
CREATE TABLE claims_key_type_by_id (LIKE jobhost.unique_claims INCLUDING DEFAULTS);
ALTER TABLE claims_key_type_by_id ADD PRIMARY KEY (unique_key, job);
CREATE INDEX ON claims_key_type_by_id (job_id);
CREATE TABLE claims_key_type (LIKE jobhost.unique_claims INCLUDING DEFAULTS);
ALTER TABLE claims_key_type ADD PRIMARY KEY (unique_key, job);
CREATE TABLE claims_heap (LIKE jobhost.unique_claims INCLUDING DEFAULTS);

DO $$
DECLARE
    n integer := 5000;
    started timestamptz;
    claimed record;
    copy text;
    types text[] := array_fill('item'::text, ARRAY[n]);
    queues text[] := array_fill('default'::text, ARRAY[n]);
    priorities smallint[] := array_fill(0::smallint, ARRAY[n]);
    attempts integer[] := array_fill(3, ARRAY[n]);
    ats timestamptz[] := array_fill(NULL::timestamptz, ARRAY[n]);
    delays bigint[] := array_fill(0::bigint, ARRAY[n]);
    no_texts text[] := array_fill(NULL::text, ARRAY[n]);
    no_ids bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    no_times timestamptz[] := array_fill(NULL::timestamptz, ARRAY[n]);
    until_executed boolean[] := array_fill(false, ARRAY[n]);
    payloads jsonb[];
    keys text[];
    own_ids bigint[];
BEGIN
    FOR round IN 0..19 LOOP
        SELECT array_agg(jsonb_build_object('k', (round * n + i)::text, 'i', round * n + i) ORDER BY i),
               array_agg((round * n + i)::text ORDER BY i), array_agg(1000000000 + round * n + i ORDER BY i)
        INTO payloads, keys, own_ids
        FROM generate_series(0, n - 1) i;

        started := clock_timestamp();
        PERFORM jobhost.insert_jobs(types, queues, priorities, payloads, attempts, ats, delays, no_texts, no_ids,
                                    no_ids, no_ids, no_times);
        INSERT INTO timed VALUES ('plain: insert_jobs', extract(epoch FROM clock_timestamp() - started) * 1000);
        started := clock_timestamp();
        SELECT * INTO claimed FROM jobhost.claim_new_keys(types, keys, until_executed, attach => true);
        INSERT INTO timed VALUES ('unique: claim_new_keys', extract(epoch FROM clock_timestamp() - started) * 1000);
        started := clock_timestamp();
        PERFORM jobhost.insert_jobs(types, queues, priorities, payloads, attempts, ats, delays, no_texts, no_ids,
                                    claimed.ids, no_ids, no_times, keys);
        INSERT INTO timed VALUES ('unique: insert_jobs, ids chosen', extract(epoch FROM clock_timestamp() - started) * 1000);

        FOREACH copy IN ARRAY ARRAY['claims_type_key_by_id', 'claims_key_type_by_id', 'claims_key_type', 'claims_heap'] LOOP
            started := clock_timestamp();
            EXECUTE format('INSERT INTO %I (job, unique_key, job_id)
                            SELECT u.job, u.unique_key, u.id FROM unnest($1, $2, $3) AS u(job, unique_key, id)
                            ORDER BY u.job, u.unique_key, u.id', copy)
            USING types, keys, own_ids;
            INSERT INTO timed VALUES ('claims into ' || copy, extract(epoch FROM clock_timestamp() - started) * 1000);
        END LOOP;
    END LOOP;
END $$;

SELECT kind, round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2) AS median_ms,
       round(min(ms)::numeric, 2) AS min_ms
FROM timed GROUP BY kind ORDER BY kind;
DROP SCHEMA bench_claims CASCADE;
