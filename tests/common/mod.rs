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
    JobContext {
        job_id,
        attempt,
        queue: "default".into(),
        enqueued_at_ms: 0,
        batch_id: None,
        concurrency_key: None,
        traceparent: None,
    }
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

pub mod bodies;
pub mod browser;
pub mod db;
pub mod fleet;
pub mod http;
pub mod pg_server;
pub mod proxy;
pub mod run_log;

/// A job type configuration for store-level tests that need no component.
pub fn job_config(name: &str) -> jobhost::types::JobConfig {
    jobhost::types::JobConfig {
        name: name.into(),
        queue: "default".into(),
        priority: 0,
        max_attempts: 3,
        backoff: jobhost::types::Backoff { base_ms: 10, cap_ms: 100 },
        timeout_ms: 10_000,
        memory_limit_bytes: 64 << 20,
        concurrency: None,
        unique: None,
        schedule: None,
        outbound: Vec::new(),
        rate_limit: None,
        on_events: Vec::new(),
    }
}

/// A host running in this process on a fresh components directory.
pub struct TestHost {
    pub components: tempfile::TempDir,
    pub shutdown: tokio_util::sync::CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), jobhost::host::HostError>>,
}

impl TestHost {
    /// Starts a host serving `guests` with short intervals, and waits until
    /// their job types are registered.
    pub async fn start(db: &db::TestDb, guests: &[&str], tune: impl FnOnce(&mut jobhost::HostConfig)) -> TestHost {
        let components = tempfile::tempdir().unwrap();
        for name in guests {
            std::fs::copy(guest(name), components.path().join(format!("{name}.wasm"))).unwrap();
        }
        let cache = std::env::temp_dir().join("jobhost-test-cache");
        let mut config = jobhost::HostConfig {
            database_url: db.url.clone(),
            components: Some(components.path().to_path_buf()),
            deployed: false,
            migrate: false,
            runtime: RuntimeConfig { cache_dir: Some(cache), ..RuntimeConfig::default() },
            worker: jobhost::worker::WorkerConfig {
                heartbeat_interval: Duration::from_millis(200),
                default_lease: Duration::from_secs(2),
                poll_interval: Duration::from_millis(200),
                shutdown_grace: Duration::from_secs(5),
                ..Default::default()
            },
            maintenance: jobhost::background::maintenance::MaintenanceConfig {
                interval: Duration::from_millis(50),
                ..Default::default()
            },
            schedules: Default::default(),
            limits: Default::default(),
            http: None,
            secret_key: None,
            otlp: None,
        };
        tune(&mut config);
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(jobhost::run(config, shutdown.clone()));
        let serving = format!(
            "SELECT count(*) FROM jobhost.hosts WHERE {} = {}",
            db.dialect("cardinality(job_types)", "json_array_length(job_types)"),
            guests.len()
        );
        eventually(Duration::from_secs(60), || async { db.scalar(&serving).await == 1 }).await;
        TestHost { components, shutdown, task }
    }

    /// Stops the host gracefully and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("host task").expect("host ran");
    }
}

/// Polls `condition` until it holds, failing after `within`. For state that
/// lives in the database, where there is no event to await.
pub async fn eventually<F, Fut>(within: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "condition not met within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fetch by host `host` of up to `limit` jobs of `types` from the default queue.
pub fn fetch_params(host: &str, types: &[&str], limit: i64) -> jobhost::store::FetchParams {
    jobhost::store::FetchParams {
        host_id: host.into(),
        queues: vec!["default".into()],
        job_types: types.iter().map(|t| (t.to_string(), 30)).collect(),
        limit,
    }
}

/// The end of a fetched job's run, as a worker would write it.
pub fn finish(job: &jobhost::store::FetchedJob, outcome: jobhost::store::FinishOutcome) -> jobhost::store::Finish {
    jobhost::store::Finish {
        id: job.id,
        lease_token: job.lease_token,
        attempt: job.attempt,
        outcome,
        log: serde_json::json!({}),
        progress: None,
        concurrency_key: job.concurrency_key.clone(),
        batch_id: job.batch_id,
        traceparent: None,
    }
}

/// Tells the store that the guests of `runs` started, as a host does for
/// each run it starts: an attempt is spent only by a run that started.
pub async fn confirm_started(db: &db::TestDb, runs: &[jobhost::store::RunId]) {
    db.store.lease_started(runs).await.expect("record the runs' start");
}

/// Renews `runs` as host `host`'s heartbeat would, every one of them
/// started, recording `progress`.
pub async fn renew(
    db: &db::TestDb,
    host: &str,
    runs: &[jobhost::store::RunId],
    progress: &[jobhost::store::RunProgress],
) -> jobhost::store::LeaseRenewal {
    let renew = jobhost::store::LeaseRenew { host_id: host, runs, started: runs, progress };
    db.store.lease_renew(&renew).await.expect("renew")
}

/// A successful run with no children.
pub fn completed() -> jobhost::store::FinishOutcome {
    let output = jobhost::types::JsonText::from(&serde_json::json!({"ok": true}));
    jobhost::store::FinishOutcome::Completed {
        output: Some(output),
        children: Vec::new().into(),
        batches: Default::default(),
        workflows: Default::default(),
        events: Default::default(),
        schedules: Default::default(),
    }
}

/// The output of a run that completed with one, parsed.
pub fn completed_output(outcome: &jobhost::types::RunOutcome) -> serde_json::Value {
    match outcome {
        jobhost::types::RunOutcome::Completed { output: Some(output) } => output.to_value().expect("output is JSON"),
        other => panic!("expected completion with output, got {other:?}"),
    }
}
