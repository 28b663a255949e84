-- Components deployed through the database (`jobhost deploy`): their bytes,
-- stored once by content digest, and each job type's deployment history.
-- The newest entry of a type says what the fleet serves for it: a digest,
-- or nothing once undeployed. Entries are only ever added, so a rollback is
-- one more entry naming an earlier digest, and the history shows who served
-- what when. Every change announces the type on `jobhost_components`, which
-- hosts serving deployed components listen to. A change that serves a
-- version also registers that version's configuration in the same
-- transaction, first renumbering its digest as the newest in
-- `job_type_digests`: the forward-only rule of 0006 would otherwise keep a
-- later-seen version's settings after a rollback.

CREATE TABLE jobhost.component_sources (
    digest      text PRIMARY KEY CHECK (digest ~ '^[0-9a-f]{64}$'),
    -- The job type the component declared when it was validated.
    job_type    text NOT NULL,
    bytes       bytea NOT NULL,
    -- The configuration it declared, registered again when a rollback
    -- serves it (validated by the deploying CLI's settings).
    config      jsonb NOT NULL CHECK (jsonb_typeof(config) = 'object'),
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
