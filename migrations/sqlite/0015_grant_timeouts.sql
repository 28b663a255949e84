-- A grant's own step timeouts, in milliseconds; NULL keeps the host's
-- default (see migrations/postgres/0021_grant_timeouts.sql).
ALTER TABLE outbound_grants ADD COLUMN connect_timeout_ms INTEGER CHECK (connect_timeout_ms > 0);
ALTER TABLE outbound_grants ADD COLUMN first_byte_timeout_ms INTEGER CHECK (first_byte_timeout_ms > 0);
ALTER TABLE outbound_grants ADD COLUMN between_bytes_timeout_ms INTEGER CHECK (between_bytes_timeout_ms > 0);
