//! The cost of per-key concurrency limits, against a real PostgreSQL with a
//! `jobhost run` process (concurrency 10) as the worker:
//!
//! - L: 10,000 jobs limited to 2 per key over 20 keys (`limited`), next to
//!   10,000 of the same work unlimited (`sleep`), each on a fresh database.
//! - S: the shape of graphile-worker's serial queues: 1,000 jobs of 5 ms over
//!   10 keys, one at a time per key (`serial`); throughput, the hand-off
//!   from a holder's end to the next job's start on its key, and the most
//!   runs of one key seen at once (must be 1).
//!
//! `cargo bench --bench concurrency` (after `guests/build.sh`); drops and
//! recreates database `jobhost_bench`. Rates use the database's timestamps;
//! a hand-off is measured by the guests' own clocks: the next job's first
//! instruction minus the holder's last, so it includes writing the holder's
//! result, promoting and leasing the next job, and starting its sandbox.

mod common;

use std::path::Path;

use common::{archive_rate, fresh_db, percentile, start_host, stop, wait_for_archive, wait_until};
use jobhost::store::{EnqueueParams, Store};
use serde_json::json;

const L_JOBS: usize = 10_000;
const L_KEYS: usize = 20;
const S_JOBS: usize = 1_000;
const S_KEYS: usize = 10;
const S_SLEEP_MS: u64 = 5;

/// Runs `jobs` on one fresh host; returns the database pool for inspection.
async fn process(jobs: Vec<EnqueueParams>, components: &Path, cache: &Path) -> sqlx::PgPool {
    let (store, url) = fresh_db().await;
    let pool = store.pool().clone();
    let host = start_host(&url, components, cache);
    wait_until(&pool, "SELECT (count(*) = 1)::int::float8 FROM jobhost.hosts WHERE cardinality(job_types) = 3").await;
    for chunk in jobs.chunks(1_000) {
        store.job_enqueue(chunk).await.unwrap();
    }
    wait_for_archive(&pool, jobs.len() as i64).await;
    stop(host);
    pool
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

    let unlimited = (0..L_JOBS).map(|i| EnqueueParams::new("sleep", json!({"i": i}))).collect();
    let unlimited = archive_rate(&process(unlimited, components, cache).await).await;
    let limited = (0..L_JOBS)
        .map(|i| EnqueueParams::new("limited", json!({"key": format!("k{}", i % L_KEYS), "i": i})))
        .collect();
    let limited = archive_rate(&process(limited, components, cache).await).await;

    let serial = (0..S_JOBS)
        .map(|i| EnqueueParams::new("serial", json!({"key": format!("k{}", i % S_KEYS), "ms": S_SLEEP_MS})))
        .collect();
    let pool = process(serial, components, cache).await;
    let serial_rate = archive_rate(&pool).await;
    let mut handoffs: Vec<f64> = sqlx::query_scalar(
        "SELECT ((output->>'started_us')::bigint - lag((output->>'ended_us')::bigint) OVER w)::float8 / 1000 AS ms
         FROM jobhost.archive WINDOW w AS (PARTITION BY concurrency_key ORDER BY started_at)
         ORDER BY ms NULLS FIRST OFFSET $1",
    )
    .bind(S_KEYS as i64)
    .fetch_all(&pool)
    .await
    .unwrap();
    handoffs.sort_by(f64::total_cmp);
    let (overlapping,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM jobhost.archive a JOIN jobhost.archive b
           ON a.concurrency_key = b.concurrency_key AND a.id < b.id
          AND (a.output->>'started_ms')::bigint < (b.output->>'ended_ms')::bigint
          AND (b.output->>'started_ms')::bigint < (a.output->>'ended_ms')::bigint",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let theoretical = (S_KEYS as u64 * 1000 / S_SLEEP_MS) as f64;

    println!("| measurement | result |");
    println!("|---|---|");
    println!("| L: {L_JOBS} unlimited jobs, one host, concurrency 10 | {unlimited:.0} jobs/s |");
    println!(
        "| L: {L_JOBS} jobs limited to 2 per key over {L_KEYS} keys, same host | {limited:.0} jobs/s ({:.2}× unlimited) |",
        limited / unlimited
    );
    println!(
        "| S: {S_JOBS} jobs of {S_SLEEP_MS} ms, limit 1 over {S_KEYS} keys | {serial_rate:.0} jobs/s (theoretical {theoretical:.0}) |"
    );
    println!(
        "| S: hand-off, holder's end → next job's start, by the guests' clocks | p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms |",
        percentile(&handoffs, 0.5),
        percentile(&handoffs, 0.95),
        percentile(&handoffs, 0.99)
    );
    println!("| S: pairs of runs of one key that overlapped | {overlapping} |");
}
