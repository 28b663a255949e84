//! What uniqueness costs an enqueue, on both backends: the same job type
//! registered with and without `unique` (until-executed, one key per job),
//! enqueued in bulk (1,000 per call) and one at a time, and duplicates of
//! keys already held (each answered with the holder's id, storing nothing).
//! No host runs: this is the enqueue path alone.
//!
//! `cargo bench --bench unique`. Databases as in `benches/queue.rs`.

mod common;

use std::time::Instant;

use common::BenchDb;
use jobhost::store::EnqueueParams;
use jobhost::template::KeyTemplate;
use jobhost::types::{Backoff, JobConfig, OnDuplicate, UniqueConfig, UniqueStrategy};

const BULK_JOBS: usize = 20_000;
const BULK_CHUNK: usize = 1_000;
const SINGLE_JOBS: usize = 1_000;

fn config(name: &str, unique: bool) -> JobConfig {
    JobConfig {
        name: name.into(),
        queue: "default".into(),
        priority: 0,
        max_attempts: 3,
        backoff: Backoff { base_ms: 1_000, cap_ms: 60_000 },
        timeout_ms: 10_000,
        memory_limit_bytes: 64 << 20,
        concurrency: None,
        unique: unique.then(|| UniqueConfig {
            key: KeyTemplate::parse("{i}").unwrap(),
            strategy: UniqueStrategy::UntilExecuted,
            on_duplicate: OnDuplicate::Skip,
        }),
        schedule: None,
        outbound: Vec::new(),
        rate_limit: None,
        on_events: Vec::new(),
    }
}

fn jobs(name: &str, from: usize, n: usize) -> Vec<EnqueueParams> {
    (from..from + n).map(|i| EnqueueParams::new(name, serde_json::json!({ "i": i }))).collect()
}

/// (bulk jobs/s, single jobs/s, bulk duplicates/s) for one job type.
async fn rates(sqlite: bool, unique: bool) -> (f64, f64, f64) {
    let db = BenchDb::fresh(sqlite).await;
    let store = db.store();
    store.job_types_register(&[(config("item", unique), "v1".into())]).await.unwrap();
    let started = Instant::now();
    for chunk in jobs("item", 0, BULK_JOBS).chunks(BULK_CHUNK) {
        store.job_enqueue(chunk).await.unwrap();
    }
    let bulk = BULK_JOBS as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for job in jobs("item", BULK_JOBS, SINGLE_JOBS) {
        store.job_enqueue(&[job]).await.unwrap();
    }
    let single = SINGLE_JOBS as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for chunk in jobs("item", 0, BULK_JOBS).chunks(BULK_CHUNK) {
        store.job_enqueue(chunk).await.unwrap();
    }
    let again = BULK_JOBS as f64 / started.elapsed().as_secs_f64();
    (bulk, single, again)
}

#[tokio::main]
async fn main() {
    println!("| backend | workload | without `unique` | with `unique` | ratio |");
    println!("|---|---|---|---|---|");
    for (sqlite, backend) in [(false, "PostgreSQL"), (true, "SQLite")] {
        let plain = rates(sqlite, false).await;
        let unique = rates(sqlite, true).await;
        let rows = [
            (format!("bulk enqueue ({BULK_JOBS} jobs, {BULK_CHUNK} per call)"), plain.0, unique.0),
            (format!("single enqueues ({SINGLE_JOBS})"), plain.1, unique.1),
            ("the bulk again: all duplicates with `unique`".to_string(), plain.2, unique.2),
        ];
        for (workload, without, with) in rows {
            println!("| {backend} | {workload} | {without:.0} jobs/s | {with:.0} jobs/s | {:.2} |", with / without);
        }
    }
}
