//! The store as the rest of the host sees it: one front over a backend's
//! [`Driver`], owning the rules (enqueue, finish, batches, schedule ticks),
//! the loops over pages and the retries, so each is written once for both
//! backends. Cloning it is cheap: the clones share the backend.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::audit::{self, Actor, Via};
use super::driver::{Driver, TickDecider};
use super::fleet::Registered;
use super::keyed_schedule::{self, KeyedPass, KeyedSchedule, KeyedScheduleStatus};
use super::workflow::{CreatedWorkflow, NewWorkflow, Workflow, WorkflowCancel};
use super::{
    Batch, Cancel, DeployChange, DeployRequest, Deployment, DeploymentEntry, EnqueueParams, Enqueued, FetchParams,
    FetchedJob, Finish, FinishOutcome, FinishResult, Fired, HostInfo, HostRow, JobDetail, JobFilter, JobRow, JobState,
    JobTypeRow, KeyCursor, KeyPage, KeyStatus, LeaseRenew, LeaseRenewal, LockedKeys, NewBatch, Result, RunId,
    ScheduleState, Schedules, SemaphoreFix, Stats, batch, concurrency, enqueue, finish, grant, schedule, secret,
    session, token, variable, workflow,
};

/// The durable queue. Enqueue and finish are the shared rules over the
/// backend's `Backend` writer, which is private to this crate so that
/// nothing outside can write a job the rules did not prepare; the rest
/// each backend's [`Driver`] does.
#[derive(Clone)]
pub struct Store {
    driver: Arc<dyn Driver>,
    /// Whom its changes are recorded as in the audit trail.
    actor: Arc<Actor>,
}

impl Store {
    /// The front over a backend.
    pub fn new(driver: impl Driver) -> Store {
        Store { driver: Arc::new(driver), actor: Arc::new(Actor::os_user(Via::Library)) }
    }

    /// The front over a backend shared with its other users (a benchmark
    /// that also reads the database through the backend's own pool).
    pub fn shared<D: Driver>(driver: Arc<D>) -> Store {
        Store { driver, actor: Arc::new(Actor::os_user(Via::Library)) }
    }

    /// The same store, its changes recorded in the audit trail as made by
    /// `actor` (a store is made as the process's OS user, through the
    /// library).
    pub fn acting_as(&self, actor: Actor) -> Store {
        Store { driver: self.driver.clone(), actor: Arc::new(actor) }
    }

    /// Whom its changes are recorded as.
    pub fn actor(&self) -> &Actor {
        &self.actor
    }

    /// `result` of `change`, recording a refusal (a job in the wrong
    /// state, a name taken, a row the database refused) in the trail on
    /// its own, since the change's transaction rolled back. A database that
    /// failed records nothing: it said nothing of the change.
    async fn recorded<T>(&self, change: &audit::Change<'_>, result: Result<T>) -> Result<T> {
        if let Err(error) = &result
            && (error.is_refusal() || !matches!(error, super::Error::Database(_)))
        {
            let outcome = format!("refused: {error}");
            if let Err(failed) = self.driver.audit_record(change, &outcome, 1).await {
                tracing::warn!(error = %failed, action = change.action, "cannot record a refused change in the audit trail");
            }
        }
        result
    }

    /// Records a change that was refused before it reached the store (an
    /// HTTP request without the role), `count` of them in one row.
    pub async fn audit_record(&self, change: &audit::Change<'_>, outcome: &str, count: i64) -> Result<()> {
        self.driver.audit_record(change, outcome, count).await
    }

    /// The trail's rows `filter` picks, newest first.
    pub async fn audit_list(&self, filter: &audit::Filter) -> Result<Vec<audit::Entry>> {
        self.driver.audit_list(filter).await
    }

