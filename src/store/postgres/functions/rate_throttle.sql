-- jobhost.rate_throttle: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0024_rate_limits.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.rate_throttle(job_id bigint, run_token bigint, delay_ms bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    throttled_job text;
    throttled_key text;
BEGIN
    SELECT j.job, jobhost.rate_key(t.config, j.job, j.payload, j.concurrency_key)
    INTO throttled_job, throttled_key
    FROM jobhost.jobs j
    JOIN jobhost.job_types t ON t.name = j.job
    WHERE j.id = job_id AND j.lease_token = run_token AND j.state = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO jobhost.rate_keys AS r (job, key, throttled_until, throttles)
    VALUES (throttled_job, throttled_key, now() + delay_ms * interval '1 millisecond', 1)
    ON CONFLICT (job, key) DO UPDATE
    SET throttled_until = greatest(r.throttled_until, excluded.throttled_until),
        throttles = r.throttles + 1,
        updated_at = now();
    RETURN true;
END;
$$;
