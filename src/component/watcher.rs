//! Keeps the registry in step with a directory of `.wasm` files.
//!
//! File events only say *that* something changed; after a quiet spell the
//! watcher rescans the whole directory and reconciles by content digest. That
//! one rule covers copies, in-place writes, write-then-rename, editors' swap
//! files, missed events and symbolic links whose target changed alike, and a
//! file caught half-written simply fails to load and is retried on its next
//! change. A watch that fails or is lost never ends the watcher: it says so
//! (log, registry) and falls back to rescanning until it can watch again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::{LoadErrorKind, Registry, RegistryEvent, Runtime};

/// Settings of a [`DirectoryWatcher`].
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// The directory of components.
    pub dir: PathBuf,
    /// Quiet time after the last file event before rescanning, so a file
    /// still being written is not loaded at every chunk.
    pub debounce: Duration,
    /// A full rescan at this interval even without events, for file systems
    /// that do not report changes (network mounts), and while the directory
    /// cannot be watched.
    pub rescan_interval: Duration,
    /// While the directory cannot be watched, how often to try again.
    pub rewatch_interval: Duration,
}

impl WatcherConfig {
    /// Defaults for `dir`: 100 ms debounce, rescan every 30 s, try to watch
    /// again every second while the watch is down.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        WatcherConfig {
            dir: dir.into(),
            debounce: Duration::from_millis(100),
            rescan_interval: Duration::from_secs(30),
            rewatch_interval: Duration::from_secs(1),
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
        if self.debounce.is_zero() || self.rescan_interval.is_zero() || self.rewatch_interval.is_zero() {
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
    #[error("{}", list_reason(.0))]
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
    /// Entries skipped at the last scan, and why: each is warned about once.
    skipped: HashMap<PathBuf, String>,
    /// Another source (the deployments) stopped serving a type: the next
    /// scan tries the files that declared a type already served.
    name_freed: bool,
}

impl DirectoryWatcher {
    /// A watcher feeding `registry` from `config.dir`.
    ///
    /// # Errors
    /// Invalid settings.
    pub fn new(runtime: Runtime, registry: Arc<Registry>, config: WatcherConfig) -> Result<Self, WatchError> {
        config.validate()?;
        Ok(DirectoryWatcher {
            runtime,
            registry,
            config,
            files: HashMap::new(),
            skipped: HashMap::new(),
            name_freed: false,
        })
    }

    /// Rescans the directory once and brings the registry in line with it.
    ///
    /// # Errors
    /// The directory could not be listed; the registry is left as it was.
    pub async fn run_once(&mut self) -> Result<(), WatchError> {
        let Listing { components: present, skipped } = list_components(&self.config.dir)?;
        for (path, reason) in &skipped {
            if self.skipped.get(path) != Some(reason) {
                tracing::warn!(path = %path.display(), %reason, "not a component; skipped");
            }
        }
        self.skipped = skipped;
        let gone: Vec<PathBuf> = self.files.keys().filter(|p| !present.contains(*p)).cloned().collect();
        let freed_a_name = !gone.is_empty() || std::mem::take(&mut self.name_freed);
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
    /// Watching never ends the task: when the watch cannot be set up or is
    /// lost (the directory removed or moved, inotify instances exhausted),
    /// the error is logged, recorded in the registry for the host's fleet
    /// row, the directory is still rescanned every `rescan_interval`, and
    /// the watch is set up again every `rewatch_interval` until it works.
    ///
    /// # Errors
    /// None so far; the result is kept for errors that must end watching.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), WatchError> {
        let (events_tx, mut events) = mpsc::unbounded_channel();
        let mut served = self.registry.subscribe();
        let mut watch = self.watch(&events_tx);
        if !self.rescan(&shutdown).await {
            watch = None;
        }
        let mut rescan = tokio::time::interval(self.config.rescan_interval);
        rescan.tick().await;
        let mut rewatch = tokio::time::interval(self.config.rewatch_interval);
        rewatch.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                _ = rescan.tick() => {}
                unloaded = served.recv() => {
                    // A type another source served is free: a file that
                    // declared it (refused as a duplicate) may serve it now.
                    let freed = match unloaded {
                        Ok(RegistryEvent::Unloaded { path, .. }) => !self.files.contains_key(&path),
                        Ok(_) => false,
                        Err(broadcast::error::RecvError::Lagged(_)) => true,
                        Err(broadcast::error::RecvError::Closed) => return Ok(()),
                    };
                    let waiting = self.files.values().any(|f| matches!(f, FileState::Duplicate(_)));
                    if !(freed && waiting) {
                        continue;
                    }
                    self.name_freed = true;
                }
                _ = rewatch.tick(), if watch.is_none() => {
                    watch = self.watch(&events_tx);
                    if watch.is_none() {
                        continue;
                    }
                    // Changes made while unwatched: the rescan below catches up.
                }
                event = events.recv() => {
                    // This task holds a sender, so the channel never closes.
                    let Some(event) = event else { return Ok(()) };
                    let mut relevant = false;
                    let mut next = Some(event);
                    // Let a burst of events (a copy in chunks, a rename)
                    // settle, minding each: a removed directory may be among them.
                    while let Some(event) = next {
                        if let Some(reason) = self.watch_lost_by(&event) {
                            self.watch_lost(reason);
                            watch = None;
                            relevant = true;
                        }
                        relevant |= event.as_ref().is_ok_and(|e| {
                            e.paths.iter().any(|p| is_component_path(p) || is_link_layout(p))
                        });
                        next = tokio::time::timeout(self.config.debounce, events.recv()).await.ok().flatten();
                    }
                    if !relevant {
                        continue;
                    }
                }
            }
            if !self.rescan(&shutdown).await {
                // Listing failed: whatever the watch was following is gone.
                watch = None;
            }
        }
    }

    /// Rescans unless `shutdown` fires first (a long compile is abandoned).
    /// Returns false when the directory could not be listed.
    async fn rescan(&mut self, shutdown: &CancellationToken) -> bool {
        let scanned = tokio::select! {
            () = shutdown.cancelled() => return true,
            scanned = self.run_once() => scanned,
        };
        match scanned {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(%error, "rescan of the components directory failed");
                self.registry.set_watcher_error(Some(error.to_string()));
                false
            }
        }
    }

    /// Sets up the watch, recording in the registry whether it worked.
    fn watch(
        &self,
        events: &mpsc::UnboundedSender<notify::Result<notify::Event>>,
    ) -> Option<notify::RecommendedWatcher> {
        let events = events.clone();
        let watched = notify::recommended_watcher(move |event| {
            let _ = events.send(event);
        })
        .and_then(|mut watcher| watcher.watch(&self.config.dir, RecursiveMode::NonRecursive).map(|()| watcher));
        match watched {
            Ok(watcher) => {
                if self.registry.watcher_error().is_some() {
                    tracing::warn!(dir = %self.config.dir.display(), "watching the components directory again");
                    self.registry.set_watcher_error(None);
                }
                Some(watcher)
            }
            Err(error) => {
                let reason = unwatched_reason(&error);
                if self.registry.watcher_error().as_ref() != Some(&reason) {
                    tracing::error!(
                        dir = %self.config.dir.display(),
                        %reason,
                        rescan_every = ?self.config.rescan_interval,
                        "the components directory is not watched; rescanning on an interval and trying again"
                    );
                }
                self.registry.set_watcher_error(Some(reason));
                None
            }
        }
    }

    fn watch_lost(&self, reason: String) {
        tracing::error!(
            dir = %self.config.dir.display(),
            %reason,
            "lost the watch on the components directory; watching it again"
        );
        self.registry.set_watcher_error(Some(reason));
    }

    /// Why an event means the watch sees nothing from now on: an error, or
    /// the watched directory itself removed or moved (the watch followed
    /// that directory, not its path).
    fn watch_lost_by(&self, event: &notify::Result<notify::Event>) -> Option<String> {
        use notify::EventKind;
        use notify::event::ModifyKind;
        match event {
            Err(error) => Some(format!("file watch error: {error}")),
            Ok(event)
                if matches!(event.kind, EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_)))
                    && event.paths.contains(&self.config.dir) =>
            {
                Some("the components directory was removed or moved".to_string())
            }
            Ok(_) => None,
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

