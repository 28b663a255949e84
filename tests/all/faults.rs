//! Fault injection on a fleet of real `jobhost run` processes sharing one
//! PostgreSQL database, serving a limited job type (`limited`: 2 runs at
//! once per payload `key`, its 10 s `duration` as lease, blocking on
//! conflict) and an unlimited one (`sleep`), or `serial` (1 run at once per
//! key, a 1 s lease). The faults: one host cut off from the database past
//! its leases, every database session terminated over and over, the server
//! restarted, the answer to a committed write of results lost on its
//! way back, a connection lost unseen under a write, and writes failing
//! for longer than a lease. After each, from the database and the times the guests
//! report: every job completed exactly once, no key ever ran more than its
//! limit at once, nothing is left (no job, blocked job or slot, nothing for
//! the repair to fix), and while the fleet worked, every slot belonged to
//! a live job.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use jobhost::store::EnqueueParams;
use serde_json::json;

use common::db::{Backend, TestDb};
use common::eventually;
use common::fleet::{
    Host, ONE_FLEET, assert_slots_match_jobs, completed_once, components, drained, host_command, host_command_beating,
    most_at_once, nothing_left, redone_after, runs_by_key, start_host, wait_serving, within_limits,
};
use common::pg_server::PgServer;
use common::proxy::{Proxy, server_address, url_via};
use common::run_log::{self, clock};

/// The bound on each wait for the fleet.
const WITHIN: Duration = Duration::from_secs(60);

/// The job types every host here serves.
const GUESTS: [&str; 2] = ["limited", "sleep"];

fn limited(i: usize, key: usize, ms: u64) -> EnqueueParams {
    EnqueueParams::new("limited", json!({"key": format!("k{key}"), "ms": ms, "i": i}))
}

fn sleep(i: usize, ms: u64) -> EnqueueParams {
    EnqueueParams::new("sleep", json!({"ms": ms, "i": i}))
}

/// Enqueues `limited` limited jobs spread over `keys` keys and `sleeps`
/// sleep jobs, each of its type's `ms`, interleaved.
async fn enqueue_mix(
    db: &TestDb,
    (limited_jobs, keys, limited_ms): (usize, usize, u64),
    (sleeps, sleep_ms): (usize, u64),
) {
    let mut jobs: Vec<EnqueueParams> = Vec::with_capacity(limited_jobs + sleeps);
    for i in 0..limited_jobs.max(sleeps) {
        if i < limited_jobs {
            jobs.push(limited(i, i % keys, limited_ms));
        }
        if i < sleeps {
            jobs.push(sleep(i, sleep_ms));
        }
    }
    db.store.job_enqueue(&jobs).await.expect("enqueue");
}

