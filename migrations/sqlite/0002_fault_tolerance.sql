-- What a host needs to keep its guarantees under faults and bad rows.

-- Each host records its own heartbeat interval, so liveness is judged by
-- the interval the host promised rather than one fixed window.
ALTER TABLE hosts ADD COLUMN heartbeat_ms INTEGER NOT NULL DEFAULT 5000 CHECK (heartbeat_ms > 0);

-- A job keeps the errors of its newest attempts only, so a job with many
-- attempts cannot grow its row without bound.
CREATE TRIGGER jobs_keep_newest_errors
AFTER UPDATE OF errors ON jobs
WHEN json_array_length(NEW.errors) > 25
BEGIN
    UPDATE jobs SET errors = (
        SELECT json_group_array(json(value) ORDER BY key)
        FROM json_each(NEW.errors) WHERE key >= json_array_length(NEW.errors) - 25
    ) WHERE id = NEW.id;
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

CREATE TRIGGER archive_keep_newest_errors
AFTER INSERT ON archive
WHEN json_array_length(NEW.errors) > 25
BEGIN
    UPDATE archive SET errors = (
        SELECT json_group_array(json(value) ORDER BY key)
        FROM json_each(NEW.errors) WHERE key >= json_array_length(NEW.errors) - 25
    ) WHERE id = NEW.id;
END;

-- Queues an operator paused: no host leases a job from them (jobs already
-- running finish). A row per paused queue; resuming deletes it.
CREATE TABLE queue_pauses (
    name      TEXT    PRIMARY KEY,
    paused_at INTEGER NOT NULL
) STRICT;

-- An operator asked to cancel this running job (milliseconds). The host
-- running it learns it from its next lease renewal, stops the guest and
-- archives the job as cancelled in the transaction that gives back its slot;
-- if that host is gone, the lease's expiry archives it as cancelled instead.
ALTER TABLE jobs ADD COLUMN cancel_requested_at INTEGER;
