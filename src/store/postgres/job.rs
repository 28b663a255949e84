//! Enqueue, fetch, finish and the operator's view of jobs, in PostgreSQL.

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Row};

use super::host::job_types_get;
use crate::store::job::{PreparedJob, prepare};
use crate::store::{
    EnqueueParams, Error, FetchParams, FetchedJob, Finish, FinishOutcome, FinishResult, JobDetail, JobFilter, JobRow,
    JobState, Result, Stats,
};

/// Enqueues inside the caller's transaction: all or none.
pub async fn enqueue(conn: &mut PgConnection, jobs: &[EnqueueParams]) -> Result<Vec<i64>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut names: Vec<String> = jobs.iter().map(|j| j.job.clone()).collect();
    names.sort();
    names.dedup();
    let configs = job_types_get(&mut *conn, &names).await?;
    let prepared = jobs
        .iter()
        .map(|job| {
            let config = configs.get(&job.job).ok_or_else(|| Error::UnknownJobType(job.job.clone()))?;
            prepare(job, config)
        })
        .collect::<Result<Vec<PreparedJob>>>()?;
    insert(conn, &prepared).await
}

/// One set-based insert for the whole batch; ids come back in input order.
async fn insert(conn: &mut PgConnection, jobs: &[PreparedJob]) -> Result<Vec<i64>> {
    let ids: Vec<(i64,)> = sqlx::query_as(
        "INSERT INTO jobhost.jobs (job, queue, priority, payload, state, max_attempts, run_at, concurrency_key, parent_id)
         SELECT job, queue, priority, payload,
                CASE WHEN due > now() THEN 'scheduled' ELSE 'available' END,
                max_attempts, greatest(due, now()), concurrency_key, parent_id
         FROM (
             SELECT u.*, coalesce(u.at, now() + u.delay_ms * interval '1 millisecond') AS due
             FROM unnest($1::text[], $2::text[], $3::smallint[], $4::jsonb[], $5::int[], $6::timestamptz[],
                         $7::bigint[], $8::text[], $9::bigint[])
                 WITH ORDINALITY AS u(job, queue, priority, payload, max_attempts, at, delay_ms, concurrency_key,
                                      parent_id, ord)
             ORDER BY u.ord
         ) input
         RETURNING id",
    )
    .bind(jobs.iter().map(|j| j.job.as_str()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.queue.as_str()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.priority).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| Json(&j.payload)).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.max_attempts).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.run_at).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.delay_ms).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.concurrency_key.as_deref()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.parent_id).collect::<Vec<_>>())
    .fetch_all(conn)
    .await?;
    Ok(ids.into_iter().map(|(id,)| id).collect())
}

pub async fn fetch(pool: &PgPool, params: &FetchParams) -> Result<Vec<FetchedJob>> {
    if params.limit <= 0 || params.job_types.is_empty() || params.queues.is_empty() {
        return Ok(Vec::new());
    }
    let (names, leases): (Vec<&str>, Vec<i32>) = params.job_types.iter().map(|(n, l)| (n.as_str(), *l)).unzip();
    // The statement lives in the migration 0003_fetch_function.sql, which
    // says why it is a function (a pinned plan).
    let rows = sqlx::query(
        "SELECT id, lease_token, job, queue, payload, attempt, max_attempts, enqueued_at, batch_id,
                concurrency_key, lease_secs
         FROM jobhost.fetch($1, $2, $3, $4, $5)",
    )
    .bind(&params.queues)
    .bind(&names)
    .bind(&leases)
    .bind(params.limit)
    .bind(&params.host_id)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(FetchedJob {
                id: row.try_get("id")?,
                lease_token: row.try_get("lease_token")?,
                job: row.try_get("job")?,
                queue: row.try_get("queue")?,
                payload: row.try_get::<Json<serde_json::Value>, _>("payload")?.0,
                attempt: row.try_get("attempt")?,
                max_attempts: row.try_get("max_attempts")?,
                enqueued_at: row.try_get("enqueued_at")?,
                batch_id: row.try_get("batch_id")?,
                concurrency_key: row.try_get("concurrency_key")?,
                lease_secs: row.try_get("lease_secs")?,
            })
        })
        .collect()
}

/// The columns of the archive statement.
#[derive(Default)]
struct ArchiveRows {
    ids: Vec<i64>,
    tokens: Vec<i64>,
    states: Vec<&'static str>,
    outputs: Vec<Option<Json<serde_json::Value>>>,
    errors: Vec<Option<Json<serde_json::Value>>>,
    logs: Vec<Json<serde_json::Value>>,
    progress: Vec<Option<Json<serde_json::Value>>>,
}