/// Keeps checking the slots against the live jobs for `span`.
async fn sample_for(db: &TestDb, span: Duration) {
    let until = tokio::time::Instant::now() + span;
    while tokio::time::Instant::now() < until {
        assert_slots_match_jobs(db).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Jobs queued, running or blocked.
async fn unfinished(db: &TestDb) -> i64 {
    db.scalar("SELECT (SELECT count(*) FROM jobhost.jobs) + (SELECT count(*) FROM jobhost.blocked_jobs)").await
}

/// Waits until each of `hosts` runs jobs.
async fn all_running(db: &TestDb, hosts: &[Host]) {
    for host in hosts {
        let running = format!(
            "SELECT count(*) FROM jobhost.jobs WHERE state = 'running' AND host_id LIKE '{}'",
            host.id_pattern()
        );
        eventually(WITHIN, || async { db.scalar(&running).await > 0 }).await;
    }
}

/// Stops every host with SIGTERM, checking first that each recovered by
/// itself and is still the process the test started.
async fn stop_all(hosts: &mut [Host]) {
    for host in hosts.iter_mut() {
        assert!(host.is_running(), "host {} is still running, recovered without a restart", host.pid());
    }
    for host in hosts {
        host.stop().await;
    }
}

/// Now, in microseconds since the Unix epoch, as the guests and logs tell time.
fn now_us() -> i64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    since_epoch.as_micros() as i64
}

/// The complete lines of a log another process is writing.
fn complete_lines(path: &Path) -> String {
    let mut text = std::fs::read_to_string(path).expect("read the host's log");
    text.truncate(text.rfind('\n').map_or(0, |end| end + 1));
    text
}

/// A host connected through `proxy`, logging at debug level to `log`.
fn host_via_proxy(db: &TestDb, proxy: &Proxy, components: &Path, cache: &Path, log: &Path) -> Host {
    Host::start(
        host_command(&url_via(&db.url, proxy.port()), components, cache)
            .env("RUST_LOG", "warn,jobhost=debug")
            .stderr(std::fs::File::create(log).expect("create the host's log")),
    )
}

/// Guarantee 6, end to end: a host that cannot reach the database (a cut
/// cable: its connections neither answer nor close) stops its guests
/// before their leases expire, so no run overlaps the job's next owner's
/// and no key runs beyond its limit. The partitioned host's own log tells
/// when its runs really ended; the completing runs' outputs tell when the
/// next owners started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_host_stops_its_guests_before_its_leases_expire() {
    // Two long runs per key take every slot, outlasting the lease (10 s) by
    // far; two short ones per key are blocked behind them.
    const KEYS: usize = 4;
    const LONG: usize = 2 * KEYS;
    const LONG_MS: u64 = 14_000;
    const SHORT_MS: u64 = 300;
    const SLEEPS: usize = 200;
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = components(&GUESTS);
    let cache = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(server_address()).await;
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("partitioned.log");

    // Alone at first, so that it is the host that takes the long runs. Its
    // heartbeat of two seconds puts its fence a second before the
    // database's expiry: room for a busy machine's scheduling (with half a
    // second, CI failed this test once, its message not kept), well inside
    // the limited jobs' 10 s lease, which the long runs outlast by 4 s.
    let mut hosts = vec![Host::start(
        host_command_beating(&url_via(&db.url, proxy.port()), components.path(), cache.path(), "2s", "4s")
            .env("RUST_LOG", "warn,jobhost=debug")
            .stderr(std::fs::File::create(&log).expect("create the host's log")),
    )];
    wait_serving(&db, &[&hosts[0]], GUESTS.len()).await;
    let jobs: Vec<_> = (0..2 * LONG).map(|i| limited(i, i % KEYS, if i < LONG { LONG_MS } else { SHORT_MS })).collect();
    db.store.job_enqueue(&jobs).await.expect("enqueue");
    let pattern = hosts[0].id_pattern();
    let running = format!(
        "SELECT count(*) FROM jobhost.jobs WHERE job = 'limited' AND state = 'running' AND host_id LIKE '{pattern}'"
    );
    eventually(WITHIN, || async { db.scalar(&running).await == LONG as i64 }).await;
    eventually(WITHIN, || async { run_log::runs(&complete_lines(&log)).len() == LONG }).await;

    proxy.freeze();
    let frozen_at = now_us();
    eprintln!("stage: cut off a host running {LONG} limited jobs at {}", clock(frozen_at));
    hosts.push(start_host(&db, components.path(), cache.path()));
    hosts.push(start_host(&db, components.path(), cache.path()));
    wait_serving(&db, &[&hosts[1], &hosts[2]], GUESTS.len()).await;
    db.store.job_enqueue(&(0..SLEEPS).map(|i| sleep(i, 20)).collect::<Vec<_>>()).await.expect("enqueue");

    // Cut off past its leases, until the others have taken all its jobs
    // over, and a little longer.
    let held = format!("SELECT count(*) FROM jobhost.jobs WHERE host_id LIKE '{pattern}'");
    eventually(Duration::from_secs(30), || async {
        assert_slots_match_jobs(&db).await;
        db.scalar(&held).await == 0
    })
    .await;
    eprintln!("stage: its jobs were taken over at {}", clock(now_us()));
    sample_for(&db, Duration::from_secs(2)).await;
    proxy.thaw();
    eprintln!("stage: reconnected at {}; draining", clock(now_us()));
    drained(&db, WITHIN).await;
    stop_all(&mut hosts).await;

    completed_once(&db, "limited", 2 * LONG).await;
    completed_once(&db, "sleep", SLEEPS).await;
    nothing_left(&db).await;
    assert!(
        redone_after(&db, &hosts[0]).await >= LONG as i64,
        "the partitioned host's limited jobs were taken over after their leases expired"
    );

    // Each job's completing run: on which host, when it started, its key.
    let completing: HashMap<i64, (String, i64, String)> = db
        .rows::<(i64, String, i64, String)>(
            "SELECT id, coalesce(host_id, ''), (output->>'started_us')::bigint, coalesce(concurrency_key, '')
             FROM jobhost.archive WHERE state = 'completed'",
        )
        .await
        .into_iter()
        .map(|(id, host, started_us, key)| (id, (host, started_us, key)))
        .collect();
    let partitioned_id = format!("-{}-", hosts[0].pid());
    let mut overtaken = 0;
    // The least time between an overtaken run's end and its job's next start.
    let mut closest_us = i64::MAX;
    let mut overlaps = Vec::new();
    let mut stale_by_key: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for run in run_log::runs(&complete_lines(&log)) {
        let Some(ended_us) = run.ended_us else {
            panic!("the partitioned host's run of job {} (lease token {}) never ended", run.job_id, run.lease_token)
        };
        if ended_us < frozen_at {
            continue;
        }
        let (host, next_started_us, key) = &completing[&run.job_id];
        let completed_here = host.contains(&partitioned_id) && (run.started_us..=ended_us).contains(next_started_us);
        if completed_here {
            continue;
        }
        overtaken += 1;
        closest_us = closest_us.min(next_started_us - ended_us);
        if run.job == "limited" {
            stale_by_key
                .entry(key.clone())
                .or_default()
                .push(((run.started_us / 1000) as u64, (ended_us / 1000) as u64));
        }
        if ended_us >= *next_started_us {
            overlaps.push(format!(
                "job {} ({} key {key:?}): the partitioned host's run (lease token {}) started {} and ran until {}, \
                 {} ms after the job's next owner started it at {}",
                run.job_id,
                run.job,
                run.lease_token,
                clock(run.started_us),
                clock(ended_us),
                (ended_us - next_started_us) / 1000,
                clock(*next_started_us),
            ));
        }
    }
    assert!(overtaken >= LONG, "the partition overtook the {LONG} long runs, not {overtaken}");
    let closest = match closest_us {
        ..0 => format!("ran {} ms past", -closest_us / 1000),
        _ => format!("ended {} ms before", closest_us / 1000),
    };
    eprintln!("stage: {overtaken} overtaken runs; the closest {closest} its next owner's start");
    assert!(
        overlaps.is_empty(),
        "a host cut off from the database (at {}) must stop its guests before their leases expire \
         (guarantee 6), but it ran beside the jobs' next owners:\n{}",
        clock(frozen_at),
        overlaps.join("\n")
    );
    for (key, mut runs) in runs_by_key(&db, "limited").await {
        let stale = stale_by_key.remove(&key).unwrap_or_default();
        let partitioned_runs = stale.len();
        runs.extend(stale);
        let most = most_at_once(runs);
        assert!(
            most <= 2,
            "limited key {key} ran {most} at once, over its limit of 2, counting the partitioned host's \
             {partitioned_runs} overtaken run(s)"
        );
    }
}

