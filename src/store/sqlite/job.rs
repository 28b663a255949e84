//! Enqueue, fetch, finish and the operator's view of jobs, in SQLite.
//!
//! Every function taking a connection runs inside the caller's `BEGIN
//! IMMEDIATE` transaction, so it reads and writes with the write lock held.

use std::collections::HashSet;

use serde::Serialize;
use sqlx::sqlite::SqliteRow;
use sqlx::types::Json;
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::concurrency;
use super::host::job_types_get;
use super::{iso, json_list, time_of};
use crate::store::Slots;
use crate::store::job::{EnqueueLimits, PreparedJob, children_of_written, job_names, prepare_all};
use crate::store::{
    EnqueueParams, Error, FetchParams, FetchedJob, Finish, FinishOutcome, FinishResult, JobDetail, JobFilter, JobRow,
    JobState, Result, Stats,
};
use crate::types::JsonText;

/// One row of insert.sql's input.
#[derive(Serialize)]
struct NewJob<'a> {
    job: &'a str,
    queue: &'a str,
    priority: i16,
    payload: &'a serde_json::Value,
    state: &'static str,
    max_attempts: i32,
    run_at: i64,
    concurrency_key: Option<&'a str>,
    parent_id: Option<i64>,
}

/// Enqueues inside the caller's transaction: all or none.
pub async fn enqueue(
    conn: &mut SqliteConnection,
    jobs: &[EnqueueParams],
    limits: &EnqueueLimits,
    now: i64,
) -> Result<Vec<i64>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let configs = job_types_get(&mut *conn, &job_names(jobs)).await?;
    let prepared = prepare_all(jobs, &configs, limits)?;
    insert(conn, &prepared, now).await
}

/// One insert for the whole batch, then the gate for the limited jobs due
/// now; ids come back in input order (a blocked or discarded job keeps its id).
async fn insert(conn: &mut SqliteConnection, jobs: &[PreparedJob], now: i64) -> Result<Vec<i64>> {
    let rows: Vec<NewJob> = jobs
        .iter()
        .map(|j| {
            let due = j.run_at.map_or(now.saturating_add(j.delay_ms), |at| at.timestamp_millis());
            NewJob {
                job: &j.job,
                queue: &j.queue,
                priority: j.priority,
                payload: &j.payload,
                state: if due > now { "scheduled" } else { "available" },
                max_attempts: j.max_attempts,
                run_at: due.max(now),
                concurrency_key: j.concurrency_key.as_deref(),
                parent_id: j.parent_id,
            }
        })
        .collect();
    let mut inserted: Vec<(i64, bool)> =
        sqlx::query_as(include_str!("sql/insert.sql")).bind(json_list(&rows)).bind(now).fetch_all(&mut *conn).await?;
    // AUTOINCREMENT hands out ascending ids in insertion order, which is
    // input order; RETURNING's own order is unspecified.
    inserted.sort_unstable();
    if inserted.len() != jobs.len() {
        return Err(Error::InvalidEnqueue(format!("{} of {} jobs were inserted", inserted.len(), jobs.len())));
    }
    let gated: Vec<i64> = inserted.iter().filter(|(_, gated)| *gated).map(|(id, _)| *id).collect();
    if !gated.is_empty() {
        concurrency::admit(conn, &gated, true, now).await?;
    }
    Ok(inserted.into_iter().map(|(id, _)| id).collect())
}

/// Whether any job a fetch with `params` could take is available: a read
/// that needs no write lock.
pub async fn any_available(pool: &SqlitePool, params: &FetchParams) -> Result<bool> {
    if params.limit <= 0 || params.job_types.is_empty() || params.queues.is_empty() {
        return Ok(false);
    }
    let names: Vec<&str> = params.job_types.iter().map(|(name, _)| name.as_str()).collect();
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM jobs
                        WHERE state = 'available'
                          AND job IN (SELECT value FROM json_each($1))
                          AND queue IN (SELECT value FROM json_each($2)))",
    )
    .bind(json_list(&names))
    .bind(json_list(&params.queues))
    .fetch_one(pool)
    .await?)
}

