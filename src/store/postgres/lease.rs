//! Lease renewal and expiry in PostgreSQL.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::store::Result;

pub async fn renew(pool: &PgPool, host_id: &str, leases: &[(i64, i64)]) -> Result<Vec<i64>> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, tokens): (Vec<i64>, Vec<i64>) = leases.iter().copied().unzip();
    // Every running job of this host in one statement. Locks: the renewed
    // rows, briefly; a job whose token changed is not renewed and so not returned.
    let renewed: Vec<(i64,)> = sqlx::query_as(
        "UPDATE jobhost.jobs j
         SET lease_expires_at = now() + j.lease_secs * interval '1 second'
         FROM unnest($2::bigint[], $3::bigint[]) AS l(id, lease_token)
         WHERE j.id = l.id AND j.lease_token = l.lease_token AND j.host_id = $1
         RETURNING j.id",
    )
    .bind(host_id)
    .bind(&ids)
    .bind(&tokens)
    .fetch_all(pool)
    .await?;
    Ok(renewed.into_iter().map(|(id,)| id).collect())
}

pub async fn expire(pool: &PgPool, now: Option<DateTime<Utc>>) -> Result<(u64, u64)> {
    let mut tx = pool.begin().await?;
    let (requeued, failed, jobs, keys): (i64, i64, Vec<String>, Vec<String>) =
        sqlx::query_as(include_str!("sql/expire.sql")).bind(now).fetch_one(&mut *tx).await?;
    let mut slots = crate::store::Slots::default();
    for (job, key) in jobs.iter().zip(&keys) {
        slots.push(job, Some(key));
    }
    super::concurrency::release(&mut tx, &slots).await?;
    if requeued > 0 {
        super::notify_available(&mut tx).await?;
        tracing::warn!(requeued, failed, "rescued jobs whose lease expired");
    }
    tx.commit().await?;
    Ok((requeued as u64, failed as u64))
}
