//! The embedded backend: one SQLite file in WAL mode, shared by the host
//! processes of one machine.
//!
//! SQLite has neither `FOR UPDATE SKIP LOCKED` nor `LISTEN/NOTIFY`. What
//! stands in for them:
//! - **One writer at a time.** Every write runs in a `BEGIN IMMEDIATE`
//!   transaction, which takes the file's write lock before reading, so a
//!   transaction's reads cannot go stale before it writes. Within a process
//!   writes queue on a single writer connection; across processes a writer
//!   finding the file locked asks again every millisecond, up to the busy
//!   timeout. The gate, the release and the sweep are therefore plain
//!   read-then-write code: nothing can change under them.
//! - **Wake-ups.** Writes that make jobs available wake this process's
//!   fetch loop directly. Other processes' commits wake it through the file
//!   system's report of a write to the `-wal` file (`commits`), after which
//!   it waits for `PRAGMA data_version` to show the commit; where the file
//!   system reports nothing, an idle host reads `data_version` every 100 ms
//!   on a connection of its own.
//! - **Deferred work at commit.** Where PostgreSQL decides a batch's end
//!   in a deferred trigger, every write here settles finished batches (their
//!   callbacks) just before it commits (`Write::commit`, `batch::settle`),
//!   except a result write that archived no batch member and enqueued
//!   nothing: it cannot have finished a batch.
//!
//! Times are milliseconds since the Unix epoch, from this machine's clock
//! (every process sharing the file shares the clock).

mod batch;
mod commits;
mod concurrency;
mod connect;
mod deploy;
mod encode;
mod finish;
mod grant;
mod host;
mod job;
mod lease;
mod membership;
mod operate;
mod schedule;
mod secret;
mod session;
mod unique;
mod variable;
mod write;

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use tokio::sync::Notify;

use super::batch::{Batch, PreparedBatch};
use super::enqueue::{Configs, PreparedJob};
use super::finish::{FinishPlan, Written};
use super::lease::Expired;
use super::schedule::{Schedules, TickWrite};
use super::session::SessionLifetime;
use super::{
    Backend, Cancel, DeployChange, DeployRequest, Deployment, DeploymentEntry, EnqueueLimits, Enqueued, Error,
    FetchParams, FetchedJob, HostInfo, JobDetail, JobFilter, JobRow, KeyCursor, KeyPage, KeyStatus, LeaseRenew,
    LeaseRenewal, Result, RunId, SemaphoreFix, Stats, Store,
};
use crate::types::JobConfig;
use commits::UNSEEN;
pub use connect::WAL_SIZE_LIMIT;
use encode::{iso, json_list, ms_or_now, now_ms, time_of};
use write::{Write, while_locked};

/// How often a host serving deployed components looks for a change.
const DEPLOYMENT_LOOK: Duration = Duration::from_millis(500);

/// A SQLite file holding the jobhost tables.
#[derive(Clone)]
pub struct SqliteStore {
    /// One connection: this process's writes queue here, not on the file
    /// lock. It does not wait inside SQLite for a busy lock; [`Self::write`]
    /// retries instead.
    writer: SqlitePool,
    /// Options with the busy timeout, for connections other than the writer.
    options: SqliteConnectOptions,
    /// Reads (listings, stats, the fetch's cheap "anything to do?" check).
    reader: SqlitePool,
    /// One connection whose `data_version` shows other connections' commits.
    watch: SqlitePool,
    /// The data version `job_wait_available` last saw.
    seen_version: Arc<AtomicI64>,
    /// This process's writes that made jobs available, after their commit.
    wake: Arc<Notify>,
    /// Writes to the `-wal` file, reported before the commit may show.
    logged: Arc<Notify>,
    /// Reports writes to the `-wal` file; `None` where that is not possible.
    _commits: Option<Arc<notify::RecommendedWatcher>>,
    /// What every enqueue through this store may carry.
    limits: EnqueueLimits,
}

impl SqliteStore {
    /// Opens (creating if need be) the file a `sqlite://PATH` URL names,
    /// with at most `max_connections` reading connections.
    ///
    /// # Errors
    /// The URL is invalid or the file cannot be opened.
    pub async fn open(url: &str, max_connections: u32) -> Result<Self> {
        Self::connect(url, max_connections, true).await
    }

    /// [`Self::open`] for a file that must exist already: it is never created.
    ///
    /// # Errors
    /// [`Error::DatabaseMissing`] when the file does not exist; as [`Self::open`].
    pub async fn open_existing(url: &str, max_connections: u32) -> Result<Self> {
        Self::connect(url, max_connections, false).await
    }

