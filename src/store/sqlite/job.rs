//! Inserting prepared jobs, fetching them, and moving them between the
//! queue's states (due, quarantined, pruned), in SQLite.
//!
//! Every function taking a connection runs inside the caller's `BEGIN
//! IMMEDIATE` transaction, so it reads and writes with the write lock held.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::sqlite::SqliteRow;
use sqlx::types::Json;
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::{ms_or_now, now_ms};
use super::unique::{self, Decision};
use super::{concurrency, rate};
use super::{json_list, time_of};
use crate::store::JobDetail;
use crate::store::driver::JobDriver;
use crate::store::enqueue::PreparedUnique;
use crate::store::{Enqueued, Error, FetchParams, FetchedJob, PreparedJob, Result};

/// A new job's row, as the insert statements of `sql/` read it.
#[derive(Serialize)]
struct NewJob<'a> {
    id: i64,
    job: &'a str,
    queue: &'a str,
    priority: i16,
    payload: &'a serde_json::Value,
    state: &'static str,
    max_attempts: i32,
    run_at: i64,
    concurrency_key: Option<&'a str>,
    parent_id: Option<i64>,
    batch_id: Option<i64>,
    /// The error entry of a job the gate discards (its key's reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    discarded: Option<serde_json::Value>,
}

/// New jobs sorted by where the gate sends them, each written once.
#[derive(Default)]
struct Placed<'a> {
    ids: Vec<i64>,
    jobs: Vec<NewJob<'a>>,
    blocked: Vec<NewJob<'a>>,
    discarded: Vec<NewJob<'a>>,
}

/// Writes a batch of jobs with the gate decided before they are written, in
/// the caller's transaction; outcomes come back in input order (a blocked
/// or discarded job keeps its id). Unique jobs are decided first, so a
/// duplicate is never stored. A limited job due now that gets a slot goes
/// into `jobs` as available; one that does not goes straight into
/// `blocked_jobs` (or the archive, for `discard`), instead of being
/// inserted into `jobs` and moved.
pub async fn insert(conn: &mut SqliteConnection, jobs: &[&PreparedJob], now: i64) -> Result<Vec<Enqueued>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let decisions = unique::decide(conn, jobs, now).await?;
    let fresh: Vec<&PreparedJob> =
        jobs.iter().zip(&decisions).filter(|(_, d)| **d == Decision::Insert).map(|(j, _)| *j).collect();
    super::membership::add_members(conn, &fresh).await?;
    let placed = place(conn, &fresh, now).await?;
    write(conn, include_str!("sql/insert.sql"), &placed.jobs, now).await?;
    write(conn, include_str!("sql/insert_blocked.sql"), &placed.blocked, now).await?;
    // Before the discarded jobs go to the archive, which takes their keys
    // with them.
    let keyed: Vec<(i64, &str, &PreparedUnique)> = placed
        .ids
        .iter()
        .zip(&fresh)
        .filter_map(|(id, job)| job.unique.as_ref().map(|u| (*id, job.job.as_str(), u)))
        .collect();
    unique::record(conn, &keyed, now).await?;
    super::trace::record(conn, placed.ids.iter().copied().zip(fresh.iter().copied())).await?;
    write(conn, include_str!("sql/insert_discarded.sql"), &placed.discarded, now).await?;
    let mut fresh_ids = placed.ids.into_iter();
    let mut outcomes: Vec<Enqueued> = Vec::with_capacity(jobs.len());
    for decision in decisions {
        outcomes.push(match decision {
            Decision::Insert => Enqueued::New(fresh_ids.next().ok_or_else(|| Error::Decode("an id short".into()))?),
            Decision::Decided(outcome) => outcome,
            Decision::DuplicateOf(earlier) => Enqueued::Duplicate(outcomes[earlier].id()),
        });
    }
    Ok(outcomes)
}

