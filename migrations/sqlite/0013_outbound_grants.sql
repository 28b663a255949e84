-- The operator's grants of outbound HTTP (see
-- migrations/postgres/0019_outbound_grants.sql); methods and secrets are
-- JSON arrays of strings, granted_at in milliseconds.
CREATE TABLE outbound_grants (
    job_type   TEXT    NOT NULL,
    origin     TEXT    NOT NULL,
    methods    TEXT    NOT NULL DEFAULT '[]',
    secrets    TEXT    NOT NULL DEFAULT '[]',
    private    INTEGER NOT NULL DEFAULT 0,
    idempotency_key INTEGER NOT NULL DEFAULT 0,
    granted_at INTEGER NOT NULL,
    PRIMARY KEY (job_type, origin)
) STRICT;
