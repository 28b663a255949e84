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
mod deploy;
mod finish;
mod grant;
mod host;
mod job;
mod lease;
mod operate;
mod schedule;
mod secret;
mod session;
mod unique;
mod variable;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Sqlite, Transaction};
use tokio::sync::Notify;

use super::batch::{Batch, PreparedBatch};
use super::enqueue::{Configs, PreparedJob};
use super::finish::{FinishPlan, Written};
use super::schedule::{Schedules, TickWrite};
use super::session::SessionLifetime;
use super::{
    Backend, Cancel, DeployChange, DeployRequest, Deployment, DeploymentEntry, EnqueueLimits, Enqueued, Error,
    FetchParams, FetchedJob, HostInfo, JobDetail, JobFilter, JobRow, KeyCursor, KeyPage, KeyStatus, LeaseRenew,
    LeaseRenewal, Result, RunId, SemaphoreFix, Stats, Store,
};
use crate::types::JobConfig;

/// How often a host serving deployed components looks for a change.
const DEPLOYMENT_LOOK: Duration = Duration::from_millis(500);

/// How long a write waits for another process's write lock before failing
/// (the failure is retried like any transient database error).
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a write waiting for the lock tries again. SQLite's own busy
/// handler backs off to sleeps of 5, 10, 25 ms and more, far longer than a
/// jobhost transaction holds the lock, so the writer asks again itself.
const LOCK_RETRY: Duration = Duration::from_millis(1);

/// After a wake-up, how long an idle host looks for the commit it
/// announced: the log is written, and reported, before the commit ends.
const CLOSE_LOOK: Duration = Duration::from_millis(50);

/// How often it looks meanwhile: every 100 µs for the first few
/// milliseconds, where a commit's sync usually ends, then every millisecond.
fn close_look_every(since_wake: Duration) -> Duration {
    if since_wake < Duration::from_millis(5) { Duration::from_micros(100) } else { Duration::from_millis(1) }
}

/// How often an idle host checks whether another process committed, in
/// case the file system did not report the write.
const WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// Pages the log may hold before a commit checkpoints it (SQLite's default,
/// set so that no connection runs with checkpoints turned off).
const WAL_CHECKPOINT_PAGES: u32 = 1000;

/// Bytes the log file is cut back to when it starts over after a checkpoint:
/// without a limit it keeps the largest size a long read ever let it reach.
pub const WAL_SIZE_LIMIT: u64 = 16 << 20;

