//! Lease renewal and expiry in SQLite, inside the caller's write transaction.

use sqlx::SqliteConnection;

use super::concurrency;
use super::{iso, json_list};
use crate::store::Result;
use crate::store::Slots;

pub async fn renew(conn: &mut SqliteConnection, host_id: &str, leases: &[(i64, i64)]) -> Result<Vec<i64>> {
    // A job whose token changed is not renewed, and so not returned.
    Ok(sqlx::query_scalar(
        "UPDATE jobs SET lease_expires_at = $3 + jobs.lease_secs * 1000
         FROM json_each($2) l
         WHERE jobs.id = l.value ->> 0 AND jobs.lease_token = l.value ->> 1 AND jobs.host_id = $1
         RETURNING jobs.id",
    )
    .bind(host_id)
    .bind(json_list(leases))
    .bind(super::now_ms())
    .fetch_all(conn)
    .await?)
}

/// Rescues jobs whose host stopped renewing their lease: back to available
/// with a note of what happened, keeping their slot (the job is redelivered
/// and nothing else may run beside it), or to the archive as failed when the
/// attempt that expired was the last, giving the slot back (guarantee 10).
/// Returns (requeued, failed).
pub async fn expire(conn: &mut SqliteConnection, now: i64) -> Result<(u64, u64)> {
    let expired: Vec<(i64, bool)> = sqlx::query_as(
        "SELECT id, attempt >= max_attempts FROM jobs
         WHERE state = 'running' AND lease_expires_at < $1
         ORDER BY lease_expires_at LIMIT 1000",
    )
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    let ids_where = |spent: bool| json_list(&expired.iter().filter(|e| e.1 == spent).map(|e| e.0).collect::<Vec<_>>());
    let (spent, requeue) = (ids_where(true), ids_where(false));
    let note = "json_insert(errors, '$[#]', json_object('attempt', attempt, 'at', $2,
                'error', 'lease expired: host ' || host_id || ' stopped heartbeating'))";
    // Built from constants only; every value is a bound parameter.
    let failed: Vec<(String, Option<String>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                              enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id)
         SELECT id, job, queue, priority, payload, 'failed', attempt, max_attempts, {note}, progress,
                enqueued_at, started_at, $3, host_id, concurrency_key, batch_id, parent_id
         FROM jobs WHERE id IN (SELECT value FROM json_each($1))
         RETURNING job, concurrency_key"
    )))
    .bind(&spent)
    .bind(iso(now))
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM jobs WHERE id IN (SELECT value FROM json_each($1))")
        .bind(&spent)
        .execute(&mut *conn)
        .await?;
    let requeued = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE jobs
         SET state = 'available', run_at = $3, errors = {note},
             lease_token = NULL, lease_secs = NULL, lease_expires_at = NULL, host_id = NULL
         WHERE id IN (SELECT value FROM json_each($1))"
    )))
    .bind(&requeue)
    .bind(iso(now))
    .bind(now)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    let mut slots = Slots::default();
    for (job, key) in &failed {
        slots.push(job, key.as_deref());
    }
    concurrency::release(conn, &slots, now).await?;
    Ok((requeued, failed.len() as u64))
}
