-- jobhost.rate_key: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0024_rate_limits.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.rate_key(config jsonb, job_type text, payload jsonb, concurrency_key text) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE
        WHEN NOT config ? 'rate_limit' THEN coalesce(concurrency_key, job_type)
        WHEN jobhost.key_renders(config -> 'rate_limit' ->> 'key', payload)
            THEN jobhost.render_key(config -> 'rate_limit' ->> 'key', payload)
        ELSE job_type
    END
$$;
