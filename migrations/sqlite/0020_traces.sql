-- The trace context an enqueue carried (docs/observability.md, "Traces"):
-- a W3C traceparent per job enqueued inside a trace, keyed by the job's id,
-- which a job keeps through the gate, retries and the archive. Rows go with
-- their job's archive row when the archive is pruned.
CREATE TABLE job_traces (
    job_id      INTEGER PRIMARY KEY,
    traceparent TEXT NOT NULL CHECK (length(traceparent) = 55)
) STRICT;
