-- jobhost.schedules_follow_registration: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0014_schedule_since.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.schedules_follow_registration() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    declared record;
BEGIN
    SELECT * INTO declared FROM jobhost.calendar_of(NEW.config);
    IF declared.cron IS NULL THEN
        DELETE FROM jobhost.schedules WHERE job = NEW.name;
        RETURN NULL;
    END IF;
    INSERT INTO jobhost.schedules (job, cron, time_zone, since)
    VALUES (NEW.name, declared.cron, declared.time_zone, clock_timestamp())
    ON CONFLICT (job) DO UPDATE
        SET cron = excluded.cron, time_zone = excluded.time_zone,
            since = greatest(excluded.since, jobhost.schedules.last_tick, jobhost.schedules.since),
            last_tick = NULL
        WHERE (jobhost.schedules.cron, jobhost.schedules.time_zone)
              IS DISTINCT FROM (excluded.cron, excluded.time_zone);
    RETURN NULL;
END;
$$;
