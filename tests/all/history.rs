//! The fleet's history on both backends: per minute, the finished jobs and
//! their run and wait times as the archive says (computed by maintenance,
//! the same figures on both backends), the retries hosts add, the queues'
//! depth, a backfill of an existing archive, and retention.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use jobhost::store::EnqueueParams;
use jobhost::store::history::{HistoryPoint, HistoryRange, RetryCount, percentile};
use serde_json::json;

use common::db::{TestDb, on_both_backends};
use common::{TestHost, eventually};

const WITHIN: Duration = Duration::from_secs(60);
const WEEK_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// The archive's rows of `job`, by minute: (run times, waits), each sorted.
async fn archive_minutes(db: &TestDb, job: &str) -> BTreeMap<i64, (Vec<f64>, Vec<f64>, i64)> {
    let sql = db.dialect(
        "SELECT (extract(epoch FROM finished_at) * 1000)::float8,
                greatest(extract(epoch FROM finished_at - started_at) * 1000, 0)::float8,
                CASE WHEN attempt = 1 THEN greatest(extract(epoch FROM started_at - enqueued_at) * 1000, 0)::float8 END,
                state
         FROM jobhost.archive WHERE job = '{job}'",
        "SELECT CAST(finished_at AS REAL),
                CASE WHEN started_at IS NOT NULL THEN CAST(max(finished_at - started_at, 0) AS REAL) END,
                CASE WHEN attempt = 1 AND started_at IS NOT NULL THEN CAST(max(started_at - enqueued_at, 0) AS REAL) END,
                state
         FROM archive WHERE job = '{job}'",
    );
    let rows: Vec<(f64, Option<f64>, Option<f64>, String)> = db.rows(sql.replace("{job}", job)).await;
    let mut minutes: BTreeMap<i64, (Vec<f64>, Vec<f64>, i64)> = BTreeMap::new();
    for (finished, run, wait, state) in rows {
        let entry = minutes.entry((finished / 60_000.0).floor() as i64 * 60_000).or_default();
        entry.0.extend(run);
        entry.1.extend(wait);
        if state == "completed" {
            entry.2 += 1;
        }
    }
    for (runs, waits, _) in minutes.values_mut() {
        runs.sort_by(f64::total_cmp);
        waits.sort_by(f64::total_cmp);
    }
    minutes
}

fn close(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() < 1e-6 * a.abs().max(1.0),
        (None, None) => true,
        _ => false,
    }
}

/// The points of the last hour with anything in them.
async fn hour(db: &TestDb, job: Option<&str>) -> Vec<HistoryPoint> {
    db.store.history(HistoryRange::Hour, job).await.unwrap()
}

fn total(points: &[HistoryPoint], count: fn(&HistoryPoint) -> i64) -> i64 {
    points.iter().map(count).sum()
}

