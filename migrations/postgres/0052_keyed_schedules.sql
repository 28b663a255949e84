-- Schedules made at run time (docs/schedules.md): many per job type, one
-- per key, written by applications (jobhost.schedule_upsert, in their own
-- transaction), operators and running jobs. A pass of any host takes the
-- due ones (`look_at` passed) with FOR UPDATE SKIP LOCKED, enqueues their
-- ticks and moves `last_tick` and `look_at` in one transaction: each tick
-- once across the fleet, and a pass costs the schedules due, not a scan.
CREATE TABLE jobhost.keyed_schedules (
    job           text        NOT NULL,
    key           text        NOT NULL CHECK (key <> '' AND char_length(key) <= 200),
    cron          text        NOT NULL CHECK (char_length(cron) BETWEEN 1 AND 200),
    time_zone     text        NOT NULL DEFAULT 'UTC',
    payload       jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(payload) = 'object'),
    overlap       text        NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    jitter_ms     bigint      NOT NULL DEFAULT 0 CHECK (jitter_ms BETWEEN 0 AND 86400000),
    backfill      integer     NOT NULL DEFAULT 1 CHECK (backfill BETWEEN 0 AND 1000),
    -- Finite, and within what hosts read (years 1 to 9999).
    starts_at     timestamptz CHECK (starts_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'),
    ends_at       timestamptz CHECK (ends_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 00:00:00+00'),
    paused        boolean     NOT NULL DEFAULT false,
    note          text        NOT NULL DEFAULT '' CHECK (char_length(note) <= 1000),
    -- When the calendar (cron, zone) was written: no tick at or before it.
    since         timestamptz NOT NULL DEFAULT now(),
    -- The cursor: every tick at or before it is done.
    last_tick     timestamptz,
    -- The job the latest enqueued tick made (or that held its unique key).
    last_job      bigint,
    -- A tick kept until that job ends (overlap buffer_one).
    buffered_tick timestamptz,
    skipped       bigint      NOT NULL DEFAULT 0,
    -- A tick asked for now (trigger), enqueued by the next pass.
    triggered_at  timestamptz,
    -- When a pass must look at it next; null when no tick is left (past
    -- its end, or a calendar hosts cannot read: `error` says why).
    look_at       timestamptz DEFAULT now(),
    -- A change of the calendar hands over at an instant: ticks of the old
    -- calendar up to it that no pass enqueued yet are still enqueued, and
    -- the new calendar's count from after it (none lost, none doubled).
    -- Each replaced calendar, oldest first, until a pass has done its
    -- ticks: {"cron", "time_zone", "from", "until"}.
    handovers     jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(handovers) = 'array'),
    next_tick     timestamptz,
    error         text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job, key),
    CHECK (ends_at > starts_at)
);

CREATE INDEX keyed_schedules_due ON jobhost.keyed_schedules (job, look_at)
    WHERE look_at IS NOT NULL AND NOT paused;

-- The fleet's latest pass over each job type's keyed schedules, written
-- every few seconds (`passed_at`), and how far it vouches (`looked_at`):
-- its clock, or just before the earliest schedule it left due (one another
-- transaction held). While the pass is recent, a tick after `looked_at`
-- is enqueued however late; ticks before it were missed while no host
-- looked (up to each schedule's backfill are enqueued).
CREATE TABLE jobhost.schedule_looks (
    job       text        PRIMARY KEY,
    looked_at timestamptz NOT NULL,
    passed_at timestamptz NOT NULL
);

-- The zones a schedule written through SQL may name, as the server's
-- time zone database lists them (hosts read zones with their own copy of
-- the IANA database and report one they do not know on the schedule).
CREATE TABLE jobhost.time_zones (name text PRIMARY KEY);
INSERT INTO jobhost.time_zones (name)
SELECT name FROM pg_timezone_names WHERE name !~ '^(posix|right)/' ON CONFLICT DO NOTHING;
INSERT INTO jobhost.time_zones (name) VALUES ('UTC') ON CONFLICT DO NOTHING;
