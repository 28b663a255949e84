-- jobhost.calendar_of: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0008_schedules.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.calendar_of(config jsonb, OUT cron text, OUT time_zone text) RETURNS record
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE jsonb_typeof(config -> 'schedule')
               WHEN 'string' THEN config ->> 'schedule'
               WHEN 'object' THEN config -> 'schedule' ->> 'cron'
           END,
           CASE jsonb_typeof(config -> 'schedule')
               WHEN 'string' THEN 'UTC'
               WHEN 'object' THEN coalesce(config -> 'schedule' ->> 'time_zone', 'UTC')
           END
$$;
