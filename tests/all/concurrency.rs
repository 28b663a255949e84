//! Per-key concurrency limits on both backends, a real PostgreSQL and an
//! SQLite file (five, of notifications and row locks, are PostgreSQL's own): the
//! gate, blocking, promotion, the sweep and the repair (DESIGN.md
//! guarantees 1-4 and 7), one test per bug class the job systems we
//! descend from shipped.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use jobhost::store::{EnqueueParams, Error, FetchedJob, FinishOutcome, FinishResult, JobState};
use jobhost::template::KeyTemplate;
use jobhost::types::{ChildJob, ConcurrencyConfig, OnConflict, OnDuplicate, UniqueConfig, UniqueStrategy};
use serde_json::json;

use common::db::{Backend, TestDb, on_both_backends};
use common::{TestHost, completed, eventually, fetch_params, finish, job_config};

const WITHIN: Duration = Duration::from_secs(60);

/// Registers `name` limited to `limit` runs per payload `key`; `version`
/// stands for the component's digest, so a new version can change the limit.
async fn limited_type(db: &TestDb, name: &str, limit: u32, on_conflict: OnConflict, version: &str) {
    let mut config = job_config(name);
    config.concurrency =
        Some(ConcurrencyConfig { limit, key: KeyTemplate::parse("{key}").unwrap(), duration_secs: 30, on_conflict });
    db.store.job_types_register(&[(config, version.to_string())]).await.unwrap();
}

fn keyed(job: &str, key: &str) -> EnqueueParams {
    EnqueueParams::new(job, json!({ "key": key }))
}

async fn holders(db: &TestDb, job: &str, key: &str) -> i64 {
    db.scalar(format!("SELECT coalesce(sum(holders), 0) FROM jobhost.semaphores WHERE job = '{job}' AND key = '{key}'"))
        .await
}

fn maintenance(db: &TestDb) -> jobhost::background::maintenance::Maintenance {
    jobhost::background::maintenance::Maintenance::new(db.dyn_store(), Default::default()).unwrap()
}

async fn a_blocked_job_is_promoted_however_long_it_waited(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    db.enqueue_one(keyed("lim", "k")).await;
    let blocked = db.enqueue_one(keyed("lim", "k")).await;
    assert_eq!(db.state_of(blocked).await, JobState::Blocked);
    let holder = db.fetch("lim", 10).await.remove(0);

    // Blocked for a day, a thousand times its key's duration: sweeps pass over it.
    db.execute(db.dialect(
        "UPDATE jobhost.blocked_jobs SET parked_at = now() - interval '1 day', enqueued_at = now() - interval '1 day'",
        "UPDATE blocked_jobs SET parked_at = parked_at - 86400000, enqueued_at = enqueued_at - 86400000",
    ))
    .await;
    for _ in 0..3 {
        maintenance(&db).run_once(None).await.unwrap();
    }
    assert_eq!(db.state_of(blocked).await, JobState::Blocked, "still blocked while the holder runs");

    db.store.job_finish(vec![finish(&holder, completed())]).await.unwrap();
    assert_eq!(db.state_of(blocked).await, JobState::Available, "promoted by the holder's completion");
    assert_eq!(holders(&db, "lim", "k").await, 1);
}

async fn a_holder_heartbeating_past_its_duration_keeps_the_key_to_itself(db: TestDb) {
    // `serial`: limit 1 per key, duration 1 s (the floor at twice the 200 ms heartbeat).
    let host = TestHost::start(&db, &["serial"], |_| {}).await;
    let long = db.store.job_enqueue(&[EnqueueParams::new("serial", json!({"key": "k", "ms": 3500}))]).await.unwrap()[0];
    eventually(WITHIN, || async { db.state_of(long).await == JobState::Running }).await;
    let next = db.store.job_enqueue(&[EnqueueParams::new("serial", json!({"key": "k", "ms": 0}))]).await.unwrap()[0];
    eventually(WITHIN, || async { db.state_of(next).await == JobState::Completed }).await;
    host.stop().await;

    let long = db.store.job_get(long).await.unwrap().unwrap();
    let next = db.store.job_get(next).await.unwrap().unwrap();
    assert_eq!(long.row.state, JobState::Completed);
    assert_eq!(long.row.attempts, 1, "never presumed dead: {:?}", long.errors);
    let (long_out, next_out) = (long.output.unwrap(), next.output.unwrap());
    assert!(
        long_out["ended_ms"].as_u64().unwrap() - long_out["started_ms"].as_u64().unwrap() >= 3000,
        "ran past three durations"
    );
    assert!(
        next_out["started_ms"].as_u64().unwrap() >= long_out["ended_ms"].as_u64().unwrap(),
        "the second run started only after the first ended: {long_out} {next_out}"
    );
}

/// Up to 1.5 ms of random delay, spun rather than slept (the timer's
/// granularity is 1 ms), so both orders of a race and every overlap between
/// them get exercised.
async fn stagger() {
    let until = std::time::Instant::now() + Duration::from_micros(fastrand::u64(0..1_500));
    while std::time::Instant::now() < until {
        tokio::task::yield_now().await;
    }
}

async fn blocks_racing_finishing_holders_strand_nothing(db: TestDb) {
    const ROUNDS: usize = 300;
    const KEYS: usize = 4;
    const LIMIT: usize = 2;
    let db = Arc::new(db);
    limited_type(&db, "lim", LIMIT as u32, OnConflict::Block, "v1").await;

    // Each round fills every key, then ends one of each key's holders at the
    // same moment as a new job for that key arrives, so blocking a job races a
    // release on every key. Once both sides have returned, a key with a
    // blocked job and a free slot has stranded it: nothing is running that
    // would promote it (the other holder still runs, on purpose: when it
    // ends, its release would promote the stranded job and hide the bug).
    for round in 0..ROUNDS {
        for key in 0..KEYS {
            for _ in 0..LIMIT {
                db.enqueue_one(keyed("lim", &format!("k{key}"))).await;
            }
        }
        let holders = db.fetch("lim", (KEYS * LIMIT) as i64).await;
        assert_eq!(holders.len(), KEYS * LIMIT);
        let start = Arc::new(tokio::sync::Barrier::new(2 * KEYS));
        let mut racing = Vec::new();
        for holder in holders.iter().step_by(LIMIT).cloned() {
            let key = holder.concurrency_key.clone().unwrap();
            let (finisher_db, finisher_start) = (db.clone(), start.clone());
            racing.push(tokio::spawn(async move {
                finisher_start.wait().await;
                stagger().await;
                let done = finisher_db.store.job_finish(vec![finish(&holder, completed())]).await.unwrap();
                assert_eq!(done, vec![FinishResult::Done]);
            }));
            let (blocker_db, blocker_start) = (db.clone(), start.clone());
            racing.push(tokio::spawn(async move {
                blocker_start.wait().await;
                stagger().await;
                blocker_db.enqueue_one(keyed("lim", &key)).await;
            }));
        }
        for task in racing {
            task.await.unwrap();
        }
        let stranded = db
            .scalar(
                "SELECT count(*) FROM (SELECT DISTINCT job, concurrency_key FROM jobhost.blocked_jobs) b
                 LEFT JOIN jobhost.semaphores s ON s.job = b.job AND s.key = b.concurrency_key
                 WHERE coalesce(s.holders, 0) < 2",
            )
            .await;
        assert_eq!(stranded, 0, "round {round}: a blocked job waits beside a free slot");
        loop {
            let running = db.fetch("lim", 100).await;
            let still_held = db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'running'").await;
            if running.is_empty() && still_held == 0 {
                break;
            }
            let mut finishes: Vec<_> = running.iter().map(|job| finish(job, completed())).collect();
            finishes.extend(holders.iter().skip(1).step_by(LIMIT).map(|job| finish(job, completed())));
            db.store.job_finish(finishes).await.unwrap();
        }
        assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, 0, "round {round}: drained");
    }

    let total = (ROUNDS * KEYS * (LIMIT + 1)) as i64;
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed'").await, total);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 0, "every slot given back");
}

async fn a_stale_lease_tokens_completion_releases_nothing(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    db.enqueue_one(keyed("lim", "k")).await;
    let blocked = db.enqueue_one(keyed("lim", "k")).await;
    let first = db.fetch("lim", 1).await.remove(0);

    // The first host goes silent: its lease expires and the job is
    // redelivered with its slot still held; the blocked job stays blocked.
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (1, 0));
    assert_eq!(db.state_of(blocked).await, JobState::Blocked);
    let second = db.fetch("lim", 1).await.remove(0);
    assert_eq!(second.id, first.id);

    // The first host comes back and reports: a duplicate, which touches nothing.
    let stale = db.store.job_finish(vec![finish(&first, completed())]).await.unwrap();
    assert_eq!(stale, vec![FinishResult::Duplicate]);
    assert_eq!(holders(&db, "lim", "k").await, 1);
    assert_eq!(db.state_of(blocked).await, JobState::Blocked, "the stale completion promoted nothing");

    db.store.job_finish(vec![finish(&second, completed())]).await.unwrap();
    assert_eq!(db.state_of(blocked).await, JobState::Available);
    assert_eq!(holders(&db, "lim", "k").await, 1);
}

async fn every_blocked_payload_is_a_json_object(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    db.store.job_types_register(&[(job_config("parent"), "v1".into())]).await.unwrap();
    db.enqueue_one(keyed("lim", "k")).await;
    let holder = db.fetch("lim", 1).await.remove(0);

    // Blocked through every path: a single enqueue, a bulk one, the SQL
    // function (PostgreSQL's own), a child written with its parent's
    // completion, and a retry that came due.
    db.enqueue_one(keyed("lim", "k")).await;
    db.store.job_enqueue(&[keyed("lim", "k"), keyed("lim", "k")]).await.unwrap();
    if db.backend == Backend::Postgres {
        db.execute("SELECT jobhost.enqueue('lim', '{\"key\": \"k\", \"via\": \"sql\"}')").await;
    }
    db.store.job_enqueue(&[EnqueueParams::new("parent", json!({}))]).await.unwrap();
    let parent = db.fetch("parent", 1).await.remove(0);
    let child = ChildJob {
        job: "lim".into(),
        payload: json!({"key": "k", "nested": {"a": [1, 2]}}),
        queue: None,
        priority: None,
        delay_ms: None,
        batch: None,
    };
    let outcome = FinishOutcome::Completed {
        output: None,
        children: vec![child].into(),
        batches: Default::default(),
        workflows: Default::default(),
        events: Default::default(),
        schedules: Default::default(),
    };
    db.store.job_finish(vec![finish(&parent, outcome)]).await.unwrap();
    db.store
        .job_finish(vec![finish(&holder, FinishOutcome::Retry { error: "again".into(), delay_ms: 1 })])
        .await
        .unwrap();
    // The retry gave its slot back, so the first blocked job took it; take
    // that one too, so the retry finds the key busy when it comes due.
    let promoted = db.fetch("lim", 1).await;
    assert_eq!(promoted.len(), 1);
    let later = chrono::Utc::now() + chrono::Duration::minutes(1);
    db.store.job_promote_due(Some(later)).await.unwrap();

    let blocked = db.dialect("5", "4").parse::<i64>().unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, blocked);
    let not_object = db.dialect("jsonb_typeof(payload) <> 'object'", "json_type(payload) <> 'object'");
    assert_eq!(db.scalar(format!("SELECT count(*) FROM jobhost.blocked_jobs WHERE {not_object}")).await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs WHERE payload->>'key' = 'k'").await, blocked);
    let nested = db.dialect("payload #>> '{nested,a,1}' = '2'", "payload ->> '$.nested.a[1]' = 2");
    let nested = db.scalar(format!("SELECT count(*) FROM jobhost.blocked_jobs WHERE {nested}")).await;
    assert_eq!(nested, 1, "nested documents survive blocking");
}

