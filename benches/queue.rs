//! Queue throughput and latency on both backends, PostgreSQL and the embedded
//! SQLite file, side by side, with `jobhost run` processes as the workers
//! (the same workloads as the peer benchmarks):
//!
//! - A: bulk-enqueue 20,000 `hello` jobs (1,000 per call); then 20,000 more
//!   processed by one host at concurrency 10, and by two hosts, with the
//!   hosts' CPU time per job (`/proc/PID/stat`; on SQLite it includes the
//!   embedded database's work, on PostgreSQL not the server's).
//! - B: an idle host; 500 single enqueues 10 ms apart; enqueue→start
//!   latency, by the database's timestamps and by the clocks themselves:
//!   from just before the enqueue call to the guest's first instruction
//!   (the `sleep` guest reports it, in microseconds), so SQLite's
//!   millisecond timestamps do not round it.
//!
//! `cargo bench --bench queue` (after `guests/build.sh`). The server comes
//! from `JOBHOST_BENCH_DATABASE_URL` (default: local); the benchmark drops
//! and recreates database `jobhost_bench`. SQLite files go in a fresh
//! directory under `JOBHOST_BENCH_SQLITE_DIR` (default `target`). Times are the database's own
//! timestamps (enqueued_at, started_at, finished_at), so the client's
//! scheduling does not count.

mod common;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use common::{BenchDb, cpu_seconds, percentile, start_host, stop};
use jobhost::store::EnqueueParams;

const A_JOBS: usize = 20_000;
const A_CHUNK: usize = 1_000;
const B_JOBS: usize = 500;
const B_SPACING: Duration = Duration::from_millis(10);

fn hello_jobs(n: usize) -> Vec<EnqueueParams> {
    (0..n).map(|i| EnqueueParams::new("hello", serde_json::json!({ "name": i.to_string() }))).collect()
}

const HOSTS: (&str, &str) = ("SELECT count(*)::float8 FROM jobhost.hosts", "SELECT CAST(count(*) AS REAL) FROM hosts");
const ARCHIVED: (&str, &str) =
    ("SELECT count(*)::float8 FROM jobhost.archive", "SELECT CAST(count(*) AS REAL) FROM archive");
const JOB_TYPES: (&str, &str) =
    ("SELECT count(*)::float8 FROM jobhost.job_types", "SELECT CAST(count(*) AS REAL) FROM job_types");
const SPAN_SECS: (&str, &str) = (
    "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM jobhost.archive",
    "SELECT (max(finished_at) - min(started_at)) / 1000.0 FROM archive",
);
const LATENCIES_MS: (&str, &str) = (
    "SELECT (extract(epoch FROM started_at - enqueued_at) * 1000)::float8 FROM jobhost.archive ORDER BY 1",
    "SELECT CAST(started_at - enqueued_at AS REAL) FROM archive ORDER BY 1",
);

/// Starts `hosts` hosts, enqueues A_JOBS in one statement, and returns jobs/s
/// from the first start to the last finish, and the hosts' CPU time per job
/// in µs (user and system, `/proc/PID/stat`).
async fn process(sqlite: bool, hosts: usize, components: &Path, cache: &Path) -> (f64, f64) {
    let db = BenchDb::fresh(sqlite).await;
    let children: Vec<Child> = (0..hosts).map(|_| start_host(db.url(), components, cache)).collect();
    db.wait_for(HOSTS.0, HOSTS.1, hosts as f64).await;
    let cpu = || children.iter().map(|c| cpu_seconds(c.id())).sum::<f64>();
    let cpu_before = cpu();
    db.store().job_enqueue(&hello_jobs(A_JOBS)).await.unwrap();
    db.wait_for(ARCHIVED.0, ARCHIVED.1, A_JOBS as f64).await;
    let cpu_us = (cpu() - cpu_before) * 1e6 / A_JOBS as f64;
    let secs = db.float(SPAN_SECS.0, SPAN_SECS.1).await;
    children.into_iter().for_each(stop);
    (A_JOBS as f64 / secs, cpu_us)
}

const GUEST_STARTS_US: (&str, &str) = (
    "SELECT (output->>'started_us')::float8 FROM jobhost.archive ORDER BY id",
    "SELECT CAST(json_extract(output, '$.started_us') AS REAL) FROM archive ORDER BY id",
);

