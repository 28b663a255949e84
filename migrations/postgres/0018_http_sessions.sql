-- The dashboard's signed-in sessions, kept in the database so every server
-- of a fleet (each `jobhost serve`, each host with `--http`) accepts a
-- session signed in at any of them, and a sign-out anywhere ends it
-- everywhere. A session is known by the SHA-256 digest of its id (hex); the
-- id itself is only in the browser's cookie, so a copy of this table signs
-- no one in. Expiry is by the database's clock: idle since last_seen_at,
-- and in all since created_at (the lengths are the server's settings).
CREATE TABLE jobhost.http_sessions (
    digest       text        PRIMARY KEY,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
);