async fn a_waiting_job_holds_no_slot(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    let delayed = EnqueueParams { delay_ms: Some(3_600_000), ..keyed("lim", "k") };
    let delayed = db.store.job_enqueue(&[delayed]).await.unwrap()[0];
    assert_eq!(db.state_of(delayed).await, JobState::Scheduled);
    assert_eq!(holders(&db, "lim", "k").await, 0, "a delayed job takes no slot while it waits");

    let now = db.enqueue_one(keyed("lim", "k")).await;
    assert_eq!(db.state_of(now).await, JobState::Available, "the key's slot was free for it");
    let running = db.fetch("lim", 1).await.remove(0);
    db.store
        .job_finish(vec![finish(&running, FinishOutcome::Retry { error: "again".into(), delay_ms: 3_600_000 })])
        .await
        .unwrap();
    assert_eq!(holders(&db, "lim", "k").await, 0, "a job in retry backoff takes no slot");
    let third = db.enqueue_one(keyed("lim", "k")).await;
    assert_eq!(db.state_of(third).await, JobState::Available);

    // Both come due while the third holds the key: they pass the gate and are blocked.
    let later = chrono::Utc::now() + chrono::Duration::hours(2);
    assert_eq!(db.store.job_promote_due(Some(later)).await.unwrap(), 2);
    assert_eq!(db.state_of(delayed).await, JobState::Blocked);
    assert_eq!(db.state_of(now).await, JobState::Blocked);
    assert_eq!(holders(&db, "lim", "k").await, 1);
}

async fn a_handed_back_job_keeps_its_slot(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    let first = db.enqueue_one(keyed("lim", "k")).await;
    let running = db.fetch("lim", 1).await.remove(0);
    let blocked = db.enqueue_one(keyed("lim", "k")).await;
    // A host shutting down hands the run back: the job is available again at
    // once, so nothing else may take its slot meanwhile.
    let release = FinishOutcome::Release { reason: "shutdown".into() };
    db.store.job_finish(vec![finish(&running, release)]).await.unwrap();
    assert_eq!(db.state_of(first).await, JobState::Available);
    assert_eq!(db.state_of(blocked).await, JobState::Blocked, "the slot stayed with the handed-back job");
    assert_eq!(holders(&db, "lim", "k").await, 1);
    let again = db.fetch("lim", 10).await;
    assert_eq!(again.iter().map(|j| j.id).collect::<Vec<_>>(), [first]);
}

/// Guarantee 4 with a paged sweep: a free key placed after thousands of busy
/// ones in key order is reached within one round of pages, each pass
/// visiting a page of keys whatever their state.
async fn a_free_key_is_promoted_within_one_round_of_pages_despite_thousands_of_busy_keys(db: TestDb) {
    const BUSY: usize = 2_000;
    const PAGE: usize = 100;
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    // Every busy key: one holder and one blocked job, blocked before the free
    // key's, and before it in key order ("busy-…" < "free").
    let busy: Vec<EnqueueParams> =
        (0..BUSY).flat_map(|i| [keyed("lim", &format!("busy-{i}")), keyed("lim", &format!("busy-{i}"))]).collect();
    db.store.job_enqueue(&busy).await.unwrap();
    db.enqueue_one(keyed("lim", "free")).await;
    let blocked = db.enqueue_one(keyed("lim", "free")).await;
    // Its holder vanishes by hand (an operator's DELETE), leaving the blocked
    // job behind a free slot that no completion will hand over.
    db.execute("DELETE FROM jobhost.jobs WHERE concurrency_key = 'free'").await;
    db.execute("DELETE FROM jobhost.semaphores WHERE key = 'free'").await;

    let config =
        jobhost::background::maintenance::MaintenanceConfig { promote_keys: PAGE as i64, ..Default::default() };
    let sweep = jobhost::background::maintenance::Maintenance::new(db.dyn_store(), config).unwrap();
    let round = (BUSY + 1).div_ceil(PAGE);
    let mut passes = 0;
    while db.state_of(blocked).await == JobState::Blocked {
        passes += 1;
        assert!(passes <= round, "not promoted within a round of {round} pages");
        let report = sweep.run_once(None).await.unwrap();
        assert!(report.unblocked <= 1, "only the free key can be promoted: {report:?}");
    }
    assert_eq!(passes, round, "the free key is the last key, reached by the round's last page");
    assert_eq!(db.state_of(blocked).await, JobState::Available);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, BUSY as i64);
}

/// The sweep visits a page of keys per pass in key order, busy or not, and
/// starts again from the first key after the last: with a page of 10 keys,
/// every other one free, a pass promotes the free keys of its page only
/// (an unpaged sweep promoted up to 10 free keys, oldest blocked first).
async fn the_sweep_visits_a_page_of_keys_per_pass_and_wraps(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    // Blocked newest-first in key order, so "oldest blocked first" would
    // start from the last key.
    let names: Vec<String> = (0..25).map(|i| format!("k{i:02}")).collect();
    for name in names.iter().rev() {
        db.store.job_enqueue(&[keyed("lim", name), keyed("lim", name)]).await.unwrap();
    }
    // Odd keys lose their holder by hand: a free slot nothing hands over.
    for name in names.iter().skip(1).step_by(2) {
        db.execute(format!("DELETE FROM jobhost.jobs WHERE concurrency_key = '{name}'")).await;
        db.execute(format!("DELETE FROM jobhost.semaphores WHERE key = '{name}'")).await;
    }
    let config = jobhost::background::maintenance::MaintenanceConfig { promote_keys: 10, ..Default::default() };
    let sweep = jobhost::background::maintenance::Maintenance::new(db.dyn_store(), config).unwrap();
    let promoted_keys = || async {
        let mut keys = Vec::new();
        for name in &names {
            let blocked =
                db.scalar(format!("SELECT count(*) FROM jobhost.blocked_jobs WHERE concurrency_key = '{name}'")).await;
            if blocked == 0 {
                keys.push(name.clone());
            }
        }
        keys
    };
    let expect = |upto: usize| -> Vec<String> { names.iter().take(upto).skip(1).step_by(2).cloned().collect() };
    assert_eq!(sweep.run_once(None).await.unwrap().unblocked, 5);
    assert_eq!(promoted_keys().await, expect(10), "the first page: k00-k09");
    assert_eq!(sweep.run_once(None).await.unwrap().unblocked, 5);
    assert_eq!(promoted_keys().await, expect(20), "the second page: k10-k19");
    assert_eq!(sweep.run_once(None).await.unwrap().unblocked, 2);
    assert_eq!(promoted_keys().await, expect(25), "the last page: k20-k24");
    // Back to the first key: a slot freed there is found by the next pass.
    db.execute("DELETE FROM jobhost.jobs WHERE concurrency_key = 'k00'").await;
    db.execute("DELETE FROM jobhost.semaphores WHERE key = 'k00'").await;
    assert_eq!(sweep.run_once(None).await.unwrap().unblocked, 1, "the sweep wrapped to the first page");
}

/// The repair checks a page of keys per pass and goes on from there: with a
/// page of 10, 25 keys with a wrong count (one with its row deleted) are
/// fixed 10, 10 and 5 at a time, in key order.
async fn the_repair_checks_a_page_of_keys_per_pass(db: TestDb) {
    limited_type(&db, "lim", 3, OnConflict::Block, "v1").await;
    let names: Vec<String> = (0..25).map(|i| format!("k{i:02}")).collect();
    let jobs: Vec<EnqueueParams> = names.iter().map(|name| keyed("lim", name)).collect();
    db.store.job_enqueue(&jobs).await.unwrap();
    db.execute("UPDATE jobhost.semaphores SET holders = 2").await;
    db.execute("DELETE FROM jobhost.semaphores WHERE key = 'k12'").await;
    let config = jobhost::background::maintenance::MaintenanceConfig { repair_keys: 10, ..Default::default() };
    let sweep = jobhost::background::maintenance::Maintenance::new(db.dyn_store(), config).unwrap();
    let wrong = || db.scalar("SELECT count(*) FROM jobhost.semaphores WHERE holders <> 1");
    assert_eq!(sweep.run_once(None).await.unwrap().repaired, 10);
    assert_eq!(wrong().await, 14, "k00-k09 fixed, k10-k24 left (k12 has no row)");
    assert_eq!(holders(&db, "lim", "k09").await, 1);
    assert_eq!(holders(&db, "lim", "k10").await, 2);
    assert_eq!(sweep.run_once(None).await.unwrap().repaired, 10);
    assert_eq!(holders(&db, "lim", "k12").await, 1, "the missing row is recreated in its page");
    assert_eq!(wrong().await, 5);
    assert_eq!(sweep.run_once(None).await.unwrap().repaired, 5);
    assert_eq!(wrong().await, 0);
    // Back to the first key.
    db.execute("UPDATE jobhost.semaphores SET holders = 3 WHERE key = 'k00'").await;
    assert_eq!(sweep.run_once(None).await.unwrap().repaired, 1, "the repair wrapped to the first page");
    assert!(db.store.semaphore_repair().await.unwrap().is_empty(), "nothing left to fix");
}

async fn raise_and_discard_leave_no_semaphore_residue(db: TestDb) {
    limited_type(&db, "rai", 1, OnConflict::Raise, "v1").await;
    limited_type(&db, "dis", 1, OnConflict::Discard, "v1").await;
    db.enqueue_one(keyed("rai", "k")).await;
    db.enqueue_one(keyed("dis", "k")).await;

    let refused = db.store.job_enqueue(&[keyed("rai", "k")]).await.unwrap_err();
    assert!(matches!(refused, Error::LimitReached(_)), "{refused}");
    assert!(refused.to_string().contains("all 1 slots of key \"k\" are taken"), "{refused}");
    // All or nothing: a batch with one refused job enqueues none, and the
    // slot its other job took is rolled back.
    let batch = db.store.job_enqueue(&[keyed("rai", "other"), keyed("rai", "k")]).await;
    assert!(matches!(batch, Err(Error::LimitReached(_))));
    if db.backend == Backend::Postgres {
        let sql =
            sqlx::query("SELECT jobhost.enqueue('rai', '{\"key\": \"k\"}')").execute(db.pool()).await.unwrap_err();
        assert_eq!(sql.as_database_error().and_then(|e| e.code()).as_deref(), Some("JHL01"));
    }

    let discarded = db.enqueue_one(keyed("dis", "k")).await;
    let detail = db.store.job_get(discarded).await.unwrap().unwrap();
    assert_eq!(detail.row.state, JobState::Discarded);
    assert!(detail.row.error.unwrap().contains("concurrency limit reached"));

    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 2, "only the two holders");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 2);
    assert_eq!(db.scalar("SELECT sum(holders) FROM jobhost.semaphores").await, 2);

    for job in ["rai", "dis"] {
        let holder = db.fetch(job, 1).await.remove(0);
        db.store.job_finish(vec![finish(&holder, completed())]).await.unwrap();
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 0, "no residue once the holders end");
}

