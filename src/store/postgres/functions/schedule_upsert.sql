-- jobhost.schedule_upsert: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
--
-- Creates or replaces the schedule of a job type and key (docs/schedules.md,
-- "Schedules made at run time"), in the caller's transaction: an
-- application may write a customer's schedule with the customer. Every
-- field is checked first, and a bad one refused (SQLSTATE 22023, the
-- message naming the field), storing nothing. True when it created the
-- schedule, false when it replaced one. The change is recorded in the
-- audit trail (`jobhost.audit_write`).
--
-- A change of the calendar (cron, zone or start) hands over at this
-- instant: ticks of the old one up to it (within its start and end) that
-- no pass has enqueued yet are still enqueued, and the new one counts from
-- after it; each replaced calendar is kept in `handovers` until a pass has
-- done its ticks (the 16 latest). A resume counts from now (ticks while
-- paused are not made up). `paused` and `note` left null keep what the
-- schedule has (an application rewriting a schedule does not undo an
-- operator's pause). The row's lock orders this against a pass: one that
-- holds it first has done its ticks, and one that comes after reads this.
CREATE OR REPLACE FUNCTION jobhost.schedule_upsert(
    schedule_job text, schedule_key text, schedule_cron text,
    schedule_time_zone text DEFAULT 'UTC', schedule_payload jsonb DEFAULT '{}',
    schedule_overlap text DEFAULT 'allow', schedule_jitter_ms bigint DEFAULT 0,
    schedule_backfill integer DEFAULT 1, schedule_starts_at timestamptz DEFAULT NULL,
    schedule_ends_at timestamptz DEFAULT NULL, schedule_paused boolean DEFAULT NULL,
    schedule_note text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    overlap text := replace(coalesce(schedule_overlap, 'allow'), '-', '_');
    fields text[] := regexp_split_to_array(btrim(coalesce(schedule_cron, '')), '\s+');
    max_payload_bytes bigint :=
        coalesce(nullif(current_setting('jobhost.max_payload_bytes', true), '')::bigint, 1048576);
    earliest constant timestamptz := '0001-01-01 00:00:00+00';
    latest constant timestamptz := '9999-12-31 00:00:00+00';
    created boolean;
    changed_at timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM jobhost.job_types t WHERE t.name = schedule_job) THEN
        RAISE EXCEPTION 'invalid schedule: job: no job type % is registered', coalesce(quote_literal(schedule_job), 'null')
            USING ERRCODE = '22023';
    END IF;
    IF schedule_key IS NULL OR schedule_key = '' THEN
        RAISE EXCEPTION 'invalid schedule: key: must not be empty (the empty key is the schedule the job type declares)'
            USING ERRCODE = '22023';
    END IF;
    IF char_length(schedule_key) > 200 OR schedule_key ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid schedule: key: at most 200 characters, none of them control characters'
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(fields) NOT IN (5, 6) OR EXISTS (SELECT 1 FROM unnest(fields) f WHERE f !~ '^[0-9A-Za-z*?/,#-]+$') THEN
        RAISE EXCEPTION 'invalid schedule: cron: % is not a cron expression of five fields, or six with seconds first',
            coalesce(quote_literal(schedule_cron), 'null') USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM jobhost.time_zones z WHERE z.name = schedule_time_zone) THEN
        RAISE EXCEPTION 'invalid schedule: time_zone: % is not an IANA time zone such as ''Europe/Berlin''',
            coalesce(quote_literal(schedule_time_zone), 'null') USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(schedule_payload) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'invalid schedule: payload: must be a JSON object, got %', coalesce(jsonb_typeof(schedule_payload), 'null')
            USING ERRCODE = '22023';
    END IF;
    IF schedule_payload ? '_tick' OR schedule_payload ? '_schedule' THEN
        RAISE EXCEPTION 'invalid schedule: payload: may not have a "_tick" or "_schedule" field: the host adds them'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(schedule_payload::text) > max_payload_bytes THEN
        RAISE EXCEPTION 'invalid schedule: payload: % bytes of JSON, more than the largest accepted, % bytes',
            octet_length(schedule_payload::text), max_payload_bytes USING ERRCODE = '22023';
    END IF;
    IF overlap NOT IN ('allow', 'skip', 'buffer_one') THEN
        RAISE EXCEPTION 'invalid schedule: overlap: % is not one of allow, skip, buffer-one', quote_literal(schedule_overlap)
            USING ERRCODE = '22023';
    END IF;
    IF schedule_jitter_ms IS NULL OR schedule_jitter_ms NOT BETWEEN 0 AND 86400000 THEN
        RAISE EXCEPTION 'invalid schedule: jitter: must be between 0 and a day' USING ERRCODE = '22023';
    END IF;
    IF schedule_backfill IS NULL OR schedule_backfill NOT BETWEEN 0 AND 1000 THEN
        RAISE EXCEPTION 'invalid schedule: backfill: must be between 0 and 1000' USING ERRCODE = '22023';
    END IF;
    IF schedule_starts_at NOT BETWEEN earliest AND latest THEN
        RAISE EXCEPTION 'invalid schedule: starts_at: must be a time between the years 1 and 9999' USING ERRCODE = '22023';
    END IF;
    IF schedule_ends_at NOT BETWEEN earliest AND latest THEN
        RAISE EXCEPTION 'invalid schedule: ends_at: must be a time between the years 1 and 9999' USING ERRCODE = '22023';
    END IF;
    IF schedule_ends_at <= schedule_starts_at THEN
        RAISE EXCEPTION 'invalid schedule: ends_at: must be after starts_at' USING ERRCODE = '22023';
    END IF;
    IF char_length(coalesce(schedule_note, '')) > 1000 THEN
        RAISE EXCEPTION 'invalid schedule: note: is longer than 1000 characters' USING ERRCODE = '22023';
    END IF;

    changed_at := clock_timestamp();
    INSERT INTO jobhost.keyed_schedules AS s
        (job, key, cron, time_zone, payload, overlap, jitter_ms, backfill, starts_at, ends_at, paused, note)
    VALUES (schedule_job, schedule_key, btrim(schedule_cron), schedule_time_zone, schedule_payload, overlap,
            schedule_jitter_ms, schedule_backfill, schedule_starts_at, schedule_ends_at,
            coalesce(schedule_paused, false), coalesce(schedule_note, ''))
    ON CONFLICT (job, key) DO UPDATE SET
        cron = EXCLUDED.cron, time_zone = EXCLUDED.time_zone, payload = EXCLUDED.payload,
        overlap = EXCLUDED.overlap, jitter_ms = EXCLUDED.jitter_ms, backfill = EXCLUDED.backfill,
        starts_at = EXCLUDED.starts_at, ends_at = EXCLUDED.ends_at,
        paused = coalesce(schedule_paused, s.paused), note = coalesce(schedule_note, s.note),
        -- The old calendar's ticks after its cursor (and its start) up to
        -- now (and its end) stay due, unless it was paused.
        handovers = CASE
            WHEN NOT s.paused
                 AND (s.cron, s.time_zone, s.starts_at) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.time_zone, EXCLUDED.starts_at)
                 AND greatest(s.last_tick, s.since, s.starts_at - interval '1 millisecond')
                     < least(greatest(changed_at, s.last_tick, s.since), s.ends_at)
                THEN (CASE WHEN jsonb_array_length(s.handovers) >= 16 THEN s.handovers - 0 ELSE s.handovers END)
                     || jsonb_build_array(jsonb_build_object(
                            'cron', s.cron, 'time_zone', s.time_zone,
                            'from', greatest(s.last_tick, s.since, s.starts_at - interval '1 millisecond'),
                            'until', least(greatest(changed_at, s.last_tick, s.since), s.ends_at)))
            ELSE s.handovers END,
        since = CASE
            WHEN (s.cron, s.time_zone, s.starts_at) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.time_zone, EXCLUDED.starts_at)
                 OR (s.paused AND NOT coalesce(schedule_paused, s.paused))
                THEN greatest(changed_at, s.last_tick, s.since)
            ELSE s.since END,
        -- A paused schedule keeps nothing buffered or asked for, to start later.
        buffered_tick = CASE WHEN coalesce(schedule_paused, s.paused) THEN NULL ELSE s.buffered_tick END,
        triggered_at = CASE WHEN coalesce(schedule_paused, s.paused) THEN NULL ELSE s.triggered_at END,
        -- Looked at again now, never later than it was due.
        look_at = least(s.look_at, now()), error = NULL, updated_at = now()
    RETURNING xmax = 0 INTO created;
    PERFORM jobhost.audit_write('schedule.set', 'schedule ' || schedule_job || '/' || schedule_key,
                                CASE WHEN created THEN 'created' ELSE 'replaced' END);
    RETURN created;
END
$$;
