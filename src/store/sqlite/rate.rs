//! Rate limits in SQLite: a fetch's turn for each key it would lease from,
//! decided by [`crate::store::rate::turn`] under the file's write lock, so
//! no other fetch can start a run of the key meanwhile (see
//! migrations/sqlite/0018_rate_limits.sql).

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::{SqliteStore, concurrency, json_list, now_ms, time_of};
use crate::store::driver::RateDriver;
use crate::store::rate::{KeyWindow, Limit, MAX_LISTED_KEYS, RateKeyStatus, RateTotals, turn};
use crate::store::{FetchParams, PreparedJob, Result, RunId, Slots};
use crate::types::RateLimitConfig;

/// When each of `jobs` may start by its key's plan (`store::rate::plan`):
/// `None` for a job without a rate limit or not due at once (a delay, a
/// time to run at), which the fetch counts when it comes due. The keys'
/// planned times are updated under the write lock.
pub async fn plan(conn: &mut SqliteConnection, jobs: &[&PreparedJob], now: i64) -> Result<Vec<Option<i64>>> {
    let keys = crate::store::rate::to_plan(jobs);
    let mut planned = vec![None; jobs.len()];
    for ((job, key), (limit, positions)) in keys {
        let latest: Option<String> = sqlx::query_scalar("SELECT planned FROM rate_keys WHERE job = $1 AND key = $2")
            .bind(job)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
        let latest: Vec<i64> = latest.and_then(|text| serde_json::from_str(&text).ok()).unwrap_or_default();
        let (times, latest) = crate::store::rate::plan(&latest, limit, positions.len(), now);
        sqlx::query(
            "INSERT INTO rate_keys (job, key, planned, updated_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (job, key) DO UPDATE SET planned = excluded.planned, updated_at = excluded.updated_at",
        )
        .bind(job)
        .bind(key)
        .bind(json_list(&latest))
        .bind(now)
        .execute(&mut *conn)
        .await?;
        for (position, time) in positions.into_iter().zip(times) {
            planned[position] = Some(time);
        }
    }
    Ok(planned)
}

/// Whether any of these job types has its starts counted now: it declares a
/// rate limit, or one of its keys is throttled.
pub async fn governed(conn: &mut SqliteConnection, job_types: &[String], now: i64) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM job_types
                        WHERE name IN (SELECT value FROM json_each($1)) AND json_type(config, '$.rate_limit') = 'object')
             OR EXISTS (SELECT 1 FROM rate_keys
                        WHERE job IN (SELECT value FROM json_each($1)) AND throttled_until > $2)",
    )
    .bind(json_list(job_types))
    .bind(now)
    .fetch_one(conn)
    .await?)
}

/// A picked job, as its key is rendered.
struct Candidate {
    id: i64,
    job: String,
    concurrency_key: Option<String>,
    key: String,
    limit: Option<Limit>,
}

