//! What a backend implements under the [`Store`](super::Store) front: one
//! small trait per entity, each implemented in that entity's file of each
//! backend (`postgres/lease.rs`, `sqlite/lease.rs`…), and [`Driver`], all
//! of them plus the writer the shared rules use. A backend states facts and
//! writes what it is given; the rules, loops and log lines over them are
//! the front's. Each method is documented at the front's method of the
//! same name.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::concurrency::BlockedSweep;
use super::fleet::{HostHealthRow, Registered};
use super::lease::Expired;
use super::{
    Backend, Batch, Cancel, DeployChange, DeployRequest, Deployment, DeploymentEntry, FetchParams, FetchedJob,
    HostInfo, HostRow, JobDetail, JobFilter, JobRow, JobState, JobTypeRow, KeyCursor, KeyPage, KeyStatus, LeaseRenew,
    LeaseRenewal, Result, RunId, Schedules, SemaphoreFix, Stats, audit, grant, keyed_schedule, secret, session, token,
    variable, wait, webhook, workflow,
};

/// The database itself: its schema, where it is, whether it answers.
#[async_trait]
pub trait SchemaDriver: Send + Sync {
    /// [`Store::schema_migrate`](super::Store::schema_migrate) on this backend.
    async fn schema_migrate(&self) -> Result<()>;

    /// [`Store::location`](super::Store::location) on this backend.
    fn location(&self) -> String;

    /// [`Store::database_ping`](super::Store::database_ping) on this backend.
    async fn database_ping(&self) -> Result<()>;

    /// [`Store::schema_present`](super::Store::schema_present) on this backend.
    async fn schema_present(&self) -> Result<bool>;
}

/// Components deployed through the database, and their history.
#[async_trait]
pub trait DeployDriver: Send + Sync {
    /// [`Store::deployment_change`](super::Store::deployment_change) on this backend.
    async fn deployment_change(
        &self,
        change: &audit::Change<'_>,
        job_type: &str,
        request: DeployRequest<'_>,
    ) -> Result<DeployChange>;

    /// [`Store::deployments_current`](super::Store::deployments_current) on this backend.
    async fn deployments_current(&self) -> Result<Vec<Deployment>>;

    /// [`Store::deployment_history`](super::Store::deployment_history) on this backend.
    async fn deployment_history(&self, job_type: &str) -> Result<Vec<DeploymentEntry>>;

    /// [`Store::component_source`](super::Store::component_source) on this backend.
    async fn component_source(&self, digest: &str) -> Result<Option<Vec<u8>>>;

    /// [`Store::deployments_wait`](super::Store::deployments_wait) on this backend.
    async fn deployments_wait(&self, timeout: std::time::Duration);
}

/// Hosts and the job types they registered.
#[async_trait]
pub trait FleetDriver: Send + Sync {
    /// [`Store::job_types_register`](super::Store::job_types_register) on this backend.
    async fn job_types_register(&self, types: &[(crate::types::JobConfig, String)]) -> Result<Registered>;

    /// [`Store::job_types_names`](super::Store::job_types_names) on this backend.
    async fn job_types_names(&self) -> Result<Vec<String>>;

    /// [`Store::host_upsert`](super::Store::host_upsert) on this backend.
    async fn host_upsert(&self, host: &HostInfo) -> Result<()>;

    /// [`Store::host_list`](super::Store::host_list) on this backend.
    async fn host_list(&self) -> Result<Vec<HostRow>>;

    /// [`Store::job_types_list`](super::Store::job_types_list) on this backend.
    async fn job_types_list(&self) -> Result<Vec<JobTypeRow>>;

    /// [`Store::job_finished_since`](super::Store::job_finished_since) on this backend.
    async fn job_finished_since(&self, secs: f64) -> Result<std::collections::BTreeMap<JobState, i64>>;

    /// [`Store::host_remove`](super::Store::host_remove) on this backend.
    async fn host_remove(&self, host_id: &str) -> Result<()>;

