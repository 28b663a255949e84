//! Queue throughput and latency against a real PostgreSQL, with `jobhost run`
//! processes as the workers (the same workloads as the peer benchmarks):
//!
//! - A: bulk-enqueue 20,000 `hello` jobs (1,000 per call); then 20,000 more
//!   processed by one host at concurrency 10, and by two hosts.
//! - B: an idle host; 500 single enqueues 10 ms apart; enqueue→start latency.
//!
//! `cargo bench --bench queue` (after `guests/build.sh`). The server comes
//! from `JOBHOST_BENCH_DATABASE_URL` (default: local); the benchmark drops
//! and recreates database `jobhost_bench`. Times are the database's own
//! timestamps (enqueued_at, started_at, finished_at), so the client's
//! scheduling does not count.

mod common;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use common::{fresh_db, percentile, scalar, start_host, stop, wait_until};
use jobhost::store::{EnqueueParams, Store};

const A_JOBS: usize = 20_000;
const A_CHUNK: usize = 1_000;
const B_JOBS: usize = 500;
const B_SPACING: Duration = Duration::from_millis(10);

fn hello_jobs(n: usize) -> Vec<EnqueueParams> {
    (0..n).map(|i| EnqueueParams::new("hello", serde_json::json!({ "name": i.to_string() }))).collect()
}

/// Starts `hosts` hosts, enqueues A_JOBS in one statement, and returns jobs/s
/// from the first start to the last finish.
async fn process(hosts: usize, components: &Path, cache: &Path) -> f64 {
    let (store, url) = fresh_db().await;
    let pool = store.pool().clone();
    let children: Vec<Child> = (0..hosts).map(|_| start_host(&url, components, cache)).collect();
    let ready: &'static str = if hosts == 1 {
        "SELECT (count(*) = 1)::int::float8 FROM jobhost.hosts"
    } else {
        "SELECT (count(*) = 2)::int::float8 FROM jobhost.hosts"
    };
    wait_until(&pool, ready).await;
    store.job_enqueue(&hello_jobs(A_JOBS)).await.unwrap();
    wait_until(&pool, "SELECT (count(*) = 20000)::int::float8 FROM jobhost.archive").await;
    let secs =
        scalar(&pool, "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM jobhost.archive")
            .await;
    children.into_iter().for_each(stop);
    A_JOBS as f64 / secs
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests/dist");
    assert!(guests.join("hello.wasm").exists(), "run guests/build.sh first");
    let components = tempfile::tempdir().unwrap();
    std::fs::copy(guests.join("hello.wasm"), components.path().join("hello.wasm")).unwrap();
    let cache = tempfile::tempdir().unwrap();

    // A: bulk enqueue, no host running.
    let (store, url) = fresh_db().await;
    let mut probe = start_host(&url, components.path(), cache.path());
    wait_until(store.pool(), "SELECT count(*)::float8 FROM jobhost.job_types").await;
    // SAFETY: as in `stop`; the probe only registered the job type.
    unsafe { libc::kill(probe.id() as libc::pid_t, libc::SIGTERM) };
    let _ = probe.wait();
    let jobs = hello_jobs(A_JOBS);
    let started = Instant::now();
    for chunk in jobs.chunks(A_CHUNK) {
        store.job_enqueue(chunk).await.unwrap();
    }
    let enqueue_rate = A_JOBS as f64 / started.elapsed().as_secs_f64();

    let one_host = process(1, components.path(), cache.path()).await;
    let two_hosts = process(2, components.path(), cache.path()).await;

    // B: latency on an idle host.
    let (store, url) = fresh_db().await;
    let host = start_host(&url, components.path(), cache.path());
    wait_until(store.pool(), "SELECT count(*)::float8 FROM jobhost.hosts").await;
    for _ in 0..B_JOBS {
        store.job_enqueue(&hello_jobs(1)).await.unwrap();
        tokio::time::sleep(B_SPACING).await;
    }
    wait_until(store.pool(), "SELECT (count(*) = 500)::int::float8 FROM jobhost.archive").await;
    let mut latencies: Vec<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM started_at - enqueued_at) * 1000)::float8 FROM jobhost.archive ORDER BY 1",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    latencies.sort_by(f64::total_cmp);
    stop(host);

    println!("| measurement | result |");
    println!("|---|---|");
    println!("| A: bulk enqueue ({A_JOBS} jobs, {A_CHUNK} per call) | {enqueue_rate:.0} jobs/s |");
    println!("| A: process {A_JOBS} `hello`, one host, concurrency 10 | {one_host:.0} jobs/s |");
    println!("| A: process {A_JOBS} `hello`, two hosts, concurrency 10 each | {two_hosts:.0} jobs/s |");
    println!(
        "| B: enqueue→start latency, idle host ({B_JOBS} jobs) | p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms |",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.95),
        percentile(&latencies, 0.99)
    );
}