/// `seen_version` before the first look.
const UNSEEN: i64 = i64::MIN;

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

    async fn connect(url: &str, max_connections: u32, create: bool) -> Result<Self> {
        // WAL lets readers run beside the writer. FULL syncs the log at
        // every commit: an enqueue reported as done survives a power cut.
        // The log is checkpointed every WAL_CHECKPOINT_PAGES and cut back to
        // WAL_SIZE_LIMIT once it starts over, so a burst of writes beside a
        // long read leaves no oversized file behind.
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(create)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .pragma("wal_autocheckpoint", WAL_CHECKPOINT_PAGES.to_string())
            .pragma("journal_size_limit", WAL_SIZE_LIMIT.to_string())
            .log_statements(tracing::log::LevelFilter::Trace);
        // Checked first for a clear message; `create_if_missing(false)` is
        // what guarantees nothing is created should the file vanish meanwhile.
        let file = options.get_filename();
        if !create && !file.exists() {
            return Err(Error::DatabaseMissing(file.display().to_string()));
        }
        let pool = |size: u32| {
            SqlitePoolOptions::new().max_connections(size).acquire_timeout(Duration::from_secs(30)).idle_timeout(None)
        };
        // The reader connects at once, creating the file and proving the URL.
        // The writer and the watcher connect when first used: a command that
        // only reads never opens them. Connecting sets the journal mode,
        // which may wait for another process's lock, so the writer waits as
        // long as any connection while it connects and only then stops
        // waiting inside SQLite (`write` retries instead).
        //
        // Connecting to a new file switches it to WAL. Two processes doing
        // that at once can each hold a lock the other needs, which SQLite
        // reports at once as busy rather than waiting: connecting retries.
        let reader =
            while_locked(|| async { Ok(pool(max_connections.max(2)).connect_with(options.clone()).await?) }).await?;
        let writer = pool(1)
            .after_connect(|conn, _| {
                Box::pin(async move { sqlx::Executor::execute(conn, "PRAGMA busy_timeout = 0").await.map(|_| ()) })
            })
            .connect_lazy_with(options.clone());
        let logged = Arc::new(Notify::new());
        let commits = commits::watch(options.get_filename(), logged.clone()).map(Arc::new);
        let watch = pool(1).connect_lazy_with(options.clone());
        let store = SqliteStore {
            writer,
            options,
            reader,
            watch,
            seen_version: Arc::new(AtomicI64::new(UNSEEN)),
            wake: Arc::new(Notify::new()),
            logged,
            _commits: commits,
            limits: EnqueueLimits::default(),
        };
        Ok(store)
    }

    /// Holds every enqueue through this store to `limits`.
    pub fn with_limits(self, limits: EnqueueLimits) -> Self {
        SqliteStore { limits, ..self }
    }

    /// A pool for tests that check invariants, or edit rows, with their own SQL.
    pub fn pool(&self) -> &SqlitePool {
        &self.reader
    }

    /// One try at [`Store::job_quarantine`], keeping the job's errors or not.
    async fn quarantine(&self, id: i64, reason: &str, keep_errors: bool) -> Result<bool> {
        let mut tx = self.write().await?;
        let moved = job::quarantine(&mut tx, id, reason, keep_errors, now_ms()).await?;
        tx.commit().await?;
        Ok(moved)
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

    /// Whether any connection (another process's, or this one's writer)
    /// committed since the last look; true when the look fails, so the caller
    /// goes and checks.
    async fn committed_since_last_look(&self) -> bool {
        match sqlx::query_scalar::<_, i64>("PRAGMA data_version").fetch_one(&self.watch).await {
            Ok(version) => {
                let seen = self.seen_version.swap(version, Ordering::Relaxed);
                seen != UNSEEN && seen != version
            }
            Err(_) => true,
        }
    }

    /// Waits for a commit by any connection since `seen`, the data version
    /// the caller last saw (updated here), until `deadline`: false when the
    /// deadline came first. Woken like an idle host: by the file system's
    /// report of a write to the log, with a look every [`WATCH_INTERVAL`]
    /// where it reports nothing.
    async fn wait_for_commit(&self, seen: &mut i64, deadline: tokio::time::Instant) -> bool {
        let version = || async { sqlx::query_scalar::<_, i64>("PRAGMA data_version").fetch_one(&self.watch).await };
        if *seen == UNSEEN {
            *seen = version().await.unwrap_or(UNSEEN);
        }
        let mut woken_at = None;
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return false;
            }
            let every = match woken_at {
                Some(woken) if now < woken + CLOSE_LOOK => close_look_every(now - woken),
                _ => WATCH_INTERVAL,
            };
            tokio::select! {
                () = self.logged.notified() => woken_at = Some(tokio::time::Instant::now()),
                () = crate::timer::sleep(every.min(deadline - now)) => {}
            }
            match version().await {
                Ok(now_seen) if now_seen == *seen => {}
                Ok(now_seen) => {
                    *seen = now_seen;
                    return true;
                }
                Err(_) => return true,
            }
        }
    }

    /// Wakes this process's idle fetch loop.
    fn announce(&self, any_available: bool) {
        if any_available {
            self.wake.notify_one();
        }
    }
}

/// A write transaction holding the file's write lock. It commits only
/// after settling the batches its writes finished (`batch::settle`): the
/// transaction that ends a closed batch's last member, whatever ended it,
/// enqueues the batch's callbacks (guarantee 12).
struct Write {
    tx: Transaction<'static, Sqlite>,
    limits: EnqueueLimits,
    wake: Arc<Notify>,
}

impl Write {
    /// Settles finished batches, then commits.
    async fn commit(self) -> Result<()> {
        self.commit_settling(true).await
    }

    /// Commits, settling finished batches first only if `may_finish_batch`:
    /// a write that ended no batch member skips a statement that would find
    /// nothing to do.
    async fn commit_settling(mut self, may_finish_batch: bool) -> Result<()> {
        let available = may_finish_batch && batch::settle(&mut self.tx, &self.limits, now_ms()).await?;
        self.tx.commit().await?;
        if available {
            self.wake.notify_one();
        }
        Ok(())
    }
}