    /// [`Store::host_prune`](super::Store::host_prune) on this backend.
    async fn host_prune(&self, silent_secs: f64) -> Result<u64>;

    /// Every host's row as its health is judged: how long it has been
    /// silent, its heartbeat, the components it serves, its watcher's error.
    async fn host_health(&self) -> Result<Vec<HostHealthRow>>;
}

/// Jobs through the queue: fetching, due jobs, the archive's retention, waits.
#[async_trait]
pub trait JobDriver: Send + Sync {
    /// [`Store::job_fetch`](super::Store::job_fetch) on this backend.
    async fn job_fetch(&self, params: &FetchParams) -> Result<Vec<FetchedJob>>;

    /// [`Store::job_promote_due`](super::Store::job_promote_due) on this backend.
    async fn job_promote_due(&self, now: Option<DateTime<Utc>>) -> Result<u64>;

    /// [`Store::job_due_ids`](super::Store::job_due_ids) on this backend.
    async fn job_due_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>>;

    /// [`Store::job_promote_due_ids`](super::Store::job_promote_due_ids) on this backend.
    async fn job_promote_due_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<u64>;

    /// [`Store::archive_prune`](super::Store::archive_prune) on this backend.
    async fn archive_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64>;

    /// [`Store::job_wait`](super::Store::job_wait) on this backend.
    async fn job_wait(&self, id: i64, timeout: std::time::Duration) -> Result<Option<JobDetail>>;

    /// [`Store::job_wait_available`](super::Store::job_wait_available) on this backend.
    async fn job_wait_available(&self, timeout: std::time::Duration);

    /// [`Store::job_next_due`](super::Store::job_next_due) on this backend.
    async fn job_next_due(&self) -> Result<Option<std::time::Duration>>;

    /// [`Store::job_wait_sent_back`](super::Store::job_wait_sent_back) on this backend.
    async fn job_wait_sent_back(&self, timeout: std::time::Duration);
}

/// Operators' reads and commands on jobs and queues.
#[async_trait]
pub trait OperateDriver: Send + Sync {
    /// [`Store::job_list`](super::Store::job_list) on this backend.
    async fn job_list(&self, filter: &JobFilter) -> Result<Vec<JobRow>>;

    /// [`Store::job_get`](super::Store::job_get) on this backend.
    async fn job_get(&self, id: i64) -> Result<Option<JobDetail>>;

    /// [`Store::job_stats`](super::Store::job_stats) on this backend.
    async fn job_stats(&self) -> Result<Stats>;

