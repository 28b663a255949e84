-- The same promoted job inserted already leased to the writing host: the
-- lease update of promote_then_lease.sql, and its index entries, saved.
\set k random(1, 1000)
BEGIN;
INSERT INTO jobhost.jobs (job, queue, payload, state, max_attempts, concurrency_key, lease_token, lease_secs, lease_expires_at, host_id, started_at, attempt) VALUES ('serial', 'default', '{"key":"k1","ms":5}', 'running', 25, 'k' || :k, 1, 1, now() + interval '1 second', 'h', now(), 1) RETURNING id \gset
DELETE FROM jobhost.jobs WHERE id = :id;
COMMIT;
