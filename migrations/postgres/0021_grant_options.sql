-- A grant's options beyond what it allows. Its own step timeouts for the
-- requests it allows, in milliseconds (`jobhost grant … --connect-timeout 5s
-- --first-byte-timeout 2m --between-bytes-timeout 1m`); NULL keeps the
-- host's default. And where, besides header values, the secrets it names
-- may be swapped in (`--secret-in query,body`): a list of 'query' and
-- 'body'. Added with defaults that keep what existing grants allow, and
-- that a host of the previous version, which does not read them, keeps.
ALTER TABLE jobhost.outbound_grants
    ADD COLUMN connect_timeout_ms       bigint CHECK (connect_timeout_ms > 0),
    ADD COLUMN first_byte_timeout_ms    bigint CHECK (first_byte_timeout_ms > 0),
    ADD COLUMN between_bytes_timeout_ms bigint CHECK (between_bytes_timeout_ms > 0),
    ADD COLUMN secrets_in               text[] NOT NULL DEFAULT '{}'
        CHECK (secrets_in <@ ARRAY['query', 'body']);
