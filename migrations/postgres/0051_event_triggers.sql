-- Event triggers (docs/events.md): the jobs an event enqueued for the job
-- types subscribed to its key, each `{"job", "id"}`, or `{"job", "error"}`
-- where the type's enqueue was refused.
ALTER TABLE jobhost.events ADD COLUMN jobs jsonb NOT NULL DEFAULT '[]';
