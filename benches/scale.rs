//! Nothing on the hot path or in maintenance may grow with the size of the
//! queue (issue 17, "Scale"). Each case loads a small and a large state
//! straight into the tables with set-based SQL, then times the same
//! operations through the real store API on both, and prints large ÷ small:
//!
//! - A: 20,000 vs 1,000,000 available jobs: a fetch of 10, a bulk enqueue
//!   of 1,000, and the completion of 10 fetched jobs (per job).
//! - B: 20 vs 100,000 keys (limit 1, every key held), 1,000,000 blocked jobs
//!   spread over them: the gate (enqueue of a limited job, which blocks),
//!   release and promotion (the finish of a holder), a sweep page and a
//!   repair page (1,000 keys each), and, for comparison, one pass of the
//!   unpaged functions of 0004_concurrency that they replace.
//! - C: a small archive vs 10,000,000 archived rows: the hot path (enqueue,
//!   fetch, finish) and one retention batch (10,000 rows).
//!
//! PostgreSQL only. `cargo bench --bench scale`; drops and recreates
//! database `jobhost_bench_scale` (set `JOBHOST_BENCH_DATABASE_URL` for
//! another server). Loading takes most of the run, about 5 minutes.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use jobhost::store::postgres::PgStore;
use jobhost::store::{EnqueueParams, FetchParams, FetchedJob, Finish, FinishOutcome, KeyCursor, Store};
use jobhost::types::{Backoff, ConcurrencyConfig, JobConfig, JsonText, OnConflict};
use serde_json::json;
use sqlx::PgPool;

const DB: &str = "jobhost_bench_scale";

/// The store's front, and the backend itself for the raw SQL that loads
/// and measures the database.
struct Db {
    front: Store,
    pg: Arc<PgStore>,
}

async fn fresh() -> Db {
    let admin = PgPool::connect(&format!("{}/postgres", common::server())).await.expect("PostgreSQL");
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)")))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {DB}"))).execute(&admin).await.unwrap();
    let pg = Arc::new(PgStore::connect(&format!("{}/{DB}", common::server()), 4).await.unwrap());
    let store = Store::shared(pg.clone());
    store.schema_migrate().await.unwrap();
    let config = |name: &str, concurrency: Option<ConcurrencyConfig>| JobConfig {
        name: name.into(),
        queue: "default".into(),
        priority: 0,
        max_attempts: 3,
        backoff: Backoff { base_ms: 10, cap_ms: 100 },
        timeout_ms: 10_000,
        memory_limit_bytes: 64 << 20,
        concurrency,
        unique: None,
        schedule: None,
        outbound: Vec::new(),
        rate_limit: None,
        on_events: Vec::new(),
    };
    let limited = ConcurrencyConfig {
        limit: 1,
        key: jobhost::template::KeyTemplate::parse("{k}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    };
    store
        .job_types_register(&[(config("plain", None), "v1".into()), (config("lim", Some(limited)), "v1".into())])
        .await
        .unwrap();
    Db { front: store, pg }
}

async fn exec(store: &Db, sql: &str) {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string())).execute(store.pg.pool()).await.unwrap();
}

/// Timed samples of one operation.
#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    /// Records the time since `start`.
    fn since(&mut self, start: Instant) {
        self.0.push(start.elapsed().as_secs_f64() * 1e6);
    }

    /// The median, in microseconds.
    fn median(mut self) -> f64 {
        self.0.sort_by(f64::total_cmp);
        common::percentile(&self.0, 0.5)
    }
}

fn fetch(limit: i64) -> FetchParams {
    FetchParams {
        host_id: "bench".into(),
        queues: vec!["default".into()],
        job_types: vec![("plain".into(), 30), ("lim".into(), 30)],
        limit,
    }
}

