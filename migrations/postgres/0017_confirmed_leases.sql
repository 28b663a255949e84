-- An attempt is spent only by a run that started (guarantee 5). A lease
-- whose write's answer never reached its host (the reply lost, the host
-- gone at once) was never run, yet its expiry used to charge an attempt and
-- fail a job on its last one. A host now confirms each run it starts: the
-- renewal that follows the start (or the start's own note, for a job that
-- waited for a run slot) writes the run's lease token to confirmed_token.
-- A lease that expires unconfirmed gives its attempt back.
--
-- Jobs leased by hosts of an earlier version, which never confirm, get
-- their attempt back if such a host dies: an upgrade errs on the side of a
-- job running once more.

ALTER TABLE jobhost.jobs ADD COLUMN confirmed_token bigint;

-- How many times a lease of this job expired unconfirmed and gave its
-- attempt back. Past three, an unconfirmed expiry is charged too: a job
-- whose run brings its host down before the first heartbeat (every host
-- that takes it dies at once) must not be retried for ever.
ALTER TABLE jobhost.jobs ADD COLUMN unconfirmed_expiries smallint NOT NULL DEFAULT 0;

-- Whether the expiry of this running job's lease charges its attempt: its
-- host confirmed the run, or its unconfirmed expiries are used up.
CREATE FUNCTION jobhost.expiry_charges(j jobhost.jobs) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT j.confirmed_token IS NOT DISTINCT FROM j.lease_token OR j.unconfirmed_expiries >= 3
$$;

-- Whether the expiry of this running job's lease ends it: an operator asked
-- to cancel it, or the charged attempt was its last.
CREATE FUNCTION jobhost.expiry_ends(j jobhost.jobs) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT j.cancel_requested_at IS NOT NULL OR (jobhost.expiry_charges(j) AND j.attempt >= j.max_attempts)
$$;

-- jobhost.expire_leases (first in 0016_lock_order), now charging an attempt
-- only to a run its host confirmed. Rescues jobs whose host stopped
-- renewing their lease (due_by is the database's clock, or a test's), at
-- most max_jobs, of every job or only of only_ids: back to available with a
-- note of what happened, keeping their slot (they are redelivered, and
-- nothing else may run beside them), and with their attempt given back when
-- the host never confirmed the run's start; or, when a confirmed attempt
-- that expired was the last, to the archive as failed (as cancelled when an
-- operator asked to cancel it), giving back the slot and counted by the
-- batch. Locks, in the order above: the expired running rows,
-- SKIP LOCKED, so sweeps on several hosts split the work; then the
-- semaphores and batch rows of the jobs it ends, SKIP LOCKED: a job whose
-- key or batch another transaction holds is left running, expired, for the
-- next pass (held_back). Returns how many it requeued, failed and held back.
CREATE OR REPLACE FUNCTION jobhost.expire_leases(
    due_by timestamptz, only_ids bigint[], max_jobs integer,
    OUT requeued integer, OUT failed integer, OUT held_back integer
)
LANGUAGE plpgsql AS $$
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
             enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id)
        SELECT id, job, queue, priority, payload, CASE WHEN cancelled THEN 'cancelled' ELSE 'failed' END,
               attempt, max_attempts, new_errors, progress,
               enqueued_at, started_at, now(), host_id, concurrency_key, batch_id, parent_id
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