async fn a_raised_limit_promotes_at_once_and_a_lowered_one_interrupts_nobody(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    let ids: Vec<i64> = db.store.job_enqueue(&[keyed("lim", "k"), keyed("lim", "k"), keyed("lim", "k")]).await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, 2);

    limited_type(&db, "lim", 3, OnConflict::Block, "v2").await;
    for id in &ids {
        assert_eq!(db.state_of(*id).await, JobState::Available, "a new version's higher limit applies at once");
    }
    let running = db.fetch("lim", 3).await;
    assert_eq!(running.len(), 3);

    limited_type(&db, "lim", 1, OnConflict::Block, "v3").await;
    for id in &ids {
        assert_eq!(db.state_of(*id).await, JobState::Running, "a lower limit stops no running holder");
    }
    let fourth = db.enqueue_one(keyed("lim", "k")).await;
    assert_eq!(db.state_of(fourth).await, JobState::Blocked);
    db.store.job_finish(vec![finish(&running[0], completed())]).await.unwrap();
    db.store.job_finish(vec![finish(&running[1], completed())]).await.unwrap();
    assert_eq!(db.state_of(fourth).await, JobState::Blocked, "still at the new limit of 1");
    db.store.job_finish(vec![finish(&running[2], completed())]).await.unwrap();
    assert_eq!(db.state_of(fourth).await, JobState::Available);
}

async fn cancel_works_on_blocked_and_admitted_jobs(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    let holder = db.enqueue_one(keyed("lim", "k")).await;
    let first_blocked = db.enqueue_one(keyed("lim", "k")).await;
    let second_blocked = db.enqueue_one(keyed("lim", "k")).await;

    db.store.job_cancel(first_blocked).await.unwrap();
    assert_eq!(db.state_of(first_blocked).await, JobState::Cancelled);
    db.store.job_cancel(holder).await.unwrap();
    assert_eq!(db.state_of(holder).await, JobState::Cancelled);
    assert_eq!(db.state_of(second_blocked).await, JobState::Available, "the cancelled holder's slot passed on");
    assert_eq!(holders(&db, "lim", "k").await, 1);
    let error = db.store.job_cancel(holder).await.unwrap_err();
    assert!(error.to_string().contains("is cancelled and cannot be cancelled"), "{error}");
}

/// A freed key whose semaphore row is gone (deleted by hand) still hands its
/// slot on in the same transaction: the release finds the key without a row
/// and promotes into it, rather than leaving the blocked job to the sweep.
async fn a_freed_key_without_its_row_still_promotes_its_blocked_job(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    let holder = db.enqueue_one(keyed("lim", "k")).await;
    let blocked = db.enqueue_one(keyed("lim", "k")).await;
    db.execute("DELETE FROM jobhost.semaphores WHERE key = 'k'").await;

    db.store.job_cancel(holder).await.unwrap();
    assert_eq!(db.state_of(blocked).await, JobState::Available, "promoted by the cancel, not left blocked");
    assert_eq!(holders(&db, "lim", "k").await, 1, "its row recreated with the one holder");
}

async fn the_repair_sweep_restores_hand_edited_semaphores(db: TestDb) {
    limited_type(&db, "lim", 2, OnConflict::Block, "v1").await;
    db.store.job_enqueue(&[keyed("lim", "a"), keyed("lim", "a"), keyed("lim", "a"), keyed("lim", "b")]).await.unwrap();
    db.execute("UPDATE jobhost.semaphores SET holders = 2 WHERE key = 'b'").await;
    db.execute("DELETE FROM jobhost.semaphores WHERE key = 'a'").await;

    let mut fixes = db.store.semaphore_repair().await.unwrap();
    fixes.sort_by(|x, y| x.key.cmp(&y.key));
    let summary: Vec<(&str, i32, i32)> = fixes.iter().map(|f| (f.key.as_str(), f.recorded, f.actual)).collect();
    assert_eq!(summary, vec![("a", 0, 2), ("b", 2, 1)]);
    assert_eq!(holders(&db, "lim", "a").await, 2);
    assert_eq!(holders(&db, "lim", "b").await, 1);
    assert!(db.store.semaphore_repair().await.unwrap().is_empty(), "nothing left to fix");
    // The repaired row keeps the key at its limit: the blocked job stays blocked.
    assert_eq!(maintenance(&db).run_once(None).await.unwrap().unblocked, 0);
}

async fn a_last_attempt_lost_with_its_host_gives_its_slot_to_a_blocked_job(db: TestDb) {
    let mut config = job_config("lim");
    config.max_attempts = 1;
    config.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{key}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    db.store.job_types_register(&[(config, "v1".into())]).await.unwrap();
    db.enqueue_one(keyed("lim", "k")).await;
    let blocked = db.enqueue_one(keyed("lim", "k")).await;
    let run = db.fetch("lim", 1).await.remove(0);
    common::confirm_started(&db, &[jobhost::store::RunId { job_id: run.id, lease_token: run.lease_token }]).await;
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (0, 1));
    assert_eq!(db.state_of(blocked).await, JobState::Available);
}

async fn the_concurrency_view_lists_holders_and_blocked_jobs(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    let holder = db.enqueue_one(keyed("lim", "k")).await;
    db.enqueue_one(keyed("lim", "k")).await;
    db.fetch("lim", 1).await;
    let keys = db.store.semaphore_list().await.unwrap();
    assert_eq!(keys.len(), 1);
    let key = &keys[0];
    assert_eq!((key.job.as_str(), key.key.as_str(), key.limit, key.holders, key.blocked), ("lim", "k", Some(1), 1, 1));
    assert_eq!(key.holding.len(), 1);
    assert_eq!((key.holding[0].id, key.holding[0].host_id.as_deref()), (holder, Some("h")));
    assert!(key.oldest_blocked_secs.is_some());
}

async fn a_guest_enqueue_refused_by_a_raise_limit_errs_at_the_call(db: TestDb) {
    let host = TestHost::start(&db, &["fanout", "limited_raise", "hello"], |_| {}).await;
    let fanout = |count: u64| {
        EnqueueParams::new("fanout", json!({"count": count, "job": "limited_raise", "child": {"key": "k", "ms": 0}}))
    };
    // Two slots: three children of one key are refused at the third call,
    // the two before it counted though none is written yet.
    let refused = db.store.job_enqueue(&[fanout(3)]).await.unwrap()[0];
    let fits = db.store.job_enqueue(&[fanout(2)]).await.unwrap()[0];
    eventually(WITHIN, || async {
        db.state_of(refused).await == JobState::Failed && db.state_of(fits).await == JobState::Completed
    })
    .await;
    let error = db.store.job_get(refused).await.unwrap().unwrap().row.error.unwrap();
    // The guest's own failure with the call's error, not a completion the gate refused later.
    assert!(error.starts_with("job \"limited_raise\" refused: concurrency limit reached: all 2 slots"), "{error}");
    eventually(WITHIN, || async {
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE job = 'limited_raise' AND state = 'completed'").await == 2
    })
    .await;
    host.stop().await;
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE job = 'limited_raise'").await,
        2,
        "the refused parent left no children"
    );
}

/// A write that frees a key leases what it promotes only in fetch order:
/// an available job ahead of the promoted one (a lower priority number)
/// takes the writing host's budget first, one behind it waits. A promoted
/// job leased by the write is an ordinary run: attempt counted, lease and
/// slot held, finished once.
async fn a_write_leases_its_promotions_in_fetch_order(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    db.store.job_types_register(&[(job_config("plain"), "v1".to_string())]).await.unwrap();
    let with_priority = |job: &str, key: Option<&str>, priority: i16| {
        let mut params = EnqueueParams::new(job, key.map_or(json!({}), |key| json!({ "key": key })));
        params.priority = Some(priority);
        params
    };
    let both = |budget| fetch_params("h", &["lim", "plain"], budget);
    db.store.job_enqueue(&[with_priority("lim", Some("k"), 5)]).await.unwrap();
    let holder = db.fetch("lim", 1).await.remove(0);

    // An available job of priority 0 comes first: the promoted job waits.
    let ids =
        db.store.job_enqueue(&[with_priority("lim", Some("k"), 5), with_priority("plain", None, 0)]).await.unwrap();
    let (promoted, first) = (ids[0], ids[1]);
    let (_, leased) = db.store.job_finish_and_fetch(vec![finish(&holder, completed())], &both(1)).await.unwrap();
    assert_eq!(leased.iter().map(|j| j.id).collect::<Vec<_>>(), [first], "the job ahead took the budget");
    assert_eq!(db.state_of(promoted).await, JobState::Available);
    assert_eq!(holders(&db, "lim", "k").await, 1, "the promoted job holds the slot while it waits");
    db.store.job_finish(vec![finish(&leased[0], completed())]).await.unwrap();

    // Behind it, an available job of priority 9 waits for the promoted one.
    let holder = db.fetch("lim", 1).await.remove(0);
    assert_eq!(holder.id, promoted);
    let ids =
        db.store.job_enqueue(&[with_priority("lim", Some("k"), 5), with_priority("plain", None, 9)]).await.unwrap();
    let (promoted, behind) = (ids[0], ids[1]);
    let (_, leased) = db.store.job_finish_and_fetch(vec![finish(&holder, completed())], &both(1)).await.unwrap();
    assert_eq!(leased.iter().map(|j| j.id).collect::<Vec<_>>(), [promoted], "the promoted job came first");
    assert_eq!(leased[0].attempt, 1);
    assert_eq!(leased[0].concurrency_key.as_deref(), Some("k"));
    assert_eq!(db.state_of(promoted).await, JobState::Running);
    assert_eq!(db.state_of(behind).await, JobState::Available);
    assert_eq!(holders(&db, "lim", "k").await, 1);

    // A budget of two takes the next promotion and the job behind it.
    let next = db.enqueue_one(keyed("lim", "k")).await;
    let (_, leased) = db.store.job_finish_and_fetch(vec![finish(&leased[0], completed())], &both(2)).await.unwrap();
    let mut got = leased.iter().map(|j| j.id).collect::<Vec<_>>();
    got.sort();
    assert_eq!(got, [next.min(behind), next.max(behind)]);
    db.store.job_finish(leased.iter().map(|j| finish(j, completed())).collect()).await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed'").await, 6);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 0, "every slot given back once");
}

