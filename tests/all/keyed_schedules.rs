//! Schedules made at run time (issue 71): many per job type, one per key,
//! written by applications, operators and SQL, and ticked by the database
//! deciding which host does each: each tick of each key once, however
//! many hosts pass at once; overlap policies; pause, resume, removal and
//! trigger-now; a changed calendar handing over without losing or doubling
//! a tick; a zone through a daylight-saving change; and a pass costing the
//! schedules due, not all of them. Store-level tests drive the schedule
//! loop (`Scheduler::run_once`) with a given clock, on both backends.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use jobhost::background::scheduler::{Scheduler, SchedulerConfig};
use jobhost::store::keyed_schedule::{KeyedSchedule, KeyedScheduleStatus, Overlap};
use jobhost::store::{Error, HostInfo, Store};
use jobhost::types::JobConfig;

use common::db::{Backend, TestDb, jobhost, on_both_backends};

/// Registers a plain job type, and a live host serving it: keyed
/// schedules tick only for a type a live host serves.
async fn registered(db: &TestDb, name: &str) -> JobConfig {
    let config = common::job_config(name);
    db.store.job_types_register(&[(config.clone(), format!("d-{name}"))]).await.expect("registers");
    let host = HostInfo::current(vec![name.to_string()], Duration::from_secs(120));
    db.store.host_upsert(&host).await.expect("host row");
    config
}

fn scheduler(store: Store) -> Scheduler {
    Scheduler::new(store, SchedulerConfig::default()).unwrap()
}

fn every_second(key: &str) -> KeyedSchedule {
    KeyedSchedule::new("report", key, "* * * * * *")
}

async fn status(db: &TestDb, key: &str) -> KeyedScheduleStatus {
    db.store.keyed_schedules(Some("report"), Some(key)).await.unwrap().pop().unwrap_or_else(|| panic!("{key} exists"))
}

/// `(key, tick)` of every `report` job, live or archived, sorted.
async fn ticks(db: &TestDb) -> Vec<(String, String)> {
    let rows = db
        .texts(
            "SELECT (payload->>'_schedule') || ' ' || (payload->>'_tick') FROM jobhost.jobs WHERE job = 'report'
             UNION ALL
             SELECT (payload->>'_schedule') || ' ' || (payload->>'_tick') FROM jobhost.archive WHERE job = 'report'
             ORDER BY 1",
        )
        .await;
    rows.into_iter()
        .map(|row| {
            let (key, tick) = row.split_once(' ').unwrap();
            (key.to_string(), tick.to_string())
        })
        .collect()
}

fn text(tick: DateTime<Utc>) -> String {
    jobhost::calendar::tick_text(&tick)
}

fn whole_second_after(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(at.timestamp() + 1, 0).unwrap()
}

/// The live `report` jobs' ids, oldest first.
async fn live_ids(db: &TestDb) -> Vec<i64> {
    db.texts("SELECT CAST(id AS TEXT) FROM jobhost.jobs WHERE job = 'report' ORDER BY id")
        .await
        .into_iter()
        .map(|id| id.parse().unwrap())
        .collect()
}

async fn each_tick_of_each_key_is_enqueued_once_by_hosts_passing_at_once(db: TestDb) {
    registered(&db, "report").await;
    const KEYS: usize = 120;
    for n in 0..KEYS {
        let mut schedule = every_second(&format!("customer-{n:03}"));
        schedule.payload.insert("customer".into(), serde_json::json!(n));
        assert!(db.store.keyed_schedule_upsert(&schedule).await.unwrap(), "created");
    }
    let latest_since = db.store.keyed_schedules(None, None).await.unwrap().iter().map(|s| s.since).max().unwrap();
    let first = whole_second_after(latest_since);
    // A first pass records the fleet's look, so later ticks count as on time.
    scheduler(db.dyn_store()).run_once(Some(latest_since)).await.unwrap();

    // Three hosts pass at once, at the same three clocks.
    let (mut a, mut b, mut c) = (scheduler(db.dyn_store()), scheduler(db.dyn_store()), scheduler(db.dyn_store()));
    for step in 0..3 {
        let now = Some(first + TimeDelta::milliseconds(1_000 * step + 300));
        let reports = tokio::join!(a.run_once(now), b.run_once(now), c.run_once(now));
        let enqueued: usize = [reports.0, reports.1, reports.2].into_iter().map(|r| r.unwrap().keyed.enqueued).sum();
        assert_eq!(enqueued, KEYS, "one job per key at {now:?}, whichever host wrote it");
    }
    let all = ticks(&db).await;
    let mut per_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, tick) in all {
        per_key.entry(key).or_default().push(tick);
    }
    assert_eq!(per_key.len(), KEYS);
    let expected: Vec<String> = (0..3).map(|n| text(first + TimeDelta::seconds(n))).collect();
    for (key, ticks) in &per_key {
        // A key written over a second before the last one has an earlier
        // tick, from the first pass: the one before `first`, once.
        let mut unique = ticks.clone();
        unique.dedup();
        assert_eq!(&unique, ticks, "{key}: no tick twice");
        let from_first: Vec<_> = ticks.iter().filter(|tick| **tick >= expected[0]).cloned().collect();
        assert_eq!(from_first, expected, "{key}: each tick once, none missing");
    }
    // Its jobs from `first` on (an earlier tick is there too when the
    // upserts took over a second).
    let customers: Vec<String> = db
        .texts(
            "SELECT (payload->>'_tick') || ' ' || CAST(payload->>'customer' AS TEXT) FROM jobhost.jobs
             WHERE payload->>'_schedule' = 'customer-007' ORDER BY 1",
        )
        .await
        .into_iter()
        .filter(|row| row.as_str() >= expected[0].as_str())
        .map(|row| row.split_once(' ').unwrap().1.to_string())
        .collect();
    assert_eq!(customers, ["7", "7", "7"], "the schedule's payload, with the tick and key added");
    let seven = status(&db, "customer-007").await;
    assert_eq!(seven.last_tick, Some(first + TimeDelta::seconds(2)));
    assert_eq!(seven.next_tick, Some(first + TimeDelta::seconds(3)));
    let last =
        db.texts(format!("SELECT payload->>'_tick' FROM jobhost.jobs WHERE id = {}", seven.last_job.unwrap())).await;
    assert_eq!(last, [text(first + TimeDelta::seconds(2))], "the latest tick's job");
}

