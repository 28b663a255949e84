//! What the fleet's history costs (docs/observability.md), through the
//! store (no guests: what is measured is the queue's own work):
//!
//! - the hot path: 20,000 jobs enqueued, then fetched 50 at a time and
//!   completed, with the history computed every second meanwhile (ten times
//!   as often as a host does) and without, alternating, the better of two
//!   rounds each;
//! - the computation at 1,000 jobs a second: 60,000 jobs of 10 types
//!   finished within the last minute, then one computation of the history
//!   (all of them read from the archive), the median of three;
//! - its size: a day of minutes of 20 types written with every figure
//!   filled (PostgreSQL's table and indexes), the same whatever the
//!   throughput.
//!
//! `cargo bench --bench history`; `BENCH_BACKEND=postgres|sqlite` for one
//! backend. Databases as in `benches/queue.rs`.

mod common;

use std::time::{Duration, Instant};

use common::BenchDb;
use jobhost::store::{EnqueueParams, FetchParams, Finish, FinishOutcome, Store};
use jobhost::types::JobConfig;
use serde_json::json;

const HOT_JOBS: usize = 20_000;
const MINUTE_JOBS: usize = 60_000;
const TYPES: usize = 10;
const WEEK_SECS: f64 = 7.0 * 86_400.0;

fn config(name: &str) -> JobConfig {
    serde_json::from_value(json!({
        "name": name, "queue": "default", "priority": 0, "max_attempts": 3,
        "backoff": {"base_ms": 1000, "cap_ms": 1000}, "timeout_ms": 60000, "memory_limit_bytes": 67108864,
    }))
    .unwrap()
}

fn names() -> Vec<String> {
    (0..TYPES).map(|i| format!("work{i}")).collect()
}

async fn registered(sqlite: bool) -> BenchDb {
    let db = BenchDb::fresh(sqlite).await;
    let types: Vec<(JobConfig, String)> = names().iter().map(|n| (config(n), "v1".to_string())).collect();
    db.store().job_types_register(&types).await.unwrap();
    db
}

fn completed(job: &jobhost::store::FetchedJob) -> Finish {
    Finish {
        id: job.id,
        lease_token: job.lease_token,
        attempt: job.attempt,
        outcome: FinishOutcome::Completed {
            output: None,
            children: Default::default(),
            batches: Default::default(),
            workflows: Default::default(),
            events: Default::default(),
            schedules: Default::default(),
        },
        log: json!({}),
        progress: None,
        concurrency_key: job.concurrency_key.clone(),
        batch_id: job.batch_id,
        traceparent: None,
    }
}

/// Enqueues `jobs` spread over the types, then fetches and completes them
/// all: (enqueue jobs/s, fetch-and-complete jobs/s).
async fn run_through(store: &Store, jobs: usize) -> (f64, f64) {
    let names = names();
    let all: Vec<EnqueueParams> =
        (0..jobs).map(|i| EnqueueParams::new(names[i % TYPES].clone(), json!({"i": i}))).collect();
    let started = Instant::now();
    for chunk in all.chunks(1_000) {
        store.job_enqueue(chunk).await.unwrap();
    }
    let enqueued = jobs as f64 / started.elapsed().as_secs_f64();
    let params = FetchParams {
        host_id: "bench".into(),
        queues: vec!["default".into()],
        job_types: names.iter().map(|n| (n.clone(), 60)).collect(),
        limit: 50,
    };
    let started = Instant::now();
    let mut done = 0;
    while done < jobs {
        let leased = store.job_fetch(&params).await.unwrap();
        done += leased.len();
        store.job_finish(leased.iter().map(completed).collect()).await.unwrap();
    }
    (enqueued, jobs as f64 / started.elapsed().as_secs_f64())
}

/// The hot path with the history computed every second meanwhile, or not.
async fn hot_path(sqlite: bool, with_history: bool) -> (f64, f64) {
    let db = registered(sqlite).await;
    let store = db.store();
    let stop = tokio_util::sync::CancellationToken::new();
    let computing = with_history.then(|| {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                store.history_roll(WEEK_SECS).await.unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    });
    let rates = run_through(&store, HOT_JOBS).await;
    stop.cancel();
    if let Some(task) = computing {
        task.await.unwrap();
    }
    rates
}

/// (median ms of one computation over a minute of 60,000 jobs, bytes per
/// stored row on PostgreSQL).
async fn computation(sqlite: bool) -> (f64, Option<f64>) {
    let db = registered(sqlite).await;
    let store = db.store();
    run_through(&store, MINUTE_JOBS).await;
    let mut times = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        store.history_roll(WEEK_SECS).await.unwrap();
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    (times[1], if sqlite { None } else { Some(day_of_rows(&db).await) })
}

/// Bytes a day of minutes takes for 20 types in one queue (table and
/// indexes, PostgreSQL): a day of rows with every figure filled is written,
/// so a page's fixed cost is spread as it is in use.
async fn day_of_rows(db: &BenchDb) -> f64 {
    db.float(
        "WITH filled AS (
             INSERT INTO jobhost.history (minute, queue, job, completed, failed, discarded, cancelled, runs,
                                          run_p50_ms, run_p95_ms, run_max_ms, waits, wait_p50_ms, wait_p95_ms,
                                          available, blocked, scheduled)
             SELECT date_trunc('minute', now()) - make_interval(days => 2, mins => m), 'default', 'type' || t,
                    60000, 12, 0, 1, 60013, 4.2, 9.8, 31.5, 59000, 2.1, 7.5, 120, 3, 40
             FROM generate_series(0, 1439) AS m, generate_series(1, 20) AS t
             RETURNING 1)
         SELECT count(*)::float8 FROM filled",
        "",
    )
    .await;
    db.float("SELECT pg_total_relation_size('jobhost.history')::float8", "").await
}

#[tokio::main]
async fn main() {
    println!("| backend | measurement | result |");
    println!("|---|---|---|");
    let only = std::env::var("BENCH_BACKEND").ok();
    for (sqlite, backend) in [(false, "PostgreSQL"), (true, "SQLite")] {
        if only.as_deref().is_some_and(|b| b != if sqlite { "sqlite" } else { "postgres" }) {
            continue;
        }
        let (mut without, mut with) = ((0.0f64, 0.0f64), (0.0f64, 0.0f64));
        for _ in 0..2 {
            let w = hot_path(sqlite, false).await;
            let h = hot_path(sqlite, true).await;
            without = (without.0.max(w.0), without.1.max(w.1));
            with = (with.0.max(h.0), with.1.max(h.1));
        }
        println!(
            "| {backend} | enqueue, without / with the history computed every 1 s | {:.0} / {:.0} jobs/s ({:.2}) |",
            without.0,
            with.0,
            with.0 / without.0
        );
        println!(
            "| {backend} | fetch and complete, without / with | {:.0} / {:.0} jobs/s ({:.2}) |",
            without.1,
            with.1,
            with.1 / without.1
        );
        let (ms, bytes) = computation(sqlite).await;
        println!(
            "| {backend} | one computation over {MINUTE_JOBS} jobs of {TYPES} types finished within a minute | {ms:.0} ms |"
        );
        if let Some(bytes) = bytes {
            let (day, row) = (bytes / 1_048_576.0, bytes / (20.0 * 1440.0));
            println!(
                "| {backend} | a day of 20 types' minutes (table and indexes) | {day:.1} MiB, {row:.0} bytes a row |"
            );
        }
    }
}