/// Of the jobs this fetch would pick, records the starts of those whose key
/// has room and sends the others back to wait (scheduled for when a start
/// frees up, their attempt untouched, their slots given back). Returns the
/// ids that may be leased, and how many were sent back.
pub async fn admit(conn: &mut SqliteConnection, params: &FetchParams, now: i64) -> Result<(Vec<i64>, u64)> {
    let rows = sqlx::query(include_str!("sql/rate_candidates.sql"))
        .bind(json_list(&params.job_types))
        .bind(json_list(&params.queues))
        .bind(params.limit)
        .fetch_all(&mut *conn)
        .await?;
    let mut candidates = Vec::with_capacity(rows.len());
    for row in &rows {
        let job: String = row.try_get("job")?;
        let concurrency_key: Option<String> = row.try_get("concurrency_key")?;
        let declared: Option<String> = row.try_get("rate_limit")?;
        let key = rate_key(&job, row.try_get("payload")?, concurrency_key.clone(), declared.as_deref());
        let limit = declared
            .and_then(|text| serde_json::from_str::<RateLimitConfig>(&text).ok())
            .map(|rate| Limit { limit: rate.limit, period_ms: rate.period_ms as i64 });
        candidates.push(Candidate { id: row.try_get("id")?, job, concurrency_key, key, limit });
    }

    let mut keys: BTreeMap<(&str, &str), Vec<&Candidate>> = BTreeMap::new();
    for candidate in &candidates {
        keys.entry((&candidate.job, &candidate.key)).or_default().push(candidate);
    }
    let mut sent_back = Vec::new();
    for ((job, key), picked) in keys {
        let window = window_of(conn, job, key).await?;
        let limit = picked[0].limit;
        if limit.is_none() && window.throttled_until.is_none_or(|until| until <= now) {
            continue;
        }
        let turn = turn(&window, limit, picked.len(), now);
        sqlx::query(
            "INSERT INTO rate_keys (job, key, starts, throttled_until, deferred, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (job, key) DO UPDATE
             SET starts = excluded.starts, throttled_until = excluded.throttled_until,
                 deferred = deferred + excluded.deferred, updated_at = excluded.updated_at",
        )
        .bind(job)
        .bind(key)
        .bind(json_list(&turn.starts))
        .bind(window.throttled_until.filter(|until| *until > now))
        .bind(turn.wait_until.len() as i64)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        for (candidate, until) in picked[turn.started..].iter().zip(turn.wait_until) {
            sent_back.push((*candidate, until));
        }
    }

    let mut slots = Slots::default();
    for (candidate, until) in &sent_back {
        sqlx::query("UPDATE jobs SET state = 'scheduled', run_at = $2 WHERE id = $1")
            .bind(candidate.id)
            .bind(until)
            .execute(&mut *conn)
            .await?;
        slots.push(&candidate.job, candidate.concurrency_key.as_deref());
    }
    if !slots.is_empty() {
        concurrency::release(conn, &slots, now).await?;
    }
    let waiting: Vec<i64> = sent_back.iter().map(|(c, _)| c.id).collect();
    let leasable = candidates.iter().map(|c| c.id).filter(|id| !waiting.contains(id)).collect();
    Ok((leasable, waiting.len() as u64))
}

/// A key's stored window, empty when it has none.
async fn window_of(conn: &mut SqliteConnection, job: &str, key: &str) -> Result<KeyWindow> {
    let row: Option<(String, Option<i64>)> =
        sqlx::query_as("SELECT starts, throttled_until FROM rate_keys WHERE job = $1 AND key = $2")
            .bind(job)
            .bind(key)
            .fetch_optional(conn)
            .await?;
    Ok(row.map_or_else(KeyWindow::default, |(starts, throttled_until)| KeyWindow {
        starts: serde_json::from_str(&starts).unwrap_or_default(),
        throttled_until,
    }))
}

/// Holds the key of `run`'s job until `delay_ms` after `now`, never
/// shortening a throttle already set; false when `run` no longer holds its
/// lease (see jobhost.rate_throttle in the PostgreSQL schema).
pub async fn throttle(conn: &mut SqliteConnection, run: RunId, delay_ms: i64, now: i64) -> Result<bool> {
    let row: Option<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT j.job, j.payload, j.concurrency_key, t.config -> '$.rate_limit'
         FROM jobs j JOIN job_types t ON t.name = j.job
         WHERE j.id = $1 AND j.lease_token = $2 AND j.state = 'running'",
    )
    .bind(run.job_id)
    .bind(run.lease_token)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((job, payload, concurrency_key, declared)) = row else {
        return Ok(false);
    };
    let key = rate_key(&job, &payload, concurrency_key, declared.as_deref());
    sqlx::query(
        "INSERT INTO rate_keys (job, key, throttled_until, throttles, updated_at) VALUES ($1, $2, $3, 1, $4)
         ON CONFLICT (job, key) DO UPDATE
         SET throttled_until = max(coalesce(throttled_until, 0), excluded.throttled_until),
             throttles = throttles + 1, updated_at = excluded.updated_at",
    )
    .bind(&job)
    .bind(&key)
    .bind(now.saturating_add(delay_ms))
    .bind(now)
    .execute(conn)
    .await?;
    Ok(true)
}