async fn skip_enqueues_nothing_while_the_previous_job_has_not_ended(db: TestDb) {
    registered(&db, "report").await;
    let schedule = KeyedSchedule { overlap: Overlap::Skip, ..every_second("sync") };
    db.store.keyed_schedule_upsert(&schedule).await.unwrap();
    let since = status(&db, "sync").await.since;
    let first = whole_second_after(since);
    let mut host = scheduler(db.dyn_store());
    host.run_once(Some(since)).await.unwrap();

    host.run_once(Some(first + TimeDelta::milliseconds(100))).await.unwrap();
    let running = live_ids(&db).await;
    assert_eq!(running.len(), 1);
    // Three ticks while that job waits: each skipped, none enqueued.
    for n in 1..=3 {
        host.run_once(Some(first + TimeDelta::milliseconds(1_000 * n + 100))).await.unwrap();
    }
    assert_eq!(live_ids(&db).await, running, "never two at once");
    let sync = status(&db, "sync").await;
    assert_eq!((sync.skipped, sync.last_job), (3, Some(running[0])));
    assert_eq!(sync.last_tick, Some(first + TimeDelta::seconds(3)), "skipped ticks are done");

    db.store.job_cancel(running[0]).await.unwrap();
    host.run_once(Some(first + TimeDelta::milliseconds(4_100))).await.unwrap();
    let next = live_ids(&db).await;
    assert_eq!(next.len(), 1, "the next tick after the job ended is enqueued");
    assert_ne!(next, running);
    assert_eq!(ticks(&db).await.last().unwrap().1, text(first + TimeDelta::seconds(4)));
}

async fn buffer_one_keeps_one_tick_for_when_the_job_before_it_ends(db: TestDb) {
    registered(&db, "report").await;
    let schedule = KeyedSchedule { overlap: Overlap::BufferOne, ..every_second("sync") };
    db.store.keyed_schedule_upsert(&schedule).await.unwrap();
    let since = status(&db, "sync").await.since;
    let first = whole_second_after(since);
    let mut host = scheduler(db.dyn_store());
    host.run_once(Some(since)).await.unwrap();
    host.run_once(Some(first + TimeDelta::milliseconds(100))).await.unwrap();
    host.run_once(Some(first + TimeDelta::milliseconds(1_100))).await.unwrap();
    host.run_once(Some(first + TimeDelta::milliseconds(2_100))).await.unwrap();
    let running = live_ids(&db).await;
    assert_eq!(running.len(), 1, "the buffered tick waits without a job");
    let sync = status(&db, "sync").await;
    assert_eq!((sync.buffered_tick, sync.skipped), (Some(first + TimeDelta::seconds(1)), 1));

    db.store.job_cancel(running[0]).await.unwrap();
    let report = host.run_once(Some(first + TimeDelta::milliseconds(3_100))).await.unwrap();
    assert_eq!(report.keyed.enqueued, 1, "the buffered tick, before the tick due now");
    assert_eq!(ticks(&db).await.last().unwrap().1, text(first + TimeDelta::seconds(1)));
    let sync = status(&db, "sync").await;
    assert_eq!(sync.buffered_tick, Some(first + TimeDelta::seconds(3)), "the new tick waits behind it");
    assert_eq!(live_ids(&db).await.len(), 1);
}

