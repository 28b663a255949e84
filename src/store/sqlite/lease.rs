//! Lease renewal and expiry in SQLite, inside the caller's write transaction.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::concurrency;
use super::encode::{ms_or_now, now_ms};
use super::{iso, json_list};
use crate::store::Slots;
use crate::store::driver::LeaseDriver;
use crate::store::lease::Expired;
use crate::store::lease::{StrayRow, UNCONFIRMED_EXPIRIES_REFUNDED};
use crate::store::{LeaseRenew, LeaseRenewal, Result, RunId, StrayLease};

/// Sets the `started_at` of the current runs among `runs` to `now` (ms
/// since the epoch) and confirms their leases.
pub async fn started(conn: &mut SqliteConnection, runs: &[RunId], now: i64) -> Result<()> {
    let pairs: Vec<(i64, i64)> = runs.iter().map(|r| (r.job_id, r.lease_token)).collect();
    sqlx::query(
        "UPDATE jobs SET started_at = $2, confirmed_token = jobs.lease_token
         FROM json_each($1) l
         WHERE jobs.id = l.value ->> 0 AND jobs.lease_token = l.value ->> 1 AND jobs.state = 'running'",
    )
    .bind(json_list(&pairs))
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// Renews in the caller's write transaction, confirming the runs that
/// started. Writers take the file's lock one at a time, so no row is ever
/// locked by another writer here: a run is either renewed or no longer this
/// host's.
pub async fn renew(conn: &mut SqliteConnection, renew: &LeaseRenew<'_>, now: i64) -> Result<LeaseRenewal> {
    let reported: HashMap<RunId, serde_json::Value> = renew.progress.iter().map(|p| (p.run, p.document())).collect();
    let started: HashSet<&RunId> = renew.started.iter().collect();
    let runs: Vec<(i64, i64, Option<&serde_json::Value>, bool)> =
        renew.runs.iter().map(|r| (r.job_id, r.lease_token, reported.get(r), started.contains(r))).collect();
    let rows: Vec<(i64, i64, bool)> = sqlx::query_as(
        "UPDATE jobs SET lease_expires_at = $3 + jobs.lease_secs * 1000,
                         progress = CASE WHEN json_type(l.value, '$[2]') = 'object' THEN l.value -> 2
                                         ELSE jobs.progress END,
                         confirmed_token = iif(l.value ->> 3, jobs.lease_token, jobs.confirmed_token)
         FROM json_each($2) l
         WHERE jobs.id = l.value ->> 0 AND jobs.lease_token = l.value ->> 1 AND jobs.host_id = $1
         RETURNING jobs.id, jobs.lease_token, jobs.cancel_requested_at IS NOT NULL",
    )
    .bind(renew.host_id)
    .bind(json_list(&runs))
    .bind(now)
    .fetch_all(conn)
    .await?;
    let run = |(job_id, lease_token, _): &(i64, i64, bool)| RunId { job_id: *job_id, lease_token: *lease_token };
    let renewed: Vec<RunId> = rows.iter().map(run).collect();
    let cancelled = rows.iter().filter(|r| r.2).map(run).collect();
    // A set, so a host with a thousand runs does not compare a million pairs.
    let kept: HashSet<&RunId> = renewed.iter().collect();
    let lost = renew.runs.iter().filter(|r| !kept.contains(r)).copied().collect();
    Ok(LeaseRenewal { renewed, lost, cancelled, strays: Vec::new() })
}

/// The host's running jobs it did not ask about (`asked`) and never
/// confirmed. A read.
pub async fn strays(pool: &SqlitePool, host_id: &str, asked: &[RunId]) -> Result<Vec<StrayLease>> {
    let pairs: Vec<(i64, i64)> = asked.iter().map(|r| (r.job_id, r.lease_token)).collect();
    let rows: Vec<StrayRow> = sqlx::query_as(
        "SELECT id, lease_token, attempt, concurrency_key, batch_id FROM jobs
         WHERE host_id = $1 AND state = 'running' AND confirmed_token IS NOT lease_token
           AND NOT EXISTS (SELECT 1 FROM json_each($2) l
                           WHERE l.value ->> 0 = jobs.id AND l.value ->> 1 = jobs.lease_token)",
    )
    .bind(host_id)
    .bind(json_list(&pairs))
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(StrayLease::from).collect())
}

