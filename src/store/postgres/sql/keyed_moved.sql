-- What a pass did to each schedule it locked (the arrays' positions): the
-- cursor, the latest job, a buffered tick, ticks skipped, when to look
-- again, the next tick and the pass's error, the replaced calendars not
-- yet done, and a tick asked for now cleared once handled.
UPDATE jobhost.keyed_schedules s
SET last_tick = m.last_tick,
    last_job = coalesce(m.last_job, s.last_job),
    buffered_tick = m.buffered_tick,
    skipped = s.skipped + m.skipped,
    look_at = m.look_at,
    next_tick = m.next_tick,
    error = m.error,
    triggered_at = CASE WHEN m.trigger_done THEN NULL ELSE s.triggered_at END,
    handovers = m.handovers
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::bigint[], $5::timestamptz[], $6::bigint[],
            $7::timestamptz[], $8::timestamptz[], $9::text[], $10::boolean[], $11::jsonb[])
     AS m (job, key, last_tick, last_job, buffered_tick, skipped, look_at, next_tick, error, trigger_done, handovers)
WHERE s.job = m.job AND s.key = m.key