    /// Removes up to `limit` rows older than `retention_secs` (before `now`,
    /// the database's clock unless given); how many it removed.
    pub async fn audit_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
        self.driver.audit_prune(now, retention_secs, limit).await
    }

    /// Brings the schema up to date.
    pub async fn schema_migrate(&self) -> Result<()> {
        self.driver.schema_migrate().await
    }

    /// Where the data lives, for logs: a file's absolute path, or a
    /// server's host, port and database (never a password).
    pub fn location(&self) -> String {
        self.driver.location()
    }

    /// Whether the database holds jobhost's schema (any migration applied):
    /// commands other than `run` and `migrate` say to migrate instead of
    /// failing on a missing table.
    pub async fn schema_present(&self) -> Result<bool> {
        self.driver.schema_present().await
    }

    /// Changes what the fleet serves for `job_type` from the database, in
    /// one transaction holding the type's lock: stores a deployed
    /// component's bytes (once per digest), appends the history entry the
    /// request calls for, and tells listening hosts.
    ///
    /// # Errors
    /// [`Error::DeployRefused`](super::Error::DeployRefused) when the request cannot apply; database errors.
    pub async fn deployment_change(&self, job_type: &str, request: DeployRequest<'_>) -> Result<DeployChange> {
        let action = match request {
            DeployRequest::Deploy { .. } => "component.deploy",
            DeployRequest::Rollback { .. } => "component.rollback",
            DeployRequest::Undeploy => "component.undeploy",
        };
        let change = self.actor.change(action, format!("type {job_type}"));
        self.recorded(&change, self.driver.deployment_change(&change, job_type, request).await).await
    }

    /// What the fleet serves from the database: each deployed type's version.
    pub async fn deployments_current(&self) -> Result<Vec<Deployment>> {
        self.driver.deployments_current().await
    }

    /// A job type's history, newest first.
    pub async fn deployment_history(&self, job_type: &str) -> Result<Vec<DeploymentEntry>> {
        self.driver.deployment_history(job_type).await
    }

    /// A deployed component's bytes.
    pub async fn component_source(&self, digest: &str) -> Result<Option<Vec<u8>>> {
        self.driver.component_source(digest).await
    }

    /// Waits up to `timeout` for a change to the deployments: told at once
    /// on PostgreSQL; on SQLite, a short wait after which the caller looks.
    pub async fn deployments_wait(&self, timeout: std::time::Duration) {
        self.driver.deployments_wait(timeout).await
    }

    /// Records the configurations this host loaded, so enqueuers without the
    /// component apply them.
    pub async fn job_types_register(&self, types: &[(crate::types::JobConfig, String)]) -> Result<()> {
        let Registered { changed, promoted } = self.driver.job_types_register(types).await?;
        if promoted > 0 {
            tracing::info!(promoted, job_types = ?changed, "a new limit promoted blocked jobs");
        }
        Ok(())
    }

    /// The names of every registered job type.
    pub async fn job_types_names(&self) -> Result<Vec<String>> {
        self.driver.job_types_names().await
    }

    /// The registered configuration of each named job type that exists.
    pub async fn job_types_get(&self, names: &[String]) -> Result<HashMap<String, crate::types::JobConfig>> {
        self.driver.configs_read(names).await
    }

    /// Adds or refreshes this host's row (fleet membership, job types served).
    pub async fn host_upsert(&self, host: &HostInfo) -> Result<()> {
        self.driver.host_upsert(host).await
    }

    /// Every host's row, alive or presumed dead (until pruned), by id.
    pub async fn host_list(&self) -> Result<Vec<HostRow>> {
        self.driver.host_list().await
    }

    /// Every registered job type with the configuration it declared, by name.
    pub async fn job_types_list(&self) -> Result<Vec<JobTypeRow>> {
        self.driver.job_types_list().await
    }

    /// How many jobs ended within the last `secs` seconds, by final state:
    /// the throughput operators watch.
    pub async fn job_finished_since(&self, secs: f64) -> Result<std::collections::BTreeMap<JobState, i64>> {
        self.driver.job_finished_since(secs).await
    }

    /// Removes this host's row at shutdown.
    pub async fn host_remove(&self, host_id: &str) -> Result<()> {
        self.driver.host_remove(host_id).await
    }

    /// Removes the rows of hosts not seen for `silent_secs` (killed hosts
    /// never leave by themselves). Returns how many.
    pub async fn host_prune(&self, silent_secs: f64) -> Result<u64> {
        self.driver.host_prune(silent_secs).await
    }

    /// Enqueues jobs, all or none, returning their ids in order: for a
    /// duplicate of a unique job, the id of the job holding its key.
    pub async fn job_enqueue(&self, jobs: &[EnqueueParams]) -> Result<Vec<i64>> {
        Ok(enqueue::enqueue(&*self.driver, jobs).await?.into_iter().map(Enqueued::id).collect())
    }

    /// [`Store::job_enqueue`], saying of each job whether it was stored or
    /// was a duplicate (and whether it replaced the waiting job's payload).
    pub async fn job_enqueue_outcomes(&self, jobs: &[EnqueueParams]) -> Result<Vec<Enqueued>> {
        enqueue::enqueue(&*self.driver, jobs).await
    }

    /// Leases up to `limit` available jobs to a host, each with a fresh token.
    pub async fn job_fetch(&self, params: &FetchParams) -> Result<Vec<FetchedJob>> {
        self.driver.job_fetch(params).await
    }

    /// Ends or reschedules runs, each matched on its lease token, in one
    /// transaction with the children of those that completed. Superseded
    /// results are taken out first ([`finish::current_runs`]).
    pub async fn job_finish(&self, finishes: Vec<Finish>) -> Result<Vec<FinishResult>> {
        Ok(finish::finish(&*self.driver, finishes, None, LockedKeys::Wait).await?.0)
    }

    /// [`Store::job_finish`], then leases up to `next.limit` jobs to the
    /// writing host as [`Store::job_fetch`] would, in one transaction: the
    /// jobs the finished runs made room for start without another round trip.
    /// It does not wait for a key's semaphore another transaction holds: those
    /// results come back [`FinishResult::Deferred`].
    pub async fn job_finish_and_fetch(
        &self,
        finishes: Vec<Finish>,
        next: &FetchParams,
    ) -> Result<(Vec<FinishResult>, Vec<FetchedJob>)> {
        finish::finish(&*self.driver, finishes, Some(next), LockedKeys::Defer).await
    }

    /// Readies the connection result writes go out on, so a host's first
    /// writes are as quick as its later ones; it changes nothing in the
    /// database. A host calls it as it starts.
    pub async fn result_writes_warm(&self) -> Result<()> {
        self.driver.writes_warm().await
    }

    /// Records that the guests of `runs` have started now, confirming their
    /// leases (an expiry of them then spends the attempt): for jobs that
    /// waited on their host for a run slot after their lease, whose
    /// `started_at` the fetch set to the lease time. A run no longer current
    /// changes nothing. One statement for all of them.
    pub async fn lease_started(&self, runs: &[RunId]) -> Result<()> {
        self.driver.lease_started(runs).await
    }

    /// Renews the leases a host still holds, in one statement that never
    /// waits on a row lock: says which runs were renewed and which are no
    /// longer this host's (see [`LeaseRenewal`]). Each renewed run among
    /// `started` is confirmed, and each among `progress` records its latest
    /// progress, so it shows while the job runs. Also reads the host's
    /// running jobs it did not ask about and never confirmed (strays).
    pub async fn lease_renew(&self, renew: &LeaseRenew<'_>) -> Result<LeaseRenewal> {
        self.driver.lease_renew(renew).await
    }

    /// Returns jobs whose lease expired to `available`, or to the archive as
    /// failed when their attempts are spent (as cancelled when an operator
    /// asked to cancel them). A lease whose host never confirmed the run's
    /// start gives its attempt back instead (at most
    /// [`lease::UNCONFIRMED_EXPIRIES_REFUNDED`] times a job). Returns
    /// (requeued, archived).
    pub async fn lease_expire(&self, now: Option<DateTime<Utc>>) -> Result<(u64, u64)> {
        Ok(self.driver.lease_expire(now).await?.logged())
    }

    /// Passes scheduled jobs that have come due through the gate. Returns how many.
    pub async fn job_promote_due(&self, now: Option<DateTime<Utc>>) -> Result<u64> {
        self.driver.job_promote_due(now).await
    }

    /// Scheduled jobs due by `now`, at most `limit`, the longest due first:
    /// what [`Store::job_promote_due`] takes, so maintenance can pass them a
    /// part at a time when the database refuses the whole batch.
    pub async fn job_due_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
        self.driver.job_due_ids(now, limit).await
    }

    /// [`Store::job_promote_due`] for the named jobs only. Returns how many.
    pub async fn job_promote_due_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<u64> {
        self.driver.job_promote_due_ids(now, ids).await
    }

    /// Running jobs whose lease expired by `now`, at most `limit`.
    pub async fn lease_expired_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>> {
        self.driver.lease_expired_ids(now, limit).await
    }

    /// [`Store::lease_expire`] for the named jobs only.
    pub async fn lease_expire_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<(u64, u64)> {
        Ok(self.driver.lease_expire_ids(now, ids).await?.logged())
    }

    /// Moves a live job that maintenance cannot process to the archive as
    /// failed, with `reason` as its last error, so the sweeps go on without
    /// it and operators see it (guarantee 13). A blocked job is never
    /// quarantined (guarantee 2). Returns whether the job was there.
    pub async fn job_quarantine(&self, id: i64, reason: &str) -> Result<bool> {
        // The job's own errors may be what the database refuses (a value
        // past a column's range): it goes without them rather than stay.
        match self.driver.quarantine_write(id, reason, true).await {
            Err(error) if error.is_refusal() => self.driver.quarantine_write(id, reason, false).await,
            other => other,
        }
    }

    /// Visits the next `max_keys` keys with blocked jobs after `after` (from
    /// the first key when `None`), in (job type, key) order, and promotes
    /// the blocked jobs of those that can take a slot now. A page, so a pass
    /// costs the same however many keys and blocked jobs there are; a
    /// sweep that follows `next` visits every key in turn, so busy keys
    /// cannot starve one with a free slot (guarantee 4). Returns how many
    /// jobs it promoted.
    pub async fn blocked_promote(&self, after: Option<&KeyCursor>, max_keys: i64) -> Result<KeyPage<u64>> {
        concurrency::promote_blocked(&*self.driver, after, max_keys).await
    }

    /// Corrects the semaphores of the next `max_keys` keys after `after`
    /// (from the first key when `None`) whose holder count disagrees with
    /// the live jobs holding their slots, and recreates the missing rows of
    /// keys with live holders; returns what it changed. A page, as for
    /// [`Store::blocked_promote`].
    pub async fn semaphore_repair_page(
        &self,
        after: Option<&KeyCursor>,
        max_keys: i64,
    ) -> Result<KeyPage<Vec<SemaphoreFix>>> {
        self.driver.semaphore_repair_page(after, max_keys).await.map(concurrency::logged_repairs)
    }

    /// [`Store::semaphore_repair_page`] over every key, a page at a time:
    /// for operators and tests that want the whole table checked now.
    /// Returns what it changed.
    pub async fn semaphore_repair(&self) -> Result<Vec<SemaphoreFix>> {
        let mut fixes = Vec::new();
        let mut after: Option<KeyCursor> = None;
        loop {
            let page = self.semaphore_repair_page(after.as_ref(), 1_000).await?;
            fixes.extend(page.done);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(fixes),
            }
        }
    }

    /// Every key with holders or blocked jobs.
    pub async fn semaphore_list(&self) -> Result<Vec<KeyStatus>> {
        self.driver.semaphore_list().await
    }

    /// Slots of a key free right now (the limit minus its holders; at most
    /// zero when a lowered limit left it over). A snapshot, not a claim.
    pub async fn semaphore_free_slots(&self, job: &str, key: &str) -> Result<i64> {
        self.driver.semaphore_free_slots(job, key).await
    }

    /// Deletes archived jobs (with their batches) that finished more than
    /// `retention_secs` before `now` (the database's clock by default), at
    /// most `limit`, and as many finished workflows.
    pub async fn archive_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
        self.driver.workflow_prune(now, retention_secs, limit).await?;
        self.driver.archive_prune(now, retention_secs, limit).await
    }

    /// Lists jobs, live and archived, newest first.
    pub async fn job_list(&self, filter: &JobFilter) -> Result<Vec<JobRow>> {
        self.driver.job_list(filter).await
    }

    /// One job with its payload, errors, log and output.
    pub async fn job_get(&self, id: i64) -> Result<Option<JobDetail>> {
        let Some(mut job) = self.driver.job_get(id).await? else {
            return Ok(None);
        };
        job.workflow = self.driver.workflow_of_job(id).await?.map(|(id, step)| super::job::StepOf { id, step });
        Ok(Some(job))
    }

    /// Counts by state and queue, the oldest wait, and live hosts.
    pub async fn job_stats(&self) -> Result<Stats> {
        let stats = self.driver.job_stats().await?;
        Ok(super::fleet::with_fleet_warnings(stats, self.driver.host_health().await?))
    }

    /// Writes the end of a run that cannot exist ([`super::job::NO_RUN`])
    /// the way a result write goes, on the same connection and through the
    /// same statements: it matches and changes nothing. That it succeeds
    /// says results get through, which a ping cannot: a host that gave its
    /// jobs up because its writes failed resumes on it when it has no
    /// result of its own left to write.
    pub async fn result_write_probe(&self) -> Result<()> {
        let probe = Finish {
            id: super::job::NO_RUN,
            lease_token: super::job::NO_RUN,
            attempt: 1,
            outcome: FinishOutcome::Failed { error: "a probe of result writes".into() },
            log: serde_json::Value::Null,
            progress: None,
            concurrency_key: None,
            batch_id: None,
            traceparent: None,
        };
        let results = self.job_finish(vec![probe]).await?;
        debug_assert_eq!(results, [FinishResult::Duplicate], "a probe matches no run");
        Ok(())
    }

    /// Answers when the database does: tells a write the database will not
    /// take from a database that is down.
    pub async fn database_ping(&self) -> Result<()> {
        self.driver.database_ping().await
    }

    /// Runs a failed, discarded or cancelled job again (a new attempt budget),
    /// or a scheduled one now.
    pub async fn job_retry(&self, id: i64) -> Result<()> {
        let change = self.actor.change("job.retry", format!("job {id}")).answering("retried", "retried");
        self.recorded(&change, self.driver.job_retry(&change, id).await).await
    }

    /// Cancels a job: at once when it is waiting, available or blocked; a
    /// running one through its host (see [`Cancel::Requested`]).
    pub async fn job_cancel(&self, id: i64) -> Result<Cancel> {
        let change = self.actor.change("job.cancel", format!("job {id}"));
        self.recorded(&change, self.driver.job_cancel(&change, id).await).await
    }

    /// Pauses a queue: no host leases a job from it until it is resumed;
    /// running jobs finish. Returns false when it was paused already.
    pub async fn queue_pause(&self, queue: &str) -> Result<bool> {
        let change = self.actor.change("queue.pause", format!("queue {queue}")).answering("paused", "already paused");
        self.recorded(&change, self.driver.queue_pause(&change, queue).await).await
    }

    /// Resumes a paused queue. Returns false when it was not paused.
    pub async fn queue_resume(&self, queue: &str) -> Result<bool> {
        let change = self.actor.change("queue.resume", format!("queue {queue}")).answering("resumed", "not paused");
        self.recorded(&change, self.driver.queue_resume(&change, queue).await).await
    }

    /// Creates a batch with its first members, all or none, and closes it
    /// unless [`NewBatch::open`]; returns its id and what became of each
    /// member (a duplicate of a unique job is not a member). Callbacks must
    /// be registered types whose keys render from the callback payload.
    pub async fn batch_create(&self, batch: &NewBatch, members: &[EnqueueParams]) -> Result<(i64, Vec<Enqueued>)> {
        batch::create(&*self.driver, batch, members).await
    }

    /// Closes an open batch: it takes no more members, and finishes (its
    /// callbacks enqueued) once every member has ended, at once if they all
    /// have. False when it was closed already.
    pub async fn batch_close(&self, id: i64) -> Result<bool> {
        self.driver.batch_close(id).await
    }

    /// One batch with its counts and progress.
    pub async fn batch_get(&self, id: i64) -> Result<Option<Batch>> {
        self.driver.batch_get(id).await
    }

    /// Batches newest first, at most `limit`.
    pub async fn batch_list(&self, limit: i64) -> Result<Vec<Batch>> {
        self.driver.batch_list(limit).await
    }

    /// Creates a workflow, all or none: checks it (names, dependencies, no
    /// cycle, at most [`MAX_WORKFLOW_STEPS`](super::workflow::MAX_WORKFLOW_STEPS)
    /// steps, each a job an enqueue would accept), stores its steps and
    /// releases those that wait for nothing, in one transaction.
    ///
    /// # Errors
    /// [`Error::InvalidWorkflow`](super::Error::InvalidWorkflow) naming the
    /// problem, with nothing stored; database errors.
    pub async fn workflow_create(&self, workflow: &NewWorkflow) -> Result<CreatedWorkflow> {
        let names = enqueue::job_names(workflow.steps.iter().map(|s| s.job.as_str()));
        let configs = self.driver.configs_read(&names).await?;
        let prepared = workflow::prepare(workflow, &configs, self.driver.limits())?;
        self.driver.workflow_write(prepared).await
    }

    /// One workflow with its steps in dependency order.
    pub async fn workflow_get(&self, id: i64) -> Result<Option<Workflow>> {
        let workflow = self.driver.workflow_get(id).await?;
        Ok(workflow.map(|w| Workflow { steps: workflow::in_dependency_order(w.steps), ..w }))
    }

    /// Workflows newest first, at most `limit`, with their step counts.
    pub async fn workflow_list(&self, limit: i64) -> Result<Vec<Workflow>> {
        self.driver.workflow_list(limit).await
    }

    /// The workflow and step name of a job that is a workflow step.
    pub async fn workflow_of_job(&self, job_id: i64) -> Result<Option<(i64, String)>> {
        self.driver.workflow_of_job(job_id).await
    }

    /// Cancels a workflow: no step is released to run after this, its
    /// waiting steps end as cancelled, and each released step not yet ended
    /// is cancelled as [`Store::job_cancel`] does (a running one by its
    /// host, at its next renewal). None when there is no such workflow.
    pub async fn workflow_cancel(&self, id: i64) -> Result<Option<WorkflowCancel>> {
        let change = self.actor.change("workflow.cancel", format!("workflow {id}")).answering("cancelled", "absent");
        let Some((waiting, live)) = self.recorded(&change, self.driver.workflow_cancel(&change, id).await).await?
        else {
            return Ok(None);
        };
        let mut done = WorkflowCancel { waiting_cancelled: waiting, ..WorkflowCancel::default() };
        for job in live {
            // Each of its jobs is a cancel of its own, recorded as one.
            let change = self.actor.change("job.cancel", format!("job {job} of workflow {id}"));
            match self.driver.job_cancel(&change, job).await {
                Ok(Cancel::Cancelled) => done.jobs_cancelled += 1,
                Ok(Cancel::Requested) => done.cancel_requested += 1,
                // It ended meanwhile: nothing left to cancel.
                Err(super::Error::WrongState { .. } | super::Error::NotFound { .. }) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(Some(done))
    }

    /// Sends an event: stores it and ends every armed wait for its key whose
    /// match its payload holds, each releasing its step, in one transaction
    /// (`source` says where it came from: `cli`, `api`). With an
    /// `idempotency_key` already used, nothing is stored or released and the
    /// first event comes back, marked a duplicate.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`](super::Error::InvalidEvent) for a bad key or
    /// payload: nothing sent.
    pub async fn event_send(
        &self,
        key: &str,
        payload: &serde_json::Value,
        idempotency_key: Option<&str>,
        source: &str,
    ) -> Result<super::wait::SentEvent> {
        super::wait::check_event(key, payload, self.driver.limits().max_payload_bytes)?;
        if let Some(idempotency) = idempotency_key {
            super::wait::check_event_key(idempotency)
                .map_err(|reason| super::Error::InvalidEvent(format!("idempotency key: {reason}")))?;
        }
        let change = self.actor.change("event.send", format!("event {key}"));
        self.recorded(&change, self.driver.event_send(&change, key, payload, idempotency_key, source).await).await
    }

    /// Recent events, newest first, of one key or all.
    pub async fn event_list(&self, key: Option<&str>, limit: i64) -> Result<Vec<super::wait::StoredEvent>> {
        self.driver.event_list(key, limit).await
    }

    /// Ends up to `batch` waits due by `now` (sleeps by their time, event
    /// waits by their timeout) and arms waits left unarmed; returns how many.
    pub async fn waits_due(&self, now: Option<DateTime<Utc>>, batch: i64) -> Result<u64> {
        self.driver.waits_due(now, batch).await
    }

    /// Adds or replaces an inbound webhook; true when it replaced one.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`](super::Error::InvalidEvent) for a bad name,
    /// key template, secret name or tolerance: nothing stored.
    pub async fn webhook_set(&self, webhook: &super::webhook::Webhook) -> Result<bool> {
        super::webhook::check(webhook)?;
        let change =
            self.actor.change("webhook.set", format!("webhook {}", webhook.name)).answering("replaced", "created");
        self.recorded(&change, self.driver.webhook_set(&change, webhook).await).await
    }

    /// Removes an inbound webhook; false when there was none.
    pub async fn webhook_delete(&self, name: &str) -> Result<bool> {
        let change = self.actor.change("webhook.delete", format!("webhook {name}")).answering("removed", "absent");
        self.recorded(&change, self.driver.webhook_delete(&change, name).await).await
    }

    /// One inbound webhook by name.
    pub async fn webhook_get(&self, name: &str) -> Result<Option<super::webhook::Webhook>> {
        self.driver.webhook_get(name).await
    }

    /// Every inbound webhook, by name.
    pub async fn webhook_list(&self) -> Result<Vec<super::webhook::Webhook>> {
        self.driver.webhook_list().await
    }

    /// Deletes up to `limit` events older than `retention_secs`.
    pub async fn event_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64> {
        self.driver.event_prune(now, retention_secs, limit).await
    }

    /// Waits until a job has ended (completed, failed, discarded or
    /// cancelled) and returns it, or `None` when `timeout` passes first.
    /// Woken by the database's announcements, not by polling.
    ///
    /// # Errors
    /// [`Error::NotFound`](super::Error::NotFound) for a job that does not exist.
    pub async fn job_wait(&self, id: i64, timeout: std::time::Duration) -> Result<Option<JobDetail>> {
        self.driver.job_wait(id, timeout).await
    }

    /// Waits until jobs may be available (a notification), or `timeout`.
    pub async fn job_wait_available(&self, timeout: std::time::Duration) {
        self.driver.job_wait_available(timeout).await
    }

    /// Holds the key of `run`'s job (its rate key, else its concurrency key,
    /// else its type) until `delay_ms` from now by the database's clock: no
    /// run of the key starts before then, fleet-wide. A later throttle
    /// never shortens an earlier one. False when `run` no longer holds its
    /// lease: a stale run throttles nothing.
    pub async fn rate_throttle(&self, run: super::RunId, delay_ms: u64) -> Result<bool> {
        self.driver.rate_throttle(run, delay_ms).await
    }

    /// The keys whose starts are counted now (a start within the window, or
    /// a throttle in force), in (type, key) order, at most
    /// [`MAX_LISTED_KEYS`](super::rate::MAX_LISTED_KEYS).
    pub async fn rate_key_list(&self) -> Result<Vec<super::rate::RateKeyStatus>> {
        self.driver.rate_key_list().await
    }

    /// Each job type's jobs sent back to wait for a start and its throttles,
    /// summed over its keys.
    pub async fn rate_totals(&self) -> Result<Vec<super::rate::RateTotals>> {
        self.driver.rate_totals().await
    }

    /// Computes the history's next minutes from the archive (at most
    /// [`MINUTES_PER_PASS`](super::history::MINUTES_PER_PASS) from where
    /// the last computation stopped, the last few again), samples the live
    /// jobs' depth into the current minute, and deletes minutes older than
    /// `retention_secs`. Safe with many hosts at once: on PostgreSQL one
    /// computes while the others pass; a minute computed twice ends with
    /// the same figures. Returns the rows computed.
    pub async fn history_roll(&self, retention_secs: f64) -> Result<u64> {
        self.driver.history_roll(retention_secs).await
    }

    /// Adds a host's retried attempts to the history's minutes.
    pub async fn history_add_retries(&self, counts: &[super::history::RetryCount]) -> Result<()> {
        self.driver.history_add_retries(counts).await
    }

    /// The points of `range` for one job type or the whole fleet, by the
    /// database's clock.
    pub async fn history(
        &self,
        range: super::history::HistoryRange,
        job: Option<&str>,
    ) -> Result<Vec<super::history::HistoryPoint>> {
        let (now, minutes) = self.driver.history_read(range.minutes(), job).await?;
        Ok(super::history::points(range, now, &minutes))
    }

    /// The W3C trace context job `id` was enqueued with, if it was enqueued
    /// inside a trace (or by a run, whose trace its children continue).
    pub async fn job_traceparent(&self, id: i64) -> Result<Option<String>> {
        self.driver.job_traceparent(id).await
    }

    /// How long until the soonest scheduled job is due, by the database's
    /// clock (zero when one is overdue); `None` when none is scheduled.
    pub async fn job_next_due(&self) -> Result<Option<std::time::Duration>> {
        self.driver.job_next_due().await
    }

    /// Waits until a fetch sent jobs back to wait for a start (a rate
    /// limit; on PostgreSQL any host's fetch, on SQLite this process's),
    /// or `timeout`: the due jobs' timer looks again.
    pub async fn job_wait_sent_back(&self, timeout: std::time::Duration) {
        self.driver.job_wait_sent_back(timeout).await
    }

    /// Every scheduled job type with its cursor and whether a live host
    /// serves it, and the clock to read ticks by: the database's, or `now`
    /// when a test gives one (hosts' liveness is judged by the database's
    /// clock either way).
    pub async fn schedule_list(&self, now: Option<DateTime<Utc>>) -> Result<Schedules> {
        self.driver.schedule_list(now).await
    }

    /// Records that a look at `at` (its clock) handled the schedules of
    /// `jobs`: it wrote their due ticks or found none due. The fleet's
    /// latest look, not one host's memory, tells a late tick from a missed
    /// one ([`ScheduleState::looked_at`]).
    pub async fn schedule_looked(&self, jobs: &[String], at: DateTime<Utc>) -> Result<()> {
        self.driver.schedule_looked(jobs, at).await
    }

    /// Creates or replaces the schedule of a job type and key (an upsert),
    /// checked first: a bad field, an unknown job type or a payload the
    /// enqueue rules refuse is [`super::Error::InvalidSchedule`] naming the
    /// field, and nothing is stored. True when it created the schedule.
    pub async fn keyed_schedule_upsert(&self, schedule: &KeyedSchedule) -> Result<bool> {
        let configs = self.driver.configs_read(std::slice::from_ref(&schedule.job)).await?;
        keyed_schedule::check_registered(schedule, configs.get(&schedule.job), self.driver.limits())?;
        let change = self
            .actor
            .change("schedule.set", format!("schedule {}/{}", schedule.job, schedule.key))
            .answering("created", "replaced");
        self.recorded(&change, self.driver.keyed_schedule_upsert(&change, schedule).await).await
    }

    /// Pauses a keyed schedule (with a note for the next operator) or
    /// resumes it; a resume counts from now. False when there is none.
    pub async fn keyed_schedule_pause(&self, job: &str, key: &str, paused: bool, note: Option<&str>) -> Result<bool> {
        if let Some(note) = note {
            keyed_schedule::check_note(note)
                .map_err(|reason| super::Error::InvalidSchedule(format!("note: {reason}")))?;
        }
        let change = match paused {
            true => self.actor.change("schedule.pause", format!("schedule {job}/{key}")).answering("paused", "absent"),
            false => {
                self.actor.change("schedule.resume", format!("schedule {job}/{key}")).answering("resumed", "absent")
            }
        };
        self.recorded(&change, self.driver.keyed_schedule_pause(&change, job, key, paused, note).await).await
    }

    /// Removes a keyed schedule: no tick after this commits. False when
    /// there was none.
    pub async fn keyed_schedule_remove(&self, job: &str, key: &str) -> Result<bool> {
        let change =
            self.actor.change("schedule.remove", format!("schedule {job}/{key}")).answering("removed", "absent");
        self.recorded(&change, self.driver.keyed_schedule_remove(&change, job, key).await).await
    }

    /// Asks for one tick of a keyed schedule now, under its overlap policy,
    /// enqueued by the next pass of any host. False when there is none.
    pub async fn keyed_schedule_trigger(&self, job: &str, key: &str) -> Result<bool> {
        let change =
            self.actor.change("schedule.trigger", format!("schedule {job}/{key}")).answering("triggered", "absent");
        self.recorded(&change, self.driver.keyed_schedule_trigger(&change, job, key).await).await
    }

    /// The keyed schedules, of one type or one key when given.
    pub async fn keyed_schedules(&self, job: Option<&str>, key: Option<&str>) -> Result<Vec<KeyedScheduleStatus>> {
        self.driver.keyed_schedules(job, key).await
    }

    /// Up to `limit` keyed schedules (of one type when given) after
    /// `after`, a (type, key), by type and key: a page of the list.
    pub async fn keyed_schedules_page(
        &self,
        job: Option<&str>,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<KeyedScheduleStatus>> {
        self.driver.keyed_schedules_page(job, after, limit).await
    }

    /// Enqueues the ticks of a keyed schedule from `from` to `to` (a past
    /// range, at most 1,000 ticks), each once: a tick a job of the
    /// schedule already has, live or archived, is not enqueued again. Every
    /// tick is enqueued whatever the overlap policy; each job has its own
    /// `_tick`. `None` when there is no such schedule.
    ///
    /// # Errors
    /// [`super::Error::InvalidSchedule`] for a range in the future, or too long.
    pub async fn keyed_schedule_backfill(
        &self,
        job: &str,
        key: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Option<keyed_schedule::Backfilled>> {
        let Some(status) = self.driver.keyed_schedules(Some(job), Some(key)).await?.pop() else {
            return Ok(None);
        };
        let ticks = keyed_schedule::backfill_ticks(&status.schedule, from, to, Utc::now())?;
        let configs = self.driver.configs_read(&[job.to_string()]).await?;
        let config = configs.get(job).ok_or_else(|| super::Error::UnknownJobType(job.to_string()))?;
        let limits = self.driver.limits();
        let jobs = ticks
            .into_iter()
            .map(|tick| {
                let mut schedule = status.schedule.clone();
                schedule.jitter_ms = 0;
                Ok((tick, keyed_schedule::prepare_keyed_tick(&schedule, config, tick, limits)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let change = self.actor.change("schedule.backfill", format!("schedule {job}/{key} from {from} to {to}"));
        let written = self.recorded(&change, self.driver.backfill_write(&change, job, key, jobs).await).await?;
        Ok(written.map(|(written, already)| keyed_schedule::Backfilled::of(written, already)))
    }

    /// One pass over up to `batch` keyed schedules that are due: their
    /// ticks planned by [`keyed_schedule::plan`] (a tick missed by more
    /// than `max_pause` counts against the schedule's backfill), written
    /// with their cursors in one transaction. `now` overrides the
    /// database's clock, for tests.
    pub async fn keyed_ticks(
        &self,
        now: Option<DateTime<Utc>>,
        batch: i64,
        max_pause: chrono::TimeDelta,
    ) -> Result<KeyedPass> {
        let limits = *self.driver.limits();
        let decide: &TickDecider = &move |due, now| keyed_schedule::plan(due, now, max_pause, &limits);
        self.driver.keyed_ticks(now, batch, decide).await
    }

    /// Records a pass at `at` that left nothing due, for every served type.
    pub async fn keyed_looked(&self, at: DateTime<Utc>) -> Result<()> {
        self.driver.keyed_looked(at).await
    }

    /// Records a new signed-in session, known by its id's digest, and
    /// forgets the sessions that expired under `lifetime`.
    /// `token` is the named token it signed in with (`None` for the
    /// server's own), whose life bounds the session's: false, and no
    /// session, when that token is no longer live.
    pub async fn session_create(
        &self,
        digest: &str,
        lifetime: session::SessionLifetime,
        token: Option<&session::SignedInWith>,
    ) -> Result<bool> {
        self.driver.session_create(digest, lifetime, token).await
    }

    /// The session, if it is signed in and not expired under `lifetime`
    /// (nor its token revoked or expired); records its use (every
    /// [`session::TOUCH_EVERY_SECS`] at most).
    pub async fn session_check(
        &self,
        digest: &str,
        lifetime: session::SessionLifetime,
    ) -> Result<Option<session::SignedIn>> {
        self.driver.session_check(digest, lifetime).await
    }

    /// Makes a named token, known by its value's digest; a live token of
    /// the same name stays, and [`token::Created::NameTaken`] says so.
    pub async fn token_create(&self, token: &token::NewToken) -> Result<token::Created> {
        let change = self.actor.change("token.create", format!("token {}", token.name));
        self.recorded(&change, self.driver.token_create(&change, token).await).await
    }

    /// Revokes a named token and ends its sessions, on every server at
    /// once; false when no live token has the name.
    pub async fn token_revoke(&self, name: &str) -> Result<bool> {
        let change = self.actor.change("token.revoke", format!("token {name}")).answering("revoked", "absent");
        self.recorded(&change, self.driver.token_revoke(&change, name).await).await
    }

    /// Every named token, revoked ones too, by name; never a value.
    pub async fn tokens(&self) -> Result<Vec<token::TokenInfo>> {
        self.driver.tokens().await
    }

    /// Who holds the live token whose value has `digest`, if any; records
    /// its use (every [`token::TOUCH_EVERY_SECS`] at most).
    pub async fn token_holder(&self, digest: &str) -> Result<Option<token::TokenHolder>> {
        self.driver.token_holder(digest).await
    }

    /// Ends a session: a sign-out, on every server of the fleet.
    pub async fn session_revoke(&self, digest: &str) -> Result<()> {
        self.driver.session_revoke(digest).await
    }

    /// Stores an outbound grant, replacing the type's grant for the same
    /// origin; true when it replaced one.
    pub async fn grant_set(&self, grant: &grant::NewGrant) -> Result<bool> {
        let change = self
            .actor
            .change("grant.set", format!("grant {} {}", grant.job_type, grant.origin))
            .answering("replaced", "created");
        self.recorded(&change, self.driver.grant_set(&change, grant).await).await
    }

    /// Removes the type's grant for `origin`; false when there was none.
    pub async fn grant_revoke(&self, job_type: &str, origin: &str) -> Result<bool> {
        let change =
            self.actor.change("grant.revoke", format!("grant {job_type} {origin}")).answering("revoked", "absent");
        self.recorded(&change, self.driver.grant_revoke(&change, job_type, origin).await).await
    }

    /// The grants of one job type, or of all, by type and origin.
    pub async fn grants(&self, job_type: Option<&str>) -> Result<Vec<grant::OutboundGrant>> {
        self.driver.grants(job_type).await
    }

    /// Stores a sealed secret, replacing its value; true when it replaced one.
    pub async fn secret_set(&self, name: &str, sealed: &secret::Sealed) -> Result<bool> {
        let change = self.actor.change("secret.set", format!("secret {name}")).answering("replaced", "created");
        self.recorded(&change, self.driver.secret_set(&change, name, sealed).await).await
    }

    /// Removes a secret; false when there was none.
    pub async fn secret_delete(&self, name: &str) -> Result<bool> {
        let change = self.actor.change("secret.delete", format!("secret {name}")).answering("removed", "absent");
        self.recorded(&change, self.driver.secret_delete(&change, name).await).await
    }

    /// Every secret's name, key and dates, by name: never a value.
    pub async fn secrets_list(&self) -> Result<Vec<secret::SecretInfo>> {
        self.driver.secrets_list().await
    }

    /// The sealed values of those of `names` that are set.
    pub async fn secrets_sealed(&self, names: &[String]) -> Result<Vec<(String, secret::Sealed)>> {
        self.driver.secrets_sealed(names).await
    }

    /// Sets a job type's plain variable; true when it replaced a value.
    pub async fn var_set(&self, job_type: &str, name: &str, value: &str) -> Result<bool> {
        let change =
            self.actor.change("var.set", format!("variable {job_type} {name}")).answering("replaced", "created");
        self.recorded(&change, self.driver.var_set(&change, job_type, name, value).await).await
    }

    /// Removes a job type's variable; false when there was none.
    pub async fn var_unset(&self, job_type: &str, name: &str) -> Result<bool> {
        let change =
            self.actor.change("var.unset", format!("variable {job_type} {name}")).answering("removed", "absent");
        self.recorded(&change, self.driver.var_unset(&change, job_type, name).await).await
    }

    /// The variables of one job type, or of all, by type and name.
    pub async fn vars(&self, job_type: Option<&str>) -> Result<Vec<variable::TypeVariable>> {
        self.driver.vars(job_type).await
    }

    /// Enqueues one job per tick of a schedule, moving its cursor past them
    /// in the same transaction, unless another host moved it first; a tick
    /// whose job the enqueue rules or the database refuse is skipped with
    /// the reason. `ticks` are due ticks after the cursor, oldest first.
    pub async fn schedule_fire(&self, state: &ScheduleState, ticks: &[DateTime<Utc>]) -> Result<Fired> {
        schedule::fire(&*self.driver, state, ticks).await
    }
}
