-- The headers a grant's secrets may be swapped into, a JSON array of lower-
-- case names; empty lets them go into any header (see
-- migrations/postgres/0046_grant_secret_headers.sql).
ALTER TABLE outbound_grants ADD COLUMN secret_headers TEXT NOT NULL DEFAULT '[]';
