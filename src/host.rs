//! A whole host: components from a watched directory and from the
//! database's deployments, their job types
//! registered fleet-wide, the worker, the maintenance sweeps and the
//! schedule loop, until shutdown.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::background::deployments::DeploymentFollower;
use crate::background::maintenance::{Maintenance, MaintenanceConfig};
use crate::background::registration::Registrar;
use crate::background::scheduler::{Scheduler, SchedulerConfig};
use crate::component::{DirectoryWatcher, Registry, Runtime, WatcherConfig};
use crate::config::RuntimeConfig;
use crate::store::{EnqueueLimits, Store};
use crate::supervisor::{Supervisor, TaskPanic};
use crate::worker::{KnownJobTypes, Worker, WorkerConfig};

/// Everything a host needs to run.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The database to share with the fleet.
    pub database_url: String,
    /// The directory of components, if any.
    pub components: Option<PathBuf>,
    /// Also serve the components deployed through the database.
    pub deployed: bool,
    /// Apply migrations at start.
    pub migrate: bool,
    /// The component runtime.
    pub runtime: RuntimeConfig,
    /// The worker.
    pub worker: WorkerConfig,
    /// The sweeps.
    pub maintenance: MaintenanceConfig,
    /// The schedule loop.
    pub schedules: SchedulerConfig,
    /// What an enqueue may carry: the children of this host's runs, checked
    /// at the guest's call and again when written.
    pub limits: EnqueueLimits,
    /// The HTTP API, dashboard and metrics, served from this host if set.
    pub http: Option<crate::http::HttpConfig>,
    /// The key that opens the secrets outbound requests carry; without it,
    /// runs that need a secret refuse to start, saying why.
    pub secret_key: Option<crate::outbound::secrets::SecretKey>,
    /// Export a span per run to this OpenTelemetry collector, if set.
    pub otlp: Option<crate::telemetry::OtlpConfig>,
}

