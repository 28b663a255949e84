-- jobhost.finish_runs_unless_locked: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0016_lock_order.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.finish_runs_unless_locked(keyed_ids bigint[], keyed_tokens bigint[], archive_ids bigint[], archive_tokens bigint[], archive_states text[], outputs jsonb[], archive_errors jsonb[], logs jsonb[], archive_progress jsonb[], requeue_ids bigint[], requeue_tokens bigint[], delays_ms bigint[], refunds integer[], requeue_errors jsonb[], requeue_progress jsonb[], queues text[], fetch_types text[], fetch_leases integer[], max_jobs bigint, host text) RETURNS TABLE(deferred bigint[], written bigint[], any_available boolean, id bigint, lease_token bigint, job text, queue text, payload jsonb, attempt integer, max_attempts integer, enqueued_at timestamp with time zone, batch_id bigint, concurrency_key text, lease_secs integer)
    LANGUAGE plpgsql
    AS $$
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
