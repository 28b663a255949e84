//! What workflows cost, on both backends:
//!
//! - creation: a 10,000-step workflow (a root, a fan-out of 9,998, a
//!   fan-in after all of them) stored in one call;
//! - completion: `hello` jobs processed by one `jobhost run` at concurrency
//!   10, plainly and as chains of steps (every completion but a chain's
//!   last releases its dependent, with the output under `_deps`), by the
//!   database's own timestamps, in the shapes `WORKFLOW_SHAPES` lists
//!   (default `200x10,1000x20`: chains x steps), medians of
//!   `WORKFLOW_ROUNDS` (default 3) interleaved rounds; each as the runs
//!   alone and with each job charged its enqueue (the plain jobs' bulk
//!   enqueue, the steps' workflow creation) into an idle host;
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

/// A shape of chained steps: `chains` chains of `length` `hello` steps.
#[derive(Clone, Copy)]
struct Shape {
    chains: usize,
    length: usize,
}

impl Shape {
    fn jobs(self) -> usize {
        self.chains * self.length
    }

    /// The shapes measured: `WORKFLOW_SHAPES` (`CHAINSxLENGTH,...`), else
    /// issue 69's 200 x 10 and the longer 1,000 x 20.
    fn from_env() -> Vec<Shape> {
        let listed = std::env::var("WORKFLOW_SHAPES").unwrap_or_else(|_| "200x10,1000x20".into());
        listed
            .split(',')
            .map(|shape| {
                let (chains, length) = shape.trim().split_once('x').expect("WORKFLOW_SHAPES: CHAINSxLENGTH,...");
                Shape { chains: chains.parse().expect("chains"), length: length.parse().expect("length") }
            })
            .collect()
    }

    /// The steps, as workflows of whole chains of at most 10,000 steps.
    fn workflows(self) -> Vec<NewWorkflow> {
        let per_workflow = (10_000 / self.length).max(1);
        (0..self.chains)
            .step_by(per_workflow)
            .map(|first| {
                let chains = first..(first + per_workflow).min(self.chains);
                let steps = chains
                    .flat_map(|c| {
                        (0..self.length).map(move |s| {
                            let step = hello(&format!("c{c}-{s}"));
                            if s == 0 { step } else { step.after([format!("c{c}-{}", s - 1)]) }
                        })
                    })
                    .collect();
                NewWorkflow { label: None, steps }
            })
            .collect()
    }
}

/// One run's jobs/s by the database's clock: from the first start to the
/// last end (the runs alone), and from the first enqueue to the last end
/// (each job charged its enqueue: the plain jobs' bulk enqueue, the steps'
/// workflow creation), with the host already started and idle.
struct Processed {
    runs: f64,
    charged: f64,
}

/// `shape.jobs()` `hello` jobs on one host at concurrency 10, as chained
/// workflow steps or plainly.
async fn processing(sqlite: bool, as_workflow: bool, shape: Shape, components: &Path, cache: &Path) -> Processed {
    let db = registered(sqlite, components, cache).await;
    let host = start_host(db.url(), components, cache);
    db.wait_for(HOSTS.0, HOSTS.1, 1.0).await;
    if as_workflow {
        for workflow in shape.workflows() {
            db.store().workflow_create(&workflow).await.unwrap();
        }
    } else {
        let jobs: Vec<_> =
            (0..shape.jobs()).map(|i| EnqueueParams::new("hello", json!({ "name": format!("s{i}") }))).collect();
        db.store().job_enqueue(&jobs).await.unwrap();
    }
    db.wait_for(ARCHIVED.0, ARCHIVED.1, shape.jobs() as f64).await;
    stop(host);
    let span = |from: &str| {
        (
            format!("SELECT extract(epoch FROM max(finished_at) - min({from}))::float8 FROM jobhost.archive"),
            format!("SELECT (max(finished_at) - min({from})) / 1000.0 FROM archive"),
        )
    };
    let (runs, charged) = (span("started_at"), span("enqueued_at"));
    let jobs = shape.jobs() as f64;
    Processed { runs: jobs / db.float(&runs.0, &runs.1).await, charged: jobs / db.float(&charged.0, &charged.1).await }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let half = values.len() / 2;
    if values.len().is_multiple_of(2) { (values[half - 1] + values[half]) / 2.0 } else { values[half] }
}

/// Plain jobs against chained steps of `shape`, `rounds` interleaved
/// rounds (a drift of the shared machine falls on both): the medians.
async fn chained_against_plain(sqlite: bool, shape: Shape, rounds: usize, components: &Path, cache: &Path) -> String {
    let (mut plain, mut chained) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        plain.push(processing(sqlite, false, shape, components, cache).await);
        chained.push(processing(sqlite, true, shape, components, cache).await);
    }
    let rate = |of: &[Processed], pick: fn(&Processed) -> f64| median(of.iter().map(pick).collect());
    let (plain_runs, chained_runs) = (rate(&plain, |p| p.runs), rate(&chained, |p| p.runs));
    let (plain_charged, chained_charged) = (rate(&plain, |p| p.charged), rate(&chained, |p| p.charged));
    let ratios = |pick: fn(&Processed) -> f64| {
        let each: Vec<String> = plain.iter().zip(&chained).map(|(p, c)| format!("{:.2}", pick(c) / pick(p))).collect();
        each.join(", ")
    };
    format!(
        "runs: {plain_runs:.0} / {chained_runs:.0} jobs/s, {:.2} (rounds {}; {:+.0} µs a completion); \
         with their enqueue: {plain_charged:.0} / {chained_charged:.0} jobs/s, {:.2} (rounds {})",
        chained_runs / plain_runs,
        ratios(|p| p.runs),
        (1.0 / chained_runs - 1.0 / plain_runs) * 1e6,
        chained_charged / plain_charged,
        ratios(|p| p.charged),
    )
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
    let rounds: usize = std::env::var("WORKFLOW_ROUNDS").map_or(3, |r| r.parse().expect("WORKFLOW_ROUNDS: a number"));
    for (sqlite, backend) in [(false, "PostgreSQL"), (true, "SQLite")] {
        if only.as_deref().is_some_and(|b| b != if sqlite { "sqlite" } else { "postgres" }) {
            continue;
        }
        let rate = creation(sqlite, components, cache).await;
        println!("| {backend} | create a {CREATE_STEPS}-step workflow in one call | {rate:.0} steps/s |");
        for shape in Shape::from_env() {
            let (chains, length, jobs) = (shape.chains, shape.length, shape.jobs());
            let measured = chained_against_plain(sqlite, shape, rounds, components, cache).await;
            println!(
                "| {backend} | {jobs} `hello`, one host, concurrency 10: plain / as {chains} chains of {length}, \
                 medians of {rounds} | {measured} |"
            );
        }
        let (p50, p95, p99) = fan_in_wait(sqlite, components, cache).await;
        println!(
            "| {backend} | a join's wait after its last dependency, idle host, {DIAMONDS} diamonds \
             | p50 {p50:.2} ms, p95 {p95:.2} ms, p99 {p99:.2} ms |"
        );
        let (bytes, wait) = wide_fan_in(sqlite, components, cache).await;
        println!("| {backend} | a {FAN_IN}-way fan-in: `_deps` size, its wait | {bytes:.0} bytes, {wait:.1} ms |");
    }
}
