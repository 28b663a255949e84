-- Secrets outbound requests may carry (docs/outbound.md): each value sealed
-- with XChaCha20-Poly1305 under a key only the hosts hold, bound to its
-- name; key_id is the key's fingerprint, so a host with another key can say
-- which one a secret needs. No value is ever stored in clear.
CREATE TABLE jobhost.outbound_secrets (
    name       text        PRIMARY KEY,
    key_id     text        NOT NULL,
    nonce      bytea       NOT NULL,
    ciphertext bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