/// Gives the jobs ids in input order and their due times, and passes the
/// limited ones due now through the gate (taking their slots): each job's
/// row, in the table it belongs in.
async fn place<'a>(conn: &mut SqliteConnection, jobs: &[&'a PreparedJob], now: i64) -> Result<Placed<'a>> {
    if jobs.is_empty() {
        return Ok(Placed::default());
    }
    let planned = rate::plan(conn, jobs, now).await?;
    let first_id = take_job_ids(conn, jobs.len() as i64).await?;
    let rows: Vec<NewJob> = jobs
        .iter()
        .zip(planned)
        .zip(first_id..)
        .map(|((j, planned), id)| {
            let due = j.run_at.map_or(now.saturating_add(j.delay_ms), |at| at.timestamp_millis());
            let due = due.max(planned.unwrap_or(due));
            NewJob {
                id,
                job: &j.job,
                queue: &j.queue,
                priority: j.priority,
                payload: &j.payload,
                state: if due > now { "scheduled" } else { "available" },
                max_attempts: j.max_attempts,
                run_at: due.max(now),
                concurrency_key: j.concurrency_key.as_deref(),
                parent_id: j.parent_id,
                batch_id: j.batch_id,
                discarded: None,
            }
        })
        .collect();
    // The limited jobs due now, by key, each key's in priority then arrival
    // (id) order: their run_at is now for all.
    let mut gated: Vec<(&str, &str, i16, i64)> = rows
        .iter()
        .filter(|r| r.state == "available")
        .filter_map(|r| r.concurrency_key.map(|key| (r.job, key, r.priority, r.id)))
        .collect();
    gated.sort_unstable();
    let mut keys: BTreeMap<(String, String), Vec<i64>> = BTreeMap::new();
    for (job, key, _, id) in gated {
        keys.entry((job.to_owned(), key.to_owned())).or_default().push(id);
    }
    let mut placed = Placed { ids: rows.iter().map(|r| r.id).collect(), ..Placed::default() };
    if keys.is_empty() {
        placed.jobs = rows;
        return Ok(placed);
    }
    let verdict = concurrency::decide(conn, &keys, true).await?;
    concurrency::record_holders(conn, &verdict.holders, now).await?;
    let blocked: HashSet<i64> = verdict.blocked.iter().copied().collect();
    let mut discarded: HashMap<i64, String> = verdict.discarded.into_iter().collect();
    for mut row in rows {
        if blocked.contains(&row.id) {
            placed.blocked.push(row);
        } else if let Some(reason) = discarded.remove(&row.id) {
            row.discarded = Some(serde_json::json!({ "attempt": 0, "at": super::iso(now), "error": reason }));
            placed.discarded.push(row);
        } else {
            placed.jobs.push(row);
        }
    }
    Ok(placed)
}

/// Writes rows with one of the insert statements of `sql/`.
async fn write(conn: &mut SqliteConnection, statement: &'static str, rows: &[NewJob<'_>], now: i64) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(statement).bind(json_list(rows)).bind(now).execute(&mut *conn).await?;
    Ok(())
}

/// Takes `count` job ids, the first returned, from `jobs`' AUTOINCREMENT
/// counter, for rows written with their ids (into `jobs`, `blocked_jobs`
/// or the archive): no job ever gets them again.
pub(super) async fn take_job_ids(conn: &mut SqliteConnection, count: i64) -> Result<i64> {
    let last: Option<i64> =
        sqlx::query_scalar("UPDATE sqlite_sequence SET seq = seq + $1 WHERE name = 'jobs' RETURNING seq")
            .bind(count)
            .fetch_optional(&mut *conn)
            .await?;
    if let Some(last) = last {
        return Ok(last - count + 1);
    }
    // No job was ever inserted through the counter: start after every id a
    // job has (one could have been written with its id).
    let first: i64 = sqlx::query_scalar(
        "SELECT 1 + max(coalesce((SELECT max(id) FROM jobs), 0), coalesce((SELECT max(id) FROM archive), 0),
                        coalesce((SELECT max(id) FROM blocked_jobs), 0))",
    )
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', $1)")
        .bind(first + count - 1)
        .execute(&mut *conn)
        .await?;
    Ok(first)
}

/// Whether any job a fetch with `params` could take is available: a read
/// that needs no write lock.
pub async fn any_available(pool: &SqlitePool, params: &FetchParams) -> Result<bool> {
    if params.limit <= 0 || params.job_types.is_empty() || params.queues.is_empty() {
        return Ok(false);
    }
    let names: Vec<&str> = params.job_types.iter().map(|(name, _)| name.as_str()).collect();
    // What the fetch would pass over (a paused queue, a `while_executing`
    // key a run holds) does not count, or an idle host would take the
    // write lock for nothing at every look.
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM jobs j
                        LEFT JOIN unique_keys k ON k.job_id = j.id AND k.while_executing
                        WHERE j.state = 'available'
                          AND j.job IN (SELECT value FROM json_each($1))
                          AND j.queue IN (SELECT value FROM json_each($2))
                          AND j.queue NOT IN (SELECT name FROM queue_pauses)
                          AND NOT EXISTS (SELECT 1 FROM unique_claims c
                                          WHERE c.job = k.job AND c.unique_key = k.unique_key))",
    )
    .bind(json_list(&names))
    .bind(json_list(&params.queues))
    .fetch_one(pool)
    .await?)
}

