-- Schedules: the fleet enqueues one job per tick of each scheduled job
-- type, and this table is what decides that a tick was enqueued (see
-- migrations/postgres/0008_schedules.sql, which this follows).

-- One row per job type whose registered configuration declares a schedule:
-- the calendar it counts ticks of (`cron`, `time_zone`), when that calendar
-- was registered (`since`, milliseconds), and the cursor (`last_tick`: the
-- latest tick enqueued), moved forward with a compare-and-set in the write
-- transaction that inserts the tick's jobs.
CREATE TABLE schedules (
    job       TEXT    PRIMARY KEY,
    cron      TEXT    NOT NULL,
    time_zone TEXT    NOT NULL,
    since     INTEGER NOT NULL,
    last_tick INTEGER,
    CHECK (last_tick > since)
) STRICT;

-- The calendar a stored configuration declares, or nulls without a
-- schedule (hosts before WIT 0.2.0 stored the bare expression, read in UTC).
CREATE VIEW job_type_calendars AS
    SELECT name,
           updated_at,
           CASE json_type(config, '$.schedule')
               WHEN 'text' THEN json_extract(config, '$.schedule')
               WHEN 'object' THEN json_extract(config, '$.schedule.cron')
           END AS cron,
           CASE json_type(config, '$.schedule')
               WHEN 'text' THEN 'UTC'
               WHEN 'object' THEN coalesce(json_extract(config, '$.schedule.time_zone'), 'UTC')
           END AS time_zone
    FROM job_types;

-- A registration that changes a job type's calendar starts it afresh from
-- the registration; one that keeps it keeps the cursor; one without a
-- schedule removes the row. A registration the forward-only rule skipped
-- (RAISE(IGNORE)) runs no AFTER trigger. Two statements rather than an
-- upsert: an upsert's conflict policy overrides the one of statements in
-- its triggers, and registrations are upserts.
CREATE TRIGGER job_types_schedules_insert AFTER INSERT ON job_types BEGIN
    INSERT INTO schedules (job, cron, time_zone, since)
        SELECT name, cron, time_zone, updated_at FROM job_type_calendars
        WHERE name = NEW.name AND cron IS NOT NULL;
END;

CREATE TRIGGER job_types_schedules_update AFTER UPDATE OF config ON job_types BEGIN
    DELETE FROM schedules
        WHERE job = NEW.name
          AND NOT EXISTS (SELECT 1 FROM job_type_calendars c
                          WHERE c.name = NEW.name AND c.cron IS schedules.cron
                            AND c.time_zone IS schedules.time_zone);
    INSERT INTO schedules (job, cron, time_zone, since)
        SELECT name, cron, time_zone, updated_at FROM job_type_calendars
        WHERE name = NEW.name AND cron IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM schedules WHERE job = NEW.name);
END;

-- Schedules registered before this migration were never enforced: they
-- start now.
INSERT INTO schedules (job, cron, time_zone, since)
    SELECT name, cron, time_zone, CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM job_type_calendars WHERE cron IS NOT NULL;