async fn a_paused_schedule_ticks_nothing_and_resumes_from_its_next_tick(db: TestDb) {
    registered(&db, "report").await;
    db.store.keyed_schedule_upsert(&every_second("acme")).await.unwrap();
    let since = status(&db, "acme").await.since;
    let first = whole_second_after(since);
    let mut host = scheduler(db.dyn_store());
    host.run_once(Some(first + TimeDelta::milliseconds(100))).await.unwrap();
    assert_eq!(ticks(&db).await.len(), 1);

    assert!(db.store.keyed_schedule_pause("report", "acme", true, Some("customer asked")).await.unwrap());
    let paused = status(&db, "acme").await;
    assert!(paused.schedule.paused);
    assert_eq!(paused.schedule.note, "customer asked");
    // Long after the real clock's now: the pause holds however late.
    let far = first + TimeDelta::days(400);
    host.run_once(Some(far)).await.unwrap();
    assert_eq!(ticks(&db).await.len(), 1, "a paused schedule ticks nothing");

    assert!(db.store.keyed_schedule_pause("report", "acme", false, None).await.unwrap());
    let resumed = status(&db, "acme").await;
    assert!(!resumed.schedule.paused && resumed.schedule.note.is_empty());
    assert!(resumed.since > paused.since, "it counts from the resume");
    let after = whole_second_after(resumed.since);
    host.run_once(Some(after + TimeDelta::milliseconds(100))).await.unwrap();
    let all = ticks(&db).await;
    assert_eq!(all.len(), 2, "one more tick, the ticks while paused not made up: {all:?}");
    assert_eq!(all[1].1, text(after));

    assert!(db.store.keyed_schedule_remove("report", "acme").await.unwrap());
    assert!(!db.store.keyed_schedule_remove("report", "acme").await.unwrap(), "gone");
    host.run_once(Some(after + TimeDelta::seconds(5))).await.unwrap();
    assert_eq!(ticks(&db).await.len(), 2, "a removed schedule never ticks again");
    assert!(!db.store.keyed_schedule_pause("report", "acme", true, None).await.unwrap());
}

async fn a_tick_asked_for_now_is_enqueued_once_under_the_policy(db: TestDb) {
    registered(&db, "report").await;
    let schedule = KeyedSchedule { overlap: Overlap::Skip, ..KeyedSchedule::new("report", "acme", "0 0 9 1 1 *") };
    let client = jobhost::Client::from_store(db.dyn_store());
    assert!(client.schedule_upsert(&schedule).await.unwrap());
    assert_eq!(client.schedules(Some("report")).await.unwrap().len(), 1);
    let mut host = scheduler(db.dyn_store());
    host.run_once(None).await.unwrap();
    assert!(ticks(&db).await.is_empty(), "its calendar's next tick is in January");

    assert!(client.schedule_trigger("report", "acme").await.unwrap());
    assert!(status(&db, "acme").await.triggered_at.is_some());
    let report = host.run_once(None).await.unwrap();
    assert_eq!(report.keyed.enqueued, 1);
    let once = host.run_once(None).await.unwrap();
    assert_eq!(once.keyed.enqueued, 0, "a trigger ticks once");
    assert_eq!(status(&db, "acme").await.triggered_at, None);

    // Its job has not ended: under `skip`, another trigger is skipped.
    db.store.keyed_schedule_trigger("report", "acme").await.unwrap();
    host.run_once(None).await.unwrap();
    assert_eq!(ticks(&db).await.len(), 1);
    assert_eq!(status(&db, "acme").await.skipped, 1);
    assert!(!db.store.keyed_schedule_trigger("report", "nobody").await.unwrap());

    // A trigger waiting when the schedule is paused is dropped, and a
    // paused schedule refuses one: it ticks nothing.
    db.store.job_cancel(live_ids(&db).await[0]).await.unwrap();
    client.schedule_trigger("report", "acme").await.unwrap();
    client.schedule_pause("report", "acme", true, None).await.unwrap();
    assert_eq!(status(&db, "acme").await.triggered_at, None);
    match client.schedule_trigger("report", "acme").await {
        Err(Error::InvalidSchedule(reason)) => assert!(reason.contains("paused"), "{reason}"),
        other => panic!("{other:?}"),
    }
    client.schedule_pause("report", "acme", false, None).await.unwrap();
    host.run_once(None).await.unwrap();
    assert_eq!(ticks(&db).await.len(), 1, "nothing ran for the dropped trigger");

    // An application rewriting the schedule keeps an operator's pause.
    client.schedule_pause("report", "acme", true, Some("billing dispute")).await.unwrap();
    client
        .schedule_upsert(&KeyedSchedule {
            payload: serde_json::Map::from_iter([("v".into(), 2.into())]),
            ..schedule.clone()
        })
        .await
        .unwrap();
    let kept = status(&db, "acme").await;
    assert!(kept.schedule.paused && kept.schedule.note == "billing dispute", "{kept:?}");
    assert_eq!(kept.schedule.payload["v"], 2);
}