fn done(job: &FetchedJob) -> Finish {
    Finish {
        id: job.id,
        lease_token: job.lease_token,
        attempt: job.attempt,
        outcome: FinishOutcome::Completed {
            output: Some(JsonText::from(&json!({"ok": true}))),
            children: Vec::new().into(),
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

/// One row of the results: an operation's cost on the small and large state.
struct Row {
    case: &'static str,
    op: &'static str,
    small: f64,
    large: f64,
}

/// Hot-path figures: fetch of 10, bulk enqueue per job, completion per job.
async fn hot_path(store: &Db) -> [f64; 3] {
    // Warm up: the plans cached, the pages read.
    for _ in 0..20 {
        let jobs = store.front.job_fetch(&fetch(10)).await.unwrap();
        store.front.job_finish(jobs.iter().map(done).collect()).await.unwrap();
    }
    let (mut fetches, mut finishes, mut enqueues) = (Samples::default(), Samples::default(), Samples::default());
    for _ in 0..100 {
        let start = Instant::now();
        let jobs = store.front.job_fetch(&fetch(10)).await.unwrap();
        fetches.since(start);
        let start = Instant::now();
        store.front.job_finish(jobs.iter().map(done).collect()).await.unwrap();
        finishes.since(start);
    }
    for i in 0..10 {
        let jobs: Vec<EnqueueParams> =
            (0..1_000).map(|n| EnqueueParams::new("plain", json!({"n": n, "batch": i}))).collect();
        let start = Instant::now();
        store.front.job_enqueue(&jobs).await.unwrap();
        enqueues.since(start);
    }
    [fetches.median(), enqueues.median() / 1_000.0, finishes.median() / 10.0]
}

async fn load_available(store: &Db, n: i64) {
    exec(
        store,
        &format!(
            "INSERT INTO jobhost.jobs (job, queue, payload, state, max_attempts, run_at)
             SELECT 'plain', 'default', jsonb_build_object('n', i), 'available', 3,
                    now() - interval '1 hour' + i * interval '1 microsecond'
             FROM generate_series(1, {n}) i"
        ),
    )
    .await;
    exec(store, "ANALYZE jobhost.jobs").await;
}

async fn case_a(store: &Db, rows: &mut Vec<Row>) {
    load_available(store, 20_000).await;
    let small = hot_path(store).await;
    load_available(store, 980_000).await;
    let large = hot_path(store).await;
    for (i, op) in ["fetch of 10 (µs)", "bulk enqueue (µs/job)", "completion (µs/job)"].into_iter().enumerate() {
        rows.push(Row { case: "A 20k vs 1M available", op, small: small[i], large: large[i] });
    }
    exec(store, "TRUNCATE jobhost.jobs").await;
}

/// Loads `keys` keys of `lim`, each held by a running job, and 1,000,000
/// blocked jobs over them.
async fn load_keys(store: &Db, keys: i64) {
    exec(store, "TRUNCATE jobhost.jobs, jobhost.blocked_jobs, jobhost.semaphores").await;
    exec(
        store,
        &format!(
            "INSERT INTO jobhost.jobs (job, queue, payload, state, attempt, max_attempts, concurrency_key,
                                       lease_token, lease_secs, lease_expires_at, host_id, started_at)
             SELECT 'lim', 'default', jsonb_build_object('k', 'key-' || k), 'running', 1, 3, 'key-' || k,
                    k, 30, now() + interval '1 day', 'bench', now()
             FROM generate_series(1, {keys}) k"
        ),
    )
    .await;
    exec(
        store,
        &format!(
            "INSERT INTO jobhost.semaphores (job, key, holders) SELECT 'lim', 'key-' || k, 1 FROM generate_series(1, {keys}) k"
        ),
    )
    .await;
    exec(
        store,
        &format!(
            "INSERT INTO jobhost.blocked_jobs (id, job, queue, priority, payload, attempt, max_attempts, enqueued_at,
                                               concurrency_key, errors, parked_at)
             SELECT nextval('jobhost.job_ids'), 'lim', 'default', 0, jsonb_build_object('k', 'key-' || (i % {keys} + 1)),
                    0, 3, now(), 'key-' || (i % {keys} + 1), '[]', now() + i * interval '1 microsecond'
             FROM generate_series(1, 1000000) i"
        ),
    )
    .await;
    exec(store, "VACUUM ANALYZE jobhost.jobs").await;
    exec(store, "VACUUM ANALYZE jobhost.blocked_jobs").await;
    exec(store, "VACUUM ANALYZE jobhost.semaphores").await;
}

/// Gate, release+promotion, a sweep page, a repair page, and the unpaged
/// functions, for the keys loaded.
async fn keyed_ops(store: &Db, keys: i64) -> [f64; 6] {
    let mut gate = Samples::default();
    for i in 0..200 {
        let key = format!("key-{}", (i * 7919) % keys + 1);
        let start = Instant::now();
        store.front.job_enqueue(&[EnqueueParams::new("lim", json!({ "k": key }))]).await.unwrap();
        gate.since(start);
    }
    // Holders to finish: each finish gives back its slot and promotes the
    // key's next blocked job, in one transaction.
    let holders: Vec<(i64, i64, i32, String)> = sqlx::query_as(
        "SELECT id, lease_token, attempt, concurrency_key FROM jobhost.jobs
         WHERE state = 'running' ORDER BY random() LIMIT 200",
    )
    .fetch_all(store.pg.pool())
    .await
    .unwrap();
    let mut release = Samples::default();
    for (id, lease_token, attempt, key) in holders {
        let job = FetchedJob {
            id,
            lease_token,
            job: "lim".into(),
            queue: "default".into(),
            payload: json!({}),
            attempt,
            max_attempts: 3,
            enqueued_at: chrono::Utc::now(),
            batch_id: None,
            concurrency_key: Some(key),
            lease_secs: 30,
        };
        let start = Instant::now();
        store.front.job_finish(vec![done(&job)]).await.unwrap();
        release.since(start);
    }
    let (mut sweep, mut repair) = (Samples::default(), Samples::default());
    let (mut swept, mut repaired): (Option<KeyCursor>, Option<KeyCursor>) = (None, None);
    for _ in 0..20 {
        let start = Instant::now();
        swept = store.front.blocked_promote(swept.as_ref(), 1_000).await.unwrap().next;
        sweep.since(start);
        let start = Instant::now();
        repaired = store.front.semaphore_repair_page(repaired.as_ref(), 1_000).await.unwrap().next;
        repair.since(start);
    }
    let (mut old_sweep, mut old_repair) = (Samples::default(), Samples::default());
    for _ in 0..3 {
        let start = Instant::now();
        exec(store, "SELECT count(*) FROM jobhost.promotable_keys(1000)").await;
        old_sweep.since(start);
        let start = Instant::now();
        exec(store, "SELECT count(*) FROM jobhost.repair_semaphores()").await;
        old_repair.since(start);
    }
    [gate.median(), release.median(), sweep.median(), repair.median(), old_sweep.median(), old_repair.median()]
}

async fn case_b(store: &Db, rows: &mut Vec<Row>) {
    load_keys(store, 20).await;
    let small = keyed_ops(store, 20).await;
    load_keys(store, 100_000).await;
    let large = keyed_ops(store, 100_000).await;
    let ops = [
        "gate: enqueue, blocks (µs)",
        "release + promotion (µs)",
        "sweep page, 1,000 keys (µs)",
        "repair page, 1,000 keys (µs)",
        "before: promotable_keys(1000) (µs)",
        "before: repair_semaphores() (µs)",
    ];
    for (i, op) in ops.into_iter().enumerate() {
        rows.push(Row { case: "B 20 vs 100k keys, 1M blocked", op, small: small[i], large: large[i] });
    }
    // A page visits every key when there are fewer than a page's worth.
    let (small_keys, large_keys) = (20.0, 1_000.0);
    for (i, op) in [(2, "sweep, per key visited (µs)"), (3, "repair, per key visited (µs)")] {
        rows.push(Row {
            case: "B 20 vs 100k keys, 1M blocked",
            op,
            small: small[i] / small_keys,
            large: large[i] / large_keys,
        });
    }
    exec(store, "TRUNCATE jobhost.jobs, jobhost.blocked_jobs, jobhost.semaphores").await;
}

/// Archives `n` rows, finished `days_ago` days ago in order of id.
async fn load_archive(store: &Db, n: i64, days_ago: i64) {
    exec(
        store,
        &format!(
            "INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, output,
                                          errors, enqueued_at, started_at, finished_at, host_id)
             SELECT nextval('jobhost.job_ids'), 'plain', 'default', 0, jsonb_build_object('n', i), 'completed', 1, 3,
                    '{{\"ok\": true}}', '[]', f, f, f, 'bench'
             FROM generate_series(1, {n}) i,
                  LATERAL (SELECT now() - interval '{days_ago} days' + i * interval '1 millisecond' AS f) t"
        ),
    )
    .await;
    exec(store, "VACUUM ANALYZE jobhost.archive").await;
}

