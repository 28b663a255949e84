//! The worker: fetches jobs this host has loaded, runs each in its own
//! sandbox, writes results back in batches, renews leases, and shuts down
//! gracefully. It uses `store` and `component`; neither knows about it.

mod backoff;
mod complete;
mod config;
mod dispatch;
mod health;
mod history;
mod job_types;
mod leases;
mod membership;
mod outcome;
mod prefetch;
mod start_notes;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::component::{LiveProgress, Registry, Runtime, StopSignal};
use crate::store::{FetchParams, FetchedJob, Finish, FinishOutcome, HostInfo, RunId, Store};
use crate::supervisor::Supervisor;
use crate::types::{JobContext, RunOutcome};
use complete::{Done, Handoff};
use health::WriteHealth;
use prefetch::Prefetch;
use start_notes::StartNotes;

pub use config::WorkerConfig;
pub use job_types::KnownJobTypes;
pub use leases::Leases;

/// One host's worker.
pub struct Worker {
    store: Store,
    runtime: Runtime,
    registry: Arc<Registry>,
    config: WorkerConfig,
    host: HostInfo,
    leases: Leases,
    /// Whether results get written; a host whose writes keep failing stops
    /// fetching and renewing (see [`health`]).
    health: WriteHealth,
    /// How many jobs to lease ahead of free run slots.
    prefetch: Prefetch,
    /// Spawns the worker's tasks, so a panic in one stops the host.
    supervisor: Supervisor,
    /// Where runs and renewals are counted.
    metrics: crate::metrics::Metrics,
    /// The attempts this host scheduled again, for the fleet's history.
    retries: crate::store::history::RetryShare,
    /// Where each run's span goes, if anywhere.
    traces: crate::telemetry::Traces,
}

impl Worker {
    /// A worker for the components in `registry`. What its guests may
    /// enqueue is checked by `runtime`'s child check, given to the runtime
    /// when it was built ([`crate::component::Runtime::with_child_check`];
    /// [`crate::host::run`] builds one from the fleet's job types).
    ///
    /// # Errors
    /// Invalid settings.
    pub fn new(
        store: Store,
        runtime: Runtime,
        registry: Arc<Registry>,
        config: WorkerConfig,
    ) -> Result<Self, crate::config::ConfigError> {
        config.validate()?;
        let host = HostInfo::current(Vec::new(), config.heartbeat_interval);
        let health = WriteHealth::new(config.default_lease);
        let prefetch = Prefetch::new(config.prefetch, config.prefetch_wait, config.concurrency);
        let supervisor = Supervisor::new(CancellationToken::new());
        let leases = Leases::default();
        let metrics = crate::metrics::Metrics::default();
        let retries = crate::store::history::RetryShare::default();
        let traces = crate::telemetry::Traces::default();
        Ok(Worker {
            store,
            runtime,
            registry,
            config,
            host,
            leases,
            health,
            prefetch,
            supervisor,
            metrics,
            retries,
            traces,
        })
    }

    /// Spawns the worker's tasks under `supervisor` (a standalone worker's
    /// own supervisor only logs a panicking task).
    pub fn with_supervisor(self, supervisor: Supervisor) -> Self {
        Worker { supervisor, ..self }
    }

    /// Counts runs and lease renewals in `metrics` (a standalone worker
    /// counts in its own).
    pub fn with_metrics(self, metrics: crate::metrics::Metrics) -> Self {
        Worker { metrics, ..self }
    }

    /// Exports a span for each run to `traces` (none are made by default).
    pub fn with_traces(self, traces: crate::telemetry::Traces) -> Self {
        Worker { traces, ..self }
    }

    /// This host's id in the fleet.
    pub fn host_id(&self) -> &str {
        &self.host.id
    }

    /// Readies the result writes' connection before the first fetch, so the
    /// first results go out on a warm session. Bounded as a write is, and
    /// by the shutdown; a failure costs only the first write's speed.
    async fn warm_result_writes(&self, shutdown: &CancellationToken) {
        let warm = tokio::time::timeout(self.config.write_deadline(), self.store.result_writes_warm());
        tokio::select! {
            warmed = warm => match warmed {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::info!(%error, "cannot ready the result writes' connection; the first write will"),
                Err(_) => tracing::info!("readying the result writes' connection took too long; the first write will"),
            },
            () = shutdown.cancelled() => {}
        }
    }

