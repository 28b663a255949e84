-- Batches: a group of jobs counted as they end, with callback jobs enqueued
-- exactly once when the last member ends (see
-- migrations/postgres/0009_batches.sql, which this follows). Here every
-- write holds the file's one write lock, so the counts need no row locks;
-- a trigger counts each archived member, whichever path archived it, and
-- the writer settles finished batches (their callbacks) just before it
-- commits, in the same transaction.

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

-- The writer's look, before each commit, for batches to settle: closed,
-- unfinished and with every member ended. The index holds just those, so
-- the look costs nothing however many batches are open or running.
CREATE INDEX batches_due ON batches (id)
    WHERE closed_at IS NOT NULL AND finished_at IS NULL AND completed + failed + discarded + cancelled >= total;
CREATE INDEX batches_finished ON batches (finished_at) WHERE finished_at IS NOT NULL;

CREATE INDEX jobs_batch ON jobs (batch_id) WHERE batch_id IS NOT NULL;
CREATE INDEX blocked_jobs_batch ON blocked_jobs (batch_id) WHERE batch_id IS NOT NULL;
CREATE INDEX archive_batch ON archive (batch_id) WHERE batch_id IS NOT NULL;

-- An archived member is counted by its ending.
CREATE TRIGGER archive_counts_batches AFTER INSERT ON archive WHEN NEW.batch_id IS NOT NULL BEGIN
    UPDATE batches
    SET completed = completed + (NEW.state = 'completed'),
        failed = failed + (NEW.state = 'failed'),
        discarded = discarded + (NEW.state = 'discarded'),
        cancelled = cancelled + (NEW.state = 'cancelled')
    WHERE id = NEW.batch_id;
END;
