//! What events and durable waits cost (docs/events.md), on both backends:
//!
//! - a call each, one after another from one client, medians of
//!   `EVENT_ROUNDS` (default 3) interleaved rounds of 1,000: a plain
//!   enqueue of one `hello` job; a wait created (a one-step workflow whose
//!   step waits for its own event, armed at once); an event delivered
//!   (sent, ending one wait and releasing its step as a job);
//! - what 100,000 waiting steps cost those who do not wait: a maintenance
//!   pass over the waits (`waits_due`, nothing due), a fetch of an empty
//!   queue and an event to a key nobody waits for, each with none held and
//!   with 100,000 held (medians of 200 calls);
//! - event to start: from an event sent to its step's start on an idle
//!   host, against a plain enqueue to its start, 200 of each, by the
//!   database's clock.
//!
//! `cargo bench --bench events` (after `guests/build.sh`;
//! `BENCH_BACKEND=postgres` or `sqlite` for one). Databases as in
//! `benches/queue.rs`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{BenchDb, percentile, start_host, stop};
use jobhost::store::wait::Wait;
use jobhost::store::{EnqueueParams, FetchParams, NewStep, NewWorkflow, Store};
use serde_json::json;

const CALLS: usize = 1_000;
const HELD: usize = 100_000;
const SAMPLES: usize = 200;
const LATENCIES: usize = 200;