    /// Runs until `shutdown` fires, then stops fetching, lets running jobs
    /// finish within the grace period, interrupts the rest and hands their
    /// jobs back so another host starts them at once.
    pub async fn run(self, shutdown: CancellationToken) {
        // Fetch slots cover running and prefetched jobs; a job holds one from
        // its fetch until its result is written (and the completer may lease
        // the next job into it). Run slots bound what runs at once.
        let capacity = Arc::new(Semaphore::new(self.fetch_slots()));
        let (done_tx, done_rx) = mpsc::unbounded_channel::<Done>();
        let (started, writing_starts) = StartNotes::new(self.store.clone(), self.config.heartbeat_deadline());
        let writing_starts = self.supervisor.spawn("start times", writing_starts);
        let launch = Launch {
            run_slots: Arc::new(Semaphore::new(self.config.concurrency)),
            done: done_tx,
            shutdown: shutdown.clone(),
            started,
        };
        let stop_heartbeat = CancellationToken::new();
        let registry = self.registry.clone();
        let host = self.host.clone();
        let membership = membership::Membership::new(self.store.clone(), move || served(&registry, &host));
        if let Err(error) = self.store.host_upsert(&membership.host()).await {
            tracing::warn!(%error, "cannot register this host in the fleet");
        }
        let membership_changes = self.supervisor.spawn(
            "fleet membership",
            membership::on_changes(
                membership.clone(),
                self.registry.subscribe(),
                self.config.heartbeat_deadline(),
                stop_heartbeat.clone(),
            ),
        );
        let heartbeat = self.supervisor.spawn(
            "heartbeat",
            leases::heartbeat_loop(
                leases::Heartbeat {
                    store: self.store.clone(),
                    leases: self.leases.clone(),
                    membership,
                    health: self.health.clone(),
                    config: self.config.clone(),
                    metrics: self.metrics.clone(),
                },
                stop_heartbeat.clone(),
            ),
        );
        let fencing = self.supervisor.spawn("fence", leases::fence_loop(self.leases.clone(), stop_heartbeat.clone()));
        let history = self
            .supervisor
            .spawn("history", history::flush_loop(self.store.clone(), self.retries.clone(), stop_heartbeat.clone()));
        let give_up = CancellationToken::new();
        let (handoff_tx, mut handoffs) = mpsc::unbounded_channel::<Handoff>();
        let completer = self.supervisor.spawn(
            "completer",
            dispatch::complete_loop(
                complete::Writer {
                    store: self.store.clone(),
                    leases: self.leases.clone(),
                    health: self.health.clone(),
                    writes: complete::Writes {
                        batch: self.config.completion_batch,
                        deadline: self.config.write_deadline(),
                        in_flight: self.config.result_writes,
                    },
                },
                done_rx,
                complete::NextJobs {
                    spec: self.fetch_spec(),
                    prefetch: self.prefetch.clone(),
                    capacity: capacity.clone(),
                    fetch_slots: self.fetch_slots(),
                    handoff: handoff_tx,
                    shutdown: shutdown.clone(),
                },
                give_up.clone(),
            ),
        );

        self.warm_result_writes(&shutdown).await;
        self.fetch_loop(&capacity, &mut handoffs, &launch).await;

        tracing::info!(running = self.leases.count(), "stopping: no new jobs will be fetched");
        let all = self.fetch_slots() as u32;
        // Jobs leased with a result written just before the stop arrive
        // here; starting them now hands them back at once.
        let drained = tokio::time::timeout(self.config.shutdown_grace, async {
            loop {
                tokio::select! {
                    _ = capacity.acquire_many(all) => return,
                    Some(handoff) = handoffs.recv() => self.start(handoff, &launch),
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(running = self.leases.count(), "grace period over; interrupting and handing back");
            self.leases.stop_all("host shutting down");
        }
        // The completer ends once this and every run's sender are gone, that
        // is once every result is in.
        drop(launch);
        // Every run ends soon after its stop signal and its result is written,
        // unless the database is unreachable: then, after one more grace
        // period, results are abandoned. Their leases expire and the jobs are
        // redelivered, so nothing is lost.
        let completer_abort = completer.abort_handle();
        let mut completer = completer;
        let give_up_at = tokio::time::sleep(self.config.shutdown_grace);
        tokio::pin!(give_up_at);
        let mut late = Vec::new();
        loop {
            tokio::select! {
                _ = &mut completer => break,
                // Leased by a write that was in flight when the grace period
                // ended: never started here, so it is handed back below.
                Some(handoff) = handoffs.recv() => late.push(handoff.job),
                () = &mut give_up_at => {
                    give_up.cancel();
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    completer_abort.abort();
                    break;
                }
            }
        }
        while let Ok(handoff) = handoffs.try_recv() {
            late.push(handoff.job);
        }
        self.hand_back(late).await;
        stop_heartbeat.cancel();
        let _ = tokio::join!(heartbeat, fencing, writing_starts, history, membership_changes);
        if let Err(error) = self.store.host_remove(&self.host.id).await {
            tracing::warn!(%error, "cannot remove this host from the fleet");
        }
    }

    /// Jobs this host may hold at most, running or waiting for a run slot.
    fn fetch_slots(&self) -> usize {
        self.config.concurrency + self.config.prefetch
    }

    /// Hands back jobs leased too late to start, so another host starts
    /// them at once with their attempt given back; if that write fails too,
    /// their leases expire and they are redelivered.
    async fn hand_back(&self, jobs: Vec<FetchedJob>) {
        if jobs.is_empty() {
            return;
        }
        let ids: Vec<i64> = jobs.iter().map(|job| job.id).collect();
        let releases = jobs.iter().map(|job| release_of(job, "leased as the host was stopping")).collect();
        match tokio::time::timeout(self.config.write_deadline(), self.store.job_finish(releases)).await {
            Ok(Ok(_)) => tracing::info!(jobs = ?ids, "handed back jobs leased too late to start"),
            Ok(Err(error)) => {
                tracing::warn!(%error, jobs = ?ids, "cannot hand back jobs leased too late; they will be redelivered")
            }
            Err(_) => {
                tracing::warn!(jobs = ?ids, "handing back jobs leased too late got no answer; they will be redelivered")
            }
        }
    }

    /// Leases jobs into free fetch slots and starts them, and starts the
    /// jobs the completer leased, until shutdown.
    async fn fetch_loop(
        &self,
        capacity: &Arc<Semaphore>,
        handoffs: &mut mpsc::UnboundedReceiver<Handoff>,
        launch: &Launch,
    ) {
        let spec = self.fetch_spec();
        let shutdown = &launch.shutdown;
        // Start watching for announcements before the first fetch: a job
        // enqueued between an empty fetch and a watch begun only then would
        // wait for the poll (PostgreSQL's LISTEN starts, SQLite's data
        // version is first read, on a store's first wait).
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = self.store.job_wait_available(Duration::ZERO) => {}
        }
        loop {
            let first = tokio::select! {
                () = shutdown.cancelled() => return,
                Some(handoff) = handoffs.recv() => {
                    self.start(handoff, launch);
                    continue;
                }
                permit = capacity.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            if self.health.given_up_for().is_some() {
                // Jobs leased now could not be written back either.
                drop(first);
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = self.health.probe(&self.store, self.config.poll_interval, self.config.write_deadline()) => continue,
                }
            }
            let mut slots = vec![first];
            while let Ok(permit) = capacity.clone().try_acquire_owned() {
                slots.push(permit);
            }
            let held = self.fetch_slots() - capacity.available_permits() - slots.len();
            let limit = self.prefetch.room(held).min(slots.len());
            if limit == 0 {
                // Every run slot is busy and runs are too long to lease
                // ahead of them: wait for one to end.
                drop(slots);
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    Some(handoff) = handoffs.recv() => self.start(handoff, launch),
                    () = self.prefetch.changed() => {}
                    () = tokio::time::sleep(self.config.poll_interval) => {}
                }
                continue;
            }
            slots.truncate(limit);
            let params = spec.params(slots.len() as i64);
            let sent_at = Instant::now();
            let call = self.leases.leasing_call();
            let jobs = match self.store.job_fetch(&params).await {
                Ok(jobs) => {
                    self.metrics.fetched(jobs.len());
                    call.answered(&jobs);
                    jobs
                }
                Err(error) => {
                    tracing::warn!(%error, "fetch failed; retrying");
                    Vec::new()
                }
            };
            let idle = jobs.len() < slots.len();
            for job in jobs {
                // One slot per job; the rest go back when `slots` drops.
                let slot = slots.pop().expect("the fetch returns at most `limit` jobs");
                self.start(Handoff { job, slot, sent_at }, launch);
            }
            drop(call);
            drop(slots);
            if idle {
                // Jobs the completer leases meanwhile start as they come, but
                // say nothing of jobs left to fetch: only an announcement (or
                // the poll) does. Looking after each would be an empty fetch
                // per result written while a key's jobs are handed along.
                let announced = self.store.job_wait_available(self.config.poll_interval);
                tokio::pin!(announced);
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        Some(handoff) = handoffs.recv() => self.start(handoff, launch),
                        () = &mut announced => break,
                    }
                }
            }
        }
    }

    /// What this host fetches: its queues, and the job types it has loaded
    /// now with their lease lengths.
    fn fetch_spec(&self) -> FetchSpec {
        FetchSpec {
            host_id: self.host.id.clone(),
            queues: self.config.queues.clone(),
            registry: self.registry.clone(),
            default_lease: self.config.default_lease,
        }
    }

    /// Starts a leased job: it waits for a run slot, runs, and sends its
    /// result to the completer.
    fn start(&self, leased: Handoff, launch: &Launch) {
        let Handoff { job, slot, sent_at } = leased;
        let Launch { run_slots, done, shutdown, started } = launch.clone();
        let signal = StopSignal::new();
        let progress = LiveProgress::new();
        let lease = Duration::from_secs(job.lease_secs.max(1) as u64);
        let run = RunId { job_id: job.id, lease_token: job.lease_token };
        self.leases.hold(run, lease, self.config.fence_margin(), sent_at, (signal.clone(), progress.clone()));
        let runtime = self.runtime.clone();
        let leases = self.leases.clone();
        let prefetch = self.prefetch.clone();
        let metrics = self.metrics.clone();
        let store = self.store.clone();
        let retries = self.retries.clone();
        let traces = self.traces.clone();
        let host_id = self.host.id.clone();
        let component = self.registry.get(&job.job);
        let span =
            tracing::info_span!("job", job_id = job.id, job = %job.job, attempt = job.attempt, host = %self.host.id);
        self.supervisor.spawn(
            "run",
            async move {
                // A prefetched job waits here for a run slot. A stop (lost
                // lease), a shutdown or a wait past `prefetch_wait` hands it
                // back unrun.
                let waiting_since = Instant::now();
                let running = tokio::select! {
                    biased;
                    () = signal.stopped() => None,
                    () = shutdown.cancelled() => {
                        signal.stop("host shutting down before the job started");
                        None
                    }
                    permit = run_slots.acquire_owned() => permit.ok(),
                    () = tokio::time::sleep(prefetch.wait()) => {
                        tracing::info!(waited = ?prefetch.wait(), "no run slot came free in time; handing the job back");
                        signal.stop("waited too long for a run slot on this host");
                        prefetch.handed_back();
                        None
                    }
                };
                if running.is_some() {
                    leases.started(run);
                    if waiting_since.elapsed() >= STARTED_AT_SLACK {
                        // The fetch set `started_at` to the lease time; the
                        // job starts only now. Off the run's path, in a batch.
                        started.note(run);
                    }
                }
                let finish = match component {
                    Some(component) if !signal.is_stopped() => {
                        let span = run_span(&traces, &store, &job, &host_id).await;
                        let context = JobContext {
                            job_id: job.id as u64,
                            attempt: job.attempt as u32,
                            queue: job.queue.clone(),
                            enqueued_at_ms: job.enqueued_at.timestamp_millis().max(0) as u64,
                            batch_id: job.batch_id.map(|b| b as u64),
                            concurrency_key: job.concurrency_key.clone(),
                            traceparent: span.traceparent(),
                        };
                        let payload = job.payload.to_string();
                        tracing::debug!(lease_token = job.lease_token, "run started");
                        let report = runtime.run_reporting(&component, &context, &payload, signal, progress).await;
                        prefetch.run_ended(Duration::from_micros(report.elapsed_us));
                        metrics.run_ended(
                            &job.job,
                            report.outcome.kind(),
                            Duration::from_micros(report.elapsed_us),
                            report.instantiate_us.map(Duration::from_micros),
                        );
                        metrics.outbound_calls(&job.job, &report.effects.outbound);
                        tracing::debug!(
                            lease_token = job.lease_token,
                            outcome = report.outcome.kind(),
                            elapsed_us = report.elapsed_us,
                            "run ended"
                        );
                        if let RunOutcome::Throttled { retry_after_ms } = report.outcome {
                            throttle(&store, run, retry_after_ms).await;
                        }
                        let outbound = if span.is_on() { report.effects.outbound.clone() } else { Vec::new() };
                        let finish = outcome::finish_of(&job, &component.config, report, &host_id);
                        (finish, span, outbound)
                    }
                    // Stopped while waiting, or unloaded since the fetch (another
                    // host may serve it): handed back without spending the attempt.
                    _ => {
                        let reason = signal.reason().unwrap_or("job type unloaded from this host");
                        (release_of(&job, reason), crate::telemetry::RunSpan::default(), Vec::new())
                    }
                };
                let (finish, span, outbound) = finish;
                // A cancel that arrived while the guest ran ends the job as
                // cancelled, unless the guest completed first.
                let cancelled = leases.ended(run);
                if !cancelled && matches!(finish.outcome, FinishOutcome::Retry { .. }) {
                    retries.retried(&job.queue, &job.job);
                }
                let finish = match finish.outcome {
                    FinishOutcome::Completed { .. } => finish,
                    _ if cancelled => {
                        Finish { outcome: FinishOutcome::Cancelled { reason: leases::CANCELLED.to_string() }, ..finish }
                    }
                    _ => finish,
                };
                let finish = Finish { traceparent: span.traceparent(), ..finish };
                span.end(&finish.outcome, &outbound);
                drop(running);
                let _ = done.send(Done { finish, fetch_slot: Some(slot) });
            }
            .instrument(span),
        );
    }
}