impl std::ops::Deref for Write {
    type Target = sqlx::SqliteConnection;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl std::ops::DerefMut for Write {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

/// Runs `attempt` again, every [`LOCK_RETRY`] up to [`BUSY_TIMEOUT`], while
/// it fails on another connection's lock of the file.
async fn while_locked<T, F: Future<Output = Result<T>>>(mut attempt: impl FnMut() -> F) -> Result<T> {
    let deadline = tokio::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match attempt().await {
            Err(error) if error.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(LOCK_RETRY).await;
            }
            outcome => return outcome,
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

/// Now, in the schema's unit.
fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// A caller's `now`, or the clock's.
fn ms_or_now(now: Option<DateTime<Utc>>) -> i64 {
    now.map_or_else(now_ms, |t| t.timestamp_millis())
}

/// A stored time.
fn time_of(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// A stored time as the text JSON documents (error entries) carry.
fn iso(ms: i64) -> String {
    time_of(ms).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// A list of values as the JSON array `json_each` reads: SQLite binds no arrays.
fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    // Serializing plain numbers and strings cannot fail.
    serde_json::to_string(items).unwrap_or_else(|_| "[]".into())
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
        let mut tx = self.write().await?;
        let enqueued = job::insert(&mut tx, &jobs.iter().collect::<Vec<_>>(), now_ms()).await?;
        tx.commit().await?;
        self.announce(enqueued.iter().any(|e| matches!(e, Enqueued::New(_) | Enqueued::Replaced(_))));
        Ok(enqueued)
    }

    async fn batch_write(&self, batch: PreparedBatch) -> Result<(i64, Vec<Enqueued>)> {
        let mut tx = self.write().await?;
        let written = batch::write(&mut tx, batch, now_ms()).await?;
        tx.commit().await?;
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
        let mut tx = self.write().await?;
        let written = schedule::write(&mut tx, &write, now_ms()).await?;
        tx.commit().await?;
        let available = |e: &Enqueued| matches!(e, Enqueued::New(_) | Enqueued::Replaced(_));
        self.announce(written.as_ref().is_some_and(|written| written.iter().any(available)));
        Ok(written)
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
        let mut tx = self.write().await?;
        let (changed, promoted) = host::job_types_register(&mut tx, types).await?;
        tx.commit().await?;
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
        let mut tx = self.write().await?;
        host::host_upsert(&mut tx, info).await?;
        Ok(tx.commit().await?)
    }

    async fn host_list(&self) -> Result<Vec<crate::store::HostRow>> {
        host::host_list(&self.reader, now_ms()).await
    }

    async fn job_types_list(&self) -> Result<Vec<crate::store::JobTypeRow>> {
        host::job_types_list(&self.reader).await
    }

    async fn job_finished_since(&self, secs: f64) -> Result<std::collections::BTreeMap<String, i64>> {
        host::finished_since(&self.reader, now_ms(), secs).await
    }

    async fn host_remove(&self, host_id: &str) -> Result<()> {
        let mut tx = self.write().await?;
        host::host_remove(&mut tx, host_id).await?;
        Ok(tx.commit().await?)
    }

    async fn host_prune(&self, silent_secs: f64) -> Result<u64> {
        let mut tx = self.write().await?;
        let pruned = host::host_prune(&mut tx, silent_secs).await?;
        tx.commit().await?;
        Ok(pruned)
    }

    async fn job_fetch(&self, params: &FetchParams) -> Result<Vec<FetchedJob>> {
        // Taking the write lock only when there is something to take keeps
        // idle hosts from queueing behind busy ones.
        if !job::any_available(&self.reader, params).await? {
            return Ok(Vec::new());
        }
        let mut tx = self.write().await?;
        let jobs = job::fetch(&mut tx, params, now_ms()).await?;
        tx.commit().await?;
        Ok(jobs)
    }

    async fn lease_started(&self, runs: &[RunId]) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let mut tx = self.write().await?;
        lease::started(&mut tx, runs, now_ms()).await?;
        tx.commit().await?;
        Ok(())
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
        let mut tx = self.write().await?;
        let (requeued, failed) = lease::expire(&mut tx, ms_or_now(now), None).await?;
        tx.commit().await?;
        if requeued > 0 {
            tracing::warn!(requeued, failed, "rescued jobs whose lease expired");
        }
        self.announce(requeued > 0);
        Ok((requeued, failed))
    }

    async fn job_promote_due(&self, now: Option<DateTime<Utc>>) -> Result<u64> {
        let mut tx = self.write().await?;
        let (due, admitted) = job::promote_due(&mut tx, ms_or_now(now), None).await?;
        tx.commit().await?;
        self.announce(admitted > 0);
        Ok(due)
    }

    async fn job_due_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
        let mut conn = self.reader.acquire().await?;
        job::due_ids(&mut conn, ms_or_now(now), limit).await
    }

    async fn job_promote_due_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<u64> {
        let mut tx = self.write().await?;
        let (due, admitted) = job::promote_due(&mut tx, ms_or_now(now), Some(ids)).await?;
        tx.commit().await?;
        self.announce(admitted > 0);
        Ok(due)
    }

    async fn lease_expired_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
        let mut conn = self.reader.acquire().await?;
        lease::expired_ids(&mut conn, ms_or_now(now), limit).await
    }

