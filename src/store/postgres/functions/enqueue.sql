-- jobhost.enqueue: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0026_traces.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.enqueue(job text, payload jsonb, queue text DEFAULT NULL::text, priority smallint DEFAULT NULL::smallint, run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, batch_id bigint DEFAULT NULL::bigint, traceparent text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql
    AS $_$
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
$_$;