    /// Holds every enqueue through this store to `limits`.
    pub fn with_limits(self, limits: EnqueueLimits) -> Self {
        SqliteStore { limits, ..self }
    }

    /// A pool for tests that check invariants, or edit rows, with their own SQL.
    pub fn pool(&self) -> &SqlitePool {
        &self.reader
    }

    /// A write transaction holding the file's write lock from its first
    /// statement, waiting up to the busy timeout for another process to
    /// release it.
    ///
    /// A write that SQLite rolled back by itself (on a full disk, an I/O
    /// error) leaves the driver counting a transaction that no longer
    /// exists, and it would refuse every later `BEGIN` on that connection,
    /// stopping every write of this process for good: that connection is
    /// closed and the next one starts clean.
    async fn write(&self) -> Result<Write> {
        let tx = while_locked(|| async {
            match self.writer.begin_with("BEGIN IMMEDIATE").await {
                Err(sqlx::Error::InvalidSavePointStatement) => {
                    tracing::warn!("the writer lost track of a transaction SQLite rolled back; reconnecting");
                    self.writer.acquire().await?.close().await?;
                    Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
                }
                begun => Ok(begun?),
            }
        })
        .await?;
        Ok(Write { tx, limits: self.limits, wake: self.wake.clone() })
    }

    /// Runs `write` in a write transaction and commits it (settling the
    /// batches it finished): the shape of most writes.
    async fn write_with<T>(&self, write: impl AsyncFnOnce(&mut Write) -> Result<T>) -> Result<T> {
        self.write_committing(true, write).await
    }

    /// [`Self::write_with`] for a write that touches no job (a session, a
    /// grant, a secret): it cannot finish a batch, so none is looked for.
    async fn write_outside_jobs<T>(&self, write: impl AsyncFnOnce(&mut Write) -> Result<T>) -> Result<T> {
        self.write_committing(false, write).await
    }

    async fn write_committing<T>(
        &self,
        may_finish_batch: bool,
        write: impl AsyncFnOnce(&mut Write) -> Result<T>,
    ) -> Result<T> {
        let mut tx = self.write().await?;
        let done = write(&mut tx).await?;
        tx.commit_settling(may_finish_batch).await?;
        Ok(done)
    }

    /// Wakes this process's idle fetch loop.
    fn announce(&self, any_available: bool) {
        if any_available {
            self.wake.notify_one();
        }
    }
}

/// The versions of the migrations the file records as applied (none on a new file).
async fn applied_migrations(pool: &SqlitePool) -> Result<Vec<i64>> {
    let recorded: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations')",
    )
    .fetch_one(pool)
    .await?;
    if !recorded {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_scalar("SELECT version FROM _sqlx_migrations").fetch_all(pool).await?)
}

#[async_trait]
impl Backend for SqliteStore {
    fn limits(&self) -> &EnqueueLimits {
        &self.limits
    }

    async fn configs_read(&self, names: &[String]) -> Result<Configs> {
        host::job_types_get(&self.reader, names).await
    }

    async fn jobs_write(&self, jobs: Vec<PreparedJob>) -> Result<Vec<Enqueued>> {
        let enqueued =
            self.write_with(async |tx| job::insert(tx, &jobs.iter().collect::<Vec<_>>(), now_ms()).await).await?;
        self.announce(enqueued.iter().any(|e| matches!(e, Enqueued::New(_) | Enqueued::Replaced(_))));
        Ok(enqueued)
    }

    async fn batch_write(&self, batch: PreparedBatch) -> Result<(i64, Vec<Enqueued>)> {
        let written = self.write_with(async |tx| batch::write(tx, batch, now_ms()).await).await?;
        self.announce(written.1.iter().any(|e| matches!(e, Enqueued::New(_))));
        Ok(written)
    }

    async fn plan_write(&self, plan: &FinishPlan, next: Option<&FetchParams>) -> Result<Written> {
        let mut tx = self.write().await?;
        let wrote = finish::write(&mut tx, plan, next, now_ms()).await?;
        tx.commit_settling(wrote.may_finish_batch).await?;
        self.announce(wrote.any_available);
        Ok(wrote.written)
    }

    async fn ticks_write(&self, write: TickWrite) -> Result<Option<Vec<Enqueued>>> {
        let written = self.write_with(async |tx| schedule::write(tx, &write, now_ms()).await).await?;
        let available = |e: &Enqueued| matches!(e, Enqueued::New(_) | Enqueued::Replaced(_));
        self.announce(written.as_ref().is_some_and(|written| written.iter().any(available)));
        Ok(written)
    }

