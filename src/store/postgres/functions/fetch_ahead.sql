-- jobhost.fetch_ahead: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0034_hot_helpers_in_plpgsql.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.fetch_ahead(queues text[], job_types text[], max_jobs bigint) RETURNS SETOF smallint
    LANGUAGE plpgsql STABLE
    SET enable_sort TO 'off'
    AS $$
BEGIN
    RETURN QUERY
    SELECT j.priority FROM jobhost.jobs j
    WHERE j.state = 'available' AND j.queue = ANY(queues) AND j.job = ANY(job_types)
    ORDER BY j.priority, j.run_at, j.id
    LIMIT max_jobs;
END;
$$;