/// Leases up to `params.limit` jobs to the fetching host (see sql/fetch.sql).
pub async fn fetch(conn: &mut SqliteConnection, params: &FetchParams, now: i64) -> Result<Vec<FetchedJob>> {
    if params.limit <= 0 || params.job_types.is_empty() || params.queues.is_empty() {
        return Ok(Vec::new());
    }
    // Reserves `limit` tokens; the ones no job takes are never used.
    let base: i64 =
        sqlx::query_scalar("UPDATE counters SET value = value + $1 WHERE name = 'lease_token' RETURNING value - $1")
            .bind(params.limit)
            .fetch_one(&mut *conn)
            .await?;
    let rows = sqlx::query(include_str!("sql/fetch.sql"))
        .bind(json_list(&params.job_types))
        .bind(json_list(&params.queues))
        .bind(params.limit)
        .bind(base)
        .bind(&params.host_id)
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
    let mut jobs = rows.iter().map(leased_job).collect::<Result<Vec<_>>>()?;
    jobs.sort_by_key(|j| j.lease_token);
    Ok(jobs)
}

fn leased_job(row: &SqliteRow) -> Result<FetchedJob> {
    Ok(FetchedJob {
        id: row.try_get("id")?,
        lease_token: row.try_get("lease_token")?,
        job: row.try_get("job")?,
        queue: row.try_get("queue")?,
        payload: row.try_get::<Json<serde_json::Value>, _>("payload")?.0,
        attempt: row.try_get("attempt")?,
        max_attempts: row.try_get("max_attempts")?,
        enqueued_at: time_of(row.try_get("enqueued_at")?),
        batch_id: row.try_get("batch_id")?,
        concurrency_key: row.try_get("concurrency_key")?,
        lease_secs: row.try_get("lease_secs")?,
    })
}

/// One row of finish_archive.sql's input.
#[derive(Serialize)]
struct Ending<'a> {
    id: i64,
    lease_token: i64,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a JsonText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<serde_json::Value>,
    log: &'a serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    progress: Option<&'a serde_json::Value>,
}

/// One row of finish_requeue.sql's input.
#[derive(Serialize)]
struct Requeue<'a> {
    id: i64,
    lease_token: i64,
    delay_ms: i64,
    refund: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    progress: Option<&'a serde_json::Value>,
}

/// What a batch of results did (see [`finish`]).
pub struct Finished {
    pub results: Vec<FinishResult>,
    pub any_available: bool,
    pub leased: Vec<FetchedJob>,
}

