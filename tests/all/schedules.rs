//! Schedules: each tick of a scheduled job type is enqueued exactly once,
//! decided by the database, however many hosts look and however they stop.
//!
//! Store-level tests drive the schedule loop's look (`Scheduler::run_once`)
//! with a given clock, on both backends: a new schedule starts at its
//! registration, missed ticks are caught up with the latest `backfill`
//! only, two hosts looking at once enqueue each tick once, a changed
//! calendar starts afresh, an unserved type does not tick, a refused tick
//! is skipped, a unique type's tick is skipped while an earlier tick's job
//! holds its key. Fleet tests run real `jobhost run` processes serving the
//! every-second `ticker` guest: three hosts on PostgreSQL with one killed
//! (SIGKILL) leave exactly one job per tick and no gap; a restart of every
//! host (on both backends) leaves no tick twice, and after the gap exactly
//! the latest three missed ticks (the ticker's backfill), then every tick.

use crate::common;

use std::time::Duration;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use jobhost::background::scheduler::{Scheduler, SchedulerConfig};
use jobhost::store::{HostInfo, Store};
use jobhost::types::{
    ConcurrencyConfig, JobConfig, OnConflict, OnDuplicate, ScheduleConfig, UniqueConfig, UniqueStrategy,
};

use common::db::{Backend, TestDb, jobhost, on_both_backends};
use common::eventually;
use common::fleet::{Host, ONE_FLEET, components, start_host, wait_serving};

const WITHIN: Duration = Duration::from_secs(90);

/// A job type ticking every second, with `backfill` and `payload`.
fn scheduled(name: &str, backfill: u32, payload: serde_json::Value) -> JobConfig {
    let schedule = ScheduleConfig {
        backfill,
        payload: payload.as_object().cloned().unwrap_or_default(),
        ..ScheduleConfig::new("* * * * * *")
    };
    JobConfig { schedule: Some(schedule), ..common::job_config(name) }
}

/// Registers `config` as a component with `digest` would.
async fn register(db: &TestDb, config: &JobConfig, digest: &str) {
    db.store.job_types_register(&[(config.clone(), digest.to_string())]).await.expect("registers");
}

/// A host row serving `types`, alive for minutes: a schedule ticks only
/// while a live host serves its type.
async fn serve(db: &TestDb, types: &[&str]) -> HostInfo {
    let host = HostInfo::current(types.iter().map(|t| t.to_string()).collect(), Duration::from_secs(120));
    db.store.host_upsert(&host).await.expect("host row");
    host
}

/// When the type's current calendar was registered.
async fn since(db: &TestDb, job: &str) -> DateTime<Utc> {
    let listing = db.store.schedule_list(None).await.unwrap();
    listing.schedules.iter().find(|s| s.job == job).unwrap_or_else(|| panic!("{job} is scheduled")).since
}

/// A look by a host that has not looked before, at `now`.
fn scheduler(store: Store) -> Scheduler {
    Scheduler::new(store, SchedulerConfig::default()).unwrap()
}

/// The ticks of `job`'s jobs, live or archived, sorted, as RFC 3339 text.
async fn tick_texts(db: &TestDb, job: &str) -> Vec<String> {
    db.texts(format!(
        "SELECT payload->>'_tick' FROM jobhost.jobs WHERE job = '{job}'
         UNION ALL SELECT payload->>'_tick' FROM jobhost.archive WHERE job = '{job}'
         ORDER BY 1"
    ))
    .await
}

fn text(tick: DateTime<Utc>) -> String {
    jobhost::calendar::tick_text(&tick)
}

fn seconds(n: i64) -> TimeDelta {
    TimeDelta::seconds(n)
}

