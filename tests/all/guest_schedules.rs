//! Schedules a running job makes (WIT 0.8.0 `schedules`, issue 71): each
//! change is checked at the call (a bad field or an unknown type is an
//! error the guest sees), held, and written in the transaction that
//! completes the job, in order; an attempt that fails writes nothing. On
//! PostgreSQL, a change the database refuses at the completion (a zone it
//! does not know) fails that run alone, with the reason.

use std::time::Duration;

use crate::common;

use jobhost::schedule_spec::ScheduleChange;
use jobhost::store::keyed_schedule::{KeyedSchedule, KeyedScheduleStatus, Overlap};
use jobhost::store::{Finish, FinishOutcome, FinishResult, JobState};
use serde_json::{Value, json};

use common::db::{Backend, TestDb, on_both_backends};
use common::eventually;

const WITHIN: Duration = Duration::from_secs(120);

/// Registers `report`, the type the planner's schedules enqueue.
async fn report_registered(db: &TestDb) {
    let config = common::job_config("report");
    db.store.job_types_register(&[(config, "d-report".into())]).await.unwrap();
}

async fn schedules(db: &TestDb) -> Vec<KeyedScheduleStatus> {
    db.store.keyed_schedules(Some("report"), None).await.unwrap()
}

fn keys(listed: &[KeyedScheduleStatus]) -> Vec<&str> {
    listed.iter().map(|s| s.schedule.key.as_str()).collect()
}

/// Enqueues a planner job making `changes`, failing its first
/// `fail_attempts` attempts after making them; waits for it to end and
/// returns its state and output.
async fn plan(db: &TestDb, changes: Value, fail_attempts: u32) -> (JobState, Option<Value>) {
    let id = db.enqueue_new("planner", json!({"changes": changes, "fail_attempts": fail_attempts})).await;
    eventually(WITHIN, || async {
        db.scalar(&format!("SELECT count(*) FROM jobhost.archive WHERE id = {id}")).await == 1
    })
    .await;
    let detail = db.store.job_get(id).await.unwrap().unwrap();
    (detail.row.state, detail.output)
}

fn set(key: &str, cron: &str) -> Value {
    json!({"set": "report", "key": key, "cron": cron})
}

