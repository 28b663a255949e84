//! The operator's view of jobs and commands on them, in SQLite: listings,
//! one job in full, the stats, retry and cancel. Commands run inside the
//! caller's `BEGIN IMMEDIATE` transaction.

use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::types::Json;
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::now_ms;
use super::{concurrency, time_of};
use crate::store::Cancel;
use crate::store::audit::Change;
use crate::store::driver::OperateDriver;
use crate::store::{Error, JobDetail, JobFilter, JobRow, JobState, Result, Slots, Stats};

/// The columns shared by listings of live, blocked and archived jobs.
const LIVE_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key, NULL AS output,
    json_extract(errors, '$[#-1].error') AS error, enqueued_at, started_at, NULL AS finished_at,
    priority, payload, max_attempts, errors, NULL AS log, progress, run_at, host_id, parent_id, batch_id";
const BLOCKED_COLUMNS: &str = "id, job, queue, 'blocked' AS state, attempt, concurrency_key, NULL AS output,
    json_extract(errors, '$[#-1].error') AS error, enqueued_at, started_at, NULL AS finished_at,
    priority, payload, max_attempts, errors, NULL AS log, progress, NULL AS run_at, NULL AS host_id, parent_id, batch_id";
const ARCHIVE_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key, output,
    json_extract(errors, '$[#-1].error') AS error, enqueued_at, started_at, finished_at,
    priority, payload, max_attempts, errors, log, progress, NULL AS run_at, host_id, parent_id, batch_id";

fn json_column(row: &SqliteRow, column: &str) -> Result<Option<serde_json::Value>> {
    Ok(row.try_get::<Option<Json<serde_json::Value>>, _>(column)?.map(|j| j.0))
}

fn row_of(row: &SqliteRow) -> Result<JobRow> {
    let state: String = row.try_get("state")?;
    Ok(JobRow {
        id: row.try_get("id")?,
        job: row.try_get("job")?,
        queue: row.try_get("queue")?,
        state: JobState::decode(&state)?,
        attempts: row.try_get("attempt")?,
        concurrency_key: row.try_get("concurrency_key")?,
        error: row.try_get("error")?,
        enqueued_at: time_of(row.try_get("enqueued_at")?),
        started_at: row.try_get::<Option<i64>, _>("started_at")?.map(time_of),
        finished_at: row.try_get::<Option<i64>, _>("finished_at")?.map(time_of),
    })
}

/// The columns a listing shows, from each table. Reading a column stored
/// after the payload walks the payload's overflow pages, so only the rows
/// listed pay for them.
const LIVE_LIST_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key,
    substr(json_extract(errors, '$[#-1].error'), 1, $ERROR_PREVIEW) AS error, enqueued_at, started_at,
    NULL AS finished_at";
const BLOCKED_LIST_COLUMNS: &str = "id, job, queue, 'blocked' AS state, attempt, concurrency_key,
    substr(json_extract(errors, '$[#-1].error'), 1, $ERROR_PREVIEW) AS error, enqueued_at, started_at,
    NULL AS finished_at";
const ARCHIVE_LIST_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key,
    substr(json_extract(errors, '$[#-1].error'), 1, $ERROR_PREVIEW) AS error, enqueued_at, started_at, finished_at";

