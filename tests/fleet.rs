//! A fleet of real `jobhost run` processes sharing one database, with one
//! killed (SIGKILL) and one frozen (SIGSTOP) past its lease and then thawed.
//! Afterwards every job is in the archive exactly once as completed, nothing
//! is left behind, and the work of both failed hosts was redone after their
//! leases expired.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::db::TestDb;
use common::{eventually, guest};

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
    sqlx::query_scalar("SELECT count(*) FROM jobhost.archive WHERE errors::text LIKE $1")
        .bind(format!("%lease expired: host %-{}-%", host.id()))
        .fetch_one(db.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_survives_a_killed_and_a_frozen_host() {
    let db = TestDb::new().await;
    let components = tempfile::tempdir().unwrap();
    std::fs::copy(guest("sleep"), components.path().join("sleep.wasm")).unwrap();
    let cache = tempfile::tempdir().unwrap();

    eprintln!("stage: starting hosts");
    let mut hosts: Vec<Child> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
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
    eventually(WITHIN, || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobhost.jobs WHERE host_id LIKE $1")
            .bind(&frozen_pattern)
            .fetch_one(db.pool())
            .await
            .unwrap()
            == 0
    })
    .await;
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
    assert!(redone_after(&db, killed).await > 0, "the killed host's jobs were redone after their leases expired");
    assert!(redone_after(&db, frozen).await > 0, "the frozen host's jobs were redone after their leases expired");

    let _ = hosts[0].wait();
    for host in &mut hosts[1..] {
        signal(host, libc::SIGTERM);
        let status = host.wait().unwrap();
        assert!(status.success(), "graceful exit: {status}");
    }
}