async fn a_new_schedule_starts_at_its_registration_and_catches_up_with_the_latest_ticks(db: TestDb) {
    register(&db, &scheduled("report", 2, serde_json::json!({"scope": "all"})), "d1").await;
    serve(&db, &["report"]).await;
    let start = since(&db, "report").await;
    let whole = start.trunc_subsecs(0);

    // Nothing before the registration: a look at it finds nothing due.
    let mut host = scheduler(db.dyn_store());
    let look = host.run_once(Some(start)).await.unwrap();
    assert!(look.enqueued.is_empty(), "{look:?}");
    assert_eq!(look.next_tick, Some(whole + seconds(1)));

    // Twelve ticks later, longer than `max_pause` after any host looked: a
    // host starting then enqueues the latest two (its backfill).
    let mut starting = scheduler(db.dyn_store());
    let now = whole + TimeDelta::milliseconds(12_500);
    starting.run_once(Some(now)).await.unwrap();
    assert_eq!(tick_texts(&db, "report").await, [text(whole + seconds(11)), text(whole + seconds(12))]);
    let scopes = db.texts("SELECT payload->>'scope' FROM jobhost.jobs WHERE job = 'report'").await;
    assert_eq!(scopes, ["all", "all"], "the declared payload, with the tick added");

    // The same host looking on: every tick since its last look, even two at once.
    starting.run_once(Some(now + seconds(2))).await.unwrap();
    assert_eq!(tick_texts(&db, "report").await.len(), 4);
    assert_eq!(tick_texts(&db, "report").await[3], text(whole + seconds(14)));

    // After a pause longer than `max_pause` the ticks in between were missed.
    starting.run_once(Some(now + seconds(40))).await.unwrap();
    let ticks = tick_texts(&db, "report").await;
    assert_eq!(ticks[4..], [text(whole + seconds(51)), text(whole + seconds(52))]);
    assert_eq!(ticks.len(), 6);
}

/// Issue 32, item 2, as reproduced: a registration changing the calendar
/// (`*/2` to every second) was open while a host enqueued the old
/// calendar's next tick; the new calendar started at the transaction's
/// start and enqueued that tick again. It now starts where its row is
/// written, never before a tick already enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_written_while_a_calendar_change_is_open_is_not_enqueued_again() {
    let db = TestDb::postgres().await;
    let mut every_two = scheduled("report", 1, serde_json::json!({}));
    every_two.schedule.as_mut().unwrap().cron = "*/2 * * * * *".into();
    register(&db, &every_two, "d1").await;
    serve(&db, &["report"]).await;

    // The registration of another calendar, as a deploy would write it,
    // begins; a host looks at the schedule while it is open.
    let mut registration = db.pool().begin().await.unwrap();
    let opened: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&mut *registration).await.unwrap();
    let mut looking = scheduler(db.dyn_store());
    let even = |at: DateTime<Utc>| {
        let whole = at.trunc_subsecs(0) + seconds(1);
        if whole.timestamp() % 2 == 0 { whole } else { whole + seconds(1) }
    };
    let tick = even(opened.max(since(&db, "report").await));
    let look = looking.run_once(Some(tick + TimeDelta::milliseconds(100))).await.unwrap();
    assert_eq!(look.enqueued, [("report".to_string(), tick)], "the old calendar's tick, after the transaction began");

    let mut every_second = every_two.clone();
    every_second.schedule.as_mut().unwrap().cron = "* * * * * *".into();
    sqlx::query(
        "INSERT INTO jobhost.job_types (name, config, digest) VALUES ('report', $1, 'd2')
         ON CONFLICT (name) DO UPDATE SET config = excluded.config, digest = excluded.digest, updated_at = now()",
    )
    .bind(sqlx::types::Json(&every_second))
    .execute(&mut *registration)
    .await
    .unwrap();
    registration.commit().await.unwrap();

    let changed = &db.store.schedule_list(None).await.unwrap().schedules[0];
    assert_eq!(changed.schedule.cron, "* * * * * *");
    assert!(changed.cursor() >= tick, "the new calendar starts after the enqueued tick: {changed:?}");
    // The same host looks on, a second and a half later: the new calendar's
    // ticks since, and not the one already enqueued.
    looking.run_once(Some(tick + TimeDelta::milliseconds(1_600))).await.unwrap();
    assert_eq!(tick_texts(&db, "report").await, [text(tick), text(tick + seconds(1))]);
}