/// A change of the calendar while a tick of the old one is due and not yet
/// enqueued: that tick is still enqueued, the new calendar counts from the
/// change, and no tick is enqueued twice. Real clocks: the change's instant
/// is the database's.
async fn a_changed_calendar_hands_over_without_losing_or_doubling_a_tick(db: TestDb) {
    registered(&db, "report").await;
    db.store.keyed_schedule_upsert(&every_second("acme")).await.unwrap();
    let mut host = scheduler(db.dyn_store());
    let clock = || async {
        let text = db
            .texts(db.dialect(
                "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')",
                "SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
            ))
            .await;
        DateTime::parse_from_rfc3339(&text[0]).unwrap().to_utc()
    };
    let until = |at: DateTime<Utc>| async move {
        common::eventually(Duration::from_secs(20), || async { clock().await > at }).await;
    };
    let start = clock().await;
    until(whole_second_after(start) + TimeDelta::milliseconds(1_100)).await;
    host.run_once(None).await.unwrap();
    let before = ticks(&db).await;
    assert!(!before.is_empty());
    // No pass for over a second: the old calendar's next tick comes due.
    let due = whole_second_after(clock().await);
    until(due + TimeDelta::milliseconds(200)).await;
    db.store.keyed_schedule_upsert(&KeyedSchedule::new("report", "acme", "*/3 * * * * *")).await.unwrap();
    let changed_at = status(&db, "acme").await.since;
    until(changed_at + TimeDelta::seconds(4)).await;
    host.run_once(None).await.unwrap();

    let all: Vec<DateTime<Utc>> =
        ticks(&db).await.into_iter().map(|(_, t)| DateTime::parse_from_rfc3339(&t).unwrap().to_utc()).collect();
    let mut unique = all.clone();
    unique.dedup();
    assert_eq!(all, unique, "no tick twice");
    let (old, new): (Vec<_>, Vec<_>) = all.iter().partition(|tick| **tick <= changed_at);
    for pair in old.windows(2) {
        assert_eq!(pair[1] - pair[0], TimeDelta::seconds(1), "every old tick up to the change: {old:?}");
    }
    assert!(old.contains(&due), "the old calendar's tick due at the change was enqueued: {old:?}");
    assert!(!new.is_empty() && new.iter().all(|tick| tick.timestamp() % 3 == 0), "then the new calendar: {new:?}");
    assert!(status(&db, "acme").await.error.is_none());
}

/// A fixed-time schedule in Berlin across the spring-forward change: it
/// ticks once a day, at 02:30 local, the skipped day at the first instant
/// after the gap.
async fn a_zone_is_followed_through_a_daylight_saving_change(db: TestDb) {
    registered(&db, "report").await;
    let schedule =
        KeyedSchedule { time_zone: "Europe/Berlin".into(), ..KeyedSchedule::new("report", "berlin", "30 2 * * *") };
    db.store.keyed_schedule_upsert(&schedule).await.unwrap();
    let config = SchedulerConfig { max_pause: Duration::from_secs(3 * 86_400), ..SchedulerConfig::default() };
    let mut host = Scheduler::new(db.dyn_store(), config).unwrap();
    let at = |text: &str| DateTime::parse_from_rfc3339(text).unwrap().to_utc();
    for day in ["2027-03-26T12:00:00Z", "2027-03-27T12:00:00Z", "2027-03-28T12:00:00Z", "2027-03-29T12:00:00Z"] {
        host.run_once(Some(at(day))).await.unwrap();
    }
    let all: Vec<String> = ticks(&db).await.into_iter().map(|(_, t)| t).collect();
    let expected = ["2027-03-27T01:30:00Z", "2027-03-28T01:00:00Z", "2027-03-29T00:30:00Z"];
    assert_eq!(all.iter().rev().take(3).rev().map(String::as_str).collect::<Vec<_>>(), expected, "{all:?}");
}

async fn a_bad_schedule_is_refused_naming_the_field_and_nothing_is_stored(db: TestDb) {
    registered(&db, "report").await;
    let field_of = |result: jobhost::store::Result<bool>| match result {
        Err(Error::InvalidSchedule(reason)) => reason.split(':').next().unwrap().to_string(),
        other => panic!("{other:?}"),
    };
    let good = every_second("acme");
    let cases = [
        (KeyedSchedule { cron: "61 * * * *".into(), ..good.clone() }, "cron"),
        (KeyedSchedule { time_zone: "Mars/Olympus".into(), ..good.clone() }, "time_zone"),
        (KeyedSchedule { key: String::new(), ..good.clone() }, "key"),
        (KeyedSchedule { job: "nobody".into(), ..good.clone() }, "job"),
        (KeyedSchedule { jitter_ms: 90_000_000, ..good.clone() }, "jitter"),
    ];
    for (schedule, field) in cases {
        assert_eq!(field_of(db.store.keyed_schedule_upsert(&schedule).await), field);
    }
    let mut big = good.clone();
    big.payload.insert("blob".into(), serde_json::json!("x".repeat(2 << 20)));
    assert_eq!(field_of(db.store.keyed_schedule_upsert(&big).await), "payload");
    assert!(db.store.keyed_schedules(None, None).await.unwrap().is_empty(), "nothing stored");
}

/// A pass costs the schedules due: with thousands not due it looks at
/// those that are, and only those (counts, not times: the benchmark
/// measures the time).
async fn a_pass_looks_only_at_the_schedules_due(db: TestDb) {
    registered(&db, "report").await;
    const IDLE: i64 = 20_000;
    let insert = match db.backend {
        Backend::Postgres => {
            "INSERT INTO jobhost.keyed_schedules (job, key, cron, look_at)
             SELECT 'report', 'idle-' || n, '0 0 9 * * *', now() + interval '1 day' FROM generate_series(1, 20000) n"
        }
        Backend::Sqlite => {
            "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 20000)
             INSERT INTO keyed_schedules (job, key, cron, since, look_at, created_at, updated_at)
             SELECT 'report', 'idle-' || n, '0 0 9 * * *', 0, CAST(unixepoch('subsec') * 1000 AS INTEGER) + 86400000, 0, 0
             FROM s"
        }
    };
    db.execute(insert).await;
    for n in 0..7 {
        db.store.keyed_schedule_upsert(&every_second(&format!("due-{n}"))).await.unwrap();
    }
    let report = scheduler(db.dyn_store()).run_once(None).await.unwrap();
    assert_eq!(report.keyed.looked, 7, "the {IDLE} schedules not due were not looked at");
    let looked = db.scalar("SELECT count(*) FROM jobhost.keyed_schedules WHERE next_tick IS NOT NULL").await;
    assert_eq!(looked, 7);
}

