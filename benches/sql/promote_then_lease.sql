-- A promoted job as the hand-off writes it today: inserted into jobhost.jobs as
-- available (jobhost.release_slots), leased by an update (jobhost.fetch), later
-- moved out (stands in for the archive move). Compare with promote_leased.sql:
--   pgbench -n -c 1 -T 6 -f benches/sql/promote_then_lease.sql DB
-- on a database `jobhost migrate` made, with PGOPTIONS='-c synchronous_commit=off'
-- to leave the disk out. See BENCHMARKS.md, "Where the serial shape's write goes".
\set k random(1, 1000)
BEGIN;
INSERT INTO jobhost.jobs (job, queue, payload, state, max_attempts, concurrency_key) VALUES ('serial', 'default', '{"key":"k1","ms":5}', 'available', 25, 'k' || :k) RETURNING id \gset
UPDATE jobhost.jobs SET state = 'running', lease_token = :id, lease_secs = 1, lease_expires_at = now() + interval '1 second', host_id = 'h', started_at = now(), attempt = attempt + 1 WHERE id = :id;
DELETE FROM jobhost.jobs WHERE id = :id;
COMMIT;
