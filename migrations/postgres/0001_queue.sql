-- The durable queue: live jobs, the archive, job types and hosts.
-- Every table lives in the `jobhost` schema; the runner creates the schema
-- before applying migrations so their bookkeeping table can live there too.

CREATE SEQUENCE jobhost.job_ids;

-- Every fetch takes a fresh token; completion, retry and failure match on
-- (id, lease_token), so a worker whose lease was taken over changes nothing.
CREATE SEQUENCE jobhost.lease_tokens;

-- Jobs that have not finished: waiting for their time (scheduled), ready to
-- run (available), or held by a host under a lease (running).
CREATE TABLE jobhost.jobs (
    id               bigint PRIMARY KEY DEFAULT nextval('jobhost.job_ids'),
    job              text        NOT NULL,
    queue            text        NOT NULL,
    priority         smallint    NOT NULL DEFAULT 0,
    -- The payload as a JSON document (never a JSON string holding JSON).
    payload          jsonb       NOT NULL,
    state            text        NOT NULL CHECK (state IN ('scheduled', 'available', 'running')),
    -- Attempts started so far; a snooze or a hand-back at shutdown gives one back.
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL CHECK (max_attempts >= 1),
    -- When a scheduled job comes due; for an available job, when it became ready.
    run_at           timestamptz NOT NULL DEFAULT now(),
    enqueued_at      timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    -- Set together while running, null otherwise.
    lease_token      bigint,
    lease_secs       integer,
    lease_expires_at timestamptz,
    host_id          text,
    concurrency_key  text,
    batch_id         bigint,
    parent_id        bigint,
    -- One entry per failed attempt: {"attempt", "at", "error", "log"}.
    errors           jsonb       NOT NULL DEFAULT '[]',
    progress         jsonb,
    CHECK ((state = 'running') = (lease_token IS NOT NULL)),
    CHECK (jsonb_typeof(errors) = 'array')
);

-- The fetch: available jobs in fetch order (priority, then run time, then
-- id), so a fetch reads the first rows in order and filters queue and job
-- type as it goes instead of sorting every available job (a leading queue
-- column cannot be read in order for a list of queues). Partial, so it holds
-- only what is ready to run.
CREATE INDEX jobs_fetch ON jobhost.jobs (priority, run_at, id) WHERE state = 'available';

-- The sweep that moves due scheduled jobs through the gate.
CREATE INDEX jobs_due ON jobhost.jobs (run_at) WHERE state = 'scheduled';

-- The sweep that rescues jobs whose host stopped heartbeating, and the
-- heartbeat that renews one host's leases.
CREATE INDEX jobs_leases ON jobhost.jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_host ON jobhost.jobs (host_id) WHERE state = 'running';

-- Finished jobs, each exactly once (its id is the primary key).
CREATE TABLE jobhost.archive (
    id              bigint PRIMARY KEY,
    job             text        NOT NULL,
    queue           text        NOT NULL,
    priority        smallint    NOT NULL,
    payload         jsonb       NOT NULL,
    state           text        NOT NULL CHECK (state IN ('completed', 'failed', 'discarded', 'cancelled')),
    attempt         integer     NOT NULL,
    max_attempts    integer     NOT NULL,
    -- The guest's output document, for a completed job.
    output          jsonb,
    errors          jsonb       NOT NULL DEFAULT '[]',
    -- The last attempt's log lines and captured output, bounded by the host.
    log             jsonb,
    progress        jsonb,
    enqueued_at     timestamptz NOT NULL,
    started_at      timestamptz,
    finished_at     timestamptz NOT NULL DEFAULT now(),
    host_id         text,
    concurrency_key text,
    batch_id        bigint,
    parent_id       bigint
);

-- Retention deletes the oldest finished jobs first.
CREATE INDEX archive_finished ON jobhost.archive (finished_at);
-- Operators list finished jobs by type and state.
CREATE INDEX archive_job_state ON jobhost.archive (job, state, finished_at);

-- The configuration each job type declared through describe(), so any
-- enqueuer (CLI, SQL, another host) applies it without the component.
CREATE TABLE jobhost.job_types (
    name       text PRIMARY KEY,
    config     jsonb       NOT NULL,
    digest     text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Fleet membership. A host is alive while it keeps last_seen_at fresh.
CREATE TABLE jobhost.hosts (
    id           text PRIMARY KEY,
    hostname     text        NOT NULL,
    pid          integer     NOT NULL,
    version      text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    -- The job types this host has loaded and fetches.
    job_types    text[]      NOT NULL DEFAULT '{}'
);

-- Wake idle hosts as soon as jobs are ready: one notification per statement
-- that inserts available jobs, whoever inserts them (the CLI, SQL, a parent's completion).
CREATE FUNCTION jobhost.notify_available() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_jobs WHERE state = 'available') THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_insert
    AFTER INSERT ON jobhost.jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobhost.notify_available();
