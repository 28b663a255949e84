-- Plain variables of a job type (see migrations/postgres/0022_type_variables.sql);
-- updated_at in milliseconds.
CREATE TABLE type_variables (
    job_type   TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    value      TEXT    NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (job_type, name)
) STRICT;
