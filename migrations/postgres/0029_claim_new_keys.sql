-- Uniqueness for the host's enqueue of a batch in one call instead of
-- three (taking ids, claiming keys, recording keys), and the claimant read
-- only for the keys a call did not win: a bulk enqueue of unique jobs with
-- distinct keys paid a read of 5,000 claims it had just written.
--
-- Takes the jobs' ids from the sequence in input order, claims their
-- until_executed keys as claim_unique (0007_uniqueness.sql) does: one
-- INSERT ... ON CONFLICT DO NOTHING in (type, key, id) order, so two
-- enqueuers of one key serialize on the primary key and exactly one wins;
-- within a call the first job of a key in that order wins. A job whose
-- claim did not win reads its key's claimant in a statement of its own
-- (it sees what the transactions the insert waited for committed); a key
-- released between the two is claimed again, at most 100 times. Then
-- records in unique_keys the key of every job that will be written (its
-- claim won, or its key is while_executing), before the job is written:
-- the archive's trigger must find a discarded job's key.
--
-- Arguments per job, in input order: its type, its rendered key (null:
-- not unique) and whether the key is while_executing. Returns per job, in
-- input order, its id and its key's claimant: its own id when it is to be
-- written, the holder's when it is a duplicate, null when it has no key.
CREATE FUNCTION jobhost.claim_new_keys(
    job_types text[], unique_keys text[], while_executing boolean[],
    OUT ids bigint[], OUT claimants bigint[]
)
LANGUAGE plpgsql AS $$
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
BEGIN
    SELECT coalesce(array_agg(s.id), '{}') INTO ids
    FROM (SELECT nextval('jobhost.job_ids') AS id FROM generate_series(1, coalesce(cardinality(job_types), 0))
          ORDER BY 1) s;

    WITH claimed AS (
        INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
        SELECT u.job, u.unique_key, u.id
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
        LEFT JOIN jobhost.unique_claims c ON c.job = l.job AND c.unique_key = l.unique_key;
        found_ords := found_ords || coalesce(read_ords, '{}');
        found_claimants := found_claimants || coalesce(read_claimants, '{}');
        EXIT WHEN lost_ords IS NULL;
        -- Released between the claim and the read: claim them again.
        tries := tries + 1;
        IF tries >= 100 THEN
            RAISE EXCEPTION 'uniqueness keys kept being released while they were claimed' USING ERRCODE = '40001';
        END IF;
        WITH claimed AS (
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
            SELECT l.job, l.unique_key, l.id
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

    -- A job with a key is written unless another job holds its key.
    SELECT coalesce(array_agg(CASE WHEN u.unique_key IS NULL THEN NULL ELSE coalesce(f.claimant, u.id) END
                              ORDER BY u.ord), '{}')
    INTO claimants
    FROM unnest(unique_keys, ids) WITH ORDINALITY AS u(unique_key, id, ord)
    LEFT JOIN unnest(found_ords, found_claimants) AS f(ord, claimant) ON f.ord = u.ord;

    INSERT INTO jobhost.unique_keys (job_id, job, unique_key, while_executing)
    SELECT u.id, u.job, u.unique_key, u.we
    FROM unnest(ids, job_types, unique_keys, while_executing, claimants) AS u(id, job, unique_key, we, claimant)
    WHERE u.unique_key IS NOT NULL AND u.claimant = u.id;
END;
$$;