/// Every session of every host is terminated over and over while the fleet
/// works (as a failover or an operator would); the hosts reconnect by
/// themselves and lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_terminated_repeatedly_loses_nothing() {
    const LIMITED: usize = 600;
    const KEYS: usize = 10;
    const SLEEPS: usize = 2_000;
    const ROUNDS: usize = 40;
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = components(&GUESTS);
    let cache = tempfile::tempdir().unwrap();
    let mut hosts: Vec<Host> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
    wait_serving(&db, &hosts.iter().collect::<Vec<_>>(), GUESTS.len()).await;
    enqueue_mix(&db, (LIMITED, KEYS, 30), (SLEEPS, 10)).await;
    all_running(&db, &hosts).await;

    // The hosts' sessions are named `jobhost`; so are the idle ones of the
    // test's store, which reconnect like a host's. The checks' own are
    // named apart, and keep checking throughout.
    let terminate = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = 'jobhost' AND pid <> pg_backend_pid()";
    let (mut rounds, mut terminated) = (0, 0);
    while rounds < ROUNDS && unfinished(&db).await > 0 {
        terminated += db.scalar(terminate).await;
        rounds += 1;
        sample_for(&db, Duration::from_millis(300)).await;
    }
    eprintln!("stage: {rounds} rounds terminated {terminated} sessions; draining");
    assert!(rounds >= 5, "the fleet still had work through {rounds} rounds of terminations only");
    assert!(terminated >= rounds as i64, "the rounds found sessions to terminate: {terminated} in {rounds}");

    drained(&db, WITHIN).await;
    completed_once(&db, "limited", LIMITED).await;
    completed_once(&db, "sleep", SLEEPS).await;
    within_limits(&db, "limited").await;
    nothing_left(&db).await;
    stop_all(&mut hosts).await;
}

/// A pooled connection whose session the server ended while it sat idle
/// (a restart, a failover) is pinged before its next use and replaced: the
/// caller never sees the dead session. Only connections idle a while are
/// pinged (a busy one goes straight to its statement; BENCHMARKS.md, "Pings
/// only for idle connections"), so the connection here is left idle well
/// past that first.
#[tokio::test]
async fn an_idle_connection_whose_session_ended_is_replaced_before_use() {
    let db = TestDb::postgres().await;
    let store = jobhost::store::open(&db.url, 1).await.unwrap();
    store.job_stats().await.expect("the store's one connection works");
    let sessions = "SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND application_name = 'jobhost'";
    let terminate = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = 'jobhost'";
    assert!(db.scalar(terminate).await >= 1, "the store's session was ended");
    assert_eq!(db.scalar(sessions).await, 0, "no jobhost session is left");
    // Idle past the ping threshold (100 ms), as after any restart.
    tokio::time::sleep(Duration::from_millis(400)).await;
    store.job_stats().await.expect("the dead connection was replaced before use, not handed out");
    assert!(db.scalar(sessions).await >= 1, "the store opened a new session");
}