    async fn quarantine_write(&self, id: i64, reason: &str, keep_errors: bool) -> Result<bool> {
        self.write_with(async |tx| job::quarantine(tx, id, reason, keep_errors, now_ms()).await).await
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn location(&self) -> String {
        let file = self.options.get_filename();
        let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
        format!("sqlite://{}", file.display())
    }

    async fn schema_migrate(&self) -> Result<()> {
        // Processes starting on one file may try the same migration at
        // once; the loser's fails on what the winner made, and a later run
        // finds it recorded as applied. Each migration can be lost once, so
        // one run more than there are migrations always gets through.
        // Any of them may also find the file locked by another.
        let migrator = sqlx::migrate!("./migrations/sqlite");
        let pool = while_locked(|| async {
            Ok(SqlitePoolOptions::new().max_connections(1).connect_with(self.options.clone()).await?)
        })
        .await?;
        let runs = migrator.iter().count() + 1;
        let migrated = while_locked(|| async {
            super::schema::check_known(&applied_migrations(&pool).await?, &migrator)?;
            for _ in 1..runs {
                if migrator.run(&pool).await.is_ok() {
                    return Ok(());
                }
            }
            Ok(migrator.run(&pool).await?)
        })
        .await;
        pool.close().await;
        migrated
    }

    async fn job_types_register(&self, types: &[(JobConfig, String)]) -> Result<()> {
        let (changed, promoted) = self.write_with(async |tx| host::job_types_register(tx, types).await).await?;
        if promoted > 0 {
            tracing::info!(promoted, job_types = ?changed, "a new limit promoted blocked jobs");
        }
        self.announce(promoted > 0);
        Ok(())
    }

    async fn job_types_names(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar("SELECT name FROM job_types ORDER BY name").fetch_all(&self.reader).await?)
    }

    async fn host_upsert(&self, info: &HostInfo) -> Result<()> {
        self.write_with(async |tx| host::host_upsert(tx, info).await).await
    }

    async fn host_list(&self) -> Result<Vec<crate::store::HostRow>> {
        host::host_list(&self.reader, now_ms()).await
    }

    async fn job_types_list(&self) -> Result<Vec<crate::store::JobTypeRow>> {
        host::job_types_list(&self.reader).await
    }

    async fn job_finished_since(&self, secs: f64) -> Result<std::collections::BTreeMap<crate::store::JobState, i64>> {
        host::finished_since(&self.reader, now_ms(), secs).await
    }

    async fn host_remove(&self, host_id: &str) -> Result<()> {
        self.write_with(async |tx| host::host_remove(tx, host_id).await).await
    }

    async fn host_prune(&self, silent_secs: f64) -> Result<u64> {
        self.write_with(async |tx| host::host_prune(tx, silent_secs).await).await
    }

    async fn job_fetch(&self, params: &FetchParams) -> Result<Vec<FetchedJob>> {
        // Taking the write lock only when there is something to take keeps
        // idle hosts from queueing behind busy ones.
        if !job::any_available(&self.reader, params).await? {
            return Ok(Vec::new());
        }
        self.write_with(async |tx| job::fetch(tx, params, now_ms()).await).await
    }