    async fn lease_expire_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<(u64, u64)> {
        let mut tx = self.write().await?;
        let (requeued, failed) = lease::expire(&mut tx, ms_or_now(now), Some(ids)).await?;
        tx.commit().await?;
        self.announce(requeued > 0);
        Ok((requeued, failed))
    }

    async fn job_quarantine(&self, id: i64, reason: &str) -> Result<bool> {
        match self.quarantine(id, reason, true).await {
            Err(error) if error.is_refusal() => self.quarantine(id, reason, false).await,
            other => other,
        }
    }

    async fn blocked_promote(&self, after: Option<&KeyCursor>, max_keys: i64) -> Result<KeyPage<u64>> {
        let page = concurrency::promotable_keys(&self.reader, after, max_keys).await?;
        let mut promoted = 0;
        // One transaction per key keeps each hold of the write lock short.
        // A key the database refuses to promote stays blocked (guarantee 2)
        // without holding back the keys after it (guarantee 13): the page
        // goes on past it.
        for (job, key, _) in page.done.into_iter().filter(|(_, _, promotable)| *promotable) {
            let mut tx = self.write().await?;
            match concurrency::fill(&mut tx, &job, &key, 0, now_ms()).await {
                Ok(moved) => {
                    tx.commit().await?;
                    promoted += moved;
                }
                Err(error) if error.is_refusal() => {
                    tracing::error!(job, key, %error, "cannot promote this key's blocked jobs; they stay blocked");
                }
                Err(error) => return Err(error),
            }
        }
        if promoted > 0 {
            tracing::info!(promoted, "promoted blocked jobs into free slots");
        }
        self.announce(promoted > 0);
        Ok(KeyPage { done: promoted, next: page.next })
    }

    async fn semaphore_repair_page(
        &self,
        after: Option<&KeyCursor>,
        max_keys: i64,
    ) -> Result<KeyPage<Vec<SemaphoreFix>>> {
        let mut tx = self.write().await?;
        let page = concurrency::repair(&mut tx, after, max_keys, now_ms()).await?;
        tx.commit().await?;
        for fix in &page.done {
            tracing::warn!(
                job = fix.job,
                key = fix.key,
                recorded = fix.recorded,
                actual = fix.actual,
                "repaired a semaphore whose holder count disagreed with its jobs"
            );
        }
        Ok(page)
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
        let mut stats = operate::stats(&self.reader, now).await?;
        (stats.watchers_down, stats.mixed_components) =
            crate::store::host::fleet_warnings(host::host_health(&self.reader, now).await?);
        Ok(stats)
    }

    async fn database_ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn job_retry(&self, id: i64) -> Result<()> {
        let mut tx = self.write().await?;
        operate::retry(&mut tx, id, now_ms()).await?;
        tx.commit().await?;
        self.announce(true);
        Ok(())
    }

    async fn job_cancel(&self, id: i64) -> Result<Cancel> {
        let mut tx = self.write().await?;
        let promoted = operate::cancel(&mut tx, id, now_ms()).await?;
        tx.commit().await?;
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
        let mut tx = self.write().await?;
        let closed = batch::close(&mut tx, id, now_ms()).await?;
        tx.commit().await?;
        Ok(closed)
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
                None => return Err(Error::JobState { id, reason: crate::store::NO_SUCH_JOB.into() }),
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
        let mut tx = self.write().await?;
        session::create(&mut tx, digest, lifetime, now_ms()).await?;
        tx.commit_settling(false).await
    }

