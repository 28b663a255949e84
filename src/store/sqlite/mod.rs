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

mod audit;
mod batch;
mod commits;
mod concurrency;
mod connect;
mod deploy;
mod encode;
mod event;
mod finish;
mod fleet;
mod grant;
mod history;
mod job;
mod keyed_schedule;
mod lease;
mod membership;
mod operate;
mod rate;
mod schedule;
mod secret;
mod session;
mod token;
mod trace;
mod trigger;
mod unique;
mod variable;
mod wait;
mod webhook;
mod workflow;
mod write;

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use async_trait::async_trait;

use super::driver::SchemaDriver;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use tokio::sync::Notify;

use super::batch::PreparedBatch;
use super::enqueue::{Configs, PreparedJob};
use super::finish::{FinishPlan, Written};
use super::schedule::TickWrite;
use super::{Backend, EnqueueLimits, Enqueued, FetchParams, Result};
pub use connect::WAL_SIZE_LIMIT;
use encode::{iso, json_list, now_ms, time_of};
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
    /// This process's fetches that sent jobs back to wait for a start.
    due: Arc<Notify>,
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
        let mut tx = self.write().await?;
        let done = write(&mut tx).await?;
        tx.commit().await?;
        Ok(done)
    }

    /// [`Self::write_with`] for a write that touches no job (a session, a
    /// grant, a secret): it can neither end a workflow step nor finish a batch,
    /// so neither is looked for.
    async fn write_outside_jobs<T>(&self, write: impl AsyncFnOnce(&mut Write) -> Result<T>) -> Result<T> {
        let mut tx = self.write().await?;
        let done = write(&mut tx).await?;
        tx.commit_outside_jobs().await?;
        Ok(done)
    }

    /// [`Self::write_outside_jobs`] of a change, recorded in the audit
    /// trail with its outcome in the same transaction.
    async fn audited_outside_jobs<T: crate::store::audit::Outcome>(
        &self,
        change: &crate::store::audit::Change<'_>,
        write: impl AsyncFnOnce(&mut Write) -> Result<T>,
    ) -> Result<T> {
        self.write_outside_jobs(async |tx| {
            let done = write(tx).await?;
            audit::record(tx, change, &done).await?;
            Ok(done)
        })
        .await
    }

    /// Wakes this process's idle fetch loop.
    fn announce(&self, any_available: bool) {
        if any_available {
            self.wake.notify_one();
        }
    }

    /// Wakes this process's timer of due jobs: a fetch sent jobs back to
    /// wait for a start, maybe sooner than the timer is set for.
    fn announce_due(&self, sent_back: u64) {
        if sent_back > 0 {
            self.due.notify_one();
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
        fleet::job_types_get(&self.reader, names).await
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
        let wrote = finish::write(&mut tx, plan, next, &self.limits, now_ms()).await?;
        tx.commit_settling(wrote.may_finish_batch).await?;
        self.announce(wrote.any_available);
        self.announce_due(wrote.sent_back);
        Ok(wrote.written)
    }

    async fn ticks_write(&self, write: TickWrite) -> Result<Option<Vec<Enqueued>>> {
        let written = self.write_with(async |tx| schedule::write(tx, &write, now_ms()).await).await?;
        let available = |e: &Enqueued| matches!(e, Enqueued::New(_) | Enqueued::Replaced(_));
        self.announce(written.as_ref().is_some_and(|written| written.iter().any(available)));
        Ok(written)
    }

    async fn backfill_write(
        &self,
        change: &crate::store::audit::Change<'_>,
        job: &str,
        key: &str,
        jobs: Vec<(chrono::DateTime<chrono::Utc>, crate::store::enqueue::PreparedJob)>,
    ) -> Result<Option<crate::store::backend::BackfillWritten>> {
        let done = self
            .write_with(async |tx| {
                let done = keyed_schedule::backfill_write(tx, job, key, &jobs, now_ms()).await?;
                audit::record(tx, change, &done).await?;
                Ok(done)
            })
            .await?;
        self.announce(done.as_ref().is_some_and(|(written, _)| !written.is_empty()));
        Ok(done)
    }

    async fn quarantine_write(&self, id: i64, reason: &str, keep_errors: bool) -> Result<bool> {
        self.write_with(async |tx| job::quarantine(tx, id, reason, keep_errors, now_ms()).await).await
    }
}

#[async_trait]
impl SchemaDriver for SqliteStore {
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
        let migrator = crate::store::migrations::sqlite();
        let pool = while_locked(|| async {
            Ok(SqlitePoolOptions::new().max_connections(1).connect_with(self.options.clone()).await?)
        })
        .await?;
        let runs = migrator.iter().count() + 1;
        let migrated = while_locked(|| async {
            super::schema::check_known(&applied_migrations(&pool).await?, migrator)?;
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

    async fn database_ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn schema_present(&self) -> Result<bool> {
        Ok(!applied_migrations(&self.reader).await?.is_empty())
    }
}
