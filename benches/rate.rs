//! What rate limits cost and how exact they are, through the store (no
//! guests: what is measured is the queue's own work):
//!
//! - cost: 20,000 jobs enqueued in batches of 1,000, then fetched 50 at a
//!   time and completed, of a plain type and of a rate-limited one (100
//!   keys, a limit no key reaches, so every job is planned, checked and
//!   counted but none waits), alternating, the better of two rounds each;
//! - fairness: tenant A enqueues 50,000 jobs (100 a second), then tenant B
//!   10; fetchers take 50 at a time: how long B's last job waits for its
//!   lease, and how many of A's are leased before it;
//! - accuracy: one key limited to 1,000 starts a second, a backlog of
//!   65,000, two fetchers of 200 and the due-job timer: starts per second
//!   over 60 s, by the database's clock, and the most in any one-second
//!   window.
//!
//! `cargo bench --bench rate`; `BENCH_BACKEND=postgres|sqlite` for one
//! backend. Databases as in `benches/queue.rs`.

mod common;

use std::time::{Duration, Instant};

use common::BenchDb;
use jobhost::background::maintenance::{Maintenance, MaintenanceConfig};
use jobhost::store::{EnqueueParams, FetchParams, Finish, FinishOutcome, Store};
use jobhost::types::JobConfig;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const COST_JOBS: usize = 20_000;
const BACKLOG: usize = 50_000;
const ACCURACY_SECS: i64 = 60;

/// A job type, rate limited to `limit` per `period_ms` per payload `key` when given.
fn config(name: &str, rate: Option<(u32, u64)>) -> JobConfig {
    let mut config = json!({
        "name": name, "queue": "default", "priority": 0, "max_attempts": 3,
        "backoff": {"base_ms": 1000, "cap_ms": 1000}, "timeout_ms": 60000, "memory_limit_bytes": 67108864,
    });
    if let Some((limit, period_ms)) = rate {
        config["rate_limit"] = json!({"limit": limit, "period_ms": period_ms, "key": "{key}"});
    }
    serde_json::from_value(config).unwrap()
}

async fn registered(sqlite: bool, config: JobConfig) -> BenchDb {
    let db = BenchDb::fresh(sqlite).await;
    db.store().job_types_register(&[(config, "v1".to_string())]).await.unwrap();
    db
}

fn params(job: &str, limit: i64) -> FetchParams {
    FetchParams { host_id: "bench".into(), queues: vec!["default".into()], job_types: vec![(job.into(), 60)], limit }
}

fn completed(store_job: &jobhost::store::FetchedJob) -> Finish {
    Finish {
        id: store_job.id,
        lease_token: store_job.lease_token,
        attempt: store_job.attempt,
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
        concurrency_key: store_job.concurrency_key.clone(),
        batch_id: store_job.batch_id,
        traceparent: None,
    }
}

async fn enqueue(store: &Store, job: &str, keys: impl Iterator<Item = String>) {
    let all: Vec<EnqueueParams> = keys.map(|key| EnqueueParams::new(job, json!({ "key": key }))).collect();
    for chunk in all.chunks(1_000) {
        store.job_enqueue(chunk).await.unwrap();
    }
}

/// Fetches `batch` at a time and completes them until `done` says so;
/// returns the leased jobs' payload keys, in lease order.
async fn drain(store: &Store, job: &str, batch: i64, mut done: impl FnMut(&[String]) -> bool) -> Vec<String> {
    let mut keys = Vec::new();
    while !done(&keys) {
        let leased = store.job_fetch(&params(job, batch)).await.unwrap();
        if leased.is_empty() {
            store.job_wait_available(Duration::from_millis(5)).await;
            continue;
        }
        keys.extend(leased.iter().map(|j| j.payload["key"].as_str().unwrap_or_default().to_string()));
        store.job_finish(leased.iter().map(completed).collect()).await.unwrap();
    }
    keys
}

/// (enqueue jobs/s, fetch-and-complete jobs/s) for COST_JOBS jobs.
async fn cost(sqlite: bool, limited: bool) -> (f64, f64) {
    let rate = limited.then_some((1_000_000, 1_000));
    let db = registered(sqlite, config("work", rate)).await;
    let store = db.store();
    let started = Instant::now();
    enqueue(&store, "work", (0..COST_JOBS).map(|i| format!("k{}", i % 100))).await;
    let enqueued = COST_JOBS as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    drain(&store, "work", 50, |keys| keys.len() >= COST_JOBS).await;
    (enqueued, COST_JOBS as f64 / started.elapsed().as_secs_f64())
}

