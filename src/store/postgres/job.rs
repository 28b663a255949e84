//! Inserting prepared jobs, fetching them, and moving them between the
//! queue's states (due, quarantined, pruned), in PostgreSQL.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Row};

use super::PgStore;
use crate::store::JobDetail;
use crate::store::driver::JobDriver;
use crate::store::{Enqueued, FetchParams, FetchedJob, PreparedJob, Result};

/// One call of `jobhost.insert_jobs` for the whole batch, which decides
/// the gate for the limited jobs due now as it writes them (a blocked job
/// goes straight to `blocked_jobs`), then the members counted into their
/// batches (after the gate: a result takes a key before a batch, and so
/// does this), in the caller's transaction; outcomes come back in input
/// order (a blocked or discarded job keeps its id). A batch with unique
/// jobs first takes its ids, claims its keys and records them (before the
/// insert, whose gate may archive a job, and the archive takes its key
/// with it), so a duplicate is never stored: in the same call as the
/// insert ([`claim_and_insert_rows`]) when [`insert_bulk`] is told it may;
/// otherwise the claims' answer comes back before anything is written.
pub async fn insert(conn: &mut PgConnection, jobs: &[&PreparedJob]) -> Result<Vec<Enqueued>> {
    insert_bulk(conn, jobs, None).await
}

/// [`insert`], for a store's bulk enqueue: unique jobs are claimed and
/// written in one round trip when `claims` says so
/// ([`super::unique::ClaimPath`]), and it learns from what the call found.
pub async fn insert_bulk(
    conn: &mut PgConnection,
    jobs: &[&PreparedJob],
    claims: Option<&super::unique::ClaimPath>,
) -> Result<Vec<Enqueued>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    if jobs.iter().all(|j| j.unique.is_none()) {
        let ids = insert_rows(conn, jobs, None).await?;
        super::trace::record(conn, ids.iter().copied().zip(jobs.iter().copied())).await?;
        super::membership::add_members(conn, jobs).await?;
        return Ok(ids.into_iter().map(Enqueued::New).collect());
    }
    let one_call = claims.is_some_and(|c| c.one_call(jobs));
    let (ids, decided) = if one_call {
        let (ids, claimants) = claim_and_insert_rows(conn, jobs).await?;
        let decided = super::unique::decide(conn, jobs, &ids, claimants).await?;
        (ids, decided)
    } else {
        super::unique::claim(conn, jobs).await?
    };
    let (fresh_ids, fresh_jobs): (Vec<i64>, Vec<&PreparedJob>) = written(&decided, &ids, jobs).unzip();
    if !one_call {
        insert_rows(conn, &fresh_jobs, Some(&fresh_ids)).await?;
    }
    if let Some(claims) = claims {
        claims.learn(&decided);
    }
    super::trace::record(conn, fresh_ids.iter().copied().zip(fresh_jobs.iter().copied())).await?;
    super::membership::add_members(conn, &fresh_jobs).await?;
    Ok(decided.into_iter().zip(ids).map(|(decided, id)| decided.unwrap_or(Enqueued::New(id))).collect())
}