/// A promoted job with a `while_executing` uniqueness key, leased by the
/// write that promoted it, runs with its claim bound to that run.
async fn a_promotion_leased_by_its_write_takes_its_while_executing_claim(db: TestDb) {
    let mut config = job_config("solo");
    config.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{key}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    config.unique = Some(UniqueConfig {
        key: KeyTemplate::parse("{u}").unwrap(),
        strategy: UniqueStrategy::WhileExecuting,
        on_duplicate: OnDuplicate::Skip,
    });
    db.store.job_types_register(&[(config, "v1".to_string())]).await.unwrap();
    let params = || EnqueueParams::new("solo", json!({"key": "k", "u": "x"}));
    db.store.job_enqueue(&[params()]).await.unwrap();
    let holder = db.fetch("solo", 1).await.remove(0);
    let promoted = db.store.job_enqueue(&[params()]).await.unwrap()[0];
    assert_eq!(db.state_of(promoted).await, JobState::Blocked);

    let (_, leased) = db
        .store
        .job_finish_and_fetch(vec![finish(&holder, completed())], &fetch_params("h", &["solo"], 1))
        .await
        .unwrap();
    assert_eq!(leased.iter().map(|j| j.id).collect::<Vec<_>>(), [promoted]);
    let claims = db.rows::<(i64, i64)>("SELECT job_id, lease_token FROM jobhost.unique_claims").await;
    assert_eq!(claims, [(promoted, leased[0].lease_token)], "the run holds its while_executing claim");
}

/// A write leases no promotion of a paused queue: the promoted job waits,
/// available and holding its slot, until the queue resumes.
async fn a_write_leases_no_promotion_of_a_paused_queue(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    db.enqueue_one(keyed("lim", "k")).await;
    let holder = db.fetch("lim", 1).await.remove(0);
    let promoted = db.enqueue_one(keyed("lim", "k")).await;
    assert!(db.store.queue_pause("default").await.unwrap());
    let (_, leased) = db
        .store
        .job_finish_and_fetch(vec![finish(&holder, completed())], &fetch_params("h", &["lim"], 1))
        .await
        .unwrap();
    assert!(leased.is_empty(), "a paused queue's promotion was leased");
    assert_eq!(db.state_of(promoted).await, JobState::Available);
    assert_eq!(holders(&db, "lim", "k").await, 1);
    assert!(db.store.queue_resume("default").await.unwrap());
    assert_eq!(db.fetch("lim", 1).await.iter().map(|j| j.id).collect::<Vec<_>>(), [promoted]);
}

/// One write that frees many keys (a result write carries a result per key
/// in the serial shape) gives each key exactly its freed slots, to its own
/// blocked jobs in promotion order (priority, then arrival), counts every
/// holder, and deletes the semaphore of a key left with none.
async fn one_write_freeing_many_keys_fills_each_in_promotion_order(db: TestDb) {
    limited_type(&db, "lim", 2, OnConflict::Block, "v1").await;
    let with_priority = |key: &str, priority: i16| {
        let mut params = keyed("lim", key);
        params.priority = Some(priority);
        params
    };
    let keys = ["a", "b", "c"];
    for key in keys {
        db.store.job_enqueue(&[keyed("lim", key), keyed("lim", key)]).await.unwrap();
    }
    db.enqueue_one(keyed("lim", "alone")).await;
    // Per key, blocked: one at priority 5, one at 1, another at 5, one at 0.
    let mut blocked = Vec::new();
    for key in keys {
        let ids = db
            .store
            .job_enqueue(&[with_priority(key, 5), with_priority(key, 1), with_priority(key, 5), with_priority(key, 0)])
            .await
            .unwrap();
        blocked.push(ids);
    }
    let holders_now = db.fetch("lim", 100).await;
    assert_eq!(holders_now.len(), 7, "two holders per key and the lone one");

    db.store.job_finish(holders_now.iter().map(|job| finish(job, completed())).collect()).await.unwrap();
    for (key, ids) in keys.iter().zip(&blocked) {
        let states = [
            db.state_of(ids[0]).await,
            db.state_of(ids[1]).await,
            db.state_of(ids[2]).await,
            db.state_of(ids[3]).await,
        ];
        use JobState::{Available, Blocked};
        assert_eq!(states, [Blocked, Available, Blocked, Available], "key {key}: priorities 0 and 1 first");
        assert_eq!(holders(&db, "lim", key).await, 2, "key {key}");
    }
    let lone = db.scalar("SELECT count(*) FROM jobhost.semaphores WHERE key = 'alone'").await;
    assert_eq!(lone, 0, "a key left with no holder keeps no semaphore");

    // A slot freed in each key again: the older of the two at priority 5 goes first.
    let running = db.fetch("lim", 100).await;
    assert_eq!(running.len(), 6);
    let firsts: Vec<i64> = blocked.iter().map(|ids| ids[3]).collect();
    let ending: Vec<_> =
        running.iter().filter(|job| firsts.contains(&job.id)).map(|job| finish(job, completed())).collect();
    assert_eq!(ending.len(), 3);
    db.store.job_finish(ending).await.unwrap();
    for (key, ids) in keys.iter().zip(&blocked) {
        assert_eq!(db.state_of(ids[0]).await, JobState::Available, "key {key}: the older job at priority 5");
        assert_eq!(db.state_of(ids[2]).await, JobState::Blocked, "key {key}: the younger job at priority 5");
        assert_eq!(holders(&db, "lim", key).await, 2, "key {key}");
    }
}

/// A job of `job` on `key` at `priority`.
fn keyed_at(job: &str, key: &str, priority: i16) -> EnqueueParams {
    EnqueueParams { priority: Some(priority), ..keyed(job, key) }
}

/// One bulk enqueue over many keys of three types: each key is decided by
/// its own holders, limit and `on_conflict`, its free slots going to its
/// jobs by priority then arrival, and each discarded job carries its own
/// key in its reason (the gate decides all keys at once).
async fn one_bulk_enqueue_decides_every_key_by_its_own_rules(db: TestDb) {
    limited_type(&db, "two", 2, OnConflict::Block, "v1").await;
    limited_type(&db, "dis", 1, OnConflict::Discard, "v1").await;
    db.store.job_types_register(&[(job_config("plain"), "v1".into())]).await.unwrap();
    let holder = db.enqueue_one(keyed("two", "a")).await;
    let jobs = vec![
        keyed_at("two", "a", 5),
        keyed("dis", "y"),
        keyed_at("two", "a", 0),
        keyed_at("two", "b", 5),
        keyed("dis", "x"),
        EnqueueParams::new("plain", json!({})),
        keyed_at("two", "b", 5),
        keyed("dis", "y"),
        keyed_at("two", "b", 1),
        keyed("dis", "x"),
        keyed("dis", "y"),
    ];
    let ids = db.store.job_enqueue(&jobs).await.unwrap();
    assert_eq!(ids.len(), jobs.len(), "an id for every job, in input order");
    let state = |i: usize| db.state_of(ids[i]);
    // two:a had one holder: its one free slot goes to the priority-0 job.
    assert_eq!(db.state_of(holder).await, JobState::Available);
    assert_eq!(state(2).await, JobState::Available, "two:a, priority 0");
    assert_eq!(state(0).await, JobState::Blocked, "two:a, priority 5");
    // two:b: priority 1 first, then the older of the two at priority 5.
    assert_eq!(state(8).await, JobState::Available, "two:b, priority 1");
    assert_eq!(state(3).await, JobState::Available, "two:b, the older priority 5");
    assert_eq!(state(6).await, JobState::Blocked, "two:b, the younger priority 5");
    assert_eq!(state(5).await, JobState::Available, "the job without a key");
    for (i, key, expected) in [
        (4, "x", JobState::Available),
        (9, "x", JobState::Discarded),
        (1, "y", JobState::Available),
        (7, "y", JobState::Discarded),
        (10, "y", JobState::Discarded),
    ] {
        let detail = db.store.job_get(ids[i]).await.unwrap().unwrap();
        assert_eq!(detail.row.state, expected, "dis:{key}, job {i}");
        if expected == JobState::Discarded {
            let error = detail.row.error.unwrap();
            assert!(error.contains(&format!("all 1 slots of key \"{key}\" are taken")), "job {i}: {error}");
        }
    }
    for (job, key, expected) in [("two", "a", 2), ("two", "b", 2), ("dis", "x", 1), ("dis", "y", 1)] {
        assert_eq!(holders(&db, job, key).await, expected, "{job}:{key}");
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, 2);
    // Ids ascend in input order whichever table a job went into, and no
    // later job gets one of them (SQLite writes blocked and discarded jobs
    // with ids taken from the jobs table's counter).
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in input order: {ids:?}");
    let stored = db
        .scalar(format!(
            "SELECT (SELECT count(*) FROM jobhost.jobs WHERE id BETWEEN {first} AND {last})
                  + (SELECT count(*) FROM jobhost.blocked_jobs WHERE id BETWEEN {first} AND {last})
                  + (SELECT count(*) FROM jobhost.archive WHERE id BETWEEN {first} AND {last})",
            first = ids[0],
            last = ids[ids.len() - 1]
        ))
        .await;
    assert_eq!(stored, jobs.len() as i64, "every job stored once under its id");
    let next = db.enqueue_new("plain", json!({})).await;
    assert!(next > ids[ids.len() - 1], "the next job's id {next} follows the call's {ids:?}");
}

/// A `raise` limit anywhere in a bulk enqueue over a thousand keys refuses
/// the whole call, naming the key, and leaves nothing behind: no job, no
/// blocked job, no semaphore taken by the keys the gate passed before it.
async fn a_raise_anywhere_in_a_bulk_enqueue_stores_nothing(db: TestDb) {
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    limited_type(&db, "rai", 1, OnConflict::Raise, "v1").await;
    let mut jobs: Vec<EnqueueParams> = (0..2_000).map(|i| keyed("lim", &format!("k{}", i % 1_000))).collect();
    jobs.insert(700, keyed("rai", "r-late"));
    jobs.insert(300, keyed("rai", "r-late"));
    let refused = db.store.job_enqueue(&jobs).await.unwrap_err();
    assert!(matches!(refused, Error::LimitReached(_)), "{refused}");
    assert!(refused.to_string().contains("key \"r-late\""), "{refused}");
    for table in ["jobs", "blocked_jobs", "semaphores", "archive"] {
        assert_eq!(db.scalar(format!("SELECT count(*) FROM jobhost.{table}")).await, 0, "{table}");
    }
    // Without the second rai job, the same call goes in: 1,000 holders, 1,000 blocked.
    jobs.remove(300);
    db.store.job_enqueue(&jobs).await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'available'").await, 1_001);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, 1_000);
    assert_eq!(db.scalar("SELECT sum(holders) FROM jobhost.semaphores").await, 1_001);
}

