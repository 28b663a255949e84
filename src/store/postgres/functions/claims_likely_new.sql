-- jobhost.claims_likely_new: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0039_likely_new_without_counting.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.claims_likely_new(job_types text[], unique_keys text[], while_executing boolean[]) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
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
