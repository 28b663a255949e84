-- jobhost.claim_unique: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0045_bulk_enqueue_by_index.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.claim_unique(job_types text[], unique_keys text[], job_ids bigint[]) RETURNS TABLE(ord bigint, claimant bigint)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    holders bigint[];
    held integer;
    tries integer := 0;
BEGIN
    IF jobhost.claims_likely_new(job_types, unique_keys, NULL) THEN
        BEGIN
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
            SELECT u.job, u.unique_key, u.id
            FROM unnest(job_types, unique_keys, job_ids) AS u(job, unique_key, id)
            ORDER BY u.job, u.unique_key, u.id;
            holders := job_ids;
        EXCEPTION WHEN unique_violation THEN
            holders := NULL;
        END;
    END IF;
    WHILE holders IS NULL LOOP
        INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
        SELECT u.job, u.unique_key, u.id
        FROM unnest(job_types, unique_keys, job_ids) AS u(job, unique_key, id)
        ORDER BY u.job, u.unique_key, u.id
        ON CONFLICT DO NOTHING;
        SELECT array_agg(c.job_id ORDER BY u.n), count(c.job_id) INTO holders, held
        FROM unnest(job_types, unique_keys) WITH ORDINALITY AS u(job, unique_key, n)
        LEFT JOIN (
            -- Each key read once (a call of duplicates of one key reads one claim).
            SELECT k.job, k.unique_key, c.job_id
            FROM (SELECT DISTINCT d.job, d.unique_key FROM unnest(job_types, unique_keys) AS d(job, unique_key)) k
            CROSS JOIN LATERAL (
                SELECT c.job_id FROM jobhost.unique_claims c
                WHERE c.job = k.job AND c.unique_key = k.unique_key OFFSET 0
            ) c
        ) c ON c.job = u.job AND c.unique_key = u.unique_key;
        EXIT WHEN held = cardinality(job_types);
        holders := NULL;
        tries := tries + 1;
        IF tries >= 100 THEN
            RAISE EXCEPTION 'uniqueness keys kept being released while they were claimed' USING ERRCODE = '40001';
        END IF;
    END LOOP;
    RETURN QUERY SELECT h.n, h.holder FROM unnest(holders) WITH ORDINALITY AS h(holder, n);
END;
$$;