/// Eight enqueuers at once, each sending bulk calls over the same 200 keys
/// in its own order: the gate takes keys in key order whatever the input's,
/// so none deadlocks (PostgreSQL would abort one with 40P01), and every
/// key ends with exactly `limit` holders, as many available jobs as holders,
/// and the rest blocked, nothing lost.
async fn concurrent_bulk_enqueues_over_shared_keys_never_deadlock_nor_overfill(db: TestDb) {
    limited_type(&db, "lim", 2, OnConflict::Block, "v1").await;
    let db = Arc::new(db);
    let mut enqueuers = Vec::new();
    for enqueuer in 0..8u64 {
        let db = db.clone();
        enqueuers.push(tokio::spawn(async move {
            for call in 0..5u64 {
                // A different order of the keys per call and per enqueuer.
                let stride = [1, 3, 7, 9, 11, 13, 17, 19][enqueuer as usize] + 20 * call;
                let jobs: Vec<EnqueueParams> =
                    (0..400u64).map(|i| keyed("lim", &format!("k{:03}", (i * stride + enqueuer) % 200))).collect();
                db.store.job_enqueue(&jobs).await.unwrap();
            }
        }));
    }
    for enqueuer in enqueuers {
        enqueuer.await.unwrap();
    }
    let stored = db.scalar("SELECT count(*) FROM jobhost.jobs").await
        + db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await;
    assert_eq!(stored, 16_000, "every job stored");
    let keys: Vec<(String, i64, i64, i64)> = db
        .rows(
            "SELECT s.key, CAST(s.holders AS BIGINT),
                    (SELECT count(*) FROM jobhost.jobs j WHERE j.job = s.job AND j.concurrency_key = s.key),
                    (SELECT count(*) FROM jobhost.blocked_jobs b WHERE b.job = s.job AND b.concurrency_key = s.key)
             FROM jobhost.semaphores s ORDER BY s.key",
        )
        .await;
    assert_eq!(keys.len(), 200, "every key has its semaphore");
    for (key, holders, available, blocked) in keys {
        assert_eq!((holders, available, available + blocked), (2, 2, 80), "key {key}");
    }
}

on_both_backends!(
    one_bulk_enqueue_decides_every_key_by_its_own_rules,
    a_raise_anywhere_in_a_bulk_enqueue_stores_nothing,
    concurrent_bulk_enqueues_over_shared_keys_never_deadlock_nor_overfill,
    one_write_freeing_many_keys_fills_each_in_promotion_order,
    a_write_leases_no_promotion_of_a_paused_queue,
    a_write_leases_its_promotions_in_fetch_order,
    a_promotion_leased_by_its_write_takes_its_while_executing_claim,
    a_handed_back_job_keeps_its_slot,
    a_blocked_job_is_promoted_however_long_it_waited,
    a_holder_heartbeating_past_its_duration_keeps_the_key_to_itself,
    a_stale_lease_tokens_completion_releases_nothing,
    every_blocked_payload_is_a_json_object,
    a_waiting_job_holds_no_slot,
    raise_and_discard_leave_no_semaphore_residue,
    a_raised_limit_promotes_at_once_and_a_lowered_one_interrupts_nobody,
    cancel_works_on_blocked_and_admitted_jobs,
    a_freed_key_without_its_row_still_promotes_its_blocked_job,
    the_repair_sweep_restores_hand_edited_semaphores,
    a_last_attempt_lost_with_its_host_gives_its_slot_to_a_blocked_job,
    the_concurrency_view_lists_holders_and_blocked_jobs,
    a_guest_enqueue_refused_by_a_raise_limit_errs_at_the_call,
    blocks_racing_finishing_holders_strand_nothing,
    a_free_key_is_promoted_within_one_round_of_pages_despite_thousands_of_busy_keys,
    the_sweep_visits_a_page_of_keys_per_pass_and_wraps,
    the_repair_checks_a_page_of_keys_per_pass,
);

/// The payload of the next notification `listener` receives.
async fn announced(listener: &mut sqlx::postgres::PgListener) -> String {
    let next = tokio::time::timeout(WITHIN, listener.recv()).await.expect("a notification");
    next.unwrap().payload().to_string()
}

/// PostgreSQL only: a result whose write promotes a blocked job and leases
/// it in the same call announces nothing, so idle hosts do not each run an
/// empty fetch for a job already taken; a promotion the write leaves, to a
/// host of other queues or to no fetch at all, is announced. Absence is shown
/// by order: notifications arrive in commit order, so a sentinel sent after
/// the write must be the first to arrive.
#[tokio::test]
async fn only_promotions_the_writing_host_did_not_lease_are_announced() {
    let db = TestDb::postgres().await;
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    db.enqueue_one(keyed("lim", "k")).await;
    let blocked = [
        db.enqueue_one(keyed("lim", "k")).await,
        db.enqueue_one(keyed("lim", "k")).await,
        db.enqueue_one(keyed("lim", "k")).await,
    ];
    let holder = db.fetch("lim", 10).await.remove(0);
    let mut listener = sqlx::postgres::PgListener::connect_with(db.pool()).await.unwrap();
    listener.listen("jobhost_available").await.unwrap();
    let sentinel = || sqlx::query("SELECT pg_notify('jobhost_available', 'sentinel')").execute(db.pool());

    // Leased by the write that promoted it: nobody is told.
    let (_, leased) = db
        .store
        .job_finish_and_fetch(vec![finish(&holder, completed())], &fetch_params("h", &["lim"], 1))
        .await
        .unwrap();
    assert_eq!(leased.iter().map(|j| j.id).collect::<Vec<_>>(), [blocked[0]]);
    sentinel().await.unwrap();
    assert_eq!(announced(&mut listener).await, "sentinel", "a promotion its own write leased was announced");

    // The writing host serves other queues: the promotion is left, and told.
    let mut elsewhere = fetch_params("h", &["lim"], 1);
    elsewhere.queues = vec!["elsewhere".into()];
    let (_, leased_elsewhere) =
        db.store.job_finish_and_fetch(vec![finish(&leased[0], completed())], &elsewhere).await.unwrap();
    assert!(leased_elsewhere.is_empty());
    sentinel().await.unwrap();
    assert_eq!(announced(&mut listener).await, "", "a promotion left by the write's fetch was not announced");
    assert_eq!(announced(&mut listener).await, "sentinel");

    // A write that fetches nothing announces its promotion too.
    let next = db.fetch("lim", 1).await.remove(0);
    assert_eq!(next.id, blocked[1]);
    db.store.job_finish(vec![finish(&next, completed())]).await.unwrap();
    sentinel().await.unwrap();
    assert_eq!(announced(&mut listener).await, "", "a promotion by a write without a fetch was not announced");
    assert_eq!(announced(&mut listener).await, "sentinel");
    assert_eq!(db.state_of(blocked[2]).await, JobState::Available);
}

/// PostgreSQL only (SQLite's writers take the whole file's lock): an
/// application's open transaction holding a `jobhost.enqueue` of a key
/// holds that key's semaphore until it commits. Only that key's results
/// wait for it; other keys' and unlimited jobs' results, and every lease
/// renewal, go on. Once it commits, the waiting result is written once and
/// the key's next job runs.
#[tokio::test]
async fn an_applications_open_transaction_holds_back_only_its_own_key() {
    let db = TestDb::postgres().await;
    let host = TestHost::start(&db, &["serial", "hello"], |_| {}).await;
    let client = jobhost::Client::from_store(db.dyn_store());
    let holder = client.enqueue("serial", json!({"key": "a", "ms": 300})).await.unwrap();
    let running = format!("SELECT count(*) FROM jobhost.jobs WHERE id = {holder} AND state = 'running'");
    eventually(WITHIN, || async { db.scalar(&running).await == 1 }).await;

    let mut application = db.pool().begin().await.unwrap();
    let app_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *application).await.unwrap();
    let blocked: i64 = sqlx::query_scalar("SELECT jobhost.enqueue('serial', '{\"key\": \"a\", \"ms\": 0}')")
        .fetch_one(&mut *application)
        .await
        .unwrap();
    // The holder's guest returns, and the write of its result waits for key a.
    let waiting = format!("SELECT count(*) FROM pg_stat_activity WHERE {app_pid} = ANY(pg_blocking_pids(pid))");
    eventually(WITHIN, || async { db.scalar(&waiting).await > 0 }).await;
    // Then other work arrives; none of it may wait for key a.
    let others: Vec<EnqueueParams> = (0..5)
        .map(|_| EnqueueParams::new("serial", json!({"key": "b", "ms": 0})))
        .chain((0..40).map(|_| EnqueueParams::new("hello", json!({}))))
        .collect();
    db.store.job_enqueue(&others).await.unwrap();
    let others_done = "SELECT count(*) FROM jobhost.archive WHERE job = 'hello' OR concurrency_key = 'b'";
    eventually(WITHIN, || async { db.scalar(others_done).await == 45 }).await;
    // The holder's result waits for key a, its run over and its lease kept.
    assert_eq!(db.scalar(&running).await, 1, "the holder's result waits for its key");
    assert_eq!(db.scalar(format!("SELECT count(*) FROM jobhost.archive WHERE id = {holder}")).await, 0);

    application.commit().await.unwrap();
    let done =
        format!("SELECT count(*) FROM jobhost.archive WHERE id IN ({holder}, {blocked}) AND state = 'completed'");
    eventually(WITHIN, || async { db.scalar(&done).await == 2 }).await;
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 0, "the slot was given back once");
    host.stop().await;
}

/// A bulk enqueue over a thousand keys, one of which an application's open
/// transaction holds (it enqueued a job of that key and has not
/// committed): the bulk waits for that one key's row, holding the keys
/// before it in key order, while a bulk over other keys goes in at once.
/// What it decides for the key follows what the application did: after a
/// commit the key is full and the bulk's job of it is blocked; after a
/// rollback the bulk's job takes the slot. Either way every key ends with
/// exactly its limit of holders and nothing is lost. Both ways of locking
/// a call's keys are covered: keys new to the bulk (created or waited for
/// by the upsert), and keys that all exist already, each with a holder of
/// two slots (locked and read in one statement; a read from before the
/// wait would take k500's second slot twice, which the guarded update
/// refuses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_enqueue_waits_for_an_applications_open_transaction_on_one_of_its_keys() {
    for (commit, existing) in [(true, false), (false, false), (true, true), (false, true)] {
        let db = TestDb::postgres().await;
        let limit = if existing { 2 } else { 1 };
        limited_type(&db, "lim", limit, OnConflict::Block, "v1").await;
        let bulk_jobs: Vec<EnqueueParams> = (0..1_000).map(|i| keyed("lim", &format!("k{i}"))).collect();
        if existing {
            db.store.job_enqueue(&bulk_jobs).await.unwrap();
        }
        let mut application = db.pool().begin().await.unwrap();
        let app_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *application).await.unwrap();
        let app_job: i64 = sqlx::query_scalar("SELECT jobhost.enqueue('lim', '{\"key\": \"k500\"}')")
            .fetch_one(&mut *application)
            .await
            .unwrap();
        let store = db.dyn_store();
        let jobs = bulk_jobs.clone();
        let bulk = tokio::spawn(async move { store.job_enqueue(&jobs).await });
        let waiting = format!("SELECT count(*) FROM pg_stat_activity WHERE {app_pid} = ANY(pg_blocking_pids(pid))");
        eventually(WITHIN, || async { db.scalar(&waiting).await > 0 }).await;
        let others: Vec<EnqueueParams> = (0..100).map(|i| keyed("lim", &format!("other{i}"))).collect();
        db.store.job_enqueue(&others).await.unwrap();
        assert!(!bulk.is_finished(), "the bulk over k500 still waits for the application");
        if commit {
            application.commit().await.unwrap();
        } else {
            application.rollback().await.unwrap();
        }
        let ids = bulk.await.unwrap().unwrap();
        assert_eq!(ids.len(), 1_000);
        let round = format!("commit: {commit}, keys existing: {existing}");
        let expected = if commit { JobState::Blocked } else { JobState::Available };
        assert_eq!(db.state_of(ids[500]).await, expected, "the bulk's k500 job, {round}");
        let app_rows = db.scalar(format!("SELECT count(*) FROM jobhost.jobs WHERE id = {app_job}")).await;
        assert_eq!(app_rows, i64::from(commit), "the application's job exists only if it committed, {round}");
        let off = format!("SELECT count(*) FROM jobhost.semaphores WHERE key LIKE 'k%' AND holders <> {limit}");
        assert_eq!(db.scalar(off).await, 0, "every key of the bulk at its limit, {round}");
        let others_off = "SELECT count(*) FROM jobhost.semaphores WHERE key LIKE 'other%' AND holders <> 1";
        assert_eq!(db.scalar(others_off).await, 0, "{round}");
        assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 1_100, "{round}");
        let available = db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'available'").await;
        assert_eq!(available, 1_000 * i64::from(limit) + 100, "as many available jobs as holders, {round}");
        assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, i64::from(commit), "{round}");
    }
}

