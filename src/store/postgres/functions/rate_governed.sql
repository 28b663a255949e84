-- jobhost.rate_governed: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0034_hot_helpers_in_plpgsql.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.rate_governed(job_type text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = job_type AND t.config ? 'rate_limit')
        OR EXISTS (SELECT 1 FROM jobhost.rate_keys r
                   WHERE r.job = job_type AND r.throttled_until IS NOT NULL AND r.throttled_until > now());
END;
$$;