/// The jobs of a unique call that were written (no duplicate's outcome
/// decided for them), with their ids.
fn written<'a>(
    decided: &'a [Option<Enqueued>],
    ids: &'a [i64],
    jobs: &'a [&'a PreparedJob],
) -> impl Iterator<Item = (i64, &'a PreparedJob)> + 'a {
    decided.iter().zip(ids.iter().zip(jobs)).filter(|(d, _)| d.is_none()).map(|(_, (id, j))| (*id, *j))
}

/// Binds the jobs' columns every write of prepared jobs sends first, in
/// `jobhost.insert_jobs`' order (`$1` to `$9`).
macro_rules! bind_job_columns {
    ($query:expr, $jobs:expr) => {
        $query
            .bind($jobs.iter().map(|j| j.job.as_str()).collect::<Vec<_>>())
            .bind($jobs.iter().map(|j| j.queue.as_str()).collect::<Vec<_>>())
            .bind($jobs.iter().map(|j| j.priority).collect::<Vec<_>>())
            .bind($jobs.iter().map(|j| Json(&j.payload)).collect::<Vec<_>>())
            .bind($jobs.iter().map(|j| j.max_attempts).collect::<Vec<_>>())
            .bind($jobs.iter().map(|j| j.run_at).collect::<Vec<_>>())
            .bind($jobs.iter().map(|j| j.delay_ms).collect::<Vec<_>>())
            .bind($jobs.iter().map(|j| j.concurrency_key.as_deref()).collect::<Vec<_>>())
            .bind($jobs.iter().map(|j| j.parent_id).collect::<Vec<_>>())
    };
}

/// Writes the jobs through the gate (with the given ids, or the
/// sequence's): `jobhost.insert_jobs`
/// (`functions/insert_jobs.sql`), each unique job with its attached key (its claim was
/// taken by [`super::unique::claim`] first). Returns their ids in input order.
async fn insert_rows(conn: &mut PgConnection, jobs: &[&PreparedJob], ids: Option<&[i64]>) -> Result<Vec<i64>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Option<i64>> = match ids {
        Some(ids) => ids.iter().copied().map(Some).collect(),
        None => vec![None; jobs.len()],
    };
    let planned = super::rate::plan(conn, jobs).await?;
    // None at all (a plain batch) is sent as NULL, not an array of them.
    let unique_keys: Vec<Option<&str>> = jobs.iter().map(|j| super::unique::attached_key(j)).collect();
    let unique_keys = unique_keys.iter().any(Option::is_some).then_some(unique_keys);
    bind_job_columns!(
        sqlx::query_scalar("SELECT jobhost.insert_jobs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"),
        jobs
    )
    .bind(ids)
    .bind(jobs.iter().map(|j| j.batch_id).collect::<Vec<_>>())
    .bind(planned)
    .bind(unique_keys)
    .fetch_one(&mut *conn)
    .await
    .map_err(super::concurrency::limit_reached)
}

/// Claims the jobs' keys and writes those that won theirs, or have none to
/// win, in one round trip: `jobhost.claim_and_insert_jobs`
/// (`functions/claim_and_insert_jobs.sql`), the two calls of the other path in one,
/// each written job with its attached key. Returns the ids and the
/// claimants as [`super::unique::claim`]'s call answers them. No job may be
/// rate-limited (none is planned here).
async fn claim_and_insert_rows(conn: &mut PgConnection, jobs: &[&PreparedJob]) -> Result<(Vec<i64>, Vec<Option<i64>>)> {
    bind_job_columns!(
        sqlx::query_as(
            "SELECT ids, claimants
             FROM jobhost.claim_and_insert_jobs($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, $11, $12)"
        ),
        jobs
    )
    .bind(jobs.iter().map(|j| j.batch_id).collect::<Vec<_>>())
    .bind(super::unique::keys(jobs))
    .bind(super::unique::while_executing(jobs))
    .fetch_one(&mut *conn)
    .await
    .map_err(super::concurrency::limit_reached)
}

pub async fn fetch(executor: impl sqlx::PgExecutor<'_>, params: &FetchParams) -> Result<Vec<FetchedJob>> {
    if params.limit <= 0 || params.job_types.is_empty() || params.queues.is_empty() {
        return Ok(Vec::new());
    }
    let (names, leases): (Vec<&str>, Vec<i32>) = params.job_types.iter().map(|(n, l)| (n.as_str(), *l)).unzip();
    // The statement lives in `functions/fetch.sql`; 0003_fetch_function.sql
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
    .fetch_all(executor)
    .await?;
    rows.iter().map(leased_job).collect()
}

