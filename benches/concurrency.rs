//! The cost of per-key concurrency limits on both backends, PostgreSQL and
//! the embedded SQLite file, side by side, with a `jobhost run` process
//! (concurrency 10) as the worker:
//!
//! - L: 10,000 jobs limited to 2 per key over 20 keys (`limited`), next to
//!   10,000 of the same work unlimited (`sleep`), each on a fresh database.
//! - S: the shape of graphile-worker's serial queues: 1,000 jobs of 5 ms over
//!   10 keys, one at a time per key (`serial`); throughput, the hand-off
//!   from a holder's end to the next job's start on its key, and the most
//!   runs of one key seen at once (must be 1).
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

/// Runs `jobs` on one fresh host; returns the database for inspection.
async fn process(sqlite: bool, jobs: Vec<EnqueueParams>, components: &Path, cache: &Path) -> BenchDb {
    let db = BenchDb::fresh(sqlite).await;
    let host = start_host(db.url(), components, cache);
    db.wait_for(
        "SELECT count(*)::float8 FROM jobhost.hosts WHERE cardinality(job_types) = 3",
        "SELECT CAST(count(*) AS REAL) FROM hosts WHERE json_array_length(job_types) = 3",
        1.0,
    )
    .await;
    for chunk in jobs.chunks(1_000) {
        db.store().job_enqueue(chunk).await.unwrap();
    }
    let n = jobs.len() as f64;
    db.wait_for("SELECT count(*)::float8 FROM jobhost.archive", "SELECT CAST(count(*) AS REAL) FROM archive", n).await;
    stop(host);
    db
}

/// Every measurement on one backend.
struct Figures {
    unlimited: f64,
    limited: f64,
    serial: f64,
    handoffs: Vec<f64>,
    overlapping: f64,
}

async fn measure(sqlite: bool, components: &Path, cache: &Path) -> Figures {
    let unlimited = (0..L_JOBS).map(|i| EnqueueParams::new("sleep", json!({"i": i}))).collect();
    let unlimited = process(sqlite, unlimited, components, cache).await.archive_rate().await;
    let limited = (0..L_JOBS)
        .map(|i| EnqueueParams::new("limited", json!({"key": format!("k{}", i % L_KEYS), "i": i})))
        .collect();
    let limited = process(sqlite, limited, components, cache).await.archive_rate().await;

    let serial = (0..S_JOBS)
        .map(|i| EnqueueParams::new("serial", json!({"key": format!("k{}", i % S_KEYS), "ms": S_SLEEP_MS})))
        .collect();
    let db = process(sqlite, serial, components, cache).await;
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
    let overlapping = db
        .float(
            "SELECT count(*)::float8 FROM jobhost.archive a JOIN jobhost.archive b
               ON a.concurrency_key = b.concurrency_key AND a.id < b.id
              AND (a.output->>'started_ms')::bigint < (b.output->>'ended_ms')::bigint
              AND (b.output->>'started_ms')::bigint < (a.output->>'ended_ms')::bigint",
            "SELECT CAST(count(*) AS REAL) FROM archive a JOIN archive b
               ON a.concurrency_key = b.concurrency_key AND a.id < b.id
              AND a.output->>'started_ms' < b.output->>'ended_ms'
              AND b.output->>'started_ms' < a.output->>'ended_ms'",
        )
        .await;
    Figures { unlimited, limited, serial: db.archive_rate().await, handoffs, overlapping }
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
    let pg = measure(false, components, cache).await;
    let lite = measure(true, components, cache).await;
    let theoretical = (S_KEYS as u64 * 1000 / S_SLEEP_MS) as f64;
    let handoff = |h: &[f64]| {
        format!(
            "p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
            percentile(h, 0.5),
            percentile(h, 0.95),
            percentile(h, 0.99)
        )
    };

    println!("| measurement | PostgreSQL | SQLite (embedded) |");
    println!("|---|---|---|");
    println!(
        "| L: {L_JOBS} unlimited jobs, one host, concurrency 10 | {:.0} jobs/s | {:.0} jobs/s |",
        pg.unlimited, lite.unlimited
    );
    println!(
        "| L: {L_JOBS} jobs limited to 2 per key over {L_KEYS} keys, same host | {:.0} jobs/s ({:.2}× unlimited) | {:.0} jobs/s ({:.2}× unlimited) |",
        pg.limited,
        pg.limited / pg.unlimited,
        lite.limited,
        lite.limited / lite.unlimited
    );
    println!(
        "| S: {S_JOBS} jobs of {S_SLEEP_MS} ms, limit 1 over {S_KEYS} keys (theoretical {theoretical:.0}) | {:.0} jobs/s | {:.0} jobs/s |",
        pg.serial, lite.serial
    );
    println!(
        "| S: hand-off, holder's end → next job's start, by the guests' clocks | {} | {} |",
        handoff(&pg.handoffs),
        handoff(&lite.handoffs)
    );
    println!("| S: pairs of runs of one key that overlapped | {} | {} |", pg.overlapping, lite.overlapping);
}