/// The columns of the requeue statement.
#[derive(Default)]
struct RequeueRows {
    ids: Vec<i64>,
    tokens: Vec<i64>,
    delays: Vec<i64>,
    refunds: Vec<i32>,
    errors: Vec<Option<Json<serde_json::Value>>>,
    progress: Vec<Option<Json<serde_json::Value>>>,
}

fn error_entry(attempt: i32, error: &str, log: &serde_json::Value) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "attempt": attempt, "error": error, "log": log }))
}

pub async fn finish(pool: &PgPool, mut finishes: Vec<Finish>) -> Result<Vec<FinishResult>> {
    fail_parents_of_unknown_children(pool, &mut finishes).await?;
    let mut archive = ArchiveRows::default();
    let mut requeue = RequeueRows::default();
    for f in &finishes {
        let progress = f.progress.clone().map(Json);
        let mut to_archive = |state, output: Option<serde_json::Value>, error: Option<&str>| {
            archive.ids.push(f.id);
            archive.tokens.push(f.lease_token);
            archive.states.push(state);
            archive.outputs.push(output.map(Json));
            archive.errors.push(error.map(|e| error_entry(f.attempt, e, &f.log)));
            archive.logs.push(Json(f.log.clone()));
            archive.progress.push(progress.clone());
        };
        match &f.outcome {
            FinishOutcome::Completed { output, .. } => to_archive("completed", output.clone(), None),
            FinishOutcome::Failed { error } => to_archive("failed", None, Some(error)),
            FinishOutcome::Retry { error, delay_ms } => {
                requeue.push(f, *delay_ms, 0, Some(error_entry(f.attempt, error, &f.log)), progress)
            }
            FinishOutcome::Snooze { delay_ms } => requeue.push(f, *delay_ms, 1, None, progress),
            FinishOutcome::Release { .. } => requeue.push(f, 0, 1, None, progress),
        }
    }

    // Children must commit with their parent's completion (guarantee 9),
    // so a batch with children is one transaction. Otherwise each statement
    // stands alone: every row's effect is independent of the others', and
    // one round trip instead of three is what keeps the hot path fast.
    let children = |archived: &HashSet<i64>| -> Vec<EnqueueParams> {
        finishes
            .iter()
            .filter(|f| archived.contains(&f.id))
            .flat_map(|f| match &f.outcome {
                FinishOutcome::Completed { children, .. } => {
                    children.iter().map(|c| EnqueueParams::child(f.id, c.clone())).collect()
                }
                _ => Vec::new(),
            })
            .collect()
    };
    let has_children = finishes
        .iter()
        .any(|f| matches!(&f.outcome, FinishOutcome::Completed { children, .. } if !children.is_empty()));
    let archived = if has_children {
        let mut tx = pool.begin().await?;
        let archived = archive.write(&mut *tx).await?;
        enqueue(&mut tx, &children(&archived)).await?;
        tx.commit().await?;
        archived
    } else {
        archive.write(pool).await?
    };
    let (requeued, any_available) = requeue.write(pool).await?;
    if any_available {
        let mut conn = pool.acquire().await?;
        super::notify_available(&mut conn).await?;
    }

    Ok(finishes
        .iter()
        .map(|f| {
            if archived.contains(&f.id) || requeued.contains(&f.id) {
                FinishResult::Done
            } else {
                FinishResult::Duplicate
            }
        })
        .collect())
}

impl ArchiveRows {
    /// Archives the rows whose lease still matches; returns their ids.
    async fn write(&self, executor: impl sqlx::PgExecutor<'_>) -> Result<HashSet<i64>> {
        if self.ids.is_empty() {
            return Ok(HashSet::new());
        }
        let rows: Vec<(i64,)> = sqlx::query_as(include_str!("sql/archive.sql"))
            .bind(&self.ids)
            .bind(&self.tokens)
            .bind(&self.states)
            .bind(&self.outputs)
            .bind(&self.errors)
            .bind(&self.logs)
            .bind(&self.progress)
            .fetch_all(executor)
            .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }
}

impl RequeueRows {
    /// Requeues the rows whose lease still matches; returns their ids and
    /// whether any became available at once.
    async fn write(&self, executor: impl sqlx::PgExecutor<'_>) -> Result<(HashSet<i64>, bool)> {
        if self.ids.is_empty() {
            return Ok((HashSet::new(), false));
        }
        let rows: Vec<(i64, String)> = sqlx::query_as(include_str!("sql/requeue.sql"))
            .bind(&self.ids)
            .bind(&self.tokens)
            .bind(&self.delays)
            .bind(&self.refunds)
            .bind(&self.errors)
            .bind(&self.progress)
            .fetch_all(executor)
            .await?;
        let any_available = rows.iter().any(|(_, state)| state == "available");
        Ok((rows.into_iter().map(|(id, _)| id).collect(), any_available))
    }

