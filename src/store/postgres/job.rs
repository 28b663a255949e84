//! Enqueue, fetch, finish and the operator's view of jobs, in PostgreSQL.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Row};

use super::host::job_types_get;
use crate::store::job::{EnqueueLimits, PreparedJob, job_names, prepare_all};
use crate::store::{
    Cancel, EnqueueParams, Error, FetchParams, FetchedJob, Finish, FinishOutcome, FinishResult, JobDetail, JobFilter,
    JobRow, JobState, LockedKeys, Result, Stats,
};
use crate::types::JsonText;

/// Enqueues inside the caller's transaction: all or none.
pub async fn enqueue(conn: &mut PgConnection, jobs: &[EnqueueParams], limits: &EnqueueLimits) -> Result<Vec<i64>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let configs = job_types_get(&mut *conn, &job_names(jobs)).await?;
    let prepared = prepare_all(jobs, &configs, limits)?;
    insert(conn, &prepared).await
}

/// One set-based insert for the whole batch, then the gate for the limited
/// jobs due now; ids come back in input order (a parked or discarded job
/// keeps its id). Keys are the ones `prepare` rendered: its canonical text is
/// what `jobhost.render_key` gives for the stored document, so the SQL
/// enqueue and this one store the same key (docs/concurrency.md, "Keys").
async fn insert(conn: &mut PgConnection, jobs: &[PreparedJob]) -> Result<Vec<i64>> {
    let rows: Vec<(i64, bool)> = sqlx::query_as(
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
         RETURNING id, concurrency_key IS NOT NULL AND state = 'available'",
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
    .fetch_all(&mut *conn)
    .await?;
    let gated: Vec<i64> = rows.iter().filter(|(_, gated)| *gated).map(|(id, _)| *id).collect();
    if !gated.is_empty() {
        super::concurrency::admit(conn, &gated).await?;
    }
    Ok(rows.into_iter().map(|(id, _)| id).collect())
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
         FROM jobhost.fetch(jobhost.unpaused($1), $2, $3, $4, $5)",
    )
    .bind(&params.queues)
    .bind(&names)
    .bind(&leases)
    .bind(params.limit)
    .bind(&params.host_id)
    .fetch_all(pool)
    .await?;
    rows.iter().map(leased_job).collect()
}

/// A leased job from the columns of `jobhost.fetch` (or of `finish_runs`).
fn leased_job(row: &sqlx::postgres::PgRow) -> Result<FetchedJob> {
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
}

/// The columns of `jobhost.finish_runs`: runs that end for good, and runs
/// that go back to wait.
#[derive(Default)]
struct FinishRows {
    keyed_ids: Vec<i64>,
    keyed_tokens: Vec<i64>,
    archive_ids: Vec<i64>,
    archive_tokens: Vec<i64>,
    archive_states: Vec<&'static str>,
    outputs: Vec<Option<Json<JsonText>>>,
    archive_errors: Vec<Option<Json<serde_json::Value>>>,
    logs: Vec<Json<serde_json::Value>>,
    archive_progress: Vec<Option<Json<serde_json::Value>>>,
    requeue_ids: Vec<i64>,
    requeue_tokens: Vec<i64>,
    delays: Vec<i64>,
    refunds: Vec<i32>,
    requeue_errors: Vec<Option<Json<serde_json::Value>>>,
    requeue_progress: Vec<Option<Json<serde_json::Value>>>,
}

fn error_entry(attempt: i32, error: &str, log: &serde_json::Value) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "attempt": attempt, "error": error, "log": log }))
}

/// What a batch of results did: each result's fate, whether any job became
/// available (requeued at once, or promoted into a freed slot), and the jobs
/// leased to the writing host in the same transaction.
pub struct Finished {
    pub results: Vec<FinishResult>,
    pub any_available: bool,
    pub leased: Vec<FetchedJob>,
}

