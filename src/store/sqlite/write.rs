//! Writes: a transaction holding the file's write lock, which releases
//! due workflow steps and settles finished batches as it commits, and the
//! retry of a write that found the file locked by another process.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Sqlite, Transaction};
use tokio::sync::Notify;

use super::{batch, now_ms, workflow};
use crate::store::{EnqueueLimits, Result};

/// How often a write waiting for the lock tries again. SQLite's own busy
/// handler backs off to sleeps of 5, 10, 25 ms and more, far longer than a
/// jobhost transaction holds the lock, so the writer asks again itself.
const LOCK_RETRY: Duration = Duration::from_millis(1);

/// How long a write waits for another process's write lock before failing
/// (the failure is retried like any transient database error).
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// A write transaction holding the file's write lock. It commits only
/// after releasing the workflow steps whose last dependency its writes
/// ended (`workflow::settle`, guarantee 14) and settling the batches its
/// writes finished (`batch::settle`): the transaction that ends a closed
/// batch's last member, whatever ended it, enqueues the batch's callbacks
/// (guarantee 12).
pub(super) struct Write {
    pub(super) tx: Transaction<'static, Sqlite>,
    pub(super) limits: EnqueueLimits,
    pub(super) wake: Arc<Notify>,
}

impl Write {
    /// Releases due workflow steps, settles finished batches, then commits.
    pub(super) async fn commit(self) -> Result<()> {
        self.commit_settling(true).await
    }

    /// Commits after releasing due workflow steps, settling finished
    /// batches first only if `may_finish_batch`: a write that ended no
    /// batch member skips a statement that would find nothing to do.
    pub(super) async fn commit_settling(mut self, may_finish_batch: bool) -> Result<()> {
        let released = workflow::settle(&mut self.tx, &self.limits, now_ms()).await?;
        let available = may_finish_batch && batch::settle(&mut self.tx, &self.limits, now_ms()).await?;
        self.commit_as_is(released || available).await
    }

    /// Commits a write that ended no job (a renewal, a session, a grant):
    /// nothing to release or settle.
    pub(super) async fn commit_outside_jobs(self) -> Result<()> {
        self.commit_as_is(false).await
    }

    async fn commit_as_is(self, available: bool) -> Result<()> {
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
pub(super) async fn while_locked<T, F: Future<Output = Result<T>>>(mut attempt: impl FnMut() -> F) -> Result<T> {
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
