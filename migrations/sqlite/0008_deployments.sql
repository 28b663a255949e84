-- Components deployed through the database (`jobhost deploy`); see
-- migrations/postgres/0010_deployments.sql, which this follows. Hosts see a
-- change by polling.

CREATE TABLE component_sources (
    digest      TEXT    PRIMARY KEY CHECK (length(digest) = 64 AND digest NOT GLOB '*[^0-9a-f]*'),
    job_type    TEXT    NOT NULL,
    bytes       BLOB    NOT NULL,
    config      TEXT    NOT NULL CHECK (json_type(config) = 'object'),
    uploaded_at INTEGER NOT NULL
) STRICT;

CREATE TABLE deployments (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    job_type TEXT    NOT NULL,
    digest   TEXT    REFERENCES component_sources (digest),
    action   TEXT    NOT NULL CHECK (action IN ('deploy', 'rollback', 'undeploy')),
    at       INTEGER NOT NULL,
    CHECK ((action = 'undeploy') = (digest IS NULL))
) STRICT;

CREATE INDEX deployments_by_type ON deployments (job_type, id DESC);
