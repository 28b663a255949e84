-- Uniqueness claims of a large call taken with a plain INSERT first.
--
-- A bulk enqueue of unique jobs with new keys spent most of its time in
-- the claims' INSERT ... ON CONFLICT DO NOTHING: each row is a speculative
-- insertion (probe the index, insert, then confirm the insertion), about
-- one and a half times the cost of a plain insert of the same rows (25.8
-- against 15.7 ms for 5,000, BENCHMARKS.md). When a
-- call claims 64 keys or more and none of a sample of about 32 of its keys
-- is claimed already (most likely all are new), the claims are first
-- inserted plainly, in the same (type, key, id) order, in a block of their
-- own. If every row goes in, every job won its key and nothing is read
-- back. If one key is taken (claimed already, or twice in the call), the
-- INSERT fails on it with unique_violation, the block's subtransaction is
-- rolled back, giving back every claim it made, and the call claims as
-- before (0029_claim_new_keys.sql, 0007_uniqueness.sql): a failed
-- attempt costs about as much again as the call (the rows it rolled back
-- are in the index the second insert probes), which is why a sample of
-- the keys is checked first.
--
-- Locks are unchanged: the plain INSERT waits for a key another
-- transaction has claimed and not yet committed, as the speculative one
-- does, in the same order, so enqueuers still wait for keys only in
-- (type, key, id) order and never deadlock; if that transaction commits,
-- the INSERT fails and the fallback finds its claim, and if it rolls back,
-- the INSERT goes on. Small calls never open the subtransaction (a
-- transaction enqueuing job by job would pile one up per call).
--
-- claim_new_keys is the host's (one call per enqueue: ids, claims, keys),
-- claim_unique the SQL enqueue's; both keep their signatures and results.

CREATE OR REPLACE FUNCTION jobhost.claim_new_keys(
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
    all_won boolean := false;
BEGIN
    SELECT coalesce(array_agg(s.id), '{}') INTO ids
    FROM (SELECT nextval('jobhost.job_ids') AS id FROM generate_series(1, coalesce(cardinality(job_types), 0))
          ORDER BY 1) s;

    IF jobhost.claims_likely_new(job_types, unique_keys, while_executing) THEN
        BEGIN
            INSERT INTO jobhost.unique_claims (job, unique_key, job_id)
            SELECT u.job, u.unique_key, u.id
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
    END IF;

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

-- Whether a call's until_executed claims are worth a plain INSERT first:
-- none of about 32 of its jobs spread evenly over the call (one probe of
-- the claims' primary key each) has a key claimed already, so a call over
-- keys that are mostly held goes straight to the INSERT ... ON CONFLICT,
-- and it makes at least 64 claims (the sample first: it is the cheaper
-- refusal). while_executing null: every key is
-- until_executed.
CREATE FUNCTION jobhost.claims_likely_new(job_types text[], unique_keys text[], while_executing boolean[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT cardinality(job_types) >= 64
       AND NOT EXISTS (
            SELECT 1
            FROM generate_series(1, cardinality(job_types), greatest(cardinality(job_types) / 32, 1)) AS i(at)
            JOIN jobhost.unique_claims c ON c.job = job_types[i.at] AND c.unique_key = unique_keys[i.at])
       AND (SELECT count(*)
            FROM unnest(unique_keys, while_executing) AS u(unique_key, we)
            WHERE u.unique_key IS NOT NULL AND NOT coalesce(u.we, false)) >= 64
$$;

-- The SQL enqueue's claims (first in 0007_uniqueness.sql): the same plain
-- INSERT first for a large call, then as before.
CREATE OR REPLACE FUNCTION jobhost.claim_unique(job_types text[], unique_keys text[], job_ids bigint[])
RETURNS TABLE (ord bigint, claimant bigint)
LANGUAGE plpgsql AS $$
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
        LEFT JOIN jobhost.unique_claims c ON c.job = u.job AND c.unique_key = u.unique_key;
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