/// Lists jobs newest first: the ids are picked first, from indexes and the
/// id order alone, and only the picked rows are read.
pub async fn list(pool: &SqlitePool, filter: &JobFilter) -> Result<Vec<JobRow>> {
    // A state lives in one table, and is picked through an index there (a
    // live state's partial index, or archive_state_queue), never from the
    // rows: a row's state is stored after its payload. The state is written
    // into the SQL, not bound, since only a literal matches a partial
    // index; `+id` keeps SQLite from walking the rows in id order instead.
    let all = Some(String::new());
    let only = |state: JobState| Some(format!("AND state = '{}'", state.as_str()));
    let (live, blocked, archived) = match filter.state {
        None => (all.clone(), all.clone(), all),
        Some(JobState::Blocked) => (None, all, None),
        Some(state @ (JobState::Scheduled | JobState::Available | JobState::Running)) => (only(state), None, None),
        Some(state) => (None, None, only(state)),
    };
    let order = if filter.state.is_some() { "+id" } else { "id" };
    // Each narrowing the filter asks for, numbered after the limit ($1).
    let texts = [("job", &filter.job), ("queue", &filter.queue), ("concurrency_key", &filter.concurrency_key)];
    let numbers = [
        ("batch_id =", filter.batch_id),
        ("enqueued_at >=", filter.enqueued_since.map(|t| t.timestamp_millis())),
        ("enqueued_at <", filter.enqueued_before.map(|t| t.timestamp_millis())),
        ("id <", filter.before_id),
    ];
    let mut narrowing = String::new();
    let mut parameters = 1;
    for (column, _) in texts.iter().filter(|(_, value)| value.is_some()) {
        parameters += 1;
        narrowing.push_str(&format!(" AND {column} = ${parameters}"));
    }
    for (comparison, _) in numbers.iter().filter(|(_, value)| value.is_some()) {
        parameters += 1;
        narrowing.push_str(&format!(" AND {comparison} ${parameters}"));
    }
    let picks: Vec<String> = [("jobs", live), ("blocked_jobs", blocked), ("archive", archived)]
        .into_iter()
        .filter_map(|(table, state)| {
            let state = state?;
            Some(format!(
                "SELECT * FROM (SELECT id FROM {table} WHERE TRUE {state}{narrowing} ORDER BY {order} DESC LIMIT $1)"
            ))
        })
        .collect();
    // Built from constants only; every value is a bound parameter.
    let sql = format!(
        "WITH picked AS ({} ORDER BY id DESC LIMIT $1)
         SELECT {LIVE_LIST_COLUMNS} FROM jobs WHERE id IN picked
         UNION ALL
         SELECT {BLOCKED_LIST_COLUMNS} FROM blocked_jobs WHERE id IN picked
         UNION ALL
         SELECT {ARCHIVE_LIST_COLUMNS} FROM archive WHERE id IN picked
         ORDER BY id DESC",
        picks.join(" UNION ALL ")
    )
    .replace("$ERROR_PREVIEW", &crate::store::job::ERROR_PREVIEW_CHARS.to_string());
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(filter.limit);
    for value in texts.into_iter().filter_map(|(_, value)| value.as_ref()) {
        query = query.bind(value);
    }
    for value in numbers.into_iter().filter_map(|(_, value)| value) {
        query = query.bind(value);
    }
    let rows = query.fetch_all(pool).await?;
    rows.iter().map(row_of).collect()
}

pub async fn get(pool: &SqlitePool, id: i64) -> Result<Option<JobDetail>> {
    // Built from constants only; every value is a bound parameter.
    let sql = format!(
        "SELECT {LIVE_COLUMNS} FROM jobs WHERE id = $1
         UNION ALL
         SELECT {BLOCKED_COLUMNS} FROM blocked_jobs WHERE id = $1
         UNION ALL
         SELECT {ARCHIVE_COLUMNS} FROM archive WHERE id = $1"
    );
    let Some(row) = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(pool).await? else {
        return Ok(None);
    };
    Ok(Some(JobDetail {
        row: row_of(&row)?,
        output: json_column(&row, "output")?,
        priority: row.try_get("priority")?,
        payload: json_column(&row, "payload")?.unwrap_or_default(),
        max_attempts: row.try_get("max_attempts")?,
        errors: json_column(&row, "errors")?.unwrap_or_default(),
        log: json_column(&row, "log")?,
        progress: json_column(&row, "progress")?,
        run_at: row.try_get::<Option<i64>, _>("run_at")?.map(time_of),
        host_id: row.try_get("host_id")?,
        parent_id: row.try_get("parent_id")?,
        batch_id: row.try_get("batch_id")?,
        workflow: None,
    }))
}

