-- Uniqueness: at most one job of a type per rendered key, from enqueue
-- until the job leaves the queue for good (until_executed) or while it
-- runs (while_executing). The same tables and release rules as PostgreSQL's
-- 0007_uniqueness.sql, which explains them; here every write holds the
-- file's one write lock, so claims need no conflict handling beyond the
-- primary key.

-- The rendered key of every live unique job, by job id: it survives a
-- job's moves between jobs and blocked_jobs.
CREATE TABLE unique_keys (
    job_id          INTEGER PRIMARY KEY,
    job             TEXT    NOT NULL,
    unique_key      TEXT    NOT NULL,
    while_executing INTEGER NOT NULL
);

-- Who holds each (type, key): the job enqueued first (until_executed) or
-- the run holding it, by its lease token (while_executing).
CREATE TABLE unique_claims (
    job         TEXT    NOT NULL,
    unique_key  TEXT    NOT NULL,
    job_id      INTEGER NOT NULL,
    lease_token INTEGER,
    claimed_at  INTEGER NOT NULL,
    PRIMARY KEY (job, unique_key)
) WITHOUT ROWID;

CREATE INDEX unique_claims_job_id ON unique_claims (job_id);

-- An archived job gives back its key and claim, whichever path archived it.
CREATE TRIGGER archive_releases_unique AFTER INSERT ON archive BEGIN
    DELETE FROM unique_claims WHERE job_id = NEW.id;
    DELETE FROM unique_keys WHERE job_id = NEW.id;
END;

-- A run that ends without archiving its job gives back a while_executing
-- claim only while the claim is bound to that run's token: a stale result
-- matches no current token, changes no row and releases nothing.
CREATE TRIGGER jobs_release_unique_run AFTER UPDATE OF lease_token ON jobs
    WHEN OLD.lease_token IS NOT NULL AND OLD.lease_token IS NOT NEW.lease_token
BEGIN
    DELETE FROM unique_claims WHERE job_id = OLD.id AND lease_token = OLD.lease_token;
END;
