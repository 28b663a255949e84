-- Inserts a batch of prepared jobs in input order: scheduled when due
-- later, available otherwise. The concurrency key ($8) was rendered by the
-- shared enqueue rules; its canonical text is what jobhost.render_key gives
-- for the stored document, so the SQL enqueue and this one store the same
-- key for the same payload (docs/concurrency.md, "Keys"). The ids ($10) are
-- the ones a batch with unique jobs took before claiming their keys, or
-- null for the sequence's next; the batches ($11) were counted by
-- jobhost.batch_add_members first. A rate-limited job due at once waits for
-- the time its key's plan gives it ($12, null for others; see
-- `rate::plan`). Returns each id, and whether the job must pass the gate
-- now (a limited job due at once).
INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, max_attempts, run_at, concurrency_key, parent_id,
                          batch_id)
SELECT coalesce(id, nextval('jobhost.job_ids')), job, queue, priority, payload,
       CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END,
       max_attempts, greatest(due, now()), concurrency_key, parent_id, batch_id
FROM (
    SELECT u.*, greatest(coalesce(u.at, now() + u.delay_ms * interval '1 millisecond'), u.planned) AS due
    FROM unnest($1::text[], $2::text[], $3::smallint[], $4::jsonb[], $5::int[], $6::timestamptz[],
                $7::bigint[], $8::text[], $9::bigint[], $10::bigint[], $11::bigint[], $12::timestamptz[])
        WITH ORDINALITY AS u(job, queue, priority, payload, max_attempts, at, delay_ms, concurrency_key,
                             parent_id, id, batch_id, planned, ord)
    ORDER BY u.ord
) input
RETURNING id, concurrency_key IS NOT NULL AND state = 'available'