/// A bulk enqueue over a thousand keys, all full, one of whose last
/// holder another transaction is releasing (its job gone, the key's row
/// deleted with its last slot, not yet committed): the bulk locks the
/// keys' rows in key order and waits at that one. After a commit the row
/// is gone, so the bulk gives back what it locked and creates the row
/// anew in one upsert, and its job of the key takes the free slot; after
/// a rollback the key is full again and the job is blocked. Every key
/// ends with exactly its one holder, and no job is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_enqueue_waiting_for_a_key_whose_last_holder_leaves_takes_the_freed_slot() {
    for commit in [true, false] {
        let db = TestDb::postgres().await;
        limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
        let bulk_jobs: Vec<EnqueueParams> = (0..1_000).map(|i| keyed("lim", &format!("k{i}"))).collect();
        let holders_ids = db.store.job_enqueue(&bulk_jobs).await.unwrap();
        let mut releasing = db.pool().begin().await.unwrap();
        let releasing_pid: i32 =
            sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *releasing).await.unwrap();
        sqlx::query("DELETE FROM jobhost.jobs WHERE id = $1")
            .bind(holders_ids[500])
            .execute(&mut *releasing)
            .await
            .unwrap();
        sqlx::query("SELECT jobhost.release_slots(ARRAY['lim'], ARRAY['k500'])")
            .execute(&mut *releasing)
            .await
            .unwrap();
        let store = db.dyn_store();
        let jobs = bulk_jobs.clone();
        let bulk = tokio::spawn(async move { store.job_enqueue(&jobs).await });
        let waiting =
            format!("SELECT count(*) FROM pg_stat_activity WHERE {releasing_pid} = ANY(pg_blocking_pids(pid))");
        eventually(WITHIN, || async { db.scalar(&waiting).await > 0 }).await;
        assert!(!bulk.is_finished(), "the bulk waits for k500's row");
        if commit {
            releasing.commit().await.unwrap();
        } else {
            releasing.rollback().await.unwrap();
        }
        let ids = bulk.await.unwrap().unwrap();
        assert_eq!(ids.len(), 1_000);
        let round = format!("commit: {commit}");
        let expected = if commit { JobState::Available } else { JobState::Blocked };
        assert_eq!(db.state_of(ids[500]).await, expected, "the bulk's k500 job, {round}");
        assert_eq!(db.state_of(ids[499]).await, JobState::Blocked, "{round}");
        assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores WHERE holders = 1").await, 1_000, "{round}");
        assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 1_000, "{round}");
        let available = db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'available'").await;
        assert_eq!(available, 1_000, "one available job a key, {round}");
        let blocked = db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await;
        assert_eq!(blocked, 999 + i64::from(!commit), "{round}");
    }
}

/// A bulk enqueue finds its keys' semaphore rows one index probe at a
/// time, in key order, however many keys are held elsewhere. The planner
/// used to join a call's keys to the whole semaphores table by hashing it,
/// so every call of thousands of keys read every row, and its cost grew
/// with the keys held anywhere. Both ways a call reads its rows are
/// covered: every key existing (locked as it is read), and some new
/// (created by an upsert, then read).
#[tokio::test]
async fn a_bulk_enqueue_reads_only_its_own_keys_semaphore_rows() {
    let db = TestDb::postgres().await;
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    let held: Vec<EnqueueParams> = (0..20_000).map(|i| keyed("lim", &format!("k{i}"))).collect();
    for chunk in held.chunks(5_000) {
        db.store.job_enqueue(chunk).await.unwrap();
    }
    sqlx::query("ANALYZE jobhost.semaphores").execute(db.pool()).await.unwrap();
    for (round, keys) in [("every key full", 0..1_000), ("half the keys new", 19_500..20_500)] {
        let mut tx = db.pool().begin().await.unwrap();
        let jobs: Vec<serde_json::Value> =
            keys.map(|i| json!({"job": "lim", "payload": {"key": format!("k{i}")}})).collect();
        assert_eq!(enqueue_many(&mut *tx, json!(jobs)).await.unwrap().len(), 1_000);
        let scans =
            "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE schemaname = 'jobhost' AND relname = 'semaphores'";
        let seq_scans: i64 = sqlx::query_scalar(scans).fetch_one(&mut *tx).await.unwrap();
        assert_eq!(seq_scans, 0, "{round}: the semaphores read by index");
        tx.commit().await.unwrap();
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 20_500);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, 1_500);
}

/// A bulk enqueue reads the limits of its own job types only: another
/// type's config, however malformed (a limit that is not a number, left
/// by a hand edit), neither refuses nor slows it.
#[tokio::test]
async fn a_bulk_enqueue_reads_only_its_own_types_limits() {
    let db = TestDb::postgres().await;
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    limited_type(&db, "other", 1, OnConflict::Block, "v1").await;
    db.execute(
        "UPDATE jobhost.job_types SET config = jsonb_set(config, '{concurrency,limit}', '\"lots\"') WHERE name = 'other'",
    )
    .await;
    let jobs: Vec<EnqueueParams> = (0..200).map(|i| keyed("lim", &format!("k{}", i % 100))).collect();
    assert_eq!(db.store.job_enqueue(&jobs).await.unwrap().len(), 200);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'available'").await, 100);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, 100);
}

/// A job of type `last`, limited to one per `{key}`, on its last attempt
/// and running on host `h`: the expiry of its lease ends it, giving back
/// its key's slot. Returns the run.
async fn running_on_its_last_attempt(db: &TestDb) -> FetchedJob {
    let mut config = job_config("last");
    config.max_attempts = 1;
    config.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{key}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    db.store.job_types_register(&[(config, "v1".into())]).await.unwrap();
    db.enqueue_one(keyed("last", "q")).await;
    let run = db.fetch("last", 1).await.remove(0);
    common::confirm_started(db, &[jobhost::store::RunId { job_id: run.id, lease_token: run.lease_token }]).await;
    run
}

/// Sessions of this test's database waiting for a lock.
async fn waiting_for_locks(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
        .await
}

/// Whether the key `q` of `last` is free to lock now (nobody holds its semaphore row).
async fn key_is_free(db: &TestDb) -> bool {
    db.scalar(
        "SELECT count(*) FROM (SELECT 1 FROM jobhost.semaphores WHERE job = 'last' AND key = 'q'
                               FOR UPDATE SKIP LOCKED) s",
    )
    .await
        == 1
}

/// Guarantee 5 under a lock-order race (issue 32, item 6): a host's late
/// result for a job arrives while the expiry of that job's lease is under
/// way. The expiry holds the job's row (here held at its archive insert by
/// an uncommitted row of the same id, so the interleaving is certain) when
/// the result comes; before, the result took the job's key, waited for the
/// job's row, and the expiry then waited for the key: a deadlock, broken by
/// the server after a second with one of them rolled back. Every path that
/// ends a job now locks job rows, then keys, then batches: the result waits
/// for the row holding nothing, the expiry ends the job, and the result is
/// then a duplicate that changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_result_and_the_expiry_of_its_lease_never_deadlock() {
    let db = TestDb::postgres().await;
    let run = running_on_its_last_attempt(&db).await;
    let mut blocker = db.pool().begin().await.unwrap();
    sqlx::query(
        "INSERT INTO jobhost.archive (id, job, queue, priority, payload, state, attempt, max_attempts, enqueued_at)
         VALUES ($1, 'last', 'default', 0, '{}', 'failed', 0, 1, now())",
    )
    .bind(run.id)
    .execute(&mut *blocker)
    .await
    .unwrap();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let expiring = tokio::spawn({
        let pool = db.pool().clone();
        async move {
            sqlx::query_as::<_, (i32, i32, i32)>("SELECT * FROM jobhost.expire_leases($1, NULL, 1000)")
                .bind(later)
                .fetch_one(&pool)
                .await
        }
    });
    eventually(WITHIN, || async { waiting_for_locks(&db).await == 1 }).await;
    let finishing = tokio::spawn({
        let store = db.dyn_store();
        let result = finish(&run, completed());
        async move { store.job_finish_and_fetch(vec![result], &fetch_params("h", &["last"], 0)).await }
    });
    // It waits for the expiry's row, or (were it to take the key first and
    // find it held) comes back at once.
    eventually(WITHIN, || async { finishing.is_finished() || waiting_for_locks(&db).await == 2 }).await;
    blocker.rollback().await.unwrap();

    let expired = expiring.await.unwrap().expect("the expiry was not rolled back");
    assert_eq!(expired, (0, 1, 0), "the expiry ended the job (requeued, failed, held back)");
    let (results, _) = finishing.await.unwrap().expect("the late result was not rolled back");
    assert_eq!(results, vec![FinishResult::Duplicate], "the late result found its lease gone");
    assert_eq!(db.state_of(run.id).await, JobState::Failed);
    assert_eq!(holders(&db, "last", "q").await, 0, "the slot was given back once");
}

/// The first half of that order: a result write waits for its job's row
/// before it takes the job's key, so while it waits, the key is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_waiting_for_its_job_row_holds_no_key() {
    let db = TestDb::postgres().await;
    let run = running_on_its_last_attempt(&db).await;
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobhost.jobs WHERE id = $1 FOR UPDATE")
        .bind(run.id)
        .execute(&mut *holder)
        .await
        .unwrap();
    let finishing = tokio::spawn({
        let store = db.dyn_store();
        let result = finish(&run, completed());
        async move { store.job_finish_and_fetch(vec![result], &fetch_params("h", &["last"], 0)).await }
    });
    eventually(WITHIN, || async { waiting_for_locks(&db).await == 1 }).await;
    assert!(key_is_free(&db).await, "the result holds the job's key while it waits for the job's row");
    holder.commit().await.unwrap();
    let (results, _) = finishing.await.unwrap().unwrap();
    assert_eq!(results, vec![FinishResult::Done]);
    assert_eq!(holders(&db, "last", "q").await, 0);
}

