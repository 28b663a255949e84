-- A registration that changes a job type's calendar starts it afresh at the
-- registration, never before a tick already enqueued under the old one
-- (see migrations/postgres/0014_schedule_since.sql). The row is changed in
-- place rather than deleted and inserted again, so its cursor is still
-- there to be the floor of the new `since`.
DROP TRIGGER job_types_schedules_update;

CREATE TRIGGER job_types_schedules_update AFTER UPDATE OF config ON job_types BEGIN
    DELETE FROM schedules
        WHERE job = NEW.name
          AND NOT EXISTS (SELECT 1 FROM job_type_calendars c WHERE c.name = NEW.name AND c.cron IS NOT NULL);
    UPDATE schedules
        SET cron = c.cron, time_zone = c.time_zone,
            since = max(c.updated_at, coalesce(schedules.last_tick, schedules.since), schedules.since),
            last_tick = NULL
        FROM (SELECT cron, time_zone, updated_at FROM job_type_calendars WHERE name = NEW.name) c
        WHERE schedules.job = NEW.name
          AND (c.cron IS NOT schedules.cron OR c.time_zone IS NOT schedules.time_zone);
    INSERT INTO schedules (job, cron, time_zone, since)
        SELECT name, cron, time_zone, updated_at FROM job_type_calendars
        WHERE name = NEW.name AND cron IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM schedules WHERE job = NEW.name);
END;
