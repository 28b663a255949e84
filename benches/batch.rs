//! What batches cost, on both backends:
//!
//! - creation: 10,000 `hello` jobs stored as one batch (one call, one
//!   transaction) beside the same 10,000 enqueued plainly in one call;
//! - completion: 20,000 `hello` jobs processed by one `jobhost run` at
//!   concurrency 10, plainly and as members of one batch (every completion
//!   counts into the batch's row; the last enqueues its callback), by the
//!   database's own timestamps. The difference per job is what a member's
//!   completion costs beyond a plain one.
//!
//! `cargo bench --bench batch` (after `guests/build.sh`). Databases as in
//! `benches/queue.rs`.

mod common;

use std::path::Path;
use std::time::Instant;

use common::{BenchDb, start_host, stop};
use jobhost::store::{Callbacks, EnqueueParams, NewBatch};

const CREATE_JOBS: usize = 10_000;
const PROCESS_JOBS: usize = 20_000;

fn hello_jobs(n: usize) -> Vec<EnqueueParams> {
    (0..n).map(|i| EnqueueParams::new("hello", serde_json::json!({ "name": i.to_string() }))).collect()
}

fn batch() -> NewBatch {
    NewBatch {
        label: Some("bench".into()),
        callbacks: Callbacks { on_finish: Some("hello".into()), ..Default::default() },
        ..Default::default()
    }
}

const HOSTS: (&str, &str) = ("SELECT count(*)::float8 FROM jobhost.hosts", "SELECT CAST(count(*) AS REAL) FROM hosts");
const JOB_TYPES: (&str, &str) =
    ("SELECT count(*)::float8 FROM jobhost.job_types", "SELECT CAST(count(*) AS REAL) FROM job_types");
const ARCHIVED: (&str, &str) =
    ("SELECT count(*)::float8 FROM jobhost.archive", "SELECT CAST(count(*) AS REAL) FROM archive");

/// A fresh database with `hello` registered by a host that then stops.
async fn registered(sqlite: bool, components: &Path, cache: &Path) -> BenchDb {
    let db = BenchDb::fresh(sqlite).await;
    let probe = start_host(db.url(), components, cache);
    db.wait_for(JOB_TYPES.0, JOB_TYPES.1, 1.0).await;
    stop(probe);
    db
}

/// (plain enqueue jobs/s, batch creation jobs/s) of CREATE_JOBS jobs in one call.
async fn creation(sqlite: bool, components: &Path, cache: &Path) -> (f64, f64) {
    let db = registered(sqlite, components, cache).await;
    let jobs = hello_jobs(CREATE_JOBS);
    let started = Instant::now();
    db.store().job_enqueue(&jobs).await.unwrap();
    let plain = CREATE_JOBS as f64 / started.elapsed().as_secs_f64();
    let db = registered(sqlite, components, cache).await;
    let started = Instant::now();
    db.store().batch_create(&batch(), &jobs).await.unwrap();
    let batched = CREATE_JOBS as f64 / started.elapsed().as_secs_f64();
    (plain, batched)
}

/// Jobs/s processing PROCESS_JOBS `hello` jobs on one host, as one batch or not.
async fn processing(sqlite: bool, as_batch: bool, components: &Path, cache: &Path) -> f64 {
    let db = registered(sqlite, components, cache).await;
    let jobs = hello_jobs(PROCESS_JOBS);
    if as_batch {
        db.store().batch_create(&batch(), &jobs).await.unwrap();
    } else {
        db.store().job_enqueue(&jobs).await.unwrap();
    }
    let host = start_host(db.url(), components, cache);
    db.wait_for(HOSTS.0, HOSTS.1, 1.0).await;
    let done = PROCESS_JOBS + usize::from(as_batch);
    db.wait_for(ARCHIVED.0, ARCHIVED.1, done as f64).await;
    stop(host);
    // The members alone: the callback runs after the last of them.
    let span = db
        .float(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM jobhost.archive
             WHERE payload ? 'name' AND NOT payload ? '_batch'",
            "SELECT (max(finished_at) - min(started_at)) / 1000.0 FROM archive
             WHERE json_extract(payload, '$._batch') IS NULL",
        )
        .await;
    PROCESS_JOBS as f64 / span
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests/dist");
    assert!(guests.join("hello.wasm").exists(), "run guests/build.sh first");
    let components = tempfile::tempdir().unwrap();
    std::fs::copy(guests.join("hello.wasm"), components.path().join("hello.wasm")).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let (components, cache) = (components.path(), cache.path());

    println!("| backend | measurement | plain | as one batch | ratio |");
    println!("|---|---|---|---|---|");
    for (sqlite, backend) in [(false, "PostgreSQL"), (true, "SQLite")] {
        let (plain, batched) = creation(sqlite, components, cache).await;
        println!(
            "| {backend} | store {CREATE_JOBS} jobs in one call | {plain:.0} jobs/s | {batched:.0} jobs/s | {:.2} |",
            batched / plain
        );
        let plain = processing(sqlite, false, components, cache).await;
        let batched = processing(sqlite, true, components, cache).await;
        let extra_us = (1.0 / batched - 1.0 / plain) * 1e6;
        println!(
            "| {backend} | process {PROCESS_JOBS} `hello`, one host, concurrency 10 | {plain:.0} jobs/s | \
             {batched:.0} jobs/s | {:.2} ({extra_us:+.1} µs a completion) |",
            batched / plain
        );
    }
}
