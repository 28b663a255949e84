//! Lease renewal and expiry in PostgreSQL.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::types::Json;

use super::PgStore;
use crate::store::driver::LeaseDriver;
use crate::store::lease::{Expired, StrayRow};
use crate::store::{LeaseRenew, LeaseRenewal, Result, RunId, StrayLease};

/// Sets the `started_at` of the current runs among `runs` to now and
/// confirms their leases. Locks: those jobs' rows.
pub async fn started(pool: &PgPool, runs: &[RunId]) -> Result<()> {
    if runs.is_empty() {
        return Ok(());
    }
    let (ids, tokens): (Vec<i64>, Vec<i64>) = runs.iter().map(|r| (r.job_id, r.lease_token)).unzip();
    sqlx::query(
        "UPDATE jobhost.jobs j SET started_at = now(), confirmed_token = j.lease_token
         FROM unnest($1::bigint[], $2::bigint[]) AS r(id, lease_token)
         WHERE j.id = r.id AND j.lease_token = r.lease_token AND j.state = 'running'",
    )
    .bind(&ids)
    .bind(&tokens)
    .execute(pool)
    .await?;
    Ok(())
}

/// Renews every running job of this host in one statement, confirming
/// those that started. Locks: the renewed rows, briefly, taken with `SKIP
/// LOCKED` so a renewal never waits behind another transaction (this
/// host's own result write stuck on a semaphore row, an operator's
/// statement); a skipped run is reported as neither renewed nor lost and
/// keeps its fence. Whether a run is lost is read from the statement's
/// snapshot, where a locked row is still visible. A second statement reads
/// the host's strays (a read; locks nothing).
pub async fn renew(pool: &PgPool, renew: &LeaseRenew<'_>) -> Result<LeaseRenewal> {
    let (ids, tokens): (Vec<i64>, Vec<i64>) = renew.runs.iter().map(|r| (r.job_id, r.lease_token)).unzip();
    let mut renewal = LeaseRenewal::default();
    if !renew.runs.is_empty() {
        let progress = renew.progress;
        let rows: Vec<(i64, i64, bool, bool, bool)> = sqlx::query_as(include_str!("sql/renew.sql"))
            .bind(renew.host_id)
            .bind(&ids)
            .bind(&tokens)
            .bind(progress.iter().map(|p| p.run.job_id).collect::<Vec<_>>())
            .bind(progress.iter().map(|p| p.run.lease_token).collect::<Vec<_>>())
            .bind(progress.iter().map(|p| Json(p.document())).collect::<Vec<_>>())
            .bind(renew.started.iter().map(|r| r.job_id).collect::<Vec<_>>())
            .fetch_all(pool)
            .await?;
        for (job_id, lease_token, renewed, cancel, ours) in rows {
            let run = RunId { job_id, lease_token };
            if cancel {
                renewal.cancelled.push(run);
            }
            if renewed {
                renewal.renewed.push(run);
            } else if !ours {
                renewal.lost.push(run);
            }
        }
    }
    let strays: Vec<StrayRow> = sqlx::query_as(
        "SELECT id, lease_token, attempt, concurrency_key, batch_id FROM jobhost.jobs
         WHERE host_id = $1 AND state = 'running' AND confirmed_token IS DISTINCT FROM lease_token
           AND (id, lease_token) NOT IN (SELECT * FROM unnest($2::bigint[], $3::bigint[]))",
    )
    .bind(renew.host_id)
    .bind(&ids)
    .bind(&tokens)
    .fetch_all(pool)
    .await?;
    renewal.strays = strays.into_iter().map(StrayLease::from).collect();
    Ok(renewal)
}

/// Rescues expired leases, of every job or only of `only`: see
/// jobhost.expire_leases (`functions/expire_leases.sql`), which locks in the order
/// every path that ends a job does and never waits while it holds a job
/// row. In a transaction of its own, rolled back before a failure returns
/// (see [`super::commit_or_roll_back`]).
pub async fn expire(pool: &PgPool, now: Option<DateTime<Utc>>, only: Option<&[i64]>) -> Result<Expired> {
    let mut tx = pool.begin().await?;
    let expired = sqlx::query_as::<_, (i32, i32, i32)>(
        "SELECT requeued, failed, held_back FROM jobhost.expire_leases(coalesce($1, now()), $2, 1000)",
    )
    .bind(now)
    .bind(only)
    .fetch_one(&mut *tx)
    .await
    .map_err(Into::into);
    let (requeued, failed, held_back) = super::commit_or_roll_back(tx, expired).await?;
    Ok(Expired { requeued: requeued as u64, failed: failed as u64, held_back: held_back as u64 })
}

/// Running jobs whose lease expired by `now`, soonest expired first.
pub async fn expired_ids(pool: &PgPool, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM jobhost.jobs WHERE state = 'running' AND lease_expires_at < coalesce($1, now())
         ORDER BY lease_expires_at LIMIT $2",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

#[async_trait]
impl LeaseDriver for PgStore {
    async fn lease_started(&self, runs: &[RunId]) -> Result<()> {
        started(&self.pool, runs).await
    }

    async fn lease_renew(&self, renew: &LeaseRenew<'_>) -> Result<LeaseRenewal> {
        self::renew(&self.pool, renew).await
    }

    async fn lease_expire(&self, now: Option<DateTime<Utc>>) -> Result<Expired> {
        Ok(expire(&self.sweeps, now, None).await?)
    }

    async fn lease_expired_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
        expired_ids(&self.pool, now, limit).await
    }

    async fn lease_expire_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<Expired> {
        Ok(expire(&self.sweeps, now, Some(ids)).await?)
    }
}
