-- A host never silently stops doing part of its job, and a job type's
-- registration only moves forward.

-- Per host: the digest of the component serving each job type it fetches
-- (a JSON object, job type → digest), so operators see a type served by
-- different builds; and why its directory watcher is down (NULL while it
-- watches), so a host that cannot see new components says so.
ALTER TABLE hosts ADD COLUMN digests TEXT NOT NULL DEFAULT '{}' CHECK (json_type(digests) = 'object');
ALTER TABLE hosts ADD COLUMN watcher_error TEXT;

-- Every digest registered for a job type, numbered (id) in the order each
-- was first registered. Rows are never deleted, so the numbers only grow.
CREATE TABLE job_type_digests (
    id                  INTEGER PRIMARY KEY,
    name                TEXT    NOT NULL,
    digest              TEXT    NOT NULL,
    first_registered_at INTEGER NOT NULL,
    UNIQUE (name, digest)
) STRICT;

INSERT INTO job_type_digests (name, digest, first_registered_at)
    SELECT name, digest, updated_at FROM job_types ORDER BY updated_at, name;

-- A registration records its digest (NOT EXISTS rather than OR IGNORE: an
-- upsert's conflict policy overrides the one of statements in its triggers).
CREATE TRIGGER job_types_record_digest BEFORE INSERT ON job_types BEGIN
    INSERT INTO job_type_digests (name, digest, first_registered_at)
        SELECT NEW.name, NEW.digest, NEW.updated_at
        WHERE NOT EXISTS (SELECT 1 FROM job_type_digests WHERE name = NEW.name AND digest = NEW.digest);
END;

-- It replaces the stored digest only when its own was first registered
-- later; otherwise the row is left as it is (RAISE(IGNORE) skips it).
CREATE TRIGGER job_types_forward_only BEFORE UPDATE OF digest ON job_types BEGIN
    INSERT INTO job_type_digests (name, digest, first_registered_at)
        SELECT NEW.name, NEW.digest, NEW.updated_at
        WHERE NOT EXISTS (SELECT 1 FROM job_type_digests WHERE name = NEW.name AND digest = NEW.digest);
    SELECT RAISE(IGNORE)
    WHERE (SELECT id FROM job_type_digests WHERE name = NEW.name AND digest = NEW.digest)
        < (SELECT id FROM job_type_digests WHERE name = OLD.name AND digest = OLD.digest);
END;
