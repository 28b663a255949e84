-- claims_likely_new (0032_plain_claims) decides whether a call's claims
-- are first tried as a plain insert: 64 claims or more, none of a sample
-- of about 32 keys held. It counted the call's claims with a pass over
-- its arrays, 0.8 ms a call of 5,000, about a twentieth of what
-- claim_new_keys spends on a call of new keys (BENCHMARKS.md, "Fifth
-- pass"). A call whose jobs all have a key and none is while_executing
-- (a host's bulk enqueue of one unique type, the usual case) has as many
-- claims as keys, which array_position and `= ANY` tell without building
-- rows; any other call is counted as before. The sample is read with one
-- EXISTS per key instead of a join. Same signature and answers: hosts of
-- the previous release call it unchanged, through claim_new_keys and
-- claim_unique.

CREATE OR REPLACE FUNCTION jobhost.claims_likely_new(job_types text[], unique_keys text[], while_executing boolean[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT cardinality(job_types) >= 64
       AND NOT EXISTS (
            SELECT 1
            FROM generate_series(1, cardinality(job_types), greatest(cardinality(job_types) / 32, 1)) AS i(at)
            WHERE EXISTS (SELECT 1 FROM jobhost.unique_claims c
                          WHERE c.unique_key = unique_keys[i.at] AND c.job = job_types[i.at]))
       AND CASE WHEN array_position(unique_keys, NULL) IS NULL
                     AND coalesce(NOT (true = ANY(coalesce(while_executing, '{}'))), false)
                THEN cardinality(unique_keys) >= 64
                ELSE (SELECT count(*)
                      FROM unnest(unique_keys, while_executing) AS u(unique_key, we)
                      WHERE u.unique_key IS NOT NULL AND NOT coalesce(u.we, false)) >= 64
           END
$$;
