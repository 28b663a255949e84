//! Per-job sandbox overhead and component load times.
//!
//! `cargo bench --bench sandbox [-- GUEST]` (after `guests/build.sh`), for
//! the Rust `hello` by default or another greeting handler (`py_hello` in
//! Python, `js_hello` in JavaScript). Prints a Markdown table; BENCHMARKS.md records the figures
//! with machine and date.
//!
//! - per-job: instantiate `hello` from its `InstancePre` in a fresh store,
//!   call `run`, drop the store; timed around `Runtime::run`, on one thread
//!   and on two threads running side by side.
//! - load: compile from scratch versus load from the artifact cache
//!   (deserialize, link, `describe`).
//! - a guest's 5 ms sleep (`sleep`, `std::thread::sleep`), by the guest's
//!   own clock: how far past 5 ms it woke (with the Rust `hello` only).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobhost::component::{LoadedComponent, Runtime, StopSignal};
use jobhost::config::RuntimeConfig;
use jobhost::types::JobContext;

/// Runs and loads measured: (warm-up runs, runs, loads). A handler that
/// bundles an interpreter runs in milliseconds and compiles in seconds, so
/// it gets fewer.
fn counts(guest: &str) -> (usize, usize, usize) {
    if guest == "hello" { (2_000, 20_000, 20) } else { (50, 1_000, 3) }
}

/// The guest named on the command line (cargo passes its own `--bench`).
fn guest() -> String {
    std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_else(|| "hello".into())
}

fn hello_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("guests/dist/{}.wasm", guest()))
}

fn context() -> JobContext {
    JobContext {
        job_id: 1,
        attempt: 1,
        queue: "default".into(),
        enqueued_at_ms: 0,
        batch_id: None,
        concurrency_key: None,
        traceparent: None,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
    println!("| {label} | {} | {:.1} | {:.1} |", samples.len(), p50.as_secs_f64() * 1e6, p99.as_secs_f64() * 1e6);
}

async fn per_job(runtime: &Runtime, hello: &LoadedComponent, runs: usize) -> Vec<Duration> {
    let ctx = context();
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let report = runtime.run(hello, &ctx, r#"{"name":"bench"}"#, StopSignal::new()).await;
        samples.push(started.elapsed());
        assert!(report.outcome.is_completed(), "{:?}", report.outcome);
    }
    samples
}

fn main() {
    assert!(hello_path().exists(), "run guests/build.sh first (no {})", hello_path().display());
    let (warmup, runs, loads) = counts(&guest());
    println!("guest: {}", guest());
    let cache = tempfile::tempdir().expect("temp dir");
    let config = RuntimeConfig { cache_dir: Some(cache.path().to_path_buf()), ..RuntimeConfig::default() };
    let runtime = Runtime::new(config.clone()).expect("runtime");

    println!("| measurement | samples | median µs | p99 µs |");
    println!("|---|---|---|---|");

    let one_thread = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
    let hello = Arc::new(one_thread.block_on(runtime.load_file(&hello_path())).expect("hello loads"));
    one_thread.block_on(per_job(&runtime, &hello, warmup));
    report("per-job, 1 thread", one_thread.block_on(per_job(&runtime, &hello, runs)));

    let two_threads =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio");
    let samples = two_threads.block_on(async {
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let (runtime, hello) = (runtime.clone(), hello.clone());
                tokio::spawn(async move {
                    per_job(&runtime, &hello, warmup).await;
                    per_job(&runtime, &hello, runs).await
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.expect("bench task"));
        }
        all
    });
    report("per-job, 2 threads", samples);

    let bytes = std::fs::read(hello_path()).expect("read hello");
    let uncached = Runtime::new(RuntimeConfig { cache_dir: None, ..config.clone() }).expect("runtime");
    let compile: Vec<_> = (0..loads)
        .map(|_| {
            let started = Instant::now();
            one_thread.block_on(uncached.load_bytes(&hello_path(), bytes.clone())).expect("compiles");
            started.elapsed()
        })
        .collect();
    report("load, compiling", compile);
    let cached: Vec<_> = (0..loads)
        .map(|_| {
            let started = Instant::now();
            one_thread.block_on(runtime.load_bytes(&hello_path(), bytes.clone())).expect("loads");
            started.elapsed()
        })
        .collect();
    report("load, from cache", cached);

    if guest() == "hello" {
        report("guest's 5 ms sleep: time past 5 ms", one_thread.block_on(oversleep(&runtime, 200)));
        // For comparison: what the tokio timer, which served guests' sleeps
        // before, does with the same 5 ms on this machine now.
        let tokio_sleeps = (0..200)
            .map(|_| {
                let started = Instant::now();
                one_thread.block_on(async { tokio::time::sleep(Duration::from_millis(5)).await });
                started.elapsed() - Duration::from_millis(5)
            })
            .collect();
        report("tokio's 5 ms sleep (the timer guests had before): time past 5 ms", tokio_sleeps);
    }
}

/// How late a guest's 5 ms `std::thread::sleep` wakes, by its own clock
/// (the `sleep` guest reports when its sleep began and ended).
async fn oversleep(runtime: &Runtime, runs: usize) -> Vec<Duration> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests/dist/sleep.wasm");
    let sleep = runtime.load_file(&path).await.expect("sleep loads");
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let report = runtime.run(&sleep, &context(), r#"{"ms":5}"#, StopSignal::new()).await;
        let jobhost::types::RunOutcome::Completed { output: Some(output) } = report.outcome else {
            panic!("sleep failed: {:?}", report.outcome);
        };
        let times: serde_json::Value = serde_json::from_str(output.get()).expect("sleep's output");
        let slept_us = times["ended_us"].as_u64().unwrap() - times["started_us"].as_u64().unwrap();
        samples.push(Duration::from_micros(slept_us.saturating_sub(5_000)));
    }
    samples
}