/// Two `mail` jobs enqueued and leased to host "h" through `store`.
async fn two_leased(db: &TestDb, store: &jobhost::store::Store) -> Vec<jobhost::store::FetchedJob> {
    store.job_types_register(&[(common::job_config("mail"), "v1".to_string())]).await.unwrap();
    store.job_enqueue(&[EnqueueParams::new("mail", json!({})), EnqueueParams::new("mail", json!({}))]).await.unwrap();
    let runs = db.fetch("mail", 2).await;
    assert_eq!(runs.len(), 2, "both jobs leased");
    runs
}

/// Result writes keep their own connection between writes instead of the
/// pool's (BENCHMARKS.md, "The result writer's own connection"); like the
/// pool's, it is checked after 100 ms idle, so a session a restart ended is
/// replaced before the next write, which neither fails nor is lost.
#[tokio::test]
async fn the_result_writers_idle_connection_whose_session_ended_is_replaced() {
    let db = TestDb::postgres().await;
    let store = jobhost::store::open(&db.url, 2).await.unwrap();
    let runs = two_leased(&db, &store).await;
    let written = store.job_finish(vec![common::finish(&runs[0], common::completed())]).await.unwrap();
    assert_eq!(written.len(), 1, "the first result written");
    let terminate = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = 'jobhost'";
    assert!(db.scalar(terminate).await >= 1, "the store's sessions, the writer's among them, were ended");
    // Idle past the ping threshold (100 ms), as after any restart.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let written = store.job_finish(vec![common::finish(&runs[1], common::completed())]).await;
    assert!(written.is_ok(), "the dead connection was replaced before the write, not used: {written:?}");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive").await, 2, "both results written");
}

/// A result write given up while its statement waits (its future dropped,
/// as at a host's write deadline) closes its connection: the next write
/// opens another, so it neither waits behind the abandoned statement nor
/// reads that statement's reply as its own. The abandoned statement still
/// runs once the lock is free, and its result is written once.
#[tokio::test]
async fn a_result_write_given_up_mid_statement_leaves_its_connection_to_no_later_write() {
    let db = TestDb::postgres().await;
    let store = jobhost::store::open(&db.url, 4).await.unwrap();
    let runs = two_leased(&db, &store).await;
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobhost.jobs WHERE id = $1 FOR UPDATE")
        .bind(runs[0].id)
        .execute(&mut *holder)
        .await
        .unwrap();
    let first = store.job_finish(vec![common::finish(&runs[0], common::completed())]);
    let gave_up = tokio::time::timeout(Duration::from_millis(300), first).await;
    assert!(gave_up.is_err(), "the first write waits for the job's row");
    let second = store.job_finish(vec![common::finish(&runs[1], common::completed())]);
    let written = tokio::time::timeout(Duration::from_secs(20), second)
        .await
        .expect("the second write does not wait behind the abandoned statement")
        .expect("the second write gets its own answer");
    assert!(
        matches!(written[..], [jobhost::store::FinishResult::Done]),
        "the answer is the second write's own, its result written: {written:?}"
    );
    holder.rollback().await.unwrap();
    let first_id = runs[0].id;
    eventually(Duration::from_secs(20), || async {
        db.scalar(format!("SELECT count(*) FROM jobhost.archive WHERE id = {first_id}")).await == 1
    })
    .await;
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive").await, 2, "each result written once");
}

