//! Per-key concurrency in PostgreSQL: the calls into the gate, release,
//! sweep and repair functions in `functions/` (`take_slot`,
//! `release_slots`, `promotable_keys`, `repair_semaphores`; 0004_concurrency.sql
//! and 0011_paged_sweeps.sql explain the locking), and the
//! operator's view of keys.

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool};

use super::PgStore;
use crate::store::concurrency::{BlockedKey, BlockedSweep, key_page_cut, key_page_read, key_page_start};
use crate::store::driver::SemaphoreDriver;
use crate::store::{Error, Holder, KeyCursor, KeyPage, KeyStatus, Result, SemaphoreFix, Slots};

/// The SQLSTATE with which the gate refuses a job whose type says `raise`.
const LIMIT_REACHED: &str = "JHL01";

/// Passes jobs just written to `jobhost.jobs` through the gate, in the
/// caller's transaction; an enqueuer is waiting, so `raise` is an error.
pub async fn admit(conn: &mut PgConnection, ids: &[i64]) -> Result<()> {
    sqlx::query("SELECT jobhost.admit($1, true)").bind(ids).execute(conn).await.map_err(limit_reached)?;
    Ok(())
}

/// Turns the gate's refusal into [`Error::LimitReached`].
pub fn limit_reached(error: sqlx::Error) -> Error {
    match &error {
        sqlx::Error::Database(db) if db.code().as_deref() == Some(LIMIT_REACHED) => {
            Error::LimitReached(db.message().to_string())
        }
        _ => Error::Database(error),
    }
}

/// Gives back freed slots and promotes blocked jobs into them, in the
/// caller's transaction (the one that ended the holders' hold).
pub async fn release(conn: &mut PgConnection, slots: &Slots) -> Result<()> {
    if slots.is_empty() {
        return Ok(());
    }
    let (jobs, keys): (Vec<&str>, Vec<&str>) = slots.iter().unzip();
    sqlx::query("SELECT jobhost.release_slots($1, $2)").bind(jobs).bind(keys).execute(conn).await?;
    Ok(())
}

#[async_trait::async_trait]
impl BlockedSweep for super::PgStore {
    async fn blocked_keys_page(&self, after: Option<&KeyCursor>, max_keys: i64) -> Result<KeyPage<Vec<BlockedKey>>> {
        let (after_job, after_key) = key_page_start(after);
        let keys: Vec<(String, String, bool)> =
            sqlx::query_as("SELECT job, key, promotable FROM jobhost.promotable_keys($1, $2, $3)")
                .bind(after_job)
                .bind(after_key)
                .bind(key_page_read(max_keys).min(i64::from(i32::MAX)) as i32)
                .fetch_all(&self.sweeps)
                .await?;
        let (keys, next) = key_page_cut(keys, max_keys, |(job, key, _)| (job.clone(), key.clone()));
        let done = keys.into_iter().map(|(job, key, promotable)| BlockedKey { job, key, promotable }).collect();
        Ok(KeyPage { done, next })
    }

    async fn promote_key(&self, job: &str, key: &str) -> Result<u64> {
        let moved: i32 = sqlx::query_scalar("SELECT jobhost.promote_parked($1, $2)")
            .bind(job)
            .bind(key)
            .fetch_one(&self.sweeps)
            .await?;
        Ok(moved as u64)
    }
}

pub async fn promote_blocked_of_types(conn: &mut PgConnection, job_types: &[String]) -> Result<u64> {
    if job_types.is_empty() {
        return Ok(0);
    }
    // Keys in order, as every multi-key transaction takes them.
    let promoted: Option<i64> = sqlx::query_scalar(
        "SELECT sum(jobhost.promote_parked(k.job, k.key))::bigint
         FROM (SELECT DISTINCT job, concurrency_key AS key FROM jobhost.blocked_jobs
               WHERE job = ANY($1) ORDER BY 1, 2) k",
    )
    .bind(job_types)
    .fetch_one(conn)
    .await?;
    Ok(promoted.unwrap_or(0) as u64)
}

pub async fn free_slots(pool: &PgPool, job: &str, key: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT jobhost.slot_limit($1)::bigint
                - coalesce((SELECT holders FROM jobhost.semaphores WHERE job = $1 AND key = $2), 0)",
    )
    .bind(job)
    .bind(key)
    .fetch_one(pool)
    .await?)
}

pub async fn repair(pool: &PgPool, after: Option<&KeyCursor>, max_keys: i64) -> Result<KeyPage<Vec<SemaphoreFix>>> {
    let (after_job, after_key) = key_page_start(after);
    let keys: Vec<(String, String)> = sqlx::query_as("SELECT job, key FROM jobhost.semaphore_page($1, $2, $3)")
        .bind(after_job)
        .bind(after_key)
        .bind(key_page_read(max_keys).min(i64::from(i32::MAX)) as i32)
        .fetch_all(pool)
        .await?;
    let (keys, next) = key_page_cut(keys, max_keys, Clone::clone);
    if keys.is_empty() {
        return Ok(KeyPage { done: Vec::new(), next });
    }
    let (jobs, keys): (Vec<String>, Vec<String>) = keys.into_iter().unzip();
    // Locks the page's semaphore rows, SKIP LOCKED, until this statement
    // commits: see `functions/repair_semaphores.sql`.
    let fixes: Vec<(String, String, i32, i32)> =
        sqlx::query_as("SELECT job, key, recorded, actual FROM jobhost.repair_semaphores($1::text[], $2::text[])")
            .bind(jobs)
            .bind(keys)
            .fetch_all(pool)
            .await?;
    Ok(KeyPage {
        done: fixes
            .into_iter()
            .map(|(job, key, recorded, actual)| SemaphoreFix { job, key, recorded, actual })
            .collect(),
        next,
    })
}

pub async fn status(pool: &PgPool) -> Result<Vec<KeyStatus>> {
    let rows: Vec<KeyRow> = sqlx::query_as(include_str!("sql/semaphore_list.sql")).fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(|r| KeyStatus {
            job: r.job,
            key: r.key,
            limit: r.limit,
            holders: r.holders,
            holding: r.holding.0,
            blocked: r.blocked,
            oldest_blocked_secs: r.oldest_blocked_secs,
        })
        .collect())
}

struct KeyRow {
    job: String,
    key: String,
    limit: Option<i32>,
    holders: i32,
    holding: sqlx::types::Json<Vec<Holder>>,
    blocked: i64,
    oldest_blocked_secs: Option<f64>,
}

from_row!(sqlx::postgres::PgRow, KeyRow { job, key, limit, holders, holding, blocked, oldest_blocked_secs });

#[async_trait]
impl SemaphoreDriver for PgStore {
    async fn semaphore_repair_page(
        &self,
        after: Option<&KeyCursor>,
        max_keys: i64,
    ) -> Result<KeyPage<Vec<SemaphoreFix>>> {
        repair(&self.sweeps, after, max_keys).await
    }

    async fn semaphore_list(&self) -> Result<Vec<KeyStatus>> {
        status(&self.pool).await
    }

    async fn semaphore_free_slots(&self, job: &str, key: &str) -> Result<i64> {
        free_slots(&self.pool, job, key).await
    }
}
