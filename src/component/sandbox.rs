//! One run of one job in a fresh instance: the store and its limits, WASI
//! with nothing of the host's, the host imports, and the classification of
//! how the run ended. Nothing survives a run but its [`RunReport`].

use std::time::Instant;

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::component::bindings::{
    self, BatchOptions, BatchRef, EnqueueOptions, Job, Level, v0_1, v0_2, v0_3, v0_4, v0_5, v0_6, v0_7, wit,
};
use crate::component::budget::RunBudget;
use crate::component::capture::CapturedOutput;
use crate::component::children::{ChildCheck, ChildKeyCounts, ChildProbe};
use crate::component::metadata;
use crate::component::progress::LiveProgress;
use crate::component::stop::StopSignal;
use crate::component::workflows::{self, RunWorkflows, StepLookup, WorkflowParts, WorkflowRun};
use crate::outbound::hooks::OutboundHooks;
use crate::types::{
    BatchRequest, ChildBatch, ChildEvent, ChildJob, Crash, JsonText, LogLine, MAX_BATCH_LABEL_BYTES, RunEffects,
    RunOutcome, tail,
};

/// Longest message kept from one `log` call.
const LOG_MESSAGE_LIMIT: usize = 4 << 10;
/// Most bytes of one run's log lines echoed into the host's own log; the
/// lines after that are kept with the job only, so no guest can flood the
/// log the host's operators read.
const HOST_LOG_BYTES_PER_RUN: usize = 64 << 10;
/// Most children one run may enqueue; past it `enqueue` returns an error.
const CHILD_LIMIT: usize = 10_000;
/// Most batches one run may open.
const BATCH_LIMIT: usize = 16;
/// Most events one run may send.
const EVENT_LIMIT: usize = 1_000;
/// Stderr kept in a trap's message: enough for a panic message.
const TRAP_STDERR_TAIL: usize = 2 << 10;
/// What one table element costs the host, counted against the memory cap:
/// a pointer, with room for the metadata a future element type may carry.
const TABLE_ELEMENT_BYTES: usize = 16;

/// Per-run limits.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    /// The run's memory cap.
    pub memory_limit_bytes: u64,
    /// When the run is interrupted as timed out.
    pub deadline: Instant,
    /// The timeout the deadline came from, for the error message.
    pub timeout_ms: u64,
    /// Bound on each of stdout and stderr.
    pub output_limit_bytes: usize,
    /// Bound on log lines.
    pub log_line_limit: usize,
    /// The largest child payload, as JSON text.
    pub max_payload_bytes: usize,
    /// The largest output, as JSON text.
    pub max_output_bytes: usize,
    /// The most bytes the run may make the host hold, all told.
    pub budget_bytes: usize,
}

/// Why the host ended a run before the guest returned.
#[derive(Debug, Clone)]
enum HostStop {
    Timeout,
    Signal(String),
}

/// The data of one run's store.
pub struct SandboxState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    /// Every outbound request passes these (docs/outbound.md).
    outbound: OutboundHooks,
    table: ResourceTable,
    memory: MemoryCap,
    stdout: CapturedOutput,
    stderr: CapturedOutput,
    pub(super) effects: RunEffects,
    limits: RunLimits,
    signal: StopSignal,
    /// The latest progress, read by the host's heartbeat while the run goes on.
    live_progress: LiveProgress,
    /// Whether the job is a member of a batch, so may add to it.
    in_batch: bool,
    stopped_by: Option<HostStop>,
    pub(super) child_check: Option<ChildCheck>,
    /// The workflow steps the run adds, and which step its job is.
    pub(super) workflows: RunWorkflows,
    /// The children enqueued so far, counted per (type, key) as the check rendered them.
    child_keys: ChildKeyCounts,
    /// What the run may still make the host hold.
    pub(super) budget: RunBudget,
    /// Bytes of log lines echoed into the host's log so far.
    host_log_bytes: usize,
    /// When the component finished instantiating, for the run's report.
    instantiated_at: Option<std::time::Instant>,
}

impl bindings::jobhost::job::workflows::Host for SandboxState {
    async fn current_step(&mut self) -> wasmtime::Result<Result<Option<bindings::StepOf>, String>> {
        Ok(workflows::current_step(self).await)
    }

    fn open(&mut self, label: Option<String>) -> wasmtime::Result<Result<u32, String>> {
        Ok(workflows::open_workflow(self, label))
    }