/// Writes a batch of results and, when `next` asks for any, leases jobs to
/// the writing host in the same transaction.
pub async fn finish(
    pool: &PgPool,
    mut finishes: Vec<Finish>,
    next: Option<&FetchParams>,
    locked: LockedKeys,
    limits: &EnqueueLimits,
) -> Result<Finished> {
    fail_parents_of_unknown_children(pool, &mut finishes, limits).await?;
    let rows = FinishRows::of(finishes.iter(), locked);
    // Children must commit with their parent's completion (guarantee 9),
    // so a batch with children is one transaction. Otherwise the batch is
    // one statement: it ends the runs (but those whose key another
    // transaction holds), gives back their slots, promotes parked jobs into
    // them and leases the next jobs, in one round trip.
    let has_children = !crate::store::job::child_types(&finishes).is_empty();
    let (written, any_available, leased, deferred) = if !has_children {
        rows.write(pool, next).await?
    } else {
        let mut tx = pool.begin().await?;
        let work = async {
            let (written, any_available, leased, deferred) = rows.write(&mut *tx, next).await?;
            let children = crate::store::job::children_of_written(&finishes, &written);
            enqueue(&mut tx, &children, limits).await?;
            Ok((written, any_available, leased, deferred))
        }
        .await;
        super::commit_or_roll_back(tx, work).await?
    };
    if !deferred.is_empty() {
        tracing::debug!(results = deferred.len(), "results deferred: their keys are locked by another transaction");
    }
    let results = finishes
        .iter()
        .map(|f| match () {
            () if deferred.contains(&f.id) => FinishResult::Deferred,
            () if written.contains(&f.id) => FinishResult::Done,
            () => FinishResult::Duplicate,
        })
        .collect();
    Ok(Finished { results, any_available, leased })
}

impl FinishRows {
    /// The rows of `finishes`; with [`LockedKeys::Defer`], the runs holding
    /// a key, to be left out while another transaction holds that key.
    fn of<'a>(finishes: impl Iterator<Item = &'a Finish>, locked: LockedKeys) -> FinishRows {
        let mut rows = FinishRows::default();
        for f in finishes {
            if locked == LockedKeys::Defer && f.concurrency_key.is_some() {
                rows.keyed_ids.push(f.id);
                rows.keyed_tokens.push(f.lease_token);
            }
            rows.push(f);
        }
        rows
    }

    fn push(&mut self, f: &Finish) {
        let progress = f.progress.clone().map(Json);
        match &f.outcome {
            FinishOutcome::Completed { output, .. } => self.archive(f, "completed", output.clone(), None, progress),
            FinishOutcome::Failed { error } => self.archive(f, "failed", None, Some(error), progress),
            FinishOutcome::Retry { error, delay_ms } => {
                self.requeue(f, *delay_ms, 0, Some(error_entry(f.attempt, error, &f.log)), progress)
            }
            FinishOutcome::Snooze { delay_ms } => self.requeue(f, *delay_ms, 1, None, progress),
            FinishOutcome::Release { .. } => self.requeue(f, 0, 1, None, progress),
            FinishOutcome::Cancelled { reason } => self.archive(f, "cancelled", None, Some(reason), progress),
        }
    }

    fn archive(
        &mut self,
        f: &Finish,
        state: &'static str,
        output: Option<JsonText>,
        error: Option<&str>,
        progress: Option<Json<serde_json::Value>>,
    ) {
        self.archive_ids.push(f.id);
        self.archive_tokens.push(f.lease_token);
        self.archive_states.push(state);
        self.outputs.push(output.map(Json));
        self.archive_errors.push(error.map(|e| error_entry(f.attempt, e, &f.log)));
        self.logs.push(Json(f.log.clone()));
        self.archive_progress.push(progress);
    }

    fn requeue(
        &mut self,
        f: &Finish,
        delay_ms: u64,
        refund: i32,
        error: Option<Json<serde_json::Value>>,
        progress: Option<Json<serde_json::Value>>,
    ) {
        self.requeue_ids.push(f.id);
        self.requeue_tokens.push(f.lease_token);
        self.delays.push(i64::try_from(delay_ms).unwrap_or(i64::MAX));
        self.refunds.push(refund);
        self.requeue_errors.push(error);
        self.requeue_progress.push(progress);
    }

    /// Writes the rows whose lease still matches (see jobhost.finish_runs in
    /// 0004_concurrency.sql, through jobhost.finish_runs_unless_locked in
    /// 0005_fault_tolerance.sql); returns their ids, whether any job became
    /// available, the jobs leased to the host `next` names, if it asks for
    /// any, and the runs left out because another transaction holds their key.
    async fn write(
        &self,
        executor: impl sqlx::PgExecutor<'_>,
        next: Option<&FetchParams>,
    ) -> Result<(HashSet<i64>, bool, Vec<FetchedJob>, HashSet<i64>)> {
        let next = next.filter(|n| n.limit > 0 && !n.job_types.is_empty() && !n.queues.is_empty());
        let (names, leases): (Vec<&str>, Vec<i32>) =
            next.map(|n| n.job_types.iter().map(|(name, l)| (name.as_str(), *l)).unzip()).unwrap_or_default();
        // A batch with no run holding a key has nothing to defer: it skips
        // the wrapper's extra function frame on the hot path.
        let query = if self.keyed_ids.is_empty() {
            sqlx::query(
                "SELECT NULL::bigint[] AS deferred, f.*
                 FROM jobhost.finish_runs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                                          jobhost.unpaused($14), $15, $16, $17, $18) f",
            )
        } else {
            sqlx::query(
                "SELECT * FROM jobhost.finish_runs_unless_locked($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
                                                                 $13, $14, $15, jobhost.unpaused($16), $17, $18, $19, $20)",
            )
            .bind(&self.keyed_ids)
            .bind(&self.keyed_tokens)
        };
        let rows = query
            .bind(&self.archive_ids)
            .bind(&self.archive_tokens)
            .bind(&self.archive_states)
            .bind(&self.outputs)
            .bind(&self.archive_errors)
            .bind(&self.logs)
            .bind(&self.archive_progress)
            .bind(&self.requeue_ids)
            .bind(&self.requeue_tokens)
            .bind(&self.delays)
            .bind(&self.refunds)
            .bind(&self.requeue_errors)
            .bind(&self.requeue_progress)
            .bind(next.map(|n| n.queues.clone()).unwrap_or_default())
            .bind(names)
            .bind(leases)
            .bind(next.map_or(0, |n| n.limit))
            .bind(next.map_or("", |n| n.host_id.as_str()))
            .fetch_all(executor)
            .await?;
        let first = rows.first().ok_or_else(|| Error::JobState { id: 0, reason: "finish wrote no row".into() })?;
        let written: Vec<i64> = first.try_get("written")?;
        let deferred: Vec<i64> = first.try_get::<Option<Vec<i64>>, _>("deferred")?.unwrap_or_default();
        let any_available: bool = first.try_get("any_available")?;
        let mut leased = Vec::new();
        for row in &rows {
            if row.try_get::<Option<i64>, _>("id")?.is_some() {
                leased.push(leased_job(row)?);
            }
        }
        Ok((written.into_iter().collect(), any_available, leased, deferred.into_iter().collect()))
    }
}