/// Issue 32, item 3, as reproduced: host A stopped (SIGSTOP) for less than
/// `max_pause` and host C started meanwhile; C, with no memory of earlier
/// looks, enqueued only the latest tick and moved the cursor past the
/// others, which were never enqueued. The fleet's latest look is in the
/// database: C carries on from A's look and enqueues every late tick.
async fn a_host_starting_while_the_fleet_looks_enqueues_every_late_tick(db: TestDb) {
    register(&db, &scheduled("report", 1, serde_json::json!({})), "d1").await;
    serve(&db, &["report"]).await;
    let whole = since(&db, "report").await.trunc_subsecs(0);
    let just_after = |tick: DateTime<Utc>| tick + TimeDelta::milliseconds(100);

    let mut a = scheduler(db.dyn_store());
    a.run_once(Some(just_after(whole + seconds(2)))).await.unwrap();
    assert_eq!(tick_texts(&db, "report").await, [text(whole + seconds(2))], "a new schedule's backfill of one");
    // A is frozen; C starts five seconds later, well within `max_pause`.
    let mut c = scheduler(db.dyn_store());
    let look = c.run_once(Some(just_after(whole + seconds(7)))).await.unwrap();
    let expected: Vec<String> = (2..=7).map(|n| text(whole + seconds(n))).collect();
    assert_eq!(tick_texts(&db, "report").await, expected, "every tick since the fleet's last look: {look:?}");
    // A wakes and looks: the cursor is past its ticks; nothing twice.
    a.run_once(Some(just_after(whole + seconds(8)))).await.unwrap();
    assert_eq!(tick_texts(&db, "report").await.len(), 7);
}

async fn two_hosts_looking_at_once_enqueue_each_tick_once(db: TestDb) {
    register(&db, &scheduled("report", 1, serde_json::json!({})), "d1").await;
    serve(&db, &["report"]).await;
    let whole = since(&db, "report").await.trunc_subsecs(0);
    // Each host with its own connections, as two processes would be.
    let other = jobhost::store::open(&db.url, 4).await.unwrap();
    let (mut a, mut b) = (scheduler(db.dyn_store()), scheduler(other));
    for step in 1..=20 {
        // Both look at the same moment, a tick or two apart each time.
        let now = whole + TimeDelta::milliseconds(700 * step + 100);
        let (first, second) = tokio::join!(a.run_once(Some(now)), b.run_once(Some(now)));
        let (first, second) = (first.unwrap(), second.unwrap());
        assert!(
            first.enqueued.is_empty() || second.enqueued.is_empty(),
            "both hosts enqueued ticks at {now}: {first:?} {second:?}"
        );
    }
    let ticks = tick_texts(&db, "report").await;
    let expected: Vec<String> = (1..=14).map(|n| text(whole + seconds(n))).collect();
    assert_eq!(ticks, expected, "every tick from the registration on, once");
}

async fn a_changed_calendar_starts_afresh_and_an_unserved_type_does_not_tick(db: TestDb) {
    let first = scheduled("report", 1, serde_json::json!({"v": 1}));
    register(&db, &first, "d1").await;
    let host = serve(&db, &["report"]).await;
    let registered = since(&db, "report").await;
    let mut looking = scheduler(db.dyn_store());
    looking.run_once(Some(registered + seconds(3))).await.unwrap();
    let last = db.store.schedule_list(None).await.unwrap().schedules[0].last_tick;
    assert!(last.is_some());

    // A new build with the same calendar (a new payload) keeps the cursor.
    register(&db, &scheduled("report", 1, serde_json::json!({"v": 2})), "d2").await;
    let kept = &db.store.schedule_list(None).await.unwrap().schedules[0];
    assert_eq!((kept.since, kept.last_tick), (registered, last));
    assert_eq!(kept.schedule.payload["v"], 2, "the tick's payload comes from the newest registration");

    // One with another calendar starts it afresh from its registration.
    let mut changed = scheduled("report", 1, serde_json::json!({"v": 3}));
    changed.schedule.as_mut().unwrap().cron = "*/5 * * * * *".into();
    register(&db, &changed, "d3").await;
    let fresh = &db.store.schedule_list(None).await.unwrap().schedules[0];
    assert!(fresh.since > registered && fresh.last_tick.is_none(), "{fresh:?}");
    assert!(fresh.since >= last.unwrap(), "never before a tick already enqueued: {fresh:?}");

    // No live host serves it: no tick, however much time passes.
    db.store.host_remove(&host.id).await.unwrap();
    let before = tick_texts(&db, "report").await.len();
    let look = looking.run_once(Some(fresh.since + seconds(60))).await.unwrap();
    assert!(look.enqueued.is_empty() && look.next_tick.is_none(), "{look:?}");
    assert_eq!(tick_texts(&db, "report").await.len(), before);
    assert!(!db.store.schedule_list(None).await.unwrap().schedules[0].served);

    // A build without a schedule removes it.
    register(&db, &common::job_config("report"), "d4").await;
    assert!(db.store.schedule_list(None).await.unwrap().schedules.is_empty());
}