    fn push(
        &mut self,
        f: &Finish,
        delay_ms: u64,
        refund: i32,
        error: Option<Json<serde_json::Value>>,
        progress: Option<Json<serde_json::Value>>,
    ) {
        self.ids.push(f.id);
        self.tokens.push(f.lease_token);
        self.delays.push(i64::try_from(delay_ms).unwrap_or(i64::MAX));
        self.refunds.push(refund);
        self.errors.push(error);
        self.progress.push(progress);
    }
}

/// A child that cannot be enqueued (unknown type, bad payload) would fail the
/// whole completion transaction; instead its parent fails with the reason,
/// and nothing is lost: the parent can be retried once the type exists.
async fn fail_parents_of_unknown_children(pool: &PgPool, finishes: &mut [Finish]) -> Result<()> {
    let mut names: Vec<String> = finishes
        .iter()
        .flat_map(|f| match &f.outcome {
            FinishOutcome::Completed { children, .. } => children.iter().map(|c| c.job.clone()).collect(),
            _ => Vec::new(),
        })
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    names.dedup();
    let configs = job_types_get(pool, &names).await?;
    for f in finishes.iter_mut() {
        let FinishOutcome::Completed { children, .. } = &f.outcome else { continue };
        let problem = children.iter().find_map(|c| {
            let Some(config) = configs.get(&c.job) else {
                return Some(Error::UnknownJobType(c.job.clone()).to_string());
            };
            prepare(&EnqueueParams::child(f.id, c.clone()), config).err().map(|e| e.to_string())
        });
        if let Some(problem) = problem {
            f.outcome = FinishOutcome::Failed { error: format!("could not enqueue a child job: {problem}") };
        }
    }
    Ok(())
}

pub async fn promote_due(pool: &PgPool, now: Option<DateTime<Utc>>) -> Result<u64> {
    let mut tx = pool.begin().await?;
    // Locks: due scheduled rows, SKIP LOCKED, so concurrent sweeps split them.
    let promoted = sqlx::query(
        "WITH due AS (
             SELECT id FROM jobhost.jobs
             WHERE state = 'scheduled' AND run_at <= coalesce($1, now())
             ORDER BY run_at
             LIMIT 5000
             FOR UPDATE SKIP LOCKED
         )
         UPDATE jobhost.jobs j SET state = 'available'
         FROM due WHERE j.id = due.id",
    )
    .bind(now)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if promoted > 0 {
        super::notify_available(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(promoted)
}

pub async fn archive_prune(pool: &PgPool, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
    let pruned = sqlx::query(
        "DELETE FROM jobhost.archive WHERE id IN (
             SELECT id FROM jobhost.archive
             WHERE finished_at < coalesce($1, now()) - $2 * interval '1 second'
             ORDER BY finished_at LIMIT $3)",
    )
    .bind(now)
    .bind(retention_secs)
    .bind(limit)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(pruned)
}

/// The columns shared by listings of live and archived jobs.
const LIVE_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key, NULL::jsonb AS output,
    errors -> -1 ->> 'error' AS error, enqueued_at, started_at, NULL::timestamptz AS finished_at,
    priority, payload, max_attempts, errors, NULL::jsonb AS log, progress, run_at, host_id, parent_id";
const ARCHIVE_COLUMNS: &str = "id, job, queue, state, attempt, concurrency_key, output,
    errors -> -1 ->> 'error' AS error, enqueued_at, started_at, finished_at,
    priority, payload, max_attempts, errors, log, progress, NULL::timestamptz AS run_at, host_id, parent_id";

fn row_of(row: &sqlx::postgres::PgRow) -> Result<JobRow> {
    let state: String = row.try_get("state")?;
    Ok(JobRow {
        id: row.try_get("id")?,
        job: row.try_get("job")?,
        queue: row.try_get("queue")?,
        state: JobState::parse(&state).ok_or_else(|| Error::JobState { id: 0, reason: format!("state {state}") })?,
        attempts: row.try_get("attempt")?,
        concurrency_key: row.try_get("concurrency_key")?,
        output: row.try_get::<Option<Json<serde_json::Value>>, _>("output")?.map(|j| j.0),
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
             SELECT {LIVE_COLUMNS} FROM jobhost.jobs
             UNION ALL
             SELECT {ARCHIVE_COLUMNS} FROM jobhost.archive
         ) all_jobs
         WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR job = $2)
         ORDER BY id DESC LIMIT $3"
    );
    let rows =
        sqlx::query(sqlx::AssertSqlSafe(sql)).bind(state).bind(&filter.job).bind(filter.limit).fetch_all(pool).await?;
    rows.iter().map(row_of).collect()
}

