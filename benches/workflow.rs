//! What workflows cost, on both backends:
//!
//! - creation: a 10,000-step workflow (a root, a fan-out of 9,998, a
//!   fan-in after all of them) stored in one call;
//! - completion: 20,000 `hello` jobs processed by one `jobhost run` at
//!   concurrency 10, plainly and as two workflows of 500 chains of 20 steps
//!   (every completion but the last layer's releases its dependent, with
//!   the output under `_deps`), by the database's own timestamps;
//! - the fan-in's wait: from its last dependency's end to its start, with
//!   an idle host, over 200 small diamonds run one after another;
//! - a 999-way fan-in: its `_deps` size, and its wait.
//!
//! `cargo bench --bench workflow` (after `guests/build.sh`). Databases as
//! in `benches/queue.rs`.

mod common;

use std::path::Path;
use std::time::Instant;

use common::{BenchDb, percentile, start_host, stop};
use jobhost::store::{EnqueueParams, NewStep, NewWorkflow, Store, WorkflowState};
use serde_json::json;

const CREATE_STEPS: usize = 10_000;
const PROCESS_JOBS: usize = 20_000;
const CHAINS: usize = 1_000;
const DIAMONDS: usize = 200;
const FAN_IN: usize = 999;

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

fn hello(name: &str) -> NewStep {
    NewStep::new(name, "hello", json!({ "name": name }))
}

fn fan(parts: usize) -> NewWorkflow {
    let names: Vec<String> = (0..parts).map(|i| format!("part-{i}")).collect();
    let mut steps = vec![hello("root")];
    steps.extend(names.iter().map(|n| hello(n).after(["root"])));
    steps.push(hello("join").after(names.iter().map(String::as_str)));
    NewWorkflow { label: Some("bench".into()), steps }
}

/// Steps/s storing a 10,000-step workflow in one call.
async fn creation(sqlite: bool, components: &Path, cache: &Path) -> f64 {
    let db = registered(sqlite, components, cache).await;
    let workflow = fan(CREATE_STEPS - 2);
    let started = Instant::now();
    db.store().workflow_create(&workflow).await.unwrap();
    CREATE_STEPS as f64 / started.elapsed().as_secs_f64()
}

/// Jobs/s processing PROCESS_JOBS `hello` jobs on one host, as chained
/// workflow steps or plainly.
async fn processing(sqlite: bool, as_workflow: bool, components: &Path, cache: &Path) -> f64 {
    let db = registered(sqlite, components, cache).await;
    if as_workflow {
        // Two workflows (one may hold 10,000 steps), each of CHAINS / 2 chains.
        let per_workflow = PROCESS_JOBS / 2;
        let chains = CHAINS / 2;
        for _ in 0..2 {
            let steps = (0..per_workflow)
                .map(|i| {
                    let step = hello(&format!("s{i}"));
                    if i < chains { step } else { step.after([format!("s{}", i - chains)]) }
                })
                .collect();
            db.store().workflow_create(&NewWorkflow { label: None, steps }).await.unwrap();
        }
    } else {
        let jobs: Vec<_> =
            (0..PROCESS_JOBS).map(|i| EnqueueParams::new("hello", json!({ "name": format!("s{i}") }))).collect();
        db.store().job_enqueue(&jobs).await.unwrap();
    }
    let host = start_host(db.url(), components, cache);
    db.wait_for(HOSTS.0, HOSTS.1, 1.0).await;
    db.wait_for(ARCHIVED.0, ARCHIVED.1, PROCESS_JOBS as f64).await;
    stop(host);
    let span = db
        .float(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM jobhost.archive",
            "SELECT (max(finished_at) - min(started_at)) / 1000.0 FROM archive",
        )
        .await;
    PROCESS_JOBS as f64 / span
}

/// Milliseconds from the latest end among a step's dependencies to its start.
const FAN_IN_WAIT: (&str, &str) = (
    "SELECT (extract(epoch FROM j.started_at - (SELECT max(d.ended_at) FROM jobhost.workflow_edges e
                                                JOIN jobhost.workflow_steps d ON d.id = e.dep_id
                                                WHERE e.step_id = s.id)) * 1000)::float8
     FROM jobhost.workflow_steps s JOIN jobhost.archive j ON j.id = s.job_id
     WHERE s.name = 'join' ORDER BY 1",
    "SELECT CAST(j.started_at - (SELECT max(d.ended_at) FROM workflow_edges e
                                JOIN workflow_steps d ON d.id = e.dep_id
                                WHERE e.step_id = s.id) AS REAL)
     FROM workflow_steps s JOIN archive j ON j.id = s.job_id
     WHERE s.name = 'join' ORDER BY 1",
);

