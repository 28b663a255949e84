//! Hot reload from a watched directory, awaiting registry events (never
//! sleeping): loads, replacements under a running job, corrupt files,
//! deletions, duplicate names, and atomic renames.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use jobhost::component::{DirectoryWatcher, LoadErrorKind, Registry, RegistryEvent, WatcherConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use common::{completed_output, guest, run, runtime, wait_for};

const WITHIN: Duration = Duration::from_secs(30);

struct Watched {
    dir: tempfile::TempDir,
    registry: Arc<Registry>,
    events: tokio::sync::broadcast::Receiver<RegistryEvent>,
    runtime: jobhost::component::Runtime,
    shutdown: CancellationToken,
    _cache: tempfile::TempDir,
}

impl Watched {
    /// Starts a watcher on a fresh directory holding `initial` guests.
    async fn start(initial: &[&str]) -> Watched {
        let dir = tempfile::tempdir().unwrap();
        for name in initial {
            std::fs::copy(guest(name), dir.path().join(format!("{name}.wasm"))).unwrap();
        }
        let (runtime, cache) = runtime();
        let registry = Arc::new(Registry::new());
        let mut events = registry.subscribe();
        let config = WatcherConfig { debounce: Duration::from_millis(50), ..WatcherConfig::new(dir.path()) };
        let mut watcher = DirectoryWatcher::new(runtime.clone(), registry.clone(), config).unwrap();
        // The initial scan completes before the watcher follows events, so
        // tests start from a known registry.
        watcher.run_once().await.unwrap();
        while events.try_recv().is_ok() {}
        let shutdown = CancellationToken::new();
        tokio::spawn(watcher.run(shutdown.clone()));
        Watched { dir, registry, events, runtime, shutdown, _cache: cache }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    async fn loaded(&mut self, file: &str) -> RegistryEvent {
        let path = self.path(file);
        wait_for(&mut self.events, WITHIN, |e| matches!(e, RegistryEvent::Loaded { path: p, .. } if *p == path)).await
    }

    async fn rejected(&mut self, file: &str) -> jobhost::component::LoadError {
        let path = self.path(file);
        match wait_for(
            &mut self.events,
            WITHIN,
            |e| matches!(e, RegistryEvent::Rejected { error } if error.path == path),
        )
        .await
        {
            RegistryEvent::Rejected { error } => error,
            _ => unreachable!(),
        }
    }

    async fn unloaded(&mut self, file: &str) {
        let path = self.path(file);
        wait_for(&mut self.events, WITHIN, |e| matches!(e, RegistryEvent::Unloaded { path: p, .. } if *p == path))
            .await;
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Writes under a hidden temporary name, then renames into place, as a
/// careful deploy would.
fn install_atomically(from: &Path, to: &Path) {
    let temp = to.with_file_name(format!(".{}.partial", to.file_name().unwrap().to_str().unwrap()));
    std::fs::copy(from, &temp).unwrap();
    std::fs::rename(&temp, to).unwrap();
}

#[tokio::test]
async fn the_initial_scan_loads_every_component() {
    let watched = Watched::start(&["hello", "sleep", "limited"]).await;
    let names: Vec<_> = watched.registry.components().iter().map(|c| c.config.name.clone()).collect();
    assert_eq!(names, ["hello", "limited", "sleep"]);
}

#[tokio::test]
async fn a_copied_in_component_is_loaded() {
    let mut watched = Watched::start(&[]).await;
    assert!(watched.registry.get("hello").is_none());
    std::fs::copy(guest("hello"), watched.path("hello.wasm")).unwrap();
    watched.loaded("hello.wasm").await;
    let hello = watched.registry.get("hello").expect("hello is served");
    assert!(run(&watched.runtime, &hello, json!({"name": "new"})).await.outcome.is_completed());
}

#[tokio::test]
async fn a_new_version_replaces_the_old_while_a_started_run_finishes_on_the_old() {
    let mut watched = Watched::start(&["hello"]).await;
    let v1 = watched.registry.get("hello").unwrap();
    let in_flight = {
        let (runtime, v1) = (watched.runtime.clone(), v1.clone());
        tokio::spawn(async move { run(&runtime, &v1, json!({"name": "old", "delay_ms": 1500})).await })
    };

    install_atomically(&guest("hello_v2"), &watched.path("hello.wasm"));
    let event = watched.loaded("hello.wasm").await;
    assert!(matches!(&event, RegistryEvent::Loaded { replaced: Some(old), .. } if *old == v1.digest), "{event:?}");
    let v2 = watched.registry.get("hello").unwrap();
    assert_ne!(v2.digest, v1.digest);
    assert_eq!(v2.config.priority, -1, "the new version's configuration is served");

    let new_run = run(&watched.runtime, &v2, json!({"name": "new"})).await;
    assert_eq!(completed_output(&new_run.outcome), json!({"greeting": "hi, new", "version": 2}));
    let old_run = in_flight.await.unwrap();
    let old_output = json!({"greeting": "hello, old", "job_id": 7});
    assert_eq!(completed_output(&old_run.outcome), old_output, "finished on v1");
}

#[tokio::test]
async fn a_corrupt_file_is_reported_and_the_old_version_keeps_serving() {
    let mut watched = Watched::start(&["hello"]).await;
    let good = watched.registry.get("hello").unwrap();
    std::fs::write(watched.path("hello.wasm"), b"\0asm garbage").unwrap();
    let error = watched.rejected("hello.wasm").await;
    assert!(matches!(error.kind, LoadErrorKind::Compile(_)), "{error}");
    let serving = watched.registry.get("hello").expect("still served");
    assert_eq!(serving.digest, good.digest);
    assert!(run(&watched.runtime, &serving, json!({})).await.outcome.is_completed());

    // Fixing the file brings it back.
    install_atomically(&guest("hello_v2"), &watched.path("hello.wasm"));
    watched.loaded("hello.wasm").await;
    assert_eq!(watched.registry.get("hello").unwrap().config.priority, -1);
}

#[tokio::test]
async fn an_invalid_configuration_never_replaces_a_good_version() {
    let mut watched = Watched::start(&["hello"]).await;
    std::fs::copy(guest("misconfigured"), watched.path("misconfigured.wasm")).unwrap();
    let error = watched.rejected("misconfigured.wasm").await;
    assert!(matches!(error.kind, LoadErrorKind::Config(_)), "{error}");
    assert!(watched.registry.get("misconfigured").is_none());
    assert!(watched.registry.get("hello").is_some());
}

#[tokio::test]
async fn a_deleted_file_is_unloaded() {
    let mut watched = Watched::start(&["hello", "sleep"]).await;
    std::fs::remove_file(watched.path("hello.wasm")).unwrap();
    watched.unloaded("hello.wasm").await;
    assert!(watched.registry.get("hello").is_none());
    assert!(watched.registry.get("sleep").is_some(), "other components stay");
}

#[tokio::test]
async fn two_files_declaring_one_job_type_are_refused_until_one_goes() {
    let mut watched = Watched::start(&["hello"]).await;
    std::fs::copy(guest("hello_v2"), watched.path("zz-hello-copy.wasm")).unwrap();
    let error = watched.rejected("zz-hello-copy.wasm").await;
    match &error.kind {
        LoadErrorKind::DuplicateName { name, other } => {
            assert_eq!(name, "hello");
            assert_eq!(*other, watched.path("hello.wasm"));
        }
        other => panic!("expected a duplicate-name error, got {other:?}"),
    }
    assert_eq!(watched.registry.get("hello").unwrap().source, watched.path("hello.wasm"));

    // Removing the first frees the name for the second.
    std::fs::remove_file(watched.path("hello.wasm")).unwrap();
    watched.loaded("zz-hello-copy.wasm").await;
    assert_eq!(watched.registry.get("hello").unwrap().source, watched.path("zz-hello-copy.wasm"));
}

#[tokio::test]
async fn temporary_and_foreign_files_are_ignored() {
    let mut watched = Watched::start(&[]).await;
    std::fs::write(watched.path("notes.txt"), b"not a component").unwrap();
    std::fs::write(watched.path(".hello.wasm.swp"), b"editor state").unwrap();
    install_atomically(&guest("hello"), &watched.path("hello.wasm"));
    watched.loaded("hello.wasm").await;
    // Only the real file produced an event: nothing was rejected on the way.
    while let Ok(event) = watched.events.try_recv() {
        assert!(!matches!(event, RegistryEvent::Rejected { .. }), "{event:?}");
    }
    assert_eq!(watched.registry.components().len(), 1);
}

/// Starts a watcher on `dir` that rescans every `rescan` and tries to watch
/// again every 50 ms while it cannot.
fn follow(dir: &Path, rescan: Duration) -> (Arc<Registry>, tokio::sync::broadcast::Receiver<RegistryEvent>, Guard) {
    let (runtime, cache) = runtime();
    let registry = Arc::new(Registry::new());
    let events = registry.subscribe();
    let config = WatcherConfig {
        debounce: Duration::from_millis(50),
        rescan_interval: rescan,
        rewatch_interval: Duration::from_millis(50),
        ..WatcherConfig::new(dir)
    };
    let watcher = DirectoryWatcher::new(runtime, registry.clone(), config).unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(watcher.run(shutdown.clone()));
    (registry, events, Guard { shutdown, task: Some(task), _cache: cache })
}

/// Stops a watcher when the test ends, checking it was still running.
struct Guard {
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), jobhost::component::watcher::WatchError>>>,
    _cache: tempfile::TempDir,
}

impl Guard {
    fn is_running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn loaded(events: &mut tokio::sync::broadcast::Receiver<RegistryEvent>, path: &Path) -> RegistryEvent {
    wait_for(events, WITHIN, |e| matches!(e, RegistryEvent::Loaded { path: p, .. } if p == path)).await
}

async fn reported_down(registry: &Registry) -> String {
    let mut error = None;
    common::eventually(WITHIN, || {
        error = registry.watcher_error();
        std::future::ready(error.is_some())
    })
    .await;
    error.unwrap_or_default()
}

#[tokio::test]
async fn a_directory_missing_when_watching_starts_is_reported_and_loaded_once_it_exists() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("components");
    std::fs::create_dir(&dir).unwrap();
    let (runtime, _cache) = runtime();
    let registry = Arc::new(Registry::new());
    let mut events = registry.subscribe();
    let config = WatcherConfig {
        rescan_interval: Duration::from_millis(200),
        rewatch_interval: Duration::from_millis(50),
        ..WatcherConfig::new(&dir)
    };
    let watcher = DirectoryWatcher::new(runtime, registry.clone(), config).unwrap();
    // Gone between the start's checks and the watch (a remount, a deploy).
    std::fs::remove_dir(&dir).unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(watcher.run(shutdown.clone()));
    let error = reported_down(&registry).await;
    assert!(!task.is_finished(), "the watcher keeps running without its directory ({error})");
    assert_eq!(error, "the components directory was removed or moved", "the documented sentence");

    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(guest("hello"), dir.join("hello.wasm")).unwrap();
    loaded(&mut events, &dir.join("hello.wasm")).await;
    common::eventually(WITHIN, || std::future::ready(registry.watcher_error().is_none())).await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_removed_and_recreated_directory_is_watched_again() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("components");
    std::fs::create_dir(&dir).unwrap();
    // No rescan during the test: only the watch can see the new file.
    let (registry, mut events, guard) = follow(&dir, Duration::from_secs(3600));
    common::eventually(WITHIN, || std::future::ready(guard.is_running())).await;
    std::fs::copy(guest("sleep"), dir.join("sleep.wasm")).unwrap();
    loaded(&mut events, &dir.join("sleep.wasm")).await;

    std::fs::remove_dir_all(&dir).unwrap();
    reported_down(&registry).await;
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(guest("hello"), dir.join("hello.wasm")).unwrap();
    loaded(&mut events, &dir.join("hello.wasm")).await;
    common::eventually(WITHIN, || std::future::ready(registry.watcher_error().is_none())).await;
    assert!(guard.is_running());
}

#[tokio::test]
async fn symlinked_components_load_and_reload_when_their_target_changes() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("components");
    std::fs::create_dir(&dir).unwrap();
    // A Kubernetes ConfigMap mount: each file links through `..data`,
    // itself a link to the current version's directory.
    for (version, guest_name) in [("..v1", "hello"), ("..v2", "hello_v2")] {
        std::fs::create_dir(dir.join(version)).unwrap();
        std::fs::copy(guest(guest_name), dir.join(version).join("hello.wasm")).unwrap();
    }
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/hello.wasm", dir.join("hello.wasm")).unwrap();
    // Links that cannot be components are skipped, without stopping the rest.
    std::os::unix::fs::symlink("..v1", dir.join("a-directory.wasm")).unwrap();
    std::os::unix::fs::symlink("nowhere.wasm", dir.join("dangling.wasm")).unwrap();

    let (registry, mut events, _guard) = follow(&dir, Duration::from_secs(3600));
    loaded(&mut events, &dir.join("hello.wasm")).await;
    let v1 = registry.get("hello").expect("served through the link");
    assert_eq!(v1.config.priority, 0);
    assert_eq!(registry.components().len(), 1, "the directory link and the dangling one are skipped");

    // The atomic swap the ConfigMap writer does: a new link renamed over `..data`.
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    let event = loaded(&mut events, &dir.join("hello.wasm")).await;
    assert!(matches!(&event, RegistryEvent::Loaded { replaced: Some(old), .. } if *old == v1.digest), "{event:?}");
    assert_eq!(registry.get("hello").unwrap().config.priority, -1, "the new target's configuration is served");
}
