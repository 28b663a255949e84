-- An until_executed job's key is its claim: unique_keys now holds the keys
-- of while_executing jobs only, as on PostgreSQL since
-- 0033_claims_hold_their_keys.sql, which explains why. Nothing read the
-- rows of until_executed jobs (the fetch and the promotions look only for
-- while_executing keys; the archive's trigger gives a claim back by its
-- job id). The rows of live until_executed jobs go; their claims stay.
DELETE FROM unique_keys WHERE NOT while_executing;
