CREATE INDEX archive_batch ON archive (batch_id) WHERE batch_id IS NOT NULL;

CREATE INDEX archive_finished ON archive (finished_at);

CREATE INDEX archive_job_state ON archive (job, state, finished_at);

CREATE INDEX archive_state_queue ON archive (state, queue);

CREATE INDEX audit_at ON audit (at);

CREATE INDEX batches_due ON batches (id)
    WHERE closed_at IS NOT NULL AND finished_at IS NULL AND completed + failed + discarded + cancelled >= total;

CREATE INDEX batches_finished ON batches (finished_at) WHERE finished_at IS NOT NULL;

CREATE INDEX blocked_jobs_batch ON blocked_jobs (batch_id) WHERE batch_id IS NOT NULL;

CREATE INDEX blocked_jobs_next ON blocked_jobs (job, concurrency_key, priority, parked_at, id);

CREATE INDEX deployments_by_type ON deployments (job_type, id DESC);

CREATE INDEX events_key_sent ON events (key, sent_at);

CREATE INDEX events_sent ON events (sent_at);

CREATE INDEX history_job ON history (job, minute);

CREATE INDEX history_retries_job ON history_retries (job, minute);

CREATE INDEX jobs_batch ON jobs (batch_id) WHERE batch_id IS NOT NULL;

CREATE INDEX jobs_due ON jobs (run_at) WHERE state = 'scheduled';

CREATE INDEX jobs_fetch ON jobs (priority, run_at, id) WHERE state = 'available';

CREATE INDEX jobs_holders ON jobs (job, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND state IN ('available', 'running');

CREATE INDEX jobs_leases ON jobs (lease_expires_at) WHERE state = 'running';

CREATE INDEX keyed_schedules_due ON keyed_schedules (job, look_at)
    WHERE look_at IS NOT NULL AND NOT paused;

CREATE INDEX rate_keys_throttled ON rate_keys (job, throttled_until) WHERE throttled_until IS NOT NULL;

CREATE INDEX unique_claims_job_id ON unique_claims (job_id);

CREATE INDEX workflow_edges_dep ON workflow_edges (dep_id);

CREATE INDEX workflow_steps_live ON workflow_steps (workflow_id) WHERE ended_state IS NULL;

CREATE INDEX workflow_steps_ready ON workflow_steps (id)
    WHERE pending = 0 AND job_id IS NULL AND (wait IS NULL OR wait <> 'armed');

CREATE INDEX workflow_waits_open_due ON workflow_waits (due_at)
    WHERE ended_by IS NULL AND due_at IS NOT NULL;

CREATE INDEX workflow_waits_open_key ON workflow_waits (key, match_one)
    WHERE ended_by IS NULL AND armed_at IS NOT NULL AND key IS NOT NULL;

CREATE INDEX workflows_created ON workflows (created_at);

CREATE TABLE access_tokens (
    name         TEXT    PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
    digest       TEXT    NOT NULL UNIQUE,
    role         TEXT    NOT NULL CHECK (role IN ('read', 'operate', 'deploy', 'admin')),
    queues       TEXT    CHECK (queues IS NULL OR json_array_length(queues) BETWEEN 1 AND 100),
    payloads     INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL,
    created_by   TEXT    NOT NULL,
    expires_at   INTEGER,
    revoked_at   INTEGER,
    last_used_at INTEGER
) STRICT;

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

CREATE TABLE audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    via        TEXT    NOT NULL CHECK (via IN ('api', 'dashboard', 'cli', 'sql', 'library', 'webhook')),
    who        TEXT    NOT NULL,
    address    TEXT,
    user_agent TEXT,
    action     TEXT    NOT NULL,
    object     TEXT    NOT NULL,
    outcome    TEXT    NOT NULL,
    count      INTEGER NOT NULL DEFAULT 1 CHECK (count >= 1)
) STRICT;

