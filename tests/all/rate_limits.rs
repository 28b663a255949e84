//! Rate limits on both backends (guarantee 15): at most `limit` runs of one
//! key start in any window of `period`, counted where leases are made; a
//! job that cannot start yet goes back to wait, spending no attempt and
//! holding no slot, until the instant a start frees up for it.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jobhost::background::maintenance::{Maintenance, MaintenanceConfig};
use jobhost::store::{EnqueueParams, Error, FetchedJob, JobState, RunId};
use jobhost::template::KeyTemplate;
use jobhost::types::{ConcurrencyConfig, OnConflict, RateLimitConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use common::db::{TestDb, on_both_backends};
use common::http::TestServer;
use common::{completed, eventually, fetch_params, finish, job_config};

const WITHIN: Duration = Duration::from_secs(60);

/// Registers `name` with `limit` starts per `period_ms` per payload `key`,
/// and a concurrency limit when `slots` is given.
async fn rate_limited(db: &TestDb, name: &str, limit: u32, period_ms: u64, slots: Option<u32>) {
    let mut config = job_config(name);
    config.rate_limit = Some(RateLimitConfig { limit, period_ms, key: KeyTemplate::parse("{key}").unwrap() });
    config.concurrency = slots.map(|limit| ConcurrencyConfig {
        limit,
        key: KeyTemplate::parse("{key}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    db.store.job_types_register(&[(config, "v1".to_string())]).await.unwrap();
}

async fn enqueue_keyed(db: &TestDb, job: &str, keys: impl IntoIterator<Item = String>) -> Vec<i64> {
    let params: Vec<EnqueueParams> =
        keys.into_iter().map(|key| EnqueueParams::new(job, json!({ "key": key }))).collect();
    db.store.job_enqueue(&params).await.unwrap()
}

/// Enqueues jobs due a second ago: available at once, not planned by their
/// key (an enqueue plans only jobs due at once), so that their fetch is
/// what counts them, as it counts retries and children.
async fn enqueue_unplanned(db: &TestDb, job: &str, keys: impl IntoIterator<Item = String>) -> Vec<i64> {
    let due = chrono::Utc::now() - chrono::Duration::seconds(1);
    let params: Vec<EnqueueParams> = keys
        .into_iter()
        .map(|key| EnqueueParams { run_at: Some(due), ..EnqueueParams::new(job, json!({ "key": key })) })
        .collect();
    db.store.job_enqueue(&params).await.unwrap()
}

/// A timestamp column in milliseconds since the epoch, on either backend.
fn ms(db: &TestDb, column: &str) -> String {
    db.dialect(&format!("(extract(epoch FROM {column}) * 1000)::bigint"), column).to_string()
}

/// Every archived job's start time (ms, the database's clock), by key.
async fn starts_by_key(db: &TestDb) -> BTreeMap<String, Vec<i64>> {
    let rows: Vec<(String, i64)> =
        db.rows(format!("SELECT payload ->> 'key', {} FROM jobhost.archive", ms(db, "started_at"))).await;
    let mut by_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (key, start) in rows {
        by_key.entry(key).or_default().push(start);
    }
    by_key.values_mut().for_each(|starts| starts.sort());
    by_key
}

/// The most starts of one list that fall in a window `[s, s + period)`.
fn most_in_a_window(starts: &[i64], period_ms: i64) -> usize {
    (0..starts.len()).map(|i| starts[i..].iter().take_while(|s| **s < starts[i] + period_ms).count()).max().unwrap_or(0)
}

/// A maintenance service whose passes are an hour apart: only its timer of
/// due jobs can make a sent-back job available while a test runs.
fn due_timer_only(db: &TestDb) -> CancellationToken {
    let config = MaintenanceConfig { interval: Duration::from_secs(3600), ..Default::default() };
    let maintenance = Maintenance::new(db.dyn_store(), config).unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(maintenance.run(stop.clone()));
    stop
}

async fn a_key_starts_at_most_its_limit_and_the_rest_wait_for_their_instant(db: TestDb) {
    rate_limited(&db, "rl", 2, 1_000, None).await;
    let ids = enqueue_unplanned(&db, "rl", (0..5).map(|_| "a".to_string())).await;
    enqueue_unplanned(&db, "rl", ["b".to_string()]).await;

    let leased = db.fetch("rl", 10).await;
    let mut keys: Vec<String> = leased.iter().map(|j| j.payload["key"].as_str().unwrap().to_string()).collect();
    keys.sort();
    assert_eq!(keys, ["a", "a", "b"], "two of key a start, and key b's one: keys are counted apart");

    let started: i64 = db
        .scalar(format!(
            "SELECT min({}) FROM jobhost.jobs WHERE state = 'running' AND payload ->> 'key' = 'a'",
            ms(&db, "started_at")
        ))
        .await;
    let waiting: Vec<(i64, i64, i32)> = db
        .rows(format!(
            "SELECT id, {} - {started}, attempt FROM jobhost.jobs WHERE state = 'scheduled' ORDER BY run_at, id",
            ms(&db, "run_at")
        ))
        .await;
    assert_eq!(waiting.iter().map(|w| w.0).collect::<Vec<_>>(), ids[2..].to_vec(), "the rest of key a wait, in order");
    assert_eq!(
        waiting.iter().map(|w| w.1).collect::<Vec<_>>(),
        [1_000, 1_000, 2_000],
        "each waits for the instant a start frees up for it: one period after the starts, then another"
    );
    assert!(waiting.iter().all(|w| w.2 == 0), "waiting spent no attempt: {waiting:?}");
    assert!(db.fetch("rl", 10).await.is_empty(), "nothing of key a is available to fetch again");
}

async fn a_sent_back_job_becomes_available_when_its_start_frees_up(db: TestDb) {
    rate_limited(&db, "rl", 1, 300, None).await;
    let stop = due_timer_only(&db);
    let ids = enqueue_unplanned(&db, "rl", ["a".to_string(), "a".to_string()]).await;
    let first = db.fetch("rl", 10).await;
    assert_eq!(first.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[0]]);
    assert_eq!(db.state_of(ids[1]).await, JobState::Scheduled);
    eventually(WITHIN, || async { db.state_of(ids[1]).await == JobState::Available }).await;
    let second = db.fetch("rl", 10).await;
    assert_eq!(second.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[1]]);
    assert_eq!(second[0].attempt, 1, "its first attempt: the wait spent none");
    stop.cancel();
}

async fn a_sent_back_job_gives_back_its_concurrency_slot(db: TestDb) {
    rate_limited(&db, "both", 1, 60_000, Some(5)).await;
    enqueue_unplanned(&db, "both", (0..3).map(|_| "k".to_string())).await;
    let holders = || db.scalar("SELECT coalesce(sum(holders), 0) FROM jobhost.semaphores WHERE key = 'k'");
    assert_eq!(holders().await, 3, "each available job holds a slot");
    assert_eq!(db.fetch("both", 10).await.len(), 1);
    assert_eq!(holders().await, 1, "only the started job holds a slot: a waiting job holds none (guarantee 7)");
}

/// A result write that frees a concurrency slot promotes the next blocked
/// job, and on PostgreSQL leases it to the writing host when its fetch would
/// take it: that lease is a start, counted like any other.
async fn a_promotion_leased_by_a_result_write_is_counted(db: TestDb) {
    rate_limited(&db, "both", 1, 60_000, Some(1)).await;
    let ids = enqueue_unplanned(&db, "both", ["k".to_string(), "k".to_string()]).await;
    assert_eq!(db.state_of(ids[1]).await, JobState::Blocked);
    let holder = db.fetch("both", 1).await.remove(0);
    let (_, leased) = db
        .store
        .job_finish_and_fetch(vec![finish(&holder, completed())], &fetch_params("h", &["both"], 5))
        .await
        .unwrap();
    assert!(leased.is_empty(), "the key started a run within the minute: {leased:?}");
    assert_eq!(db.state_of(ids[1]).await, JobState::Scheduled, "promoted, then sent back to wait for its start");
}

async fn a_payload_without_the_rate_key_is_refused_at_enqueue(db: TestDb) {
    rate_limited(&db, "rl", 1, 1_000, None).await;
    let refused = db.store.job_enqueue(&[EnqueueParams::new("rl", json!({ "other": 1 }))]).await.unwrap_err();
    assert!(matches!(&refused, Error::InvalidEnqueue(reason) if reason.contains("rate")), "{refused}");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 0, "nothing stored");
}

/// Four fetchers at once, each completing what it leased, against three
/// keys limited to 3 starts per 400 ms, with only the due timer making
/// waiting jobs available: every job runs once, no window of any key holds
/// more than 3 starts, and no wait spent an attempt.
async fn racing_fetchers_never_overfill_a_window(db: TestDb) {
    const KEYS: usize = 3;
    const PER_KEY: usize = 12;
    rate_limited(&db, "rl", 3, 400, None).await;
    let stop = due_timer_only(&db);
    enqueue_keyed(&db, "rl", (0..KEYS * PER_KEY).map(|i| format!("k{}", i % KEYS))).await;
    let db = Arc::new(db);
    let fetchers: Vec<_> = (0..4)
        .map(|n| {
            let db = db.clone();
            tokio::spawn(async move {
                let params = fetch_params(&format!("h{n}"), &["rl"], 4);
                loop {
                    let leased: Vec<FetchedJob> = db.store.job_fetch(&params).await.unwrap();
                    if leased.is_empty() {
                        let left = db.scalar("SELECT count(*) FROM jobhost.jobs").await;
                        if left == 0 {
                            return;
                        }
                        db.store.job_wait_available(Duration::from_millis(50)).await;
                        continue;
                    }
                    db.store.job_finish(leased.iter().map(|j| finish(j, completed())).collect()).await.unwrap();
                }
            })
        })
        .collect();
    for fetcher in fetchers {
        tokio::time::timeout(WITHIN, fetcher).await.expect("drained").unwrap();
    }
    stop.cancel();

    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed' AND attempt = 1").await, 36);
    for (key, starts) in starts_by_key(&db).await {
        assert_eq!(starts.len(), PER_KEY);
        assert!(most_in_a_window(&starts, 400) <= 3, "key {key}: {starts:?}");
    }
}

/// Tenant A's backlog of 5,000 waits over its coming windows, planned at
/// its enqueue, so tenant B's 10 jobs enqueued after it are all leased by
/// the first fetch, beside A's first window: one turn, not 5,000 jobs.
async fn a_backlog_of_one_key_does_not_hold_back_another_key(db: TestDb) {
    rate_limited(&db, "rl", 10, 1_000, None).await;
    enqueue_keyed(&db, "rl", (0..5_000).map(|_| "a".to_string())).await;
    let small = enqueue_keyed(&db, "rl", (0..10).map(|_| "b".to_string())).await;
    let leased = db.fetch("rl", 20).await;
    let tenant = |job: &FetchedJob| job.payload["key"].as_str().unwrap().to_string();
    let mut b: Vec<i64> = leased.iter().filter(|j| tenant(j) == "b").map(|j| j.id).collect();
    b.sort();
    assert_eq!(b, small, "every job of B in the first fetch");
    assert_eq!(leased.iter().filter(|j| tenant(j) == "a").count(), 10, "and A's first window");

    // A's backlog waits, 10 a second, and no window holds more than 10.
    let planned: Vec<i64> = db
        .rows::<(i64,)>(format!(
            "SELECT {} FROM jobhost.jobs WHERE state = 'scheduled' AND payload ->> 'key' = 'a' ORDER BY run_at",
            ms(&db, "run_at")
        ))
        .await
        .into_iter()
        .map(|(at,)| at)
        .collect();
    assert_eq!(planned.len(), 4_990);
    assert_eq!(most_in_a_window(&planned, 1_000), 10);
    let spread = planned[4_989] - planned[0];
    assert!((498_999..=499_001).contains(&(spread + 1_000)), "499 more windows: {spread} ms");
    // A later job of A comes after the backlog, not beside its first window.
    let late = enqueue_keyed(&db, "rl", ["a".to_string()]).await[0];
    let late_at: i64 = db.scalar(format!("SELECT {} FROM jobhost.jobs WHERE id = {late}", ms(&db, "run_at"))).await;
    assert!(late_at >= planned[4_989], "the late job waits behind the backlog");
}

async fn a_throttled_key_is_seen_in_the_listing_the_api_the_metrics_and_the_cli(db: TestDb) {
    rate_limited(&db, "rl", 5, 1_000, None).await;
    enqueue_keyed(&db, "rl", (0..3).map(|_| "a".to_string())).await;
    let leased = db.fetch("rl", 2).await;
    let run = RunId { job_id: leased[0].id, lease_token: leased[0].lease_token };
    assert!(db.store.rate_throttle(run, 60_000).await.unwrap());
    let stale = RunId { lease_token: run.lease_token + 1_000, ..run };
    assert!(!db.store.rate_throttle(stale, 600_000).await.unwrap(), "a stale run throttles nothing");
    assert!(db.store.rate_throttle(run, 1).await.unwrap(), "a shorter throttle is counted, and shortens nothing");
    assert!(db.fetch("rl", 5).await.is_empty(), "the key's third job is held by the throttle");

    let keys = db.store.rate_key_list().await.unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let key = &keys[0];
    assert_eq!(
        (key.job.as_str(), key.key.as_str(), key.limit, key.period_ms, key.starts_in_window),
        ("rl", "a", Some(5), Some(1_000), 2)
    );
    assert_eq!((key.sent_back, key.throttles), (1, 2));
    assert!(key.throttled_secs.is_some_and(|secs| secs > 50.0), "the first throttle stands: {key:?}");

    let server = TestServer::start(db.dyn_store(), None).await;
    let listed = server.get("/api/rate-keys").await.json();
    assert_eq!(listed[0]["key"], "a");
    assert_eq!(listed[0]["sent_back"], 1);
    let metrics = server.get("/metrics").await.body;
    for sample in [
        "jobhost_rate_throttled_keys{job_type=\"rl\"} 1",
        "jobhost_rate_sent_back_total{job_type=\"rl\"} 1",
        "jobhost_rate_throttles_total{job_type=\"rl\"} 2",
    ] {
        assert!(metrics.lines().any(|line| line == sample), "{sample} in {metrics}");
    }

    let out = common::db::jobhost(&db, &["concurrency"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<_> = text.lines().collect();
    let at = lines.iter().position(|line| line.starts_with("rl \"a\"")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(lines[at], "rl \"a\": 2/5 starts in 1 s", "{text}");
    assert!(lines[at + 1].starts_with("  throttled "), "{text}");
    assert!(lines[at + 1].ends_with(" s more, 1 sent back, 2 throttles"), "{text}");
    assert!(lines.iter().all(|line| line.chars().count() <= 80), "fits a terminal: {text}");
}

/// An application's open transaction holding one key's row holds back only
/// that key: a fetch does not wait for it, leases the other key's job, and
/// leaves the held key's job available (not started, not sent back) until
/// the row is free (guarantee 13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applications_open_transaction_on_a_rate_key_holds_back_only_that_key() {
    let db = TestDb::new(common::db::Backend::Postgres).await;
    rate_limited(&db, "rl", 5, 1_000, None).await;
    let held = enqueue_keyed(&db, "rl", ["a".to_string()]).await[0];
    let mut app = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobhost.rate_keys WHERE job = 'rl' AND key = 'a' FOR UPDATE")
        .execute(&mut *app)
        .await
        .unwrap();
    let free = enqueue_unplanned(&db, "rl", ["b".to_string()]).await[0];
    let held_unplanned = enqueue_unplanned(&db, "rl", ["a".to_string()]).await[0];
    let leased =
        tokio::time::timeout(Duration::from_secs(10), db.fetch("rl", 10)).await.expect("the fetch does not wait");
    assert_eq!(leased.iter().map(|j| j.id).collect::<Vec<_>>(), [free]);
    assert_eq!(db.state_of(held_unplanned).await, JobState::Available, "passed over, not sent back");
    app.commit().await.unwrap();
    let mut leased: Vec<i64> = db.fetch("rl", 10).await.iter().map(|j| j.id).collect();
    leased.sort();
    assert_eq!(leased, [held, held_unplanned], "leased once the row is free");
}

/// The SQL enqueue does not check the rate key: a payload without it is
/// counted with its type as a whole, never unlimited, and the fetch that
/// meets it does not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_enqueued_from_sql_without_the_rate_key_is_limited_with_its_type() {
    let db = TestDb::new(common::db::Backend::Postgres).await;
    rate_limited(&db, "rl", 1, 60_000, None).await;
    for _ in 0..2 {
        db.execute("SELECT jobhost.enqueue('rl', '{\"other\": 1}')").await;
    }
    assert_eq!(db.fetch("rl", 10).await.len(), 1, "one start a minute, under the type's name");
    let keys = db.store.rate_key_list().await.unwrap();
    assert_eq!(keys.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(), ["rl"]);
    assert_eq!(keys[0].sent_back, 1);
}

/// A key's planned backlog runs within its limit, and each planned job is
/// sent back at most once: a job planned a period after an earlier planned
/// start becomes available at that instant, while the start it follows
/// happened a fetch later and leaves the window a moment after; the fetch
/// sends it back to that exact moment, where it fits (docs/rate-limits.md,
/// "Fair turns between keys"). A job bounced again and again would show as
/// more send-backs than planned jobs.
async fn a_planned_job_is_sent_back_at_most_once(db: TestDb) {
    const JOBS: i64 = 12;
    rate_limited(&db, "rl", 3, 300, None).await;
    let stop = due_timer_only(&db);
    enqueue_keyed(&db, "rl", (0..JOBS).map(|_| "a".to_string())).await;
    eventually(WITHIN, || async {
        let leased = db.fetch("rl", 10).await;
        db.store.job_finish(leased.iter().map(|job| finish(job, completed())).collect()).await.unwrap();
        db.scalar("SELECT count(*) FROM jobhost.archive").await == JOBS
    })
    .await;
    stop.cancel();
    let starts = &starts_by_key(&db).await["a"];
    assert!(most_in_a_window(starts, 300) <= 3, "never more than the limit in a window: {starts:?}");
    let sent_back = db.scalar("SELECT CAST(sum(deferred) AS BIGINT) FROM jobhost.rate_keys").await;
    assert!(sent_back <= JOBS - 3, "{sent_back} send-backs for {} planned jobs past the first window", JOBS - 3);
}

on_both_backends!(
    a_planned_job_is_sent_back_at_most_once,
    a_backlog_of_one_key_does_not_hold_back_another_key,
    a_throttled_key_is_seen_in_the_listing_the_api_the_metrics_and_the_cli,
    a_key_starts_at_most_its_limit_and_the_rest_wait_for_their_instant,
    a_sent_back_job_becomes_available_when_its_start_frees_up,
    a_sent_back_job_gives_back_its_concurrency_slot,
    a_promotion_leased_by_a_result_write_is_counted,
    a_payload_without_the_rate_key_is_refused_at_enqueue,
    racing_fetchers_never_overfill_a_window,
);
