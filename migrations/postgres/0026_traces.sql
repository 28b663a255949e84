-- The trace context an enqueue carried (docs/observability.md, "Traces"):
-- a W3C traceparent per job that was enqueued inside a trace, so the run
-- that a host starts, on any host and at any later time, joins the trace
-- of the request that enqueued it. A table of its own, keyed by the job's
-- id, which a job keeps from enqueue through the gate, retries and the
-- archive: no path that moves a job between tables needs to know of it,
-- and a job enqueued outside any trace costs nothing here. Rows go with
-- their job's archive row when the archive is pruned.
CREATE TABLE jobhost.job_traces (
    job_id      bigint PRIMARY KEY,
    traceparent text NOT NULL CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$')
);

-- The SQL enqueue (last in 0023_workflows) with an optional trace context:
-- `traceparent => '00-…'`. Dropped and created again with the new argument
-- (calls by position or by name keep working); privileges granted on the
-- old function must be granted again. A duplicate of a unique job answers
-- with the holder's id and records nothing: the holder keeps its own trace.
DROP FUNCTION jobhost.enqueue(text, jsonb, text, smallint, timestamptz, bigint);

CREATE FUNCTION jobhost.enqueue(
    job text,
    payload jsonb,
    queue text DEFAULT NULL,
    priority smallint DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    batch_id bigint DEFAULT NULL,
    traceparent text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    new_id bigint := nextval('jobhost.job_ids');
    stored bigint;
BEGIN
    IF traceparent IS NOT NULL AND traceparent !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION 'traceparent "%" is not a W3C trace context: 00-<32 hex>-<16 hex>-<2 hex>, lowercase',
            traceparent USING ERRCODE = '22023';
    END IF;
    stored := jobhost.enqueue_as(new_id, job, payload, queue, priority, run_at, batch_id);
    IF traceparent IS NOT NULL AND stored = new_id THEN
        INSERT INTO jobhost.job_traces (job_id, traceparent) VALUES (new_id, traceparent);
    END IF;
    RETURN stored;
END;
$$;