    async fn add_step(
        &mut self,
        workflow: bindings::WorkflowRef,
        step: bindings::NewStep,
    ) -> wasmtime::Result<Result<(), String>> {
        Ok(workflows::add_step(self, workflow, step).await)
    }
}

impl bindings::jobhost::job::events::Host for SandboxState {
    fn send(&mut self, key: String, payload: String) -> wasmtime::Result<Result<(), String>> {
        Ok(self.send_event(key, payload))
    }
}

impl WorkflowRun for SandboxState {
    fn workflow_parts(&mut self) -> WorkflowParts<'_> {
        WorkflowParts { state: &mut self.workflows, held: &mut self.effects.workflows, budget: &self.budget }
    }

    fn child_of(&self, job: String, payload: String, options: EnqueueOptions) -> Result<ChildJob, String> {
        SandboxState::child_of(self, job, payload, options)
    }

    fn child_check(&self) -> Option<ChildCheck> {
        self.child_check.clone()
    }
}

impl WasiView for SandboxState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl WasiHttpView for SandboxState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.outbound }
    }
}

/// Enforces the run's memory cap over all its memories and tables together
/// (a component may have several of each, and each alone may be under the
/// cap), and remembers that it was hit, so an allocation failure is reported
/// as what it is rather than as whatever trap the guest turned it into.
struct MemoryCap {
    limit: usize,
    /// Sum of the current sizes of the run's memories, in bytes.
    memories: usize,
    /// Sum of the run's table elements, in bytes.
    tables: usize,
    hit: bool,
}

impl MemoryCap {
    fn new(limit: usize) -> Self {
        MemoryCap { limit, memories: 0, tables: 0, hit: false }
    }

    /// Whether `more` bytes fit beside what the run holds already.
    fn admits(&mut self, more: usize) -> bool {
        let total = self.memories.saturating_add(self.tables).saturating_add(more);
        if total > self.limit {
            self.hit = true;
            return false;
        }
        true
    }
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let more = desired.saturating_sub(current);
        if !self.admits(more) {
            return Ok(false);
        }
        self.memories += more;
        Ok(true)
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let more = desired.saturating_sub(current).saturating_mul(TABLE_ELEMENT_BYTES);
        if !self.admits(more) {
            return Ok(false);
        }
        self.tables += more;
        Ok(true)
    }
}

/// Adds WASI, `wasi:http` and the `jobhost:job` imports to a linker.
///
/// # Errors
/// Only if two definitions collide, which is a host bug.
pub fn link(linker: &mut Linker<SandboxState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    super::clock::link_precise_sleeps(linker)?;
    Job::add_to_linker::<SandboxState, HasSelf<SandboxState>>(linker, |state| state)?;
    v0_5::Job::add_to_linker::<SandboxState, HasSelf<SandboxState>>(linker, |state| state)?;
    v0_6::Job::add_to_linker::<SandboxState, HasSelf<SandboxState>>(linker, |state| state)?;
    v0_7::Job::add_to_linker::<SandboxState, HasSelf<SandboxState>>(linker, |state| state)?;
    v0_4::Job::add_to_linker::<SandboxState, HasSelf<SandboxState>>(linker, |state| state)?;
    v0_3::Job::add_to_linker::<SandboxState, HasSelf<SandboxState>>(linker, |state| state)?;
    v0_2::Job::add_to_linker::<SandboxState, HasSelf<SandboxState>>(linker, |state| state)?;
    v0_1::Job::add_to_linker::<SandboxState, HasSelf<SandboxState>>(linker, |state| state)
}

