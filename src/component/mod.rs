//! Everything WebAssembly: the engine, compiling and caching components,
//! reading their configuration, running jobs in sandboxes, and the registry
//! of loaded job types fed by the watched directory. The only module that
//! names wasmtime.

mod bindings;
mod budget;
mod cache;
mod capture;
mod children;
mod clock;
mod engine;
pub mod metadata;
mod progress;
pub mod registry;
mod sandbox;
mod schedules;
mod stop;
pub mod variables;
pub mod watcher;
mod workflows;
mod world;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use wasmtime::component::{Component, Linker};

use crate::config::{ConfigError, RuntimeConfig};
use crate::outbound::budget::BodyBudget;
use crate::outbound::hooks::OutboundHooks;
use crate::outbound::run;
use crate::types::{Crash, JobConfig, JobContext, RunOutcome, RunReport};

pub use crate::outbound::run::{GrantSource, SecretSource, grants_from, secrets_from};
pub use children::{ChildCheck, ChildKeyCounts, ChildProbe};
pub use progress::LiveProgress;
pub use registry::{Registry, RegistryEvent};
pub use stop::StopSignal;
pub use variables::variables_from;
pub use watcher::{DirectoryWatcher, WatcherConfig};
pub use workflows::{JobStep, StepLookup};

use bindings::wit;
use sandbox::{CallEnd, RunLimits, SandboxState};
use world::WorldPre;

/// How long `describe()` may take when a component is loaded.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A setting cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The engine could not be built on this machine.
    #[error("cannot start the WebAssembly engine: {0:#}")]
    Engine(wasmtime::Error),
    /// The epoch thread could not be started.
    #[error("cannot start the epoch thread: {0}")]
    Thread(std::io::Error),
}

/// A component file that could not be loaded, and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct LoadError {
    /// The file.
    pub path: PathBuf,
    /// What went wrong.
    pub kind: LoadErrorKind,
}

/// The first bytes of every WebAssembly binary, module or component.
const WASM_MAGIC: &[u8] = b"\0asm";

/// What went wrong loading a component.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadErrorKind {
    /// The file could not be read.
    #[error("cannot read the file: {0}")]
    Read(String),
    /// The bytes are not a valid WebAssembly component.
    #[error("not a valid WebAssembly component: {0}")]
    Compile(String),
    /// The component is valid but needs more than this host's instance
    /// pool gives one component (core instances, memories, tables, memory
    /// size); the text names the limit.
    #[error("does not fit: {0}")]
    TooLarge(String),
    /// The component does not fit the `jobhost:job` world: a missing
    /// export, or an import the host does not provide.
    #[error("does not implement the jobhost:job world: {0}")]
    World(String),
    /// `describe()` trapped or did not return.
    #[error("describe() failed: {0}")]
    Describe(String),
    /// `describe()` returned a configuration that cannot be used.
    #[error("invalid configuration: {0}")]
    Config(#[from] metadata::InvalidConfig),
    /// A component fetched from the database is not what was deployed:
    /// its bytes do not match the deployed digest, or it declares another
    /// job type than the one it was deployed as.
    #[error("does not match its deployment: {0}")]
    Deployment(String),
    /// Another file already provides this job type.
    #[error("job type {name:?} is already provided by {}", other.display())]
    DuplicateName {
        /// The job type both files declare.
        name: String,
        /// The file that keeps serving it.
        other: PathBuf,
    },
}

/// A compiled, linked and described component, ready to run jobs. Runs hold
/// it by `Arc`, so a reload never pulls a version out from under a run.
pub struct LoadedComponent {
    /// The file it was loaded from.
    pub source: PathBuf,
    /// SHA-256 of the file's bytes, hex.
    pub digest: String,
    /// Its validated configuration.
    pub config: JobConfig,
    pre: WorldPre,
}

impl std::fmt::Debug for LoadedComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedComponent")
            .field("source", &self.source)
            .field("digest", &self.digest)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The host's WebAssembly runtime: one engine, one linker, one artifact
/// cache, and the check a guest's `enqueue` passes. Cheap to clone; clones
/// share everything.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
    /// What a guest may enqueue beyond well-formed names and JSON; anything
    /// when unset (a runtime without a queue, as in `jobhost exec`). Fixed
    /// for this value and its clones: never changed under a running guest.
    child_check: Option<ChildCheck>,
    /// How a run finds which workflow step its job is; unset (`jobhost
    /// exec`), a run cannot add steps to its own workflow.
    step_lookup: Option<StepLookup>,
    /// Where a run reads its job type's grants; none granted when unset
    /// (`jobhost exec`), so every request is refused.
    grants: Option<GrantSource>,
    /// Where a run opens the secrets its requests may carry; a run that
    /// needs one refuses to start without it.
    secrets: Option<SecretSource>,
    /// Each type's plain variables, for its runs' environment; none when unset.
    variables: Option<Arc<variables::Variables>>,
}