/// The server itself goes down while the fleet works: every session ends
/// at once, connections are refused for a few seconds (longer than the
/// unlimited jobs' 1 s lease), then it is back on the same port. The hosts
/// reconnect by themselves and lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_loses_nothing() {
    const LIMITED: usize = 600;
    const KEYS: usize = 10;
    const SLEEPS: usize = 2_000;
    const DOWN: Duration = Duration::from_secs(3);
    let _one = ONE_FLEET.lock().await;
    let server = tokio::task::block_in_place(PgServer::start);
    let db = TestDb::postgres_on(&server.url()).await;
    let components = components(&GUESTS);
    let cache = tempfile::tempdir().unwrap();
    let mut hosts: Vec<Host> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
    wait_serving(&db, &hosts.iter().collect::<Vec<_>>(), GUESTS.len()).await;
    enqueue_mix(&db, (LIMITED, KEYS, 50), (SLEEPS, 20)).await;
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await >= 300 }).await;
    all_running(&db, &hosts).await;

    let left = unfinished(&db).await;
    assert!(left > 0, "the fleet still has work when the server stops");
    eprintln!("stage: stopping the server with {left} jobs unfinished");
    tokio::task::block_in_place(|| server.stop());
    let down_until = tokio::time::Instant::now() + DOWN;
    while tokio::time::Instant::now() < down_until {
        for host in &mut hosts {
            assert!(host.is_running(), "host {} outlives the database's outage", host.pid());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::task::block_in_place(|| server.start_again());
    eprintln!("stage: the server is back; draining");

    drained(&db, WITHIN).await;
    completed_once(&db, "limited", LIMITED).await;
    completed_once(&db, "sleep", SLEEPS).await;
    within_limits(&db, "limited").await;
    nothing_left(&db).await;
    let redelivered = db.scalar("SELECT count(*) FROM jobhost.archive WHERE attempt > 1").await;
    eprintln!("stage: drained; {redelivered} jobs ran more than once");
    stop_all(&mut hosts).await;
}

/// Guarantees 5 and 11 through an ambiguous commit: the connection drops
/// after the server committed a batch of results and before its answer
/// arrived, so the host cannot tell whether the batch was written. It
/// writes the batch again; the first write consumed every (job id, lease
/// token) in it, so the retry is a duplicate: no second slot release, no
/// second promotion, and no key ever runs two at once. The lost write may
/// also have leased the next jobs to the host, which never saw them: the
/// host's next heartbeat finds them leased to it and never confirmed, and
/// hands them back (or, failing that, their leases of 1 s expire); either
/// way they run once, on their first attempt: an attempt is spent only by
/// a run that started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_whose_reply_is_lost_is_written_once() {
    // `serial` runs one job per key at once. Forty short jobs a key keep
    // every key busy well past a lease, so a job the lost write leased comes
    // back while its key still has jobs blocked: a second release would let
    // two run at once, which the guests' own times would show.
    const KEYS: usize = 3;
    const JOBS: usize = 40 * KEYS;
    const MS: u64 = 50;
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = components(&["serial"]);
    let cache = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(server_address()).await;
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("host.log");
    let mut host = host_via_proxy(&db, &proxy, components.path(), cache.path(), &log);
    wait_serving(&db, &[&host], 1).await;
    let jobs: Vec<_> = (0..JOBS)
        .map(|i| EnqueueParams::new("serial", json!({"key": format!("k{}", i % KEYS), "ms": MS, "i": i})))
        .collect();
    db.store.job_enqueue(&jobs).await.expect("enqueue");
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'running'").await > 0 })
        .await;

    // The next write of results (each goes through jobhost.finish_runs, in
    // autocommit) is the one whose answer is lost.
    let mut fired = proxy.lose_reply_to("finish_runs");
    let lost = tokio::time::timeout(WITHIN, async {
        loop {
            assert_slots_match_jobs(&db).await;
            tokio::select! {
                lost = &mut fired => break lost.expect("the connection lasted until the server answered"),
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    })
    .await
    .expect("a write of results went through the proxy");
    eprintln!("stage: lost the answer ({} bytes) to {:?} at {}", lost.dropped_bytes, lost.statement, clock(now_us()));
    assert!(lost.committed, "the write whose answer was lost committed: {lost:?}");

    drained(&db, WITHIN).await;
    // Stopped, it has written every result it had, and its log is complete.
    host.stop().await;

    completed_once(&db, "serial", JOBS).await;
    for (key, runs) in runs_by_key(&db, "serial").await {
        let most = most_at_once(runs);
        assert!(most <= 1, "serial key {key} ran {most} at once, over its limit of 1");
    }
    nothing_left(&db).await;
    let log = complete_lines(&log);
    let lines = |text: &str| log.lines().filter(|line| line.contains(text)).count();
    let retried = lines("cannot write results; retrying");
    let duplicates = lines("result discarded: its lease is gone");
    assert!(retried >= 1, "the host wrote the results whose answer it lost again");
    assert!(duplicates >= 1, "the second write found those results already written, and said so");
    let handed_back = lines("handed back jobs leased to this host by a write whose answer was lost");
    let expired =
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE errors::text LIKE '%lease expired before host %'").await;
    eprintln!(
        "stage: {retried} write(s) retried, {duplicates} result(s) found already written, \
         {handed_back} hand-back(s) of jobs the lost write leased, {expired} job(s) whose unconfirmed lease expired"
    );
    // The lost write freed a key and leased its next job (on PostgreSQL,
    // inserted already leased); that job came back without a run, and ran once.
    assert!(handed_back + expired as usize >= 1, "the job the lost write leased came back");
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE attempt <> 1").await,
        0,
        "no attempt was spent by a run that never started"
    );
}

/// Guarantee 5, the attempt half (issue 32, item 5): the jobs a lost write
/// leased are handed back at once, not when their leases expire. `limited`
/// holds a key's slot for a 10 s lease; the lost write frees slots and
/// leases the key's next jobs to the host, which never learns of them. Its
/// next heartbeat finds them leased to it, unconfirmed and older than every
/// write still in flight, and hands them back with their attempt; so every
/// job completes on its first attempt and none comes back by a lease's
/// expiry (which would hold its key for 10 s first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_a_lost_write_leased_are_handed_back_at_once() {
    const JOBS: usize = 60;
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = components(&["limited"]);
    let cache = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(server_address()).await;
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("host.log");
    let mut host = host_via_proxy(&db, &proxy, components.path(), cache.path(), &log);
    wait_serving(&db, &[&host], 1).await;
    db.store.job_enqueue(&(0..JOBS).map(|i| limited(i, i % 2, 30)).collect::<Vec<_>>()).await.expect("enqueue");
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'running'").await > 0 })
        .await;
    let lost = tokio::time::timeout(WITHIN, proxy.lose_reply_to("finish_runs"))
        .await
        .expect("a write of results went through the proxy")
        .expect("the connection lasted until the server answered");
    assert!(lost.committed, "the write whose answer was lost committed: {lost:?}");

    drained(&db, WITHIN).await;
    host.stop().await;
    completed_once(&db, "limited", JOBS).await;
    nothing_left(&db).await;
    let log = complete_lines(&log);
    let handed_back = log.matches("handed back jobs leased to this host by a write whose answer was lost").count();
    assert!(handed_back >= 1, "the host handed back what the lost write leased:\n{log}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE errors::text LIKE '%lease expired%'").await,
        0,
        "no job waited for its lease to expire"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE attempt <> 1").await, 0, "nor spent an attempt");
}