pub async fn stats(pool: &SqlitePool, now: i64) -> Result<Stats> {
    // Counts come from indexes, and never from a row's state: it is stored
    // after the payload, so reading it reads the whole payload. Each live
    // state is counted through its partial index (the queue is read from
    // the row's first page), the archive through archive_state_queue alone.
    let counts: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT 'scheduled', queue, count(*) FROM jobs WHERE state = 'scheduled' GROUP BY queue
         UNION ALL
         SELECT 'available', queue, count(*) FROM jobs WHERE state = 'available' GROUP BY queue
         UNION ALL
         SELECT 'running', queue, count(*) FROM jobs WHERE state = 'running' GROUP BY queue
         UNION ALL
         SELECT 'blocked', queue, count(*) FROM blocked_jobs GROUP BY queue
         UNION ALL
         SELECT state, queue, count(*) FROM archive GROUP BY 1, 2",
    )
    .fetch_all(pool)
    .await?;
    let oldest: Option<f64> =
        sqlx::query_scalar("SELECT ($1 - min(run_at)) / 1000.0 FROM jobs WHERE state = 'available'")
            .bind(now)
            .fetch_one(pool)
            .await?;
    let hosts: Vec<(String, f64, i64)> =
        sqlx::query_as("SELECT id, ($1 - last_seen_at) / 1000.0, heartbeat_ms FROM hosts ORDER BY id")
            .bind(now)
            .fetch_all(pool)
            .await?;
    let paused: Vec<String> = sqlx::query_scalar("SELECT name FROM queue_pauses ORDER BY name").fetch_all(pool).await?;
    Stats::from_counts(counts, oldest.map(|s| s.max(0.0)), hosts, paused)
}

pub async fn retry(conn: &mut SqliteConnection, id: i64, now: i64) -> Result<()> {
    // A scheduled job runs now, or a finished job that did not complete
    // comes back with a fresh budget; either way it passes the gate, as a
    // new enqueue would.
    let due = sqlx::query("UPDATE jobs SET run_at = $2 WHERE id = $1 AND state = 'scheduled'")
        .bind(id)
        .bind(now)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    let revived = if due > 0 {
        0
    } else {
        let revived = sqlx::query(
            "INSERT INTO jobs (id, job, queue, priority, payload, state, attempt, max_attempts, run_at,
                               enqueued_at, concurrency_key, batch_id, parent_id, errors, progress)
             SELECT id, job, queue, priority, payload, 'scheduled', 0, max_attempts, $2,
                    enqueued_at, concurrency_key, batch_id, parent_id, errors, progress
             FROM archive WHERE id = $1 AND state IN ('failed', 'discarded', 'cancelled')",
        )
        .bind(id)
        .bind(now)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if revived > 0 {
            // Its batch counts it pending again; from a batch that has
            // finished (a record of how it went), it leaves instead.
            let uncounted = sqlx::query(
                "UPDATE batches
                 SET completed = completed - (a.state = 'completed'), failed = failed - (a.state = 'failed'),
                     discarded = discarded - (a.state = 'discarded'), cancelled = cancelled - (a.state = 'cancelled')
                 FROM (SELECT batch_id, state FROM archive WHERE id = $1) a
                 WHERE batches.id = a.batch_id AND batches.finished_at IS NULL",
            )
            .bind(id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if uncounted == 0 {
                sqlx::query("UPDATE jobs SET batch_id = NULL WHERE id = $1").bind(id).execute(&mut *conn).await?;
            }
            sqlx::query("DELETE FROM archive WHERE id = $1").bind(id).execute(&mut *conn).await?;
            super::unique::reclaim(conn, id, now).await?;
        }
        revived
    };
    if due + revived == 0 {
        return Err(Error::not_applied(id, state_of(conn, id).await?, "retried"));
    }
    concurrency::admit(conn, &[id], true, now).await?;
    Ok(())
}

