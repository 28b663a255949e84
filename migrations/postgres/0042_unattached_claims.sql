-- no-transaction
--
-- The claims not attached to their job's row (0041), by their job's id:
-- how the archive's trigger and a run's end find them once 0043 drops
-- the index of every claim by job id. Built concurrently, so no writer
-- waits for it (every result write reads the claims). A build that failed
-- half-way leaves the index invalid; 0043 builds it again, inside its own
-- transaction, rather than use it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS unique_claims_unattached ON jobhost.unique_claims (job_id) WHERE NOT attached;
