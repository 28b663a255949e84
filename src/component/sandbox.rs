//! One run of one job in a fresh instance: the store and its limits, WASI
//! with nothing of the host's, the host imports, and the classification of
//! how the run ended. Nothing survives a run but its [`RunReport`].

use std::time::Instant;

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::component::bindings::{self, EnqueueOptions, Job, JobPre, Level, wit};
use crate::component::capture::CapturedOutput;
use crate::component::metadata;
use crate::component::stop::StopSignal;
use crate::types::{ChildJob, Crash, LogLine, RunEffects, tail};

/// Longest message kept from one `log` call.
const LOG_MESSAGE_LIMIT: usize = 4 << 10;
/// Most bytes of one run's log lines echoed into the host's own log; the
/// lines after that are kept with the job only, so no guest can flood the
/// log the host's operators read.
const HOST_LOG_BYTES_PER_RUN: usize = 64 << 10;
/// Most children one run may enqueue; past it `enqueue` returns an error.
const CHILD_LIMIT: usize = 10_000;
/// Stderr kept in a trap's message: enough for a panic message.
const TRAP_STDERR_TAIL: usize = 2 << 10;

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
    table: ResourceTable,
    memory: MemoryCap,
    stdout: CapturedOutput,
    stderr: CapturedOutput,
    effects: RunEffects,
    limits: RunLimits,
    signal: StopSignal,
    stopped_by: Option<HostStop>,
    child_check: Option<ChildCheck>,
    /// Bytes of log lines echoed into the host's log so far.
    host_log_bytes: usize,
}

/// A child job a guest asks to enqueue, as the [`ChildCheck`] sees it.
#[derive(Debug, Clone)]
pub struct ChildProbe {
    /// Its job type.
    pub job: String,
    /// Its payload.
    pub payload: serde_json::Value,
    /// The payloads of the children of the same type this run enqueued before.
    pub earlier: Vec<serde_json::Value>,
}

/// Checks a child against the fleet when the guest enqueues it (its type
/// exists; a `raise` limit has room for it), so the guest gets the error
/// at the call instead of its run failing at completion. An `Err` is the
/// message the guest receives.
pub type ChildCheck = std::sync::Arc<
    dyn Fn(ChildProbe) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> + Send + Sync,
>;

impl WasiView for SandboxState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// Enforces the run's memory cap and remembers that it was hit, so an
/// allocation failure is reported as what it is rather than as whatever
/// trap the guest turned it into.
struct MemoryCap {
    limit: usize,
    hit: bool,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, _desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // The pool's per-table element limit bounds tables already.
        Ok(true)
    }
}

/// Adds WASI and the `jobhost:job/host` imports to a linker.
///
/// # Errors
/// Only if two definitions collide, which is a host bug.
pub fn link(linker: &mut Linker<SandboxState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    Job::add_to_linker::<SandboxState, HasSelf<SandboxState>>(linker, |state| state)
}

/// A store for one run, with its limits, captured output and stop checks.
pub fn new_store(
    engine: &wasmtime::Engine,
    limits: RunLimits,
    signal: StopSignal,
    child_check: Option<ChildCheck>,
) -> Store<SandboxState> {
    let stdout = CapturedOutput::new(limits.output_limit_bytes);
    let stderr = CapturedOutput::new(limits.output_limit_bytes);
    // No preopened directories, environment, arguments or network: a job
    // sees only its payload and the host imports.
    let wasi = WasiCtxBuilder::new()
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build();
    let state = SandboxState {
        wasi,
        table: ResourceTable::new(),
        memory: MemoryCap { limit: usize::try_from(limits.memory_limit_bytes).unwrap_or(usize::MAX), hit: false },
        stdout,
        stderr,
        effects: RunEffects::default(),
        limits,
        signal,
        stopped_by: None,
        child_check,
        host_log_bytes: 0,
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

/// Instantiates the component and calls `run`, bounded by the deadline and
/// the stop signal even while the guest waits in a host call.
pub async fn call_run(
    store: &mut Store<SandboxState>,
    pre: &JobPre<SandboxState>,
    context: &wit::JobContext,
    payload: &str,
) -> CallEnd {
    let deadline = tokio::time::Instant::from_std(store.data().limits.deadline);
    let signal = store.data().signal.clone();
    let outcome = {
        let call = async {
            let job = pre.instantiate_async(&mut *store).await?;
            job.call_run(&mut *store, context, payload).await
        };
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

/// Instantiates the component and calls `describe`, bounded like a run.
///
/// # Errors
/// The guest trapped, ran past the deadline or blocked in a host call.
pub async fn call_describe(
    store: &mut Store<SandboxState>,
    pre: &JobPre<SandboxState>,
) -> Result<wit::JobConfig, String> {
    let deadline = tokio::time::Instant::from_std(store.data().limits.deadline);
    let call = async {
        let job = pre.instantiate_async(&mut *store).await?;
        job.call_describe(&mut *store).await
    };
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
        let (message, cut) = truncate(message, LOG_MESSAGE_LIMIT);
        self.effects.truncated |= cut;
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
        Ok(())
    }

    async fn enqueue(
        &mut self,
        job: String,
        payload: String,
        options: EnqueueOptions,
    ) -> wasmtime::Result<Result<(), String>> {
        let child = match self.child_of(job, payload, options) {
            Ok(child) => child,
            Err(error) => return Ok(Err(error)),
        };
        if let Some(check) = self.child_check.clone() {
            let earlier =
                self.effects.children.iter().filter(|c| c.job == child.job).map(|c| c.payload.clone()).collect();
            let probe = ChildProbe { job: child.job.clone(), payload: child.payload.clone(), earlier };
            if let Err(error) = check(probe).await {
                return Ok(Err(error));
            }
        }
        // Held for the completion transaction.
        self.effects.children.push(child);
        Ok(Ok(()))
    }
}

impl SandboxState {
    /// Checks what a guest enqueues on its own terms: the run's child limit,
    /// the names, and the payload's JSON.
    fn child_of(&self, job: String, payload: String, options: EnqueueOptions) -> Result<ChildJob, String> {
        if self.effects.children.len() >= CHILD_LIMIT {
            return Err(format!("a run may enqueue at most {CHILD_LIMIT} jobs"));
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
        Ok(ChildJob { job, payload, queue: options.queue, priority: options.priority, delay_ms: options.delay_ms })
    }
}
