-- jobhost.admit: its current definition.
-- Hosts apply this file when its content changes (see
-- src/store/postgres/functions.rs): edit it here, not in a new migration.
-- Migrations up to 0027_set_gate.sql hold its earlier copies as history.

CREATE OR REPLACE FUNCTION jobhost.admit(job_ids bigint[], enqueuer_waiting boolean) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    admitted integer;
    key_jobs text[];
    key_names text[];
    key_counts integer[];
    key_limits integer[];
    key_taken integer[];
    key_conflicts text[];
    available bigint[];
    parked bigint[];
    discarded bigint[];
    reasons text[];
BEGIN
    WITH unkeyed AS (
        UPDATE jobhost.jobs SET state = 'available'
        WHERE id = ANY(job_ids) AND concurrency_key IS NULL AND state <> 'available'
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM jobhost.jobs WHERE id = ANY(job_ids) AND concurrency_key IS NULL)
    INTO admitted;

    -- The keys, in (job, key) order, with how many of the jobs each has
    -- (aggregated from a sorted subquery: one sort instead of one per array).
    SELECT array_agg(w.job), array_agg(w.key), array_agg(w.n)
    INTO key_jobs, key_names, key_counts
    FROM (
        SELECT j.job, j.concurrency_key AS key, count(*)::integer AS n
        FROM jobhost.jobs j
        WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL
        GROUP BY 1, 2
        ORDER BY 1, 2
    ) w;
    IF key_jobs IS NULL THEN
        RETURN admitted;
    END IF;
    SELECT g.slot_limits, g.taken, g.on_conflicts INTO key_limits, key_taken, key_conflicts
    FROM jobhost.take_slots(key_jobs, key_names, key_counts, enqueuer_waiting) g;

    WITH ranked AS (
        SELECT j.id, j.job, j.concurrency_key AS key,
               row_number() OVER (PARTITION BY j.job, j.concurrency_key ORDER BY j.priority, j.run_at, j.id) AS place
        FROM jobhost.jobs j
        WHERE j.id = ANY(job_ids) AND j.concurrency_key IS NOT NULL
    ), judged AS (
        SELECT r.id, r.job, r.key, r.place, t.ord, t.slot_limit, r.place <= t.taken AS admitted, t.on_conflict
        FROM ranked r
        JOIN unnest(key_jobs, key_names, key_limits, key_taken, key_conflicts)
            WITH ORDINALITY AS t(job, key, slot_limit, taken, on_conflict, ord)
            ON t.job = r.job AND t.key = r.key
    )
    SELECT array_agg(j.id) FILTER (WHERE j.admitted),
           array_agg(j.id ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict NOT IN ('discard', 'raise')),
           array_agg(j.id ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict IN ('discard', 'raise')),
           array_agg(format('concurrency limit reached: all %s slots of key "%s" are taken', j.slot_limit, j.key)
                     ORDER BY j.ord, j.place) FILTER (WHERE NOT j.admitted AND j.on_conflict IN ('discard', 'raise'))
    INTO available, parked, discarded, reasons
    FROM judged j;

    IF available IS NOT NULL THEN
        UPDATE jobhost.jobs SET state = 'available' WHERE id = ANY(available) AND state <> 'available';
        admitted := admitted + cardinality(available);
    END IF;
    IF discarded IS NOT NULL THEN
        PERFORM jobhost.discard_each(discarded, reasons);
    END IF;
    IF parked IS NOT NULL THEN
        PERFORM jobhost.park(parked);
    END IF;
    RETURN admitted;
END;
$$;