struct Inner {
    engine: wasmtime::Engine,
    linker: Linker<SandboxState>,
    cache: Option<cache::ArtifactCache>,
    config: RuntimeConfig,
    /// One permit per pool slot for runs: a run past the pool's size waits
    /// here instead of failing to instantiate.
    run_slots: Semaphore,
    /// The same for loads, which instantiate to call `describe`.
    load_slots: Semaphore,
    /// Outbound TLS settings, built once, and the connections every run's
    /// requests share.
    connections: Arc<crate::outbound::send::Connections>,
}

impl Runtime {
    /// Starts the engine and its epoch thread, for runs whose children are
    /// checked only for well-formed names and JSON (`jobhost exec`, tests)
    /// until [`Runtime::with_child_check`] gives it a check.
    ///
    /// # Errors
    /// Invalid settings, or an engine this machine cannot provide.
    pub fn new(config: RuntimeConfig) -> Result<Self, RuntimeError> {
        config.validate()?;
        let engine = engine::build(&config).map_err(RuntimeError::Engine)?;
        engine::start_epoch_ticker(&engine, config.epoch_tick).map_err(RuntimeError::Thread)?;
        let mut linker = Linker::new(&engine);
        sandbox::link(&mut linker).map_err(RuntimeError::Engine)?;
        let cache = config.cache_dir.clone().map(|dir| cache::ArtifactCache::new(dir, &engine));
        let run_slots = Semaphore::new(config.max_concurrent_runs as usize);
        let load_slots = Semaphore::new(engine::LOAD_SLOTS as usize);
        let connections = Arc::new(crate::outbound::send::Connections::new());
        let inner = Arc::new(Inner { engine, linker, cache, config, run_slots, load_slots, connections });
        Ok(Runtime { inner, child_check: None, step_lookup: None, grants: None, secrets: None, variables: None })
    }

    /// This runtime, with every guest's `enqueue` refusing the children
    /// `check` refuses. It takes the runtime by value: the check is part of
    /// the runtime handed to the watcher and the worker, never swapped in
    /// under runs already going (clones made earlier keep theirs).
    pub fn with_child_check(self, check: ChildCheck) -> Self {
        Runtime { child_check: Some(check), ..self }
    }

    /// This runtime, with each run finding its job's workflow step through
    /// `lookup` when the guest asks (`workflows.current-step`, or a step
    /// added to `current`).
    pub fn with_step_lookup(self, lookup: StepLookup) -> Self {
        Runtime { step_lookup: Some(lookup), ..self }
    }

    /// This runtime, with each run reading its job type's grants from
    /// `source` when it starts (so a grant or revoke applies to the next run).
    pub fn with_grants(self, source: GrantSource) -> Self {
        Runtime { grants: Some(source), ..self }
    }

    /// This runtime, with each run opening the secrets it may send from `source`.
    pub fn with_secrets(self, source: SecretSource) -> Self {
        Runtime { secrets: Some(source), ..self }
    }

    /// This runtime, with each run's environment holding its type's plain
    /// variables as read from `source` (kept for [`variables::FRESH_FOR`]).
    pub fn with_variables(self, source: variables::VariableSource) -> Self {
        Runtime { variables: Some(Arc::new(variables::Variables::new(source))), ..self }
    }

