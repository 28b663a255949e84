//! The cost of per-key concurrency limits on both backends, PostgreSQL and
//! the embedded SQLite file, side by side, with a `jobhost run` process
//! (concurrency 10) as the worker:
//!
//! - L: 10,000 jobs limited to 2 per key over 20 keys (`limited`), next to
//!   10,000 of the same work unlimited (`sleep`), each on a fresh database.
//! - S: the shape of graphile-worker's serial queues: 1,000 jobs of 5 ms over
//!   10 keys, one at a time per key (`serial`), all queued before the host
//!   starts, as the peers' workload C does; throughput, the hand-off
//!   from a holder's end to the next job's start on its key, and the runs
//!   that started before their key's previous run ended (must be none).
//! - S deep: the serial shape with 20,000 jobs queued (19,990 of them
//!   blocked at the gate), as `pgboss.mjs -w C` with `C_JOBS=20000`.
//!
//! `JOBHOST_BENCH_SHAPES=serial` runs only the serial shapes, and
//! `JOBHOST_BENCH_BACKENDS=postgres` (or `sqlite`) only one backend, for
//! interleaved A/B runs (with `JOBHOST_BENCH_BIN` or
//! `JOBHOST_BENCH_HOST_FLAGS`).
//!
//! `cargo bench --bench concurrency` (after `guests/build.sh`); drops and
//! recreates database `jobhost_bench`, and makes SQLite files as the queue
//! benchmark does. Rates use the database's timestamps;
//! a hand-off is measured by the guests' own clocks: the next job's first
//! instruction minus the holder's last, so it includes writing the holder's
//! result, promoting and leasing the next job, and starting its sandbox.

mod common;

use std::path::Path;

use common::{BenchDb, percentile, start_host, stop};
use jobhost::store::EnqueueParams;
use serde_json::json;

const L_JOBS: usize = 10_000;
const L_KEYS: usize = 20;
const S_JOBS: usize = 1_000;
const S_KEYS: usize = 10;
const S_SLEEP_MS: u64 = 5;
const S_DEEP_JOBS: usize = 20_000;

/// Whether the jobs go in while the host runs, or all before it starts.
#[derive(Clone, Copy, PartialEq)]
enum Enqueue {
    WhileRunning,
    QueuedFirst,
}

/// Runs `jobs` on one fresh host; returns the database for inspection.
async fn process(sqlite: bool, jobs: Vec<EnqueueParams>, enqueue: Enqueue, components: &Path, cache: &Path) -> BenchDb {
    let db = BenchDb::fresh(sqlite).await;
    if enqueue == Enqueue::QueuedFirst {
        // The job types are registered by a host started and stopped once
        // (`BenchDb::fresh` migrated the database).
        let host = start_host(db.url(), components, cache);
        wait_for_types(&db).await;
        stop(host);
        for chunk in jobs.chunks(1_000) {
            db.store().job_enqueue(chunk).await.unwrap();
        }
    }
    let host = start_host(db.url(), components, cache);
    wait_for_types(&db).await;
    if enqueue == Enqueue::WhileRunning {
        for chunk in jobs.chunks(1_000) {
            db.store().job_enqueue(chunk).await.unwrap();
        }
    }
    let n = jobs.len() as f64;
    db.wait_for("SELECT count(*)::float8 FROM jobhost.archive", "SELECT CAST(count(*) AS REAL) FROM archive", n).await;
    stop(host);
    db
}

async fn wait_for_types(db: &BenchDb) {
    db.wait_for(
        "SELECT count(*)::float8 FROM jobhost.hosts WHERE cardinality(job_types) = 3",
        "SELECT CAST(count(*) AS REAL) FROM hosts WHERE json_array_length(job_types) = 3",
        1.0,
    )
    .await;
}

/// Every measurement on one backend; the L figures are `None` when only
/// the serial shapes run.
struct Figures {
    unlimited: Option<f64>,
    limited: Option<f64>,
    serial: Serial,
    deep: Serial,
}

/// The serial shape's figures, with jobs queued first (`deep`) or not.
fn shape(figures: &Figures, deep: bool) -> &Serial {
    if deep { &figures.deep } else { &figures.serial }
}

/// The serial shape's figures.
struct Serial {
    rate: f64,
    handoffs: Vec<f64>,
    overlapping: f64,
}

async fn measure(sqlite: bool, only_serial: bool, components: &Path, cache: &Path) -> Figures {
    let (mut unlimited, mut limited) = (None, None);
    if !only_serial {
        let jobs = (0..L_JOBS).map(|i| EnqueueParams::new("sleep", json!({"i": i}))).collect();
        let db = process(sqlite, jobs, Enqueue::WhileRunning, components, cache).await;
        unlimited = Some(db.archive_rate().await);
        let jobs = (0..L_JOBS)
            .map(|i| EnqueueParams::new("limited", json!({"key": format!("k{}", i % L_KEYS), "i": i})))
            .collect();
        let db = process(sqlite, jobs, Enqueue::WhileRunning, components, cache).await;
        limited = Some(db.archive_rate().await);
    }
    let serial = serial_shape(sqlite, S_JOBS, Enqueue::QueuedFirst, components, cache).await;
    let deep = serial_shape(sqlite, S_DEEP_JOBS, Enqueue::QueuedFirst, components, cache).await;
    Figures { unlimited, limited, serial, deep }
}

