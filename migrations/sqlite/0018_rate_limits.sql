-- Rate limits (see migrations/postgres/0024_rate_limits.sql, which this
-- follows): a key's latest starts, oldest first, at most its type's
-- limit, and a throttle holding all its starts. The fetch decides in Rust
-- (`store::rate`) under the file's one write lock.
CREATE TABLE rate_keys (
    job             TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    -- A JSON array of start times (ms), oldest first.
    starts          TEXT    NOT NULL DEFAULT '[]' CHECK (json_type(starts) = 'array'),
    -- When the key's latest enqueued jobs may start (ms), at most its
    -- limit: an enqueue plans its jobs after these.
    planned         TEXT    NOT NULL DEFAULT '[]' CHECK (json_type(planned) = 'array'),
    throttled_until INTEGER,
    throttles       INTEGER NOT NULL DEFAULT 0,
    deferred        INTEGER NOT NULL DEFAULT 0,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (job, key)
) STRICT;
CREATE INDEX rate_keys_throttled ON rate_keys (job, throttled_until) WHERE throttled_until IS NOT NULL;
