-- A grant's own step timeouts for the requests it allows, in milliseconds
-- (`jobhost grant … --connect-timeout 5s --first-byte-timeout 2m
-- --between-bytes-timeout 1m`); NULL keeps the host's default. Added as
-- nullable columns: existing grants keep the defaults, and a host of the
-- previous version, which does not read them, keeps them too.
ALTER TABLE jobhost.outbound_grants
    ADD COLUMN connect_timeout_ms       bigint CHECK (connect_timeout_ms > 0),
    ADD COLUMN first_byte_timeout_ms    bigint CHECK (first_byte_timeout_ms > 0),
    ADD COLUMN between_bytes_timeout_ms bigint CHECK (between_bytes_timeout_ms > 0);