/// Writes a batch of results in the caller's transaction: the runs whose
/// lease still matches end or go back to wait, their slots are given back
/// and blocked jobs promoted into them, the children of completed runs are
/// enqueued (guarantee 9), and then, when `next` asks for any, jobs are
/// leased to the writing host. Parents whose children cannot be enqueued
/// must have been failed already
/// ([`crate::store::job::fail_parents_of_unfit_children`]).
pub async fn finish(
    conn: &mut SqliteConnection,
    finishes: &[Finish],
    next: Option<&FetchParams>,
    limits: &EnqueueLimits,
) -> Result<Finished> {
    let now = super::now_ms();
    let at = iso(now);
    let entry =
        |f: &Finish, error: &str| serde_json::json!({ "attempt": f.attempt, "at": at, "error": error, "log": f.log });
    let mut endings = Vec::new();
    let mut requeues = Vec::new();
    for f in finishes {
        let progress = f.progress.as_ref();
        let (delay_ms, refund, error) = match &f.outcome {
            FinishOutcome::Completed { output, .. } => {
                let output = output.as_ref();
                endings.push(Ending {
                    id: f.id,
                    lease_token: f.lease_token,
                    state: "completed",
                    output,
                    error: None,
                    log: &f.log,
                    progress,
                });
                continue;
            }
            FinishOutcome::Failed { error } => {
                let error = Some(entry(f, error));
                endings.push(Ending {
                    id: f.id,
                    lease_token: f.lease_token,
                    state: "failed",
                    output: None,
                    error,
                    log: &f.log,
                    progress,
                });
                continue;
            }
            FinishOutcome::Cancelled { reason } => {
                let error = Some(entry(f, reason));
                endings.push(Ending {
                    id: f.id,
                    lease_token: f.lease_token,
                    state: "cancelled",
                    output: None,
                    error,
                    log: &f.log,
                    progress,
                });
                continue;
            }
            FinishOutcome::Retry { error, delay_ms } => (*delay_ms, 0, Some(entry(f, error))),
            FinishOutcome::Snooze { delay_ms } => (*delay_ms, 1, None),
            FinishOutcome::Release { .. } => (0, 1, None),
        };
        let delay_ms = i64::try_from(delay_ms).unwrap_or(i64::MAX / 2);
        requeues.push(Requeue { id: f.id, lease_token: f.lease_token, delay_ms, refund, error, progress });
    }

    let mut written = HashSet::new();
    let mut freed = Slots::default();
    let mut any_available = false;
    if !endings.is_empty() {
        let ended: Vec<(i64, String, Option<String>)> = sqlx::query_as(include_str!("sql/finish_archive.sql"))
            .bind(json_list(&endings))
            .bind(now)
            .fetch_all(&mut *conn)
            .await?;
        let ids: Vec<i64> = ended.iter().map(|(id, _, _)| *id).collect();
        sqlx::query("DELETE FROM jobs WHERE id IN (SELECT value FROM json_each($1))")
            .bind(json_list(&ids))
            .execute(&mut *conn)
            .await?;
        for (id, job, key) in ended {
            written.insert(id);
            freed.push(&job, key.as_deref());
        }
    }
    if !requeues.is_empty() {
        let back: Vec<(i64, String, String, Option<String>)> = sqlx::query_as(include_str!("sql/finish_requeue.sql"))
            .bind(json_list(&requeues))
            .bind(now)
            .fetch_all(&mut *conn)
            .await?;
        for (id, state, job, key) in back {
            written.insert(id);
            // A job available again at once keeps its slot; one that waits gives it back.
            if state == "scheduled" {
                freed.push(&job, key.as_deref());
            } else {
                any_available = true;
            }
        }
    }
    let promoted = concurrency::release(conn, &freed, now).await?;
    let children = children_of_written(finishes, &written);
    let enqueued = enqueue(conn, &children, limits, now).await?;
    let leased = match next {
        Some(next) => fetch(conn, next, now).await?,
        None => Vec::new(),
    };
    let results = finishes
        .iter()
        .map(|f| if written.contains(&f.id) { FinishResult::Done } else { FinishResult::Duplicate })
        .collect();
    Ok(Finished { results, any_available: any_available || promoted > 0 || !enqueued.is_empty(), leased })
}

/// Scheduled jobs that have come due pass the gate. Returns (due, admitted).
/// Passes due scheduled jobs through the gate: every due job, or only those
/// of `only`. Returns (due, admitted).
pub async fn promote_due(conn: &mut SqliteConnection, now: i64, only: Option<&[i64]>) -> Result<(u64, u64)> {
    let due: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM jobs WHERE state = 'scheduled' AND run_at <= $1
           AND ($2 IS NULL OR id IN (SELECT value FROM json_each($2)))
         ORDER BY run_at LIMIT 5000",
    )
    .bind(now)
    .bind(only.map(super::json_list))
    .fetch_all(&mut *conn)
    .await?;
    if due.is_empty() {
        return Ok((0, 0));
    }
    let admitted = concurrency::admit(conn, &due, false, now).await?;
    Ok((due.len() as u64, admitted))
}

/// Scheduled jobs due by `now`, the longest due first.
pub async fn due_ids(conn: &mut SqliteConnection, now: i64, limit: i64) -> Result<Vec<i64>> {
    Ok(sqlx::query_scalar("SELECT id FROM jobs WHERE state = 'scheduled' AND run_at <= $1 ORDER BY run_at LIMIT $2")
        .bind(now)
        .bind(limit)
        .fetch_all(conn)
        .await?)
}