/// (B's last lease after its enqueue, A's leases before it, A's enqueue jobs/s).
async fn fairness(sqlite: bool) -> (Duration, usize, f64) {
    let db = registered(sqlite, config("tenant", Some((100, 1_000)))).await;
    let store = db.store();
    let started = Instant::now();
    enqueue(&store, "tenant", (0..BACKLOG).map(|_| "A".to_string())).await;
    let a_rate = BACKLOG as f64 / started.elapsed().as_secs_f64();
    let b_enqueued = Instant::now();
    enqueue(&store, "tenant", (0..10).map(|_| "B".to_string())).await;
    let leased = drain(&store, "tenant", 50, |keys| keys.iter().filter(|k| *k == "B").count() == 10).await;
    let waited = b_enqueued.elapsed();
    let last_b = leased.iter().rposition(|k| k == "B").unwrap_or(0);
    (waited, leased[..last_b].iter().filter(|k| *k == "A").count(), a_rate)
}

/// Starts per second over ACCURACY_SECS of a key limited to 1,000 a
/// second: (mean, lowest second, highest second, most in any window).
async fn accuracy(sqlite: bool) -> (f64, i64, i64, usize) {
    let db = registered(sqlite, config("paced", Some((1_000, 1_000)))).await;
    let store = db.store();
    enqueue(&store, "paced", (0..(ACCURACY_SECS as usize + 5) * 1_000).map(|_| "k".to_string())).await;
    let stop = CancellationToken::new();
    let maintenance = Maintenance::new(store.clone(), MaintenanceConfig::default()).unwrap();
    tokio::spawn(maintenance.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(ACCURACY_SECS as u64 + 2);
    let fetchers: Vec<_> = (0..2)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { drain(&store, "paced", 200, |_| Instant::now() >= deadline).await })
        })
        .collect();
    for fetcher in fetchers {
        fetcher.await.unwrap();
    }
    stop.cancel();
    let mut starts: Vec<i64> = db
        .floats(
            "SELECT floor(extract(epoch FROM started_at) * 1000)::float8 FROM jobhost.archive",
            "SELECT CAST(started_at AS REAL) FROM archive",
        )
        .await
        .into_iter()
        .map(|ms| ms as i64)
        .collect();
    starts.sort_unstable();
    let first = starts[0];
    // Whole seconds from the first start; the last, partial one is left out.
    let seconds: Vec<i64> =
        (0..ACCURACY_SECS).map(|s| starts.iter().filter(|t| (**t - first) / 1_000 == s).count() as i64).collect();
    let most = (0..starts.len())
        .map(|i| starts[i..].iter().take_while(|t| **t < starts[i] + 1_000).count())
        .max()
        .unwrap_or(0);
    let mean = seconds.iter().sum::<i64>() as f64 / ACCURACY_SECS as f64;
    (mean, *seconds.iter().min().unwrap(), *seconds.iter().max().unwrap(), most)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("| backend | measurement | result |");
    println!("|---|---|---|");
    let only = std::env::var("BENCH_BACKEND").ok();
    for (sqlite, backend) in [(false, "PostgreSQL"), (true, "SQLite")] {
        if only.as_deref().is_some_and(|b| b != if sqlite { "sqlite" } else { "postgres" }) {
            continue;
        }
        // Alternating, so a drift of the shared machine falls on both.
        let (mut plain, mut limited) = ((0.0f64, 0.0f64), (0.0f64, 0.0f64));
        for _ in 0..2 {
            let p = cost(sqlite, false).await;
            let l = cost(sqlite, true).await;
            plain = (plain.0.max(p.0), plain.1.max(p.1));
            limited = (limited.0.max(l.0), limited.1.max(l.1));
        }
        println!(
            "| {backend} | enqueue, plain / rate-limited | {:.0} / {:.0} jobs/s ({:.2}) |",
            plain.0,
            limited.0,
            limited.0 / plain.0
        );
        println!(
            "| {backend} | fetch and complete, plain / rate-limited | {:.0} / {:.0} jobs/s ({:.2}) |",
            plain.1,
            limited.1,
            limited.1 / plain.1
        );
        let (waited, before, a_rate) = fairness(sqlite).await;
        println!("| {backend} | enqueue {BACKLOG} jobs of one key, planned 100 a second | {a_rate:.0} jobs/s |");
        println!(
            "| {backend} | tenant B's 10 jobs after A's {BACKLOG}: last one leased after | {} ms, behind {before} of A's |",
            waited.as_millis()
        );
        let (mean, low, high, most) = accuracy(sqlite).await;
        println!(
            "| {backend} | 1,000 starts/s limit over {ACCURACY_SECS} s | {mean:.1}/s mean, seconds {low} to {high}, most in any 1 s window {most} |"
        );
    }
}