fn micros_since_epoch() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as f64
}

/// Every workload on one backend: (bulk enqueue/s, one host's jobs/s and
/// CPU µs per job, two hosts', sorted latencies in ms by the database, and
/// by the clocks).
async fn workloads(sqlite: bool, components: &Path, cache: &Path) -> (f64, (f64, f64), (f64, f64), Vec<f64>, Vec<f64>) {
    // A: bulk enqueue, no host running.
    let db = BenchDb::fresh(sqlite).await;
    let mut probe = start_host(db.url(), components, cache);
    db.wait_for(JOB_TYPES.0, JOB_TYPES.1, 2.0).await;
    // SAFETY: as in `stop`; the probe only registered the job type.
    unsafe { libc::kill(probe.id() as libc::pid_t, libc::SIGTERM) };
    let _ = probe.wait();
    let jobs = hello_jobs(A_JOBS);
    let started = Instant::now();
    for chunk in jobs.chunks(A_CHUNK) {
        db.store().job_enqueue(chunk).await.unwrap();
    }
    let enqueue_rate = A_JOBS as f64 / started.elapsed().as_secs_f64();

    let one_host = process(sqlite, 1, components, cache).await;
    let two_hosts = process(sqlite, 2, components, cache).await;

    // B: latency on an idle host.
    let db = BenchDb::fresh(sqlite).await;
    let host = start_host(db.url(), components, cache);
    db.wait_for(HOSTS.0, HOSTS.1, 1.0).await;
    db.wait_for(JOB_TYPES.0, JOB_TYPES.1, 2.0).await;
    let mut sent_us = Vec::with_capacity(B_JOBS);
    for _ in 0..B_JOBS {
        let job = EnqueueParams::new("sleep", serde_json::json!({ "ms": 0 }));
        sent_us.push(micros_since_epoch());
        db.store().job_enqueue(&[job]).await.unwrap();
        tokio::time::sleep(B_SPACING).await;
    }
    db.wait_for(ARCHIVED.0, ARCHIVED.1, B_JOBS as f64).await;
    let mut latencies = db.floats(LATENCIES_MS.0, LATENCIES_MS.1).await;
    latencies.sort_by(f64::total_cmp);
    let started_us = db.floats(GUEST_STARTS_US.0, GUEST_STARTS_US.1).await;
    let mut by_clock: Vec<f64> = started_us.iter().zip(&sent_us).map(|(start, sent)| (start - sent) / 1000.0).collect();
    by_clock.sort_by(f64::total_cmp);
    stop(host);
    (enqueue_rate, one_host, two_hosts, latencies, by_clock)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests/dist");
    assert!(guests.join("hello.wasm").exists(), "run guests/build.sh first");
    let components = tempfile::tempdir().unwrap();
    for guest in ["hello.wasm", "sleep.wasm"] {
        std::fs::copy(guests.join(guest), components.path().join(guest)).unwrap();
    }
    let cache = tempfile::tempdir().unwrap();

    let pg = workloads(false, components.path(), cache.path()).await;
    let lite = workloads(true, components.path(), cache.path()).await;
    let latency = |l: &[f64]| {
        format!(
            "p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
            percentile(l, 0.5),
            percentile(l, 0.95),
            percentile(l, 0.99)
        )
    };

    println!("| measurement | PostgreSQL | SQLite (embedded) |");
    println!("|---|---|---|");
    println!("| A: bulk enqueue ({A_JOBS} jobs, {A_CHUNK} per call) | {:.0} jobs/s | {:.0} jobs/s |", pg.0, lite.0);
    let rate = |(jobs_per_sec, cpu_us): (f64, f64)| format!("{jobs_per_sec:.0} jobs/s, host CPU {cpu_us:.0} µs a job");
    println!("| A: process {A_JOBS} `hello`, one host, concurrency 10 | {} | {} |", rate(pg.1), rate(lite.1));
    println!("| A: process {A_JOBS} `hello`, two hosts, concurrency 10 each | {} | {} |", rate(pg.2), rate(lite.2));
    println!("| B: enqueue→start latency, idle host ({B_JOBS} jobs) | {} | {} |", latency(&pg.3), latency(&lite.3));
    println!(
        "| B: enqueue call → guest's first instruction, by the clocks | {} | {} |",
        latency(&pg.4),
        latency(&lite.4)
    );
}