/// Workflows of `steps` steps, each waiting for its own key `PREFIX.N`.
fn waiting(prefix: &str, first: usize, steps: usize) -> NewWorkflow {
    let steps = (first..first + steps)
        .map(|n| NewStep::new(format!("s{n}"), "hello", json!({"name": n})).wait(Wait::event(format!("{prefix}.{n}"))))
        .collect();
    NewWorkflow { label: None, steps }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// µs a call of each kind, one after another.
async fn per_call(store: &Store, round: usize) -> (f64, f64, f64) {
    let started = Instant::now();
    for i in 0..CALLS {
        store.job_enqueue(&[EnqueueParams::new("hello", json!({"name": i}))]).await.unwrap();
    }
    let enqueue = started.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
    let prefix = format!("r{round}");
    let started = Instant::now();
    for i in 0..CALLS {
        store.workflow_create(&waiting(&prefix, i, 1)).await.unwrap();
    }
    let create = started.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
    let started = Instant::now();
    for i in 0..CALLS {
        let sent = store.event_send(&format!("{prefix}.{i}"), &json!({"n": i}), None, "bench").await.unwrap();
        assert_eq!(sent.released, 1);
    }
    let deliver = started.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
    (enqueue, create, deliver)
}

/// Median µs of `call`, `SAMPLES` times.
async fn timed<F, Fut>(mut call: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        call().await;
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    median(times)
}

/// µs of a maintenance pass over the waits, an empty fetch and an event to
/// nobody's key, as they stand.
async fn bystanders(store: &Store) -> (f64, f64, f64) {
    let pass = timed(|| async {
        store.waits_due(None, 1000).await.unwrap();
    })
    .await;
    let params = FetchParams {
        host_id: "bench-host".into(),
        queues: vec!["default".into()],
        job_types: vec![("hello".into(), 30)],
        limit: 10,
    };
    let fetch = timed(|| async {
        assert!(store.job_fetch(&params).await.unwrap().is_empty());
    })
    .await;
    let send = timed(|| async {
        store.event_send("nobody.waits", &json!({}), None, "bench").await.unwrap();
    })
    .await;
    (pass, fetch, send)
}

/// Event → start and enqueue → start, ms by the database's clock, p50 and p95.
async fn to_start(db: &BenchDb, components: &Path, cache: &Path) -> ((f64, f64), (f64, f64)) {
    let store = db.store();
    let host = start_host(db.url(), components, cache);
    db.wait_for(common::HOSTS.0, common::HOSTS.1, 1.0).await;
    for i in 0..LATENCIES {
        store.workflow_create(&waiting("late", i, 1)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..LATENCIES {
        store.event_send(&format!("late.{i}"), &json!({"i": i}), None, "bench").await.unwrap();
        db.wait_for(
            "SELECT count(*)::float8 FROM jobhost.archive WHERE payload ? '_event'",
            "SELECT CAST(count(*) AS REAL) FROM archive WHERE json_extract(payload, '$._event') IS NOT NULL",
            (i + 1) as f64,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let plains = db.plain_to_start(LATENCIES).await;
    stop(host);
    let mut events = db
        .floats(
            "SELECT (extract(epoch FROM a.started_at - e.sent_at) * 1000)::float8
             FROM jobhost.events e JOIN jobhost.workflow_waits w ON w.event_id = e.id
             JOIN jobhost.workflow_steps s ON s.id = w.step_id JOIN jobhost.archive a ON a.id = s.job_id",
            "SELECT CAST(a.started_at - e.sent_at AS REAL)
             FROM events e JOIN workflow_waits w ON w.event_id = e.id
             JOIN workflow_steps s ON s.id = w.step_id JOIN archive a ON a.id = s.job_id",
        )
        .await;
    events.sort_by(f64::total_cmp);
    let p = |v: &[f64]| (percentile(v, 0.5), percentile(v, 0.95));
    (p(&events), p(&plains))
}

#[tokio::main]
async fn main() {
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests/dist");
    assert!(guests.join("hello.wasm").exists(), "run guests/build.sh first");
    let components = tempfile::tempdir().unwrap();
    std::fs::copy(guests.join("hello.wasm"), components.path().join("hello.wasm")).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let (components, cache) = (components.path(), cache.path());
    let only = std::env::var("BENCH_BACKEND").ok();
    let rounds: usize = std::env::var("EVENT_ROUNDS").map_or(3, |r| r.parse().expect("EVENT_ROUNDS: a number"));

    println!("| backend | measurement | result |");
    println!("|---|---|---|");
    for (sqlite, backend) in [(false, "PostgreSQL"), (true, "SQLite")] {
        if only.as_deref().is_some_and(|b| b != if sqlite { "sqlite" } else { "postgres" }) {
            continue;
        }
        let db = BenchDb::registered(sqlite, components, cache).await;
        let store = db.store();
        let (mut enqueue, mut create, mut deliver) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let (e, c, d) = per_call(&store, round).await;
            enqueue.push(e);
            create.push(c);
            deliver.push(d);
        }
        let (e, c, d) = (median(enqueue), median(create), median(deliver));
        println!(
            "| {backend} | a call each, one client, medians of {rounds} x {CALLS}: plain enqueue / wait created / \
             event delivered (its step released) | {e:.0} / {c:.0} / {d:.0} µs ({:.2}x / {:.2}x a plain enqueue) |",
            c / e,
            d / e
        );

        let db = BenchDb::registered(sqlite, components, cache).await;
        let store = db.store();
        let (pass0, fetch0, send0) = bystanders(&store).await;
        for first in (0..HELD).step_by(10_000) {
            store.workflow_create(&waiting("held", first, 10_000)).await.unwrap();
        }
        let (pass, fetch, send) = bystanders(&store).await;
        println!(
            "| {backend} | none / {HELD} waiting steps held: a pass over the waits, an empty fetch, an event to \
             nobody's key (medians of {SAMPLES}) | {pass0:.0} / {pass:.0} µs, {fetch0:.0} / {fetch:.0} µs, \
             {send0:.0} / {send:.0} µs |"
        );

        let db = BenchDb::registered(sqlite, components, cache).await;
        let ((e50, e95), (p50, p95)) = to_start(&db, components, cache).await;
        println!(
            "| {backend} | to start on an idle host, {LATENCIES} each: event sent → its step's start / plain \
             enqueue → start | p50 {e50:.2} / {p50:.2} ms, p95 {e95:.2} / {p95:.2} ms |"
        );
    }
}