/// Entries a symlinked layout swaps to change its components' targets at
/// once: Kubernetes' `..data` link (and its `..data_tmp`, `..2024_…`
/// directories). A change there changes what `hello.wasm -> ..data/hello.wasm`
/// reads, without an event naming `hello.wasm`.
fn is_link_layout(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|name| name.starts_with(".."))
}

/// What a directory listing found: components, and the entries that look
/// like components but cannot be one (with the reason), to warn about.
#[derive(Debug, Default)]
struct Listing {
    components: Vec<PathBuf>,
    skipped: HashMap<PathBuf, String>,
}

/// Regular `.wasm` files and symbolic links to them (ConfigMap mounts,
/// release layouts); a link to a directory or a dangling link is skipped.
fn list_components(dir: &Path) -> std::io::Result<Listing> {
    let mut listing = Listing::default();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if !is_component_path(&path) {
            continue;
        }
        let file_type = entry.file_type()?;
        if file_type.is_file() {
            listing.components.push(path);
        } else if file_type.is_symlink() {
            match std::fs::metadata(&path) {
                Ok(target) if target.is_file() => listing.components.push(path),
                Ok(_) => {
                    listing.skipped.insert(path, "a symbolic link to something other than a file".into());
                }
                Err(error) => {
                    listing.skipped.insert(path, format!("a symbolic link whose target cannot be read: {error}"));
                }
            }
        }
    }
    listing.components.sort();
    Ok(listing)
}

/// Why the directory cannot be listed: the sentence `jobhost stats` shows
/// for a directory that is gone, as for one that cannot be watched.
fn list_reason(error: &std::io::Error) -> String {
    if error.kind() == std::io::ErrorKind::NotFound {
        return "the components directory was removed or moved".to_string();
    }
    format!("cannot list the components directory: {error}")
}

/// Why the directory cannot be watched, in a sentence for the host's row
/// and `jobhost stats` (notify's own text ends in a debug list of paths).
fn unwatched_reason(error: &notify::Error) -> String {
    match &error.kind {
        notify::ErrorKind::PathNotFound => "the components directory was removed or moved".to_string(),
        notify::ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::NotFound => {
            "the components directory was removed or moved".to_string()
        }
        notify::ErrorKind::MaxFilesWatch => {
            "cannot watch the components directory: the system's limit of watches is reached \
             (raise fs.inotify.max_user_watches or max_user_instances)"
                .to_string()
        }
        notify::ErrorKind::Io(io) => format!("cannot watch the components directory: {io}"),
        notify::ErrorKind::Generic(text) => format!("cannot watch the components directory: {text}"),
        other => format!("cannot watch the components directory: {other:?}"),
    }
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
