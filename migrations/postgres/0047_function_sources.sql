-- What each SQL function's living file (src/store/postgres/functions/) was
-- when a host last applied it: a host applies a file whose digest differs
-- from the one recorded here, unless a host of a later generation applied
-- it (src/store/postgres/functions.rs). From this migration on, a function
-- changes by an edit of its file, not by a new copy in a migration.
CREATE TABLE jobhost.function_sources (
    name       text PRIMARY KEY,
    sha256     text NOT NULL,
    generation bigint NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
