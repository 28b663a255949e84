//! Keeps the registry in step with a directory of `.wasm` files.
//!
//! File events only say *that* something changed; after a quiet spell the
//! watcher rescans the whole directory and reconciles by content digest. That
//! one rule covers copies, in-place writes, write-then-rename, editors' swap
//! files and missed events alike, and a file caught half-written simply fails
//! to load and is retried on its next change.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{LoadErrorKind, Registry, Runtime};

/// Settings of a [`DirectoryWatcher`].
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// The directory of components.
    pub dir: PathBuf,
    /// Quiet time after the last file event before rescanning, so a file
    /// still being written is not loaded at every chunk.
    pub debounce: Duration,
    /// A full rescan at this interval even without events, for file systems
    /// that do not report changes (network mounts).
    pub rescan_interval: Duration,
}

impl WatcherConfig {
    /// Defaults for `dir`: 100 ms debounce, rescan every 30 s.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        WatcherConfig {
            dir: dir.into(),
            debounce: Duration::from_millis(100),
            rescan_interval: Duration::from_secs(30),
        }
    }

    /// Checks that the settings can work.
    ///
    /// # Errors
    /// The directory does not exist or is not a directory, or an interval is zero.
    pub fn validate(&self) -> Result<(), WatchError> {
        if !self.dir.is_dir() {
            return Err(WatchError::NotADirectory(self.dir.clone()));
        }
        if self.debounce.is_zero() || self.rescan_interval.is_zero() {
            return Err(WatchError::Interval);
        }
        Ok(())
    }
}

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The components path is not a directory.
    #[error("components directory {} does not exist or is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// An interval setting is zero.
    #[error("watcher intervals must be positive")]
    Interval,
    /// The operating system refused to watch the directory.
    #[error("cannot watch the components directory: {0}")]
    Notify(#[from] notify::Error),
    /// The directory could not be listed.
    #[error("cannot list the components directory: {0}")]
    List(#[from] std::io::Error),
}

/// What the watcher last saw in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FileState {
    /// Serving this digest.
    Loaded(String),
    /// This digest failed to load; not retried until the file changes.
    Rejected(String),
    /// This digest names a job type another file serves; retried when some
    /// file is unloaded, since that may free the name.
    Duplicate(String),
}

/// Loads, reloads and unloads components as files come and go.
pub struct DirectoryWatcher {
    runtime: Runtime,
    registry: Arc<Registry>,
    config: WatcherConfig,
    files: HashMap<PathBuf, FileState>,
}

impl DirectoryWatcher {
    /// A watcher feeding `registry` from `config.dir`.
    ///
    /// # Errors
    /// Invalid settings.
    pub fn new(runtime: Runtime, registry: Arc<Registry>, config: WatcherConfig) -> Result<Self, WatchError> {
        config.validate()?;
        Ok(DirectoryWatcher { runtime, registry, config, files: HashMap::new() })
    }

    /// Rescans the directory once and brings the registry in line with it.
    ///
    /// # Errors
    /// The directory could not be listed; the registry is left as it was.
    pub async fn run_once(&mut self) -> Result<(), WatchError> {
        let present = list_components(&self.config.dir)?;
        let gone: Vec<PathBuf> = self.files.keys().filter(|p| !present.contains(*p)).cloned().collect();
        let freed_a_name = !gone.is_empty();
        for path in gone {
            self.files.remove(&path);
            self.registry.remove_path(&path);
        }
        for path in present {
            self.reconcile(path, freed_a_name).await;
        }
        Ok(())
    }

    async fn reconcile(&mut self, path: PathBuf, retry_duplicates: bool) {
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            // Removed between listing and reading: the next scan unloads it.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot read component; will retry");
                return;
            }
        };
        let digest = super::digest_of(&bytes);
        match self.files.get(&path) {
            Some(FileState::Loaded(d) | FileState::Rejected(d)) if *d == digest => return,
            Some(FileState::Duplicate(d)) if *d == digest && !retry_duplicates => return,
            _ => {}
        }
        let state = match self.runtime.load_bytes(&path, bytes).await {
            Ok(component) => match self.registry.install(component) {
                Ok(_) => FileState::Loaded(digest),
                Err(error) => {
                    self.registry.reject(error);
                    FileState::Duplicate(digest)
                }
            },
            Err(error) => {
                let state = match error.kind {
                    LoadErrorKind::DuplicateName { .. } => FileState::Duplicate(digest),
                    _ => FileState::Rejected(digest),
                };
                self.registry.reject(error);
                state
            }
        };
        self.files.insert(path, state);
    }

    /// Scans once, then follows the directory until `shutdown` fires.
    ///
    /// # Errors
    /// The directory could not be watched or listed at start.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), WatchError> {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let mut watcher = notify::recommended_watcher(move |event| {
            let _ = events_tx.send(event);
        })?;
        watcher.watch(&self.config.dir, RecursiveMode::NonRecursive)?;
        self.run_once().await?;
        let mut rescan = tokio::time::interval(self.config.rescan_interval);
        rescan.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                _ = rescan.tick() => {}
                event = events.recv() => {
                    match event {
                        None => return Ok(()),
                        Some(Err(error)) => tracing::warn!(%error, "file watch error; rescanning"),
                        Some(Ok(event)) if !event.paths.iter().any(|p| is_component_path(p)) => continue,
                        Some(Ok(_)) => {}
                    }
                    // Let a burst of events (a copy in chunks, a rename) settle.
                    while let Ok(Some(_)) = tokio::time::timeout(self.config.debounce, events.recv()).await {}
                }
            }
            if let Err(error) = self.run_once().await {
                tracing::error!(%error, "rescan of the components directory failed");
            }
        }
    }
}

/// `.wasm` files, ignoring hidden ones (editors' and tools' temporary files).
fn is_component_path(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    !name.starts_with('.') && name.ends_with(".wasm")
}

fn list_components(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if is_component_path(&path) && entry.file_type()?.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_visible_wasm_files_are_components() {
        assert!(is_component_path(Path::new("/d/hello.wasm")));
        assert!(!is_component_path(Path::new("/d/.hello.wasm.swp")));
        assert!(!is_component_path(Path::new("/d/.hello.wasm")));
        assert!(!is_component_path(Path::new("/d/hello.wasm.tmp")));
        assert!(!is_component_path(Path::new("/d/hello.wasm~")));
        assert!(!is_component_path(Path::new("/d/hello.cwasm.txt")));
    }
}
