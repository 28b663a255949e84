//! The Rust API for programs that enqueue jobs without running a host.

use std::time::Duration;

use crate::store::keyed_schedule::{KeyedSchedule, KeyedScheduleStatus};
use crate::store::{
    Batch, CreatedWorkflow, EnqueueParams, Enqueued, JobDetail, NewBatch, NewWorkflow, Result, Store, Workflow,
    WorkflowCancel,
};

/// Enqueues jobs into a jobhost database through the same checks as the CLI
/// and the hosts: registered job types, JSON-object payloads, their types'
/// defaults, concurrency keys and uniqueness. A duplicate of a unique job
/// is not an error: its enqueue answers with the id of the job holding the
/// key (see [`Client::enqueue_reporting`] to tell the two apart).
///
/// A job enqueued inside a trace (the caller's current `tracing` span,
/// where `tracing-opentelemetry` records it, or OpenTelemetry's current
/// context) carries that trace context, and a host exporting traces makes
/// its run a child of the caller's span (docs/observability.md). Set
/// [`EnqueueParams::traceparent`] to name another.
#[derive(Clone)]
pub struct Client {
    store: Store,
}

impl Client {
    /// Connects to a database (`sqlite://PATH` or `postgres://…`).
    ///
    /// # Errors
    /// The URL is not supported or the database cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        Ok(Client { store: crate::store::open(url, 4).await? })
    }

    /// A client over an open store.
    pub fn from_store(store: Store) -> Self {
        Client { store }
    }

    /// Enqueues one job with its type's defaults; returns its id.
    ///
    /// # Errors
    /// See [`Client::enqueue_many`].
    pub async fn enqueue(&self, job: &str, payload: serde_json::Value) -> Result<i64> {
        self.enqueue_with(EnqueueParams::new(job, payload)).await
    }

    /// Enqueues one job with options; returns its id.
    ///
    /// # Errors
    /// See [`Client::enqueue_many`].
    pub async fn enqueue_with(&self, params: EnqueueParams) -> Result<i64> {
        let ids = self.store.job_enqueue(&in_current_trace(std::slice::from_ref(&params))).await?;
        Ok(ids[0])
    }

    /// Enqueues jobs all or none; returns their ids in order.
    ///
    /// # Errors
    /// An unknown job type, a payload that is not a JSON object, an invalid
    /// option, a payload without a field its concurrency or uniqueness key
    /// needs, a duplicate whose type's `on_duplicate` is `raise`
    /// ([`crate::store::Error::Duplicate`]), or a database error. Nothing is
    /// enqueued then.
    pub async fn enqueue_many(&self, jobs: &[EnqueueParams]) -> Result<Vec<i64>> {
        self.store.job_enqueue(&in_current_trace(jobs)).await
    }

    /// [`Client::enqueue_many`], saying of each job whether it was stored
    /// or was a duplicate of the job holding its uniqueness key.
    ///
    /// # Errors
    /// See [`Client::enqueue_many`].
    pub async fn enqueue_reporting(&self, jobs: &[EnqueueParams]) -> Result<Vec<Enqueued>> {
        self.store.job_enqueue_outcomes(&in_current_trace(jobs)).await
    }

    /// Creates a batch with its first members, all or none, and closes it
    /// unless `batch.open`; returns its id and what became of each member.
    /// Add to an open batch with [`EnqueueParams::batch_id`]; close it with
    /// [`Client::batch_close`].
    ///
    /// # Errors
    /// A callback type that is not registered or whose keys cannot render
    /// from the callback payload, what [`Client::enqueue_many`] refuses for
    /// a member, or a database error. Nothing is stored then.
    pub async fn batch_create(&self, batch: &NewBatch, members: &[EnqueueParams]) -> Result<(i64, Vec<Enqueued>)> {
        self.store.batch_create(batch, &in_current_trace(members)).await
    }

    /// Closes an open batch; false when it was closed already.
    ///
    /// # Errors
    /// The batch does not exist, or a database error.
    pub async fn batch_close(&self, id: i64) -> Result<bool> {
        self.store.batch_close(id).await
    }

    /// A batch's counts, progress and callbacks.
    ///
    /// # Errors
    /// A database error.
    pub async fn batch(&self, id: i64) -> Result<Option<Batch>> {
        self.store.batch_get(id).await
    }

    /// Creates a workflow, all or none: its steps that wait for nothing are
    /// enqueued at once, and each other step in the transaction that ends
    /// its last dependency, with their outputs under `_deps`
    /// (docs/workflows.md). Returns its id and the jobs of the first steps.
    ///
    /// # Errors
    /// [`Error::InvalidWorkflow`](crate::store::Error::InvalidWorkflow) for a
    /// cycle, an unknown step or type, a bad payload or too many steps; a
    /// database error. Nothing is stored then.
    pub async fn workflow_create(&self, workflow: &NewWorkflow) -> Result<CreatedWorkflow> {
        self.store.workflow_create(workflow).await
    }

    /// Sends an event: every workflow step armed to wait for `key` whose
    /// match `payload` holds is released, once (docs/events.md). With an
    /// `idempotency_key` used before, nothing is sent again.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`](crate::store::Error::InvalidEvent) for a bad
    /// key or payload; a database error. Nothing is sent then.
    pub async fn send_event(
        &self,
        key: &str,
        payload: &serde_json::Value,
        idempotency_key: Option<&str>,
    ) -> Result<crate::store::wait::SentEvent> {
        self.store.event_send(key, payload, idempotency_key, "client").await
    }

    /// Creates or replaces the schedule of a job type and key
    /// (docs/schedules.md, "Schedules made at run time"): true when it
    /// created one. A changed calendar hands over without losing or
    /// doubling a tick.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`](crate::store::Error::InvalidSchedule)
    /// naming the bad field (nothing is stored); a database error.
    pub async fn schedule_upsert(&self, schedule: &KeyedSchedule) -> Result<bool> {
        self.store.keyed_schedule_upsert(schedule).await
    }

    /// Pauses a schedule, with a note, or resumes it (from its next tick):
    /// false when there is none.
    ///
    /// # Errors
    /// A database error.
    pub async fn schedule_pause(&self, job: &str, key: &str, paused: bool, note: Option<&str>) -> Result<bool> {
        self.store.keyed_schedule_pause(job, key, paused, note).await
    }

    /// Removes a schedule: no tick after this returns. False when there was none.
    ///
    /// # Errors
    /// A database error.
    pub async fn schedule_remove(&self, job: &str, key: &str) -> Result<bool> {
        self.store.keyed_schedule_remove(job, key).await
    }

    /// Asks for one tick now, under the schedule's overlap policy: false
    /// when there is no such schedule.
    ///
    /// # Errors
    /// A database error.
    pub async fn schedule_trigger(&self, job: &str, key: &str) -> Result<bool> {
        self.store.keyed_schedule_trigger(job, key).await
    }

    /// Enqueues the ticks of a past range of a schedule, each once (a tick
    /// a job of the schedule already has is not enqueued again): `None`
    /// when there is no such schedule.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`](crate::store::Error::InvalidSchedule) for
    /// a range in the future or of more than 1,000 ticks; a database error.
    pub async fn schedule_backfill(
        &self,
        job: &str,
        key: &str,
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<crate::store::keyed_schedule::Backfilled>> {
        self.store.keyed_schedule_backfill(job, key, from, to).await
    }

    /// The schedules made at run time, of one type when given.
    ///
    /// # Errors
    /// A database error.
    pub async fn schedules(&self, job: Option<&str>) -> Result<Vec<KeyedScheduleStatus>> {
        self.store.keyed_schedules(job, None).await
    }

    /// A workflow's state and each step's.
    ///
    /// # Errors
    /// A database error.
    pub async fn workflow(&self, id: i64) -> Result<Option<Workflow>> {
        self.store.workflow_get(id).await
    }

    /// Cancels every step of a workflow not yet ended; none when it does not exist.
    ///
    /// # Errors
    /// A database error.
    pub async fn workflow_cancel(&self, id: i64) -> Result<Option<WorkflowCancel>> {
        self.store.workflow_cancel(id).await
    }

    /// Waits up to `timeout` for a job to end and returns it (its state,
    /// output and errors), or `None` if it has not ended by then.
    ///
    /// # Errors
    /// The job does not exist, or a database error.
    pub async fn wait(&self, id: i64, timeout: Duration) -> Result<Option<JobDetail>> {
        self.store.job_wait(id, timeout).await
    }

    /// The store, for operator queries.
    pub fn store(&self) -> &Store {
        &self.store
    }
}

/// `jobs` with the caller's current trace context on each that names none.
fn in_current_trace(jobs: &[EnqueueParams]) -> std::borrow::Cow<'_, [EnqueueParams]> {
    match crate::telemetry::context::current() {
        Some(current) if jobs.iter().any(|job| job.traceparent.is_none()) => jobs
            .iter()
            .map(|job| EnqueueParams {
                traceparent: job.traceparent.clone().or_else(|| Some(current.clone())),
                ..job.clone()
            })
            .collect(),
        _ => std::borrow::Cow::Borrowed(jobs),
    }
}
