-- The small helpers a result write and a fetch call once per statement,
-- in PL/pgSQL instead of SQL.
--
-- A LANGUAGE sql function whose body holds a subquery or an aggregate is
-- never inlined into its caller, and PostgreSQL plans such a body afresh
-- for every statement that calls it: the plan lives only as long as the
-- calling statement's execution. PL/pgSQL keeps its statements' plans for
-- the session. Measured per call, once per statement, on this schema
-- (BENCHMARKS.md, "Helpers planned once per session"): `unpaused` and
-- `rate_governed` cost 20–40 µs each as SQL and 4–6 µs in PL/pgSQL; a
-- serial-shape result write (three results) spent 0.46 of its 1.68 ms of
-- server time in these three (`track_functions = all`).
--
-- Same names, arguments, results and volatility; callers are unchanged.
-- `fetch_ahead` keeps its `SET enable_sort = off`, so its scan still
-- follows the fetch's index order. `slot_limit` stays in SQL: the bulk
-- gate calls it once per key over a whole call, where a SQL function's
-- plan is reused row to row and is cheaper than a PL/pgSQL call.

-- A generic plan from the first call: left to choose, PostgreSQL plans an
-- array argument's unnest afresh each call (39 µs against 8).
CREATE OR REPLACE FUNCTION jobhost.unpaused(queues text[]) RETURNS text[]
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(q), '{}')
            FROM unnest(queues) AS q
            WHERE NOT EXISTS (SELECT 1 FROM jobhost.queue_pauses p WHERE p.name = q));
END;
$$;

CREATE OR REPLACE FUNCTION jobhost.rate_governed(job_type text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = job_type AND t.config ? 'rate_limit')
        OR EXISTS (SELECT 1 FROM jobhost.rate_keys r
                   WHERE r.job = job_type AND r.throttled_until IS NOT NULL AND r.throttled_until > now());
END;
$$;

CREATE OR REPLACE FUNCTION jobhost.fetch_ahead(queues text[], job_types text[], max_jobs bigint)
RETURNS SETOF smallint
LANGUAGE plpgsql STABLE
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    SELECT j.priority FROM jobhost.jobs j
    WHERE j.state = 'available' AND j.queue = ANY(queues) AND j.job = ANY(job_types)
    ORDER BY j.priority, j.run_at, j.id
    LIMIT max_jobs;
END;
$$;
