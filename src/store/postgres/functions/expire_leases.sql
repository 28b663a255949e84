-- jobhost.expire_leases: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0043_claims_found_by_key_functions.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.expire_leases(due_by timestamp with time zone, only_ids bigint[], max_jobs integer, OUT requeued integer, OUT failed integer, OUT held_back integer) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    expired bigint[];
    ending bigint[];
    keyed bigint[];
    with_semaphore bigint[];
    keys_locked bigint[];
    batched bigint[];
    batch_ids bigint[];
    batches_locked bigint[];
    waiting bigint[];
    freed_jobs text[];
    freed_keys text[];
BEGIN
    requeued := 0;
    failed := 0;
    held_back := 0;
    SELECT coalesce(array_agg(e.id), '{}') INTO expired FROM (
        SELECT j.id FROM jobhost.jobs j
        WHERE j.state = 'running' AND j.lease_expires_at < due_by
          AND (only_ids IS NULL OR j.id = ANY(only_ids))
        ORDER BY j.lease_expires_at
        LIMIT max_jobs
        FOR UPDATE SKIP LOCKED
    ) e;
    IF cardinality(expired) = 0 THEN
        RETURN;
    END IF;
    -- The jobs this expiry ends, and what each needs locked.
    SELECT coalesce(array_agg(j.id), '{}'),
           coalesce(array_agg(j.id) FILTER (WHERE j.concurrency_key IS NOT NULL), '{}'),
           coalesce(array_agg(j.id) FILTER (WHERE j.batch_id IS NOT NULL), '{}'),
           coalesce(array_agg(DISTINCT j.batch_id) FILTER (WHERE j.batch_id IS NOT NULL), '{}')
    INTO ending, keyed, batched, batch_ids
    FROM jobhost.jobs j
    WHERE j.id = ANY(expired) AND jobhost.expiry_ends(j);
    IF cardinality(keyed) > 0 THEN
        SELECT coalesce(array_agg(l.id), '{}') INTO keys_locked FROM (
            SELECT j.id FROM jobhost.jobs j
            JOIN jobhost.semaphores s ON s.job = j.job AND s.key = j.concurrency_key
            WHERE j.id = ANY(keyed)
            ORDER BY s.job, s.key
            FOR UPDATE OF s SKIP LOCKED
        ) l;
        -- A key whose row is missing (deleted by hand) has nothing to wait for.
        SELECT coalesce(array_agg(j.id), '{}') INTO with_semaphore
        FROM jobhost.jobs j JOIN jobhost.semaphores s ON s.job = j.job AND s.key = j.concurrency_key
        WHERE j.id = ANY(keyed);
        waiting := ARRAY(SELECT unnest(with_semaphore) EXCEPT SELECT unnest(keys_locked));
    ELSE
        waiting := '{}';
    END IF;
    IF cardinality(batch_ids) > 0 THEN
        SELECT coalesce(array_agg(l.id), '{}') INTO batches_locked FROM (
            SELECT b.id FROM jobhost.batches b
            WHERE b.id = ANY(batch_ids)
            ORDER BY b.id
            FOR UPDATE OF b SKIP LOCKED
        ) l;
        waiting := waiting || ARRAY(
            SELECT j.id FROM jobhost.jobs j
            JOIN jobhost.batches b ON b.id = j.batch_id
            WHERE j.id = ANY(batched) AND b.id <> ALL(batches_locked));
    END IF;
    IF cardinality(waiting) > 0 THEN
        SELECT count(DISTINCT w) INTO held_back FROM unnest(waiting) AS w;
        expired := ARRAY(SELECT unnest(expired) EXCEPT SELECT unnest(waiting));
    END IF;
    WITH noted AS (
        SELECT j.id, jobhost.expiry_ends(j) AS spent,
               j.cancel_requested_at IS NOT NULL AS cancelled,
               NOT jobhost.expiry_charges(j) AS refund,
               j.errors || jsonb_build_array(jsonb_build_object(
                   'attempt', j.attempt, 'at', now(),
                   'error', CASE WHEN jobhost.expiry_charges(j)
                                 THEN format('lease expired: host %s stopped during the run, attempt %s of %s',
                                             j.host_id, j.attempt, j.max_attempts)
                                 ELSE format('lease expired before host %s started the run: attempt %s given back',
                                             j.host_id, j.attempt)
                            END
                            || CASE WHEN j.cancel_requested_at IS NOT NULL
                                    THEN '; cancelled by an operator while running' ELSE '' END)) AS errors
        FROM jobhost.jobs j
        WHERE j.id = ANY(expired)
    ),
    gone AS (
        DELETE FROM jobhost.jobs j USING noted n
        WHERE j.id = n.id AND n.spent
        RETURNING j.*, n.errors AS new_errors, n.cancelled
    ),
    archived AS (
        INSERT INTO jobhost.archive
            (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
             enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id, unique_key,
             key_carried)
        SELECT id, job, queue, priority, payload, CASE WHEN cancelled THEN 'cancelled' ELSE 'failed' END,
               attempt, max_attempts, new_errors, progress,
               enqueued_at, started_at, now(), host_id, concurrency_key, batch_id, parent_id, unique_key, true
        FROM gone
        RETURNING id, job, concurrency_key
    ),
    back AS (
        UPDATE jobhost.jobs j
        SET state = 'available', run_at = now(), errors = n.errors,
            attempt = j.attempt - n.refund::int, unconfirmed_expiries = j.unconfirmed_expiries + n.refund::int,
            lease_token = NULL, lease_secs = NULL, lease_expires_at = NULL, host_id = NULL
        FROM noted n
        WHERE j.id = n.id AND NOT n.spent
        RETURNING j.id
    )
    SELECT (SELECT count(*) FROM back), (SELECT count(*) FROM archived),
           (SELECT coalesce(array_agg(a.job), '{}') FROM archived a WHERE a.concurrency_key IS NOT NULL),
           (SELECT coalesce(array_agg(a.concurrency_key), '{}') FROM archived a WHERE a.concurrency_key IS NOT NULL)
    INTO requeued, failed, freed_jobs, freed_keys;
    IF cardinality(freed_jobs) > 0 THEN
        PERFORM jobhost.release_slots(freed_jobs, freed_keys);
    END IF;
    IF requeued > 0 THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
END;
$$;
