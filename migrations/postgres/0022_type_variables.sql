-- Plain variables of a job type (`jobhost var set TYPE NAME VALUE`), given
-- to its runs as environment variables, in clear; hosts re-read a type's
-- variables within a few seconds of a change. Secrets live apart, sealed
-- (0020_outbound_secrets.sql).
CREATE TABLE jobhost.type_variables (
    job_type   text        NOT NULL,
    name       text        NOT NULL,
    value      text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_type, name)
);