    async fn lease_started(&self, runs: &[RunId]) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        self.write_with(async |tx| lease::started(tx, runs, now_ms()).await).await
    }

    async fn lease_renew(&self, renew: &LeaseRenew<'_>) -> Result<LeaseRenewal> {
        let mut renewal = LeaseRenewal::default();
        if !renew.runs.is_empty() {
            let mut tx = self.write().await?;
            renewal = lease::renew(&mut tx, renew, now_ms()).await?;
            tx.commit_settling(false).await?;
        }
        renewal.strays = lease::strays(&self.reader, renew.host_id, renew.runs).await?;
        Ok(renewal)
    }

    async fn lease_expire(&self, now: Option<DateTime<Utc>>) -> Result<(u64, u64)> {
        let (requeued, failed) = self.write_with(async |tx| lease::expire(tx, ms_or_now(now), None).await).await?;
        self.announce(requeued > 0);
        Ok(Expired { requeued, failed, held_back: 0 }.logged())
    }

    async fn job_promote_due(&self, now: Option<DateTime<Utc>>) -> Result<u64> {
        let (due, admitted) = self.write_with(async |tx| job::promote_due(tx, ms_or_now(now), None).await).await?;
        self.announce(admitted > 0);
        Ok(due)
    }

    async fn job_due_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
        let mut conn = self.reader.acquire().await?;
        job::due_ids(&mut conn, ms_or_now(now), limit).await
    }

    async fn job_promote_due_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<u64> {
        let (due, admitted) = self.write_with(async |tx| job::promote_due(tx, ms_or_now(now), Some(ids)).await).await?;
        self.announce(admitted > 0);
        Ok(due)
    }

    async fn lease_expired_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
        let mut conn = self.reader.acquire().await?;
        lease::expired_ids(&mut conn, ms_or_now(now), limit).await
    }

    async fn lease_expire_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<(u64, u64)> {
        let (requeued, failed) = self.write_with(async |tx| lease::expire(tx, ms_or_now(now), Some(ids)).await).await?;
        self.announce(requeued > 0);
        Ok(Expired { requeued, failed, held_back: 0 }.logged())
    }

    async fn blocked_promote(&self, after: Option<&KeyCursor>, max_keys: i64) -> Result<KeyPage<u64>> {
        let page = crate::store::concurrency::promote_blocked(self, after, max_keys).await?;
        self.announce(page.done > 0);
        Ok(page)
    }

    async fn semaphore_repair_page(
        &self,
        after: Option<&KeyCursor>,
        max_keys: i64,
    ) -> Result<KeyPage<Vec<SemaphoreFix>>> {
        let page = self.write_with(async |tx| concurrency::repair(tx, after, max_keys, now_ms()).await).await?;
        Ok(crate::store::concurrency::logged_repairs(page))
    }

    async fn semaphore_list(&self) -> Result<Vec<KeyStatus>> {
        concurrency::status(&self.reader, now_ms()).await
    }

    async fn semaphore_free_slots(&self, job: &str, key: &str) -> Result<i64> {
        let mut conn = self.reader.acquire().await?;
        concurrency::free_slots(&mut conn, job, key).await
    }

    async fn archive_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
        let mut tx = self.write().await?;
        let now = ms_or_now(now);
        let pruned = job::archive_prune(&mut tx, now, retention_secs, limit).await?;
        batch::prune(&mut tx, now - (retention_secs * 1000.0) as i64, limit).await?;
        tx.commit().await?;
        Ok(pruned)
    }

    async fn job_list(&self, filter: &JobFilter) -> Result<Vec<JobRow>> {
        operate::list(&self.reader, filter).await
    }

    async fn job_get(&self, id: i64) -> Result<Option<JobDetail>> {
        operate::get(&self.reader, id).await
    }

    async fn job_stats(&self) -> Result<Stats> {
        let now = now_ms();
        let stats = operate::stats(&self.reader, now).await?;
        Ok(crate::store::host::with_fleet_warnings(stats, host::host_health(&self.reader, now).await?))
    }

    async fn database_ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn job_retry(&self, id: i64) -> Result<()> {
        self.write_with(async |tx| operate::retry(tx, id, now_ms()).await).await?;
        self.announce(true);
        Ok(())
    }

    async fn job_cancel(&self, id: i64) -> Result<Cancel> {
        let promoted = self.write_with(async |tx| operate::cancel(tx, id, now_ms()).await).await?;
        self.announce(promoted.is_some_and(|n| n > 0));
        Ok(if promoted.is_some() { Cancel::Cancelled } else { Cancel::Requested })
    }

    async fn queue_pause(&self, queue: &str) -> Result<bool> {
        let mut tx = self.write().await?;
        let paused = sqlx::query("INSERT INTO queue_pauses (name, paused_at) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(queue)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(paused.rows_affected() == 1)
    }

    async fn queue_resume(&self, queue: &str) -> Result<bool> {
        let mut tx = self.write().await?;
        let resumed = sqlx::query("DELETE FROM queue_pauses WHERE name = $1").bind(queue).execute(&mut *tx).await?;
        tx.commit().await?;
        // Idle hosts wait for a wake-up; the queue's jobs are ready now.
        self.announce(true);
        Ok(resumed.rows_affected() == 1)
    }

    async fn batch_close(&self, id: i64) -> Result<bool> {
        self.write_with(async |tx| batch::close(tx, id, now_ms()).await).await
    }

    async fn batch_get(&self, id: i64) -> Result<Option<Batch>> {
        Ok(batch::list(&self.reader, Some(id), 1).await?.pop())
    }

    async fn batch_list(&self, limit: i64) -> Result<Vec<Batch>> {
        batch::list(&self.reader, None, limit).await
    }

    async fn job_wait(&self, id: i64, timeout: Duration) -> Result<Option<JobDetail>> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut seen = UNSEEN;
        loop {
            match operate::get(&self.reader, id).await? {
                None => return Err(Error::NotFound { id }),
                Some(job) if job.row.state.is_final() => return Ok(Some(job)),
                Some(_) => {}
            }
            if !self.wait_for_commit(&mut seen, deadline).await {
                return Ok(None);
            }
        }
    }

    async fn schedule_list(&self, now: Option<DateTime<Utc>>) -> Result<Schedules> {
        let schedules = schedule::list(&self.reader, now_ms()).await?;
        Ok(Schedules { now: now.unwrap_or_else(|| time_of(now_ms())), schedules })
    }

    async fn session_create(&self, digest: &str, lifetime: SessionLifetime) -> Result<()> {
        self.write_outside_jobs(async |tx| session::create(tx, digest, lifetime, now_ms()).await).await
    }

    async fn session_check(&self, digest: &str, lifetime: SessionLifetime) -> Result<bool> {
        let now = now_ms();
        let Some(stale) = session::check(&self.reader, digest, lifetime, now).await? else {
            return Ok(false);
        };
        if stale {
            self.write_outside_jobs(async |tx| session::touch(tx, digest, now).await).await?;
        }
        Ok(true)
    }

    async fn session_revoke(&self, digest: &str) -> Result<()> {
        self.write_outside_jobs(async |tx| session::revoke(tx, digest).await).await
    }

    async fn grant_set(&self, new: &crate::store::grant::NewGrant) -> Result<bool> {
        self.write_outside_jobs(async |tx| grant::set(tx, new, now_ms()).await).await
    }

    async fn grant_revoke(&self, job_type: &str, origin: &str) -> Result<bool> {
        self.write_outside_jobs(async |tx| grant::revoke(tx, job_type, origin).await).await
    }

    async fn grants(&self, job_type: Option<&str>) -> Result<Vec<crate::store::grant::OutboundGrant>> {
        grant::list(&self.reader, job_type).await
    }

    async fn secret_set(&self, name: &str, sealed: &crate::store::secret::Sealed) -> Result<bool> {
        self.write_outside_jobs(async |tx| secret::set(tx, name, sealed, now_ms()).await).await
    }

    async fn secret_delete(&self, name: &str) -> Result<bool> {
        self.write_outside_jobs(async |tx| secret::delete(tx, name).await).await
    }

    async fn secrets_list(&self) -> Result<Vec<crate::store::secret::SecretInfo>> {
        secret::list(&self.reader).await
    }

    async fn secrets_sealed(&self, names: &[String]) -> Result<Vec<(String, crate::store::secret::Sealed)>> {
        secret::sealed(&self.reader, names).await
    }

    async fn var_set(&self, job_type: &str, name: &str, value: &str) -> Result<bool> {
        let replaced =
            self.write_outside_jobs(async |tx| variable::set(tx, job_type, name, value, now_ms()).await).await?;
        Ok(replaced)
    }

    async fn var_unset(&self, job_type: &str, name: &str) -> Result<bool> {
        self.write_outside_jobs(async |tx| variable::unset(tx, job_type, name).await).await
    }

    async fn vars(&self, job_type: Option<&str>) -> Result<Vec<crate::store::variable::TypeVariable>> {
        variable::list(&self.reader, job_type).await
    }

    async fn schedule_looked(&self, jobs: &[String], at: DateTime<Utc>) -> Result<()> {
        self.write_outside_jobs(async |tx| schedule::looked(tx, jobs, at.timestamp_millis()).await).await?;
        Ok(())
    }

    async fn deployment_change(&self, job_type: &str, request: DeployRequest<'_>) -> Result<DeployChange> {
        let (change, promoted) = self.write_with(async |tx| deploy::apply(tx, job_type, request).await).await?;
        self.announce(promoted > 0);
        Ok(change)
    }

    async fn deployments_current(&self) -> Result<Vec<Deployment>> {
        deploy::current(&self.reader).await
    }

    async fn deployment_history(&self, job_type: &str) -> Result<Vec<DeploymentEntry>> {
        deploy::history_in(&self.reader, job_type).await
    }

    async fn component_source(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        deploy::source(&self.reader, digest).await
    }

    async fn deployments_wait(&self, timeout: Duration) {
        // Another process's change shows only by looking; the look is one
        // indexed read of the newest entry.
        tokio::time::sleep(timeout.min(DEPLOYMENT_LOOK)).await;
    }

    async fn job_wait_available(&self, timeout: Duration) {
        self.wait_available(timeout).await;
    }
}