async fn retention_batch(store: &Db) -> f64 {
    let mut prune = Samples::default();
    for _ in 0..3 {
        let start = Instant::now();
        let pruned = store.front.archive_prune(None, 7.0 * 86_400.0, 10_000).await.unwrap();
        prune.since(start);
        assert_eq!(pruned, 10_000, "a full batch is due");
    }
    prune.median()
}

async fn case_c(store: &Db, rows: &mut Vec<Row>) {
    load_available(store, 20_000).await;
    load_archive(store, 40_000, 30).await;
    let small = hot_path(store).await;
    let small_prune = retention_batch(store).await;
    load_archive(store, 10_000_000, 30).await;
    let large = hot_path(store).await;
    let large_prune = retention_batch(store).await;
    for (i, op) in ["fetch of 10 (µs)", "bulk enqueue (µs/job)", "completion (µs/job)"].into_iter().enumerate() {
        rows.push(Row { case: "C archive 40k vs 10M", op, small: small[i], large: large[i] });
    }
    rows.push(Row {
        case: "C archive 40k vs 10M",
        op: "retention batch, 10,000 rows (µs)",
        small: small_prune,
        large: large_prune,
    });
}

#[tokio::main]
async fn main() {
    let started = Instant::now();
    let store = fresh().await;
    let mut rows = Vec::new();
    case_a(&store, &mut rows).await;
    eprintln!("A done after {:?}", started.elapsed());
    case_b(&store, &mut rows).await;
    eprintln!("B done after {:?}", started.elapsed());
    case_c(&store, &mut rows).await;
    eprintln!("C done after {:?}", started.elapsed());
    println!("| case | operation | small | large | large ÷ small |");
    println!("|---|---|---:|---:|---:|");
    for row in rows {
        println!("| {} | {} | {:.1} | {:.1} | {:.2}× |", row.case, row.op, row.small, row.large, row.large / row.small);
    }
    println!("total {:.0?}", Duration::from_secs(started.elapsed().as_secs()));
}
