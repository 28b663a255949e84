-- The audit trail (see migrations/postgres/0054_audit.sql); times in
-- milliseconds.
CREATE TABLE audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    via        TEXT    NOT NULL CHECK (via IN ('api', 'dashboard', 'cli', 'sql', 'library', 'webhook')),
    who        TEXT    NOT NULL,
    address    TEXT,
    user_agent TEXT,
    action     TEXT    NOT NULL,
    object     TEXT    NOT NULL,
    outcome    TEXT    NOT NULL,
    count      INTEGER NOT NULL DEFAULT 1 CHECK (count >= 1)
) STRICT;

CREATE INDEX audit_at ON audit (at);
