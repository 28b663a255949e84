-- jobhost.fetch: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0024_rate_limits.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost."fetch"(queues text[], job_types text[], lease_secs integer[], max_jobs bigint, host text) RETURNS SETOF jobhost.jobs
    LANGUAGE plpgsql
    SET enable_sort TO 'off'
    SET jit TO 'off'
    AS $$
DECLARE
    chosen bigint[];
    sent_back bigint[] := '{}';
BEGIN
    SELECT coalesce(array_agg(c.id), '{}') INTO chosen
    FROM (
        SELECT j.id
        FROM jobhost.jobs j
        WHERE j.state = 'available'
          AND j.queue = ANY(queues)
          AND j.job = ANY(job_types)
          AND NOT EXISTS (
              SELECT 1
              FROM jobhost.unique_keys k
              JOIN jobhost.unique_claims c ON c.job = k.job AND c.unique_key = k.unique_key
              WHERE k.job_id = j.id AND k.while_executing)
        ORDER BY j.priority, j.run_at, j.id
        LIMIT max_jobs
        FOR UPDATE OF j SKIP LOCKED
    ) c;
    IF cardinality(chosen) = 0 THEN
        RETURN;
    END IF;
    -- Two index probes, whatever the number of types served.
    IF EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = ANY(job_types) AND t.config ? 'rate_limit')
       OR EXISTS (SELECT 1 FROM jobhost.rate_keys r
                  WHERE r.job = ANY(job_types) AND r.throttled_until IS NOT NULL AND r.throttled_until > now()) THEN
        sent_back := jobhost.rate_start(chosen);
    END IF;

    RETURN QUERY
    WITH picked AS (
        SELECT j.id, j.job FROM jobhost.jobs j
        WHERE j.id = ANY(chosen) AND NOT j.id = ANY(sent_back)
    ),
    tokens AS (
        SELECT p.id, p.job, nextval('jobhost.lease_tokens') AS token FROM picked p
    ),
    exclusive AS (
        SELECT t.id, t.token, k.job, k.unique_key
        FROM tokens t
        JOIN jobhost.unique_keys k ON k.job_id = t.id AND k.while_executing
    ),
    claimed AS (
        INSERT INTO jobhost.unique_claims (job, unique_key, job_id, lease_token)
        SELECT e.job, e.unique_key, e.id, e.token FROM exclusive e
        ORDER BY e.job, e.unique_key, e.id
        ON CONFLICT DO NOTHING
        RETURNING job_id
    ),
    leases AS (
        SELECT t.id, t.token, s.lease_secs
        FROM tokens t
        JOIN unnest(job_types, lease_secs) AS s(job, lease_secs) ON s.job = t.job
        WHERE t.id NOT IN (SELECT e.id FROM exclusive e)
           OR t.id IN (SELECT c.job_id FROM claimed c)
    )
    UPDATE jobhost.jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        lease_token = l.token,
        lease_secs = l.lease_secs,
        lease_expires_at = now() + l.lease_secs * interval '1 second',
        host_id = host,
        started_at = now()
    FROM leases l
    WHERE j.id = l.id
    RETURNING j.*;
END;
$$;
