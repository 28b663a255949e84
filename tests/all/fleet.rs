//! A fleet of real `jobhost run` processes sharing one database, with one
//! killed (SIGKILL) and one frozen (SIGSTOP) past its lease and then thawed.
//! Afterwards every job is in the archive exactly once as completed, nothing
//! is left behind, and the work of both failed hosts was redone after their
//! leases expired. With limited job types, no key ever ran more than its
//! limit at once, by the start and end times the guests report; that test
//! runs on both backends (on SQLite, the processes share one file).

use crate::common;

use std::time::Duration;

use jobhost::store::{EnqueueParams, Error};
use serde_json::json;

use common::db::{Backend, TestDb, on_both_backends};
use common::eventually;
use common::fleet::{Host, ONE_FLEET, components, redone_after, slots_match_jobs, start_host, within_limits};

const JOBS: usize = 5_000;
const WITHIN: Duration = Duration::from_secs(120);

/// Checks that the work of the killed host (`hosts[0]`) and of the frozen
/// (or, when not `frozen`, also killed) one (`hosts[1]`) was redone after
/// their leases expired, then stops the hosts still alive and checks that
/// they exit gracefully.
async fn both_failures_redone_and_survivors_exit(db: &TestDb, mut hosts: Vec<Host>, frozen: bool) {
    assert!(redone_after(db, &hosts[0]).await > 0, "the killed host's jobs were redone after their leases expired");
    assert!(redone_after(db, &hosts[1]).await > 0, "the second host's jobs were redone after their leases expired");
    hosts[0].wait().await;
    let survivors = if frozen { 1 } else { 2 };
    if !frozen {
        hosts[1].wait().await;
    }
    for host in &mut hosts[survivors..] {
        host.stop().await;
    }
}

/// Orders `hosts` by how many jobs each holds now, most first.
async fn busiest_first(db: &TestDb, hosts: &mut [Host]) {
    let holding = db
        .texts("SELECT host_id FROM jobhost.jobs WHERE state = 'running' GROUP BY host_id ORDER BY count(*) DESC")
        .await;
    let rank = |host: &Host| {
        let marker = format!("-{}-", host.pid());
        holding.iter().position(|id| id.contains(&marker)).unwrap_or(usize::MAX)
    };
    hosts.sort_by_key(|host| rank(host));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_survives_a_killed_and_a_frozen_host() {
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = components(&["sleep"]);
    let cache = tempfile::tempdir().unwrap();

    eprintln!("stage: starting hosts");
    let hosts: Vec<Host> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.hosts").await == 3 }).await;

    let payloads: Vec<_> =
        (0..JOBS).map(|i| jobhost::store::EnqueueParams::new("sleep", serde_json::json!({"ms": 20, "i": i}))).collect();
    let client = jobhost::Client::from_store(db.dyn_store());
    client.enqueue_many(&payloads).await.unwrap();

    eprintln!("stage: enqueued; waiting for 500 done");
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await >= 500 }).await;
    eprintln!("stage: waiting for all three hosts to be running jobs");
    let (killed, frozen) = (&hosts[0], &hosts[1]);
    eventually(WITHIN, || async {
        db.scalar("SELECT count(DISTINCT host_id) FROM jobhost.jobs WHERE state = 'running'").await == 3
    })
    .await;
    killed.signal(libc::SIGKILL);
    frozen.signal(libc::SIGSTOP);
    eprintln!("stage: killed one, froze one; waiting for the frozen host's jobs to be rescued");
    // Frozen past its lease: the surviving host's sweep takes its jobs back.
    let frozen_jobs = format!("SELECT count(*) FROM jobhost.jobs WHERE host_id LIKE '{}'", frozen.id_pattern());
    eventually(WITHIN, || async { db.scalar(&frozen_jobs).await == 0 }).await;
    frozen.signal(libc::SIGCONT);
    eprintln!("stage: thawed; waiting for the queue to drain");

    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.jobs").await == 0 }).await;

    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive").await, JOBS as i64);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE state = 'completed'").await, JOBS as i64);
    assert_eq!(
        db.scalar("SELECT count(DISTINCT (payload->>'i')::int) FROM jobhost.archive").await,
        JOBS as i64,
        "every payload completed, none twice"
    );
    both_failures_redone_and_survivors_exit(&db, hosts, true).await;
}