async fn a_tick_the_enqueue_rules_refuse_is_skipped_not_retried(db: TestDb) {
    // The concurrency key needs a field the declared payload lacks.
    let mut config = scheduled("report", 3, serde_json::json!({}));
    config.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: jobhost::template::KeyTemplate::parse("acct:{account}").unwrap(),
        duration_secs: 10,
        on_conflict: OnConflict::Block,
    });
    register(&db, &config, "d1").await;
    serve(&db, &["report"]).await;
    let whole = since(&db, "report").await.trunc_subsecs(0);
    let mut looking = scheduler(db.dyn_store());
    let look = looking.run_once(Some(whole + TimeDelta::milliseconds(5_500))).await.unwrap();
    assert_eq!(look.refused.len(), 3, "{look:?}");
    assert!(look.refused[0].2.contains("account"), "the reason names the field: {look:?}");
    assert!(tick_texts(&db, "report").await.is_empty());
    let cursor = db.store.schedule_list(None).await.unwrap().schedules[0].last_tick;
    assert_eq!(cursor, Some(whole + seconds(5)), "the cursor moved past the refused ticks");
}

/// A unique type's tick whose key the job of an earlier tick still holds
/// (it waits, or runs) is a duplicate: the tick is skipped, so slow jobs
/// never pile up behind their schedule; once that job ends, ticks enqueue again.
async fn a_unique_types_tick_is_skipped_while_an_earlier_ticks_job_holds_its_key(db: TestDb) {
    let mut config = scheduled("report", 1, serde_json::json!({}));
    config.unique = Some(UniqueConfig {
        key: jobhost::template::KeyTemplate::parse("one-report").unwrap(),
        strategy: UniqueStrategy::UntilExecuted,
        on_duplicate: OnDuplicate::Skip,
    });
    register(&db, &config, "d1").await;
    serve(&db, &["report"]).await;
    let whole = since(&db, "report").await.trunc_subsecs(0);
    let mut looking = scheduler(db.dyn_store());
    let first = looking.run_once(Some(whole + TimeDelta::milliseconds(1_500))).await.unwrap();
    assert_eq!(first.enqueued, [("report".to_string(), whole + seconds(1))]);

    // Ticks 2 and 3 come due while tick 1's job still waits: duplicates of it.
    let look = looking.run_once(Some(whole + TimeDelta::milliseconds(3_500))).await.unwrap();
    assert!(look.enqueued.is_empty(), "{look:?}");
    let holders: Vec<i64> = look.duplicates.iter().map(|(_, _, holder)| *holder).collect();
    let first_id = db.scalar("SELECT id FROM jobhost.jobs WHERE job = 'report'").await;
    assert_eq!(holders, [first_id, first_id]);
    assert_eq!(tick_texts(&db, "report").await, [text(whole + seconds(1))]);
    let cursor = db.store.schedule_list(None).await.unwrap().schedules[0].last_tick;
    assert_eq!(cursor, Some(whole + seconds(3)), "the skipped ticks are done with");

    // Once it has run, the next tick is a job again.
    let fetched = db.store.job_fetch(&common::fetch_params("worker", &["report"], 1)).await.unwrap();
    db.store.job_finish(vec![common::finish(&fetched[0], common::completed())]).await.unwrap();
    let look = looking.run_once(Some(whole + TimeDelta::milliseconds(4_500))).await.unwrap();
    assert_eq!(look.enqueued, [("report".to_string(), whole + seconds(4))]);
}

