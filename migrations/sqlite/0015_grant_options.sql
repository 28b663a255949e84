-- A grant's own step timeouts, in milliseconds (NULL keeps the host's
-- default), and where besides headers its secrets may go, as a JSON array
-- of 'query' and 'body' (see migrations/postgres/0021_grant_options.sql).
ALTER TABLE outbound_grants ADD COLUMN connect_timeout_ms INTEGER CHECK (connect_timeout_ms > 0);
ALTER TABLE outbound_grants ADD COLUMN first_byte_timeout_ms INTEGER CHECK (first_byte_timeout_ms > 0);
ALTER TABLE outbound_grants ADD COLUMN between_bytes_timeout_ms INTEGER CHECK (between_bytes_timeout_ms > 0);
ALTER TABLE outbound_grants ADD COLUMN secrets_in TEXT NOT NULL DEFAULT '[]';
