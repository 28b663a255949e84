-- The SQL bulk enqueue's server time (BENCHMARKS.md, "The SQL bulk
-- enqueue"): `jobhost.enqueue_many` of 5,000 plain, unique and limited
-- jobs, beside the call the host's own bulk enqueue makes for the same
-- plain jobs (`jobhost.insert_jobs`, the arrays prepared). Run against a
-- scratch database that `jobhost migrate` has migrated, never a live one:
-- it registers three job types and empties the queue's tables.
--
--   psql -d jobhost_scratch -f benches/sql/sql_bulk_enqueue.sql
--
-- Ten rounds; each round's unique and limited jobs have new keys, so a
-- unique call claims 5,000 new keys and a limited call takes 5,000 new
-- keys' slots. Medians and minimums in ms.

SET client_min_messages = warning;
INSERT INTO jobhost.job_types (name, config, digest) VALUES
    ('bench_plain', '{"name": "bench_plain", "queue": "default", "priority": 0, "max_attempts": 3}', 'bench'),
    ('bench_unique', '{"name": "bench_unique", "queue": "default", "priority": 0, "max_attempts": 3,
                       "unique": {"key": "{k}", "strategy": "until_executed", "on_duplicate": "skip"}}', 'bench'),
    ('bench_limited', '{"name": "bench_limited", "queue": "default", "priority": 0, "max_attempts": 3,
                        "concurrency": {"limit": 1, "key": "{k}", "duration_secs": 60, "on_conflict": "block"}}',
     'bench')
ON CONFLICT (name) DO NOTHING;
TRUNCATE jobhost.jobs, jobhost.blocked_jobs, jobhost.semaphores, jobhost.unique_claims, jobhost.unique_keys,
    jobhost.job_traces;
CREATE TEMP TABLE timed (kind text, ms float8);

DO $$
DECLARE
    n integer := 5000;
    started timestamptz;
    kind text;
    doc jsonb;
    payloads jsonb[];
    no_ids bigint[] := array_fill(NULL::bigint, ARRAY[n]);
BEGIN
    FOR round IN 0..9 LOOP
        FOREACH kind IN ARRAY ARRAY['plain', 'unique', 'limited'] LOOP
            SELECT jsonb_agg(jsonb_build_object('job', 'bench_' || kind,
                                                'payload', jsonb_build_object('k', (round * n + i)::text, 'i', i))
                             ORDER BY i)
            INTO doc FROM generate_series(0, n - 1) i;
            started := clock_timestamp();
            PERFORM count(*) FROM jobhost.enqueue_many(doc);
            INSERT INTO timed VALUES ('enqueue_many, ' || kind, extract(epoch FROM clock_timestamp() - started) * 1000);
        END LOOP;

        SELECT array_agg(jsonb_build_object('k', (round * n + i)::text, 'i', i) ORDER BY i) INTO payloads
        FROM generate_series(0, n - 1) i;
        started := clock_timestamp();
        PERFORM jobhost.insert_jobs(array_fill('bench_plain'::text, ARRAY[n]), array_fill('default'::text, ARRAY[n]),
                                    array_fill(0::smallint, ARRAY[n]), payloads, array_fill(3, ARRAY[n]),
                                    array_fill(NULL::timestamptz, ARRAY[n]), array_fill(0::bigint, ARRAY[n]),
                                    array_fill(NULL::text, ARRAY[n]), no_ids, no_ids, no_ids,
                                    array_fill(NULL::timestamptz, ARRAY[n]));
        INSERT INTO timed VALUES ('the host''s insert_jobs, plain', extract(epoch FROM clock_timestamp() - started) * 1000);
    END LOOP;
END $$;

SELECT kind, round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 2) AS median_ms,
       round(min(ms)::numeric, 2) AS min_ms
FROM timed GROUP BY kind ORDER BY kind;
