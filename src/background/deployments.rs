//! Serves the components deployed through the database (`jobhost deploy`),
//! keeping the registry in step with what the fleet's database says each
//! deployed job type runs.
//!
//! The same rule as the directory watcher's: reconcile by digest. At each
//! look (told by `NOTIFY` on PostgreSQL, a short poll on SQLite, and every
//! few seconds in any case, for a notification lost with a connection) the
//! follower reads every deployed type's digest, one small read, and loads
//! what it does not serve yet. It compares the whole set rather than the
//! newest entry's id: ids are handed out at insert, not at commit, so a
//! change to one type can commit after a later-numbered change to another.
//!
//! A version loads from the compiled artifact cache when this machine has
//! compiled it before, otherwise from the bytes in the database, checked
//! against the digest they were deployed under. A version that fails to
//! load here is refused and never replaces the one serving; it is tried
//! again when the deployment changes, or a minute later. Runs hold their
//! component, so a job already running finishes on the version it started
//! with.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::component::{LoadError, LoadErrorKind, LoadedComponent, Registry, Runtime, digest_of};
use crate::store::{Deployment, Store};

/// The longest a change goes unseen when its notification was lost.
const LOOK_EVERY: Duration = Duration::from_secs(5);

/// How long a version this host refused waits before it is tried again.
const RETRY_REFUSED: Duration = Duration::from_secs(60);

/// The registry's name for the deployed component of `job_type`, standing
/// where a file's path stands for a component from the directory.
pub fn source_of(job_type: &str) -> PathBuf {
    PathBuf::from(format!("database:{job_type}"))
}

/// Why a deployed version was not loaded this time.
enum Missed {
    /// The database could not be read: try again at the next look.
    Unavailable(crate::store::Error),
    /// The component cannot serve here: refused until the deployment changes.
    Refused(LoadError),
}

/// Loads, replaces and unloads deployed components as the database says.
pub struct DeploymentFollower {
    runtime: Runtime,
    registry: Arc<Registry>,
    store: Store,
    /// The digest installed for each deployed type.
    served: HashMap<String, String>,
    /// The history entry whose version was refused, by type, and when: not
    /// tried again until a newer entry (a new version, or the same one
    /// repaired), or [`RETRY_REFUSED`] later, in case the cause passed (a
    /// `describe` out of time on a loaded machine).
    refused: HashMap<String, (i64, Instant)>,
    /// The digest of a type a file serves here, warned about once.
    shadowed: HashMap<String, String>,
}

impl DeploymentFollower {
    /// A follower feeding `registry` from `store`'s deployments.
    pub fn new(runtime: Runtime, registry: Arc<Registry>, store: Store) -> Self {
        DeploymentFollower {
            runtime,
            registry,
            store,
            served: HashMap::new(),
            refused: HashMap::new(),
            shadowed: HashMap::new(),
        }
    }

    /// Looks once and brings the registry in line with the deployments.
    ///
    /// # Errors
    /// The database could not be read; the registry is left as it was, and
    /// the next look tries again.
    pub async fn run_once(&mut self) -> Result<(), crate::store::Error> {
        let deployed = self.store.deployments_current().await?;
        let gone: Vec<String> =
            self.served.keys().filter(|name| !deployed.iter().any(|d| d.job_type == **name)).cloned().collect();
        for name in gone {
            self.served.remove(&name);
            self.registry.remove_path(&source_of(&name));
        }
        self.refused.retain(|name, (entry, at)| {
            at.elapsed() < RETRY_REFUSED && deployed.iter().any(|d| d.job_type == *name && d.entry == *entry)
        });
        for deployment in &deployed {
            let name = &deployment.job_type;
            if self.served.get(name) == Some(&deployment.digest)
                || self.refused.get(name).map(|r| r.0) == Some(deployment.entry)
            {
                continue;
            }
            if let Some(other) = self.registry.get(name).filter(|c| c.source != source_of(name)) {
                // A file here serves the type; the deployed version waits
                // for the file to go (looked at again every few seconds).
                if self.shadowed.insert(name.clone(), deployment.digest.clone()).as_ref() != Some(&deployment.digest) {
                    tracing::warn!(
                        job = %name,
                        file = %other.source.display(),
                        "a deployed job type is served from a file on this host; the deployed version waits for it to go"
                    );
                }
                continue;
            }
            match self.load(deployment).await {
                Ok(component) => match self.registry.install(component) {
                    Ok(_) => {
                        self.served.insert(name.clone(), deployment.digest.clone());
                    }
                    Err(error) => self.registry.reject(error),
                },
                Err(Missed::Unavailable(error)) => {
                    tracing::warn!(job = %name, %error, "cannot fetch a deployed component; trying again");
                }
                Err(Missed::Refused(error)) => {
                    self.registry.reject(error);
                    self.refused.insert(name.clone(), (deployment.entry, Instant::now()));
                }
            }
        }
        Ok(())
    }

    /// Compiles the deployed version, from this machine's artifact cache if
    /// it is there, else from its bytes in the database.
    async fn load(&self, deployment: &Deployment) -> Result<LoadedComponent, Missed> {
        let source = source_of(&deployment.job_type);
        let refused = |kind| Missed::Refused(LoadError { path: source.clone(), kind });
        let cached = match self.runtime.load_cached(&source, &deployment.digest).await {
            Some(Ok(component)) => Some(Ok(component)),
            // An artifact that loads but does not link or describe here is
            // not trusted: the bytes in the database decide.
            Some(Err(error)) => {
                tracing::warn!(%error, "a cached deployed component failed to load; compiling it from the database");
                None
            }
            None => None,
        };
        let loaded = match cached {
            Some(loaded) => loaded,
            None => {
                let bytes =
                    self.store.component_source(&deployment.digest).await.map_err(Missed::Unavailable)?.ok_or_else(
                        || refused(LoadErrorKind::Deployment("its bytes are not in the database".into())),
                    )?;
                let actual = digest_of(&bytes);
                if actual != deployment.digest {
                    return Err(refused(LoadErrorKind::Deployment(format!(
                        "the stored bytes have digest {actual}, not the deployed {}",
                        deployment.digest
                    ))));
                }
                self.runtime.load_bytes(&source, bytes).await
            }
        };
        let component = loaded.map_err(Missed::Refused)?;
        if component.config.name != deployment.job_type {
            return Err(refused(LoadErrorKind::Deployment(format!(
                "it declares job type {:?}, not {:?}",
                component.config.name, deployment.job_type
            ))));
        }
        Ok(component)
    }

    /// Follows the deployments until `shutdown` fires. Failures to read the
    /// database are logged and retried at the next look.
    pub async fn run(mut self, shutdown: CancellationToken) {
        // Listen before looking, so a change made after the look is heard.
        self.store.deployments_wait(Duration::ZERO).await;
        loop {
            let looked = tokio::select! {
                () = shutdown.cancelled() => return,
                looked = self.run_once() => looked,
            };
            if let Err(error) = looked {
                tracing::warn!(%error, "cannot read the deployed components; trying again");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.store.deployments_wait(LOOK_EVERY) => {}
            }
        }
    }
}