/// Cancels a waiting, available or blocked job; an available limited job
/// gives its slot back. Returns how many blocked jobs the freed slot
/// promoted, or `None` when the job is running and its cancel was requested.
pub async fn cancel(conn: &mut SqliteConnection, id: i64, now: i64) -> Result<Option<u64>> {
    let live: Option<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT state, job, concurrency_key FROM jobs WHERE id = $1 AND state IN ('scheduled', 'available')",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let table = if live.is_some() {
        "jobs"
    } else if sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM blocked_jobs WHERE id = $1)")
        .bind(id)
        .fetch_one(&mut *conn)
        .await?
    {
        "blocked_jobs"
    } else {
        // A running job: its host stops it and archives it (see Cancel::Requested).
        let requested = sqlx::query(
            "UPDATE jobs SET cancel_requested_at = coalesce(cancel_requested_at, $2)
             WHERE id = $1 AND state = 'running'",
        )
        .bind(id)
        .bind(now)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if requested == 1 {
            return Ok(None);
        }
        return Err(Error::not_applied(id, state_of(conn, id).await?, "cancelled"));
    };
    // Built from constants only; every value is a bound parameter.
    let sql = format!(
        "INSERT INTO archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                              enqueued_at, started_at, finished_at, concurrency_key, batch_id, parent_id)
         SELECT id, job, queue, priority, payload, 'cancelled', attempt, max_attempts, errors, progress,
                enqueued_at, started_at, $2, concurrency_key, batch_id, parent_id
         FROM {table} WHERE id = $1"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).bind(now).execute(&mut *conn).await?;
    let sql = format!("DELETE FROM {table} WHERE id = $1");
    sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).execute(&mut *conn).await?;
    let mut slots = Slots::default();
    if let Some((state, job, key)) = live
        && state == "available"
    {
        slots.push(&job, key.as_deref());
    }
    Ok(Some(concurrency::release(conn, &slots, now).await?))
}

/// The state a job is in, wherever it is; none when it is nowhere.
async fn state_of(conn: &mut SqliteConnection, id: i64) -> Result<Option<JobState>> {
    let state: Option<String> = sqlx::query_scalar(
        "SELECT state FROM jobs WHERE id = $1
         UNION ALL SELECT state FROM archive WHERE id = $1
         UNION ALL SELECT 'blocked' FROM blocked_jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    state.map(|state| JobState::decode(&state)).transpose()
}

#[async_trait]
impl OperateDriver for SqliteStore {
    async fn job_list(&self, filter: &JobFilter) -> Result<Vec<JobRow>> {
        list(&self.reader, filter).await
    }

    async fn job_get(&self, id: i64) -> Result<Option<JobDetail>> {
        get(&self.reader, id).await
    }

    async fn job_stats(&self) -> Result<Stats> {
        stats(&self.reader, now_ms()).await
    }

    async fn job_retry(&self, change: &Change<'_>, id: i64) -> Result<()> {
        self.write_with(async |tx| {
            retry(tx, id, now_ms()).await?;
            super::audit::record(tx, change, &()).await
        })
        .await?;
        self.announce(true);
        Ok(())
    }

    async fn job_cancel(&self, change: &Change<'_>, id: i64) -> Result<Cancel> {
        let promoted = self
            .write_with(async |tx| {
                let promoted = cancel(tx, id, now_ms()).await?;
                let done = if promoted.is_some() { Cancel::Cancelled } else { Cancel::Requested };
                super::audit::record(tx, change, &done).await?;
                Ok(promoted)
            })
            .await?;
        self.announce(promoted.is_some_and(|n| n > 0));
        Ok(if promoted.is_some() { Cancel::Cancelled } else { Cancel::Requested })
    }

    async fn queue_pause(&self, change: &Change<'_>, queue: &str) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| {
            let paused =
                sqlx::query("INSERT INTO queue_pauses (name, paused_at) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                    .bind(queue)
                    .bind(now_ms())
                    .execute(&mut **tx)
                    .await?;
            Ok(paused.rows_affected() == 1)
        })
        .await
    }

    async fn queue_resume(&self, change: &Change<'_>, queue: &str) -> Result<bool> {
        let resumed = self
            .audited_outside_jobs(change, async |tx| {
                let resumed =
                    sqlx::query("DELETE FROM queue_pauses WHERE name = $1").bind(queue).execute(&mut **tx).await?;
                Ok(resumed.rows_affected() == 1)
            })
            .await?;
        // Idle hosts wait for a wake-up; the queue's jobs are ready now.
        self.announce(true);
        Ok(resumed)
    }
}
