-- The operator's grants of outbound HTTP: a job type's runs may send
-- requests to an origin only when the component declares it and a row here
-- grants it (docs/outbound.md). Hosts read a type's grants at each run's
-- start, so a grant or revoke applies to the next run fleet-wide. Methods
-- and secrets are upper-case method names and secret names; an empty list
-- of methods allows every method the component declares. idempotency_key
-- asks the host to add an Idempotency-Key header, the same on every attempt
-- of a job, so an API that honours it does a retried request once.
CREATE TABLE jobhost.outbound_grants (
    job_type   text        NOT NULL,
    origin     text        NOT NULL,
    methods    text[]      NOT NULL DEFAULT '{}',
    secrets    text[]      NOT NULL DEFAULT '{}',
    private    boolean     NOT NULL DEFAULT false,
    idempotency_key boolean NOT NULL DEFAULT false,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_type, origin)
);
