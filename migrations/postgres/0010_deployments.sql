-- Components deployed through the database (`jobhost deploy`): their bytes,
-- stored once by content digest, and each job type's deployment history.
-- The newest entry of a type says what the fleet serves for it: a digest,
-- or nothing once undeployed. Entries are only ever added, so a rollback is
-- one more entry naming an earlier digest, and the history shows who served
-- what when. Every change announces the type on `jobhost_components`, which
-- hosts serving deployed components listen to.

CREATE TABLE jobhost.component_sources (
    digest      text PRIMARY KEY CHECK (digest ~ '^[0-9a-f]{64}$'),
    -- The job type the component declared when it was validated.
    job_type    text NOT NULL,
    bytes       bytea NOT NULL,
    uploaded_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobhost.deployments (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_type text NOT NULL,
    -- Null for an undeploy.
    digest   text REFERENCES jobhost.component_sources (digest),
    action   text NOT NULL CHECK (action IN ('deploy', 'rollback', 'undeploy')),
    at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((action = 'undeploy') = (digest IS NULL))
);

CREATE INDEX deployments_by_type ON jobhost.deployments (job_type, id DESC);