/// The second half: an expiry never waits while it holds job rows. A job
/// whose key another transaction holds (an application enqueuing to it) is
/// left, running and expired, for the next pass.
#[tokio::test]
async fn an_expiry_passes_over_a_job_whose_key_another_transaction_holds() {
    let db = TestDb::postgres().await;
    let run = running_on_its_last_attempt(&db).await;
    let mut application = db.pool().begin().await.unwrap();
    sqlx::query("SELECT jobhost.enqueue('last', '{\"key\": \"q\"}')").execute(&mut *application).await.unwrap();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    // A bound far beyond a statement that waits for nothing.
    let mut conn = db.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '5s'").execute(&mut *conn).await.unwrap();
    let expired: (i32, i32, i32) = sqlx::query_as("SELECT * FROM jobhost.expire_leases($1, NULL, 1000)")
        .bind(later)
        .fetch_one(&mut *conn)
        .await
        .expect("the expiry did not wait for the key");
    conn.commit().await.unwrap();
    assert_eq!(expired, (0, 0, 1), "held back, not ended");
    assert_eq!(db.state_of(run.id).await, JobState::Running);
    application.commit().await.unwrap();
    let expired: (i32, i32, i32) = sqlx::query_as("SELECT * FROM jobhost.expire_leases($1, NULL, 1000)")
        .bind(later)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(expired, (0, 1, 0), "ended once the key was free");
    assert_eq!(db.state_of(run.id + 1).await, JobState::Available, "the application's job took the freed slot");
}

/// Registers `name` unique until executed on `{key}`, answering duplicates by `on_duplicate`.
async fn unique_type(db: &TestDb, name: &str, on_duplicate: OnDuplicate) {
    let mut config = job_config(name);
    config.unique = Some(UniqueConfig {
        key: KeyTemplate::parse("{key}").unwrap(),
        strategy: UniqueStrategy::UntilExecuted,
        on_duplicate,
    });
    db.store.job_types_register(&[(config, "v1".to_string())]).await.unwrap();
}

/// `jobhost.enqueue_many(jobs)`'s rows: (position, id, duplicate).
async fn enqueue_many(
    executor: impl sqlx::PgExecutor<'_>,
    jobs: serde_json::Value,
) -> Result<Vec<(i64, i64, bool)>, sqlx::Error> {
    sqlx::query_as("SELECT ord, id, duplicate FROM jobhost.enqueue_many($1)")
        .bind(sqlx::types::Json(jobs))
        .fetch_all(executor)
        .await
}

// PostgreSQL only, as the SQL enqueue: the bulk form answers each job as
// `jobhost.enqueue` would, in input order, in one call.
#[tokio::test]
async fn sql_enqueue_many_answers_each_job_as_enqueue_would() {
    let db = TestDb::postgres().await;
    db.store.job_types_register(&[(job_config("mail"), "v1".into())]).await.unwrap();
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    limited_type(&db, "dis", 1, OnConflict::Discard, "v1").await;
    unique_type(&db, "uni", OnDuplicate::Skip).await;
    let holder = db.enqueue_one(keyed("uni", "u0")).await;
    let batch: i64 =
        sqlx::query_scalar("SELECT jobhost.batch_open(label => 'bulk')").fetch_one(db.pool()).await.unwrap();
    let trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let rows = enqueue_many(
        db.pool(),
        json!([
            {"job": "mail", "payload": {}},
            {"job": "lim", "payload": {"key": "k1"}},
            {"job": "lim", "payload": {"key": "k1"}, "priority": -1},
            {"job": "uni", "payload": {"key": "u1"}},
            {"job": "uni", "payload": {"key": "u1"}},
            {"job": "uni", "payload": {"key": "u0"}},
            {"job": "lim", "payload": {"key": "k2"}, "run_at": "2999-01-01T00:00:00Z"},
            {"job": "mail", "payload": {"n": 1}, "queue": "other", "priority": 3, "batch_id": batch, "traceparent": trace},
            {"job": "dis", "payload": {"key": "d"}},
            {"job": "dis", "payload": {"key": "d"}},
        ]),
    )
    .await
    .unwrap();
    let positions: Vec<i64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(positions, (1..=10).collect::<Vec<_>>(), "one row per job, in input order");
    let id = |k: usize| rows[k].1;
    assert_eq!(
        rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        [false, false, false, false, true, true, false, false, false, false]
    );
    assert_eq!(id(4), id(3), "a duplicate of an earlier job of the call answers with its id");
    assert_eq!(id(5), holder, "a duplicate of a stored job answers with the holder's id");
    // The gate decided k1 by priority: the later job at -1 runs first.
    assert_eq!(db.state_of(id(2)).await, JobState::Available);
    assert_eq!(db.state_of(id(1)).await, JobState::Blocked);
    assert_eq!(holders(&db, "lim", "k1").await, 1);
    assert_eq!(db.state_of(id(6)).await, JobState::Scheduled, "a job due later is not gated yet");
    assert_eq!(holders(&db, "lim", "k2").await, 0);
    assert_eq!(db.state_of(id(8)).await, JobState::Available);
    assert_eq!(db.state_of(id(9)).await, JobState::Discarded, "discard applies per key");
    let (queue, priority): (String, i16) = sqlx::query_as("SELECT queue, priority FROM jobhost.jobs WHERE id = $1")
        .bind(id(7))
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!((queue.as_str(), priority), ("other", 3));
    assert_eq!(db.scalar(format!("SELECT total FROM jobhost.batches WHERE id = {batch}")).await, 1);
    let traced = db.texts(format!("SELECT traceparent FROM jobhost.job_traces WHERE job_id = {}", id(7))).await;
    assert_eq!(traced, [trace]);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.unique_claims WHERE unique_key = 'u1'").await, 1);
    assert_eq!(db.texts(format!("SELECT concurrency_key FROM jobhost.jobs WHERE id = {}", id(2))).await, ["k1"]);
    assert!(sqlx::query("SELECT * FROM jobhost.enqueue_many('[]')").fetch_all(db.pool()).await.unwrap().is_empty());
}

// PostgreSQL only. A large call's claims are first tried as one plain
// insert, which a taken key makes fail and roll back: the answers are those
// of a small call wherever the taken key falls (one held by a stored job,
// one twice in the call), and only the written jobs hold claims.
#[tokio::test]
async fn sql_enqueue_many_answers_a_large_calls_duplicates() {
    let db = TestDb::postgres().await;
    unique_type(&db, "uni", OnDuplicate::Skip).await;
    let holder = db.enqueue_one(keyed("uni", "u901")).await;
    let call = |prefix: &str| -> Vec<serde_json::Value> {
        (0..200).map(|i| json!({"job": "uni", "payload": {"key": format!("{prefix}{i:03}")}})).collect()
    };
    let fresh = enqueue_many(db.pool(), json!(call("u"))).await.unwrap();
    assert!(fresh.iter().all(|r| !r.2), "every new key is new");
    let mut taken = call("v");
    taken[100] = json!({"job": "uni", "payload": {"key": "u901"}});
    taken[199] = json!({"job": "uni", "payload": {"key": "v007"}});
    let rows = enqueue_many(db.pool(), json!(taken)).await.unwrap();
    let duplicates: Vec<(usize, i64)> = rows.iter().enumerate().filter(|(_, r)| r.2).map(|(i, r)| (i, r.1)).collect();
    assert_eq!(duplicates, [(100, holder), (199, rows[7].1)], "the stored holder's id, the call's first job's id");
    let again = enqueue_many(db.pool(), json!(call("u"))).await.unwrap();
    assert_eq!(
        again.iter().map(|r| (r.1, r.2)).collect::<Vec<_>>(),
        fresh.iter().map(|r| (r.1, true)).collect::<Vec<_>>()
    );
    let live = db.scalar("SELECT count(*) FROM jobhost.jobs WHERE job = 'uni'").await;
    assert_eq!(live, 1 + 200 + 198);
    let own = "SELECT count(*) FROM jobhost.unique_claims c JOIN jobhost.jobs j ON j.id = c.job_id";
    assert_eq!(db.scalar(own).await, live, "one claim per written job");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.unique_claims").await, live);
}

// PostgreSQL only. A bad job, a `raise` limit or a `raise` duplicate
// anywhere in the call refuses all of it; the bad job is named by position.
#[tokio::test]
async fn sql_enqueue_many_is_all_or_nothing() {
    let db = TestDb::postgres().await;
    db.store.job_types_register(&[(job_config("mail"), "v1".into())]).await.unwrap();
    limited_type(&db, "rai", 1, OnConflict::Raise, "v1").await;
    unique_type(&db, "ur", OnDuplicate::Raise).await;
    let stored = db.enqueue_one(keyed("ur", "taken")).await;
    let mail = json!({"job": "mail", "payload": {}});
    for (jobs, code, expected) in [
        (json!({"job": "mail"}), "22023", "must be a JSON array".to_string()),
        (json!([mail, {"job": "nope", "payload": {}}, mail]), "22023", "job 2 of 3: unknown job type \"nope\"".into()),
        (json!([mail, 5]), "22023", "job 2 of 2: is not an object".into()),
        (json!([mail, ["job", "mail"]]), "22023", "job 2 of 2: is not an object".into()),
        (
            json!([mail, mail, {"job": "mail", "payload": {}, "runat": "x"}]),
            "22023",
            "job 3 of 3: has an unknown field".into(),
        ),
        (
            json!([{"job": "mail", "payload": [1]}]),
            "22023",
            "job 1 of 1: payload of job \"mail\" must be a JSON object".into(),
        ),
        (json!([{"job": "mail", "payload": {}, "priority": "high"}]), "22023", "job 1 of 1: has a \"priority\"".into()),
        (
            json!([mail, {"job": "mail", "payload": {}, "run_at": "2026-12-24T18:00:00Z"}, {"job": "mail", "payload": {}, "run_at": "next tuesday"}]),
            "22023",
            "job 3 of 3: \"run_at\" \"next tuesday\" is not a time".into(),
        ),
        (
            json!([{"job": "mail", "payload": {}, "run_at": "2026-02-30T18:00:00Z"}, mail]),
            "22023",
            "job 1 of 2: \"run_at\" \"2026-02-30T18:00:00Z\" is not a time".into(),
        ),
        (
            json!([{"job": "mail", "payload": {}, "queue": "Bad Queue"}]),
            "22023",
            "job 1 of 1: queue \"Bad Queue\"".into(),
        ),
        (
            json!([{"job": "mail", "payload": {}, "traceparent": "nope"}]),
            "22023",
            "job 1 of 1: traceparent \"nope\"".into(),
        ),
        (
            json!([mail, {"job": "rai", "payload": {"key": "a"}}, {"job": "rai", "payload": {"key": "a"}}]),
            "JHL01",
            "all 1 slots of key \"a\" are taken".into(),
        ),
        (json!([mail, {"job": "ur", "payload": {"key": "taken"}}]), "JHU01", format!("is a duplicate of job {stored}")),
        (
            json!([{"job": "ur", "payload": {"key": "new"}}, {"job": "ur", "payload": {"key": "new"}}]),
            "JHU01",
            "two jobs of this enqueue have the unique key \"new\"".into(),
        ),
    ] {
        let error = enqueue_many(db.pool(), jobs.clone()).await.unwrap_err();
        let database = error.as_database_error().unwrap_or_else(|| panic!("{jobs}: {error}"));
        assert_eq!(database.code().as_deref(), Some(code), "{jobs}: {error}");
        assert!(database.message().contains(&expected), "{jobs}: {}", database.message());
        assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 1, "{jobs}: nothing stored");
        assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 0, "{jobs}");
        assert_eq!(db.scalar("SELECT count(*) FROM jobhost.unique_claims").await, 1, "{jobs}");
    }
    // Inside an application's transaction: rolled back with it, committed with it.
    let mut tx = db.pool().begin().await.unwrap();
    enqueue_many(&mut *tx, json!([{"job": "rai", "payload": {"key": "a"}}, mail])).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 0, "rolled back with the caller");
    let mut tx = db.pool().begin().await.unwrap();
    enqueue_many(&mut *tx, json!([{"job": "rai", "payload": {"key": "a"}}, mail])).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 3);
    assert_eq!(holders(&db, "rai", "a").await, 1);
}