/// Holds a throttled run's key until `retry_after_ms` from now, before its
/// result is written: in a statement of its own, matched on the run's
/// lease, so a stale run throttles nothing. A throttle that cannot be
/// written is logged; the job itself still waits as the guest asked.
async fn throttle(store: &Store, run: RunId, retry_after_ms: u64) {
    let until = retry_after_ms.clamp(1, crate::store::rate::MAX_THROTTLE_MS);
    match store.rate_throttle(run, until).await {
        Ok(true) => tracing::info!(retry_after_ms = until, "throttled: the job's key starts nothing until then"),
        Ok(false) => tracing::debug!("throttle of a run that no longer holds its lease: nothing held"),
        Err(error) => tracing::warn!(%error, "cannot record the throttle; only this job waits"),
    }
}

/// What every job this host starts shares with the others: the run slots it
/// waits for, where its result goes, the host's shutdown, and where a late
/// start is noted.
#[derive(Clone)]
struct Launch {
    run_slots: Arc<Semaphore>,
    done: mpsc::UnboundedSender<Done>,
    shutdown: CancellationToken,
    /// Where runs that waited for a slot note their real start.
    started: StartNotes,
}

/// How long a leased job may wait for a run slot before its `started_at` is
/// set again when its guest starts: shorter waits are not worth a write.
const STARTED_AT_SLACK: Duration = Duration::from_millis(50);