/// The serial shape: `jobs` jobs of 5 ms, limit 1 over 10 keys.
async fn serial_shape(sqlite: bool, jobs: usize, enqueue: Enqueue, components: &Path, cache: &Path) -> Serial {
    let serial = (0..jobs)
        .map(|i| EnqueueParams::new("serial", json!({"key": format!("k{}", i % S_KEYS), "ms": S_SLEEP_MS})))
        .collect();
    let db = process(sqlite, serial, enqueue, components, cache).await;
    // Each key's first job has no holder before it: the first S_KEYS rows
    // (NULL, sorted first) are left out.
    let mut handoffs = db
        .floats(
            &format!(
                "SELECT ((output->>'started_us')::bigint - lag((output->>'ended_us')::bigint) OVER w)::float8 / 1000
                     AS ms
                 FROM jobhost.archive WINDOW w AS (PARTITION BY concurrency_key ORDER BY started_at)
                 ORDER BY ms NULLS FIRST OFFSET {S_KEYS}"
            ),
            &format!(
                "SELECT ((output->>'started_us') - lag(output->>'ended_us') OVER w) / 1000.0 AS ms
                 FROM archive WINDOW w AS (PARTITION BY concurrency_key ORDER BY output->>'started_us')
                 ORDER BY ms NULLS FIRST LIMIT -1 OFFSET {S_KEYS}"
            ),
        )
        .await;
    handoffs.sort_by(f64::total_cmp);
    // A run that started before the previous run of its key (by start)
    // ended: with limit 1 there must be none. Two runs that overlap make
    // the earlier one's successor such a run, so this finds any overlap.
    let overlapping = db
        .float(
            "SELECT count(*)::float8 FROM (
               SELECT (output->>'started_ms')::bigint < lag((output->>'ended_ms')::bigint) OVER w AS early
                 FROM jobhost.archive WINDOW w AS (PARTITION BY concurrency_key ORDER BY (output->>'started_ms')::bigint, id)
             ) runs WHERE early",
            "SELECT CAST(count(*) AS REAL) FROM (
               SELECT output->>'started_ms' < lag(output->>'ended_ms') OVER w AS early
                 FROM archive WINDOW w AS (PARTITION BY concurrency_key ORDER BY output->>'started_ms', id)
             ) WHERE early",
        )
        .await;
    Serial { rate: db.archive_rate().await, handoffs, overlapping }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("guests/dist");
    assert!(guests.join("serial.wasm").exists(), "run guests/build.sh first");
    let components = tempfile::tempdir().unwrap();
    for name in ["limited", "sleep", "serial"] {
        std::fs::copy(guests.join(format!("{name}.wasm")), components.path().join(format!("{name}.wasm"))).unwrap();
    }
    let cache = tempfile::tempdir().unwrap();
    let (components, cache) = (components.path(), cache.path());
    let only_serial = std::env::var("JOBHOST_BENCH_SHAPES").is_ok_and(|shapes| shapes == "serial");
    let backends = std::env::var("JOBHOST_BENCH_BACKENDS").unwrap_or_default();
    let mut columns = Vec::new();
    for (name, sqlite) in [("PostgreSQL", false), ("SQLite (embedded)", true)] {
        let wanted = backends.is_empty() || backends == if sqlite { "sqlite" } else { "postgres" };
        if wanted {
            columns.push((name, measure(sqlite, only_serial, components, cache).await));
        }
    }
    let theoretical = (S_KEYS as u64 * 1000 / S_SLEEP_MS) as f64;
    let handoff = |h: &[f64]| {
        format!(
            "p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
            percentile(h, 0.5),
            percentile(h, 0.95),
            percentile(h, 0.99)
        )
    };
    let row = |label: String, cell: &dyn Fn(&Figures) -> String| {
        let cells: Vec<String> = columns.iter().map(|(_, figures)| cell(figures)).collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    let names: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
    println!("| measurement | {} |", names.join(" | "));
    println!("|---|{}", "---|".repeat(columns.len()));
    if !only_serial {
        let figure = |f: Option<f64>| f.unwrap_or(f64::NAN);
        row(format!("L: {L_JOBS} unlimited jobs, one host, concurrency 10"), &|f| {
            format!("{:.0} jobs/s", figure(f.unlimited))
        });
        row(format!("L: {L_JOBS} jobs limited to 2 per key over {L_KEYS} keys, same host"), &|f| {
            format!("{:.0} jobs/s ({:.2}× unlimited)", figure(f.limited), figure(f.limited) / figure(f.unlimited))
        });
    }
    for (label, deep) in [(format!("{S_JOBS} queued first"), false), (format!("{S_DEEP_JOBS} queued first"), true)] {
        row(
            format!("S: {label}, {S_SLEEP_MS} ms each, limit 1 over {S_KEYS} keys (theoretical {theoretical:.0})"),
            &|f| format!("{:.0} jobs/s", shape(f, deep).rate),
        );
        row(format!("S ({label}): hand-off, holder's end → next job's start, by the guests' clocks"), &|f| {
            handoff(&shape(f, deep).handoffs)
        });
        row(format!("S ({label}): runs started before their key's previous run ended"), &|f| {
            format!("{}", shape(f, deep).overlapping)
        });
    }
}
