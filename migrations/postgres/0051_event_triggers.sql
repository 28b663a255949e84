-- Event triggers (docs/events.md): the jobs an event enqueued for the job
-- types subscribed to its key, each `{"job", "id"}`, or `{"job", "error"}`
-- where the type's enqueue was refused.
ALTER TABLE jobhost.events ADD COLUMN jobs jsonb NOT NULL DEFAULT '[]';

-- A wait left unarmed records the transaction that left it (beside its
-- snapshot): an event that transaction sends afterwards (a run's own
-- `events.send`, written with its completion) came after the dependency
-- ended, and its own snapshot cannot say so.
ALTER TABLE jobhost.workflow_waits ADD COLUMN deferred_by xid8;

-- A wait's match whose templates name a field its step's payload lacks,
-- for a step with dependencies: rendered when the wait is armed, from the
-- payload and the dependencies' outputs (docs/workflows.md). A field in
-- none of them ends the wait `unmatched`, and its step fails.
ALTER TABLE jobhost.workflow_waits ADD COLUMN match_later jsonb CHECK (jsonb_typeof(match_later) = 'object');
ALTER TABLE jobhost.workflow_waits DROP CONSTRAINT workflow_waits_ended_by_check;
ALTER TABLE jobhost.workflow_waits ADD CONSTRAINT workflow_waits_ended_by_check
    CHECK (ended_by IN ('event', 'time', 'timeout', 'skipped', 'unmatched')) NOT VALID;
ALTER TABLE jobhost.workflow_waits VALIDATE CONSTRAINT workflow_waits_ended_by_check;
