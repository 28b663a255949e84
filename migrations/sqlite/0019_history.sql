-- The fleet over time (see migrations/postgres/0025_history.sql, which
-- this follows); times in ms since the epoch.
CREATE TABLE history (
    minute      INTEGER NOT NULL,
    queue       TEXT    NOT NULL,
    job         TEXT    NOT NULL,
    completed   INTEGER NOT NULL DEFAULT 0,
    failed      INTEGER NOT NULL DEFAULT 0,
    discarded   INTEGER NOT NULL DEFAULT 0,
    cancelled   INTEGER NOT NULL DEFAULT 0,
    runs        INTEGER NOT NULL DEFAULT 0,
    run_p50_ms  REAL,
    run_p95_ms  REAL,
    run_max_ms  REAL,
    waits       INTEGER NOT NULL DEFAULT 0,
    wait_p50_ms REAL,
    wait_p95_ms REAL,
    available   INTEGER,
    blocked     INTEGER,
    scheduled   INTEGER,
    PRIMARY KEY (minute, queue, job)
) STRICT;
CREATE INDEX history_job ON history (job, minute);

CREATE TABLE history_retries (
    minute  INTEGER NOT NULL,
    queue   TEXT    NOT NULL,
    job     TEXT    NOT NULL,
    retried INTEGER NOT NULL,
    PRIMARY KEY (minute, queue, job)
) STRICT;
CREATE INDEX history_retries_job ON history_retries (job, minute);

CREATE TABLE history_marks (
    name TEXT    PRIMARY KEY,
    upto INTEGER NOT NULL
) STRICT;
