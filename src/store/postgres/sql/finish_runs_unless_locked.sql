-- jobhost.finish_runs, leaving out the runs ($1 ids, $2 tokens) whose key's
-- semaphore or batch's row another transaction holds: see
-- jobhost.finish_runs_unless_locked in migrations/postgres/0009_batches.sql.
SELECT *
FROM jobhost.finish_runs_unless_locked($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                                       jobhost.unpaused($16), $17, $18, $19, $20)
