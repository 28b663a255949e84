-- The dashboard's signed-in sessions (see
-- migrations/postgres/0018_http_sessions.sql); times in milliseconds.
CREATE TABLE http_sessions (
    digest       TEXT    PRIMARY KEY,
    created_at   INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL
) STRICT;
