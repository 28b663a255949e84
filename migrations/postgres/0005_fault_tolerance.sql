-- What a fleet needs to keep its guarantees under faults and bad rows.

-- Each host records its own heartbeat interval, so liveness is judged by
-- the interval the host promised rather than one fixed window for the fleet.
-- Rows of hosts from before this migration take the default interval.
ALTER TABLE jobhost.hosts ADD COLUMN heartbeat_ms integer NOT NULL DEFAULT 5000 CHECK (heartbeat_ms > 0);

-- A concurrency key is indexed (semaphores, parked jobs, holders), and an
-- index entry has a size limit: a longer key would be stored by an enqueue
-- and then fail every statement that indexes it, on every host. The host
-- refuses such keys at its own enqueue paths; this refuses them from any
-- other writer (the SQL enqueue among them). NOT VALID: rows written before
-- it are left to maintenance, which fails a row it cannot process.
ALTER TABLE jobhost.jobs ADD CONSTRAINT concurrency_key_at_most_1024_bytes
    CHECK (octet_length(concurrency_key) <= 1024) NOT VALID;

-- A job keeps the errors of its newest attempts only, so a job with many
-- attempts cannot grow its row towards the size limit of a jsonb value.
CREATE FUNCTION jobhost.keep_newest_errors() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.errors := (
        SELECT jsonb_agg(x.e ORDER BY x.n)
        FROM jsonb_array_elements(NEW.errors) WITH ORDINALITY AS x(e, n)
        WHERE x.n > jsonb_array_length(NEW.errors) - 25
    );
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_keep_newest_errors
    BEFORE INSERT OR UPDATE OF errors ON jobhost.jobs
    FOR EACH ROW WHEN (jsonb_array_length(NEW.errors) > 25)
    EXECUTE FUNCTION jobhost.keep_newest_errors();

CREATE TRIGGER blocked_jobs_keep_newest_errors
    BEFORE INSERT OR UPDATE OF errors ON jobhost.blocked_jobs
    FOR EACH ROW WHEN (jsonb_array_length(NEW.errors) > 25)
    EXECUTE FUNCTION jobhost.keep_newest_errors();

CREATE TRIGGER archive_keep_newest_errors
    BEFORE INSERT OR UPDATE OF errors ON jobhost.archive
    FOR EACH ROW WHEN (jsonb_array_length(NEW.errors) > 25)
    EXECUTE FUNCTION jobhost.keep_newest_errors();

-- Queues an operator paused: no host leases a job from them (jobs already
-- running finish). A row per paused queue; resuming deletes it.
CREATE TABLE jobhost.queue_pauses (
    name      text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);

-- The queues of a fetch that are not paused. Every fetch (jobhost.fetch and
-- the fetch of jobhost.finish_runs) is given its queues through this, so a
-- pause is seen by the next statement of every host.
CREATE FUNCTION jobhost.unpaused(queues text[]) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(q), '{}')
    FROM unnest(queues) AS q
    WHERE NOT EXISTS (SELECT 1 FROM jobhost.queue_pauses p WHERE p.name = q)
$$;

-- An operator asked to cancel this running job. The host running it learns
-- it from its next lease renewal, stops the guest and archives the job as
-- cancelled in the transaction that gives back its slot; if that host is
-- gone, the lease's expiry archives it as cancelled instead of redelivering it.
ALTER TABLE jobhost.jobs ADD COLUMN cancel_requested_at timestamptz;
