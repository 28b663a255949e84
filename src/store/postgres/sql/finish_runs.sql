-- Ends a batch of runs, each matched on (id, lease token), gives back their
-- slots, promotes blocked jobs into them and leases the next jobs: see
-- jobhost.finish_runs in migrations/postgres/0004_concurrency.sql. No run
-- here holds a key another transaction may lock, so nothing is deferred.
SELECT NULL::bigint[] AS deferred, f.*
FROM jobhost.finish_runs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                         jobhost.unpaused($14), $15, $16, $17, $18) f