/// A result the database will not take, failing without a refusal (here a
/// trigger fails the statement as the server does a value too large for it
/// to hold: "invalid memory alloc request size", an internal error), cannot
/// hold back the host's other results: the batch is halved until that
/// result stands alone, its job is failed with the reason, and every other
/// job completes. Before, the same batch was sent every 200 ms for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_database_will_not_take_fails_alone() {
    const JOBS: usize = 60;
    const POISON: usize = 17;
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    db.execute(
        "CREATE FUNCTION jobhost.test_cancel_poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.state = 'completed' AND NEW.payload ? 'poison' THEN
                 RAISE EXCEPTION 'invalid memory alloc request size 1073741824' USING ERRCODE = 'XX000';
             END IF;
             RETURN NEW;
         END $$",
    )
    .await;
    db.execute(
        "CREATE TRIGGER test_cancel_poison BEFORE INSERT ON jobhost.archive
         FOR EACH ROW EXECUTE FUNCTION jobhost.test_cancel_poison()",
    )
    .await;
    let components = components(&["sleep"]);
    let cache = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("host.log");
    let mut host = Host::start(
        host_command(&db.url, components.path(), cache.path())
            .env("RUST_LOG", "warn")
            .stderr(std::fs::File::create(&log).expect("create the host's log")),
    );
    wait_serving(&db, &[&host], 1).await;
    let jobs: Vec<_> = (0..JOBS)
        .map(|i| {
            let payload =
                if i == POISON { json!({"ms": 20, "i": i, "poison": true}) } else { json!({"ms": 20, "i": i}) };
            EnqueueParams::new("sleep", payload)
        })
        .collect();
    db.store.job_enqueue(&jobs).await.expect("enqueue");

    drained(&db, WITHIN).await;
    assert!(host.is_running(), "the host carried on");
    host.stop().await;
    let completed = db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed'").await;
    assert_eq!(completed, JOBS as i64 - 1, "every other job completed");
    let failed = db
        .texts("SELECT payload->>'i' || ': ' || (errors->-1->>'error') FROM jobhost.archive WHERE state = 'failed'")
        .await;
    assert_eq!(failed.len(), 1, "only the result the database would not take failed: {failed:?}");
    assert!(
        failed[0].starts_with(&format!("{POISON}: the run's result could not be written"))
            && failed[0].contains("invalid memory alloc request size"),
        "it failed with the reason: {failed:?}"
    );
    let log = complete_lines(&log);
    assert!(log.contains("splitting it"), "the host said it split the batch:\n{log}");
    nothing_left(&db).await;
}

