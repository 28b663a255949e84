//! Bulk enqueue through the gate and the uniqueness claims, against a plain
//! bulk enqueue of the same number of jobs, on both backends (issue 40's
//! workloads): limit-1 jobs over many keys (most of them blocked), unique
//! jobs with distinct keys, and unique jobs that are all duplicates of one
//! key. Jobs go in as `jobhost enqueue --file` sends them: 5,000 per call,
//! each call one transaction. No host runs: this is the enqueue path alone.
//!
//! `cargo bench --bench bulk`. Each round of a workload runs on two fresh
//! databases at once, one with the plain job type and one with the
//! workload's, and sends each 5,000-job call to both in turn (alternating
//! which goes first), so a plain rate and the rate it is compared with come
//! from the same seconds: on a shared machine whose speed drifts by a third
//! within minutes, runs one after the other could not resolve a few
//! percent.
//! `JOBHOST_BENCH_ROUNDS` (default 3) sets the rounds, `JOBHOST_BENCH_SCALE`
//! (default 1) scales the job counts for a quick look, and
//! `JOBHOST_BENCH_BACKENDS=postgres` (or `sqlite`) runs one backend.
//! Databases as in `benches/queue.rs`.

mod common;

use std::time::{Duration, Instant};

use common::BenchDb;
use jobhost::store::{EnqueueParams, Enqueued};
use jobhost::template::KeyTemplate;
use jobhost::types::{Backoff, ConcurrencyConfig, JobConfig, OnConflict, OnDuplicate, UniqueConfig, UniqueStrategy};

/// Jobs per call, as the CLI's `enqueue --file` sends them.
const CHUNK: usize = 5_000;
const LIMITED_JOBS: usize = 500_000;
const LIMITED_KEYS: usize = 100_000;
const UNIQUE_JOBS: usize = 100_000;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Plain,
    /// Limit 1 per `{k}`, blocking.
    Limited,
    /// Unique until executed on `{k}`; a duplicate is answered with the holder's id.
    Unique,
}

fn config(kind: Kind) -> JobConfig {
    let key = || KeyTemplate::parse("{k}").unwrap();
    JobConfig {
        name: "item".into(),
        queue: "default".into(),
        priority: 0,
        max_attempts: 3,
        backoff: Backoff { base_ms: 1_000, cap_ms: 60_000 },
        timeout_ms: 10_000,
        memory_limit_bytes: 64 << 20,
        concurrency: (kind == Kind::Limited).then(|| ConcurrencyConfig {
            limit: 1,
            key: key(),
            duration_secs: 60,
            on_conflict: OnConflict::Block,
        }),
        unique: (kind == Kind::Unique).then(|| UniqueConfig {
            key: key(),
            strategy: UniqueStrategy::UntilExecuted,
            on_duplicate: OnDuplicate::Skip,
        }),
        schedule: None,
        outbound: Vec::new(),
        rate_limit: None,
        on_events: Vec::new(),
    }
}

/// `jobs` jobs whose key `k` cycles through `keys` values.
fn payloads(jobs: usize, keys: usize) -> Vec<EnqueueParams> {
    (0..jobs).map(|i| EnqueueParams::new("item", serde_json::json!({ "k": (i % keys).to_string(), "i": i }))).collect()
}

/// One workload's enqueue against a plain one of the same jobs, on two
/// fresh databases at once, call by call: each chunk goes into the plain
/// database and then the other (the order alternating from chunk to
/// chunk), so both rates come from the same seconds of a noisy machine.
/// Returns the two rates (jobs/s, counting only the time inside the calls)
/// and how many of the workload's answers were new jobs.
async fn paired_rates(sqlite: bool, kind: Kind, jobs: &[EnqueueParams]) -> (f64, f64, usize) {
    let plain_db = BenchDb::fresh_named(sqlite, "jobhost_bench").await;
    let gated_db = BenchDb::fresh_named(sqlite, "jobhost_bench_gated").await;
    let (plain, gated) = (plain_db.store(), gated_db.store());
    plain.job_types_register(&[(config(Kind::Plain), "v1".into())]).await.unwrap();
    gated.job_types_register(&[(config(kind), "v1".into())]).await.unwrap();
    let (mut plain_time, mut gated_time, mut new) = (Duration::ZERO, Duration::ZERO, 0);
    for (i, chunk) in jobs.chunks(CHUNK).enumerate() {
        for plain_turn in if i % 2 == 0 { [true, false] } else { [false, true] } {
            let store = if plain_turn { &plain } else { &gated };
            let started = Instant::now();
            let answers = store.job_enqueue_outcomes(chunk).await.unwrap();
            let took = started.elapsed();
            let fresh = answers.iter().filter(|a| matches!(a, Enqueued::New(_))).count();
            if plain_turn {
                assert_eq!(fresh, chunk.len(), "a plain enqueue answers every job as new");
                plain_time += took;
            } else {
                gated_time += took;
                new += fresh;
            }
        }
    }
    let rate = |time: Duration| jobs.len() as f64 / time.as_secs_f64();
    (rate(plain_time), rate(gated_time), new)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let rounds: usize = env_or("JOBHOST_BENCH_ROUNDS", 3);
    let scale: f64 = env_or("JOBHOST_BENCH_SCALE", 1.0);
    let scaled = |n: usize| ((n as f64 * scale) as usize).max(CHUNK);
    let backends = std::env::var("JOBHOST_BENCH_BACKENDS").unwrap_or_default();
    let limited = payloads(scaled(LIMITED_JOBS), scaled(LIMITED_KEYS));
    let distinct = payloads(scaled(UNIQUE_JOBS), usize::MAX);
    let one_key = payloads(scaled(UNIQUE_JOBS), 1);
    println!("| backend | workload | plain jobs/s | jobs/s | ratio (medians of {rounds}) | each round's ratio |");
    println!("|---|---|---|---|---|---|");
    for (backend, sqlite) in [("PostgreSQL", false), ("SQLite", true)] {
        if !(backends.is_empty() || backends == if sqlite { "sqlite" } else { "postgres" }) {
            continue;
        }
        let workloads = [
            (
                format!("{} limit-1 jobs over {} keys", limited.len(), scaled(LIMITED_KEYS)),
                Kind::Limited,
                &limited,
                scaled(LIMITED_KEYS),
            ),
            (format!("{} unique jobs, distinct keys", distinct.len()), Kind::Unique, &distinct, distinct.len()),
            (format!("{} unique jobs, all one key", one_key.len()), Kind::Unique, &one_key, 1),
        ];
        for (label, kind, jobs, expect_new) in workloads {
            let (mut plain, mut gated, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                let (p, g, g_new) = paired_rates(sqlite, kind, jobs).await;
                let expected = if kind == Kind::Limited { jobs.len() } else { expect_new };
                assert_eq!(g_new, expected, "{label}: new jobs");
                plain.push(p);
                gated.push(g);
                ratios.push(g / p);
            }
            let each = ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
            println!(
                "| {backend} | {label} | {:.0} | {:.0} | {:.2} | {each} |",
                median(plain.clone()),
                median(gated.clone()),
                median(ratios.clone()),
            );
        }
    }
}
