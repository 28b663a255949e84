-- jobhost.claim_new_keys: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0045_bulk_enqueue_by_index.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.claim_new_keys(job_types text[], unique_keys text[], while_executing boolean[], attach boolean DEFAULT false, OUT ids bigint[], OUT claimants bigint[]) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    lost_ords bigint[];
    lost_jobs text[];
    lost_keys text[];
    lost_ids bigint[];
    found_ords bigint[] := '{}';
    found_claimants bigint[] := '{}';
    read_ords bigint[];
    read_claimants bigint[];
    won bigint[];
    tries integer := 0;
    all_won boolean := false;
BEGIN
    SELECT coalesce(array_agg(s.id), '{}') INTO ids
    FROM (SELECT nextval('jobhost.job_ids') AS id FROM generate_series(1, coalesce(cardinality(job_types), 0))
          ORDER BY 1) s;

    IF jobhost.claims_likely_new(job_types, unique_keys, while_executing) THEN
        BEGIN
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id, attached)
            SELECT u.job, u.unique_key, u.id, attach
            FROM unnest(job_types, unique_keys, ids, while_executing) AS u(job, unique_key, id, we)
            WHERE u.unique_key IS NOT NULL AND NOT u.we
            ORDER BY u.job, u.unique_key, u.id;
            all_won := true;
        EXCEPTION WHEN unique_violation THEN
            all_won := false;
        END;
    END IF;

    IF NOT all_won THEN
        WITH claimed AS (
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id, attached)
            SELECT u.job, u.unique_key, u.id, attach
            FROM unnest(job_types, unique_keys, ids, while_executing) AS u(job, unique_key, id, we)
            WHERE u.unique_key IS NOT NULL AND NOT u.we
            ORDER BY u.job, u.unique_key, u.id
            ON CONFLICT DO NOTHING
            RETURNING job_id
        )
        SELECT coalesce(array_agg(job_id), '{}') INTO won FROM claimed;
        SELECT array_agg(u.ord), array_agg(u.job), array_agg(u.unique_key), array_agg(u.id)
        INTO lost_ords, lost_jobs, lost_keys, lost_ids
        FROM unnest(job_types, unique_keys, ids, while_executing) WITH ORDINALITY AS u(job, unique_key, id, we, ord)
        WHERE u.unique_key IS NOT NULL AND NOT u.we AND NOT EXISTS (SELECT 1 FROM unnest(won) AS w(id) WHERE w.id = u.id);

        WHILE lost_ords IS NOT NULL LOOP
            SELECT array_agg(l.ord) FILTER (WHERE c.job_id IS NOT NULL),
                   array_agg(c.job_id) FILTER (WHERE c.job_id IS NOT NULL),
                   array_agg(l.ord) FILTER (WHERE c.job_id IS NULL),
                   array_agg(l.job) FILTER (WHERE c.job_id IS NULL),
                   array_agg(l.unique_key) FILTER (WHERE c.job_id IS NULL),
                   array_agg(l.id) FILTER (WHERE c.job_id IS NULL)
            INTO read_ords, read_claimants, lost_ords, lost_jobs, lost_keys, lost_ids
            FROM unnest(lost_ords, lost_jobs, lost_keys, lost_ids) AS l(ord, job, unique_key, id)
            LEFT JOIN (
                -- Each lost key read once (a call of duplicates of one key reads one claim).
                SELECT k.job, k.unique_key, c.job_id
                FROM (SELECT DISTINCT u.job, u.unique_key FROM unnest(lost_jobs, lost_keys) AS u(job, unique_key)) k
                CROSS JOIN LATERAL (
                    SELECT c.job_id FROM jobhost.unique_claims c
                    WHERE c.job = k.job AND c.unique_key = k.unique_key OFFSET 0
                ) c
            ) c ON c.job = l.job AND c.unique_key = l.unique_key;
            found_ords := found_ords || coalesce(read_ords, '{}');
            found_claimants := found_claimants || coalesce(read_claimants, '{}');
            EXIT WHEN lost_ords IS NULL;
            -- Released between the claim and the read: claim them again.
            tries := tries + 1;
            IF tries >= 100 THEN
                RAISE EXCEPTION 'uniqueness keys kept being released while they were claimed' USING ERRCODE = '40001';
            END IF;
            WITH claimed AS (
                INSERT INTO jobhost.unique_claims (job, unique_key, job_id, attached)
                SELECT l.job, l.unique_key, l.id, attach
                FROM unnest(lost_jobs, lost_keys, lost_ids) AS l(job, unique_key, id)
                ORDER BY l.job, l.unique_key, l.id
                ON CONFLICT DO NOTHING
                RETURNING job_id
            )
            SELECT coalesce(array_agg(job_id), '{}') INTO won FROM claimed;
            SELECT array_agg(l.ord), array_agg(l.job), array_agg(l.unique_key), array_agg(l.id)
            INTO lost_ords, lost_jobs, lost_keys, lost_ids
            FROM unnest(lost_ords, lost_jobs, lost_keys, lost_ids) AS l(ord, job, unique_key, id)
            WHERE NOT EXISTS (SELECT 1 FROM unnest(won) AS w(id) WHERE w.id = l.id);
        END LOOP;
    END IF;

    -- A job with a key is written unless another job holds its key.
    IF all_won AND array_position(unique_keys, NULL) IS NULL THEN
        claimants := ids;
    ELSE
        SELECT coalesce(array_agg(CASE WHEN u.unique_key IS NULL THEN NULL ELSE coalesce(f.claimant, u.id) END
                                  ORDER BY u.ord), '{}')
        INTO claimants
        FROM unnest(unique_keys, ids) WITH ORDINALITY AS u(unique_key, id, ord)
        LEFT JOIN unnest(found_ords, found_claimants) AS f(ord, claimant) ON f.ord = u.ord;
    END IF;

    IF true = ANY(while_executing) THEN
        INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
        SELECT u.id, u.job, u.unique_key, true
        FROM unnest(ids, job_types, unique_keys, while_executing) AS u(id, job, unique_key, we)
        WHERE u.unique_key IS NOT NULL AND u.we;
    END IF;
END;
$$;
