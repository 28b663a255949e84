//! The operator's view of jobs and commands on them, in PostgreSQL:
//! listings, one job in full, the stats, retry and cancel.

use async_trait::async_trait;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Row};

use super::PgStore;
use super::notify_available;
use crate::store::audit::Change;
use crate::store::driver::OperateDriver;
use crate::store::{Cancel, Error, JobDetail, JobFilter, JobRow, JobState, Result, Stats};

/// The columns of one job in full, from each table.
const LIVE_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key, NULL::jsonb AS output,
    errors -> -1 ->> 'error' AS error, enqueued_at, started_at, NULL::timestamptz AS finished_at,
    priority, payload, max_attempts, errors, NULL::jsonb AS log, progress, run_at, host_id, parent_id, batch_id";
const BLOCKED_COLUMNS: &str = "id, job, queue, 'blocked' AS state, attempt, concurrency_key, NULL::jsonb AS output,
    errors -> -1 ->> 'error' AS error, enqueued_at, started_at, NULL::timestamptz AS finished_at,
    priority, payload, max_attempts, errors, NULL::jsonb AS log, progress, NULL::timestamptz AS run_at,
    NULL::text AS host_id, parent_id, batch_id";
const ARCHIVE_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key, output,
    errors -> -1 ->> 'error' AS error, enqueued_at, started_at, finished_at,
    priority, payload, max_attempts, errors, log, progress, NULL::timestamptz AS run_at, host_id, parent_id, batch_id";

/// The columns a listing shows (and filters on), from each table: never a
/// payload, an output or a log, and the last error cut to its preview, so
/// a page costs the same whatever the jobs hold.
const LIVE_LIST_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key,
    left(errors -> -1 ->> 'error', $10) AS error, enqueued_at, started_at, NULL::timestamptz AS finished_at, batch_id";
const BLOCKED_LIST_COLUMNS: &str = "id, job, queue, 'blocked' AS state, attempt, concurrency_key,
    left(errors -> -1 ->> 'error', $10) AS error, enqueued_at, started_at, NULL::timestamptz AS finished_at, batch_id";
const ARCHIVE_LIST_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key,
    left(errors -> -1 ->> 'error', $10) AS error, enqueued_at, started_at, finished_at, batch_id";

fn row_of(row: &sqlx::postgres::PgRow) -> Result<JobRow> {
    let state: String = row.try_get("state")?;
    Ok(JobRow {
        id: row.try_get("id")?,
        job: row.try_get("job")?,
        queue: row.try_get("queue")?,
        state: JobState::decode(&state)?,
        attempts: row.try_get("attempt")?,
        concurrency_key: row.try_get("concurrency_key")?,
        error: row.try_get("error")?,
        enqueued_at: row.try_get("enqueued_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
    })
}

pub async fn list(pool: &PgPool, filter: &JobFilter) -> Result<Vec<JobRow>> {
    let state = filter.state.map(JobState::as_str);
    // Built from constants only; every value is a bound parameter.
    let sql = format!(
        "SELECT * FROM (
             SELECT {LIVE_LIST_COLUMNS} FROM jobhost.jobs
             UNION ALL
             SELECT {BLOCKED_LIST_COLUMNS} FROM jobhost.blocked_jobs
             UNION ALL
             SELECT {ARCHIVE_LIST_COLUMNS} FROM jobhost.archive
         ) all_jobs
         WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR job = $2)
           AND ($4::bigint IS NULL OR batch_id = $4) AND ($5::text IS NULL OR queue = $5)
           AND ($6::text IS NULL OR concurrency_key = $6)
           AND ($7::timestamptz IS NULL OR enqueued_at >= $7) AND ($8::timestamptz IS NULL OR enqueued_at < $8)
           AND ($9::bigint IS NULL OR id < $9)
         ORDER BY id DESC LIMIT $3"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(state)
        .bind(&filter.job)
        .bind(filter.limit)
        .bind(filter.batch_id)
        .bind(&filter.queue)
        .bind(&filter.concurrency_key)
        .bind(filter.enqueued_since)
        .bind(filter.enqueued_before)
        .bind(filter.before_id)
        .bind(crate::store::job::ERROR_PREVIEW_CHARS as i32)
        .fetch_all(pool)
        .await?;
    rows.iter().map(row_of).collect()
}

