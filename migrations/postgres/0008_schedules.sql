-- Schedules: the fleet enqueues one job per tick of each scheduled job
-- type, and this table is what decides that a tick was enqueued.

-- One row per job type whose registered configuration declares a schedule.
-- `cron` and `time_zone` are the calendar the row counts ticks of; `since`
-- is when that calendar was registered (its first tick is the first after
-- it, never one from before). `last_tick` is the cursor: the latest tick
-- the fleet has enqueued. A host enqueues a tick's job only in the
-- transaction that moves `last_tick` forward from the value it read (a
-- compare-and-set on this row), so each tick is enqueued once however many
-- hosts look, and a host that dies mid-way enqueued all of it or nothing.
-- Nothing here depends on the enqueued jobs: they may finish and be pruned.
CREATE TABLE jobhost.schedules (
    job       text PRIMARY KEY,
    cron      text        NOT NULL,
    time_zone text        NOT NULL,
    since     timestamptz NOT NULL DEFAULT now(),
    last_tick timestamptz,
    CHECK (last_tick > since)
);

-- The calendar a stored configuration declares: its expression and zone,
-- or nulls without a schedule. Hosts before WIT 0.2.0 stored the bare
-- expression, read in UTC.
CREATE FUNCTION jobhost.calendar_of(config jsonb, OUT cron text, OUT time_zone text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE jsonb_typeof(config -> 'schedule')
               WHEN 'string' THEN config ->> 'schedule'
               WHEN 'object' THEN config -> 'schedule' ->> 'cron'
           END,
           CASE jsonb_typeof(config -> 'schedule')
               WHEN 'string' THEN 'UTC'
               WHEN 'object' THEN coalesce(config -> 'schedule' ->> 'time_zone', 'UTC')
           END
$$;

-- A registration that changes a job type's calendar starts it afresh from
-- now (its ticks counted from this registration on); one that keeps the
-- calendar (a new build, a new payload or backfill) keeps the cursor; one
-- without a schedule removes the row, which stops the ticks. A registration
-- that changed nothing (the same digest, or an older one the forward-only
-- rule skipped) fires no trigger at all. In the database, so that every
-- writer of job_types obeys it, an older jobhost included.
CREATE FUNCTION jobhost.schedules_follow_registration() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    declared record;
BEGIN
    SELECT * INTO declared FROM jobhost.calendar_of(NEW.config);
    IF declared.cron IS NULL THEN
        DELETE FROM jobhost.schedules WHERE job = NEW.name;
        RETURN NULL;
    END IF;
    INSERT INTO jobhost.schedules (job, cron, time_zone) VALUES (NEW.name, declared.cron, declared.time_zone)
    ON CONFLICT (job) DO UPDATE
        SET cron = excluded.cron, time_zone = excluded.time_zone, since = excluded.since, last_tick = NULL
        WHERE (jobhost.schedules.cron, jobhost.schedules.time_zone)
              IS DISTINCT FROM (excluded.cron, excluded.time_zone);
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_types_schedules
    AFTER INSERT OR UPDATE OF config ON jobhost.job_types
    FOR EACH ROW EXECUTE FUNCTION jobhost.schedules_follow_registration();

-- Schedules registered before this migration were never enforced: they
-- start now.
INSERT INTO jobhost.schedules (job, cron, time_zone)
    SELECT t.name, c.cron, c.time_zone
    FROM jobhost.job_types t, jobhost.calendar_of(t.config) c
    WHERE c.cron IS NOT NULL;