/// A store for one run, with its limits, captured output and stop checks.
pub fn new_store(
    engine: &wasmtime::Engine,
    limits: RunLimits,
    signal: StopSignal,
    live_progress: LiveProgress,
    child_check: Option<ChildCheck>,
    outbound: OutboundHooks,
    environment: &[(String, String)],
) -> Store<SandboxState> {
    let budget = RunBudget::new(limits.budget_bytes);
    let stdout = CapturedOutput::new(limits.output_limit_bytes, budget.clone());
    let stderr = CapturedOutput::new(limits.output_limit_bytes, budget.clone());
    // No preopened directories, arguments or network: a job sees only its
    // payload, the host imports and, in its environment, the placeholders
    // of the secrets it declares.
    let wasi = WasiCtxBuilder::new()
        .envs(environment)
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build();
    let state = SandboxState {
        wasi,
        http: WasiHttpCtx::new(),
        outbound,
        table: ResourceTable::new(),
        memory: MemoryCap::new(usize::try_from(limits.memory_limit_bytes).unwrap_or(usize::MAX)),
        stdout,
        stderr,
        effects: RunEffects::default(),
        limits,
        signal,
        live_progress,
        in_batch: false,
        stopped_by: None,
        child_check,
        workflows: RunWorkflows::default(),
        child_keys: ChildKeyCounts::default(),
        budget,
        host_log_bytes: 0,
        instantiated_at: None,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.memory);
    // Checked at every epoch tick: stop if told to or past the deadline,
    // otherwise yield the thread to other tasks and carry on.
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut context| {
        let state = context.data_mut();
        if let Some(reason) = state.signal.reason() {
            state.stopped_by = Some(HostStop::Signal(reason.to_string()));
            return Ok(UpdateDeadline::Interrupt);
        }
        if Instant::now() >= state.limits.deadline {
            state.stopped_by = Some(HostStop::Timeout);
            return Ok(UpdateDeadline::Interrupt);
        }
        Ok(UpdateDeadline::Yield(1))
    });
    store
}

/// What the guest's `run` export returned, or why it returned nothing.
pub enum CallEnd {
    /// The guest returned.
    Returned(Result<Option<String>, wit::JobError>),
    /// The call failed: a trap, or the epoch interruption above.
    Errored(wasmtime::Error),
    /// The host stopped waiting: a timeout or stop signal while the guest
    /// sat in a host call (a sleep) where epochs cannot reach it.
    Abandoned,
}

/// Makes a run's call (instantiating the component and calling `run`, in
/// whichever world it implements), bounded by the deadline and the stop
/// signal even while the guest waits in a host call.
pub async fn call_run(
    store: &mut Store<SandboxState>,
    run: impl AsyncFnOnce(&mut Store<SandboxState>) -> wasmtime::Result<Result<Option<String>, wit::JobError>>,
) -> CallEnd {
    let deadline = tokio::time::Instant::from_std(store.data().limits.deadline);
    let signal = store.data().signal.clone();
    let outcome = {
        let call = run(&mut *store);
        tokio::select! {
            result = call => Some(result),
            () = tokio::time::sleep_until(deadline) => None,
            () = signal.stopped() => None,
        }
    };
    match outcome {
        Some(Ok(returned)) => CallEnd::Returned(returned),
        Some(Err(error)) => CallEnd::Errored(error),
        None => {
            let state = store.data_mut();
            state.stopped_by = Some(match signal.reason() {
                Some(reason) => HostStop::Signal(reason.to_string()),
                None => HostStop::Timeout,
            });
            CallEnd::Abandoned
        }
    }
}

/// Makes a load's call (instantiating the component and calling
/// `describe`), bounded like a run.
///
/// # Errors
/// The guest trapped, ran past the deadline or blocked in a host call.
pub async fn call_describe(
    store: &mut Store<SandboxState>,
    describe: impl AsyncFnOnce(&mut Store<SandboxState>) -> wasmtime::Result<wit::JobConfig>,
) -> Result<wit::JobConfig, String> {
    let deadline = tokio::time::Instant::from_std(store.data().limits.deadline);
    let call = describe(&mut *store);
    let result = tokio::time::timeout_at(deadline, call).await;
    match result {
        Ok(Ok(config)) => Ok(config),
        Ok(Err(error)) => Err(crash_of(store.data(), error).to_string()),
        Err(_) => Err("describe() did not return in time".to_string()),
    }
}

/// Classifies a failed call by what the host saw, never by error text.
pub fn crash_of(state: &SandboxState, error: wasmtime::Error) -> Crash {
    if let Some(stop) = &state.stopped_by {
        return host_stop_crash(stop, &state.limits);
    }
    if state.memory.hit {
        return Crash::MemoryExceeded { limit_bytes: state.limits.memory_limit_bytes };
    }
    let trap = match error.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        None => format!("{:#}", error.root_cause()),
    };
    let (stderr, _) = state.stderr.contents();
    let tail = tail(stderr.trim_end(), TRAP_STDERR_TAIL);
    let message = if tail.is_empty() { trap } else { format!("{trap}; stderr: {tail}") };
    Crash::Trap { message }
}