async fn finished(store: &Store, id: i64) {
    while store.workflow_get(id).await.unwrap().unwrap().state == WorkflowState::Running {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// (p50, p95, p99) ms of the join's wait over DIAMONDS diamonds, one at a time.
async fn fan_in_wait(sqlite: bool, components: &Path, cache: &Path) -> (f64, f64, f64) {
    let db = registered(sqlite, components, cache).await;
    let host = start_host(db.url(), components, cache);
    db.wait_for(HOSTS.0, HOSTS.1, 1.0).await;
    for _ in 0..DIAMONDS {
        let created = db.store().workflow_create(&fan(2)).await.unwrap();
        finished(&db.store(), created.id).await;
    }
    stop(host);
    let waits = db.floats(FAN_IN_WAIT.0, FAN_IN_WAIT.1).await;
    (percentile(&waits, 0.5), percentile(&waits, 0.95), percentile(&waits, 0.99))
}

/// (bytes of `_deps`, ms of the join's wait) for a FAN_IN-way fan-in.
async fn wide_fan_in(sqlite: bool, components: &Path, cache: &Path) -> (f64, f64) {
    let db = registered(sqlite, components, cache).await;
    let host = start_host(db.url(), components, cache);
    db.wait_for(HOSTS.0, HOSTS.1, 1.0).await;
    let created = db.store().workflow_create(&fan(FAN_IN)).await.unwrap();
    finished(&db.store(), created.id).await;
    stop(host);
    let bytes = db
        .float(
            "SELECT octet_length((j.payload -> '_deps')::text)::float8 FROM jobhost.workflow_steps s
             JOIN jobhost.archive j ON j.id = s.job_id WHERE s.name = 'join'",
            "SELECT CAST(length(CAST(j.payload -> '$._deps' AS BLOB)) AS REAL) FROM workflow_steps s
             JOIN archive j ON j.id = s.job_id WHERE s.name = 'join'",
        )
        .await;
    let wait = db.floats(FAN_IN_WAIT.0, FAN_IN_WAIT.1).await;
    (bytes, wait[0])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests/dist");
    assert!(guests.join("hello.wasm").exists(), "run guests/build.sh first");
    let components = tempfile::tempdir().unwrap();
    std::fs::copy(guests.join("hello.wasm"), components.path().join("hello.wasm")).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let (components, cache) = (components.path(), cache.path());

    println!("| backend | measurement | result |");
    println!("|---|---|---|");
    // `BENCH_BACKEND=postgres` or `sqlite` measures one backend only.
    let only = std::env::var("BENCH_BACKEND").ok();
    for (sqlite, backend) in [(false, "PostgreSQL"), (true, "SQLite")] {
        if only.as_deref().is_some_and(|b| b != if sqlite { "sqlite" } else { "postgres" }) {
            continue;
        }
        let rate = creation(sqlite, components, cache).await;
        println!("| {backend} | create a {CREATE_STEPS}-step workflow in one call | {rate:.0} steps/s |");
        // Alternating, so a drift of the shared machine falls on both.
        let plain = processing(sqlite, false, components, cache).await;
        let chained = processing(sqlite, true, components, cache).await;
        let plain_again = processing(sqlite, false, components, cache).await;
        let chained_again = processing(sqlite, true, components, cache).await;
        let (plain, chained) = ((plain + plain_again) / 2.0, (chained + chained_again) / 2.0);
        println!(
            "| {backend} | process {PROCESS_JOBS} `hello`, one host, concurrency 10: plain / as {CHAINS} chains \
             | {plain:.0} / {chained:.0} jobs/s: {:.2} ({:+.1} µs a completion) |",
            chained / plain,
            (1.0 / chained - 1.0 / plain) * 1e6
        );
        let (p50, p95, p99) = fan_in_wait(sqlite, components, cache).await;
        println!(
            "| {backend} | a join's wait after its last dependency, idle host, {DIAMONDS} diamonds \
             | p50 {p50:.2} ms, p95 {p95:.2} ms, p99 {p99:.2} ms |"
        );
        let (bytes, wait) = wide_fan_in(sqlite, components, cache).await;
        println!("| {backend} | a {FAN_IN}-way fan-in: `_deps` size, its wait | {bytes:.0} bytes, {wait:.1} ms |");
    }
}
