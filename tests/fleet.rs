//! A fleet of real `jobhost run` processes sharing one database, with one
//! killed (SIGKILL) and one frozen (SIGSTOP) past its lease and then thawed.
//! Afterwards every job is in the archive exactly once as completed, nothing
//! is left behind, and the work of both failed hosts was redone after their
//! leases expired. With limited job types, no key ever ran more than its
//! limit at once, by the start and end times the guests report; that test
//! runs on both backends (on SQLite, the processes share one file).

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use jobhost::store::{EnqueueParams, Error};
use serde_json::json;

use common::db::{Backend, TestDb, on_both_backends};
use common::{eventually, guest};

/// The fleets of different tests would share two cores; one at a time.
static ONE_FLEET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const JOBS: usize = 5_000;
const WITHIN: Duration = Duration::from_secs(120);

fn start_host(db: &TestDb, components: &std::path::Path, cache: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_jobhost"))
        .args(["run", "--no-migrate", "--concurrency", "8", "--heartbeat", "250ms", "--lease", "1s"])
        .args(["--poll", "200ms", "--maintenance-interval", "100ms", "--grace", "5s"])
        .arg("--components")
        .arg(components)
        .arg("--cache-dir")
        .arg(cache)
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start jobhost run")
}

fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) on a child process this test started and has not reaped.
    let sent = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    assert_eq!(sent, 0, "signal {signal} to {}", child.id());
}

/// Jobs whose archived errors say this host's lease expired under them.
async fn redone_after(db: &TestDb, host: &Child) -> i64 {
    let errors = db.dialect("errors::text", "errors");
    db.scalar(format!(
        "SELECT count(*) FROM jobhost.archive WHERE {errors} LIKE '%lease expired: host %-{}-%'",
        host.id()
    ))
    .await
}

/// Checks that the work of the killed host (`hosts[0]`) and of the frozen
/// (or, when not `frozen`, also killed) one (`hosts[1]`) was redone after
/// their leases expired, then stops the hosts still alive and checks that
/// they exit gracefully.
async fn both_failures_redone_and_survivors_exit(db: &TestDb, mut hosts: Vec<Child>, frozen: bool) {
    assert!(redone_after(db, &hosts[0]).await > 0, "the killed host's jobs were redone after their leases expired");
    assert!(redone_after(db, &hosts[1]).await > 0, "the second host's jobs were redone after their leases expired");
    let _ = hosts[0].wait();
    let survivors = if frozen { 1 } else { 2 };
    if !frozen {
        let _ = hosts[1].wait();
    }
    for host in &mut hosts[survivors..] {
        signal(host, libc::SIGTERM);
        let status = host.wait().unwrap();
        assert!(status.success(), "graceful exit: {status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_survives_a_killed_and_a_frozen_host() {
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = tempfile::tempdir().unwrap();
    std::fs::copy(guest("sleep"), components.path().join("sleep.wasm")).unwrap();
    let cache = tempfile::tempdir().unwrap();

    eprintln!("stage: starting hosts");
    let hosts: Vec<Child> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
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
    signal(killed, libc::SIGKILL);
    signal(frozen, libc::SIGSTOP);
    eprintln!("stage: killed one, froze one; waiting for the frozen host's jobs to be rescued");
    // Frozen past its lease: the surviving host's sweep takes its jobs back.
    let frozen_pattern = format!("%-{}-%", frozen.id());
    let frozen_jobs = format!("SELECT count(*) FROM jobhost.jobs WHERE host_id LIKE '{frozen_pattern}'");
    eventually(WITHIN, || async { db.scalar(&frozen_jobs).await == 0 }).await;
    signal(frozen, libc::SIGCONT);
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

/// How a key's runs may overlap: by the guests' own clocks, the most runs
/// of one key that were ever in progress at once.
fn most_at_once(mut runs: Vec<(u64, u64)>) -> usize {
    // Half-open [start, end): an end at the same millisecond as a start comes first.
    let mut events: Vec<(u64, i32)> = runs.drain(..).flat_map(|(start, end)| [(start, 1), (end, -1)]).collect();
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, change) in events {
        now += change;
        most = most.max(now);
    }
    most as usize
}

/// Every key's completed runs, from the outputs the guests reported.
async fn runs_by_key(db: &TestDb, job: &str) -> BTreeMap<String, Vec<(u64, u64)>> {
    let (started, ended) = match db.backend {
        Backend::Postgres => ("(output->>'started_ms')::bigint", "(output->>'ended_ms')::bigint"),
        Backend::Sqlite => ("output->>'started_ms'", "output->>'ended_ms'"),
    };
    let rows: Vec<(String, i64, i64)> = db
        .rows(format!(
            "SELECT concurrency_key, {started}, {ended} FROM jobhost.archive WHERE job = '{job}' AND state = 'completed'"
        ))
        .await;
    let mut by_key: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for (key, start, end) in rows {
        by_key.entry(key).or_default().push((start as u64, end as u64));
    }
    by_key
}

/// Checked in one snapshot while the fleet runs: every semaphore counts
/// exactly the live jobs holding its slots, and no key has more than 2.
async fn slots_match_jobs(db: &TestDb) -> (i64, i64) {
    db.rows(
        "WITH live AS (
             SELECT job, concurrency_key AS key, count(*) AS n FROM jobhost.jobs
             WHERE concurrency_key IS NOT NULL AND state IN ('available', 'running') GROUP BY 1, 2
         )
         SELECT count(*) FILTER (WHERE coalesce(s.holders, 0) <> coalesce(l.n, 0)),
                count(*) FILTER (WHERE coalesce(l.n, 0) > 2)
         FROM jobhost.semaphores s FULL JOIN live l ON l.job = s.job AND l.key = s.key",
    )
    .await
    .remove(0)
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
    let components = tempfile::tempdir().unwrap();
    for name in ["limited", "limited_discard", "limited_raise"] {
        std::fs::copy(guest(name), components.path().join(format!("{name}.wasm"))).unwrap();
    }
    let cache = tempfile::tempdir().unwrap();
    let hosts: Vec<Child> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
    let serving = format!(
        "SELECT count(*) FROM jobhost.hosts WHERE {} = 3",
        db.dialect("cardinality(job_types)", "json_array_length(job_types)")
    );
    eventually(WITHIN, || async { db.scalar(&serving).await == 3 }).await;

    // Limit 2 per key, 20 keys: 40 admitted, the rest parked.
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
    let (killed, frozen) = (&hosts[0], &hosts[1]);
    signal(killed, libc::SIGKILL);
    signal(frozen, if freeze { libc::SIGSTOP } else { libc::SIGKILL });
    // Frozen past its lease (the limited types' 10 s duration): its jobs are
    // redelivered, their slots still held, and the sweep keeps checking.
    let frozen_pattern = format!("%-{}-%", frozen.id());
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
        signal(frozen, libc::SIGCONT);
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
        for (key, runs) in runs_by_key(&db, job).await {
            assert!(most_at_once(runs) <= 2, "{job} key {key} ran more than its limit of 2 at once");
        }
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
    assert!(db.store.semaphores_repair().await.unwrap().is_empty(), "nothing for the repair to fix");
    both_failures_redone_and_survivors_exit(&db, hosts, freeze).await;
}

on_both_backends!(limited_jobs_keep_their_limits_through_a_killed_and_a_frozen_host);
