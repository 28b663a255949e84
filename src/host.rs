//! A whole host: components from a watched directory, their job types
//! registered fleet-wide, the worker and the maintenance sweeps, until shutdown.

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::component::{DirectoryWatcher, Registry, RegistryEvent, Runtime, WatcherConfig};
use crate::config::RuntimeConfig;
use crate::maintenance::{Maintenance, MaintenanceConfig};
use crate::store::{EnqueueLimits, Store};
use crate::worker::{Worker, WorkerConfig};

/// Everything a host needs to run.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The database to share with the fleet.
    pub database_url: String,
    /// The directory of components.
    pub components: PathBuf,
    /// Apply migrations at start.
    pub migrate: bool,
    /// The component runtime.
    pub runtime: RuntimeConfig,
    /// The worker.
    pub worker: WorkerConfig,
    /// The sweeps.
    pub maintenance: MaintenanceConfig,
    /// What an enqueue may carry: the children of this host's runs, checked
    /// at the guest's call and again when written.
    pub limits: EnqueueLimits,
}

/// Why a host could not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A setting cannot work.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The runtime could not start.
    #[error(transparent)]
    Runtime(#[from] crate::component::RuntimeError),
    /// The components directory could not be watched.
    #[error(transparent)]
    Watch(#[from] crate::component::watcher::WatchError),
    /// The database could not be used.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// Runs a host until `shutdown` fires, then stops gracefully.
///
/// # Errors
/// Anything that prevents the host from starting; once running, failures
/// are logged and retried.
pub async fn run(config: HostConfig, shutdown: CancellationToken) -> Result<(), HostError> {
    let runtime_config = RuntimeConfig {
        heartbeat_interval: config.worker.heartbeat_interval,
        max_concurrent_runs: config.worker.concurrency as u32,
        max_payload_bytes: config.limits.max_payload_bytes,
        ..config.runtime.clone()
    };
    let runtime = Runtime::new(runtime_config)?;
    let store =
        crate::store::open_with(&config.database_url, config.worker.concurrency as u32 + 4, config.limits).await?;
    if config.migrate {
        store.migrate().await?;
    }
    let registry = Arc::new(Registry::new());
    let mut watcher = DirectoryWatcher::new(runtime.clone(), registry.clone(), WatcherConfig::new(&config.components))?;
    let events = registry.subscribe();
    watcher.run_once().await?;
    register_all(store.as_ref(), &registry).await?;
    tracing::info!(
        database = store.location(),
        job_types = ?registry.components().iter().map(|c| &c.config.name).collect::<Vec<_>>(),
        "host starting"
    );

    let background = CancellationToken::new();
    let watching = tokio::spawn(watcher.run(background.clone()));
    let registering = tokio::spawn(register_on_load(store.clone(), registry.clone(), events, background.clone()));
    let maintenance = Maintenance::new(store.clone(), config.maintenance.clone())?;
    let sweeping = tokio::spawn(maintenance.run(background.clone()));

    let worker = Worker::new(store, runtime, registry, config.worker.clone())?;
    tracing::info!(host_id = worker.host_id(), "worker running");
    worker.run(shutdown).await;

    background.cancel();
    let _ = tokio::join!(watching, registering, sweeping);
    tracing::info!("host stopped");
    Ok(())
}

async fn register_all(store: &dyn Store, registry: &Registry) -> crate::store::Result<()> {
    let types: Vec<_> = registry.components().iter().map(|c| (c.config.clone(), c.digest.clone())).collect();
    store.job_types_register(&types).await
}

/// Records each newly loaded configuration so every enqueuer applies it.
async fn register_on_load(
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    mut events: tokio::sync::broadcast::Receiver<RegistryEvent>,
    shutdown: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            () = shutdown.cancelled() => return,
            event = events.recv() => event,
        };
        match event {
            Ok(RegistryEvent::Loaded { .. }) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                if let Err(error) = register_all(store.as_ref(), &registry).await {
                    tracing::error!(%error, "cannot record job types in the database");
                }
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}
