//! The fleet's history in SQLite (0019_history.sql): the archive's minutes
//! are read outside the write lock and computed by
//! [`crate::store::history`], then written with the live jobs' depth under
//! it; as on PostgreSQL, a minute computed again ends with the same figures.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::{SqliteStore, now_ms, time_of};
use crate::store::Result;
use crate::store::driver::HistoryDriver;
use crate::store::history::{
    ArchivedJob, BACKFILL, HistoryMinute, MINUTES_PER_PASS, RetryCount, SETTLE_MINUTES, archived_minutes, percentile,
    with_retries,
};

const MINUTE_MS: i64 = 60_000;

/// Where the archive's computation stands: the first minute not final.
async fn mark(pool: &SqlitePool, now: i64) -> Result<i64> {
    let upto: Option<i64> =
        sqlx::query_scalar("SELECT upto FROM history_marks WHERE name = 'archive'").fetch_optional(pool).await?;
    if let Some(upto) = upto {
        return Ok(upto);
    }
    let oldest: Option<i64> = sqlx::query_scalar("SELECT min(finished_at) FROM archive WHERE finished_at >= $1")
        .bind(now - BACKFILL.num_milliseconds())
        .fetch_one(pool)
        .await?;
    let start = oldest.unwrap_or(now);
    Ok(start - start.rem_euclid(MINUTE_MS))
}

/// The archive rows that finished in `[from, until)`.
async fn finished(pool: &SqlitePool, from: i64, until: i64) -> Result<Vec<ArchivedJob>> {
    let rows = sqlx::query(
        "SELECT finished_at, queue, job, state,
                CASE WHEN started_at IS NOT NULL THEN max(finished_at - started_at, 0) END AS run_ms,
                CASE WHEN attempt = 1 AND started_at IS NOT NULL THEN max(started_at - enqueued_at, 0) END AS wait_ms
         FROM archive WHERE finished_at >= $1 AND finished_at < $2",
    )
    .bind(from)
    .bind(until)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(ArchivedJob {
                finished_at: time_of(row.try_get("finished_at")?),
                queue: row.try_get("queue")?,
                job: row.try_get("job")?,
                state: row.try_get("state")?,
                run_ms: row.try_get::<Option<i64>, _>("run_ms")?.map(|ms| ms as f64),
                wait_ms: row.try_get::<Option<i64>, _>("wait_ms")?.map(|ms| ms as f64),
            })
        })
        .collect()
}

/// Computes the archive's minutes from the mark on, samples the live jobs
/// and prunes, as the PostgreSQL backend does.
async fn roll(store: &SqliteStore, retention_secs: f64) -> Result<u64> {
    let now = now_ms();
    let from = mark(&store.reader, now).await?;
    let until = (from + MINUTES_PER_PASS * MINUTE_MS).min(now);
    let settled = now - now.rem_euclid(MINUTE_MS) - SETTLE_MINUTES * MINUTE_MS;
    let minutes = archived_minutes(finished(&store.reader, from, until).await?);
    store
        .write_outside_jobs(async |tx| {
            sqlx::query(
                "UPDATE history SET completed = 0, failed = 0, discarded = 0, cancelled = 0, runs = 0,
                        run_p50_ms = NULL, run_p95_ms = NULL, run_max_ms = NULL,
                        waits = 0, wait_p50_ms = NULL, wait_p95_ms = NULL
                 WHERE minute >= $1 AND minute < $2",
            )
            .bind(from)
            .bind(until)
            .execute(&mut **tx)
            .await?;
            for minute in &minutes {
                let [completed, failed, discarded, cancelled] = minute.ended;
                sqlx::query(
                    "INSERT INTO history (minute, queue, job, completed, failed, discarded, cancelled, runs,
                                          run_p50_ms, run_p95_ms, run_max_ms, waits, wait_p50_ms, wait_p95_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
                     ON CONFLICT (minute, queue, job) DO UPDATE SET
                         completed = excluded.completed, failed = excluded.failed, discarded = excluded.discarded,
                         cancelled = excluded.cancelled, runs = excluded.runs, run_p50_ms = excluded.run_p50_ms,
                         run_p95_ms = excluded.run_p95_ms, run_max_ms = excluded.run_max_ms, waits = excluded.waits,
                         wait_p50_ms = excluded.wait_p50_ms, wait_p95_ms = excluded.wait_p95_ms",
                )
                .bind(minute.minute.timestamp_millis())
                .bind(&minute.queue)
                .bind(&minute.job)
                .bind(completed)
                .bind(failed)
                .bind(discarded)
                .bind(cancelled)
                .bind(minute.run_ms.len() as i64)
                .bind(percentile(&minute.run_ms, 0.5))
                .bind(percentile(&minute.run_ms, 0.95))
                .bind(minute.run_ms.last().copied())
                .bind(minute.wait_ms.len() as i64)
                .bind(percentile(&minute.wait_ms, 0.5))
                .bind(percentile(&minute.wait_ms, 0.95))
                .execute(&mut **tx)
                .await?;
            }
            let upto = from.max((until - until.rem_euclid(MINUTE_MS)).min(settled));
            sqlx::query(
                "INSERT INTO history_marks (name, upto) VALUES ('archive', $1)
                 ON CONFLICT (name) DO UPDATE SET upto = max(upto, excluded.upto)",
            )
            .bind(upto)
            .execute(&mut **tx)
            .await?;
            sample_depth(tx, now - now.rem_euclid(MINUTE_MS)).await?;
            let oldest = now - (retention_secs * 1000.0) as i64;
            sqlx::query("DELETE FROM history WHERE minute < $1").bind(oldest).execute(&mut **tx).await?;
            sqlx::query("DELETE FROM history_retries WHERE minute < $1").bind(oldest).execute(&mut **tx).await?;
            Ok(minutes.len() as u64)
        })
        .await
}