/// Why a host could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A setting cannot work.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Neither a components directory nor the deployments to serve.
    #[error("nothing to serve: name a components directory, the deployed components (`db`), or both")]
    NothingToServe,
    /// The runtime could not start.
    #[error(transparent)]
    Runtime(#[from] crate::component::RuntimeError),
    /// The components directory could not be watched.
    #[error(transparent)]
    Watch(#[from] crate::component::watcher::WatchError),
    /// The database could not be used.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    /// The HTTP server could not start.
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    /// Traces cannot be exported as configured.
    #[error(transparent)]
    Traces(#[from] crate::telemetry::TraceError),
    /// A background task panicked; the host stopped rather than run on
    /// with part of its job silently stopped.
    #[error(transparent)]
    TaskPanicked(#[from] TaskPanic),
}

/// Runs a host until `shutdown` fires, then stops gracefully.
///
/// A database that cannot be reached at start is waited for (logged, with
/// backoff) until it can or `shutdown` fires. Every background task runs
/// under a [`Supervisor`]: one that panics stops the host, and the panic is
/// returned as [`HostError::TaskPanicked`].
///
/// # Errors
/// Anything that prevents the host from starting, or a task that panicked;
/// other failures while running are logged and retried.
pub async fn run(config: HostConfig, shutdown: CancellationToken) -> Result<(), HostError> {
    if config.components.is_none() && !config.deployed {
        return Err(HostError::NothingToServe);
    }
    // Every setting is checked before anything starts: a bad one is told
    // at once, not after the components load or the database answers.
    config.worker.validate()?;
    config.maintenance.validate()?;
    if let Some(http) = &config.http {
        http.validate()?;
    }
    let traces = match &config.otlp {
        Some(otlp) => crate::telemetry::Traces::export(otlp)?,
        None => crate::telemetry::Traces::default(),
    };
    let runtime_config = RuntimeConfig {
        heartbeat_interval: config.worker.heartbeat_interval,
        max_concurrent_runs: config.worker.concurrency as u32,
        max_payload_bytes: config.limits.max_payload_bytes,
        ..config.runtime.clone()
    };
    // Started before the wait for the database: a bad setting, or an engine
    // this machine cannot provide, fails at once.
    let runtime = Runtime::new(runtime_config)?;
    let Some(store) = open_store(&config, &shutdown).await? else {
        tracing::info!("shutdown requested while waiting for the database");
        return Ok(());
    };
    let registry = Arc::new(Registry::new());
    // A guest's enqueue is checked against the fleet's job types with the
    // rules its completion will apply.
    let known = KnownJobTypes::default();
    known.refresh(&store).await;
    let grants = crate::component::grants_from(store.clone());
    let secrets = crate::component::secrets_from(store.clone(), config.secret_key.clone());
    let runtime = runtime
        .with_child_check(known.check(registry.clone(), store.clone(), config.limits))
        .with_step_lookup(KnownJobTypes::step_lookup(store.clone()))
        .with_grants(grants)
        .with_secrets(secrets)
        .with_variables(crate::component::variables_from(store.clone()));
    let mut watcher = match &config.components {
        Some(dir) => Some(DirectoryWatcher::new(runtime.clone(), registry.clone(), WatcherConfig::new(dir))?),
        None => None,
    };
    let mut follower =
        config.deployed.then(|| DeploymentFollower::new(runtime.clone(), registry.clone(), store.clone()));
    // The startup scan may compile many components; a shutdown stops it.
    let startup = async {
        if let Some(watcher) = watcher.as_mut() {
            watcher.run_once().await?;
        }
        if let Some(follower) = follower.as_mut() {
            // The follower looks again in a moment; a host starts anyway.
            if let Err(error) = follower.run_once().await {
                tracing::warn!(%error, "cannot read the deployed components at start; trying again");
            }
        }
        Ok::<(), HostError>(())
    };
    tokio::select! {
        () = shutdown.cancelled() => {
            tracing::info!("shutdown requested during the startup scan");
            return Ok(());
        }
        scanned = startup => scanned?,
    }
    let events = registry.subscribe();
    let mut registrar = Registrar::new(store.clone(), registry.clone());
    registrar.queue_all();
    registrar.register_pending().await;
    tracing::info!(
        database = store.location(),
        job_types = ?registry.components().iter().map(|c| &c.config.name).collect::<Vec<_>>(),
        "host starting"
    );

    // The worker stops on `shutdown`, or when a background task panicked.
    let stop = shutdown.child_token();
    let supervisor = Supervisor::new(stop.clone());
    let background = CancellationToken::new();
    let metrics = crate::metrics::Metrics::default();

    let watching = watcher.map(|watcher| supervisor.spawn("watcher", watcher.run(background.clone())));
    let following = follower.map(|follower| supervisor.spawn("deployments", follower.run(background.clone())));
    let registering = supervisor.spawn("registration", registrar.run(events, background.clone()));
    let maintenance = Maintenance::new(store.clone(), config.maintenance.clone())?.with_metrics(metrics.clone());
    let sweeping = supervisor.spawn("maintenance", maintenance.run(background.clone()));
    // Stops with the worker: a host shutting down enqueues no more ticks.
    let scheduler = Scheduler::new(store.clone(), config.schedules.clone())?;
    let scheduling = supervisor.spawn("schedules", scheduler.run(stop.clone()));
    let refreshing = supervisor.spawn(
        "job type refresh",
        known.refresh_loop(store.clone(), config.worker.heartbeat_interval, background.clone()),
    );

    let worker = Worker::new(store, runtime, registry, config.worker.clone())?
        .with_supervisor(supervisor.clone())
        .with_metrics(metrics.clone())
        .with_traces(traces.clone());
    // Bound once everything that can fail to start has started.
    let serving = match &config.http {
        Some(http) => {
            // A pool of its own: pages and scrapes never take the workers'
            // connections, and a slow read is given up at half its deadline.
            let opened = crate::store::open_for_http(
                &config.database_url,
                HTTP_CONNECTIONS,
                config.limits,
                http.request_timeout / 2,
            )
            .await;
            let server = match opened {
                Ok(http_store) => {
                    crate::http::Server::bind(http, http_store, metrics.clone()).await.map_err(Into::into)
                }
                Err(error) => Err(HostError::from(error)),
            };
            let server = match server {
                Ok(server) => server,
                Err(error) => {
                    background.cancel();
                    return Err(error);
                }
            };
            tracing::info!("{}", http.announcement(server.local_addr()));
            Some(supervisor.spawn("http", server.serve(background.clone())))
        }
        None => None,
    };
    tracing::info!(host_id = worker.host_id(), "worker running");
    worker.run(stop).await;

    background.cancel();
    let _ = tokio::join!(registering, sweeping, scheduling, refreshing);
    if let Some(watching) = watching {
        let _ = watching.await;
    }
    if let Some(following) = following {
        let _ = following.await;
    }
    if let Some(serving) = serving {
        let _ = serving.await;
    }
    traces.shut_down().await;
    if let Some(panic) = supervisor.failure() {
        tracing::error!(%panic, "host stopped after a task panicked");
        return Err(HostError::TaskPanicked(panic));
    }
    tracing::info!("host stopped");
    Ok(())
}

/// The first wait for a database that is unavailable at start; it doubles
/// up to [`OPEN_RETRY_MAX`].
const OPEN_RETRY_FIRST: Duration = Duration::from_millis(250);

/// Connections a host's HTTP server has to the database, apart from its
/// workers'.
const HTTP_CONNECTIONS: u32 = 4;

/// The longest wait between attempts to reach the database at start.
const OPEN_RETRY_MAX: Duration = Duration::from_secs(10);

/// Opens (and migrates) the store, waiting for a database that is not
/// available yet: hosts and their database often start together, and a
/// host that exits instead needs something else to restart it. `None` when
/// `shutdown` fired first.
async fn open_store(config: &HostConfig, shutdown: &CancellationToken) -> Result<Option<Store>, HostError> {
    let max_connections = config.worker.concurrency as u32 + 4;
    Ok(open_waiting(&config.database_url, max_connections, config.limits, config.migrate, shutdown).await?)
}

/// Opens (and, if `migrate`, migrates) the store `url` names, waiting for
/// a database that is not available yet, with backoff, logged. `None` when
/// `shutdown` fired first.
///
/// # Errors
/// A database that answered with an error other than being unavailable
/// (a bad URL, a schema too new, a failed migration).
pub async fn open_waiting(
    url: &str,
    max_connections: u32,
    limits: EnqueueLimits,
    migrate: bool,
    shutdown: &CancellationToken,
) -> Result<Option<Store>, crate::store::Error> {
    let mut wait = OPEN_RETRY_FIRST;
    let mut attempt = 0u32;
    loop {
        attempt = attempt.saturating_add(1);
        let opening = async {
            let store = crate::store::open_with(url, max_connections, limits).await?;
            if migrate {
                store.schema_migrate().await?;
            }
            Ok::<_, crate::store::Error>(store)
        };
        let error = tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            opened = opening => match opened {
                Ok(store) => {
                    if attempt > 1 {
                        tracing::info!(attempt, "the database is available");
                    }
                    return Ok(Some(store));
                }
                Err(error) if error.is_unavailable() => error,
                Err(error) => return Err(error),
            },
        };
        tracing::warn!(%error, attempt, retry_in = ?wait, "the database is unavailable; waiting for it before starting");
        tokio::select! {
            () = shutdown.cancelled() => return Ok(None),
            () = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(OPEN_RETRY_MAX);
    }
}