// PostgreSQL only. The bulk form's passes that run only when a call needs
// them (`while_executing` keys, trace contexts) run when it does, and its
// queue rule is the SQL enqueue's: 1 to 128 characters of a-z, 0-9, _, .
// and -, the whole name.
#[tokio::test]
async fn sql_enqueue_many_records_what_its_jobs_need_and_checks_whole_queue_names() {
    let db = TestDb::postgres().await;
    db.store.job_types_register(&[(job_config("mail"), "v1".into())]).await.unwrap();
    let mut solo = job_config("solo");
    solo.unique = Some(UniqueConfig {
        key: KeyTemplate::parse("{key}").unwrap(),
        strategy: UniqueStrategy::WhileExecuting,
        on_duplicate: OnDuplicate::Skip,
    });
    db.store.job_types_register(&[(solo, "v1".to_string())]).await.unwrap();
    let recorded = "SELECT count(*) FROM jobhost.unique_keys";
    let traced = "SELECT count(*) FROM jobhost.job_traces";

    let plain = enqueue_many(db.pool(), json!([{"job": "mail", "payload": {}}, {"job": "mail", "payload": {}}]));
    assert_eq!(plain.await.unwrap().len(), 2);
    assert_eq!((db.scalar(recorded).await, db.scalar(traced).await), (0, 0), "nothing to record for plain jobs");

    let trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let rows = enqueue_many(
        db.pool(),
        json!([
            {"job": "solo", "payload": {"key": "k1"}},
            {"job": "mail", "payload": {}, "traceparent": trace},
            {"job": "solo", "payload": {"key": "k2"}},
        ]),
    )
    .await
    .unwrap();
    let keys =
        db.texts("SELECT job_id || ':' || unique_key FROM jobhost.unique_keys WHERE while_executing ORDER BY 1").await;
    assert_eq!(keys, [format!("{}:k1", rows[0].1), format!("{}:k2", rows[2].1)], "each while_executing key recorded");
    let traces = db.texts("SELECT job_id || ':' || traceparent FROM jobhost.job_traces").await;
    assert_eq!(traces, [format!("{}:{trace}", rows[1].1)]);

    let longest = "q".repeat(128);
    assert!(enqueue_many(db.pool(), json!([{"job": "mail", "payload": {}, "queue": longest}])).await.is_ok());
    for queue in ["q".repeat(129), String::new(), "a\nb".into(), "tenant-1/eu".into(), "Q".into()] {
        let jobs = json!([{"job": "mail", "payload": {}}, {"job": "mail", "payload": {}, "queue": queue}]);
        let error = enqueue_many(db.pool(), jobs).await.unwrap_err();
        let message = error.as_database_error().map(|e| e.message().to_string()).unwrap_or_default();
        assert!(message.starts_with("job 2 of 2: queue \""), "{queue:?}: {error}");
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 6, "only the accepted calls stored jobs");
}

/// A write's promotion reads each key's limit within the promotion
/// statement and asks whether a promoted job's type is rate-governed once
/// per job: as a SQL function `slot_limit` was planned afresh by every
/// write, and an inlined CTE asked `rate_governed` twice per job
/// (BENCHMARKS.md, "The promotion without its helpers"). Counted by
/// PostgreSQL itself, in the transaction that promotes three jobs (rolled
/// back).
#[tokio::test]
async fn a_promotion_calls_no_limit_helper_and_asks_for_rate_limits_once_per_job() {
    let db = TestDb::postgres().await;
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    for key in ["a", "b", "c"] {
        db.store.job_enqueue(&[keyed("lim", key), keyed("lim", key)]).await.unwrap();
    }
    db.fetch("lim", 3).await;
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL track_functions = 'all'").execute(&mut *tx).await.unwrap();
    let (promoted, leased): (i32, i32) = sqlx::query_as(
        "SELECT r.promoted, cardinality(r.leased) FROM jobhost.release_slots_leasing(
             ARRAY['lim', 'lim', 'lim'], ARRAY['a', 'b', 'c'], ARRAY['default'], ARRAY['lim'], ARRAY[60], 3, 'h') r",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!((promoted, leased), (3, 3), "each freed key promoted its blocked job, leased to the writer");
    let calls: Vec<(String, i64)> = sqlx::query_as(
        "SELECT funcname::text, calls FROM pg_stat_xact_user_functions
         WHERE schemaname = 'jobhost' AND funcname IN ('slot_limit', 'rate_governed') ORDER BY 1",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(calls, [("rate_governed".to_string(), 3)], "no slot_limit call; one rate check per promoted job");
    tx.rollback().await.unwrap();
}

/// A result write's archive insert runs one trigger frame, not one for
/// each of batches, workflows and uniqueness (BENCHMARKS.md, "One archive
/// trigger"): three frames and five statements, set up even for jobs that
/// belong to none, were a measured part of every write. Counted by
/// PostgreSQL itself, in the transaction that archives two keyed runs
/// (rolled back); what the one trigger does is tested where batches,
/// waits, workflows and claims are.
#[tokio::test]
async fn a_result_write_fires_one_archive_trigger() {
    let db = TestDb::postgres().await;
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    db.store.job_enqueue(&[keyed("lim", "a"), keyed("lim", "b")]).await.unwrap();
    let runs = db.fetch("lim", 2).await;
    let ids: Vec<i64> = runs.iter().map(|r| r.id).collect();
    let tokens: Vec<i64> = runs.iter().map(|r| r.lease_token).collect();
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL track_functions = 'pl'").execute(&mut *tx).await.unwrap();
    let written: i32 = sqlx::query_scalar(
        "SELECT cardinality(f.written) FROM jobhost.finish_runs(
             $1, $2, ARRAY['completed', 'completed'], ARRAY[NULL, NULL]::jsonb[], ARRAY[NULL, NULL]::jsonb[],
             ARRAY['[]', '[]']::jsonb[], ARRAY[NULL, NULL]::jsonb[], '{}', '{}', '{}', '{}', '{}', '{}') f",
    )
    .bind(&ids)
    .bind(&tokens)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(written, 2, "both runs archived");
    let triggers: Vec<(String, i64)> = sqlx::query_as(
        "SELECT p.proname::text, s.calls FROM pg_stat_xact_user_functions s JOIN pg_proc p ON p.oid = s.funcid
         WHERE s.funcid IN (SELECT tgfoid FROM pg_trigger WHERE tgrelid = 'jobhost.archive'::regclass) ORDER BY 1",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(triggers, [("archive_ended".to_string(), 1)], "one archive trigger, fired once");
    tx.rollback().await.unwrap();
}

/// Counts the functions of every new session of the test's database
/// (`pg_stat_user_functions`, which a session reports when idle).
async fn count_functions(db: &TestDb) {
    db.execute(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', current_database()); END $$",
    )
    .await;
}

/// Calls of `function` counted so far by every session of the database.
async fn calls_of(db: &TestDb, function: &str) -> i64 {
    db.scalar(format!(
        "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_user_functions
         WHERE schemaname = 'jobhost' AND funcname = '{function}'"
    ))
    .await
}

/// What readying the result writer may not change: live, parked and
/// archived jobs, the keys' holders, and the ids and tokens drawn.
async fn queue_state(db: &TestDb) -> Vec<String> {
    db.texts(
        "SELECT concat_ws(' | ',
             (SELECT string_agg(id || ':' || state || ':' || coalesce(lease_token, 0), ',' ORDER BY id) FROM jobhost.jobs),
             (SELECT string_agg(id::text, ',' ORDER BY id) FROM jobhost.blocked_jobs),
             (SELECT count(*) FROM jobhost.archive),
             (SELECT string_agg(job || '/' || key || ':' || holders, ',' ORDER BY job, key) FROM jobhost.semaphores),
             (SELECT last_value FROM jobhost.job_ids),
             (SELECT last_value FROM jobhost.lease_tokens))",
    )
    .await
}

/// A store readies its result writer's session by running a write's
/// functions once (BENCHMARKS.md, "A warm result writer"): the first
/// write of a new session compiled and planned them, ten times a warm
/// write. The warm-up changes, draws and leaves locked nothing, and the
/// writes after it on the same session write as before.
#[tokio::test]
async fn warming_the_result_writer_runs_a_write_and_changes_nothing() {
    let db = TestDb::postgres().await;
    count_functions(&db).await;
    limited_type(&db, "lim", 1, OnConflict::Block, "v1").await;
    db.store.job_enqueue(&[keyed("lim", "a"), keyed("lim", "a")]).await.unwrap();
    let runs = db.fetch("lim", 2).await;
    assert_eq!(runs.len(), 1, "one holder of the key, one job parked behind it");
    let before = queue_state(&db).await;
    // A store opened now: its sessions count their functions.
    let store = jobhost::store::open(&db.url, 2).await.unwrap();
    store.result_writes_warm().await.unwrap();
    assert_eq!(queue_state(&db).await, before, "nothing changed or drawn");
    let locks = "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                 WHERE c.relnamespace = 'jobhost'::regnamespace AND l.pid <> pg_backend_pid()";
    assert_eq!(db.scalar(locks).await, 0, "no lock left on any table");
    eventually(Duration::from_secs(20), || async {
        calls_of(&db, "finish_runs_unless_locked").await >= 1 && calls_of(&db, "release_slots_leasing").await >= 1
    })
    .await;
    let written = store.job_finish(vec![finish(&runs[0], completed())]).await.unwrap();
    assert!(matches!(written[..], [FinishResult::Done]), "the holder's result written: {written:?}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'available'").await,
        1,
        "the parked job promoted"
    );
}

/// A host readies its result writer as it starts, before any job is
/// fetched, so its first results go out on a warm session.
#[tokio::test]
async fn a_host_readies_its_result_writer_before_its_first_result() {
    let db = TestDb::postgres().await;
    count_functions(&db).await;
    let host = TestHost::start(&db, &["hello"], |_| {}).await;
    eventually(Duration::from_secs(20), || async { calls_of(&db, "finish_runs_unless_locked").await >= 1 }).await;
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive").await, 0, "no job was run");
    host.stop().await;
}