/// A host that gave its jobs up because its result writes failed for
/// longer than a lease resumes once writes pass again, though it has no
/// result of its own left to write: here every write into the archive
/// fails (an internal error, as a failing disk would give, while pings
/// still answer) until the host has split its one batch down to its one
/// result, failed to record that result's failure too and dropped it. It
/// then leases nothing, so only a write that changes nothing, sent while
/// it waits, can tell it writes pass again. Before, such a host never
/// fetched again (a fleet stalled so after a server restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_gave_its_jobs_up_resumes_once_writes_pass() {
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    db.execute("CREATE TABLE jobhost.test_writes_fail ()").await;
    db.execute("INSERT INTO jobhost.test_writes_fail DEFAULT VALUES").await;
    db.execute(
        "CREATE FUNCTION jobhost.test_writes_fail() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF EXISTS (SELECT FROM jobhost.test_writes_fail) THEN
                 RAISE EXCEPTION 'could not write block 7 of relation' USING ERRCODE = 'XX000';
             END IF;
             RETURN NEW;
         END $$",
    )
    .await;
    db.execute(
        "CREATE TRIGGER test_writes_fail BEFORE INSERT ON jobhost.archive
         FOR EACH ROW EXECUTE FUNCTION jobhost.test_writes_fail()",
    )
    .await;
    let components = components(&["sleep"]);
    let cache = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("host.log");
    let mut host = Host::start(
        host_command(&db.url, components.path(), cache.path())
            .env("RUST_LOG", "warn")
            .stderr(std::fs::File::create(&log).expect("create the host's log")),
    );
    wait_serving(&db, &[&host], 1).await;
    db.store.job_enqueue(&[sleep(0, 20)]).await.expect("enqueue");

    eventually(WITHIN, || async {
        let log = complete_lines(&log);
        log.contains("cannot record the failure either") && log.contains("not renewing leases")
    })
    .await;
    db.execute("DELETE FROM jobhost.test_writes_fail").await;
    db.store.job_enqueue(&[sleep(1, 20)]).await.expect("enqueue");

    eventually(WITHIN, || async {
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed'").await == 2
    })
    .await;
    assert!(host.is_running(), "the host carried on");
    host.stop().await;
    completed_once(&db, "sleep", 2).await;
    let log = complete_lines(&log);
    assert!(log.contains("results are written again; renewing and fetching again"), "the host said it resumed:\n{log}");
    nothing_left(&db).await;
}

/// A result written alone after the database refused its batch is bounded
/// by the write deadline, as every other send is: here that write's
/// connection is lost unseen (the proxy keeps it open and drops the
/// server's answer), and the host sends the result again on another after
/// the deadline, so the job is failed with the database's reason. Before,
/// the write waited for an answer that never came, and with one write in
/// flight (`--result-writes 1`) no result of the host was written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_written_alone_whose_connection_is_lost_is_sent_again() {
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    db.execute(
        "CREATE FUNCTION jobhost.test_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.state = 'completed' AND NEW.payload ? 'poison' THEN
                 RAISE EXCEPTION 'the output breaks a rule' USING ERRCODE = 'check_violation';
             END IF;
             RETURN NEW;
         END $$",
    )
    .await;
    db.execute(
        "CREATE TRIGGER test_refuse_poison BEFORE INSERT ON jobhost.archive
         FOR EACH ROW EXECUTE FUNCTION jobhost.test_refuse_poison()",
    )
    .await;
    let components = components(&["sleep"]);
    let cache = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(server_address()).await;
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("host.log");
    let mut host = Host::start(
        host_command(&url_via(&db.url, proxy.port()), components.path(), cache.path())
            .args(["--result-writes", "1"])
            .env("RUST_LOG", "warn")
            .stderr(std::fs::File::create(&log).expect("create the host's log")),
    );
    wait_serving(&db, &[&host], 1).await;
    // A first result written, so the host's start is behind it.
    db.store.job_enqueue(&[sleep(0, 20)]).await.expect("enqueue");
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await == 1 }).await;

    // The batch carrying the poisoned result is refused; the write of that
    // result alone, next, is the one whose connection is lost.
    let hung = proxy.hang_reply_to("finish_runs", 1);
    db.store
        .job_enqueue(&[EnqueueParams::new("sleep", json!({"ms": 20, "i": 1, "poison": true}))])
        .await
        .expect("enqueue");
    let hung = tokio::time::timeout(WITHIN, hung).await.expect("the write alone went out").expect("the fault fired");
    assert!(!hung.committed, "the server refused the write whose answer hung: {hung:?}");

    let failed = "SELECT count(*) FROM jobhost.archive WHERE state = 'failed'
                  AND errors->-1->>'error' LIKE 'the run''s result could not be stored:%the output breaks a rule%'";
    eventually(WITHIN, || async { db.scalar(failed).await == 1 }).await;
    db.store.job_enqueue(&[sleep(2, 20)]).await.expect("enqueue");
    drained(&db, WITHIN).await;
    assert!(host.is_running(), "the host carried on");
    host.stop().await;
    let log = complete_lines(&log);
    assert!(log.contains("a result written alone got no answer in time"), "the host said it gave up waiting:\n{log}");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed'").await, 2);
    nothing_left(&db).await;
}