async fn finished_jobs_retries_and_times_are_counted_as_the_archive_says(db: TestDb) {
    let host = TestHost::start(&db, &["hello", "flaky"], |_| {}).await;
    for i in 0..20 {
        db.enqueue_new("hello", json!({"name": format!("n{i}")})).await;
    }
    for _ in 0..3 {
        db.enqueue_new("flaky", json!({"fail_times": 1})).await;
    }
    for _ in 0..2 {
        db.enqueue_new("flaky", json!({"fail_times": 9})).await;
    }
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await == 25 }).await;
    // Stopping the host writes its share of retries.
    host.stop().await;
    db.store.history_roll(WEEK_SECS).await.unwrap();

    let hello = hour(&db, Some("hello")).await;
    assert_eq!(hello.len(), 60, "every minute of the hour, empty ones too");
    assert_eq!(total(&hello, |p| p.completed), 20);
    assert_eq!(total(&hello, |p| p.failed + p.retried), 0);
    let flaky = hour(&db, Some("flaky")).await;
    assert_eq!(total(&flaky, |p| p.completed), 3);
    assert_eq!(total(&flaky, |p| p.failed), 2);
    assert_eq!(total(&flaky, |p| p.retried), 3 + 2 * 4, "each attempt scheduled again, by the host that ran it");
    assert_eq!(total(&flaky, |p| p.waits), 0, "no flaky job finished on its first attempt");
    let everything = hour(&db, None).await;
    assert_eq!(total(&everything, |p| p.completed), 23);

    // Each minute's times are the archive's, by the same percentile on
    // both backends.
    let archive = archive_minutes(&db, "hello").await;
    for point in hello.iter().filter(|p| p.runs > 0) {
        let (runs, waits, completed) = &archive[&point.at.timestamp_millis()];
        assert_eq!(point.completed, *completed);
        assert_eq!(point.runs, runs.len() as i64);
        assert!(close(point.run_p50_ms, percentile(runs, 0.5)), "{point:?} {runs:?}");
        assert!(close(point.run_p95_ms, percentile(runs, 0.95)), "{point:?} {runs:?}");
        assert!(close(point.run_max_ms, runs.last().copied()), "{point:?}");
        assert_eq!(point.waits, waits.len() as i64);
        assert!(close(point.wait_p50_ms, percentile(waits, 0.5)), "{point:?} {waits:?}");
        assert!(close(point.wait_p95_ms, percentile(waits, 0.95)), "{point:?} {waits:?}");
    }

    // Computing again changes nothing: the archive's figures are set, not
    // added, and the hosts' retries stay.
    db.store.history_roll(WEEK_SECS).await.unwrap();
    assert_eq!(hour(&db, Some("hello")).await, hello);
    assert_eq!(hour(&db, Some("flaky")).await, flaky);
}

async fn retries_from_many_hosts_add_up_while_minutes_are_computed(db: TestDb) {
    let minute = chrono::Utc::now();
    let minute = minute - chrono::TimeDelta::milliseconds(minute.timestamp_millis() % 60_000);
    // 8 hosts write 25 shares each while maintenance computes the minute
    // over and over: every retry counts once, none is overwritten.
    let mut writers = Vec::new();
    for host in 0..8 {
        let store = db.store.clone();
        writers.push(tokio::spawn(async move {
            for _ in 0..25 {
                let shares = [
                    RetryCount { minute, queue: "default".into(), job: "flaky".into(), retried: 1 },
                    RetryCount { minute, queue: format!("q{}", host % 2), job: "flaky".into(), retried: 2 },
                ];
                store.history_add_retries(&shares).await.unwrap();
            }
        }));
    }
    let store = db.store.clone();
    let computing = tokio::spawn(async move {
        for _ in 0..20 {
            store.history_roll(WEEK_SECS).await.unwrap();
        }
    });
    for writer in writers {
        writer.await.unwrap();
    }
    computing.await.unwrap();
    let points = hour(&db, Some("flaky")).await;
    assert_eq!(total(&points, |p| p.retried), 8 * 25 * 3);
}

async fn the_depth_of_the_queues_is_sampled_into_the_current_minute(db: TestDb) {
    // No host serves "hello" here: its jobs wait.
    db.store.job_types_register(&[(common::job_config("hello"), "d".into())]).await.unwrap();
    for i in 0..4 {
        db.enqueue_new("hello", json!({"name": format!("now{i}")})).await;
    }
    let mut later = EnqueueParams::new("hello", json!({"name": "later"}));
    later.delay_ms = Some(3_600_000);
    db.enqueue_one(later).await;
    db.store.history_roll(WEEK_SECS).await.unwrap();
    let last = hour(&db, Some("hello")).await.pop().unwrap();
    assert_eq!((last.available, last.scheduled, last.blocked), (Some(4), Some(1), Some(0)));

    // Emptied within the minute: the sample says zero, not the old count.
    db.execute("DELETE FROM jobhost.jobs").await;
    db.store.history_roll(WEEK_SECS).await.unwrap();
    let points = hour(&db, Some("hello")).await;
    let last = points.last().unwrap();
    // The minute may have turned between the two samples.
    assert!(last.available.unwrap_or(0) == 0 && last.scheduled.unwrap_or(0) == 0, "{last:?}");
}