CREATE TABLE batches (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    label            TEXT CHECK (length(CAST(label AS BLOB)) <= 256),
    created_at       INTEGER NOT NULL,
    -- Null while open: members may be added.
    closed_at        INTEGER,
    total            INTEGER NOT NULL DEFAULT 0,
    completed        INTEGER NOT NULL DEFAULT 0,
    failed           INTEGER NOT NULL DEFAULT 0,
    discarded        INTEGER NOT NULL DEFAULT 0,
    cancelled        INTEGER NOT NULL DEFAULT 0,
    on_finish        TEXT,
    on_success       TEXT,
    on_failure       TEXT,
    callback_payload TEXT    NOT NULL DEFAULT '{}' CHECK (json_type(callback_payload) = 'object'),
    -- Set once, by the write that found the closed batch complete; the same
    -- write enqueues its callbacks.
    finished_at      INTEGER,
    callback_jobs    TEXT    NOT NULL DEFAULT '{}',
    callback_errors  TEXT    NOT NULL DEFAULT '{}'
) STRICT;

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

CREATE TABLE component_sources (
    digest      TEXT    PRIMARY KEY CHECK (length(digest) = 64 AND digest NOT GLOB '*[^0-9a-f]*'),
    job_type    TEXT    NOT NULL,
    bytes       BLOB    NOT NULL,
    config      TEXT    NOT NULL CHECK (json_type(config) = 'object'),
    uploaded_at INTEGER NOT NULL
) STRICT;

CREATE TABLE counters (
    name  TEXT    PRIMARY KEY,
    value INTEGER NOT NULL
) STRICT;

CREATE TABLE deployments (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    job_type TEXT    NOT NULL,
    digest   TEXT    REFERENCES component_sources (digest),
    action   TEXT    NOT NULL CHECK (action IN ('deploy', 'rollback', 'undeploy')),
    at       INTEGER NOT NULL,
    CHECK ((action = 'undeploy') = (digest IS NULL))
) STRICT;

CREATE TABLE events (
    id              INTEGER PRIMARY KEY,
    key             TEXT NOT NULL CHECK (length(CAST(key AS BLOB)) BETWEEN 1 AND 256),
    payload         TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    source          TEXT NOT NULL DEFAULT 'sql',
    sent_at         INTEGER NOT NULL,
    released        INTEGER NOT NULL DEFAULT 0
, jobs TEXT NOT NULL DEFAULT '[]' CHECK (json_type(jobs) = 'array')) STRICT;

CREATE TABLE history (
    minute      INTEGER NOT NULL,
    queue       TEXT    NOT NULL,
    job         TEXT    NOT NULL,
    completed   INTEGER NOT NULL DEFAULT 0,
    failed      INTEGER NOT NULL DEFAULT 0,
    discarded   INTEGER NOT NULL DEFAULT 0,
    cancelled   INTEGER NOT NULL DEFAULT 0,
    runs        INTEGER NOT NULL DEFAULT 0,
    run_p50_ms  REAL,
    run_p95_ms  REAL,
    run_max_ms  REAL,
    waits       INTEGER NOT NULL DEFAULT 0,
    wait_p50_ms REAL,
    wait_p95_ms REAL,
    available   INTEGER,
    blocked     INTEGER,
    scheduled   INTEGER,
    PRIMARY KEY (minute, queue, job)
) STRICT;

CREATE TABLE history_marks (
    name TEXT    PRIMARY KEY,
    upto INTEGER NOT NULL
) STRICT;

CREATE TABLE history_retries (
    minute  INTEGER NOT NULL,
    queue   TEXT    NOT NULL,
    job     TEXT    NOT NULL,
    retried INTEGER NOT NULL,
    PRIMARY KEY (minute, queue, job)
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
, heartbeat_ms INTEGER NOT NULL DEFAULT 5000 CHECK (heartbeat_ms > 0), digests TEXT NOT NULL DEFAULT '{}' CHECK (json_type(digests) = 'object'), watcher_error TEXT) STRICT;