    async fn session_check(&self, digest: &str, lifetime: SessionLifetime) -> Result<bool> {
        let now = now_ms();
        let Some(stale) = session::check(&self.reader, digest, lifetime, now).await? else {
            return Ok(false);
        };
        if stale {
            let mut tx = self.write().await?;
            session::touch(&mut tx, digest, now).await?;
            tx.commit_settling(false).await?;
        }
        Ok(true)
    }

    async fn session_revoke(&self, digest: &str) -> Result<()> {
        let mut tx = self.write().await?;
        session::revoke(&mut tx, digest).await?;
        tx.commit_settling(false).await
    }

    async fn grant_set(&self, new: &crate::store::grant::NewGrant) -> Result<bool> {
        let mut tx = self.write().await?;
        let replaced = grant::set(&mut tx, new, now_ms()).await?;
        tx.commit_settling(false).await?;
        Ok(replaced)
    }

    async fn grant_revoke(&self, job_type: &str, origin: &str) -> Result<bool> {
        let mut tx = self.write().await?;
        let removed = grant::revoke(&mut tx, job_type, origin).await?;
        tx.commit_settling(false).await?;
        Ok(removed)
    }

    async fn grants(&self, job_type: Option<&str>) -> Result<Vec<crate::store::grant::OutboundGrant>> {
        grant::list(&self.reader, job_type).await
    }

    async fn secret_set(&self, name: &str, sealed: &crate::store::secret::Sealed) -> Result<bool> {
        let mut tx = self.write().await?;
        let replaced = secret::set(&mut tx, name, sealed, now_ms()).await?;
        tx.commit_settling(false).await?;
        Ok(replaced)
    }

    async fn secret_delete(&self, name: &str) -> Result<bool> {
        let mut tx = self.write().await?;
        let removed = secret::delete(&mut tx, name).await?;
        tx.commit_settling(false).await?;
        Ok(removed)
    }

    async fn secrets_list(&self) -> Result<Vec<crate::store::secret::SecretInfo>> {
        secret::list(&self.reader).await
    }

    async fn secrets_sealed(&self, names: &[String]) -> Result<Vec<(String, crate::store::secret::Sealed)>> {
        secret::sealed(&self.reader, names).await
    }

    async fn var_set(&self, job_type: &str, name: &str, value: &str) -> Result<bool> {
        let mut tx = self.write().await?;
        let replaced = variable::set(&mut tx, job_type, name, value, now_ms()).await?;
        tx.commit_settling(false).await?;
        Ok(replaced)
    }

    async fn var_unset(&self, job_type: &str, name: &str) -> Result<bool> {
        let mut tx = self.write().await?;
        let removed = variable::unset(&mut tx, job_type, name).await?;
        tx.commit_settling(false).await?;
        Ok(removed)
    }

    async fn vars(&self, job_type: Option<&str>) -> Result<Vec<crate::store::variable::TypeVariable>> {
        variable::list(&self.reader, job_type).await
    }

    async fn schedule_looked(&self, jobs: &[String], at: DateTime<Utc>) -> Result<()> {
        let mut tx = self.write().await?;
        schedule::looked(&mut tx, jobs, at.timestamp_millis()).await?;
        tx.commit_settling(false).await?;
        Ok(())
    }

    async fn deployment_change(&self, job_type: &str, request: DeployRequest<'_>) -> Result<DeployChange> {
        let mut tx = self.write().await?;
        let (change, promoted) = deploy::apply(&mut tx, job_type, request).await?;
        tx.commit().await?;
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
        let deadline = tokio::time::Instant::now() + timeout;
        let mut woken_at = None;
        if self.seen_version.load(Ordering::Relaxed) == UNSEEN {
            self.committed_since_last_look().await;
        }
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return;
            }
            let every = match woken_at {
                Some(woken) if now < woken + CLOSE_LOOK => close_look_every(now - woken),
                _ => WATCH_INTERVAL,
            };
            tokio::select! {
                () = self.wake.notified() => return,
                () = self.logged.notified() => woken_at = Some(tokio::time::Instant::now()),
                () = crate::timer::sleep(every.min(deadline - now)) => {}
            }
            if self.committed_since_last_look().await {
                return;
            }
        }
    }
}