/// Moves a live job that maintenance cannot process to the archive as
/// failed with `reason` as its last error, touching nothing else (the
/// semaphore repair corrects a slot it held). When its errors cannot be
/// extended, they are replaced by the reason.
pub async fn quarantine(
    conn: &mut SqliteConnection,
    id: i64,
    reason: &str,
    keep_errors: bool,
    now: i64,
) -> Result<bool> {
    let moved = sqlx::query(
        "INSERT INTO archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors, progress,
                              enqueued_at, started_at, finished_at, host_id, concurrency_key, batch_id, parent_id)
         SELECT id, job, queue, priority, payload, 'failed', attempt, max_attempts,
                json_insert(CASE WHEN $3 THEN errors ELSE '[]' END, '$[#]',
                            json_object('attempt', attempt, 'at', $4, 'error', $2)),
                progress, enqueued_at, started_at, $5, host_id, concurrency_key, batch_id, parent_id
         FROM jobs WHERE id = $1",
    )
    .bind(id)
    .bind(reason)
    .bind(keep_errors)
    .bind(super::iso(now))
    .bind(now)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    sqlx::query("DELETE FROM jobs WHERE id = $1").bind(id).execute(&mut *conn).await?;
    Ok(moved == 1)
}

pub async fn archive_prune(conn: &mut SqliteConnection, now: i64, retention_secs: f64, limit: i64) -> Result<u64> {
    let cutoff = now - (retention_secs * 1000.0) as i64;
    let pruned = sqlx::query(
        "DELETE FROM archive WHERE id IN (
             SELECT id FROM archive WHERE finished_at < $1 ORDER BY finished_at LIMIT $2)",
    )
    .bind(cutoff)
    .bind(limit)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(pruned)
}

/// The columns shared by listings of live, blocked and archived jobs.
const LIVE_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key, NULL AS output,
    json_extract(errors, '$[#-1].error') AS error, enqueued_at, started_at, NULL AS finished_at,
    priority, payload, max_attempts, errors, NULL AS log, progress, run_at, host_id, parent_id";
const PARKED_COLUMNS: &str = "id, job, queue, 'blocked' AS state, attempt, concurrency_key, NULL AS output,
    json_extract(errors, '$[#-1].error') AS error, enqueued_at, started_at, NULL AS finished_at,
    priority, payload, max_attempts, errors, NULL AS log, progress, NULL AS run_at, NULL AS host_id, parent_id";
const ARCHIVE_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key, output,
    json_extract(errors, '$[#-1].error') AS error, enqueued_at, started_at, finished_at,
    priority, payload, max_attempts, errors, log, progress, NULL AS run_at, host_id, parent_id";

fn json_column(row: &SqliteRow, column: &str) -> Result<Option<serde_json::Value>> {
    Ok(row.try_get::<Option<Json<serde_json::Value>>, _>(column)?.map(|j| j.0))
}

fn row_of(row: &SqliteRow) -> Result<JobRow> {
    let state: String = row.try_get("state")?;
    Ok(JobRow {
        id: row.try_get("id")?,
        job: row.try_get("job")?,
        queue: row.try_get("queue")?,
        state: JobState::parse(&state).ok_or_else(|| Error::JobState { id: 0, reason: format!("state {state}") })?,
        attempts: row.try_get("attempt")?,
        concurrency_key: row.try_get("concurrency_key")?,
        output: json_column(row, "output")?,
        error: row.try_get("error")?,
        enqueued_at: time_of(row.try_get("enqueued_at")?),
        started_at: row.try_get::<Option<i64>, _>("started_at")?.map(time_of),
        finished_at: row.try_get::<Option<i64>, _>("finished_at")?.map(time_of),
    })
}

/// The columns a listing shows, from each table. Reading a column stored
/// after the payload walks the payload's overflow pages, so only the rows
/// listed pay for them.
const LIVE_LIST_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key, NULL AS output,
    json_extract(errors, '$[#-1].error') AS error, enqueued_at, started_at, NULL AS finished_at";