CREATE TABLE http_sessions (
    digest       TEXT    PRIMARY KEY,
    created_at   INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL
, token_name TEXT REFERENCES access_tokens (name) ON DELETE CASCADE) STRICT;

CREATE TABLE job_traces (
    job_id      INTEGER PRIMARY KEY,
    traceparent TEXT NOT NULL CHECK (length(traceparent) = 55)
) STRICT;

CREATE TABLE job_type_digests (
    id                  INTEGER PRIMARY KEY,
    name                TEXT    NOT NULL,
    digest              TEXT    NOT NULL,
    first_registered_at INTEGER NOT NULL,
    UNIQUE (name, digest)
) STRICT;

CREATE TABLE job_types (
    name       TEXT    PRIMARY KEY,
    config     TEXT    NOT NULL CHECK (json_type(config) = 'object'),
    digest     TEXT    NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;

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
    progress         TEXT, cancel_requested_at INTEGER, confirmed_token INTEGER, unconfirmed_expiries INTEGER NOT NULL DEFAULT 0,
    CHECK ((state = 'running') = (lease_token IS NOT NULL))
) STRICT;

CREATE TABLE keyed_schedules (
    job           TEXT    NOT NULL,
    key           TEXT    NOT NULL CHECK (key <> '' AND length(key) <= 200),
    cron          TEXT    NOT NULL CHECK (length(cron) BETWEEN 1 AND 200),
    time_zone     TEXT    NOT NULL DEFAULT 'UTC',
    payload       TEXT    NOT NULL DEFAULT '{}' CHECK (json_type(payload) = 'object'),
    overlap       TEXT    NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    jitter_ms     INTEGER NOT NULL DEFAULT 0 CHECK (jitter_ms BETWEEN 0 AND 86400000),
    backfill      INTEGER NOT NULL DEFAULT 1 CHECK (backfill BETWEEN 0 AND 1000),
    starts_at     INTEGER CHECK (starts_at BETWEEN -62135596800000 AND 253402214400000),
    ends_at       INTEGER CHECK (ends_at BETWEEN -62135596800000 AND 253402214400000),
    paused        INTEGER NOT NULL DEFAULT 0,
    note          TEXT    NOT NULL DEFAULT '' CHECK (length(note) <= 1000),
    since         INTEGER NOT NULL,
    last_tick     INTEGER,
    last_job      INTEGER,
    buffered_tick INTEGER,
    skipped       INTEGER NOT NULL DEFAULT 0,
    triggered_at  INTEGER,
    look_at       INTEGER,
    handovers     TEXT    NOT NULL DEFAULT '[]' CHECK (json_type(handovers) = 'array'),
    next_tick     INTEGER,
    error         TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (job, key),
    CHECK (ends_at > starts_at)
) STRICT;

CREATE TABLE outbound_grants (
    job_type   TEXT    NOT NULL,
    origin     TEXT    NOT NULL,
    methods    TEXT    NOT NULL DEFAULT '[]',
    secrets    TEXT    NOT NULL DEFAULT '[]',
    private    INTEGER NOT NULL DEFAULT 0,
    idempotency_key INTEGER NOT NULL DEFAULT 0,
    granted_at INTEGER NOT NULL, connect_timeout_ms INTEGER CHECK (connect_timeout_ms > 0), first_byte_timeout_ms INTEGER CHECK (first_byte_timeout_ms > 0), between_bytes_timeout_ms INTEGER CHECK (between_bytes_timeout_ms > 0), secrets_in TEXT NOT NULL DEFAULT '[]', secret_headers TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (job_type, origin)
) STRICT;