    /// [`Store::job_retry`](super::Store::job_retry) on this backend.
    async fn job_retry(&self, change: &audit::Change<'_>, id: i64) -> Result<()>;

    /// [`Store::job_cancel`](super::Store::job_cancel) on this backend.
    async fn job_cancel(&self, change: &audit::Change<'_>, id: i64) -> Result<Cancel>;

    /// [`Store::queue_pause`](super::Store::queue_pause) on this backend.
    async fn queue_pause(&self, change: &audit::Change<'_>, queue: &str) -> Result<bool>;

    /// [`Store::queue_resume`](super::Store::queue_resume) on this backend.
    async fn queue_resume(&self, change: &audit::Change<'_>, queue: &str) -> Result<bool>;
}

/// Leases of running jobs: confirmation, renewal, expiry.
#[async_trait]
pub trait LeaseDriver: Send + Sync {
    /// [`Store::lease_started`](super::Store::lease_started) on this backend.
    async fn lease_started(&self, runs: &[RunId]) -> Result<()>;

    /// [`Store::lease_renew`](super::Store::lease_renew) on this backend.
    async fn lease_renew(&self, renew: &LeaseRenew<'_>) -> Result<LeaseRenewal>;

    /// [`Store::lease_expire`](super::Store::lease_expire) on this backend.
    async fn lease_expire(&self, now: Option<DateTime<Utc>>) -> Result<Expired>;

    /// [`Store::lease_expired_ids`](super::Store::lease_expired_ids) on this backend.
    async fn lease_expired_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>>;

    /// [`Store::lease_expire_ids`](super::Store::lease_expire_ids) on this backend.
    async fn lease_expire_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<Expired>;
}

/// Per-key concurrency slots: their repair and reports.
#[async_trait]
pub trait SemaphoreDriver: Send + Sync {
    /// [`Store::semaphore_repair_page`](super::Store::semaphore_repair_page) on this backend.
    async fn semaphore_repair_page(
        &self,
        after: Option<&KeyCursor>,
        max_keys: i64,
    ) -> Result<KeyPage<Vec<SemaphoreFix>>>;

    /// [`Store::semaphore_list`](super::Store::semaphore_list) on this backend.
    async fn semaphore_list(&self) -> Result<Vec<KeyStatus>>;

    /// [`Store::semaphore_free_slots`](super::Store::semaphore_free_slots) on this backend.
    async fn semaphore_free_slots(&self, job: &str, key: &str) -> Result<i64>;
}

/// Rate limits' keys: throttles, and what operators see of them.
#[async_trait]
pub trait RateDriver: Send + Sync {
    /// [`Store::rate_throttle`](super::Store::rate_throttle) on this backend.
    async fn rate_throttle(&self, run: RunId, delay_ms: u64) -> Result<bool>;

    /// [`Store::rate_key_list`](super::Store::rate_key_list) on this backend.
    async fn rate_key_list(&self) -> Result<Vec<super::rate::RateKeyStatus>>;

    /// [`Store::rate_totals`](super::Store::rate_totals) on this backend.
    async fn rate_totals(&self) -> Result<Vec<super::rate::RateTotals>>;
}

/// Batches after their creation (which the shared rules write).
#[async_trait]
pub trait BatchDriver: Send + Sync {
    /// [`Store::batch_close`](super::Store::batch_close) on this backend.
    async fn batch_close(&self, id: i64) -> Result<bool>;

    /// [`Store::batch_get`](super::Store::batch_get) on this backend.
    async fn batch_get(&self, id: i64) -> Result<Option<Batch>>;

    /// [`Store::batch_list`](super::Store::batch_list) on this backend.
    async fn batch_list(&self, limit: i64) -> Result<Vec<Batch>>;
}

/// Workflows: their creation (prepared by the shared rules), cancel and
/// views. Releasing steps is the backends' own, in every transaction that
/// ends a job.
#[async_trait]
pub trait WorkflowDriver: Send + Sync {
    /// Deletes workflows whose every step ended more than `retention_secs`
    /// before `now` (the database's clock by default), at most `limit`:
    /// the archive's retention, applied to workflows.
    async fn workflow_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<()>;

    /// Stores a checked workflow and releases its steps that wait for nothing.
    async fn workflow_write(&self, workflow: workflow::PreparedWorkflow) -> Result<workflow::CreatedWorkflow>;

    /// [`Store::workflow_get`](super::Store::workflow_get) on this backend.
    async fn workflow_get(&self, id: i64) -> Result<Option<workflow::Workflow>>;

    /// [`Store::workflow_list`](super::Store::workflow_list) on this backend.
    async fn workflow_list(&self, limit: i64) -> Result<Vec<workflow::Workflow>>;

    /// Marks a workflow cancelled (no step is released to run after it) and
    /// ends its waiting steps as cancelled, in one transaction. Returns how
    /// many were waiting and the jobs of its live steps, for the front to
    /// cancel; none when there is no such workflow.
    async fn workflow_cancel(&self, change: &audit::Change<'_>, id: i64) -> Result<Option<(usize, Vec<i64>)>>;

    /// The workflow and step name a job is, if it is a step.
    async fn workflow_of_job(&self, job_id: i64) -> Result<Option<(i64, String)>>;
}

/// Events, and the durable waits they and the clock end (`store::wait`).
#[async_trait]
pub trait EventDriver: Send + Sync {
    /// [`Store::event_send`](super::Store::event_send) on this backend,
    /// the event already checked.
    async fn event_send(
        &self,
        change: &audit::Change<'_>,
        key: &str,
        payload: &serde_json::Value,
        idempotency_key: Option<&str>,
        source: &str,
    ) -> Result<wait::SentEvent>;

    /// [`Store::event_list`](super::Store::event_list) on this backend.
    async fn event_list(&self, key: Option<&str>, limit: i64) -> Result<Vec<wait::StoredEvent>>;

    /// Ends up to `batch` waits due by `now` (the database's clock by
    /// default): sleeps by their time, event waits by their timeout,
    /// releasing their steps; and arms waits the release left unarmed.
    /// Returns how many waits it ended or armed.
    async fn waits_due(&self, now: Option<DateTime<Utc>>, batch: i64) -> Result<u64>;

    /// Deletes up to `limit` events sent more than `retention_secs` before
    /// `now`, oldest first.
    async fn event_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64>;
}

/// Inbound webhooks (`store::webhook`).
#[async_trait]
pub trait WebhookDriver: Send + Sync {
    /// Adds or replaces a webhook; true when it replaced one.
    async fn webhook_set(&self, change: &audit::Change<'_>, webhook: &webhook::Webhook) -> Result<bool>;

    /// Removes a webhook; false when there was none.
    async fn webhook_delete(&self, change: &audit::Change<'_>, name: &str) -> Result<bool>;

    /// One webhook by name.
    async fn webhook_get(&self, name: &str) -> Result<Option<webhook::Webhook>>;

    /// Every webhook, by name.
    async fn webhook_list(&self) -> Result<Vec<webhook::Webhook>>;
}

/// Schedules' cursors (their ticks are written by the shared rules).
#[async_trait]
pub trait ScheduleDriver: Send + Sync {
    /// [`Store::schedule_list`](super::Store::schedule_list) on this backend.
    async fn schedule_list(&self, now: Option<DateTime<Utc>>) -> Result<Schedules>;

    /// [`Store::schedule_looked`](super::Store::schedule_looked) on this backend.
    async fn schedule_looked(&self, jobs: &[String], at: DateTime<Utc>) -> Result<()>;
}

/// Decides what a pass does with one due schedule, by the pass's clock
/// ([`super::keyed_schedule::plan`], bound to the scheduler's settings).
pub type TickDecider = dyn Fn(&keyed_schedule::DueSchedule, DateTime<Utc>) -> keyed_schedule::TickPlan + Send + Sync;

/// Schedules made at run time (`store::keyed_schedule`).
#[async_trait]
pub trait KeyedScheduleDriver: Send + Sync {
    /// Creates or replaces a schedule, checked; true when it created one.
    async fn keyed_schedule_upsert(
        &self,
        change: &audit::Change<'_>,
        schedule: &keyed_schedule::KeyedSchedule,
    ) -> Result<bool>;

    /// Pauses (with a note) or resumes a schedule; false when there is none.
    async fn keyed_schedule_pause(
        &self,
        change: &audit::Change<'_>,
        job: &str,
        key: &str,
        paused: bool,
        note: Option<&str>,
    ) -> Result<bool>;

    /// Removes a schedule; false when there was none.
    async fn keyed_schedule_remove(&self, change: &audit::Change<'_>, job: &str, key: &str) -> Result<bool>;

    /// Asks for a tick now; false when there is no such schedule.
    async fn keyed_schedule_trigger(&self, change: &audit::Change<'_>, job: &str, key: &str) -> Result<bool>;

    /// The schedules, of one type or one key when given, by type and key.
    async fn keyed_schedules(
        &self,
        job: Option<&str>,
        key: Option<&str>,
    ) -> Result<Vec<keyed_schedule::KeyedScheduleStatus>>;

    /// Up to `limit` schedules (of one type when given) after `after`, a
    /// (type, key), by type and key: a page of a list that may hold
    /// hundreds of thousands.
    async fn keyed_schedules_page(
        &self,
        job: Option<&str>,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<keyed_schedule::KeyedScheduleStatus>>;

    /// One pass: up to `batch` due schedules of served types, each planned
    /// by `decide` with its row locked, their jobs and cursors written in
    /// one transaction. `now` overrides the database's clock, for tests.
    async fn keyed_ticks(
        &self,
        now: Option<DateTime<Utc>>,
        batch: i64,
        decide: &TickDecider,
    ) -> Result<keyed_schedule::KeyedPass>;

    /// Records a pass at `at` that left nothing due, for every served type.
    async fn keyed_looked(&self, at: DateTime<Utc>) -> Result<()>;
}

/// Signed-in sessions of the HTTP server.
#[async_trait]
pub trait SessionDriver: Send + Sync {
    /// [`Store::session_create`](super::Store::session_create) on this backend.
    async fn session_create(
        &self,
        digest: &str,
        lifetime: session::SessionLifetime,
        token: Option<&session::SignedInWith>,
    ) -> Result<bool>;

    /// [`Store::session_check`](super::Store::session_check) on this backend.
    async fn session_check(
        &self,
        digest: &str,
        lifetime: session::SessionLifetime,
    ) -> Result<Option<session::SignedIn>>;

    /// [`Store::session_revoke`](super::Store::session_revoke) on this backend.
    async fn session_revoke(&self, digest: &str) -> Result<()>;
}

/// Named access tokens.
#[async_trait]
pub trait TokenDriver: Send + Sync {
    /// [`Store::token_create`](super::Store::token_create) on this backend.
    async fn token_create(&self, change: &audit::Change<'_>, token: &token::NewToken) -> Result<token::Created>;

    /// [`Store::token_revoke`](super::Store::token_revoke) on this backend.
    async fn token_revoke(&self, change: &audit::Change<'_>, name: &str) -> Result<bool>;

    /// [`Store::tokens`](super::Store::tokens) on this backend.
    async fn tokens(&self) -> Result<Vec<token::TokenInfo>>;

    /// [`Store::token_holder`](super::Store::token_holder) on this backend.
    async fn token_holder(&self, digest: &str) -> Result<Option<token::TokenHolder>>;
}

/// Outbound grants.
#[async_trait]
pub trait GrantDriver: Send + Sync {
    /// [`Store::grant_set`](super::Store::grant_set) on this backend.
    async fn grant_set(&self, change: &audit::Change<'_>, grant: &grant::NewGrant) -> Result<bool>;

    /// [`Store::grant_revoke`](super::Store::grant_revoke) on this backend.
    async fn grant_revoke(&self, change: &audit::Change<'_>, job_type: &str, origin: &str) -> Result<bool>;

    /// [`Store::grants`](super::Store::grants) on this backend.
    async fn grants(&self, job_type: Option<&str>) -> Result<Vec<grant::OutboundGrant>>;
}

/// Sealed secrets.
#[async_trait]
pub trait SecretDriver: Send + Sync {
    /// [`Store::secret_set`](super::Store::secret_set) on this backend.
    async fn secret_set(&self, change: &audit::Change<'_>, name: &str, sealed: &secret::Sealed) -> Result<bool>;

    /// [`Store::secret_delete`](super::Store::secret_delete) on this backend.
    async fn secret_delete(&self, change: &audit::Change<'_>, name: &str) -> Result<bool>;

    /// [`Store::secrets_list`](super::Store::secrets_list) on this backend.
    async fn secrets_list(&self) -> Result<Vec<secret::SecretInfo>>;

    /// [`Store::secrets_sealed`](super::Store::secrets_sealed) on this backend.
    async fn secrets_sealed(&self, names: &[String]) -> Result<Vec<(String, secret::Sealed)>>;
}

/// Job types' plain variables.
#[async_trait]
pub trait VariableDriver: Send + Sync {
    /// [`Store::var_set`](super::Store::var_set) on this backend.
    async fn var_set(&self, change: &audit::Change<'_>, job_type: &str, name: &str, value: &str) -> Result<bool>;

    /// [`Store::var_unset`](super::Store::var_unset) on this backend.
    async fn var_unset(&self, change: &audit::Change<'_>, job_type: &str, name: &str) -> Result<bool>;

    /// [`Store::vars`](super::Store::vars) on this backend.
    async fn vars(&self, job_type: Option<&str>) -> Result<Vec<variable::TypeVariable>>;
}

/// The fleet's minutes (`history.rs` of each backend).
#[async_trait]
pub trait HistoryDriver: Send + Sync {
    /// [`Store::history_roll`](super::Store::history_roll) on this backend.
    async fn history_roll(&self, retention_secs: f64) -> Result<u64>;

    /// [`Store::history_add_retries`](super::Store::history_add_retries) on this backend.
    async fn history_add_retries(&self, counts: &[super::history::RetryCount]) -> Result<()>;

    /// [`Store::history_read`](super::Store::history_read) on this backend.
    async fn history_read(
        &self,
        minutes: i64,
        job: Option<&str>,
    ) -> Result<(chrono::DateTime<chrono::Utc>, Vec<super::history::HistoryMinute>)>;
}

/// The trace contexts enqueues carried (`trace.rs` of each backend).
#[async_trait]
pub trait TraceDriver: Send + Sync {
    /// [`Store::job_traceparent`](super::Store::job_traceparent) on this backend.
    async fn job_traceparent(&self, id: i64) -> Result<Option<String>>;
}

/// The audit trail's rows: a refusal recorded on its own, listings, pruning.
#[async_trait]
pub trait AuditDriver: Send + Sync {
    /// [`Store::audit_record`](super::Store::audit_record) on this backend.
    async fn audit_record(&self, change: &audit::Change<'_>, outcome: &str, count: i64) -> Result<()>;

    /// [`Store::audit_list`](super::Store::audit_list) on this backend.
    async fn audit_list(&self, filter: &audit::Filter) -> Result<Vec<audit::Entry>>;

    /// [`Store::audit_prune`](super::Store::audit_prune) on this backend.
    async fn audit_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64>;
}

/// Everything a backend implements, as the front holds it.
#[allow(private_bounds)]
pub trait Driver:
    SchemaDriver
    + DeployDriver
    + FleetDriver
    + JobDriver
    + OperateDriver
    + LeaseDriver
    + SemaphoreDriver
    + RateDriver
    + BatchDriver
    + WorkflowDriver
    + EventDriver
    + WebhookDriver
    + ScheduleDriver
    + KeyedScheduleDriver
    + SessionDriver
    + TokenDriver
    + GrantDriver
    + SecretDriver
    + VariableDriver
    + HistoryDriver
    + TraceDriver
    + AuditDriver
    + Backend
    + BlockedSweep
    + 'static
{
}

#[allow(private_bounds)]
impl<T> Driver for T where
    T: SchemaDriver
        + DeployDriver
        + FleetDriver
        + JobDriver
        + OperateDriver
        + LeaseDriver
        + SemaphoreDriver
        + RateDriver
        + BatchDriver
        + WorkflowDriver
        + EventDriver
        + WebhookDriver
        + ScheduleDriver
        + KeyedScheduleDriver
        + SessionDriver
        + TokenDriver
        + GrantDriver
        + SecretDriver
        + VariableDriver
        + HistoryDriver
        + TraceDriver
        + AuditDriver
        + Backend
        + BlockedSweep
        + 'static
{
}
