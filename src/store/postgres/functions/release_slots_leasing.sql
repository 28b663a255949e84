-- jobhost.release_slots_leasing: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0043_claims_found_by_key_functions.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.release_slots_leasing(job_types text[], slot_keys text[], queues text[], fetch_types text[], fetch_leases integer[], max_jobs bigint, host text, OUT promoted integer, OUT leased jobhost.jobs[]) RETURNS record
    LANGUAGE plpgsql
    AS $$
DECLARE
    orphan record;
    keys_freed integer;
    keys_held integer;
    emptied integer;
BEGIN
    PERFORM 1 FROM jobhost.semaphores s
    WHERE (s.job, s.key) IN (SELECT t.job, t.key FROM unnest(job_types, slot_keys) AS t(job, key))
    ORDER BY s.job, s.key
    FOR UPDATE;

    WITH freed AS (
        SELECT t.job, t.key, count(*)::integer AS n
        FROM unnest(job_types, slot_keys) AS t(job, key)
        WHERE t.key IS NOT NULL
        GROUP BY 1, 2
    ),
    room AS (
        SELECT s.job, s.key, f.n,
               greatest(coalesce((t.config -> 'concurrency' ->> 'limit')::integer, 2147483647)
                        - greatest(s.holders - f.n, 0), 0) AS free
        FROM jobhost.semaphores s
        JOIN freed f ON f.job = s.job AND f.key = s.key
        LEFT JOIN jobhost.job_types t ON t.name = s.job
    ),
    chosen AS (
        SELECT p.id
        FROM room r
        CROSS JOIN LATERAL (
            SELECT b.id FROM jobhost.blocked_jobs b
            WHERE b.job = r.job AND b.concurrency_key = r.key
            ORDER BY b.priority, b.parked_at, b.id
            LIMIT r.free
            FOR UPDATE SKIP LOCKED
        ) p
        WHERE r.free > 0
    ),
    moved AS (
        DELETE FROM jobhost.blocked_jobs b USING chosen c WHERE b.id = c.id RETURNING b.*
    ),
    servable AS MATERIALIZED (
        -- Materialized: placed reads `servable` twice, and inlined each
        -- read would call rate_governed again.
        SELECT m.*, s.lease_secs AS lease_for,
               s.lease_secs IS NOT NULL AND m.queue = ANY(queues)
               AND NOT jobhost.rate_governed(m.job)
               AND NOT EXISTS (SELECT 1 FROM jobhost.unique_keys k WHERE k.job_id = m.id AND k.while_executing)
                   AS servable
        FROM moved m
        LEFT JOIN unnest(fetch_types, fetch_leases) AS s(job, lease_secs) ON s.job = m.job
    ),
    ahead AS MATERIALIZED (
        -- Read only when there is a servable promotion to place.
        SELECT a.priority FROM jobhost.fetch_ahead(queues, fetch_types, max_jobs) AS a(priority)
    ),
    placed AS (
        -- A servable promotion's place in the fetch: the servable promotions
        -- before it, and the available jobs of its priority or before.
        SELECT v.*,
               v.servable AND max_jobs > 0
               AND (row_number() OVER (PARTITION BY v.servable ORDER BY v.priority, v.id) - 1)
                   + (SELECT count(*) FROM ahead a WHERE a.priority <= v.priority)
                   < max_jobs AS lease
        FROM servable v
    ),
    inserted AS (
        INSERT INTO jobhost.jobs AS j
            (id, job, queue, priority, payload, state, attempt, max_attempts, run_at, enqueued_at, started_at,
             concurrency_key, batch_id, parent_id, errors, progress, unique_key,
             lease_token, lease_secs, lease_expires_at, host_id)
        SELECT p.id, p.job, p.queue, p.priority, p.payload,
               CASE WHEN p.lease THEN 'running' ELSE 'available' END,
               p.attempt + CASE WHEN p.lease THEN 1 ELSE 0 END, p.max_attempts, now(),
               p.enqueued_at, CASE WHEN p.lease THEN now() ELSE p.started_at END,
               p.concurrency_key, p.batch_id, p.parent_id, p.errors, p.progress, p.unique_key,
               CASE WHEN p.lease THEN nextval('jobhost.lease_tokens') END,
               CASE WHEN p.lease THEN p.lease_for END,
               CASE WHEN p.lease THEN now() + p.lease_for * interval '1 second' END,
               CASE WHEN p.lease THEN host END
        FROM placed p
        RETURNING j
    ),
    taken AS (
        SELECT (i.j).job, (i.j).concurrency_key AS key, count(*)::integer AS n FROM inserted i GROUP BY 1, 2
    ),
    counted AS (
        -- Runs whether or not it is read, like every data-modifying WITH.
        UPDATE jobhost.semaphores s
        SET holders = greatest(s.holders - r.n, 0) + coalesce(t.n, 0), updated_at = now()
        FROM room r
        LEFT JOIN taken t ON t.job = r.job AND t.key = r.key
        WHERE s.job = r.job AND s.key = r.key
    )
    SELECT count(*)::integer, coalesce(array_agg(i.j) FILTER (WHERE (i.j).state = 'running'), '{}'),
           (SELECT count(*)::integer FROM freed), (SELECT count(*)::integer FROM room)
    INTO promoted, leased, keys_freed, keys_held
    FROM inserted i;

    DELETE FROM jobhost.semaphores s
    USING unnest(job_types, slot_keys) AS t(job, key)
    WHERE s.job = t.job AND s.key = t.key AND s.holders = 0;
    GET DIAGNOSTICS emptied = ROW_COUNT;

    -- A freed key is left without a row only when the DELETE just emptied
    -- it or it had none when the promotion began (see the header).
    IF emptied = 0 AND keys_held = keys_freed THEN
        RETURN;
    END IF;
    FOR orphan IN
        SELECT DISTINCT t.job, t.key FROM unnest(job_types, slot_keys) AS t(job, key)
        WHERE t.key IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM jobhost.semaphores s WHERE s.job = t.job AND s.key = t.key)
        ORDER BY 1, 2
    LOOP
        promoted := promoted + jobhost.promote_parked(orphan.job, orphan.key);
    END LOOP;
END;
$$;
