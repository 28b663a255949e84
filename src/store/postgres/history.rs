//! The fleet's history (0025_history.sql): the archive's minutes computed
//! in SQL, the live jobs' depth sampled, hosts' retries added, and the
//! minutes read back summed over queues and types.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};

use super::PgStore;
use crate::store::Result;
use crate::store::driver::HistoryDriver;
use crate::store::history::{BACKFILL, HistoryMinute, MINUTES_PER_PASS, RetryCount, SETTLE_MINUTES, with_retries};

/// Computes the archive's minutes from the mark on (at most
/// [`MINUTES_PER_PASS`]), samples the live jobs into the current minute
/// and deletes minutes older than `retention_secs`. One host at a time:
/// another holding the mark's row means this pass has nothing to do.
/// Returns the rows of minutes computed (a queue and type each).
async fn roll(pool: &PgPool, retention_secs: f64) -> Result<u64> {
    let mut tx = pool.begin().await?;
    // A database without a mark starts with the archive's last day.
    sqlx::query(
        "INSERT INTO jobhost.history_marks (name, upto)
         SELECT 'archive', date_trunc('minute', coalesce(min(finished_at), now()))
         FROM jobhost.archive WHERE finished_at >= now() - make_interval(secs => $1)
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(BACKFILL.num_seconds() as f64)
    .execute(&mut *tx)
    .await?;
    let Some(row) = sqlx::query(
        "SELECT upto, least(upto + make_interval(mins => $1), now()) AS until,
                date_trunc('minute', now()) - make_interval(mins => $2) AS settled
         FROM jobhost.history_marks WHERE name = 'archive' FOR UPDATE SKIP LOCKED",
    )
    .bind(MINUTES_PER_PASS as i32)
    .bind(SETTLE_MINUTES as i32)
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(0);
    };
    let (from, until, settled): (DateTime<Utc>, DateTime<Utc>, DateTime<Utc>) =
        (row.try_get("upto")?, row.try_get("until")?, row.try_get("settled")?);
    let mut computed = compute(&mut tx, from, until).await?;
    // Minutes behind the mark that a late commit added to (the archive's
    // deferred trigger flagged them), taken before they are computed
    // again: a flag committed after this statement stays for the next
    // pass, and one a committing writer holds makes this wait for it.
    let late: Vec<DateTime<Utc>> =
        sqlx::query_scalar("DELETE FROM jobhost.history_late WHERE minute < $1 RETURNING minute")
            .bind(from)
            .fetch_all(&mut *tx)
            .await?;
    for minute in late {
        computed += compute(&mut tx, minute, minute + chrono::Duration::minutes(1)).await?;
    }
    sqlx::query("UPDATE jobhost.history_marks SET upto = greatest(upto, least(date_trunc('minute', $1), $2)) WHERE name = 'archive'")
        .bind(until)
        .bind(settled)
        .execute(&mut *tx)
        .await?;
    sample_depth(&mut tx).await?;
    sqlx::query(
        "WITH old AS (DELETE FROM jobhost.history_retries WHERE minute < now() - make_interval(secs => $1))
         DELETE FROM jobhost.history WHERE minute < now() - make_interval(secs => $1)",
    )
    .bind(retention_secs)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(computed)
}

/// Computes the archive's minutes in `[from, until)` from its rows. Set,
/// not added: a minute computed again (a late result, a second pass) ends
/// with the same figures. A minute whose rows left the archive (a retried
/// job) is cleared first. Returns the rows of minutes computed.
async fn compute(tx: &mut sqlx::PgConnection, from: DateTime<Utc>, until: DateTime<Utc>) -> Result<u64> {
    sqlx::query(
        "UPDATE jobhost.history SET completed = 0, failed = 0, discarded = 0, cancelled = 0, runs = 0,
                run_p50_ms = NULL, run_p95_ms = NULL, run_max_ms = NULL,
                waits = 0, wait_p50_ms = NULL, wait_p95_ms = NULL
         WHERE minute >= $1 AND minute < $2",
    )
    .bind(from)
    .bind(until)
    .execute(&mut *tx)
    .await?;
    let computed = sqlx::query(
        "INSERT INTO jobhost.history AS h (minute, queue, job, completed, failed, discarded, cancelled,
                                           runs, run_p50_ms, run_p95_ms, run_max_ms, waits, wait_p50_ms, wait_p95_ms)
         SELECT date_trunc('minute', finished_at), queue, job,
                count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'failed'),
                count(*) FILTER (WHERE state = 'discarded'), count(*) FILTER (WHERE state = 'cancelled'),
                count(run_ms), percentile_cont(0.5) WITHIN GROUP (ORDER BY run_ms),
                percentile_cont(0.95) WITHIN GROUP (ORDER BY run_ms), max(run_ms),
                count(wait_ms), percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_ms),
                percentile_cont(0.95) WITHIN GROUP (ORDER BY wait_ms)
         FROM (SELECT finished_at, queue, job, state,
                      greatest(extract(epoch FROM finished_at - started_at) * 1000, 0)::float8 AS run_ms,
                      CASE WHEN attempt = 1
                           THEN greatest(extract(epoch FROM started_at - enqueued_at) * 1000, 0)::float8 END AS wait_ms
               FROM jobhost.archive WHERE finished_at >= $1 AND finished_at < $2) AS finished
         GROUP BY 1, 2, 3
         ORDER BY 1, 2, 3
         ON CONFLICT (minute, queue, job) DO UPDATE SET
             completed = excluded.completed, failed = excluded.failed, discarded = excluded.discarded,
             cancelled = excluded.cancelled, runs = excluded.runs, run_p50_ms = excluded.run_p50_ms,
             run_p95_ms = excluded.run_p95_ms, run_max_ms = excluded.run_max_ms, waits = excluded.waits,
             wait_p50_ms = excluded.wait_p50_ms, wait_p95_ms = excluded.wait_p95_ms",
    )
    .bind(from)
    .bind(until)
    .execute(&mut *tx)
    .await?;
    Ok(computed.rows_affected())
}