/// The key a job's starts are counted under: its rate key when its type
/// declares a rate limit (`declared`, the stored JSON), else its concurrency
/// key, else its type. A payload that does not render the template (an
/// enqueue that did not check it) counts with the type as a whole.
fn rate_key(job: &str, payload: &str, concurrency_key: Option<String>, declared: Option<&str>) -> String {
    match declared.and_then(|text| serde_json::from_str::<RateLimitConfig>(text).ok()) {
        Some(rate) => {
            let payload: serde_json::Value = serde_json::from_str(payload).unwrap_or_default();
            rate.key.render(&payload).unwrap_or_else(|_| job.to_string())
        }
        None => concurrency_key.unwrap_or_else(|| job.to_string()),
    }
}

type RateKeyRow = (String, String, String, Option<i64>, Option<String>, i64, i64);

/// Keys with starts in their window or a throttle in force, in (type, key)
/// order (see the PostgreSQL listing).
pub async fn list(pool: &SqlitePool, now: i64) -> Result<Vec<RateKeyStatus>> {
    let rows: Vec<RateKeyRow> = sqlx::query_as(
        "SELECT r.job, r.key, r.starts, r.throttled_until, t.config -> '$.rate_limit', r.deferred, r.throttles
         FROM rate_keys r LEFT JOIN job_types t ON t.name = r.job
         WHERE r.throttled_until > $1
            OR EXISTS (SELECT 1 FROM json_each(r.starts) s
                       WHERE s.value > $1 - coalesce(t.config ->> '$.rate_limit.period_ms', 0))
         ORDER BY r.job, r.key
         LIMIT $2",
    )
    .bind(now)
    .bind(MAX_LISTED_KEYS)
    .fetch_all(pool)
    .await?;
    let mut keys = Vec::new();
    for (job, key, starts, throttled_until, declared, sent_back, throttles) in rows {
        let declared = declared.and_then(|text| serde_json::from_str::<RateLimitConfig>(&text).ok());
        let period_ms = declared.as_ref().map(|rate| rate.period_ms as i64);
        let starts: Vec<i64> = serde_json::from_str(&starts).unwrap_or_default();
        let starts_in_window = starts.iter().filter(|s| period_ms.is_some_and(|p| **s > now - p)).count() as i64;
        let throttled_until = throttled_until.filter(|until| *until > now);
        keys.push(RateKeyStatus {
            job,
            key,
            limit: declared.as_ref().map(|rate| i64::from(rate.limit)),
            period_ms,
            starts_in_window,
            throttled_until: throttled_until.map(time_of),
            throttled_secs: throttled_until.map(|until| (until - now) as f64 / 1000.0),
            sent_back,
            throttles,
        });
    }
    Ok(keys)
}

/// Each type's sends-back and throttles, summed over its keys.
pub async fn totals(pool: &SqlitePool) -> Result<Vec<RateTotals>> {
    Ok(sqlx::query_as(
        "SELECT job, sum(deferred) AS sent_back, sum(throttles) AS throttles FROM rate_keys GROUP BY job ORDER BY job",
    )
    .fetch_all(pool)
    .await?)
}

#[async_trait]
impl RateDriver for SqliteStore {
    async fn rate_throttle(&self, run: RunId, delay_ms: u64) -> Result<bool> {
        let delay_ms = i64::try_from(delay_ms).unwrap_or(i64::MAX);
        self.write_with(async |tx| throttle(tx, run, delay_ms, now_ms()).await).await
    }

    async fn rate_key_list(&self) -> Result<Vec<RateKeyStatus>> {
        list(&self.reader, now_ms()).await
    }

    async fn rate_totals(&self) -> Result<Vec<RateTotals>> {
        totals(&self.reader).await
    }
}
