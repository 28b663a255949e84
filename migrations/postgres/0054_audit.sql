-- The audit trail (docs/audit.md): one row per change, written by the
-- change's own transaction. `count` is above 1 only for a row standing for
-- a flood of refusals (wrong tokens from one address), which are counted
-- rather than written one by one. Rows older than the retention (90 days
-- unless configured) are pruned a bounded batch at a time.
CREATE TABLE jobhost.audit (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    via        text        NOT NULL CHECK (via IN ('api', 'dashboard', 'cli', 'sql', 'library', 'webhook')),
    who        text        NOT NULL,
    address    text,
    user_agent text,
    action     text        NOT NULL,
    object     text        NOT NULL,
    outcome    text        NOT NULL,
    count      bigint      NOT NULL DEFAULT 1 CHECK (count >= 1)
);

CREATE INDEX audit_at ON jobhost.audit (at);