CREATE TABLE outbound_secrets (
    name       TEXT    PRIMARY KEY,
    key_id     TEXT    NOT NULL,
    nonce      BLOB    NOT NULL,
    ciphertext BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE queue_pauses (
    name      TEXT    PRIMARY KEY,
    paused_at INTEGER NOT NULL
) STRICT;

CREATE TABLE rate_keys (
    job             TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    -- A JSON array of start times (ms), oldest first.
    starts          TEXT    NOT NULL DEFAULT '[]' CHECK (json_type(starts) = 'array'),
    -- When the key's latest enqueued jobs may start (ms), at most its
    -- limit: an enqueue plans its jobs after these.
    planned         TEXT    NOT NULL DEFAULT '[]' CHECK (json_type(planned) = 'array'),
    throttled_until INTEGER,
    throttles       INTEGER NOT NULL DEFAULT 0,
    deferred        INTEGER NOT NULL DEFAULT 0,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (job, key)
) STRICT;

CREATE TABLE schedule_looks (
    job       TEXT    PRIMARY KEY,
    looked_at INTEGER NOT NULL,
    passed_at INTEGER NOT NULL
) STRICT;

CREATE TABLE schedules (
    job       TEXT    PRIMARY KEY,
    cron      TEXT    NOT NULL,
    time_zone TEXT    NOT NULL,
    since     INTEGER NOT NULL,
    last_tick INTEGER, looked_at INTEGER,
    CHECK (last_tick > since)
) STRICT;

CREATE TABLE semaphores (
    job        TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    holders    INTEGER NOT NULL CHECK (holders >= 0),
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (job, key)
) STRICT;

CREATE TABLE type_variables (
    job_type   TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    value      TEXT    NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (job_type, name)
) STRICT;

CREATE TABLE unique_claims (
    job         TEXT    NOT NULL,
    unique_key  TEXT    NOT NULL,
    job_id      INTEGER NOT NULL,
    lease_token INTEGER,
    claimed_at  INTEGER NOT NULL,
    PRIMARY KEY (job, unique_key)
) WITHOUT ROWID;

CREATE TABLE unique_keys (
    job_id          INTEGER PRIMARY KEY,
    job             TEXT    NOT NULL,
    unique_key      TEXT    NOT NULL,
    while_executing INTEGER NOT NULL
);

CREATE TABLE webhooks (
    name           TEXT PRIMARY KEY,
    event_key      TEXT NOT NULL,
    style          TEXT NOT NULL CHECK (style IN ('stripe', 'github', 'standard')),
    secret         TEXT NOT NULL,
    tolerance_secs INTEGER NOT NULL DEFAULT 300 CHECK (tolerance_secs > 0),
    created_at     INTEGER NOT NULL
) STRICT;

CREATE TABLE workflow_edges (
    step_id   INTEGER NOT NULL REFERENCES workflow_steps ON DELETE CASCADE,
    dep_id    INTEGER NOT NULL REFERENCES workflow_steps ON DELETE CASCADE,
    if_failed TEXT    NOT NULL CHECK (if_failed IN ('cancel', 'run', 'fail')),
    PRIMARY KEY (step_id, dep_id)
) STRICT, WITHOUT ROWID;

CREATE TABLE workflow_steps (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_id INTEGER NOT NULL REFERENCES workflows ON DELETE CASCADE,
    name        TEXT    NOT NULL,
    job         TEXT    NOT NULL,
    payload     TEXT    NOT NULL CHECK (json_type(payload) = 'object'),
    queue       TEXT,
    priority    INTEGER,
    delay_ms    INTEGER NOT NULL DEFAULT 0,
    -- Dependencies not ended yet; released when it reaches zero.
    pending     INTEGER NOT NULL CHECK (pending >= 0),
    -- The job it became.
    job_id      INTEGER UNIQUE,
    released_at INTEGER,
    ended_state TEXT CHECK (ended_state IN ('completed', 'failed', 'discarded', 'cancelled')),
    -- Its output (completed) or last error (else), as JSON.
    result      TEXT,
    ended_at    INTEGER, wait TEXT CHECK (wait IN ('waiting', 'armed', 'ended')),
    UNIQUE (workflow_id, name)
) STRICT;

CREATE TABLE "workflow_waits" (
    step_id     INTEGER PRIMARY KEY REFERENCES workflow_steps ON DELETE CASCADE,
    key         TEXT CHECK (length(CAST(key AS BLOB)) BETWEEN 1 AND 256),
    -- A JSON object: the fields, as text, an event's payload must hold.
    match       TEXT NOT NULL DEFAULT '{}',
    -- A match of one field as the JSON text ["field","value"].
    match_one   TEXT,
    sleep_ms    INTEGER CHECK (sleep_ms >= 0),
    until       INTEGER,
    timeout_ms  INTEGER CHECK (timeout_ms >= 0),
    on_timeout  TEXT NOT NULL DEFAULT 'fail' CHECK (on_timeout IN ('cancel', 'run', 'fail')),
    lookback_ms INTEGER NOT NULL DEFAULT 0 CHECK (lookback_ms >= 0),
    armed_at    INTEGER,
    due_at      INTEGER,
    ended_by    TEXT CHECK (ended_by IN ('event', 'time', 'timeout', 'skipped', 'unmatched')),
    ended_at    INTEGER,
    event_id    INTEGER,
    -- The match's templates, rendered when the wait is armed.
    match_later TEXT CHECK (json_type(match_later) = 'object')
) STRICT;

CREATE TABLE workflows (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    label        TEXT CHECK (length(CAST(label AS BLOB)) <= 256),
    created_at   INTEGER NOT NULL,
    -- Set by `workflow cancel`: no step is released to run after it.
    cancelled_at INTEGER
) STRICT;

CREATE TRIGGER archive_counts_batches AFTER INSERT ON archive WHEN NEW.batch_id IS NOT NULL BEGIN
    UPDATE batches
    SET completed = completed + (NEW.state = 'completed'),
        failed = failed + (NEW.state = 'failed'),
        discarded = discarded + (NEW.state = 'discarded'),
        cancelled = cancelled + (NEW.state = 'cancelled')
    WHERE id = NEW.batch_id;
END;

CREATE TRIGGER archive_ends_workflow_steps AFTER INSERT ON archive BEGIN
    UPDATE workflow_steps
    SET ended_state = NEW.state,
        result = CASE WHEN NEW.state = 'completed' THEN coalesce(NEW.output, 'null')
                      ELSE coalesce(NEW.errors -> '$[#-1].error', 'null') END,
        ended_at = NEW.finished_at
    WHERE job_id = NEW.id AND ended_state IS NULL;
END;

CREATE TRIGGER archive_keep_newest_errors
AFTER INSERT ON archive
WHEN json_array_length(NEW.errors) > 25
BEGIN
    UPDATE archive SET errors = (
        SELECT json_group_array(json(value) ORDER BY key)
        FROM json_each(NEW.errors) WHERE key >= json_array_length(NEW.errors) - 25
    ) WHERE id = NEW.id;
END;

CREATE TRIGGER archive_releases_unique AFTER INSERT ON archive BEGIN
    DELETE FROM unique_claims WHERE job_id = NEW.id;
    DELETE FROM unique_keys WHERE job_id = NEW.id;
END;

CREATE TRIGGER blocked_jobs_keep_newest_errors
AFTER INSERT ON blocked_jobs
WHEN json_array_length(NEW.errors) > 25
BEGIN
    UPDATE blocked_jobs SET errors = (
        SELECT json_group_array(json(value) ORDER BY key)
        FROM json_each(NEW.errors) WHERE key >= json_array_length(NEW.errors) - 25
    ) WHERE id = NEW.id;
END;

CREATE TRIGGER job_types_forward_only BEFORE UPDATE OF digest ON job_types BEGIN
    INSERT INTO job_type_digests (name, digest, first_registered_at)
        SELECT NEW.name, NEW.digest, NEW.updated_at
        WHERE NOT EXISTS (SELECT 1 FROM job_type_digests WHERE name = NEW.name AND digest = NEW.digest);
    SELECT RAISE(IGNORE)
    WHERE (SELECT id FROM job_type_digests WHERE name = NEW.name AND digest = NEW.digest)
        < (SELECT id FROM job_type_digests WHERE name = OLD.name AND digest = OLD.digest);
END;

CREATE TRIGGER job_types_record_digest BEFORE INSERT ON job_types BEGIN
    INSERT INTO job_type_digests (name, digest, first_registered_at)
        SELECT NEW.name, NEW.digest, NEW.updated_at
        WHERE NOT EXISTS (SELECT 1 FROM job_type_digests WHERE name = NEW.name AND digest = NEW.digest);
END;

CREATE TRIGGER job_types_schedules_insert AFTER INSERT ON job_types BEGIN
    INSERT INTO schedules (job, cron, time_zone, since)
        SELECT name, cron, time_zone, updated_at FROM job_type_calendars
        WHERE name = NEW.name AND cron IS NOT NULL;
END;

CREATE TRIGGER job_types_schedules_update AFTER UPDATE OF config ON job_types BEGIN
    DELETE FROM schedules
        WHERE job = NEW.name
          AND NOT EXISTS (SELECT 1 FROM job_type_calendars c WHERE c.name = NEW.name AND c.cron IS NOT NULL);
    UPDATE schedules
        SET cron = c.cron, time_zone = c.time_zone,
            since = max(c.updated_at, coalesce(schedules.last_tick, schedules.since), schedules.since),
            last_tick = NULL
        FROM (SELECT cron, time_zone, updated_at FROM job_type_calendars WHERE name = NEW.name) c
        WHERE schedules.job = NEW.name
          AND (c.cron IS NOT schedules.cron OR c.time_zone IS NOT schedules.time_zone);
    INSERT INTO schedules (job, cron, time_zone, since)
        SELECT name, cron, time_zone, updated_at FROM job_type_calendars
        WHERE name = NEW.name AND cron IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM schedules WHERE job = NEW.name);
