-- Named access tokens with roles (docs/http.md, "Access"). A token is
-- known by the SHA-256 digest of its value (hex): the value is printed once
-- by `jobhost token create` and kept nowhere, so a copy of this table
-- signs no one in. A revoked token's row stays, so its name still shows in
-- `jobhost token list`, until a new token takes its name.
-- Roles rise read < operate < deploy < admin, each holding the ones below.
CREATE TABLE jobhost.access_tokens (
    name         text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    digest       text        NOT NULL UNIQUE,
    role         text        NOT NULL CHECK (role IN ('read', 'operate', 'deploy', 'admin')),
    -- The queues whose jobs it may change (an operate token's); NULL for
    -- every queue.
    queues       text[]      CHECK (cardinality(queues) BETWEEN 1 AND 100),
    -- Whether it is shown payloads, outputs and logs (admin always is).
    payloads     boolean     NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text        NOT NULL,
    expires_at   timestamptz,
    revoked_at   timestamptz,
    last_used_at timestamptz
);

-- The named token a dashboard session signed in with; NULL for the
-- server's own token. A session ends with its token (few sessions live at
-- once, so revoking reads them all rather than keep an index).
ALTER TABLE jobhost.http_sessions
    ADD COLUMN token_name text REFERENCES jobhost.access_tokens (name) ON DELETE CASCADE;
