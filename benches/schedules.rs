//! What schedules made at run time cost (docs/schedules.md), on both
//! backends:
//!
//! - upserts per second, one client, one after another (5,000 schedules);
//! - a maintenance pass (`Scheduler::run_once`) with 100, 10,000 and
//!   100,000 schedules of a served type: with none due, and with 100 of
//!   them due (each pass enqueues their 100 jobs), medians of 50 passes;
//! - tick to start: 50 schedules (`SCHEDULE_TICKING`) ticking every second on an idle host for
//!   twenty seconds, the first of each tick's 50 jobs to start, and all of
//!   them, after their tick (`_tick`), against a plain enqueue's start
//!   after its enqueue, by the database's clock.
//!
//! `cargo bench --bench schedules` (after `guests/build.sh`;
//! `BENCH_BACKEND=postgres` or `sqlite` for one). Databases as in
//! `benches/queue.rs`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{BenchDb, percentile, start_host, stop};
use jobhost::background::scheduler::{Scheduler, SchedulerConfig};
use jobhost::store::HostInfo;
use jobhost::store::keyed_schedule::KeyedSchedule;
use serde_json::json;

const UPSERTS: usize = 5_000;
const PASSES: usize = 50;
const DUE: usize = 100;
/// Schedules ticking together in the tick-to-start run (`SCHEDULE_TICKING`).
fn ticking() -> usize {
    std::env::var("SCHEDULE_TICKING").map_or(50, |n| n.parse().expect("SCHEDULE_TICKING: a number"))
}
const TICK_SECONDS: u64 = 20;
const PLAIN: usize = 200;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Upserts per second, one after another.
async fn upserts(db: &BenchDb) -> f64 {
    let store = db.store();
    let started = Instant::now();
    for n in 0..UPSERTS {
        let mut schedule = KeyedSchedule::new("hello", format!("customer-{n}"), "0 9 * * MON");
        schedule.payload.insert("name".into(), json!(n));
        store.keyed_schedule_upsert(&schedule).await.unwrap();
    }
    UPSERTS as f64 / started.elapsed().as_secs_f64()
}

/// Adds idle schedules (not due for a day) until there are `total`.
async fn grow_to(db: &BenchDb, from: usize, total: usize) {
    grow(db, from, total).await;
    // As autovacuum would, long before a fleet has this many.
    db.execute("ANALYZE jobhost.keyed_schedules", "ANALYZE keyed_schedules").await;
}

async fn grow(db: &BenchDb, from: usize, total: usize) {
    db.execute(
        &format!(
            "INSERT INTO jobhost.keyed_schedules (job, key, cron, look_at)
             SELECT 'hello', 'idle-' || n, '0 9 * * *', now() + interval '1 day' FROM generate_series({from}, {}) n",
            total - 1
        ),
        &format!(
            "WITH RECURSIVE s(n) AS (SELECT {from} UNION ALL SELECT n + 1 FROM s WHERE n < {})
             INSERT INTO keyed_schedules (job, key, cron, since, look_at, created_at, updated_at)
             SELECT 'hello', 'idle-' || n, '0 9 * * *', 0, CAST(unixepoch('subsec') * 1000 AS INTEGER) + 86400000, 0, 0
             FROM s",
            total - 1
        ),
    )
    .await;
}

/// Median ms of a pass with nothing due, and with `DUE` schedules due.
async fn passes(db: &BenchDb) -> (f64, f64) {
    let store = db.store();
    let mut scheduler = Scheduler::new(store.clone(), SchedulerConfig::default()).unwrap();
    let mut idle = Vec::new();
    for _ in 0..PASSES {
        let started = Instant::now();
        let report = scheduler.run_once(None).await.unwrap();
        idle.push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!(report.keyed.looked, 0);
    }
    let mut busy = Vec::new();
    for _ in 0..PASSES {
        db.execute(
            &format!(
                "UPDATE jobhost.keyed_schedules SET look_at = now() - interval '1 second', since = now() - interval '61 seconds',
                 last_tick = NULL, cron = '0 * * * * *'
                 WHERE key IN (SELECT 'idle-' || n FROM generate_series(0, {}) n)",
                DUE - 1
            ),
            &format!(
                "UPDATE keyed_schedules SET look_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) - 1000,
                 since = CAST(unixepoch('subsec') * 1000 AS INTEGER) - 61000, last_tick = NULL, cron = '0 * * * * *'
                 WHERE key IN (WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n < {})
                               SELECT 'idle-' || n FROM s)",
                DUE - 1
            ),
        )
        .await;
        let started = Instant::now();
        let report = scheduler.run_once(None).await.unwrap();
        busy.push(started.elapsed().as_secs_f64() * 1e3);
        assert_eq!((report.keyed.looked, report.keyed.enqueued), (DUE, DUE));
    }
    (median(idle), median(busy))
}

