-- The embedded backend's schema: the same tables as the PostgreSQL one
-- (migrations/postgres), in one SQLite file.
--
-- Differences that follow from SQLite:
--   * times are INTEGER milliseconds since the Unix epoch (UTC);
--   * JSON documents are TEXT, checked by SQLite's JSON functions, so a
--     payload is still an object and never a string holding JSON;
--   * ids come from AUTOINCREMENT on jobs, which never reuses an id, so a
--     job keeps its id when it moves to the archive or the parked table;
--   * lease tokens come from the counters table instead of a sequence.
-- Every write runs in a BEGIN IMMEDIATE transaction, so writers (threads or
-- processes) take the file's write lock one at a time: there is no row
-- locking to get wrong, and the gate's count of a key's holders cannot
-- change under it.

CREATE TABLE jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    job              TEXT    NOT NULL,
    queue            TEXT    NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,
    payload          TEXT    NOT NULL CHECK (json_type(payload) = 'object'),
    state            TEXT    NOT NULL CHECK (state IN ('scheduled', 'available', 'running')),
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
    run_at           INTEGER NOT NULL,
    enqueued_at      INTEGER NOT NULL,
    started_at       INTEGER,
    lease_token      INTEGER,
    lease_secs       INTEGER,
    lease_expires_at INTEGER,
    host_id          TEXT,
    concurrency_key  TEXT,
    batch_id         INTEGER,
    parent_id        INTEGER,
    errors           TEXT    NOT NULL DEFAULT '[]' CHECK (json_type(errors) = 'array'),
    progress         TEXT,
    CHECK ((state = 'running') = (lease_token IS NOT NULL))
) STRICT;

-- The fetch reads available jobs in fetch order.
CREATE INDEX jobs_fetch ON jobs (priority, run_at, id) WHERE state = 'available';
-- The sweep that moves due scheduled jobs through the gate.
CREATE INDEX jobs_due ON jobs (run_at) WHERE state = 'scheduled';
-- Lease expiry and renewal.
CREATE INDEX jobs_leases ON jobs (lease_expires_at) WHERE state = 'running';
-- The repair sweep counts the live holders of every key.
CREATE INDEX jobs_holders ON jobs (job, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND state IN ('available', 'running');

CREATE TABLE archive (
    id              INTEGER PRIMARY KEY,
    job             TEXT    NOT NULL,
    queue           TEXT    NOT NULL,
    priority        INTEGER NOT NULL,
    payload         TEXT    NOT NULL CHECK (json_type(payload) = 'object'),
    state           TEXT    NOT NULL CHECK (state IN ('completed', 'failed', 'discarded', 'cancelled')),
    attempt         INTEGER NOT NULL,
    max_attempts    INTEGER NOT NULL,
    output          TEXT,
    errors          TEXT    NOT NULL DEFAULT '[]' CHECK (json_type(errors) = 'array'),
    log             TEXT,
    progress        TEXT,
    enqueued_at     INTEGER NOT NULL,
    started_at      INTEGER,
    finished_at     INTEGER NOT NULL,
    host_id         TEXT,
    concurrency_key TEXT,
    batch_id        INTEGER,
    parent_id       INTEGER
) STRICT;

CREATE INDEX archive_finished ON archive (finished_at);
CREATE INDEX archive_job_state ON archive (job, state, finished_at);

CREATE TABLE job_types (
    name       TEXT    PRIMARY KEY,
    config     TEXT    NOT NULL CHECK (json_type(config) = 'object'),
    digest     TEXT    NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE hosts (
    id           TEXT    PRIMARY KEY,
    hostname     TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    version      TEXT    NOT NULL,
    started_at   INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL,
    -- A JSON array of the job types this host has loaded and fetches.
    job_types    TEXT    NOT NULL DEFAULT '[]' CHECK (json_type(job_types) = 'array')
) STRICT;

-- One row per (job type, key) with slots taken; deleted when the last is given back.
CREATE TABLE semaphores (
    job        TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    holders    INTEGER NOT NULL CHECK (holders >= 0),
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (job, key)
) STRICT;

-- Jobs waiting for a slot of their key. Nothing expires them: the only ways
-- out are promotion and an operator's cancel.
CREATE TABLE blocked_jobs (
    id              INTEGER PRIMARY KEY,
    job             TEXT    NOT NULL,
    queue           TEXT    NOT NULL,
    priority        INTEGER NOT NULL,
    payload         TEXT    NOT NULL CHECK (json_type(payload) = 'object'),
    attempt         INTEGER NOT NULL,
    max_attempts    INTEGER NOT NULL,
    enqueued_at     INTEGER NOT NULL,
    started_at      INTEGER,
    concurrency_key TEXT    NOT NULL,
    batch_id        INTEGER,
    parent_id       INTEGER,
    errors          TEXT    NOT NULL CHECK (json_type(errors) = 'array'),
    progress        TEXT,
    parked_at       INTEGER NOT NULL
) STRICT;

-- Promotion order within a key: highest priority (lowest number) first, then oldest.
CREATE INDEX blocked_jobs_next ON blocked_jobs (job, concurrency_key, priority, parked_at, id);

-- Monotonic counters standing in for PostgreSQL sequences.
CREATE TABLE counters (
    name  TEXT    PRIMARY KEY,
    value INTEGER NOT NULL
) STRICT;

INSERT INTO counters (name, value) VALUES ('lease_token', 0);
