-- Renews the leases a host asks about and says, for each run, whether it
-- was renewed, whether an operator asked to cancel it, and whether it is
-- still this host's; a renewed run among $4..$6 (ids, tokens, documents)
-- records its latest progress, and one among $7 (ids of runs whose guests
-- started) is confirmed: its expiry will spend the attempt. Locks: the rows renewed,
-- taken with SKIP LOCKED so a row another transaction holds is passed over
-- instead of waited for. Every part of the statement sees one snapshot, so
-- a row locked by an uncommitted transaction still reads as this host's.
WITH asked AS (
    SELECT * FROM unnest($2::bigint[], $3::bigint[]) AS a(id, lease_token)
), lockable AS (
    SELECT j.id, j.lease_token FROM jobhost.jobs j
    JOIN asked a ON a.id = j.id AND a.lease_token = j.lease_token
    WHERE j.host_id = $1
    FOR UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE jobhost.jobs j
    SET lease_expires_at = now() + j.lease_secs * interval '1 second',
        progress = coalesce(p.progress, j.progress),
        confirmed_token = CASE WHEN j.id = ANY($7::bigint[]) THEN j.lease_token ELSE j.confirmed_token END
    FROM lockable l
    LEFT JOIN unnest($4::bigint[], $5::bigint[], $6::jsonb[]) AS p(id, lease_token, progress)
        ON p.id = l.id AND p.lease_token = l.lease_token
    WHERE j.id = l.id
    RETURNING j.id, j.lease_token, j.cancel_requested_at IS NOT NULL AS cancel
)
SELECT a.id, a.lease_token,
       EXISTS (SELECT 1 FROM renewed r WHERE r.id = a.id AND r.lease_token = a.lease_token) AS renewed,
       EXISTS (SELECT 1 FROM renewed r WHERE r.id = a.id AND r.lease_token = a.lease_token AND r.cancel) AS cancel,
       EXISTS (SELECT 1 FROM jobhost.jobs j
               WHERE j.id = a.id AND j.lease_token = a.lease_token AND j.host_id = $1) AS ours
FROM asked a