async fn operators_list_schedules(db: TestDb) {
    register(&db, &scheduled("report", 2, serde_json::json!({})), "d1").await;
    let mut berlin = scheduled("digest", 1, serde_json::json!({}));
    berlin.schedule = Some(ScheduleConfig { time_zone: "Europe/Berlin".into(), ..ScheduleConfig::new("0 9 * * *") });
    register(&db, &berlin, "d1").await;
    serve(&db, &["report"]).await;
    let whole = since(&db, "report").await.trunc_subsecs(0);
    scheduler(db.dyn_store()).run_once(Some(whole + seconds(2))).await.unwrap();

    let output = jobhost(&db, &["schedules", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rows: Vec<serde_json::Value> =
        String::from_utf8(output.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2);
    let (digest, report) = (&rows[0], &rows[1]);
    assert_eq!((digest["job"].as_str(), digest["served"].as_bool()), (Some("digest"), Some(false)));
    assert_eq!((digest["cron"].as_str(), digest["time_zone"].as_str()), (Some("0 9 * * *"), Some("Europe/Berlin")));
    assert_eq!(digest["last_tick"], serde_json::Value::Null);
    assert_eq!(report["served"], true);
    let last_tick = (whole + seconds(2)).to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    assert_eq!(report["last_tick"].as_str(), Some(last_tick.as_str()));
    // Fixed width, to the microsecond, in UTC.
    for field in ["since", "last_tick", "next_tick"] {
        assert_eq!(report[field].as_str().map(str::len), Some(27), "{field}: {report}");
    }

    let table = jobhost(&db, &["schedules"]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains("digest \"0 9 * * *\" in Europe/Berlin, backfill 1, not served"), "{table}");
    assert!(table.contains("last tick none"), "{table}");
    assert!(table.lines().all(|line| line.len() <= 80), "fits 80 columns:\n{table}");
}

/// A host says which types it serves as soon as a component goes, not at
/// its next heartbeat (a minute away here): once the scheduled `ticker` is
/// removed from its directory, `jobhost schedules` says it is not served
/// within seconds. The scheduler's looks read the same `served`, so no tick
/// is enqueued for it after that.
async fn a_removed_scheduled_component_is_unserved_at_once_not_at_the_next_heartbeat(db: TestDb) {
    let host = common::TestHost::start(&db, &["ticker"], |config| {
        config.worker.heartbeat_interval = Duration::from_secs(60);
        config.worker.default_lease = Duration::from_secs(600);
    })
    .await;
    let served = || async {
        let output = jobhost(&db, &["schedules", "--json"]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let row: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        row["served"].as_bool().unwrap()
    };
    eventually(WITHIN, || async { served().await && ticker_count(&db).await >= 1 }).await;
    std::fs::remove_file(host.components.path().join("ticker.wasm")).unwrap();
    eventually(Duration::from_secs(20), || async { !served().await }).await;
    let serving = db.scalar(format!(
        "SELECT {}",
        db.dialect(
            "count(*) FROM jobhost.hosts WHERE 'ticker' = ANY(job_types)",
            "count(*) FROM jobhost.hosts, json_each(hosts.job_types) WHERE json_each.value = 'ticker'",
        )
    ));
    assert_eq!(serving.await, 0, "the host's row no longer lists the type");
    host.stop().await;
}

on_both_backends!(
    a_new_schedule_starts_at_its_registration_and_catches_up_with_the_latest_ticks,
    two_hosts_looking_at_once_enqueue_each_tick_once,
    a_changed_calendar_starts_afresh_and_an_unserved_type_does_not_tick,
    a_host_starting_while_the_fleet_looks_enqueues_every_late_tick,
    a_tick_the_enqueue_rules_refuse_is_skipped_not_retried,
    a_unique_types_tick_is_skipped_while_an_earlier_ticks_job_holds_its_key,
    operators_list_schedules,
    a_removed_scheduled_component_is_unserved_at_once_not_at_the_next_heartbeat,
    a_restart_catches_up_with_the_latest_missed_ticks_and_repeats_none,
);

/// Every ticker job, live or archived: its tick and the time its enqueue
/// committed (ms; the jobs of one transaction share it), by tick.
async fn ticker_jobs(db: &TestDb) -> Vec<(DateTime<Utc>, i64)> {
    let at = db.dialect("(extract(epoch FROM enqueued_at) * 1000)::bigint", "enqueued_at");
    let rows: Vec<(String, i64)> = db
        .rows(format!(
            "SELECT payload->>'_tick', {at} FROM jobhost.jobs WHERE job = 'ticker'
             UNION ALL SELECT payload->>'_tick', {at} FROM jobhost.archive WHERE job = 'ticker'"
        ))
        .await;
    let mut jobs: Vec<(DateTime<Utc>, i64)> = rows
        .into_iter()
        .map(|(tick, at)| (DateTime::parse_from_rfc3339(&tick).expect("an RFC 3339 tick").to_utc(), at))
        .collect();
    jobs.sort();
    jobs
}

async fn ticker_count(db: &TestDb) -> i64 {
    db.scalar("SELECT (SELECT count(*) FROM jobhost.jobs WHERE job = 'ticker') + (SELECT count(*) FROM jobhost.archive WHERE job = 'ticker')")
        .await
}

/// Asserts no tick has two jobs, and the ticks run one second apart with no gap.
fn assert_once_each_without_gaps(ticks: &[DateTime<Utc>], what: &str) {
    for pair in ticks.windows(2) {
        assert!(pair[1] != pair[0], "{what}: tick {} was enqueued twice", pair[0]);
        assert_eq!(pair[1] - pair[0], seconds(1), "{what}: no tick between {} and {}", pair[0], pair[1]);
    }
}

/// Asserts every completed ticker job reported its own tick, and started
/// no earlier than it (one machine: the guests' clock is the database's).
async fn ran_their_own_ticks(db: &TestDb) {
    let rows: Vec<(String, String)> = db
        .rows(
            "SELECT payload->>'_tick', output->>'tick' || ' ' || (output->>'started_ms')
             FROM jobhost.archive WHERE job = 'ticker' AND state = 'completed'",
        )
        .await;
    if rows.is_empty() {
        let states: Vec<(String, i64)> = db
            .rows(
                "SELECT state, count(*) FROM jobhost.jobs WHERE job = 'ticker' GROUP BY 1
                 UNION ALL SELECT state, count(*) FROM jobhost.archive WHERE job = 'ticker' GROUP BY 1",
            )
            .await;
        panic!("no ticker job completed; by state: {states:?}");
    }
    for (tick, reported) in rows {
        let (reported_tick, started_ms) = reported.split_once(' ').unwrap();
        assert_eq!(reported_tick, tick);
        let tick_ms = DateTime::parse_from_rfc3339(&tick).unwrap().timestamp_millis();
        assert!(started_ms.parse::<i64>().unwrap() >= tick_ms, "the job of tick {tick} started before it");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_enqueue_each_tick_once_through_a_killed_host() {
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = components(&["ticker"]);
    let cache = tempfile::tempdir().unwrap();
    let mut hosts: Vec<Host> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
    wait_serving(&db, &hosts.iter().collect::<Vec<_>>(), 1).await;

    eventually(WITHIN, || async { ticker_count(&db).await >= 5 }).await;
    hosts[0].signal(libc::SIGKILL);
    let at_kill = ticker_count(&db).await;
    // About fifteen seconds more of ticks, from the two hosts left.
    eventually(WITHIN, || async { ticker_count(&db).await >= at_kill + 15 }).await;
    hosts[0].wait().await;
    for host in &mut hosts[1..] {
        host.stop().await;
    }

    let ticks: Vec<DateTime<Utc>> = ticker_jobs(&db).await.into_iter().map(|(tick, _)| tick).collect();
    assert!(ticks.len() >= 20, "{} ticks", ticks.len());
    assert_once_each_without_gaps(&ticks, "three hosts, one killed");
    assert_eq!(
        db.scalar("SELECT count(DISTINCT payload->>'_tick') FROM (SELECT payload FROM jobhost.jobs WHERE job = 'ticker' UNION ALL SELECT payload FROM jobhost.archive WHERE job = 'ticker') j").await,
        ticks.len() as i64,
        "one job per tick, by the database"
    );
    assert!(ticks[0] > since(&db, "ticker").await, "no tick from before the registration");
    ran_their_own_ticks(&db).await;
}

/// Every host stops (gracefully), the fleet stays down for several ticks,
/// and starts again: no tick is enqueued twice; after the gap the first
/// look enqueues the latest three missed ticks (the ticker's backfill) in
/// one transaction and none older; from then on every tick. Two hosts on
/// PostgreSQL, one on SQLite.
async fn a_restart_catches_up_with_the_latest_missed_ticks_and_repeats_none(db: TestDb) {
    const BACKFILL: usize = 3;
    let _one = ONE_FLEET.lock().await;
    let count = if db.backend == Backend::Postgres { 2 } else { 1 };
    let components = components(&["ticker"]);
    let cache = tempfile::tempdir().unwrap();
    let start = || -> Vec<Host> { (0..count).map(|_| start_host(&db, components.path(), cache.path())).collect() };

    let mut hosts = start();
    wait_serving(&db, &hosts.iter().collect::<Vec<_>>(), 1).await;
    eventually(WITHIN, || async { ticker_count(&db).await >= 4 }).await;
    for host in &mut hosts {
        host.stop().await;
    }
    let before = ticker_jobs(&db).await;
    let last_before = before.last().expect("ticks before the stop").0;

    // Down for more ticks than the backfill, and longer than a pause the
    // fleet still counts as looking (`max_pause`), by the clock ticks are
    // read by: a shorter gap's ticks would all be enqueued, as late ones.
    let clock = db.dialect("(extract(epoch FROM now()) * 1000)::bigint", "CAST(unixepoch('subsec') * 1000 AS INTEGER)");
    let max_pause = SchedulerConfig::default().max_pause.as_secs() as i64;
    let down_until = (last_before + seconds((BACKFILL as i64 + 4).max(max_pause + 2))).timestamp_millis();
    eventually(WITHIN, || async { db.scalar(format!("SELECT {clock}")).await > down_until }).await;

    let mut hosts = start();
    wait_serving(&db, &hosts.iter().collect::<Vec<_>>(), 1).await;
    let restarted = before.len() as i64 + BACKFILL as i64 + 5;
    eventually(WITHIN, || async { ticker_count(&db).await >= restarted }).await;
    for host in &mut hosts {
        host.stop().await;
    }

    let jobs = ticker_jobs(&db).await;
    let ticks: Vec<DateTime<Utc>> = jobs.iter().map(|(tick, _)| *tick).collect();
    let (old, new): (Vec<_>, Vec<_>) = jobs.iter().partition(|(tick, _)| *tick <= last_before);
    assert_eq!(old.len(), before.len(), "nothing was enqueued for ticks before the stop after it");
    assert_once_each_without_gaps(&ticks[..old.len()], "before the stop");
    assert_once_each_without_gaps(&ticks[old.len()..], "after the restart");

    // The first write after the restart: the latest BACKFILL missed ticks, at once.
    let first_write = new.iter().map(|(_, at)| *at).min().unwrap();
    let caught_up: Vec<DateTime<Utc>> = new.iter().filter(|(_, at)| *at == first_write).map(|(t, _)| *t).collect();
    assert_eq!(caught_up.len(), BACKFILL, "one catch-up write of the backfill: {caught_up:?}");
    assert_eq!(caught_up[0], new[0].0, "nothing older than the catch-up was enqueued after the gap");
    assert!(
        caught_up[0] > last_before + seconds(BACKFILL as i64),
        "the gap's older ticks were missed, not enqueued: last before {last_before}, first after {}",
        caught_up[0]
    );
    ran_their_own_ticks(&db).await;
}