/// A run's schedules are written with its completion: the attempt that
/// failed wrote nothing (the run that failed for good wrote nothing at
/// all), a refused change was the guest's error at the call and stored
/// nothing, and pause, resume and removal act in order.
async fn a_run_changes_schedules_with_its_completion(db: TestDb) {
    report_registered(&db).await;
    let host = common::TestHost::start(&db, &["planner"], |_| {}).await;

    let acme = json!({
        "set": "report", "key": "acme", "cron": "0 9 * * 1", "time_zone": "Europe/Berlin",
        "payload": {"customer": "acme"}, "overlap": "skip", "jitter_ms": 1000, "backfill": 0,
    });
    let changes = json!([
        acme,
        set("globex", "*/5 * * * *"),
        set("bad", "every monday"),
        {"set": "no_such_type", "key": "acme", "cron": "* * * * *"},
        {"set": "report", "key": "", "cron": "* * * * *"},
        {"set": "report", "key": "zone", "cron": "* * * * *", "time_zone": "Mars/Olympus"},
        {"set": "report", "key": "tick", "cron": "* * * * *", "payload": {"_schedule": "x"}},
    ]);
    let (state, output) = plan(&db, changes, 1).await;
    assert_eq!(state, JobState::Completed);
    let output = output.unwrap();
    assert_eq!(output["attempt"], 2, "its first attempt failed after making the same changes: {output}");
    let results: Vec<&str> = output["results"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    assert_eq!(&results[..2], ["ok", "ok"]);
    assert!(results[2].starts_with("cron:"), "{results:?}");
    assert!(results[3].starts_with("job:") && results[3].contains("no_such_type"), "{results:?}");
    assert!(results[4].starts_with("key:"), "{results:?}");
    assert!(results[5].starts_with("time_zone:"), "{results:?}");
    assert!(results[6].starts_with("payload:"), "{results:?}");

    let listed = schedules(&db).await;
    assert_eq!(keys(&listed), ["acme", "globex"], "the refused changes stored nothing");
    let written = &listed[0].schedule;
    assert_eq!((written.cron.as_str(), written.time_zone.as_str()), ("0 9 * * 1", "Europe/Berlin"));
    assert_eq!(written.payload["customer"], "acme");
    assert_eq!((written.overlap, written.jitter_ms, written.backfill), (Overlap::Skip, 1000, 0));
    assert!(!written.paused);

    // A run that fails for good (the planner has two attempts) writes nothing.
    let (state, _) = plan(&db, json!([set("doomed", "* * * * *"), {"remove": "report", "key": "acme"}]), 2).await;
    assert_eq!(state, JobState::Failed);
    assert_eq!(keys(&schedules(&db).await), ["acme", "globex"]);

    // In order: a pause with its note, a removal, a set that keeps the pause.
    let changes = json!([
        {"pause": "report", "key": "acme", "note": "card declined"},
        {"remove": "report", "key": "globex"},
        set("acme", "0 10 * * 1"),
        {"pause": "report", "key": "nobody"},
    ]);
    let (state, output) = plan(&db, changes, 0).await;
    assert_eq!(state, JobState::Completed, "{output:?}");
    let listed = schedules(&db).await;
    assert_eq!(keys(&listed), ["acme"], "globex removed; pausing a schedule that is not there made none");
    assert_eq!(listed[0].schedule.cron, "0 10 * * 1");
    assert!(listed[0].schedule.paused, "a rewrite keeps the pause");
    assert_eq!(listed[0].schedule.note, "card declined");

    let (state, _) = plan(&db, json!([{"resume": "report", "key": "acme"}]), 0).await;
    assert_eq!(state, JobState::Completed);
    assert!(!schedules(&db).await[0].schedule.paused);
    host.stop().await;
}

on_both_backends!(a_run_changes_schedules_with_its_completion);

/// PostgreSQL: a schedule the host's checks accept and the database's
/// refuse (here a zone removed from `jobhost.time_zones`) fails that run
/// at its completion with the reason and stores nothing; the run beside
/// it completes with its own schedule.
#[tokio::test]
async fn postgres_a_schedule_the_database_refuses_fails_its_run_alone() {
    let db = TestDb::new(Backend::Postgres).await;
    report_registered(&db).await;
    db.execute("DELETE FROM jobhost.time_zones WHERE name = 'Europe/Berlin'").await;
    let host = common::TestHost::start(&db, &["planner"], |_| {}).await;
    let berlin = json!([{"set": "report", "key": "berlin", "cron": "* * * * *", "time_zone": "Europe/Berlin"}]);
    let refused = db.enqueue_new("planner", json!({"changes": berlin})).await;
    let (state, _) = plan(&db, json!([set("utc", "* * * * *")]), 0).await;
    assert_eq!(state, JobState::Completed);
    eventually(WITHIN, || async {
        db.scalar(&format!("SELECT count(*) FROM jobhost.archive WHERE id = {refused}")).await == 1
    })
    .await;
    let detail = db.store.job_get(refused).await.unwrap().unwrap();
    assert_eq!(detail.row.state, JobState::Failed);
    let error = detail.errors.to_string();
    assert!(error.contains("time_zone"), "the reason is kept: {error}");
    assert_eq!(keys(&schedules(&db).await), ["utc"]);
    host.stop().await;
}

/// PostgreSQL: while an application's transaction holds a schedule's row,
/// a result changing that schedule is deferred at once (its job still
/// leased), not made to wait in the write with the results beside it,
/// which are written; written again waiting for the row, it commits once
/// the application does, its change after the application's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_result_changing_a_held_schedule_is_deferred_alone() {
    let db = TestDb::new(Backend::Postgres).await;
    report_registered(&db).await;
    db.store.job_types_register(&[(common::job_config("planner"), "d-planner".into())]).await.unwrap();
    let pool = db.pool();
    sqlx::query("SELECT jobhost.schedule_upsert('report', 'acme', '0 9 * * *')").execute(pool).await.unwrap();
    let mut app = pool.begin().await.unwrap();
    sqlx::query("SELECT jobhost.schedule_upsert('report', 'acme', '0 7 * * *')").execute(&mut *app).await.unwrap();

    let changer = db.enqueue_new("planner", json!({})).await;
    let beside = db.enqueue_new("planner", json!({})).await;
    let fetched = db.store.job_fetch(&common::fetch_params("h", &["planner"], 2)).await.unwrap();
    assert_eq!(fetched.len(), 2);
    let mut change = KeyedSchedule::new("report", "acme", "0 8 * * *");
    change.payload.insert("by".into(), json!("run"));
    let finishes: Vec<Finish> = fetched
        .iter()
        .map(|job| {
            let mut outcome = common::completed();
            if let FinishOutcome::Completed { schedules, .. } = &mut outcome
                && job.id == changer
            {
                *schedules = vec![ScheduleChange::Set(change.clone())].into();
            }
            common::finish(job, outcome)
        })
        .collect();
    // A write that waited for the row would not return while the
    // application holds it: the bound turns that into a failure here.
    let next = common::fetch_params("h", &["nothing"], 1);
    let written = tokio::time::timeout(WITHIN, db.store.job_finish_and_fetch(finishes.clone(), &next))
        .await
        .expect("the write does not wait for the application's row")
        .unwrap()
        .0;
    let results: std::collections::HashMap<i64, FinishResult> = fetched.iter().map(|job| job.id).zip(written).collect();
    assert_eq!((results[&changer], results[&beside]), (FinishResult::Deferred, FinishResult::Done));
    assert_eq!(db.scalar(format!("SELECT count(*) FROM jobhost.jobs WHERE id = {changer}")).await, 1, "still leased");

    // Written again waiting for its row, as the host does with a deferred result.
    let store = db.store.clone();
    let again = vec![finishes[fetched.iter().position(|job| job.id == changer).unwrap()].clone()];
    let waiting = tokio::spawn(async move { store.job_finish(again).await });
    app.commit().await.unwrap();
    assert_eq!(waiting.await.unwrap().unwrap(), [FinishResult::Done]);
    let written = &schedules(&db).await[0].schedule;
    assert_eq!(
        (written.cron.as_str(), &written.payload["by"]),
        ("0 8 * * *", &json!("run")),
        "after the application's"
    );
}

/// A guest cannot make the host hold changes without bound: past 1,000 a
/// run's calls are refused (the run still completes, with what it held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_makes_at_most_a_thousand_schedule_changes() {
    let db = TestDb::new(Backend::Postgres).await;
    report_registered(&db).await;
    let host = common::TestHost::start(&db, &["planner"], |_| {}).await;
    let changes: Vec<Value> = (0..1_001).map(|n| json!({"remove": "report", "key": format!("k{n}")})).collect();
    let (state, output) = plan(&db, Value::Array(changes), 0).await;
    assert_eq!(state, JobState::Completed);
    let output = output.unwrap();
    let results = output["results"].as_array().unwrap();
    assert!(results[..1_000].iter().all(|r| r == "ok"));
    assert_eq!(results[1_000], "a run may make at most 1000 schedule changes");
    host.stop().await;
}
