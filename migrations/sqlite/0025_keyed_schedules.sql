-- Schedules made at run time (docs/schedules.md): many per job type, one
-- per key. A pass takes the due ones (`look_at` passed) in the file's one
-- write transaction, enqueues their ticks and moves `last_tick` and
-- `look_at`: each tick once, and a pass costs the schedules due, not a scan.
-- Times are milliseconds since the epoch.
CREATE TABLE keyed_schedules (
    job           TEXT    NOT NULL,
    key           TEXT    NOT NULL CHECK (key <> '' AND length(key) <= 200),
    cron          TEXT    NOT NULL CHECK (length(cron) BETWEEN 1 AND 200),
    time_zone     TEXT    NOT NULL DEFAULT 'UTC',
    payload       TEXT    NOT NULL DEFAULT '{}' CHECK (json_type(payload) = 'object'),
    overlap       TEXT    NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    jitter_ms     INTEGER NOT NULL DEFAULT 0 CHECK (jitter_ms BETWEEN 0 AND 86400000),
    backfill      INTEGER NOT NULL DEFAULT 1 CHECK (backfill BETWEEN 0 AND 1000),
    starts_at     INTEGER CHECK (starts_at BETWEEN -62135596800000 AND 253402214400000),
    ends_at       INTEGER CHECK (ends_at BETWEEN -62135596800000 AND 253402214400000),
    paused        INTEGER NOT NULL DEFAULT 0,
    note          TEXT    NOT NULL DEFAULT '' CHECK (length(note) <= 1000),
    since         INTEGER NOT NULL,
    last_tick     INTEGER,
    last_job      INTEGER,
    buffered_tick INTEGER,
    skipped       INTEGER NOT NULL DEFAULT 0,
    triggered_at  INTEGER,
    look_at       INTEGER,
    handovers     TEXT    NOT NULL DEFAULT '[]' CHECK (json_type(handovers) = 'array'),
    next_tick     INTEGER,
    error         TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (job, key),
    CHECK (ends_at > starts_at)
) STRICT;

CREATE INDEX keyed_schedules_due ON keyed_schedules (job, look_at)
    WHERE look_at IS NOT NULL AND NOT paused;

CREATE TABLE schedule_looks (
    job       TEXT    PRIMARY KEY,
    looked_at INTEGER NOT NULL,
    passed_at INTEGER NOT NULL
) STRICT;
