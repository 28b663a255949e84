-- jobhost.unpaused: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0034_hot_helpers_in_plpgsql.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.unpaused(queues text[]) RETURNS text[]
    LANGUAGE plpgsql STABLE
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(q), '{}')
            FROM unnest(queues) AS q
            WHERE NOT EXISTS (SELECT 1 FROM jobhost.queue_pauses p WHERE p.name = q));
END;
$$;
