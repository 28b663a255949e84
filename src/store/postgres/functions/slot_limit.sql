-- jobhost.slot_limit: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0004_concurrency.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.slot_limit(job_type text) RETURNS integer
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(
        (SELECT (t.config -> 'concurrency' ->> 'limit')::integer FROM jobhost.job_types t WHERE t.name = job_type),
        2147483647)
$$;