/// A job handed back unrun: to `available` at once, its attempt given back.
fn release_of(job: &FetchedJob, reason: &str) -> Finish {
    Finish {
        id: job.id,
        lease_token: job.lease_token,
        attempt: job.attempt,
        outcome: FinishOutcome::Release { reason: reason.to_string() },
        log: serde_json::Value::Null,
        progress: None,
        concurrency_key: job.concurrency_key.clone(),
        batch_id: job.batch_id,
        traceparent: None,
    }
}

/// How long a run waits for its job's trace context before it starts
/// without one (as a trace's root): a slow database delays no run for it.
const TRACE_LOOKUP: Duration = Duration::from_secs(1);

/// The span of `job`'s run, joined to the trace its enqueue carried; none
/// unless this host exports traces.
async fn run_span(
    traces: &crate::telemetry::Traces,
    store: &Store,
    job: &FetchedJob,
    host: &str,
) -> crate::telemetry::RunSpan {
    if !traces.is_on() {
        return crate::telemetry::RunSpan::default();
    }
    let parent = match tokio::time::timeout(TRACE_LOOKUP, store.job_traceparent(job.id)).await {
        Ok(Ok(parent)) => parent,
        Ok(Err(error)) => {
            tracing::debug!(%error, "cannot read the job's trace context; its run starts a trace");
            None
        }
        Err(_) => {
            tracing::debug!("the job's trace context took too long to read; its run starts a trace");
            None
        }
    };
    traces.run_span(job, host, parent.as_deref())
}

/// How to ask for this host's jobs, shared by the fetch loop and the
/// completer (which leases jobs along with the results it writes).
#[derive(Clone)]
pub(crate) struct FetchSpec {
    host_id: String,
    queues: Vec<String>,
    registry: Arc<Registry>,
    default_lease: Duration,
}

impl FetchSpec {
    /// A fetch of up to `limit` jobs of the types loaded now.
    pub(crate) fn params(&self, limit: i64) -> FetchParams {
        FetchParams {
            host_id: self.host_id.clone(),
            queues: self.queues.clone(),
            job_types: self
                .registry
                .components()
                .iter()
                .map(|c| (c.config.name.clone(), crate::store::lease::lease_secs(&c.config, self.default_lease)))
                .collect(),
            limit,
        }
    }
}

/// This host's row as of now: the job types it fetches, the component
/// serving each, and whether its directory watcher is down.
fn served(registry: &Registry, host: &HostInfo) -> HostInfo {
    let components = registry.components();
    HostInfo {
        job_types: components.iter().map(|c| c.config.name.clone()).collect(),
        digests: components.iter().map(|c| (c.config.name.clone(), c.digest.clone())).collect(),
        watcher_error: registry.watcher_error(),
        ..host.clone()
    }
}
