//! The job types this host serves: job name → loaded component. Replaced
//! atomically per name; a run holds its component by `Arc`, so it finishes on
//! the version it started with.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tokio::sync::broadcast;

use super::{LoadError, LoadErrorKind, LoadedComponent};

/// What happened to the registry, for logs, the database and tests.
#[derive(Debug, Clone)]
pub enum RegistryEvent {
    /// A component now serves a job type (new, or replacing an older version).
    Loaded {
        /// The job type.
        name: String,
        /// The file.
        path: PathBuf,
        /// The file's digest.
        digest: String,
        /// The digest of the version it replaced, if any.
        replaced: Option<String>,
    },
    /// A file could not be loaded; whatever served before keeps serving.
    Rejected {
        /// The error, naming the file.
        error: LoadError,
    },
    /// A job type is no longer served by this host.
    Unloaded {
        /// The job type.
        name: String,
        /// The file that was removed.
        path: PathBuf,
    },
}

/// The loaded job types of one host.
pub struct Registry {
    by_name: RwLock<HashMap<String, Arc<LoadedComponent>>>,
    events: broadcast::Sender<RegistryEvent>,
    /// Why the directory watcher feeding this registry is down, if it is:
    /// kept here, beside what the host serves, so the host's fleet row
    /// reports both.
    watcher_error: std::sync::Mutex<Option<String>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry { by_name: RwLock::default(), events: broadcast::channel(1024).0, watcher_error: Default::default() }
    }

    /// Why the watcher cannot follow the components directory (`None`
    /// while it can): the host serves what it has but may miss new files.
    pub fn watcher_error(&self) -> Option<String> {
        self.watcher_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Records whether the watcher is down, and why.
    pub fn set_watcher_error(&self, error: Option<String>) {
        *self.watcher_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = error;
    }

    /// Events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<RegistryEvent> {
        self.events.subscribe()
    }

    /// The component serving a job type.
    pub fn get(&self, name: &str) -> Option<Arc<LoadedComponent>> {
        self.read().get(name).cloned()
    }

    /// Every loaded component, by job name.
    pub fn components(&self) -> Vec<Arc<LoadedComponent>> {
        let mut all: Vec<_> = self.read().values().cloned().collect();
        all.sort_by(|a, b| a.config.name.cmp(&b.config.name));
        all
    }

    /// Makes a component serve its job type, replacing the version from the
    /// same file (even under another name).
    ///
    /// # Errors
    /// Another file already serves that job type; nothing changes.
    pub fn install(&self, component: LoadedComponent) -> Result<Arc<LoadedComponent>, LoadError> {
        let component = Arc::new(component);
        let name = component.config.name.clone();
        let replaced = {
            let mut by_name = self.write();
            if let Some(other) = by_name.get(&name).filter(|other| other.source != component.source) {
                return Err(LoadError {
                    path: component.source.clone(),
                    kind: LoadErrorKind::DuplicateName { name, other: other.source.clone() },
                });
            }
            // The file may have changed the name it declares.
            by_name.retain(|n, c| c.source != component.source || *n == name);
            by_name.insert(name.clone(), component.clone())
        };
        tracing::info!(job = %name, path = %component.source.display(), digest = %component.digest, "component loaded");
        let _ = self.events.send(RegistryEvent::Loaded {
            name,
            path: component.source.clone(),
            digest: component.digest.clone(),
            replaced: replaced.map(|old| old.digest.clone()),
        });
        Ok(component)
    }

    /// Stops serving whatever the file provided.
    pub fn remove_path(&self, path: &Path) -> Option<Arc<LoadedComponent>> {
        let removed = {
            let mut by_name = self.write();
            let name = by_name.iter().find(|(_, c)| c.source == path).map(|(n, _)| n.clone())?;
            by_name.remove(&name)
        }?;
        tracing::info!(job = %removed.config.name, path = %path.display(), "component unloaded");
        let _ =
            self.events.send(RegistryEvent::Unloaded { name: removed.config.name.clone(), path: path.to_path_buf() });
        Some(removed)
    }

    /// Reports a file that could not be loaded.
    pub fn reject(&self, error: LoadError) {
        tracing::error!(%error, "component rejected; the previous version, if any, keeps serving");
        let _ = self.events.send(RegistryEvent::Rejected { error });
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<LoadedComponent>>> {
        // Writers never panic while holding the lock (plain map updates).
        self.by_name.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<LoadedComponent>>> {
        self.by_name.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
