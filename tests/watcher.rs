//! Hot reload from a watched directory, awaiting registry events (never
//! sleeping): loads, replacements under a running job, corrupt files,
//! deletions, duplicate names, and atomic renames.

mod common;

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
