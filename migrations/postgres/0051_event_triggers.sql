-- Event triggers (docs/events.md): the jobs an event enqueued for the job
-- types subscribed to its key, each `{"job", "id"}`, or `{"job", "error"}`
-- where the type's enqueue was refused.
ALTER TABLE jobhost.events ADD COLUMN jobs jsonb NOT NULL DEFAULT '[]';

-- A wait left unarmed records the transaction that left it (beside its
-- snapshot): an event that transaction sends afterwards (a run's own
-- `events.send`, written with its completion) came after the dependency
-- ended, and its own snapshot cannot say so.
ALTER TABLE jobhost.workflow_waits ADD COLUMN deferred_by xid8;
