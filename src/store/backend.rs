//! What the shared job rules need from a backend: the configurations they
//! apply, and a writer for what they decided. The rules themselves live
//! above, in [`super::enqueue`], [`super::finish`] and [`super::schedule`];
//! a backend never decides a key, a default, a job's fate or a tick's
//! payload, it only writes.

use std::collections::HashSet;

use async_trait::async_trait;

use super::Result;
use super::batch::PreparedBatch;
use super::enqueue::{Configs, EnqueueLimits, PreparedJob};
use super::finish::{FinishPlan, Written};
use super::job::{Enqueued, FetchParams};
use super::schedule::TickWrite;

/// Each tick a backfill wrote and what became of its job, and how many
/// ticks a job of the schedule had already.
pub(crate) type BackfillWritten = (Vec<(chrono::DateTime<chrono::Utc>, Enqueued)>, usize);

impl super::audit::Outcome for BackfillWritten {
    fn outcome(&self, _: &super::audit::Change<'_>) -> String {
        format!("{} ticks enqueued, {} there already", self.0.len(), self.1)
    }
}

/// The narrow interface each backend implements under the shared rules.
#[async_trait]
pub(crate) trait Backend: Send + Sync {
    /// What every enqueue through this store may carry.
    fn limits(&self) -> &EnqueueLimits;

    /// The registered configuration of each named job type that exists.
    async fn configs_read(&self, names: &[String]) -> Result<Configs>;

    /// Inserts prepared jobs in one transaction, all or none: each unique
    /// job claims its key first (a duplicate is not stored), and each job
    /// passes the concurrency gate as it becomes due. Returns what became of
    /// each, in order.
    async fn jobs_write(&self, jobs: Vec<PreparedJob>) -> Result<Vec<Enqueued>>;

    /// Creates a batch and inserts its first members as [`Backend::jobs_write`]
    /// does, each with the new batch's id, closing it unless it stays open,
    /// in one transaction. Returns the batch's id and what became of each.
    async fn batch_write(&self, batch: PreparedBatch) -> Result<(i64, Vec<Enqueued>)>;

    /// Writes a plan in one transaction: each run whose lease token still
    /// matches ends or goes back to wait, gives back its slot (blocked jobs
    /// are promoted into it), and has its children inserted; then, when
    /// `next` asks for any, jobs are leased to the writing host. A backend
    /// that can tell another transaction holds a key's semaphore leaves the
    /// plan's deferrable runs of that key out instead of waiting.
    async fn plan_write(&self, plan: &FinishPlan, next: Option<&FetchParams>) -> Result<Written>;

    /// Of the keyed schedules named, those another transaction holds (an
    /// application's open write, a pass): a result that would change one
    /// is deferred rather than made to wait with the whole batch behind
    /// it. None where a write cannot be held up by another's row lock.
    async fn keyed_schedules_held(&self, _schedules: &[(String, String)]) -> Result<HashSet<(String, String)>> {
        Ok(HashSet::new())
    }

    /// Readies what result writes go out on before the first one, so a
    /// host's first writes are as quick as its later ones. Nothing to do
    /// where nothing is kept between writes.
    async fn writes_warm(&self) -> Result<()> {
        Ok(())
    }

    /// Moves a schedule's cursor from `write.expected` to `write.last_tick`
    /// and writes `write.jobs` (as [`Backend::jobs_write`] does: a unique
    /// job whose key is held is not stored), in one
    /// transaction, only if the cursor of the calendar registered at
    /// `write.since` is still `write.expected`. `None` when it is not:
    /// another host wrote those ticks, or a registration changed the
    /// calendar, and nothing was written.
    async fn ticks_write(&self, write: TickWrite) -> Result<Option<Vec<Enqueued>>>;

    /// Writes a backfill of a keyed schedule in one transaction, its row
    /// locked (two backfills of one schedule go one after the other): each
    /// of `jobs` (a tick's) whose tick no job of the schedule has yet, live
    /// or archived, is written as [`Backend::jobs_write`] does. `None` when
    /// there is no such schedule; else what became of each tick written,
    /// and how many were there already.
    async fn backfill_write(
        &self,
        change: &super::audit::Change<'_>,
        job: &str,
        key: &str,
        jobs: Vec<(chrono::DateTime<chrono::Utc>, PreparedJob)>,
    ) -> Result<Option<BackfillWritten>>;

    /// Moves a live job to the archive as failed with `reason` as its last
    /// error, keeping its earlier errors or not, in one transaction; a
    /// blocked job is left where it is. Whether the job was there.
    async fn quarantine_write(&self, id: i64, reason: &str, keep_errors: bool) -> Result<bool>;
}
