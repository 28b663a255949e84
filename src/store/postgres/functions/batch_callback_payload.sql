-- jobhost.batch_callback_payload: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0009_batches.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.batch_callback_payload(b jobhost.batches) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT b.callback_payload || jsonb_build_object('_batch', jsonb_build_object(
        'id', b.id,
        'label', b.label,
        'succeeded', b.failed + b.discarded = 0,
        'total', b.total,
        'completed', b.completed,
        'failed', b.failed,
        'discarded', b.discarded,
        'cancelled', b.cancelled))
$$;