/// The live jobs of each queue and type now, as `minute`'s depth (see the
/// PostgreSQL backend): the minute's samples are cleared, then set again
/// for the queues and types that have live jobs. Counted through the live
/// states' partial indexes.
async fn sample_depth(tx: &mut SqliteConnection, minute: i64) -> Result<()> {
    sqlx::query(
        "UPDATE history SET available = 0, blocked = 0, scheduled = 0 WHERE minute = $1 AND available IS NOT NULL",
    )
    .bind(minute)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO history (minute, queue, job, available, blocked, scheduled)
         SELECT $1, queue, job, sum(available), sum(blocked), sum(scheduled) FROM (
             SELECT queue, job, count(*) AS available, 0 AS blocked, 0 AS scheduled
             FROM jobs WHERE state = 'available' GROUP BY 1, 2
             UNION ALL
             SELECT queue, job, 0, 0, count(*) FROM jobs WHERE state = 'scheduled' GROUP BY 1, 2
             UNION ALL
             SELECT queue, job, 0, count(*), 0 FROM blocked_jobs GROUP BY 1, 2)
         WHERE true
         GROUP BY queue, job
         ON CONFLICT (minute, queue, job) DO UPDATE SET
             available = excluded.available, blocked = excluded.blocked, scheduled = excluded.scheduled",
    )
    .bind(minute)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Adds a host's retried attempts to their minutes.
async fn add_retries(store: &SqliteStore, counts: &[RetryCount]) -> Result<()> {
    if counts.is_empty() {
        return Ok(());
    }
    store
        .write_outside_jobs(async |tx| {
            for count in counts {
                sqlx::query(
                    "INSERT INTO history_retries (minute, queue, job, retried) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (minute, queue, job) DO UPDATE SET retried = retried + excluded.retried",
                )
                .bind(count.minute.timestamp_millis())
                .bind(&count.queue)
                .bind(&count.job)
                .bind(count.retried)
                .execute(&mut **tx)
                .await?;
            }
            Ok(())
        })
        .await
}

/// The last `minutes` minutes, summed over queues (and types, unless `job`
/// names one), oldest first, with this machine's time now.
async fn read(pool: &SqlitePool, minutes_back: i64, job: Option<&str>) -> Result<(DateTime<Utc>, Vec<HistoryMinute>)> {
    let now = now_ms();
    let rows = sqlx::query(
        "SELECT minute, sum(completed) AS completed, sum(failed) AS failed, sum(discarded) AS discarded,
                sum(cancelled) AS cancelled, sum(runs) AS runs,
                sum(run_p50_ms * runs) / nullif(sum(runs) FILTER (WHERE run_p50_ms IS NOT NULL), 0) AS run_p50_ms,
                max(run_p95_ms) AS run_p95_ms, max(run_max_ms) AS run_max_ms, sum(waits) AS waits,
                sum(wait_p50_ms * waits) / nullif(sum(waits) FILTER (WHERE wait_p50_ms IS NOT NULL), 0) AS wait_p50_ms,
                max(wait_p95_ms) AS wait_p95_ms, sum(available) AS available, sum(blocked) AS blocked,
                sum(scheduled) AS scheduled
         FROM history
         WHERE minute > $1 AND ($2 IS NULL OR job = $2)
         GROUP BY minute ORDER BY minute",
    )
    .bind(now - minutes_back * MINUTE_MS)
    .bind(job)
    .fetch_all(pool)
    .await?;
    let minutes = rows
        .iter()
        .map(|row| {
            Ok(HistoryMinute {
                minute: time_of(row.try_get("minute")?),
                completed: row.try_get("completed")?,
                failed: row.try_get("failed")?,
                discarded: row.try_get("discarded")?,
                cancelled: row.try_get("cancelled")?,
                retried: 0,
                runs: row.try_get("runs")?,
                run_p50_ms: row.try_get("run_p50_ms")?,
                run_p95_ms: row.try_get("run_p95_ms")?,
                run_max_ms: row.try_get("run_max_ms")?,
                waits: row.try_get("waits")?,
                wait_p50_ms: row.try_get("wait_p50_ms")?,
                wait_p95_ms: row.try_get("wait_p95_ms")?,
                available: row.try_get("available")?,
                blocked: row.try_get("blocked")?,
                scheduled: row.try_get("scheduled")?,
            })
        })
        .collect::<std::result::Result<Vec<_>, sqlx::Error>>()?;
    let retries: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT minute, sum(retried) FROM history_retries WHERE minute > $1 AND ($2 IS NULL OR job = $2) GROUP BY minute",
    )
    .bind(now - minutes_back * MINUTE_MS)
    .bind(job)
    .fetch_all(pool)
    .await?;
    let retries = retries.into_iter().map(|(minute, retried)| (time_of(minute), retried)).collect();
    Ok((time_of(now), with_retries(minutes, retries)))
}

#[async_trait]
impl HistoryDriver for SqliteStore {
    async fn history_roll(&self, retention_secs: f64) -> Result<u64> {
        roll(self, retention_secs).await
    }

    async fn history_add_retries(&self, counts: &[RetryCount]) -> Result<()> {
        add_retries(self, counts).await
    }

    async fn history_read(&self, minutes: i64, job: Option<&str>) -> Result<(DateTime<Utc>, Vec<HistoryMinute>)> {
        read(&self.reader, minutes, job).await
    }
}