/// A leased job from the columns of `jobhost.fetch` (or of `finish_runs`).
pub fn leased_job(row: &sqlx::postgres::PgRow) -> Result<FetchedJob> {
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

pub async fn promote_due(pool: &PgPool, now: Option<DateTime<Utc>>) -> Result<u64> {
    // The gate, for jobs that have waited out a delay or a backoff; see
    // jobhost.promote_due (`functions/promote_due.sql`). In a transaction of its
    // own: a failed single statement is answered before the server lets go
    // of its row locks, and the isolating sweep that follows a refusal
    // (SKIP LOCKED, on another connection) would pass over the very rows it
    // must sort out. A rollback is answered only once they are free.
    let mut tx = pool.begin().await?;
    let promoted = sqlx::query_scalar::<_, i32>("SELECT jobhost.promote_due(coalesce($1, now()), 5000)")
        .bind(now)
        .fetch_one(&mut *tx)
        .await
        .map(|promoted| promoted as u64)
        .map_err(Into::into);
    super::commit_or_roll_back(tx, promoted).await
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
pub async fn quarantine(pool: &PgPool, id: i64, reason: &str, keep_errors: bool) -> Result<bool> {
    let moved = sqlx::query(include_str!("sql/quarantine.sql"))
        .bind(id)
        .bind(reason)
        .bind(keep_errors)
        .execute(pool)
        .await?
        .rows_affected();
    Ok(moved == 1)
}

pub async fn archive_prune(pool: &PgPool, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
    // Finished batches go with the archive's retention, in bounded batches
    // too (workflows: `workflow_prune`).
    sqlx::query(
        "DELETE FROM jobhost.batches WHERE id IN (
             SELECT id FROM jobhost.batches
             WHERE finished_at < coalesce($1, now()) - $2 * interval '1 second'
             ORDER BY finished_at LIMIT $3)",
    )
    .bind(now)
    .bind(retention_secs)
    .bind(limit)
    .execute(pool)
    .await?;
    // Each job's trace context goes with it.
    let pruned: i64 = sqlx::query_scalar(
        "WITH gone AS (
             DELETE FROM jobhost.archive WHERE id IN (
                 SELECT id FROM jobhost.archive
                 WHERE finished_at < coalesce($1, now()) - $2 * interval '1 second'
                 ORDER BY finished_at LIMIT $3)
             RETURNING id),
         traces AS (DELETE FROM jobhost.job_traces t USING gone WHERE t.job_id = gone.id)
         SELECT count(*) FROM gone",
    )
    .bind(now)
    .bind(retention_secs)
    .bind(limit)
    .fetch_one(pool)
    .await?;
    Ok(pruned as u64)
}

#[async_trait]
impl JobDriver for PgStore {
    async fn job_fetch(&self, params: &FetchParams) -> Result<Vec<FetchedJob>> {
        fetch(&self.pool, params).await
    }

    async fn job_due_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
        due_ids(&self.pool, now, limit).await
    }

    async fn job_promote_due_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<u64> {
        promote_due_ids(&self.sweeps, now, ids).await
    }

    async fn job_promote_due(&self, now: Option<DateTime<Utc>>) -> Result<u64> {
        promote_due(&self.sweeps, now).await
    }

    async fn archive_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
        archive_prune(&self.sweeps, now, retention_secs, limit).await
    }

    async fn job_wait(&self, id: i64, timeout: Duration) -> Result<Option<JobDetail>> {
        super::wait::wait(&self.pool, &self.listeners, &self.announcements, id, timeout).await
    }

    async fn job_wait_available(&self, timeout: Duration) {
        self.listen().await;
        let _ = tokio::time::timeout(timeout, self.wake.notified()).await;
    }

    async fn job_next_due(&self) -> Result<Option<Duration>> {
        let secs: Option<f64> = sqlx::query_scalar(
            "SELECT greatest(extract(epoch FROM min(run_at) - now()), 0)::float8 FROM jobhost.jobs WHERE state = 'scheduled'",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(secs.map(Duration::from_secs_f64))
    }

    async fn job_wait_sent_back(&self, timeout: Duration) {
        self.listen().await;
        let _ = tokio::time::timeout(timeout, self.due.notified()).await;
    }
}