const PARKED_LIST_COLUMNS: &str = "id, job, queue, 'blocked' AS state, attempt, concurrency_key, NULL AS output,
    json_extract(errors, '$[#-1].error') AS error, enqueued_at, started_at, NULL AS finished_at";
const ARCHIVE_LIST_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key, output,
    json_extract(errors, '$[#-1].error') AS error, enqueued_at, started_at, finished_at";

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
    let job = if filter.job.is_some() { "AND job = $2" } else { "" };
    let picks: Vec<String> = [("jobs", live), ("blocked_jobs", blocked), ("archive", archived)]
        .into_iter()
        .filter_map(|(table, state)| {
            let state = state?;
            Some(format!(
                "SELECT * FROM (SELECT id FROM {table} WHERE TRUE {state} {job} ORDER BY {order} DESC LIMIT $1)"
            ))
        })
        .collect();
    // Built from constants only; every value is a bound parameter.
    let sql = format!(
        "WITH picked AS ({} ORDER BY id DESC LIMIT $1)
         SELECT {LIVE_LIST_COLUMNS} FROM jobs WHERE id IN picked
         UNION ALL
         SELECT {PARKED_LIST_COLUMNS} FROM blocked_jobs WHERE id IN picked
         UNION ALL
         SELECT {ARCHIVE_LIST_COLUMNS} FROM archive WHERE id IN picked
         ORDER BY id DESC",
        picks.join(" UNION ALL ")
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(filter.limit);
    if let Some(job) = &filter.job {
        query = query.bind(job);
    }
    let rows = query.fetch_all(pool).await?;
    rows.iter().map(row_of).collect()
}

pub async fn get(pool: &SqlitePool, id: i64) -> Result<Option<JobDetail>> {
    // Built from constants only; every value is a bound parameter.
    let sql = format!(
        "SELECT {LIVE_COLUMNS} FROM jobs WHERE id = $1
         UNION ALL
         SELECT {PARKED_COLUMNS} FROM blocked_jobs WHERE id = $1
         UNION ALL
         SELECT {ARCHIVE_COLUMNS} FROM archive WHERE id = $1"
    );
    let Some(row) = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(pool).await? else {
        return Ok(None);
    };
    Ok(Some(JobDetail {
        row: row_of(&row)?,
        priority: row.try_get("priority")?,
        payload: json_column(&row, "payload")?.unwrap_or_default(),
        max_attempts: row.try_get("max_attempts")?,
        errors: json_column(&row, "errors")?.unwrap_or_default(),
        log: json_column(&row, "log")?,
        progress: json_column(&row, "progress")?,
        run_at: row.try_get::<Option<i64>, _>("run_at")?.map(time_of),
        host_id: row.try_get("host_id")?,
        parent_id: row.try_get("parent_id")?,
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
    Ok(Stats::from_counts(counts, oldest.map(|s| s.max(0.0)), hosts, paused))
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
            sqlx::query("DELETE FROM archive WHERE id = $1").bind(id).execute(&mut *conn).await?;
        }
        revived
    };
    if due + revived == 0 {
        return Err(Error::JobState { id, reason: state_reason(conn, id, "retried").await? });
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
        return Err(Error::JobState { id, reason: state_reason(conn, id, "cancelled").await? });
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
    concurrency::release(conn, &slots, now).await.map(Some)
}

/// Explains why an operator action did not apply to a job.
async fn state_reason(conn: &mut SqliteConnection, id: i64, action: &str) -> Result<String> {
    let state: Option<String> = sqlx::query_scalar(
        "SELECT state FROM jobs WHERE id = $1
         UNION ALL SELECT state FROM archive WHERE id = $1
         UNION ALL SELECT 'blocked' FROM blocked_jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    Ok(match state {
        None => "does not exist".to_string(),
        Some(state) => format!("is {state} and cannot be {action}"),
    })
}
