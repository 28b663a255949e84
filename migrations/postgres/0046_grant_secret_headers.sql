-- The headers a grant's secrets may be swapped into (`jobhost grant …
-- --secret-header authorization`), lower case; empty lets them go into any
-- header, as every grant before this one does. Naming them keeps a value
-- out of a header the server is known to echo. A host of the previous
-- version does not read the column and swaps into any header, as before.
ALTER TABLE jobhost.outbound_grants
    ADD COLUMN secret_headers text[] NOT NULL DEFAULT '{}';