pub async fn get(pool: &PgPool, id: i64) -> Result<Option<JobDetail>> {
    // Built from constants only; every value is a bound parameter.
    let sql = format!(
        "SELECT {LIVE_COLUMNS} FROM jobhost.jobs WHERE id = $1
         UNION ALL
         SELECT {BLOCKED_COLUMNS} FROM jobhost.blocked_jobs WHERE id = $1
         UNION ALL
         SELECT {ARCHIVE_COLUMNS} FROM jobhost.archive WHERE id = $1"
    );
    let Some(row) = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(pool).await? else {
        return Ok(None);
    };
    Ok(Some(JobDetail {
        row: row_of(&row)?,
        output: row.try_get::<Option<Json<serde_json::Value>>, _>("output")?.map(|j| j.0),
        priority: row.try_get("priority")?,
        payload: row.try_get::<Json<serde_json::Value>, _>("payload")?.0,
        max_attempts: row.try_get("max_attempts")?,
        errors: row.try_get::<Json<serde_json::Value>, _>("errors")?.0,
        log: row.try_get::<Option<Json<serde_json::Value>>, _>("log")?.map(|j| j.0),
        progress: row.try_get::<Option<Json<serde_json::Value>>, _>("progress")?.map(|j| j.0),
        run_at: row.try_get("run_at")?,
        host_id: row.try_get("host_id")?,
        parent_id: row.try_get("parent_id")?,
        batch_id: row.try_get("batch_id")?,
        workflow: None,
    }))
}

pub async fn stats(pool: &PgPool) -> Result<Stats> {
    let counts: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT state, queue, count(*) FROM jobhost.jobs GROUP BY 1, 2
         UNION ALL
         SELECT 'blocked', queue, count(*) FROM jobhost.blocked_jobs GROUP BY 1, 2
         UNION ALL
         SELECT state, queue, count(*) FROM jobhost.archive GROUP BY 1, 2",
    )
    .fetch_all(pool)
    .await?;
    let oldest: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - min(run_at))::float8 FROM jobhost.jobs WHERE state = 'available'",
    )
    .fetch_one(pool)
    .await?;
    let hosts: Vec<(String, f64, i64)> = sqlx::query_as(
        "SELECT id, extract(epoch FROM now() - last_seen_at)::float8, heartbeat_ms::bigint FROM jobhost.hosts ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    let paused: Vec<String> =
        sqlx::query_scalar("SELECT name FROM jobhost.queue_pauses ORDER BY name").fetch_all(pool).await?;
    Stats::from_counts(counts, oldest, hosts, paused)
}

pub async fn retry(pool: &PgPool, change: &Change<'_>, id: i64) -> Result<()> {
    let mut tx = pool.begin().await?;
    // A scheduled job runs now, or a finished job that did not complete
    // comes back with a fresh budget; either way it passes the gate, as a
    // new enqueue would. Locks: that row.
    let due = sqlx::query("UPDATE jobhost.jobs SET run_at = now() WHERE id = $1 AND state = 'scheduled'")
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let ended: Option<(Option<i64>, String)> = if due > 0 {
        None
    } else {
        sqlx::query_as("SELECT batch_id, state FROM jobhost.archive WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
    };
    let revived = if due > 0 {
        0
    } else {
        sqlx::query(
            "WITH revived AS (
                 DELETE FROM jobhost.archive WHERE id = $1 AND state IN ('failed', 'discarded', 'cancelled')
                 RETURNING *)
             INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, attempt, max_attempts, run_at,
                                       enqueued_at, concurrency_key, batch_id, parent_id, errors, progress)
             SELECT id, job, queue, priority, payload, 'scheduled', 0, max_attempts, now(),
                    enqueued_at, concurrency_key, batch_id, parent_id, errors, progress
             FROM revived",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
    };
    if due + revived == 0 {
        return Err(Error::not_applied(id, state_of(&mut tx, id).await?, "retried"));
    }
    if revived > 0 {
        sqlx::query("SELECT jobhost.reclaim_unique($1)").bind(id).execute(&mut *tx).await?;
    }
    // The key's semaphore before the batch's row, as every path that ends
    // or admits a job takes them.
    sqlx::query("SELECT jobhost.lock_for_ending($1)").bind([id]).execute(&mut *tx).await?;
    // Before the gate, which may block or discard the job: its batch counts
    // it pending again, or it leaves a batch that has finished, so whatever
    // the gate does with it is counted (or not) by the batch it now has.
    if let Some((Some(batch), state)) = &ended {
        sqlx::query("SELECT jobhost.batch_retry_member($1, $2, $3)")
            .bind(id)
            .bind(batch)
            .bind(state)
            .execute(&mut *tx)
            .await?;
    }
    super::concurrency::admit(&mut tx, &[id]).await?;
    super::notify_available(&mut tx).await?;
    super::audit::record(&mut tx, change, &()).await?;
    tx.commit().await?;
    Ok(())
}

