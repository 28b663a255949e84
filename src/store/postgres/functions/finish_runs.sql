-- jobhost.finish_runs: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0043_claims_found_by_key_functions.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.finish_runs(archive_ids bigint[], archive_tokens bigint[], archive_states text[], outputs jsonb[], archive_errors jsonb[], logs jsonb[], archive_progress jsonb[], requeue_ids bigint[], requeue_tokens bigint[], delays_ms bigint[], refunds integer[], requeue_errors jsonb[], requeue_progress jsonb[], queues text[] DEFAULT '{}'::text[], fetch_types text[] DEFAULT '{}'::text[], fetch_leases integer[] DEFAULT '{}'::integer[], max_jobs bigint DEFAULT 0, host text DEFAULT ''::text) RETURNS TABLE(written bigint[], any_available boolean, id bigint, lease_token bigint, job text, queue text, payload jsonb, attempt integer, max_attempts integer, enqueued_at timestamp with time zone, batch_id bigint, concurrency_key text, lease_secs integer)
    LANGUAGE plpgsql
    AS $$
#variable_conflict use_column
DECLARE
    archived bigint[];
    freed_jobs text[];
    freed_keys text[];
    requeued bigint[];
    waiting_jobs text[];
    waiting_keys text[];
    available_now boolean;
    promoted integer := 0;
    leased jobhost.jobs[] := '{}';
    promoted_leased integer := 0;
    fetched jobhost.jobs[];
    left_available boolean := false;
BEGIN
    archived := '{}';
    freed_jobs := '{}';
    freed_keys := '{}';
    requeued := '{}';
    waiting_jobs := '{}';
    waiting_keys := '{}';
    available_now := false;
    IF cardinality(archive_ids) > 0 THEN
        WITH input AS (
            SELECT *
            FROM unnest(archive_ids, archive_tokens, archive_states, outputs, archive_errors, logs, archive_progress)
                AS i(id, lease_token, state, output, error, log, progress)
        ),
        ended AS (
            DELETE FROM jobhost.jobs j
            USING input i
            WHERE j.id = i.id AND j.lease_token = i.lease_token
            RETURNING j.*
        ),
        moved AS (
            INSERT INTO jobhost.archive
                (id, job, queue, priority, payload, state, attempt, max_attempts, output, errors, log, progress,
                 enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id, unique_key,
                 key_carried)
            SELECT e.id, e.job, e.queue, e.priority, e.payload, i.state, e.attempt, e.max_attempts, i.output,
                   CASE WHEN i.error IS NULL THEN e.errors
                        ELSE e.errors || jsonb_build_array(i.error || jsonb_build_object('at', now())) END,
                   i.log, coalesce(i.progress, e.progress),
                   e.enqueued_at, e.started_at, now(), e.host_id, e.concurrency_key, e.batch_id, e.parent_id,
                   e.unique_key, true
            FROM ended e
            JOIN input i ON i.id = e.id
            RETURNING id, job, concurrency_key
        )
        SELECT coalesce(array_agg(m.id), '{}'),
               coalesce(array_agg(m.job) FILTER (WHERE m.concurrency_key IS NOT NULL), '{}'),
               coalesce(array_agg(m.concurrency_key) FILTER (WHERE m.concurrency_key IS NOT NULL), '{}')
        INTO archived, freed_jobs, freed_keys
        FROM moved m;
    END IF;

    IF cardinality(requeue_ids) > 0 THEN
        WITH input AS (
            SELECT *
            FROM unnest(requeue_ids, requeue_tokens, delays_ms, refunds, requeue_errors, requeue_progress)
                AS i(id, lease_token, delay_ms, refund, error, progress)
        ),
        back AS (
            UPDATE jobhost.jobs j
            SET state = CASE WHEN i.delay_ms > 0 THEN 'scheduled' ELSE 'available' END,
                run_at = now() + i.delay_ms * interval '1 millisecond',
                attempt = j.attempt - i.refund,
                errors = CASE WHEN i.error IS NULL THEN j.errors
                              ELSE j.errors || jsonb_build_array(i.error || jsonb_build_object('at', now())) END,
                progress = coalesce(i.progress, j.progress),
                lease_token = NULL,
                lease_secs = NULL,
                lease_expires_at = NULL,
                host_id = NULL
            FROM input i
            WHERE j.id = i.id AND j.lease_token = i.lease_token
            RETURNING j.id, j.state, j.job, j.concurrency_key
        )
        SELECT coalesce(array_agg(b.id), '{}'),
               coalesce(array_agg(b.job) FILTER (WHERE b.state = 'scheduled' AND b.concurrency_key IS NOT NULL), '{}'),
               coalesce(array_agg(b.concurrency_key) FILTER (WHERE b.state = 'scheduled' AND b.concurrency_key IS NOT NULL),
                        '{}'),
               coalesce(bool_or(b.state = 'available'), false)
        INTO requeued, waiting_jobs, waiting_keys, available_now
        FROM back b;
    END IF;

    IF cardinality(freed_jobs) + cardinality(waiting_jobs) > 0 THEN
        -- What the fetch below would lease of these promotions goes in
        -- leased already; nobody is woken for the rest yet (see
        -- notify_available and 0012).
        IF max_jobs > 0 THEN
            PERFORM set_config('jobhost.promotions_unannounced', 'on', true);
        END IF;
        SELECT r.promoted, r.leased INTO promoted, leased
        FROM jobhost.release_slots_leasing(freed_jobs || waiting_jobs, freed_keys || waiting_keys,
                                           queues, fetch_types, fetch_leases, max_jobs, host) r;
        promoted_leased := cardinality(leased);
        PERFORM set_config('jobhost.promotions_unannounced', '', true);
    END IF;
    IF available_now THEN
        PERFORM pg_notify('jobhost_available', '');
    END IF;
    written := archived || requeued;
    IF max_jobs > 0 THEN
        IF max_jobs > cardinality(leased) THEN
            SELECT array_agg(f) INTO fetched
            FROM jobhost.fetch(queues, fetch_types, fetch_leases, max_jobs - cardinality(leased), host) f;
            leased := leased || coalesce(fetched, '{}');
        END IF;
        IF promoted > promoted_leased THEN
            -- A promoted job left available (the host's budget was spent, or
            -- the job's queue is one this host does not serve) is announced
            -- now. Any available job on a key this call freed counts: a
            -- needless wake-up costs one empty fetch, a missed one a
            -- promoted job waiting for the next poll.
            SELECT EXISTS (
                SELECT 1 FROM jobhost.jobs j
                JOIN unnest(freed_jobs || waiting_jobs, freed_keys || waiting_keys) AS f(job, key)
                    ON j.job = f.job AND j.concurrency_key = f.key
                WHERE j.state = 'available'
            ) INTO left_available;
            IF left_available THEN
                PERFORM pg_notify('jobhost_available', '');
            END IF;
        END IF;
    ELSE
        left_available := promoted > 0;
    END IF;
    -- Whether the writing host should look for more: only what it did not lease.
    any_available := available_now OR left_available;
    IF cardinality(leased) > 0 THEN
        RETURN QUERY
        SELECT written, any_available, j.id, j.lease_token, j.job, j.queue, j.payload, j.attempt, j.max_attempts,
               j.enqueued_at, j.batch_id, j.concurrency_key, j.lease_secs
        FROM unnest(leased) j;
        RETURN;
    END IF;
    RETURN QUERY SELECT written, any_available, NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::jsonb,
                        NULL::integer, NULL::integer, NULL::timestamptz, NULL::bigint, NULL::text, NULL::integer;
END;
$$;
