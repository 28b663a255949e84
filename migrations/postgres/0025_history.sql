-- The fleet over time (docs/observability.md): one row per minute, queue
-- and job type. Maintenance computes the finished jobs' columns from the
-- archive (set, not added, so computing a minute again is harmless and
-- many hosts agree), and samples the live jobs' depth into the current
-- minute; only the host holding the mark writes these rows. Hosts add the
-- attempts they scheduled again, which the archive does not keep, to
-- history_retries: rows of their own, so a host's write never waits for
-- the computation's locks, nor it for theirs. Rows older than the
-- history's retention are deleted by maintenance.
CREATE TABLE jobhost.history (
    minute      timestamptz NOT NULL,
    queue       text        NOT NULL,
    job         text        NOT NULL,
    completed   bigint      NOT NULL DEFAULT 0,
    failed      bigint      NOT NULL DEFAULT 0,
    discarded   bigint      NOT NULL DEFAULT 0,
    cancelled   bigint      NOT NULL DEFAULT 0,
    -- Finished jobs with a run time (their last attempt, started to
    -- finished) and its percentiles, in milliseconds.
    runs        bigint      NOT NULL DEFAULT 0,
    run_p50_ms  double precision,
    run_p95_ms  double precision,
    run_max_ms  double precision,
    -- Jobs finished on their first attempt, and the wait from their
    -- enqueue to their start (a delay the enqueuer asked for included).
    waits       bigint      NOT NULL DEFAULT 0,
    wait_p50_ms double precision,
    wait_p95_ms double precision,
    -- Live jobs at the minute's last sample; null when none was taken.
    available   bigint,
    blocked     bigint,
    scheduled   bigint,
    PRIMARY KEY (minute, queue, job)
);
CREATE INDEX history_job ON jobhost.history (job, minute);

CREATE TABLE jobhost.history_retries (
    minute  timestamptz NOT NULL,
    queue   text        NOT NULL,
    job     text        NOT NULL,
    retried bigint      NOT NULL,
    PRIMARY KEY (minute, queue, job)
);
CREATE INDEX history_retries_job ON jobhost.history_retries (job, minute);

-- How far the archive has been computed: minutes before `upto` are final.
-- One host computes at a time (its row locked, SKIP LOCKED by the others).
CREATE TABLE jobhost.history_marks (
    name text        PRIMARY KEY,
    upto timestamptz NOT NULL
);
