-- Workflows: named steps with dependencies between them, each an ordinary
-- job once released (see migrations/postgres/0023_workflows.sql, which
-- this follows). Here every write holds the file's one write lock, so the
-- counts need no row locks: a trigger ends an archived job's step, another
-- counts an ended step down in its dependents, and the writer releases the
-- steps whose count reached zero just before it commits, in the same
-- transaction (`workflow::settle`), wave by wave until none is left.

CREATE TABLE workflows (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    label        TEXT CHECK (length(CAST(label AS BLOB)) <= 256),
    created_at   INTEGER NOT NULL,
    -- Set by `workflow cancel`: no step is released to run after it.
    cancelled_at INTEGER
) STRICT;
CREATE INDEX workflows_created ON workflows (created_at);

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
    ended_at    INTEGER,
    UNIQUE (workflow_id, name)
) STRICT;
CREATE INDEX workflow_steps_live ON workflow_steps (workflow_id) WHERE ended_state IS NULL;
-- The writer's look before each commit: steps due for release. Almost
-- always empty, so the look costs nothing however many steps wait.
CREATE INDEX workflow_steps_ready ON workflow_steps (id) WHERE pending = 0 AND job_id IS NULL;

CREATE TABLE workflow_edges (
    step_id   INTEGER NOT NULL REFERENCES workflow_steps ON DELETE CASCADE,
    dep_id    INTEGER NOT NULL REFERENCES workflow_steps ON DELETE CASCADE,
    if_failed TEXT    NOT NULL CHECK (if_failed IN ('cancel', 'run', 'fail')),
    PRIMARY KEY (step_id, dep_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX workflow_edges_dep ON workflow_edges (dep_id);

-- An archived job that is a step ends it, once.
CREATE TRIGGER archive_ends_workflow_steps AFTER INSERT ON archive BEGIN
    UPDATE workflow_steps
    SET ended_state = NEW.state,
        result = CASE WHEN NEW.state = 'completed' THEN coalesce(NEW.output, 'null')
                      ELSE coalesce(NEW.errors -> '$[#-1].error', 'null') END,
        ended_at = NEW.finished_at
    WHERE job_id = NEW.id AND ended_state IS NULL;
END;

-- An ended step counts down in each of its dependents, whatever ended it.
CREATE TRIGGER workflow_step_ends AFTER UPDATE OF ended_state ON workflow_steps
    WHEN OLD.ended_state IS NULL AND NEW.ended_state IS NOT NULL
BEGIN
    UPDATE workflow_steps SET pending = pending - 1
    WHERE id IN (SELECT step_id FROM workflow_edges WHERE dep_id = NEW.id);
END;

-- Each step with where it is: waiting (no job yet), its job's state, or how it ended.
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
