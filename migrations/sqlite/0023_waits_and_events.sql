-- Durable waits and events (docs/events.md, DESIGN guarantee 17), as on
-- PostgreSQL (migrations/postgres/0050_waits_and_events.sql): a step with a
-- wait is 'waiting' until its dependencies end, 'armed' until its wait
-- ends, then 'ended' and released. The writer's look before each commit
-- passes over armed steps, so steps held by their waits cost it nothing.
ALTER TABLE workflow_steps ADD COLUMN wait TEXT CHECK (wait IN ('waiting', 'armed', 'ended'));
DROP INDEX workflow_steps_ready;
CREATE INDEX workflow_steps_ready ON workflow_steps (id)
    WHERE pending = 0 AND job_id IS NULL AND (wait IS NULL OR wait <> 'armed');

CREATE TABLE workflow_waits (
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
    ended_by    TEXT CHECK (ended_by IN ('event', 'time', 'timeout', 'skipped')),
    ended_at    INTEGER,
    event_id    INTEGER
) STRICT;
CREATE INDEX workflow_waits_open_key ON workflow_waits (key, match_one)
    WHERE ended_by IS NULL AND armed_at IS NOT NULL AND key IS NOT NULL;
CREATE INDEX workflow_waits_open_due ON workflow_waits (due_at)
    WHERE ended_by IS NULL AND due_at IS NOT NULL;

CREATE TABLE events (
    id              INTEGER PRIMARY KEY,
    key             TEXT NOT NULL CHECK (length(CAST(key AS BLOB)) BETWEEN 1 AND 256),
    payload         TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    source          TEXT NOT NULL DEFAULT 'sql',
    sent_at         INTEGER NOT NULL,
    released        INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX events_key_sent ON events (key, sent_at);
CREATE INDEX events_sent ON events (sent_at);

-- Inbound webhooks: a signed request to /hooks/NAME becomes an event.
CREATE TABLE webhooks (
    name           TEXT PRIMARY KEY,
    event_key      TEXT NOT NULL,
    style          TEXT NOT NULL CHECK (style IN ('stripe', 'github', 'standard')),
    secret         TEXT NOT NULL,
    tolerance_secs INTEGER NOT NULL DEFAULT 300 CHECK (tolerance_secs > 0),
    created_at     INTEGER NOT NULL
) STRICT;