END;

CREATE TRIGGER jobs_keep_newest_errors
AFTER UPDATE OF errors ON jobs
WHEN json_array_length(NEW.errors) > 25
BEGIN
    UPDATE jobs SET errors = (
        SELECT json_group_array(json(value) ORDER BY key)
        FROM json_each(NEW.errors) WHERE key >= json_array_length(NEW.errors) - 25
    ) WHERE id = NEW.id;
END;

CREATE TRIGGER jobs_release_unique_run AFTER UPDATE OF lease_token ON jobs
    WHEN OLD.lease_token IS NOT NULL AND OLD.lease_token IS NOT NEW.lease_token
BEGIN
    DELETE FROM unique_claims WHERE job_id = OLD.id AND lease_token = OLD.lease_token;
END;

CREATE TRIGGER workflow_step_ends AFTER UPDATE OF ended_state ON workflow_steps
    WHEN OLD.ended_state IS NULL AND NEW.ended_state IS NOT NULL
BEGIN
    UPDATE workflow_steps SET pending = pending - 1
    WHERE id IN (SELECT step_id FROM workflow_edges WHERE dep_id = NEW.id);
END;

CREATE VIEW job_type_calendars AS
    SELECT name,
           updated_at,
           CASE json_type(config, '$.schedule')
               WHEN 'text' THEN json_extract(config, '$.schedule')
               WHEN 'object' THEN json_extract(config, '$.schedule.cron')
           END AS cron,
           CASE json_type(config, '$.schedule')
               WHEN 'text' THEN 'UTC'
               WHEN 'object' THEN coalesce(json_extract(config, '$.schedule.time_zone'), 'UTC')
           END AS time_zone
    FROM job_types;

CREATE VIEW workflow_step_states AS
SELECT s.*,
       CASE
           WHEN s.ended_state IS NOT NULL THEN s.ended_state
           WHEN s.job_id IS NULL THEN 'waiting'
           WHEN j.state IS NOT NULL THEN j.state
           WHEN EXISTS (SELECT 1 FROM blocked_jobs b WHERE b.id = s.job_id) THEN 'blocked'
           ELSE 'waiting'
       END AS state
FROM workflow_steps s
LEFT JOIN jobs j ON j.id = s.job_id;