/// Tick → first start, tick → start of every job, and plain enqueue →
/// start, ms, p50 and p95.
async fn to_start(db: &BenchDb, components: &Path, cache: &Path) -> [(f64, f64); 3] {
    let store = db.store();
    let host = start_host(db.url(), components, cache);
    db.wait_for(common::HOSTS.0, common::HOSTS.1, 1.0).await;
    for n in 0..ticking() {
        store.keyed_schedule_upsert(&KeyedSchedule::new("hello", format!("t{n}"), "* * * * * *")).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(TICK_SECONDS)).await;
    for n in 0..ticking() {
        store.keyed_schedule_remove("hello", &format!("t{n}")).await.unwrap();
    }
    // Not the first tick: the host's first pass may be late to it.
    let mut firsts = db
        .floats(
            "SELECT (extract(epoch FROM min(started_at) - (payload->>'_tick')::timestamptz) * 1000)::float8
             FROM jobhost.archive WHERE payload ? '_tick'
               AND (payload->>'_tick')::timestamptz > (SELECT min((payload->>'_tick')::timestamptz) FROM jobhost.archive)
             GROUP BY payload->>'_tick'",
            "SELECT CAST(min(started_at) - CAST(unixepoch(payload->>'_tick') * 1000 AS INTEGER) AS REAL)
             FROM archive WHERE payload->>'_tick' IS NOT NULL
               AND payload->>'_tick' > (SELECT min(payload->>'_tick') FROM archive)
             GROUP BY payload->>'_tick'",
        )
        .await;
    let mut ticks = db
        .floats(
            "SELECT (extract(epoch FROM started_at - (payload->>'_tick')::timestamptz) * 1000)::float8
             FROM jobhost.archive WHERE payload ? '_tick'
               AND (payload->>'_tick')::timestamptz > (SELECT min((payload->>'_tick')::timestamptz) FROM jobhost.archive)",
            "SELECT CAST(started_at - CAST(unixepoch(payload->>'_tick') * 1000 AS INTEGER) AS REAL)
             FROM archive WHERE payload->>'_tick' IS NOT NULL
               AND payload->>'_tick' > (SELECT min(payload->>'_tick') FROM archive)",
        )
        .await;
    let plains = db.plain_to_start(PLAIN).await;
    stop(host);
    ticks.sort_by(f64::total_cmp);
    firsts.sort_by(f64::total_cmp);
    let p = |v: &[f64]| (percentile(v, 0.5), percentile(v, 0.95));
    [p(&firsts), p(&ticks), p(&plains)]
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

    println!("| backend | measurement | result |");
    println!("|---|---|---|");
    for (sqlite, backend) in [(false, "PostgreSQL"), (true, "SQLite")] {
        if only.as_deref().is_some_and(|b| b != if sqlite { "sqlite" } else { "postgres" }) {
            continue;
        }
        let db = BenchDb::registered(sqlite, components, cache).await;
        let rate = upserts(&db).await;
        println!("| {backend} | upserts, one client, {UPSERTS} one after another | {rate:.0} a second |");

        let db = BenchDb::registered(sqlite, components, cache).await;
        let serving = HostInfo::current(vec!["hello".into()], Duration::from_secs(3600));
        db.store().host_upsert(&serving).await.unwrap();
        let mut held = 0;
        for total in [100, 10_000, 100_000] {
            grow_to(&db, held, total).await;
            held = total;
            let (idle, busy) = passes(&db).await;
            println!(
                "| {backend} | a pass with {total} schedules: none due / {DUE} due (their jobs enqueued), \
                 medians of {PASSES} | {idle:.2} / {busy:.2} ms |"
            );
        }

        let db = BenchDb::registered(sqlite, components, cache).await;
        let [(f50, f95), (t50, t95), (p50, p95)] = to_start(&db, components, cache).await;
        println!(
            "| {backend} | to start on an idle host: {} schedules every second for {TICK_SECONDS} s, \
             tick → its first job's start / tick → each of its jobs' start / plain enqueue → start \
             | p50 {f50:.2} / {t50:.2} / {p50:.2} ms, p95 {f95:.2} / {t95:.2} / {p95:.2} ms |",
            ticking()
        );
    }
}
