-- A registration that changes a job type's calendar starts it afresh at the
-- moment it writes the schedule's row, never before a tick the fleet has
-- already enqueued. Before, `since` was the registering transaction's start
-- (`now()`): a tick of the old calendar written while that transaction was
-- open (a `jobhost deploy` uploading its bytes widens the window) fell after
-- `since`, and the new calendar enqueued it again. The row's lock orders the
-- two: a tick written before the registration reaches the row is in
-- `last_tick` when it does; one that would be written after waits for the
-- registration to commit and then finds the calendar changed.
CREATE OR REPLACE FUNCTION jobhost.schedules_follow_registration() RETURNS trigger LANGUAGE plpgsql AS $$
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
