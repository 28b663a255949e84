-- A host never silently stops doing part of its job, and a job type's
-- registration only moves forward.

-- Per host: the digest of the component serving each job type it fetches
-- (a JSON object, job type → digest), so operators see a type served by
-- different builds across the fleet; and why its directory watcher is down
-- (NULL while it watches), so a host that cannot see new components says so.
ALTER TABLE jobhost.hosts ADD COLUMN digests jsonb NOT NULL DEFAULT '{}'
    CHECK (jsonb_typeof(digests) = 'object');
ALTER TABLE jobhost.hosts ADD COLUMN watcher_error text;

-- Every digest registered for a job type, numbered in the order each was
-- first registered anywhere in the fleet. A digest keeps its number for
-- good, so "newer" means "first seen later", whoever registers it again.
CREATE TABLE jobhost.job_type_digests (
    name                text        NOT NULL,
    digest              text        NOT NULL,
    seq                 bigint      GENERATED ALWAYS AS IDENTITY,
    first_registered_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, digest)
);

-- The digests registered before this migration, in the order they were.
INSERT INTO jobhost.job_type_digests (name, digest, first_registered_at)
    SELECT name, digest, updated_at FROM jobhost.job_types ORDER BY updated_at, name;

-- A registration records its digest, and replaces the stored one only when
-- its own was first registered later: an older host loading (or restarting
-- with) an older build of a type leaves the newer settings alone. Enforced
-- here rather than in the host so every writer, an older jobhost included,
-- obeys it. Returning NULL skips the update of that row only.
CREATE FUNCTION jobhost.job_types_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    incoming bigint;
    stored   bigint;
BEGIN
    INSERT INTO jobhost.job_type_digests (name, digest) VALUES (NEW.name, NEW.digest)
        ON CONFLICT (name, digest) DO NOTHING;
    IF TG_OP = 'UPDATE' AND NEW.digest IS DISTINCT FROM OLD.digest THEN
        SELECT seq INTO incoming FROM jobhost.job_type_digests WHERE name = NEW.name AND digest = NEW.digest;
        SELECT seq INTO stored FROM jobhost.job_type_digests WHERE name = OLD.name AND digest = OLD.digest;
        IF incoming < stored THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER job_types_forward_only
    BEFORE INSERT OR UPDATE ON jobhost.job_types
    FOR EACH ROW EXECUTE FUNCTION jobhost.job_types_forward_only();
