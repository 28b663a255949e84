//! How deep a host should lease ahead of its free run slots, on PostgreSQL:
//!
//! - short jobs: 20,000 `hello` jobs, one host at concurrency 10, with
//!   `--prefetch` 10, 20 and 40 and with no flag (the default);
//! - a mix: two hosts at concurrency 10, 2,960 `sleep` jobs of 0 ms with 40
//!   of 1 s among them, shallow (`--prefetch 10`) and at the default. A host
//!   that hoarded long jobs would leave the other idle while its own leased
//!   jobs wait: the long jobs' split between the hosts, their longest wait
//!   from enqueue to start, and the whole span show whether it did. With 20
//!   run slots, 40 one-second jobs need 2 s at best.
//!
//! `cargo bench --bench prefetch` (after `guests/build.sh`). Drops and
//! recreates database `jobhost_bench`; times are the database's own.

mod common;

use std::path::Path;

use common::{BenchDb, start_host_with, stop};
use jobhost::store::EnqueueParams;

const SHORT_JOBS: usize = 20_000;
const MIX_JOBS: usize = 3_000;
const LONG_EVERY: usize = 75;
const LONG_MS: u64 = 1_000;

const HOSTS: &str = "SELECT count(*)::float8 FROM jobhost.hosts";
const ARCHIVED: &str = "SELECT count(*)::float8 FROM jobhost.archive";
const SPAN_SECS: &str = "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM jobhost.archive";
const LONG_WAIT_MAX_SECS: &str = "SELECT max(extract(epoch FROM started_at - enqueued_at))::float8
    FROM jobhost.archive WHERE (payload->>'ms')::int > 0";
const LONG_PER_HOST: &str = "SELECT count(*)::float8 FROM jobhost.archive
    WHERE (payload->>'ms')::int > 0 GROUP BY host_id ORDER BY 1 DESC";

/// Starts `hosts` hosts with `flags`, enqueues `jobs` in one call, and waits
/// until all are archived.
async fn run(jobs: &[EnqueueParams], hosts: usize, flags: &[&str], components: &Path, cache: &Path) -> BenchDb {
    let db = BenchDb::fresh(false).await;
    let children: Vec<_> = (0..hosts).map(|_| start_host_with(db.url(), components, cache, flags)).collect();
    db.wait_for(HOSTS, HOSTS, hosts as f64).await;
    db.store().job_enqueue(jobs).await.unwrap();
    db.wait_for(ARCHIVED, ARCHIVED, jobs.len() as f64).await;
    children.into_iter().for_each(stop);
    db
}

fn sleep_job(ms: u64) -> EnqueueParams {
    EnqueueParams::new("sleep", serde_json::json!({ "ms": ms }))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests/dist");
    assert!(guests.join("sleep.wasm").exists(), "run guests/build.sh first");
    let components = tempfile::tempdir().unwrap();
    for guest in ["hello.wasm", "sleep.wasm"] {
        std::fs::copy(guests.join(guest), components.path().join(guest)).unwrap();
    }
    let cache = tempfile::tempdir().unwrap();
    let (components, cache) = (components.path(), cache.path());

    let short: Vec<_> =
        (0..SHORT_JOBS).map(|i| EnqueueParams::new("hello", serde_json::json!({ "name": i.to_string() }))).collect();
    println!("| `hello`, one host, concurrency 10 | jobs/s |");
    println!("|---|---|");
    for (label, flags) in [
        ("--prefetch 10", &["--prefetch", "10"][..]),
        ("--prefetch 20", &["--prefetch", "20"][..]),
        ("--prefetch 40", &["--prefetch", "40"][..]),
        ("default", &[][..]),
    ] {
        let db = run(&short, 1, flags, components, cache).await;
        println!("| {label} | {:.0} |", SHORT_JOBS as f64 / db.float(SPAN_SECS, SPAN_SECS).await);
    }

    let mix: Vec<_> = (0..MIX_JOBS).map(|i| sleep_job(if i % LONG_EVERY == 0 { LONG_MS } else { 0 })).collect();
    println!();
    println!("| mix, two hosts | span | long jobs per host | longest wait of a long job |");
    println!("|---|---|---|---|");
    for (label, flags) in [("--prefetch 10", &["--prefetch", "10"][..]), ("default", &[][..])] {
        let db = run(&mix, 2, flags, components, cache).await;
        let split: Vec<String> = db.floats(LONG_PER_HOST, LONG_PER_HOST).await.iter().map(|n| n.to_string()).collect();
        println!(
            "| {label} | {:.2} s | {} | {:.2} s |",
            db.float(SPAN_SECS, SPAN_SECS).await,
            split.join(" / "),
            db.float(LONG_WAIT_MAX_SECS, LONG_WAIT_MAX_SECS).await
        );
    }
}
