//! Opening the file: its journal and sync settings, and the three pools
//! (one writer, the readers, one connection watching for commits).

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use sqlx::ConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::Notify;

use super::SqliteStore;
use super::commits::{self, UNSEEN};
use super::write::{BUSY_TIMEOUT, while_locked};
use crate::store::{EnqueueLimits, Error, Result};

/// Pages the log may hold before a commit checkpoints it (SQLite's default,
/// set so that no connection runs with checkpoints turned off).
const WAL_CHECKPOINT_PAGES: u32 = 1000;

/// Bytes the log file is cut back to when it starts over after a checkpoint:
/// without a limit it keeps the largest size a long read ever let it reach.
pub const WAL_SIZE_LIMIT: u64 = 16 << 20;

impl SqliteStore {
    pub(super) async fn connect(url: &str, max_connections: u32, create: bool) -> Result<Self> {
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
        // No ping before a checkout: the connection is this process's own
        // file handle, with no server that could have ended it, and the
        // ping is a round trip to its worker thread (about 60 µs of a
        // result write; BENCHMARKS.md, "Pings only for idle connections").
        let pool = |size: u32| {
            SqlitePoolOptions::new()
                .max_connections(size)
                .acquire_timeout(Duration::from_secs(30))
                .idle_timeout(None)
                .test_before_acquire(false)
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
            due: Arc::new(Notify::new()),
            logged,
            _commits: commits,
            limits: EnqueueLimits::default(),
        };
        Ok(store)
    }
}