/// A backfill enqueues each tick of a past range once, with its own tick:
/// the same range again enqueues nothing, an overlapping one only the new
/// ticks, a range in the future is refused.
async fn a_backfill_enqueues_each_tick_of_a_past_range_once(db: TestDb) {
    registered(&db, "report").await;
    let hourly = KeyedSchedule { overlap: Overlap::Skip, ..KeyedSchedule::new("report", "acme", "0 * * * *") };
    db.store.keyed_schedule_upsert(&hourly).await.unwrap();
    let at = |text: &str| DateTime::parse_from_rfc3339(text).unwrap().to_utc();
    let client = jobhost::Client::from_store(db.dyn_store());
    let first = client
        .schedule_backfill("report", "acme", at("2026-03-01T09:00:00Z"), at("2026-03-01T12:00:00Z"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.enqueued.len(), first.already), (4, 0), "every tick, whatever the overlap policy");
    let again = client
        .schedule_backfill("report", "acme", at("2026-03-01T10:30:00Z"), at("2026-03-01T14:00:00Z"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((again.enqueued.len(), again.already), (2, 2), "only the ticks not enqueued yet");
    let all: Vec<String> = ticks(&db).await.into_iter().map(|(_, tick)| tick).collect();
    let expected: Vec<String> = (9..=14).map(|h| format!("2026-03-01T{h:02}:00:00Z")).collect();
    assert_eq!(all, expected, "each tick once");
    let future = client.schedule_backfill("report", "acme", Utc::now(), Utc::now() + TimeDelta::hours(3)).await;
    assert!(matches!(future, Err(Error::InvalidSchedule(_))), "{future:?}");
    assert!(
        client
            .schedule_backfill("report", "nobody", at("2026-03-01T09:00:00Z"), at("2026-03-01T10:00:00Z"))
            .await
            .unwrap()
            .is_none()
    );
}

on_both_backends!(
    a_backfill_enqueues_each_tick_of_a_past_range_once,
    each_tick_of_each_key_is_enqueued_once_by_hosts_passing_at_once,
    skip_enqueues_nothing_while_the_previous_job_has_not_ended,
    buffer_one_keeps_one_tick_for_when_the_job_before_it_ends,
    a_paused_schedule_ticks_nothing_and_resumes_from_its_next_tick,
    a_tick_asked_for_now_is_enqueued_once_under_the_policy,
    a_changed_calendar_hands_over_without_losing_or_doubling_a_tick,
    a_zone_is_followed_through_a_daylight_saving_change,
    a_bad_schedule_is_refused_naming_the_field_and_nothing_is_stored,
    a_pass_looks_only_at_the_schedules_due,
    the_api_writes_pauses_triggers_and_removes_schedules,
    a_fleet_ticks_each_key_once_without_a_gap_through_a_killed_and_a_frozen_host,
);

/// PostgreSQL: an application writes and removes schedules in its own
/// transaction. A removal rolled back leaves the schedule ticking; one
/// committed ends it, and a pass meanwhile neither waits for the
/// application's lock nor ticks the row it holds. A bad field through SQL
/// is refused naming it.
mod sql {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_application_writes_and_removes_schedules_in_its_own_transaction() {
        let db = TestDb::new(Backend::Postgres).await;
        registered(&db, "report").await;
        let pool = db.pool();
        let created: bool = sqlx::query_scalar(
            "SELECT jobhost.schedule_upsert('report', 'acme', '* * * * * *', 'Europe/Berlin', '{\"plan\": \"pro\"}', 'skip')",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        assert!(created);
        let acme = status(&db, "acme").await;
        assert_eq!((acme.schedule.overlap, acme.schedule.time_zone.as_str()), (Overlap::Skip, "Europe/Berlin"));
        assert_eq!(acme.schedule.payload["plan"], "pro");

        for (call, field) in [
            ("'report', 'a', 'every day'", "cron"),
            ("'report', 'a', '* * * * *', 'Mars/Olympus'", "time_zone"),
            ("'report', 'a', '* * * * *', 'UTC', '[1]'", "payload"),
            ("'report', 'a', '* * * * *', 'UTC', '{}', 'sometimes'", "overlap"),
            ("'nobody', 'a', '* * * * *'", "job"),
            ("'report', '', '* * * * *'", "key"),
            ("'report', 'a', '* * * * *', 'UTC', '{}', 'allow', 0, 1, NULL, 'infinity'", "ends_at"),
            ("'report', 'a', '* * * * *', 'UTC', '{}', 'allow', 0, 1, '-infinity'", "starts_at"),
            ("'report', 'a', '* * * * *', 'UTC', '{}', 'allow', 0, 1, '270000-01-01'", "starts_at"),
        ] {
            let error = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT jobhost.schedule_upsert({call})")))
                .execute(pool)
                .await
                .unwrap_err();
            let message = error.as_database_error().unwrap().message().to_string();
            assert!(message.starts_with(&format!("invalid schedule: {field}:")), "{call}: {message}");
        }
        assert_eq!(db.store.keyed_schedules(None, None).await.unwrap().len(), 1, "nothing more stored");
        let direct = sqlx::query(
            "INSERT INTO jobhost.keyed_schedules (job, key, cron, ends_at) VALUES ('report', 'b', '* * * * *', 'infinity')",
        )
        .execute(pool)
        .await;
        assert!(direct.is_err(), "the table refuses a time hosts cannot read");

        // A first pass at the schedule's start finds no tick due: one made
        // now would still be live (no host runs jobs here), and `skip`
        // would skip every later tick behind it.
        let since = status(&db, "acme").await.since;
        let mut host = scheduler(db.dyn_store());
        host.run_once(Some(since)).await.unwrap();
        let mut app = pool.begin().await.unwrap();
        let removed: bool =
            sqlx::query_scalar("SELECT jobhost.schedule_remove('report', 'acme')").fetch_one(&mut *app).await.unwrap();
        assert!(removed);
        let base = ticks(&db).await.len();
        let later = Utc::now() + TimeDelta::seconds(3);
        let pass = host.run_once(Some(later)).await.unwrap();
        assert_eq!(pass.keyed.looked, 0, "the row the application holds is passed over, not waited for");
        app.rollback().await.unwrap();
        host.run_once(Some(later)).await.unwrap();
        assert!(ticks(&db).await.len() > base, "a removal rolled back leaves it ticking");

        let mut app = pool.begin().await.unwrap();
        sqlx::query("SELECT jobhost.schedule_remove('report', 'acme')").execute(&mut *app).await.unwrap();
        app.commit().await.unwrap();
        let after = ticks(&db).await.len();
        host.run_once(Some(later + TimeDelta::seconds(10))).await.unwrap();
        assert_eq!(ticks(&db).await.len(), after, "no tick after the removal commits");
    }
}

/// A schedule another transaction holds while passes go on keeps its late
/// ticks, even with no backfill: the fleet's record of its passes vouches
/// only up to the earliest schedule it left due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_held_by_another_transaction_keeps_its_ticks() {
    let db = TestDb::new(Backend::Postgres).await;
    registered(&db, "report").await;
    for key in ["held", "free"] {
        db.store.keyed_schedule_upsert(&KeyedSchedule { backfill: 0, ..every_second(key) }).await.unwrap();
    }
    let since = status(&db, "held").await.since.max(status(&db, "free").await.since);
    let first = whole_second_after(since);
    let mut host = scheduler(db.dyn_store());
    host.run_once(Some(first - TimeDelta::milliseconds(500))).await.unwrap();
    let mut app = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobhost.keyed_schedules WHERE key = 'held' FOR UPDATE")
        .execute(&mut *app)
        .await
        .unwrap();
    for n in 0..5 {
        let report = host.run_once(Some(first + TimeDelta::milliseconds(1_000 * n + 700))).await.unwrap();
        assert_eq!(report.keyed.looked, 1, "the held schedule is passed over");
    }
    app.commit().await.unwrap();
    host.run_once(Some(first + TimeDelta::milliseconds(4_900))).await.unwrap();
    let held: Vec<String> = ticks(&db).await.into_iter().filter(|(k, _)| k == "held").map(|(_, t)| t).collect();
    let expected: Vec<String> = (0..5).map(|n| text(first + TimeDelta::seconds(n))).collect();
    assert_eq!(held, expected, "every tick while it was held, late, none missed");
}

/// The CLI: add (refused when one exists), set, list at 80 columns, show,
/// pause with a note, trigger, remove; a bad field's error names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_writes_lists_and_removes_schedules() {
    let db = TestDb::new(Backend::Sqlite).await;
    registered(&db, "report").await;
    let run = |args: &[&str]| jobhost(&db, args);
    let text = |out: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let add = run(&[
        "schedule",
        "add",
        "report",
        "customer-42",
        "--cron",
        "0 9 * * MON",
        "--zone",
        "Europe/Berlin",
        "--payload",
        r#"{"customer": 42}"#,
        "--overlap",
        "skip",
        "--jitter",
        "90s",
    ]);
    assert!(add.status.success(), "{}", text(&add));
    assert!(text(&add).contains("schedule report \"customer-42\" added"), "{}", text(&add));
    let again = run(&["schedule", "add", "report", "customer-42", "--cron", "0 9 * * MON"]);
    assert!(!again.status.success() && text(&again).contains("`jobhost schedule set` replaces it"), "{}", text(&again));
    let bad = run(&["schedule", "set", "report", "customer-42", "--cron", "0 9 * * MON", "--zone", "Europe/Atlantis"]);
    assert!(!bad.status.success());
    assert!(text(&bad).contains("invalid schedule: time_zone:"), "{}", text(&bad));

    let paused = run(&["schedule", "pause", "report", "customer-42", "--note", "migrating their account"]);
    assert!(paused.status.success(), "{}", text(&paused));
    let list = run(&["schedules"]);
    let listed = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(listed.lines().all(|line| line.chars().count() <= 80), "{listed}");
    assert!(
        listed.contains("report \"customer-42\" \"0 9 * * MON\" in Europe/Berlin, skip, jitter 1m 30s"),
        "{listed}"
    );
    assert!(listed.contains("next tick paused") && listed.contains("note \"migrating their account\""), "{listed}");

    let show = run(&["schedule", "show", "report", "customer-42", "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!((shown["jitter_ms"].as_u64(), shown["paused"].as_bool()), (Some(90_000), Some(true)));
    assert_eq!(shown["payload"]["customer"], 42);

    assert!(run(&["schedule", "resume", "report", "customer-42"]).status.success());
    assert!(run(&["schedule", "trigger", "report", "customer-42"]).status.success());
    let backfill = run(&[
        "schedule",
        "backfill",
        "report",
        "customer-42",
        "--from",
        "2026-03-02T00:00:00Z",
        "--to",
        "2026-03-09T23:00:00Z",
    ]);
    assert!(text(&backfill).contains("2 ticks enqueued (jobs "), "{}", text(&backfill));
    assert!(status(&db, "customer-42").await.triggered_at.is_some());
    assert!(run(&["schedule", "remove", "report", "customer-42"]).status.success());
    let gone = run(&["schedule", "remove", "report", "customer-42"]);
    assert!(!gone.status.success() && text(&gone).contains("there is no schedule"), "{}", text(&gone));
}

/// The API: `PUT` creates (201) and replaces (200), a bad field is 400
/// naming it, a change without the token is refused, and pause, trigger
/// and `DELETE` answer as documented; an action's body is optional, and one
/// that does not read is a JSON 400.
async fn the_api_writes_pauses_triggers_and_removes_schedules(db: TestDb) {
    use axum::http::{Method, StatusCode};
    use common::http::{TOKEN, TestServer};
    registered(&db, "report").await;
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let put = |body: serde_json::Value, token: Option<&'static str>| {
        let server = &server;
        async move {
            let body = Some(("application/json", body.to_string()));
            server.send(Method::PUT, "/api/schedules/report/customer%2042", body, token).await
        }
    };
    let body = serde_json::json!({"cron": "0 9 * * MON", "time_zone": "Europe/Berlin", "payload": {"customer": 42},
                                  "overlap": "buffer-one", "jitter_ms": 30000});
    let created = put(body.clone(), Some(TOKEN)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let created = created.json();
    assert_eq!((created["key"].as_str(), created["overlap"].as_str()), (Some("customer 42"), Some("buffer_one")));
    assert_eq!(put(body.clone(), Some(TOKEN)).await.status, StatusCode::OK, "replaced");
    assert_eq!(put(body.clone(), None).await.status, StatusCode::UNAUTHORIZED);
    let bad = put(serde_json::json!({"cron": "0 9 * * MON", "time_zone": "Europe/Atlantis"}), Some(TOKEN)).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("invalid schedule: time_zone:"), "{}", bad.body);

    let listed = server.get("/api/schedules/keyed?job=report").await.json();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    for key in ["a/1", "b", "c"] {
        db.store.keyed_schedule_upsert(&KeyedSchedule::new("report", key, "0 9 * * *")).await.unwrap();
    }
    let keys = |answer: serde_json::Value| -> Vec<String> {
        answer.as_array().unwrap().iter().map(|s| s["key"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(keys(server.get("/api/schedules/keyed?limit=2").await.json()), ["a/1", "b"]);
    let next = server.get("/api/schedules/keyed?limit=2&after=report/b").await.json();
    assert_eq!(keys(next), ["c", "customer 42"], "the page after the last one's type and key");
    assert_eq!(
        keys(server.get("/api/schedules/keyed?after=report/a/1&limit=1").await.json()),
        ["b"],
        "a key may hold `/`"
    );
    for refused in
        ["/api/schedules/keyed?limit=0", "/api/schedules/keyed?limit=5001", "/api/schedules/keyed?after=report"]
    {
        assert_eq!(server.get(refused).await.status, StatusCode::BAD_REQUEST, "{refused}");
    }
    for key in ["a/1", "b", "c"] {
        db.store.keyed_schedule_remove("report", key).await.unwrap();
    }
    let paused = server.post("/api/schedules/report/customer%2042/pause", serde_json::json!({"note": "on hold"})).await;
    assert_eq!(paused.status, StatusCode::OK, "{}", paused.body);
    assert_eq!((paused.json()["paused"].as_bool(), paused.json()["note"].as_str()), (Some(true), Some("on hold")));
    let resumed = server.send(Method::POST, "/api/schedules/report/customer%2042/resume", None, Some(TOKEN)).await;
    assert_eq!(resumed.json()["paused"], false, "no body is the defaults");
    let garbled = Some(("application/json", "{\"note\": ".to_string()));
    let garbled = server.send(Method::POST, "/api/schedules/report/customer%2042/pause", garbled, Some(TOKEN)).await;
    assert_eq!(garbled.status, StatusCode::BAD_REQUEST);
    assert!(garbled.json()["error"].as_str().is_some_and(|e| e.contains("does not read")), "{}", garbled.body);
    let list = Some(("application/json", "\"on hold\"".to_string()));
    let list = server.send(Method::POST, "/api/schedules/report/customer%2042/pause", list, Some(TOKEN)).await;
    assert_eq!(list.status, StatusCode::BAD_REQUEST);
    assert!(!list.body.contains("ActBody"), "no Rust type named to the client: {}", list.body);
    let triggered = server.post("/api/schedules/report/customer%2042/trigger", serde_json::json!({})).await.json();
    assert!(triggered["triggered_at"].is_string(), "{triggered}");
    let removed = server.send(Method::DELETE, "/api/schedules/report/customer%2042", None, Some(TOKEN)).await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT);
    assert_eq!(server.get("/api/schedules/report/customer%2042").await.status, StatusCode::NOT_FOUND);
    let missing = server.post("/api/schedules/report/nobody/trigger", serde_json::json!({})).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    put(body.clone(), Some(TOKEN)).await;
    let range = serde_json::json!({"from": "2026-03-02T08:00:00Z", "to": "2026-03-16T08:00:00Z"});
    let backfilled = server.post("/api/schedules/report/customer%2042/backfill", range.clone()).await;
    assert_eq!(backfilled.status, StatusCode::OK, "{}", backfilled.body);
    assert_eq!(backfilled.json()["enqueued"].as_array().unwrap().len(), 3, "three Mondays at 09:00 in Berlin");
    let again = server.post("/api/schedules/report/customer%2042/backfill", range).await.json();
    assert_eq!((again["enqueued"].as_array().unwrap().len(), again["already"].as_u64()), (0, Some(3)));
}

/// A fleet of three `jobhost run` processes ticking many keyed schedules
/// every two seconds; one is killed (SIGKILL) mid-run, and on PostgreSQL
/// another is frozen (SIGSTOP) past its lease and thawed, perhaps holding
/// a pass's locks. Afterwards, from the database: each key's ticks once
/// each, every two seconds from its first to its last with no gap, and
/// every key ticking to the end. (SQLite: a process frozen while it holds
/// the file's write lock stops every process on the file, so it is killed.)
async fn a_fleet_ticks_each_key_once_without_a_gap_through_a_killed_and_a_frozen_host(db: TestDb) {
    use common::fleet::{ONE_FLEET, components, start_host, wait_serving};
    let _one = ONE_FLEET.lock().await;
    let keys = if db.backend == Backend::Postgres { 1_000 } else { 300 };
    let hello = common::job_config("hello");
    db.store.job_types_register(&[(hello, "seed".into())]).await.unwrap();
    for n in 0..keys {
        let schedule = KeyedSchedule::new("hello", format!("account-{n:04}"), "*/2 * * * * *");
        db.store.keyed_schedule_upsert(&schedule).await.unwrap();
    }
    let components = components(&["hello"]);
    let cache = tempfile::tempdir().unwrap();
    let mut hosts: Vec<_> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
    wait_serving(&db, &hosts.iter().collect::<Vec<_>>(), 1).await;

    let clock_ms =
        db.dialect("(extract(epoch FROM now()) * 1000)::bigint", "CAST(unixepoch('subsec') * 1000 AS INTEGER)");
    let clock = || async { db.scalar(format!("SELECT {clock_ms}")).await };
    let after = |ms: i64| async move {
        let until = clock().await + ms;
        common::eventually(Duration::from_secs(60), || async { clock().await >= until }).await;
    };
    let jobs = "SELECT count(*) FROM (SELECT id FROM jobhost.jobs WHERE job = 'hello'
                UNION ALL SELECT id FROM jobhost.archive WHERE job = 'hello') j";
    common::eventually(Duration::from_secs(60), || async { db.scalar(jobs).await >= 2 * keys }).await;
    hosts[0].signal(libc::SIGKILL);
    if db.backend == Backend::Postgres {
        hosts[1].signal(libc::SIGSTOP);
        after(4_000).await;
        hosts[1].signal(libc::SIGCONT);
    } else {
        hosts[1].signal(libc::SIGKILL);
    }
    after(6_000).await;
    for host in &mut hosts {
        if host.is_running() {
            host.stop().await;
        }
    }

    let rows = db
        .texts(
            "SELECT (payload->>'_schedule') || ' ' || (payload->>'_tick') FROM jobhost.jobs WHERE job = 'hello'
             UNION ALL
             SELECT (payload->>'_schedule') || ' ' || (payload->>'_tick') FROM jobhost.archive WHERE job = 'hello'
             ORDER BY 1",
        )
        .await;
    let mut per_key: BTreeMap<&str, Vec<DateTime<Utc>>> = BTreeMap::new();
    for row in &rows {
        let (key, tick) = row.split_once(' ').unwrap();
        per_key.entry(key).or_default().push(DateTime::parse_from_rfc3339(tick).unwrap().to_utc());
    }
    assert_eq!(per_key.len(), keys as usize, "every key ticked");
    let latest = per_key.values().filter_map(|ticks| ticks.last()).max().copied().unwrap();
    for (key, ticks) in &per_key {
        for pair in ticks.windows(2) {
            assert_eq!(pair[1] - pair[0], TimeDelta::seconds(2), "{key}: each tick once, no gap: {ticks:?}");
        }
        assert!(*ticks.last().unwrap() >= latest - TimeDelta::seconds(2), "{key} ticked to the end: {ticks:?}");
        assert!(ticks.len() >= 5, "{key} ticked through the faults: {ticks:?}");
    }
}