/// How a run that returned success ended: completed with its output, or
/// failed when the output is not JSON, is larger than the host accepts, or
/// is larger than what is left of the run's budget. The output stays text.
pub fn completed(state: &SandboxState, output: Option<String>) -> RunOutcome {
    let Some(text) = output else {
        return RunOutcome::Completed { output: None };
    };
    let bytes = text.len();
    let crash = if bytes > state.limits.max_output_bytes {
        Crash::OutputTooLarge { bytes: bytes as u64, limit_bytes: state.limits.max_output_bytes as u64 }
    } else if !state.budget.try_take(bytes) {
        Crash::OverBudget {
            bytes: bytes as u64,
            left_bytes: state.budget.left() as u64,
            budget_bytes: state.budget.limit() as u64,
        }
    } else {
        match JsonText::parse(text) {
            Ok(output) => return RunOutcome::Completed { output: Some(output) },
            Err(error) => Crash::InvalidResult { message: format!("output is not valid JSON: {error}") },
        }
    };
    RunOutcome::Crashed { crash }
}

/// The crash for a run the host abandoned in a host call.
pub fn abandoned_crash(state: &SandboxState) -> Crash {
    match &state.stopped_by {
        Some(stop) => host_stop_crash(stop, &state.limits),
        None => Crash::Interrupted { reason: "stopped".to_string() },
    }
}

fn host_stop_crash(stop: &HostStop, limits: &RunLimits) -> Crash {
    match stop {
        HostStop::Timeout => Crash::Timeout { limit_ms: limits.timeout_ms },
        HostStop::Signal(reason) => Crash::Interrupted { reason: reason.clone() },
    }
}

/// Collects what the run produced besides its outcome.
pub fn take_effects(state: &mut SandboxState) -> RunEffects {
    let mut effects = std::mem::take(&mut state.effects);
    let (stdout, stdout_cut) = state.stdout.contents();
    let (stderr, stderr_cut) = state.stderr.contents();
    effects.stdout = stdout;
    effects.stderr = stderr;
    effects.truncated |= stdout_cut || stderr_cut;
    let refusals = state.outbound.take_refusals();
    effects.logs.extend(refusals.into_iter().map(|message| LogLine { level: crate::types::LogLevel::Warn, message }));
    effects.outbound = state.outbound.take_calls();
    let calls =
        effects.outbound.iter().map(|call| LogLine { level: crate::types::LogLevel::Info, message: call.describe() });
    effects.logs.extend(calls);
    effects
}

fn truncate(mut text: String, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

impl bindings::jobhost::job::types::Host for SandboxState {}

impl bindings::jobhost::job::host::Host for SandboxState {
    fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        if self.effects.logs.len() >= self.limits.log_line_limit {
            self.effects.truncated = true;
            return Ok(());
        }
        // Before the line reaches the host's log (its sinks are shipped
        // elsewhere; the job's record is redacted only at the run's end), and
        // before it is cut, so a value at the cut is not left half shown.
        let mut message = message;
        self.outbound.secrets().redact_text(&mut message);
        let (message, cut) = truncate(message, LOG_MESSAGE_LIMIT);
        self.effects.truncated |= cut;
        if !self.budget.try_take(message.len()) {
            self.effects.truncated = true;
            return Ok(());
        }
        let echoed = self.host_log_bytes;
        self.host_log_bytes = echoed.saturating_add(message.len());
        if self.host_log_bytes <= HOST_LOG_BYTES_PER_RUN {
            match level {
                Level::Trace => tracing::trace!(target: "jobhost::guest", "{message}"),
                Level::Debug => tracing::debug!(target: "jobhost::guest", "{message}"),
                Level::Info => tracing::info!(target: "jobhost::guest", "{message}"),
                Level::Warn => tracing::warn!(target: "jobhost::guest", "{message}"),
                Level::Error => tracing::error!(target: "jobhost::guest", "{message}"),
            }
        } else if echoed <= HOST_LOG_BYTES_PER_RUN {
            tracing::warn!(
                target: "jobhost::guest",
                "this run logged more than {HOST_LOG_BYTES_PER_RUN} bytes; further lines are kept with the job only"
            );
        }
        self.effects.logs.push(LogLine { level: level.into(), message });
        Ok(())
    }

    fn heartbeat(&mut self) -> wasmtime::Result<()> {
        self.effects.heartbeats = self.effects.heartbeats.saturating_add(1);
        Ok(())
    }

    fn progress(&mut self, done: u64, total: u64) -> wasmtime::Result<()> {
        self.effects.progress = Some((done, total));
        self.live_progress.report(done, total);
        Ok(())
    }

    async fn enqueue(
        &mut self,
        job: String,
        payload: String,
        options: EnqueueOptions,
    ) -> wasmtime::Result<Result<(), String>> {
        Ok(self.enqueue_child(job, payload, options, None).await)
    }
}