/// Leases up to `params.limit` jobs to the fetching host (see sql/fetch.sql),
/// after the rate check when a type it serves is rate governed. Returns the
/// leased jobs and how many picked jobs were sent back to wait for a start.
pub async fn fetch(conn: &mut SqliteConnection, params: &FetchParams, now: i64) -> Result<(Vec<FetchedJob>, u64)> {
    if params.limit <= 0 || params.job_types.is_empty() || params.queues.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let names: Vec<String> = params.job_types.iter().map(|(name, _)| name.clone()).collect();
    let (only, sent_back) = if rate::governed(conn, &names, now).await? {
        let (leasable, sent_back) = rate::admit(conn, params, now).await?;
        if leasable.is_empty() {
            return Ok((Vec::new(), sent_back));
        }
        (Some(json_list(&leasable)), sent_back)
    } else {
        (None, 0)
    };
    let rows = sqlx::query(include_str!("sql/fetch.sql"))
        .bind(json_list(&params.job_types))
        .bind(json_list(&params.queues))
        .bind(params.limit)
        .bind(&params.host_id)
        .bind(now)
        .bind(only)
        .fetch_all(&mut *conn)
        .await?;
    let mut runs: Vec<(i64, i64)> = Vec::new();
    let mut jobs = Vec::with_capacity(rows.len());
    for row in &rows {
        let job = leased_job(row)?;
        if row.try_get::<bool, _>("while_executing")? {
            runs.push((job.id, job.lease_token));
        }
        jobs.push(job);
    }
    jobs.sort_by_key(|j| j.lease_token);
    unique::claim_runs(conn, &runs, now).await?;
    Ok((jobs, sent_back))
}

pub fn leased_job(row: &SqliteRow) -> Result<FetchedJob> {
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

/// Deletes archived jobs and batches that finished before the retention
/// began, at most `limit` of each (workflows: `workflow_prune`). Returns how
/// many jobs.
pub async fn archive_prune(conn: &mut SqliteConnection, now: i64, retention_secs: f64, limit: i64) -> Result<u64> {
    let cutoff = now - (retention_secs * 1000.0) as i64;
    // Each job's trace context goes with it (the same rows: the oldest first).
    sqlx::query(
        "DELETE FROM job_traces WHERE job_id IN (
             SELECT id FROM archive WHERE finished_at < $1 ORDER BY finished_at LIMIT $2)",
    )
    .bind(cutoff)
    .bind(limit)
    .execute(&mut *conn)
    .await?;
    let pruned = sqlx::query(
        "DELETE FROM archive WHERE id IN (
             SELECT id FROM archive WHERE finished_at < $1 ORDER BY finished_at LIMIT $2)",
    )
    .bind(cutoff)
    .bind(limit)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    sqlx::query(
        "DELETE FROM batches WHERE id IN (
             SELECT id FROM batches WHERE finished_at < $1 ORDER BY finished_at LIMIT $2)",
    )
    .bind(cutoff)
    .bind(limit)
    .execute(&mut *conn)
    .await?;
    Ok(pruned)
}

#[async_trait]
impl JobDriver for SqliteStore {
    async fn job_fetch(&self, params: &FetchParams) -> Result<Vec<FetchedJob>> {
        // Taking the write lock only when there is something to take keeps
        // idle hosts from queueing behind busy ones.
        if !any_available(&self.reader, params).await? {
            return Ok(Vec::new());
        }
        let (jobs, sent_back) = self.write_with(async |tx| fetch(tx, params, now_ms()).await).await?;
        self.announce_due(sent_back);
        Ok(jobs)
    }

    async fn job_promote_due(&self, now: Option<DateTime<Utc>>) -> Result<u64> {
        let (due, admitted) = self.write_with(async |tx| promote_due(tx, ms_or_now(now), None).await).await?;
        self.announce(admitted > 0);
        Ok(due)
    }

    async fn job_due_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
        let mut conn = self.reader.acquire().await?;
        due_ids(&mut conn, ms_or_now(now), limit).await
    }

    async fn job_promote_due_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<u64> {
        let (due, admitted) = self.write_with(async |tx| promote_due(tx, ms_or_now(now), Some(ids)).await).await?;
        self.announce(admitted > 0);
        Ok(due)
    }

    async fn archive_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
        self.write_with(async |tx| archive_prune(tx, ms_or_now(now), retention_secs, limit).await).await
    }

    async fn job_wait(&self, id: i64, timeout: Duration) -> Result<Option<JobDetail>> {
        let deadline = tokio::time::Instant::now() + timeout;
        // Read before the first look: a job that ends between the look and
        // the wait then shows as a commit since `seen`.
        let mut seen = self.data_version().await;
        loop {
            match super::operate::get(&self.reader, id).await? {
                None => return Err(Error::NotFound { id }),
                Some(job) if job.row.state.is_final() => return Ok(Some(job)),
                Some(_) => {}
            }
            if !self.wait_for_commit(&mut seen, deadline).await {
                return Ok(None);
            }
        }
    }

    async fn job_wait_available(&self, timeout: Duration) {
        self.wait_available(timeout).await;
    }

    async fn job_next_due(&self) -> Result<Option<Duration>> {
        let due: Option<i64> = sqlx::query_scalar("SELECT min(run_at) FROM jobs WHERE state = 'scheduled'")
            .fetch_one(&self.reader)
            .await?;
        Ok(due.map(|at| Duration::from_millis(at.saturating_sub(now_ms()).max(0) as u64)))
    }

    async fn job_wait_sent_back(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.due.notified()).await;
    }
}
