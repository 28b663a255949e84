//! Shared test harness: builds the example guests once, hands out runtimes
//! with private caches, and waits for events with a bound instead of sleeping.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use jobhost::component::{LoadedComponent, Runtime};
use jobhost::config::RuntimeConfig;
use jobhost::types::{JobContext, RunReport};

/// Builds every guest (once per test binary) and returns the component's path.
pub fn guest(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dist = BUILT.get_or_init(|| {
        let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests");
        let status =
            std::process::Command::new("bash").arg(guests.join("build.sh")).status().expect("run guests/build.sh");
        assert!(status.success(), "guests/build.sh failed");
        guests.join("dist")
    });
    let path = dist.join(format!("{name}.wasm"));
    assert!(path.exists(), "no guest {name} in {}", dist.display());
    path
}

/// Runtime settings for tests: a small pool, a private cache directory.
pub fn runtime_config(cache: &tempfile::TempDir) -> RuntimeConfig {
    RuntimeConfig { max_concurrent_runs: 16, cache_dir: Some(cache.path().to_path_buf()), ..RuntimeConfig::default() }
}

/// A runtime with a private cache; keep the `TempDir` alive as long as the runtime.
pub fn runtime() -> (Runtime, tempfile::TempDir) {
    let cache = tempfile::tempdir().expect("temp dir");
    let runtime = Runtime::new(runtime_config(&cache)).expect("runtime starts");
    (runtime, cache)
}

/// Loads an example guest.
pub async fn load(runtime: &Runtime, name: &str) -> LoadedComponent {
    runtime.load_file(&guest(name)).await.unwrap_or_else(|e| panic!("{name} loads: {e}"))
}

/// A job context for attempt `attempt` of job `job_id`.
pub fn context(job_id: u64, attempt: u32) -> JobContext {
    JobContext { job_id, attempt, queue: "default".into(), enqueued_at_ms: 0, batch_id: None, concurrency_key: None }
}

/// Runs one job to its report.
pub async fn run(runtime: &Runtime, component: &LoadedComponent, payload: serde_json::Value) -> RunReport {
    runtime.run(component, &context(7, 1), &payload.to_string(), jobhost::component::StopSignal::new()).await
}

/// Awaits the first broadcast item that `matches`, failing after `within`.
pub async fn wait_for<T: Clone + std::fmt::Debug>(
    events: &mut tokio::sync::broadcast::Receiver<T>,
    within: Duration,
    mut matches: impl FnMut(&T) -> bool,
) -> T {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(within, async {
        loop {
            match events.recv().await {
                Ok(event) if matches(&event) => return event,
                Ok(event) => seen.push(format!("{event:?}")),
                Err(error) => panic!("event stream ended: {error}"),
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no matching event within {within:?}; saw: {seen:#?}"))
}