/// On SQLite the second host is killed too instead of frozen: a process
/// frozen while it holds the file's write lock stops every process on the
/// file until it resumes (documented), so no lease could expire meanwhile.
async fn limited_jobs_keep_their_limits_through_a_killed_and_a_frozen_host(db: TestDb) {
    const LIMITED: usize = 2_000;
    const KEYS: usize = 20;
    const EXTRA: usize = 150;
    let _one = ONE_FLEET.lock().await;
    let freeze = db.backend == Backend::Postgres;
    let components = components(&["limited", "limited_discard", "limited_raise"]);
    let cache = tempfile::tempdir().unwrap();
    let mut hosts: Vec<Host> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
    let serving = format!(
        "SELECT count(*) FROM jobhost.hosts WHERE {} = 3",
        db.dialect("cardinality(job_types)", "json_array_length(job_types)")
    );
    eventually(WITHIN, || async { db.scalar(&serving).await == 3 }).await;

    // Limit 2 per key, 20 keys: 40 admitted, the rest blocked.
    let limited: Vec<_> = (0..LIMITED)
        .map(|i| EnqueueParams::new("limited", json!({"key": format!("k{}", i % KEYS), "ms": 40, "i": i})))
        .collect();
    db.store.job_enqueue(&limited).await.unwrap();

    // Discarding and raising types arrive one by one while the fleet works.
    let store = db.dyn_store();
    let mixed = tokio::spawn(async move {
        let (mut raised, mut accepted) = (0, 0);
        for i in 0..EXTRA {
            let key = format!("k{}", i % 3);
            store.job_enqueue(&[EnqueueParams::new("limited_discard", json!({"key": key, "ms": 30}))]).await.unwrap();
            match store.job_enqueue(&[EnqueueParams::new("limited_raise", json!({"key": key, "ms": 30}))]).await {
                Ok(_) => accepted += 1,
                Err(Error::LimitReached(_)) => raised += 1,
                Err(other) => panic!("unexpected enqueue error: {other}"),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (accepted, raised)
    });

    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await >= 300 }).await;
    eventually(WITHIN, || async {
        db.scalar("SELECT count(DISTINCT host_id) FROM jobhost.jobs WHERE state = 'running'").await == 3
    })
    .await;
    // The limits leave hosts idle at moments: the host killed is the one
    // holding the most jobs, the one frozen the next, so each holds some
    // when it fails (a host killed between jobs would leave nothing to redo).
    busiest_first(&db, &mut hosts).await;
    let (killed, frozen) = (&hosts[0], &hosts[1]);
    killed.signal(libc::SIGKILL);
    frozen.signal(if freeze { libc::SIGSTOP } else { libc::SIGKILL });
    // Frozen past its lease (the limited types' 10 s duration): its jobs are
    // redelivered, their slots still held, and the sweep keeps checking.
    let frozen_pattern = frozen.id_pattern();
    let mut samples = 0;
    loop {
        let (mismatched, over) = slots_match_jobs(&db).await;
        assert_eq!((mismatched, over), (0, 0), "slots and live jobs agree, within the limit");
        samples += 1;
        if db.scalar(format!("SELECT count(*) FROM jobhost.jobs WHERE host_id LIKE '{frozen_pattern}'")).await == 0 {
            break;
        }
        assert!(samples < 12_000, "the frozen host's jobs were never rescued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if freeze {
        frozen.signal(libc::SIGCONT);
    }
    let (accepted, raised) = mixed.await.unwrap();
    eventually(WITHIN, || async {
        let (mismatched, over) = slots_match_jobs(&db).await;
        assert_eq!((mismatched, over), (0, 0), "slots and live jobs agree, within the limit");
        db.scalar("SELECT count(*) FROM jobhost.jobs").await == 0
            && db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await == 0
    })
    .await;

    for job in ["limited", "limited_discard", "limited_raise"] {
        within_limits(&db, job).await;
    }
    assert_eq!(
        db.scalar(format!(
            "SELECT count(DISTINCT {}) FROM jobhost.archive WHERE job = 'limited' AND state = 'completed'",
            db.dialect("(payload->>'i')::int", "payload->>'i'")
        ))
        .await,
        LIMITED as i64,
        "every limited job completed, none twice"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE job = 'limited'").await, LIMITED as i64);
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE job = 'limited_discard'").await,
        EXTRA as i64,
        "each discarding job either completed or was discarded"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE job = 'limited_raise' AND state = 'completed'").await,
        accepted,
        "every accepted raising job completed"
    );
    assert_eq!(accepted + raised, EXTRA as i64);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 0, "no slot held without a live job");
    assert!(db.store.semaphore_repair().await.unwrap().is_empty(), "nothing for the repair to fix");
    both_failures_redone_and_survivors_exit(&db, hosts, freeze).await;
}

on_both_backends!(limited_jobs_keep_their_limits_through_a_killed_and_a_frozen_host);