pub async fn get(pool: &PgPool, id: i64) -> Result<Option<JobDetail>> {
    // Built from constants only; every value is a bound parameter.
    let sql = format!(
        "SELECT {LIVE_COLUMNS} FROM jobhost.jobs WHERE id = $1
         UNION ALL
         SELECT {ARCHIVE_COLUMNS} FROM jobhost.archive WHERE id = $1"
    );
    let Some(row) = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(pool).await? else {
        return Ok(None);
    };
    Ok(Some(JobDetail {
        row: row_of(&row)?,
        priority: row.try_get("priority")?,
        payload: row.try_get::<Json<serde_json::Value>, _>("payload")?.0,
        max_attempts: row.try_get("max_attempts")?,
        errors: row.try_get::<Json<serde_json::Value>, _>("errors")?.0,
        log: row.try_get::<Option<Json<serde_json::Value>>, _>("log")?.map(|j| j.0),
        progress: row.try_get::<Option<Json<serde_json::Value>>, _>("progress")?.map(|j| j.0),
        run_at: row.try_get("run_at")?,
        host_id: row.try_get("host_id")?,
        parent_id: row.try_get("parent_id")?,
    }))
}

/// How recently a host must have heartbeated to count as alive.
const HOST_ALIVE_SECS: f64 = 30.0;

pub async fn stats(pool: &PgPool) -> Result<Stats> {
    let counts: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT state, queue, count(*) FROM jobhost.jobs GROUP BY 1, 2
         UNION ALL
         SELECT state, queue, count(*) FROM jobhost.archive GROUP BY 1, 2",
    )
    .fetch_all(pool)
    .await?;
    let (oldest, hosts_alive): (Option<f64>, i64) = sqlx::query_as(
        "SELECT (SELECT extract(epoch FROM now() - min(run_at))::float8 FROM jobhost.jobs WHERE state = 'available'),
                (SELECT count(*) FROM jobhost.hosts WHERE last_seen_at > now() - $1 * interval '1 second')",
    )
    .bind(HOST_ALIVE_SECS)
    .fetch_one(pool)
    .await?;
    let mut states: BTreeMap<String, i64> = JobState::ALL.iter().map(|s| (s.as_str().to_string(), 0)).collect();
    let mut queues: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for (state, queue, count) in counts {
        *states.entry(state.clone()).or_default() += count;
        *queues.entry(queue).or_default().entry(state).or_default() += count;
    }
    Ok(Stats { states, queues, oldest_available_secs: oldest, hosts_alive })
}

pub async fn retry(pool: &PgPool, id: i64) -> Result<()> {
    let mut tx = pool.begin().await?;
    // A scheduled job runs now. Locks: that row.
    let promoted = sqlx::query(
        "UPDATE jobhost.jobs SET state = 'available', run_at = now() WHERE id = $1 AND state = 'scheduled'",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    // A finished job that did not complete comes back with a fresh budget.
    let revived = if promoted > 0 {
        0
    } else {
        sqlx::query(
            "WITH revived AS (
                 DELETE FROM jobhost.archive WHERE id = $1 AND state IN ('failed', 'discarded', 'cancelled')
                 RETURNING *)
             INSERT INTO jobhost.jobs (id, job, queue, priority, payload, state, attempt, max_attempts, run_at,
                                       enqueued_at, concurrency_key, batch_id, parent_id, errors, progress)
             SELECT id, job, queue, priority, payload, 'available', 0, max_attempts, now(),
                    enqueued_at, concurrency_key, batch_id, parent_id, errors, progress
             FROM revived",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
    };
    if promoted + revived == 0 {
        return Err(Error::JobState { id, reason: state_reason(&mut tx, id, "retried").await? });
    }
    super::notify_available(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

pub async fn cancel(pool: &PgPool, id: i64) -> Result<()> {
    let mut tx = pool.begin().await?;
    // Locks: the job's row, if it is waiting.
    let cancelled = sqlx::query(
        "WITH cancelled AS (
             DELETE FROM jobhost.jobs WHERE id = $1 AND state IN ('scheduled', 'available') RETURNING *)
         INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                      progress, enqueued_at, started_at, finished_at, concurrency_key, batch_id,
                                      parent_id)
         SELECT id, job, queue, priority, payload, 'cancelled', attempt, max_attempts, errors, progress,
                enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id
         FROM cancelled",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if cancelled == 0 {
        return Err(Error::JobState { id, reason: state_reason(&mut tx, id, "cancelled").await? });
    }
    tx.commit().await?;
    Ok(())
}

/// Explains why an operator action did not apply to a job.
async fn state_reason(conn: &mut PgConnection, id: i64, action: &str) -> Result<String> {
    let state: Option<(String,)> = sqlx::query_as(
        "SELECT state FROM jobhost.jobs WHERE id = $1 UNION ALL SELECT state FROM jobhost.archive WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    Ok(match state {
        None => "does not exist".to_string(),
        Some((state,)) => format!("is {state} and cannot be {action}"),
    })
}