async fn an_existing_archive_is_charted_and_old_minutes_are_pruned(db: TestDb) {
    let host = TestHost::start(&db, &["hello"], |_| {}).await;
    for i in 0..6 {
        db.enqueue_new("hello", json!({"name": format!("old{i}")})).await;
    }
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await == 6 }).await;
    host.stop().await;
    // As if they had finished three hours ago, before the history existed.
    db.execute(db.dialect(
        "UPDATE jobhost.archive SET enqueued_at = enqueued_at - interval '3 hours',
                started_at = started_at - interval '3 hours', finished_at = finished_at - interval '3 hours'",
        "UPDATE archive SET enqueued_at = enqueued_at - 10800000, started_at = started_at - 10800000,
                finished_at = finished_at - 10800000",
    ))
    .await;
    db.execute("DELETE FROM jobhost.history").await;
    db.execute("DELETE FROM jobhost.history_marks").await;
    // An hour of the archive per pass: four passes reach the present.
    for _ in 0..4 {
        db.store.history_roll(WEEK_SECS).await.unwrap();
    }
    let day = db.store.history(HistoryRange::Day, Some("hello")).await.unwrap();
    assert_eq!(day.len(), 96);
    assert_eq!(total(&day, |p| p.completed), 6, "the archive's last day is charted");
    assert!(hour(&db, Some("hello")).await.iter().all(|p| p.completed == 0), "three hours ago, not now");

    // With a retention of two hours, those minutes go.
    db.store.history_roll(2.0 * 3600.0).await.unwrap();
    let day = db.store.history(HistoryRange::Day, Some("hello")).await.unwrap();
    assert_eq!(total(&day, |p| p.completed), 0);
}

/// An application's transaction holding the mark's row (or a host stuck
/// computing) makes another host's computation pass, not wait; the hosts'
/// retries are written meanwhile, in rows of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_mark_makes_a_computation_pass_instead_of_waiting() {
    let db = TestDb::postgres().await;
    db.store.history_roll(WEEK_SECS).await.unwrap();
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("SELECT upto FROM jobhost.history_marks FOR UPDATE").execute(&mut *holder).await.unwrap();
    let passed = tokio::time::timeout(Duration::from_secs(30), db.store.history_roll(WEEK_SECS)).await;
    assert_eq!(passed.expect("the computation does not wait for the held row").unwrap(), 0);
    let minute = chrono::Utc::now();
    let share = RetryCount { minute, queue: "default".into(), job: "flaky".into(), retried: 3 };
    let added = tokio::time::timeout(Duration::from_secs(30), db.store.history_add_retries(&[share])).await;
    added.expect("retries are not held by the computation").unwrap();
    holder.rollback().await.unwrap();
    assert_eq!(total(&hour(&db, Some("flaky")).await, |p| p.retried), 3);
}

/// A result that commits after its minute was computed and passed still
/// counts in it: the write's transaction began in minute m (its
/// `finished_at`), waited on an application's lock on the job's row until
/// the mark had moved past m (as it does once m is older than the settle
/// window; set here rather than waited for), then committed. The archive's
/// commit-time trigger flags m, and the next pass computes it again.
/// (SQLite takes `finished_at` under its write lock, after any wait, so its
/// rows are never late.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_committed_after_its_minute_was_passed_still_counts() {
    let db = TestDb::postgres().await;
    db.store.job_types_register(&[(common::job_config("hello"), "v1".into())]).await.unwrap();
    let id = db.enqueue_new("hello", json!({})).await;
    let leased = db.store.job_fetch(&common::fetch_params("h-1", &["hello"], 1)).await.unwrap();
    db.store.history_roll(WEEK_SECS).await.unwrap();

    let mut application = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobhost.jobs WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *application)
        .await
        .unwrap();
    let store = db.dyn_store();
    let done = common::finish(&leased[0], common::completed());
    let writing = tokio::spawn(async move { store.job_finish(vec![done]).await });
    // The write waits on the row; its transaction began in minute m.
    let waiting = "SELECT count(*) FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%finish%'";
    eventually(WITHIN, || async { db.scalar(waiting).await == 1 }).await;
    let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "SELECT date_trunc('minute', xact_start) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%finish%'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    // Minute m ends, and a pass moves the mark past it, counting it empty.
    let ended = "SELECT count(*) FROM (SELECT date_trunc('minute', now()) AS now) n WHERE n.now > '{m}'::timestamptz";
    let ended = ended.replace("{m}", &started.to_rfc3339());
    eventually(Duration::from_secs(70), || async { db.scalar(&ended).await == 1 }).await;
    sqlx::query("UPDATE jobhost.history_marks SET upto = date_trunc('minute', now())")
        .execute(db.pool())
        .await
        .unwrap();
    db.store.history_roll(WEEK_SECS).await.unwrap();
    let in_minute =
        |points: &[HistoryPoint]| points.iter().filter(|p| p.at == started).map(|p| p.completed).sum::<i64>();
    assert_eq!(in_minute(&hour(&db, Some("hello")).await), 0, "nothing had committed in minute {started}");

    application.commit().await.unwrap();
    writing.await.unwrap().unwrap();
    let finished: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT finished_at FROM jobhost.archive WHERE id = $1")
            .bind(id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(finished.timestamp() / 60 * 60, started.timestamp(), "the result is dated by its transaction's start");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.history_late").await, 1, "the late minute is flagged");
    db.store.history_roll(WEEK_SECS).await.unwrap();
    assert_eq!(in_minute(&hour(&db, Some("hello")).await), 1, "the late result counts in its minute");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.history_late").await, 0, "the flag is taken");
}