/// The live jobs of each queue and type now, as the current minute's
/// depth; a queue and type sampled earlier in the minute with none left
/// is set to zero.
async fn sample_depth(tx: &mut sqlx::PgConnection) -> Result<()> {
    sqlx::query(
        "WITH live AS (
             SELECT queue, job, count(*) FILTER (WHERE state = 'available') AS available,
                    0::bigint AS blocked, count(*) FILTER (WHERE state = 'scheduled') AS scheduled
             FROM jobhost.jobs GROUP BY 1, 2
             UNION ALL
             SELECT queue, job, 0, count(*), 0 FROM jobhost.blocked_jobs GROUP BY 1, 2),
         sums AS (
             SELECT queue, job, sum(available)::bigint AS available, sum(blocked)::bigint AS blocked,
                    sum(scheduled)::bigint AS scheduled
             FROM live GROUP BY 1, 2),
         emptied AS (
             UPDATE jobhost.history SET available = 0, blocked = 0, scheduled = 0
             WHERE minute = date_trunc('minute', now()) AND available IS NOT NULL
               AND (queue, job) NOT IN (SELECT queue, job FROM sums))
         INSERT INTO jobhost.history (minute, queue, job, available, blocked, scheduled)
         SELECT date_trunc('minute', now()), queue, job, available, blocked, scheduled FROM sums
         ORDER BY 2, 3
         ON CONFLICT (minute, queue, job) DO UPDATE SET
             available = excluded.available, blocked = excluded.blocked, scheduled = excluded.scheduled",
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// Adds a host's retried attempts to their minutes, in key order, so two
/// hosts wait for each other rather than deadlock; rows apart from the
/// computed ones, so neither waits for the computation.
async fn add_retries(pool: &PgPool, counts: &[RetryCount]) -> Result<()> {
    if counts.is_empty() {
        return Ok(());
    }
    let mut sorted: Vec<&RetryCount> = counts.iter().collect();
    sorted.sort_by(|a, b| (a.minute, &a.queue, &a.job).cmp(&(b.minute, &b.queue, &b.job)));
    sqlx::query(
        "INSERT INTO jobhost.history_retries (minute, queue, job, retried)
         SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::bigint[])
         ON CONFLICT (minute, queue, job) DO UPDATE SET retried = jobhost.history_retries.retried + excluded.retried",
    )
    .bind(sorted.iter().map(|c| c.minute).collect::<Vec<_>>())
    .bind(sorted.iter().map(|c| c.queue.clone()).collect::<Vec<_>>())
    .bind(sorted.iter().map(|c| c.job.clone()).collect::<Vec<_>>())
    .bind(sorted.iter().map(|c| c.retried).collect::<Vec<_>>())
    .execute(pool)
    .await?;
    Ok(())
}

/// The last `minutes` minutes, summed over queues (and types, unless
/// `job` names one), oldest first, with the database's time now.
async fn read(pool: &PgPool, minutes_back: i64, job: Option<&str>) -> Result<(DateTime<Utc>, Vec<HistoryMinute>)> {
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let rows = sqlx::query(
        "SELECT minute, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed,
                sum(discarded)::bigint AS discarded, sum(cancelled)::bigint AS cancelled,
                sum(runs)::bigint AS runs,
                sum(run_p50_ms * runs) / nullif(sum(runs) FILTER (WHERE run_p50_ms IS NOT NULL), 0) AS run_p50_ms,
                max(run_p95_ms) AS run_p95_ms, max(run_max_ms) AS run_max_ms, sum(waits)::bigint AS waits,
                sum(wait_p50_ms * waits) / nullif(sum(waits) FILTER (WHERE wait_p50_ms IS NOT NULL), 0) AS wait_p50_ms,
                max(wait_p95_ms) AS wait_p95_ms, sum(available)::bigint AS available,
                sum(blocked)::bigint AS blocked, sum(scheduled)::bigint AS scheduled
         FROM jobhost.history
         WHERE minute > $1::timestamptz - make_interval(mins => $2) AND ($3::text IS NULL OR job = $3)
         GROUP BY minute ORDER BY minute",
    )
    .bind(now)
    .bind(minutes_back as i32)
    .bind(job)
    .fetch_all(pool)
    .await?;
    let minutes = rows
        .iter()
        .map(|row| {
            Ok(HistoryMinute {
                minute: row.try_get("minute")?,
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
    let retries: Vec<(DateTime<Utc>, i64)> = sqlx::query_as(
        "SELECT minute, sum(retried)::bigint FROM jobhost.history_retries
         WHERE minute > $1::timestamptz - make_interval(mins => $2) AND ($3::text IS NULL OR job = $3)
         GROUP BY minute",
    )
    .bind(now)
    .bind(minutes_back as i32)
    .bind(job)
    .fetch_all(pool)
    .await?;
    Ok((now, with_retries(minutes, retries)))
}

#[async_trait]
impl HistoryDriver for PgStore {
    async fn history_roll(&self, retention_secs: f64) -> Result<u64> {
        roll(&self.sweeps, retention_secs).await
    }

    async fn history_add_retries(&self, counts: &[RetryCount]) -> Result<()> {
        add_retries(&self.pool, counts).await
    }

    async fn history_read(&self, minutes: i64, job: Option<&str>) -> Result<(DateTime<Utc>, Vec<HistoryMinute>)> {
        read(&self.pool, minutes, job).await
    }
}
