-- One lock order for every path that ends a job (docs/concurrency.md,
-- "Lock order"): job rows, then semaphore rows in (job, key) order, then
-- batch rows in id order. A path may wait only for a lock later in that
-- order than every lock it holds; a lock it needs out of order it takes
-- with SKIP LOCKED (or a bounded wait), leaving what it could not lock for
-- later. Two paths broke it:
--
-- * jobhost.finish_runs_unless_locked (a host's result write) took its
--   runs' semaphores and batches, then waited for their job rows, which an
--   expiry held while it waited for those semaphores: a deadlock, broken by
--   the server after deadlock_timeout. It now locks its runs' job rows
--   first.
-- * The expiry of leases (Rust-side SQL until now) held expired job rows
--   and waited for their semaphores and (through the archive's trigger)
--   their batches, in that order: batches before semaphores. It is now
--   jobhost.expire_leases, which takes the semaphores, then the batches, of
--   the jobs it ends with SKIP LOCKED, and leaves a job whose key or batch
--   another transaction holds (an application's open transaction) for the
--   next pass: an expiry never waits while it holds job rows.

-- jobhost.finish_runs_unless_locked (first in 0005_fault_tolerance, then
-- 0009_batches), now locking every run's job row before anything else.
CREATE OR REPLACE FUNCTION jobhost.finish_runs_unless_locked(
    keyed_ids bigint[], keyed_tokens bigint[],
    archive_ids bigint[], archive_tokens bigint[], archive_states text[], outputs jsonb[], archive_errors jsonb[],
    logs jsonb[], archive_progress jsonb[],
    requeue_ids bigint[], requeue_tokens bigint[], delays_ms bigint[], refunds integer[], requeue_errors jsonb[],
    requeue_progress jsonb[],
    queues text[], fetch_types text[], fetch_leases integer[], max_jobs bigint, host text
)
RETURNS TABLE (
    deferred bigint[], written bigint[], any_available boolean, id bigint, lease_token bigint, job text, queue text,
    payload jsonb, attempt integer, max_attempts integer, enqueued_at timestamptz, batch_id bigint,
    concurrency_key text, lease_secs integer
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    keyed bigint[];
    keys_locked bigint[] := '{}';
    batched bigint[];
    batch_ids bigint[];
    batches_locked bigint[] := '{}';
    previous_timeout text;
    held_back bigint[] := '{}';
BEGIN
    IF cardinality(keyed_ids) > 0 THEN
        -- Every current run of the plan is locked first, in id order, and
        -- the ones among keyed_ids say what else each needs locked. Job
        -- rows come first in every path that ends a job: this transaction
        -- never holds a key or a batch while it waits for a job row (an
        -- expiry holding one ends it quickly and waits for nothing).
        SELECT coalesce(array_agg(j.id) FILTER (WHERE j.concurrency_key IS NOT NULL), '{}'),
               coalesce(array_agg(j.id) FILTER (WHERE j.batch_id IS NOT NULL), '{}'),
               coalesce(array_agg(DISTINCT j.batch_id) FILTER (WHERE j.batch_id IS NOT NULL), '{}')
        INTO keyed, batched, batch_ids
        FROM (
            SELECT j.id, j.concurrency_key, j.batch_id
            FROM jobhost.jobs j
            JOIN unnest(archive_ids || requeue_ids, archive_tokens || requeue_tokens) AS r(run_id, run_token)
                ON r.run_id = j.id AND r.run_token = j.lease_token
            ORDER BY j.id
            FOR UPDATE OF j
        ) j
        WHERE j.id = ANY(keyed_ids);
        IF cardinality(keyed) > 0 THEN
            SELECT coalesce(array_agg(l.id), '{}') INTO keys_locked FROM (
                SELECT j.id FROM jobhost.jobs j
                JOIN jobhost.semaphores s ON s.job = j.job AND s.key = j.concurrency_key
                WHERE j.id = ANY(keyed)
                ORDER BY s.job, s.key
                FOR UPDATE OF s SKIP LOCKED
            ) l;
        END IF;
        IF cardinality(batch_ids) > 0 THEN
            -- Another host's result holds a batch's row for a moment: wait
            -- for it, briefly. Only a lock held longer (an application's
            -- open transaction) defers results: a deferred result costs a
            -- second write, and members of one batch end on many hosts at once.
            previous_timeout := current_setting('lock_timeout');
            BEGIN
                PERFORM set_config('lock_timeout', '50ms', true);
                PERFORM 1 FROM jobhost.batches b WHERE b.id = ANY(batch_ids) ORDER BY b.id FOR UPDATE;
                batches_locked := batch_ids;
            EXCEPTION WHEN lock_not_available THEN
                SELECT coalesce(array_agg(l.id), '{}') INTO batches_locked FROM (
                    SELECT b.id FROM jobhost.batches b
                    WHERE b.id = ANY(batch_ids)
                    ORDER BY b.id
                    FOR UPDATE OF b SKIP LOCKED
                ) l;
            END;
            PERFORM set_config('lock_timeout', previous_timeout, true);
        END IF;
        -- Usually every key and batch was free: nothing more to read.
        IF cardinality(keys_locked) < cardinality(keyed) OR cardinality(batches_locked) < cardinality(batch_ids) THEN
            SELECT coalesce(array_agg(DISTINCT j.id), '{}') INTO held_back
            FROM jobhost.jobs j
            WHERE (j.id = ANY(keyed) AND j.id <> ALL(keys_locked))
               OR (j.id = ANY(batched) AND j.batch_id <> ALL(batches_locked));
        END IF;
    END IF;
    IF cardinality(held_back) > 0 THEN
        SELECT coalesce(array_agg(i.a_id ORDER BY i.n), '{}'), coalesce(array_agg(i.a_token ORDER BY i.n), '{}'),
               coalesce(array_agg(i.a_state ORDER BY i.n), '{}'), coalesce(array_agg(i.a_output ORDER BY i.n), '{}'),
               coalesce(array_agg(i.a_error ORDER BY i.n), '{}'), coalesce(array_agg(i.a_log ORDER BY i.n), '{}'),
               coalesce(array_agg(i.a_progress ORDER BY i.n), '{}')
        INTO archive_ids, archive_tokens, archive_states, outputs, archive_errors, logs, archive_progress
        FROM unnest(archive_ids, archive_tokens, archive_states, outputs, archive_errors, logs, archive_progress)
            WITH ORDINALITY AS i(a_id, a_token, a_state, a_output, a_error, a_log, a_progress, n)
        WHERE i.a_id <> ALL(held_back);
        SELECT coalesce(array_agg(i.r_id ORDER BY i.n), '{}'), coalesce(array_agg(i.r_token ORDER BY i.n), '{}'),
               coalesce(array_agg(i.r_delay ORDER BY i.n), '{}'), coalesce(array_agg(i.r_refund ORDER BY i.n), '{}'),
               coalesce(array_agg(i.r_error ORDER BY i.n), '{}'), coalesce(array_agg(i.r_progress ORDER BY i.n), '{}')
        INTO requeue_ids, requeue_tokens, delays_ms, refunds, requeue_errors, requeue_progress
        FROM unnest(requeue_ids, requeue_tokens, delays_ms, refunds, requeue_errors, requeue_progress)
            WITH ORDINALITY AS i(r_id, r_token, r_delay, r_refund, r_error, r_progress, n)
        WHERE i.r_id <> ALL(held_back);
    END IF;
    RETURN QUERY
    SELECT held_back, f.*
    FROM jobhost.finish_runs(archive_ids, archive_tokens, archive_states, outputs, archive_errors, logs,
                             archive_progress, requeue_ids, requeue_tokens, delays_ms, refunds, requeue_errors,
                             requeue_progress, queues, fetch_types, fetch_leases, max_jobs, host) f;
END;
$$;

-- Rescues jobs whose host stopped renewing their lease (due_by is the
-- database's clock, or a test's), at most max_jobs, of every job or only of
-- only_ids: back to available with a note of what happened, keeping their
-- slot (they are redelivered, and nothing else may run beside them); or,
-- when the attempt that expired was the last, to the archive as failed (as
-- cancelled when an operator asked to cancel it), giving back the slot and
-- counted by the batch. Locks, in the order above: the expired running rows,
-- SKIP LOCKED, so sweeps on several hosts split the work; then the
-- semaphores and batch rows of the jobs it ends, SKIP LOCKED: a job whose
-- key or batch another transaction holds is left running, expired, for the
-- next pass (held_back). Returns how many it requeued, failed and held back.
CREATE FUNCTION jobhost.expire_leases(
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
    WHERE j.id = ANY(expired) AND (j.attempt >= j.max_attempts OR j.cancel_requested_at IS NOT NULL);
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
        SELECT j.id, j.attempt >= j.max_attempts OR j.cancel_requested_at IS NOT NULL AS spent,
               j.cancel_requested_at IS NOT NULL AS cancelled,
               j.errors || jsonb_build_array(jsonb_build_object(
                   'attempt', j.attempt, 'at', now(),
                   'error', format('lease expired: host %s stopped during the run, attempt %s of %s',
                                   j.host_id, j.attempt, j.max_attempts)
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

-- Takes, in the lock order, the locks a path that waits for them needs to
-- end (or admit) the named jobs: their rows in jobs (in id order), their
-- keys' semaphore rows (in key order), and their batches' rows, of jobs
-- and blocked jobs (in id order). Then that path's own statements (the
-- archive's batch trigger, the release of slots) find them held. For an
-- operator's cancel or retry, and a result write that waits for its keys
-- instead of leaving them out.
CREATE FUNCTION jobhost.lock_for_ending(job_ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM jobhost.jobs j WHERE j.id = ANY(job_ids) ORDER BY j.id FOR UPDATE;
    PERFORM 1 FROM jobhost.semaphores s
    WHERE (s.job, s.key) IN (SELECT j.job, j.concurrency_key FROM jobhost.jobs j
                             WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL)
    ORDER BY s.job, s.key
    FOR UPDATE;
    PERFORM 1 FROM jobhost.batches b
    WHERE b.id IN (SELECT j.batch_id FROM jobhost.jobs j WHERE j.id = ANY(job_ids)
                   UNION SELECT p.batch_id FROM jobhost.blocked_jobs p WHERE p.id = ANY(job_ids))
    ORDER BY b.id
    FOR UPDATE;
END;
$$;