impl bindings::jobhost::job::batches::Host for SandboxState {
    fn open(&mut self, options: BatchOptions) -> wasmtime::Result<Result<u32, String>> {
        Ok(self.open_batch(options))
    }

    async fn enqueue(
        &mut self,
        batch: BatchRef,
        job: String,
        payload: String,
        options: EnqueueOptions,
    ) -> wasmtime::Result<Result<(), String>> {
        let target = match batch {
            BatchRef::Current if self.in_batch => ChildBatch::Parent,
            BatchRef::Current => return Ok(Err("this job is in no batch".to_string())),
            BatchRef::Opened(n) if (n as usize) < self.effects.batches.len() => ChildBatch::Opened(n),
            BatchRef::Opened(n) => return Ok(Err(format!("this run opened no batch {n}"))),
        };
        Ok(self.enqueue_child(job, payload, options, Some(target)).await)
    }
}

impl SandboxState {
    /// Notes that the run's job is a member of a batch: `batches.enqueue`
    /// may then add to it.
    pub fn set_in_batch(&mut self, in_batch: bool) {
        self.in_batch = in_batch;
    }

    /// The largest payload a job may have, as JSON text.
    pub(super) fn max_payload_bytes(&self) -> usize {
        self.limits.max_payload_bytes
    }

    /// Notes the run's job and how to find which workflow step it is, for
    /// `workflows.current-step` and steps added to `current`.
    pub fn set_job(&mut self, job_id: i64, lookup: Option<StepLookup>) {
        self.workflows = RunWorkflows::new(job_id, lookup);
    }

    /// Notes that the component has been instantiated: the guest's code runs from now.
    pub fn note_instantiated(&mut self) {
        self.instantiated_at = Some(std::time::Instant::now());
    }

    /// When the component finished instantiating, if it did.
    pub fn instantiated_at(&self) -> Option<std::time::Instant> {
        self.instantiated_at
    }

    /// A child, checked on the run's own terms and then by the fleet's
    /// rules (see [`ChildCheck`]), held for the completion transaction.
    async fn enqueue_child(
        &mut self,
        job: String,
        payload: String,
        options: EnqueueOptions,
        batch: Option<ChildBatch>,
    ) -> Result<(), String> {
        let held = job.len() + payload.len();
        let child = ChildJob { batch, ..self.child_of(job, payload, options)? };
        if let Some(check) = self.child_check.clone() {
            let earlier = self.child_keys.clone();
            let probe = ChildProbe { child: child.clone(), earlier, at_release: false };
            if let Some(key) = check(probe).await? {
                self.child_keys.add(child.job.clone(), key);
            }
        }
        // Held for the completion transaction; its budget was checked in
        // `child_of` and nothing else took any since.
        self.budget.try_take(held);
        self.effects.children.push(child);
        Ok(())
    }

    /// An event the run sends, checked on the run's own terms (how many,
    /// its byte budget) and by the rules of every event (its key, a JSON
    /// object within the payload limit), held for the completion transaction.
    fn send_event(&mut self, key: String, payload: String) -> Result<(), String> {
        if self.effects.events.len() >= EVENT_LIMIT {
            return Err(format!("a run may send at most {EVENT_LIMIT} events"));
        }
        let held = key.len() + payload.len();
        if held > self.budget.left() {
            return Err(self.budget.refusal("this event", held));
        }
        if payload.len() > self.limits.max_payload_bytes {
            return Err(format!(
                "payload is {} bytes, more than the largest accepted, {} bytes",
                payload.len(),
                self.limits.max_payload_bytes
            ));
        }
        let payload: serde_json::Value =
            serde_json::from_str(&payload).map_err(|e| format!("payload is not valid JSON: {e}"))?;
        // The rules every sender's event passes, measured as the database will.
        crate::store::wait::check_event(&key, &payload, self.limits.max_payload_bytes).map_err(|e| match e {
            crate::store::Error::InvalidEvent(reason) => reason,
            other => other.to_string(),
        })?;
        self.budget.try_take(held);
        self.effects.events.push(ChildEvent { key, payload });
        Ok(())
    }