    /// The settings the runtime was started with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// Reads, compiles (or loads from the cache), links and describes a component file.
    ///
    /// # Errors
    /// A [`LoadError`] naming the file and the reason.
    pub async fn load_file(&self, path: &Path) -> Result<LoadedComponent, LoadError> {
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|e| LoadError { path: path.to_path_buf(), kind: LoadErrorKind::Read(e.to_string()) })?;
        self.load_bytes(path, bytes).await
    }

    /// Compiles (or loads from the cache), links and describes a component.
    /// `source` names it in errors and in the registry.
    ///
    /// # Errors
    /// A [`LoadError`] naming `source` and the reason.
    pub async fn load_bytes(&self, source: &Path, bytes: Vec<u8>) -> Result<LoadedComponent, LoadError> {
        let fail = |kind| LoadError { path: source.to_path_buf(), kind };
        // Said plainly: the parser's own error lists the bytes it expected
        // and found as multi-line arrays.
        if !bytes.starts_with(WASM_MAGIC) {
            return Err(fail(LoadErrorKind::Compile(
                "the file is not WebAssembly (it does not begin with the magic bytes 00 61 73 6d)".into(),
            )));
        }
        let digest = digest_of(&bytes);
        let inner = self.inner.clone();
        let key = digest.clone();
        // Compiling takes 100 ms and more: keep it off the async threads.
        let component = tokio::task::spawn_blocking(move || inner.compile(&key, &bytes))
            .await
            .map_err(|e| fail(LoadErrorKind::Compile(format!("compiler task failed: {e}"))))?
            .map_err(|e| fail(self.compile_error(&e)))?;
        self.link_and_describe(source, digest, component).await
    }

    /// Loads the component with this digest from the artifact cache alone,
    /// without its bytes: a host serving deployed components fetches them
    /// from the database only when this is `None` (not cached, or no cache).
    pub async fn load_cached(&self, source: &Path, digest: &str) -> Option<Result<LoadedComponent, LoadError>> {
        let inner = self.inner.clone();
        let key = digest.to_string();
        let cached = tokio::task::spawn_blocking(move || {
            let cache = inner.cache.as_ref()?;
            cache.load(&inner.engine, &key)
        })
        .await
        .ok()
        .flatten()?;
        Some(self.link_and_describe(source, digest.to_string(), cached).await)
    }

    /// A compile error as a load error: a component too large for the
    /// instance pool is told apart from one that is not valid.
    fn compile_error(&self, error: &wasmtime::Error) -> LoadErrorKind {
        match engine::pool_misfit(error, &self.inner.config) {
            Some(misfit) => LoadErrorKind::TooLarge(misfit),
            None => LoadErrorKind::Compile(format!("{error:#}")),
        }
    }

    /// Links a compiled component to the host and reads its configuration.
    async fn link_and_describe(
        &self,
        source: &Path,
        digest: String,
        component: Component,
    ) -> Result<LoadedComponent, LoadError> {
        let fail = |kind| LoadError { path: source.to_path_buf(), kind };
        let pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .and_then(WorldPre::new)
            .map_err(|e| fail(LoadErrorKind::World(format!("{e:#}"))))?;

        let limits = RunLimits {
            memory_limit_bytes: self.inner.config.max_memory_limit_bytes,
            deadline: Instant::now() + DESCRIBE_TIMEOUT,
            timeout_ms: DESCRIBE_TIMEOUT.as_millis() as u64,
            output_limit_bytes: self.inner.config.output_limit_bytes,
            log_line_limit: self.inner.config.log_line_limit,
            max_payload_bytes: self.inner.config.max_payload_bytes,
            max_output_bytes: self.inner.config.max_output_bytes,
            budget_bytes: self.inner.config.run_budget_bytes,
        };
        // The semaphore is never closed, so acquiring cannot fail.
        let _slot = self.inner.load_slots.acquire().await;
        let budget = BodyBudget::new(0);
        let outbound = OutboundHooks::new(Arc::default(), Arc::default(), 0, self.inner.connections.clone(), budget);
        let (signal, progress) = (StopSignal::new(), LiveProgress::new());
        let mut store = sandbox::new_store(&self.inner.engine, limits, signal, progress, None, outbound, &[]);
        let declared = sandbox::call_describe(&mut store, async |store| pre.describe(store).await)
            .await
            .map_err(|e| fail(LoadErrorKind::Describe(e)))?;
        let config = metadata::validate(declared, &self.inner.config).map_err(|e| fail(e.into()))?;
        Ok(LoadedComponent { source: source.to_path_buf(), digest, config, pre })
    }

    /// Runs one attempt of a job in a fresh sandbox. Never fails: a trap,
    /// a timeout, a memory overrun or a stop is reported as a [`crate::types::Crash`].
    pub async fn run(
        &self,
        component: &LoadedComponent,
        context: &JobContext,
        payload: &str,
        signal: StopSignal,
    ) -> RunReport {
        self.run_reporting(component, context, payload, signal, LiveProgress::new()).await
    }

    /// [`Runtime::run`], with the guest's progress reports written to
    /// `progress` as they come, for the host to send while the run goes on.
    pub async fn run_reporting(
        &self,
        component: &LoadedComponent,
        context: &JobContext,
        payload: &str,
        signal: StopSignal,
        progress: LiveProgress,
    ) -> RunReport {
        // The semaphore is never closed, so acquiring cannot fail.
        let _slot = self.inner.run_slots.acquire().await;
        let started = Instant::now();
        let config = &component.config;
        let limits = RunLimits {
            memory_limit_bytes: config.memory_limit_bytes,
            deadline: started + config.timeout(),
            timeout_ms: config.timeout_ms,
            output_limit_bytes: self.inner.config.output_limit_bytes,
            log_line_limit: self.inner.config.log_line_limit,
            max_payload_bytes: self.inner.config.max_payload_bytes,
            max_output_bytes: self.inner.config.max_output_bytes,
            budget_bytes: self.inner.config.run_budget_bytes,
        };
        let not_started = |reason: String| {
            tracing::warn!("{reason}");
            let outcome = RunOutcome::Retry { reason };
            RunReport { outcome, effects: Default::default(), elapsed_us: 0, instantiate_us: None }
        };
        // Grants, secrets and variables may be read from the database. A run
        // stopped meanwhile (its host cut off from the database fences it, or
        // it is cancelled) ends at once, before its guest starts, not when
        // the database answers again, after the job's next owner started it.
        let reads = async {
            let policy = run::policy_for(self.grants.as_ref(), config).await?;
            let secrets = run::secrets_for(self.secrets.as_ref(), &policy)
                .await
                .map_err(|reason| format!("job type {} needs secrets this host cannot give: {reason}", config.name))?;
            let variables = match &self.variables {
                Some(variables) => variables.of(&config.name).await?,
                None => Arc::default(),
            };
            Ok::<_, String>((policy, Arc::new(secrets), variables))
        };
        let (policy, secrets, variables) = tokio::select! {
            biased;
            () = signal.stopped() => {
                let reason = signal.reason().unwrap_or("stopped").to_string();
                let outcome = RunOutcome::Crashed { crash: Crash::Interrupted { reason } };
                return RunReport { outcome, effects: Default::default(), elapsed_us: 0, instantiate_us: None };
            }
            read = reads => match read {
                Ok(read) => read,
                Err(reason) => return not_started(reason),
            },
        };
        // A secret's placeholder wins over a variable of the same name.
        let mut environment = secrets.environment();
        let secret_names: Vec<String> = environment.iter().map(|(name, _)| name.clone()).collect();
        environment.extend(variables.iter().filter(|(name, _)| !secret_names.contains(name)).cloned());
        let budget = BodyBudget::new(self.inner.config.outbound_budget_bytes);
        let (policy, connections) = (Arc::new(policy), self.inner.connections.clone());
        let outbound = OutboundHooks::new(policy, secrets.clone(), context.job_id, connections, budget)
            .in_trace(context.traceparent.clone());
        let child_check = self.child_check.clone();
        let mut store =
            sandbox::new_store(&self.inner.engine, limits, signal, progress, child_check, outbound, &environment);
        store.data_mut().set_in_batch(context.batch_id.is_some());
        store.data_mut().set_job(context.job_id as i64, self.step_lookup.clone());
        let wit_context: wit::JobContext = context.into();
        let end =
            sandbox::call_run(&mut store, async |store| component.pre.run(store, &wit_context, payload).await).await;
        let outcome = match end {
            CallEnd::Returned(Ok(output)) => sandbox::completed(store.data(), output),
            CallEnd::Returned(Err(wit::JobError::Retry(reason))) => RunOutcome::Retry { reason },
            CallEnd::Returned(Err(wit::JobError::Fail(reason))) => RunOutcome::Failed { reason },
            CallEnd::Returned(Err(wit::JobError::Snooze(seconds))) => RunOutcome::Snooze { seconds },
            CallEnd::Returned(Err(wit::JobError::Throttled(retry_after_ms))) => {
                RunOutcome::Throttled { retry_after_ms }
            }
            CallEnd::Errored(error) => RunOutcome::Crashed { crash: sandbox::crash_of(store.data(), error) },
            CallEnd::Abandoned => RunOutcome::Crashed { crash: sandbox::abandoned_crash(store.data()) },
        };
        let effects = sandbox::take_effects(store.data_mut());
        let instantiate_us = store.data().instantiated_at().map(|at| at.duration_since(started).as_micros() as u64);
        let mut report =
            RunReport { outcome, effects, elapsed_us: started.elapsed().as_micros() as u64, instantiate_us };
        secrets.redact(&mut report);
        report
    }
}

impl Inner {
    fn compile(&self, digest: &str, bytes: &[u8]) -> wasmtime::Result<Component> {
        let Some(cache) = &self.cache else {
            return Component::new(&self.engine, bytes);
        };
        if let Some(component) = cache.load(&self.engine, digest) {
            return Ok(component);
        }
        let artifact = self.engine.precompile_component(bytes)?;
        // SAFETY: the artifact was produced just above by this engine.
        let component = unsafe { Component::deserialize(&self.engine, &artifact) }?;
        // Cached only once it fits this engine's pool: a misfit would be
        // discarded at every later load.
        cache.store(digest, &artifact);
        Ok(component)
    }
}

/// SHA-256 of a component's bytes, hex: its identity in the cache, the
/// registry and the database.
pub fn digest_of(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