/// Two late results for one minute: the second's flag finds the first's
/// and takes its row (not `DO NOTHING`), so a pass taking the flags waits
/// for the second's commit and then counts it. The second's trigger is
/// fired early (`SET CONSTRAINTS … IMMEDIATE`) and its transaction held
/// open, standing for the moment between a commit's trigger and its
/// visibility; a late row is a copy of an archived job dated ten minutes
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_waits_for_a_late_result_whose_flag_it_takes() {
    let db = TestDb::postgres().await;
    db.store.job_types_register(&[(common::job_config("hello"), "v1".into())]).await.unwrap();
    let id = db.enqueue_new("hello", json!({})).await;
    let leased = db.store.job_fetch(&common::fetch_params("h-1", &["hello"], 1)).await.unwrap();
    db.store.job_finish(vec![common::finish(&leased[0], common::completed())]).await.unwrap();
    let late_copy = |copy: i64| {
        format!(
            "INSERT INTO jobhost.archive SELECT * FROM jsonb_populate_record(NULL::jobhost.archive,
                 (SELECT to_jsonb(a) || jsonb_build_object('id', {copy},
                     'finished_at', date_trunc('minute', now()) - interval '10 minutes')
                  FROM jobhost.archive a WHERE id = {id}))"
        )
    };
    sqlx::query(sqlx::AssertSqlSafe(late_copy(id + 1000))).execute(db.pool()).await.unwrap();
    db.store.history_roll(WEEK_SECS).await.unwrap();
    sqlx::query("UPDATE jobhost.history_marks SET upto = date_trunc('minute', now())")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(late_copy(id + 1001))).execute(db.pool()).await.unwrap();

    let mut second = db.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(late_copy(id + 1002))).execute(&mut *second).await.unwrap();
    sqlx::query("SET CONSTRAINTS jobhost.archive_flag_late IMMEDIATE").execute(&mut *second).await.unwrap();
    let store = db.dyn_store();
    let pass = tokio::spawn(async move { store.history_roll(WEEK_SECS).await });
    let waiting = "SELECT count(*) FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%history_late%'";
    eventually(WITHIN, || async { db.scalar(waiting).await == 1 }).await;
    second.commit().await.unwrap();
    pass.await.unwrap().unwrap();
    let minute = "SELECT CAST(sum(completed) AS BIGINT) FROM jobhost.history
                  WHERE minute = date_trunc('minute', now()) - interval '10 minutes'";
    assert_eq!(db.scalar(minute).await, 3, "the three late copies count in their minute");
}

on_both_backends!(
    finished_jobs_retries_and_times_are_counted_as_the_archive_says,
    retries_from_many_hosts_add_up_while_minutes_are_computed,
    the_depth_of_the_queues_is_sampled_into_the_current_minute,
    an_existing_archive_is_charted_and_old_minutes_are_pruned,
);