pub async fn cancel(pool: &PgPool, change: &Change<'_>, id: i64) -> Result<Cancel> {
    let mut tx = pool.begin().await?;
    // A waiting or available job, or a blocked one, goes to the archive; an
    // available limited job gives its slot back in the same transaction.
    // Locks, in the order every path that ends a job takes them: the job's
    // row, its key's semaphore, its batch's row.
    sqlx::query("SELECT jobhost.lock_for_ending($1)").bind([id]).execute(&mut *tx).await?;
    let cancelled: Option<(String, Option<String>)> =
        sqlx::query_as(include_str!("sql/cancel.sql")).bind(id).fetch_optional(&mut *tx).await?;
    let Some((job, key)) = cancelled else {
        // A running job: its host stops it and archives it (see Cancel::Requested).
        let requested = sqlx::query(
            "UPDATE jobhost.jobs SET cancel_requested_at = coalesce(cancel_requested_at, now())
             WHERE id = $1 AND state = 'running'",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if requested == 1 {
            super::audit::record(&mut tx, change, &Cancel::Requested).await?;
            tx.commit().await?;
            return Ok(Cancel::Requested);
        }
        return Err(Error::not_applied(id, state_of(&mut tx, id).await?, "cancelled"));
    };
    let mut slots = crate::store::Slots::default();
    slots.push(&job, key.as_deref());
    super::concurrency::release(&mut tx, &slots).await?;
    super::audit::record(&mut tx, change, &Cancel::Cancelled).await?;
    tx.commit().await?;
    Ok(Cancel::Cancelled)
}

/// The state a job is in, wherever it is; none when it is nowhere.
async fn state_of(conn: &mut PgConnection, id: i64) -> Result<Option<JobState>> {
    let state: Option<(String,)> = sqlx::query_as(
        "SELECT state FROM jobhost.jobs WHERE id = $1
         UNION ALL SELECT state FROM jobhost.archive WHERE id = $1
         UNION ALL SELECT 'blocked' FROM jobhost.blocked_jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    state.map(|(state,)| JobState::decode(&state)).transpose()
}

#[async_trait]
impl OperateDriver for PgStore {
    async fn job_list(&self, filter: &JobFilter) -> Result<Vec<JobRow>> {
        list(&self.pool, filter).await
    }

    async fn job_get(&self, id: i64) -> Result<Option<JobDetail>> {
        get(&self.pool, id).await
    }

    async fn job_stats(&self) -> Result<Stats> {
        stats(&self.pool).await
    }

    async fn job_retry(&self, change: &Change<'_>, id: i64) -> Result<()> {
        retry(&self.pool, change, id).await
    }

    async fn job_cancel(&self, change: &Change<'_>, id: i64) -> Result<Cancel> {
        cancel(&self.pool, change, id).await
    }

    async fn queue_pause(&self, change: &Change<'_>, queue: &str) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| {
            let paused = sqlx::query("INSERT INTO jobhost.queue_pauses (name) VALUES ($1) ON CONFLICT DO NOTHING")
                .bind(queue)
                .execute(conn)
                .await?;
            Ok(paused.rows_affected() == 1)
        })
        .await
    }

    async fn queue_resume(&self, change: &Change<'_>, queue: &str) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| {
            let resumed =
                sqlx::query("DELETE FROM jobhost.queue_pauses WHERE name = $1").bind(queue).execute(&mut *conn).await?;
            // Idle hosts wait for a notification; the queue's jobs are ready now.
            notify_available(conn).await?;
            Ok(resumed.rows_affected() == 1)
        })
        .await
    }
}