/// Jobs leased by a result write that was still in flight when a stopping
/// host's grace period ended are handed back, with their attempt given
/// back, not left running under a lease until it expires. The write is
/// held in flight by freezing the host's connections until its grace
/// period is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_leased_as_a_host_stops_are_handed_back() {
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = components(&["sleep"]);
    let cache = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(server_address()).await;
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("host.log");
    let mut host = host_via_proxy(&db, &proxy, components.path(), cache.path(), &log);
    wait_serving(&db, &[&host], 1).await;
    db.store.job_enqueue(&(0..400).map(|i| sleep(i, 50)).collect::<Vec<_>>()).await.expect("enqueue");
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await >= 20 }).await;

    proxy.freeze();
    // A run that ends now sends its result, with a fetch, into the frozen connection.
    let before = complete_lines(&log).matches("run ended").count();
    eventually(WITHIN, || async { complete_lines(&log).matches("run ended").count() > before }).await;
    host.signal(libc::SIGTERM);
    eventually(WITHIN, || async { complete_lines(&log).contains("grace period over") }).await;
    proxy.thaw();
    let status = host.wait().await;
    assert!(status.success(), "the host stopped gracefully: {status}");

    let log = complete_lines(&log);
    assert!(log.contains("handed back jobs leased too late to start"), "the host handed the late jobs back:\n{log}");
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'running'").await,
        0,
        "no job is left leased to the stopped host"
    );
    // Runs the freeze fenced may have been expired by the sweep, keeping
    // their attempt; every other job has its attempt given back.
    let spent = db
        .texts("SELECT id || ': ' || errors::text FROM jobhost.jobs WHERE attempt > 0 AND errors::text NOT LIKE '%lease expired%'")
        .await;
    assert!(spent.is_empty(), "jobs handed back have their attempt given back: {spent:?}");
}

/// A job whose host is killed (SIGKILL) during every attempt: each expired
/// lease spends an attempt, and after the last the expiry sweep fails the
/// job with a reason naming the host and the attempt, instead of handing it
/// to host after host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_host_dies_on_every_attempt_fails_after_its_last() {
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::new(Backend::Postgres).await;
    let components = components(&["hostile"]);
    let cache = tempfile::tempdir().unwrap();
    let mut host = start_host(&db, components.path(), cache.path());
    wait_serving(&db, &[&host], 1).await;
    let sleeper = EnqueueParams::new("hostile", json!({"sleep_ms": 600_000}));
    let id = db.store.job_enqueue(&[sleeper]).await.unwrap()[0];
    for attempt in 1..=2 {
        if attempt > 1 {
            // Its maintenance hands the job over once the last host's lease expired.
            host = start_host(&db, components.path(), cache.path());
        }
        // Killed once its host confirmed the run's start (the heartbeat after
        // it): an attempt is spent only by a run that started.
        let running = format!(
            "SELECT count(*) FROM jobhost.jobs WHERE id = {id} AND state = 'running' AND attempt = {attempt}
               AND host_id LIKE '{}' AND confirmed_token = lease_token",
            host.id_pattern()
        );
        eventually(WITHIN, || async { db.scalar(&running).await == 1 }).await;
        host.signal(libc::SIGKILL);
        host.wait().await;
    }
    // No host is left: the sweep any host runs ends it once the lease expires.
    let archived = format!("SELECT count(*) FROM jobhost.archive WHERE id = {id}");
    eventually(WITHIN, || async {
        db.store.lease_expire(None).await.unwrap();
        db.scalar(&archived).await == 1
    })
    .await;
    assert_eq!(db.scalar(format!("SELECT count(*) FROM jobhost.jobs WHERE id = {id}")).await, 0);
    let failed = format!("SELECT count(*) FROM jobhost.archive WHERE id = {id} AND state = 'failed' AND attempt = 2");
    assert_eq!(db.scalar(failed).await, 1, "failed after its second attempt, not more");
    let errors = db
        .texts(format!(
            "SELECT e->>'error' FROM jobhost.archive, jsonb_array_elements(errors) WITH ORDINALITY AS x(e, n)
             WHERE id = {id} ORDER BY n"
        ))
        .await;
    assert_eq!(errors.len(), 2, "{errors:?}");
    for (error, attempt) in errors.iter().zip(1..) {
        assert!(error.starts_with("lease expired: host "), "{error}");
        assert!(error.ends_with(&format!(" stopped during the run, attempt {attempt} of 2")), "{error}");
    }
}
