-- Event triggers (docs/events.md): the jobs an event enqueued for the job
-- types subscribed to its key, each `{"job", "id"}`, or `{"job", "error"}`
-- where the type's enqueue was refused.
ALTER TABLE events ADD COLUMN jobs TEXT NOT NULL DEFAULT '[]' CHECK (json_type(jobs) = 'array');

-- A wait's match whose templates name a field its step's payload lacks,
-- for a step with dependencies: rendered when the wait is armed, from the
-- payload and the dependencies' outputs (docs/workflows.md); a field in
-- none of them ends the wait `unmatched`, and its step fails. SQLite
-- changes a CHECK only by building the table again.
CREATE TABLE workflow_waits_new (
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
INSERT INTO workflow_waits_new
    (step_id, key, match, match_one, sleep_ms, until, timeout_ms, on_timeout, lookback_ms, armed_at, due_at,
     ended_by, ended_at, event_id)
SELECT step_id, key, match, match_one, sleep_ms, until, timeout_ms, on_timeout, lookback_ms, armed_at, due_at,
       ended_by, ended_at, event_id
FROM workflow_waits;
DROP TABLE workflow_waits;
ALTER TABLE workflow_waits_new RENAME TO workflow_waits;
CREATE INDEX workflow_waits_open_key ON workflow_waits (key, match_one)
    WHERE ended_by IS NULL AND armed_at IS NOT NULL AND key IS NOT NULL;
CREATE INDEX workflow_waits_open_due ON workflow_waits (due_at)
    WHERE ended_by IS NULL AND due_at IS NOT NULL;