/// `jobhost run` with one run slot and one job leased ahead of it, which
/// may wait `prefetch_wait` for the slot.
fn one_slot_host(db: &TestDb, components: &std::path::Path, cache: &std::path::Path, prefetch_wait: &str) -> Host {
    Host::start(
        std::process::Command::new(env!("CARGO_BIN_EXE_jobhost"))
            .args(["run", "--no-migrate", "--concurrency", "1", "--prefetch", "1", "--prefetch-wait", prefetch_wait])
            .args(["--heartbeat", "250ms", "--lease", "5s", "--poll", "200ms", "--maintenance-interval", "100ms"])
            .args(["--grace", "1s", "--components"])
            .arg(components)
            .arg("--cache-dir")
            .arg(cache)
            .env("DATABASE_URL", &db.url)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null()),
    )
}

/// A job leased ahead of a long run does not wait behind it while another
/// host is idle: it is handed back, with its attempt given back, once it
/// has waited its host's `--prefetch-wait`, and the host leases no more
/// ahead of runs that long. Before, the short job waited the whole long
/// run, counted as started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_leased_behind_a_long_run_goes_to_an_idle_host() {
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = components(&["sleep"]);
    let cache = tempfile::tempdir().unwrap();
    let mut busy = one_slot_host(&db, components.path(), cache.path(), "500ms");
    common::fleet::wait_serving(&db, &[&busy], 1).await;

    let long = EnqueueParams::new("sleep", json!({"ms": 30_000, "i": 0}));
    let short = EnqueueParams::new("sleep", json!({"ms": 0, "i": 1}));
    let leased_to_busy = |id: i64| {
        format!(
            "SELECT count(*) FROM jobhost.jobs WHERE id = {id} AND state = 'running' AND host_id LIKE '{}'",
            busy.id_pattern()
        )
    };
    // The long job first, so that it takes the run slot and the short one
    // is leased ahead of it.
    let mut ids = db.store.job_enqueue(&[long]).await.unwrap();
    eventually(WITHIN, || async { db.scalar(leased_to_busy(ids[0])).await == 1 }).await;
    ids.extend(db.store.job_enqueue(&[short]).await.unwrap());
    eventually(WITHIN, || async { db.scalar(leased_to_busy(ids[1])).await == 1 }).await;

    let mut idle = one_slot_host(&db, components.path(), cache.path(), "500ms");
    let short_done = format!("SELECT count(*) FROM jobhost.archive WHERE id = {} AND state = 'completed'", ids[1]);
    eventually(WITHIN, || async { db.scalar(&short_done).await == 1 }).await;
    let long_running = format!("SELECT count(*) FROM jobhost.jobs WHERE id = {} AND state = 'running'", ids[0]);
    assert_eq!(db.scalar(&long_running).await, 1, "the short job completed while the long one still ran");
    let (attempt, host) = db
        .rows::<(i32, String)>(format!("SELECT attempt, host_id FROM jobhost.archive WHERE id = {}", ids[1]))
        .await
        .remove(0);
    assert_eq!(attempt, 1, "handing it back gave its attempt back");
    assert!(host.contains(&format!("-{}-", idle.pid())), "the idle host ran it, not {host}");
    idle.stop().await;
    busy.stop().await;
}

/// A job that waited on its host for the run slot has the time its guest
/// started as `started_at`, not the time it was leased: it starts after the
/// run before it ended, by that run's own clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_waited_for_a_run_slot_started_when_its_guest_did() {
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = components(&["sleep"]);
    let cache = tempfile::tempdir().unwrap();
    let mut host = one_slot_host(&db, components.path(), cache.path(), "30s");
    common::fleet::wait_serving(&db, &[&host], 1).await;
    let running = |id: i64| format!("SELECT count(*) FROM jobhost.jobs WHERE id = {id} AND state = 'running'");
    let first = db.store.job_enqueue(&[EnqueueParams::new("sleep", json!({"ms": 1000, "i": 0}))]).await.unwrap()[0];
    eventually(WITHIN, || async { db.scalar(running(first)).await == 1 }).await;
    let second = db.store.job_enqueue(&[EnqueueParams::new("sleep", json!({"ms": 0, "i": 1}))]).await.unwrap()[0];
    eventually(WITHIN, || async { db.scalar(running(second)).await == 1 }).await;
    let done = format!("SELECT count(*) FROM jobhost.archive WHERE id IN ({first}, {second})");
    eventually(WITHIN, || async { db.scalar(&done).await == 2 }).await;
    host.stop().await;

    let (started_us, first_ended_us) = db
        .rows::<(i64, i64)>(format!(
            "SELECT (extract(epoch FROM s.started_at) * 1e6)::bigint, (f.output->>'ended_us')::bigint
             FROM jobhost.archive s, jobhost.archive f WHERE s.id = {second} AND f.id = {first}"
        ))
        .await
        .remove(0);
    assert!(
        started_us >= first_ended_us,
        "the second job's started_at ({started_us} us) is after the first run ended ({first_ended_us} us), not when it was leased"
    );
}