    /// A batch the run opens, checked on the run's own terms: how many, the
    /// label, the callbacks' names and the callback payload. The callbacks'
    /// types are checked when the run completes (an unknown one fails it).
    fn open_batch(&mut self, options: BatchOptions) -> Result<u32, String> {
        if self.effects.batches.len() >= BATCH_LIMIT {
            return Err(format!("a run may open at most {BATCH_LIMIT} batches"));
        }
        if options.label.as_ref().is_some_and(|l| l.len() > MAX_BATCH_LABEL_BYTES) {
            return Err(format!("a batch's label is at most {MAX_BATCH_LABEL_BYTES} bytes"));
        }
        for callback in [&options.on_finish, &options.on_success, &options.on_failure].into_iter().flatten() {
            metadata::check_name(callback).map_err(|reason| format!("callback job name {reason}"))?;
        }
        let text = options.callback_payload.as_deref().unwrap_or("{}");
        let held = text.len() + options.label.as_ref().map_or(0, String::len);
        if held > self.budget.left() {
            return Err(self.budget.refusal("this batch", held));
        }
        let callback_payload: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("callback payload is not valid JSON: {e}"))?;
        if !callback_payload.is_object() {
            return Err("callback payload must be a JSON object".to_string());
        }
        self.budget.try_take(held);
        self.effects.batches.push(BatchRequest {
            label: options.label,
            on_finish: options.on_finish,
            on_success: options.on_success,
            on_failure: options.on_failure,
            callback_payload,
        });
        Ok((self.effects.batches.len() - 1) as u32)
    }

    /// Checks what a guest enqueues on its own terms: the run's child limit,
    /// its byte budget, the names, and the payload's JSON.
    pub(super) fn child_of(&self, job: String, payload: String, options: EnqueueOptions) -> Result<ChildJob, String> {
        if self.effects.children.len() >= CHILD_LIMIT {
            return Err(format!("a run may enqueue at most {CHILD_LIMIT} jobs"));
        }
        let held = job.len() + payload.len();
        if held > self.budget.left() {
            return Err(self.budget.refusal("this child", held));
        }
        metadata::check_name(&job).map_err(|reason| format!("job name {reason}"))?;
        if let Some(queue) = &options.queue {
            metadata::check_name(queue).map_err(|reason| format!("queue name {reason}"))?;
        }
        if payload.len() > self.limits.max_payload_bytes {
            return Err(format!(
                "payload is {} bytes, more than the largest accepted, {} bytes",
                payload.len(),
                self.limits.max_payload_bytes
            ));
        }
        let payload: serde_json::Value =
            serde_json::from_str(&payload).map_err(|e| format!("payload is not valid JSON: {e}"))?;
        let (queue, priority, delay_ms) = (options.queue, options.priority, options.delay_ms);
        Ok(ChildJob { job, payload, queue, priority, delay_ms, batch: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Building a component with several memories from Rust is impractical
    // (the toolchains emit one), so the limiter is tested on its own.
    #[test]
    fn the_memory_cap_holds_over_all_memories_together() {
        let mut cap = MemoryCap::new(100);
        assert!(cap.memory_growing(0, 60, None).unwrap(), "a first memory of 60 fits");
        assert!(!cap.memory_growing(0, 60, None).unwrap(), "a second of 60 would make 120");
        assert!(cap.memory_growing(0, 40, None).unwrap(), "a second of 40 makes exactly 100");
        assert!(!cap.memory_growing(40, 41, None).unwrap(), "and cannot grow by a byte");
        assert!(cap.hit);
    }

    #[test]
    fn a_memory_grows_by_the_difference_only() {
        let mut cap = MemoryCap::new(100);
        assert!(cap.memory_growing(0, 50, None).unwrap());
        assert!(cap.memory_growing(50, 100, None).unwrap(), "growing 50 to 100 adds 50");
        assert!(!cap.hit);
    }

    #[test]
    fn tables_count_against_the_same_cap() {
        let mut cap = MemoryCap::new(100 * TABLE_ELEMENT_BYTES);
        assert!(cap.memory_growing(0, 90 * TABLE_ELEMENT_BYTES, None).unwrap());
        assert!(cap.table_growing(0, 10, None).unwrap(), "10 elements fill the cap");
        assert!(!cap.table_growing(10, 11, None).unwrap(), "one more element does not fit");
        assert!(!cap.memory_growing(90 * TABLE_ELEMENT_BYTES, 90 * TABLE_ELEMENT_BYTES + 1, None).unwrap());
        assert!(cap.hit);
    }
}
