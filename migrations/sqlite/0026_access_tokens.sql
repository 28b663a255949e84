-- Named access tokens with roles (see
-- migrations/postgres/0053_access_tokens.sql); times in milliseconds, the
-- queues a JSON array of names or NULL for every queue.
CREATE TABLE access_tokens (
    name         TEXT    PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
    digest       TEXT    NOT NULL UNIQUE,
    role         TEXT    NOT NULL CHECK (role IN ('read', 'operate', 'deploy', 'admin')),
    queues       TEXT    CHECK (queues IS NULL OR json_array_length(queues) BETWEEN 1 AND 100),
    payloads     INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL,
    created_by   TEXT    NOT NULL,
    expires_at   INTEGER,
    revoked_at   INTEGER,
    last_used_at INTEGER
) STRICT;

ALTER TABLE http_sessions
    ADD COLUMN token_name TEXT REFERENCES access_tokens (name) ON DELETE CASCADE;