/// Fails the parents whose children cannot be enqueued (see
/// [`crate::store::job::fail_parents_of_unfit_children`]).
async fn fail_parents_of_unknown_children(
    pool: &PgPool,
    finishes: &mut [Finish],
    limits: &EnqueueLimits,
) -> Result<()> {
    let names = crate::store::job::child_types(finishes);
    if names.is_empty() {
        return Ok(());
    }
    let configs = job_types_get(pool, &names).await?;
    crate::store::job::fail_parents_of_unfit_children(finishes, &configs, limits);
    Ok(())
}

pub async fn promote_due(pool: &PgPool, now: Option<DateTime<Utc>>) -> Result<u64> {
    // The gate, for jobs that have waited out a delay or a backoff; see
    // jobhost.promote_due in 0004_concurrency.sql.
    let promoted: i32 =
        sqlx::query_scalar("SELECT jobhost.promote_due(coalesce($1, now()), 5000)").bind(now).fetch_one(pool).await?;
    Ok(promoted as u64)
}

/// Scheduled jobs due by `now`, the longest due first.
pub async fn due_ids(pool: &PgPool, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM jobhost.jobs WHERE state = 'scheduled' AND run_at <= coalesce($1, now()) ORDER BY run_at LIMIT $2",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Passes the named scheduled jobs that are due through the gate. Locks:
/// those rows, SKIP LOCKED (another host's sweep has them), then their
/// semaphores in order, as `jobhost.promote_due` does for every due job.
pub async fn promote_due_ids(pool: &PgPool, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<u64> {
    let mut tx = pool.begin().await?;
    let promoted = promote_due_ids_in(&mut tx, now, ids).await;
    super::commit_or_roll_back(tx, promoted).await
}

async fn promote_due_ids_in(conn: &mut PgConnection, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<u64> {
    let due: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM jobhost.jobs
         WHERE id = ANY($1) AND state = 'scheduled' AND run_at <= coalesce($2, now())
         ORDER BY id FOR UPDATE SKIP LOCKED",
    )
    .bind(ids)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    if due.is_empty() {
        return Ok(0);
    }
    let admitted: i32 = sqlx::query_scalar("SELECT jobhost.admit($1, false)").bind(&due).fetch_one(&mut *conn).await?;
    if admitted > 0 {
        super::notify_available(conn).await?;
    }
    Ok(due.len() as u64)
}

/// Moves a live job that maintenance cannot process to the archive as
/// failed, with `reason` as its last error, touching nothing else: a slot it
/// held is corrected by the semaphore repair. When even its errors cannot be
/// extended (they are what is too large), they are replaced by the reason.
pub async fn quarantine(pool: &PgPool, id: i64, reason: &str) -> Result<bool> {
    match quarantine_with(pool, id, reason, true).await {
        Err(error) if error.is_refusal() => quarantine_with(pool, id, reason, false).await,
        other => other,
    }
}

async fn quarantine_with(pool: &PgPool, id: i64, reason: &str, keep_errors: bool) -> Result<bool> {
    let moved = sqlx::query(
        "WITH gone AS (DELETE FROM jobhost.jobs WHERE id = $1 RETURNING *)
         INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                      progress, enqueued_at, started_at, finished_at, host_id, concurrency_key,
                                      batch_id, parent_id)
         SELECT id, job, queue, priority, payload, 'failed', attempt, max_attempts,
                CASE WHEN $3 THEN errors ELSE '[]'::jsonb END
                    || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', now(), 'error', $2::text)),
                progress, enqueued_at, started_at, now(), host_id, concurrency_key, batch_id, parent_id
         FROM gone",
    )
    .bind(id)
    .bind(reason)
    .bind(keep_errors)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(moved == 1)
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
const PARKED_COLUMNS: &str = "id, job, queue, 'blocked' AS state, attempt, concurrency_key, NULL::jsonb AS output,
    errors -> -1 ->> 'error' AS error, enqueued_at, started_at, NULL::timestamptz AS finished_at,
    priority, payload, max_attempts, errors, NULL::jsonb AS log, progress, NULL::timestamptz AS run_at,
    NULL::text AS host_id, parent_id";
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
             SELECT {PARKED_COLUMNS} FROM jobhost.blocked_jobs
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
         SELECT {PARKED_COLUMNS} FROM jobhost.blocked_jobs WHERE id = $1
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
    Ok(Stats::from_counts(counts, oldest, hosts, paused))
}

pub async fn retry(pool: &PgPool, id: i64) -> Result<()> {
    let mut tx = pool.begin().await?;
    // A scheduled job runs now, or a finished job that did not complete
    // comes back with a fresh budget; either way it passes the gate, as a
    // new enqueue would. Locks: that row.
    let due = sqlx::query("UPDATE jobhost.jobs SET run_at = now() WHERE id = $1 AND state = 'scheduled'")
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
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
        return Err(Error::JobState { id, reason: state_reason(&mut tx, id, "retried").await? });
    }
    super::concurrency::admit(&mut tx, &[id]).await?;
    super::notify_available(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

pub async fn cancel(pool: &PgPool, id: i64) -> Result<Cancel> {
    let mut tx = pool.begin().await?;
    // A waiting or available job, or a parked one, goes to the archive; an
    // available limited job gives its slot back in the same transaction.
    // Locks: the job's row, then its semaphore.
    let cancelled: Option<(String, Option<String>)> = sqlx::query_as(
        "WITH cancelled AS (
             DELETE FROM jobhost.jobs WHERE id = $1 AND state IN ('scheduled', 'available')
             RETURNING *, state = 'available' AS held_slot
         ),
         unparked AS (
             DELETE FROM jobhost.blocked_jobs WHERE id = $1
             RETURNING id, job, queue, priority, payload, attempt, max_attempts, errors, progress, enqueued_at,
                       started_at, concurrency_key, batch_id, parent_id, false AS held_slot
         ),
         gone AS (
             SELECT id, job, queue, priority, payload, attempt, max_attempts, errors, progress, enqueued_at,
                    started_at, concurrency_key, batch_id, parent_id, held_slot
             FROM cancelled
             UNION ALL
             SELECT * FROM unparked
         ),
         archived AS (
             INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, errors,
                                          progress, enqueued_at, started_at, finished_at, concurrency_key, batch_id,
                                          parent_id)
             SELECT id, job, queue, priority, payload, 'cancelled', attempt, max_attempts, errors, progress,
                    enqueued_at, started_at, now(), concurrency_key, batch_id, parent_id
             FROM gone
         )
         SELECT job, CASE WHEN held_slot THEN concurrency_key END FROM gone",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
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
            tx.commit().await?;
            return Ok(Cancel::Requested);
        }
        return Err(Error::JobState { id, reason: state_reason(&mut tx, id, "cancelled").await? });
    };
    let mut slots = crate::store::Slots::default();
    slots.push(&job, key.as_deref());
    super::concurrency::release(&mut tx, &slots).await?;
    tx.commit().await?;
    Ok(Cancel::Cancelled)
}

/// Explains why an operator action did not apply to a job.
async fn state_reason(conn: &mut PgConnection, id: i64, action: &str) -> Result<String> {
    let state: Option<(String,)> = sqlx::query_as(
        "SELECT state FROM jobhost.jobs WHERE id = $1
         UNION ALL SELECT state FROM jobhost.archive WHERE id = $1
         UNION ALL SELECT 'blocked' FROM jobhost.blocked_jobs WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    Ok(match state {
        None => "does not exist".to_string(),
        Some((state,)) => format!("is {state} and cannot be {action}"),
    })
}
