-- Sealed secrets (see migrations/postgres/0020_outbound_secrets.sql); times
-- in milliseconds.
CREATE TABLE outbound_secrets (
    name       TEXT    PRIMARY KEY,
    key_id     TEXT    NOT NULL,
    nonce      BLOB    NOT NULL,
    ciphertext BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;