/// Whether the expiry of a running job's lease charges its attempt: its
/// host confirmed the run, or its unconfirmed expiries are used up.
fn charges() -> String {
    format!("(confirmed_token IS lease_token OR unconfirmed_expiries >= {UNCONFIRMED_EXPIRIES_REFUNDED})")
}

/// Rescues jobs whose host stopped renewing their lease: back to available
/// with a note of what happened, keeping their slot (the job is redelivered
/// and nothing else may run beside it), or to the archive as failed when the
/// attempt that expired was the last, giving the slot back (guarantee 10).
/// Returns (requeued, failed).
/// `only`, when given, limits the sweep to those jobs (maintenance isolating
/// a row it cannot process).
pub async fn expire(conn: &mut SqliteConnection, now: i64, only: Option<&[i64]>) -> Result<Expired> {
    // A job an operator asked to cancel is archived as cancelled, never
    // redelivered; one whose host never confirmed the run gets its attempt
    // back. Built from constants only; every value is a bound parameter.
    let charges = charges();
    let expired: Vec<(i64, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, cancel_requested_at IS NOT NULL OR ({charges} AND attempt >= max_attempts) FROM jobs
         WHERE state = 'running' AND lease_expires_at < $1
           AND ($2 IS NULL OR id IN (SELECT value FROM json_each($2)))
         ORDER BY lease_expires_at LIMIT 1000"
    )))
    .bind(now)
    .bind(only.map(json_list))
    .fetch_all(&mut *conn)
    .await?;
    let ids_where = |spent: bool| json_list(&expired.iter().filter(|e| e.1 == spent).map(|e| e.0).collect::<Vec<_>>());
    let (spent, requeue) = (ids_where(true), ids_where(false));
    let note = format!(
        "json_insert(errors, '$[#]', json_object('attempt', attempt, 'at', $2,
         'error', iif({charges},
                      'lease expired: host ' || host_id || ' stopped during the run, attempt '
                      || attempt || ' of ' || max_attempts,
                      'lease expired before host ' || host_id || ' started the run: attempt '
                      || attempt || ' given back')
                  || iif(cancel_requested_at IS NULL, '', '; cancelled by an operator while running')))"
    );
    // Built from constants only; every value is a bound parameter.
    let failed: Vec<(String, Option<String>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                              enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id)
         SELECT id, job, queue, priority, payload,
                CASE WHEN cancel_requested_at IS NULL THEN 'failed' ELSE 'cancelled' END,
                attempt, max_attempts, {note}, progress,
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
             attempt = attempt - NOT {charges}, unconfirmed_expiries = unconfirmed_expiries + NOT {charges},
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
    Ok(Expired { requeued, failed: failed.len() as u64, held_back: 0 })
}

/// Running jobs whose lease expired by `now`, soonest expired first.
pub async fn expired_ids(conn: &mut SqliteConnection, now: i64, limit: i64) -> Result<Vec<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM jobs WHERE state = 'running' AND lease_expires_at < $1 ORDER BY lease_expires_at LIMIT $2",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(conn)
    .await?)
}

#[async_trait]
impl LeaseDriver for SqliteStore {
    async fn lease_started(&self, runs: &[RunId]) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        self.write_with(async |tx| started(tx, runs, now_ms()).await).await
    }

    async fn lease_renew(&self, renew: &LeaseRenew<'_>) -> Result<LeaseRenewal> {
        let mut renewal = LeaseRenewal::default();
        if !renew.runs.is_empty() {
            let mut tx = self.write().await?;
            renewal = self::renew(&mut tx, renew, now_ms()).await?;
            tx.commit_outside_jobs().await?;
        }
        renewal.strays = strays(&self.reader, renew.host_id, renew.runs).await?;
        Ok(renewal)
    }

    async fn lease_expire(&self, now: Option<DateTime<Utc>>) -> Result<Expired> {
        let expired = self.write_with(async |tx| expire(tx, ms_or_now(now), None).await).await?;
        self.announce(expired.requeued > 0);
        Ok(expired)
    }

    async fn lease_expired_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
        let mut conn = self.reader.acquire().await?;
        expired_ids(&mut conn, ms_or_now(now), limit).await
    }

    async fn lease_expire_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<Expired> {
        let expired = self.write_with(async |tx| expire(tx, ms_or_now(now), Some(ids)).await).await?;
        self.announce(expired.requeued > 0);
        Ok(expired)
    }
}
