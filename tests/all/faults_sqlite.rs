//! Fault injection on a fleet of three real `jobhost run` processes sharing
//! one embedded SQLite file, serving a limited job type (`serial`: one run
//! at a time per payload `key`) and an unlimited one (`sleep`). The faults:
//! the file's disk fills up mid-run, and the file's write lock is held (as
//! by a process frozen while writing) past every lease. Afterwards every job
//! completed exactly once, nothing is left, and by the runs every host
//! logged, no job ever ran twice at once and no key beyond its limit.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use jobhost::store::EnqueueParams;
use serde_json::json;

use common::db::TestDb;
use common::eventually;
use common::fleet::{
    Host, ONE_FLEET, assert_logged_runs_keep_leases_and_limits, assert_slots_match_jobs, completed_once, components,
    drained, host_command_beating, nothing_left, wait_serving,
};

const WITHIN: Duration = Duration::from_secs(60);
const GUESTS: [&str; 2] = ["serial", "sleep"];
const KEYS: usize = 6;
const SLEEPS: usize = 1_200;

/// A tmpfs of a fixed size mounted on a directory, unmounted on drop (after
/// the database in it is closed: declare it before the database).
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Tmpfs {
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(mounted.success(), "mounting a tmpfs (this test needs root, as CI has) failed: {mounted}");
        Tmpfs { path: dir.to_path_buf() }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Three hosts on `db`, each logging its runs to a file in `logs`, working
/// through `serial` jobs of `serial_ms` over six keys and short sleeps; a
/// heartbeat of a second puts each fence half a second before its lease
/// runs out in the database, room for a busy machine's scheduling.
async fn start_fleet(db: &TestDb, dirs: &Dirs, (serial, serial_ms): (usize, u64)) -> (Vec<Host>, Vec<PathBuf>) {
    let (components, cache, logs) = (dirs.components.path(), dirs.cache.path(), dirs.logs.path());
    let mut hosts = Vec::new();
    let mut paths = Vec::new();
    for n in 0..3 {
        let path = logs.join(format!("host{n}.log"));
        hosts.push(Host::start(
            host_command_beating(&db.url, components, cache, "1s", "2s")
                .env("RUST_LOG", "warn,jobhost=debug")
                .stderr(std::fs::File::create(&path).expect("create a host's log")),
        ));
        paths.push(path);
    }
    wait_serving(db, &hosts.iter().collect::<Vec<_>>(), GUESTS.len()).await;
    let mut jobs = Vec::new();
    for i in 0..SLEEPS.max(serial) {
        if i < serial {
            jobs.push(EnqueueParams::new("serial", json!({"key": format!("k{}", i % KEYS), "ms": serial_ms, "i": i})));
        }
        if i < SLEEPS {
            jobs.push(EnqueueParams::new("sleep", json!({"ms": 5, "i": i})));
        }
    }
    db.store.job_enqueue(&jobs).await.expect("enqueue");
    (hosts, paths)
}

/// The directories a fleet needs: its components, their compiled cache, and the hosts' logs.
struct Dirs {
    components: tempfile::TempDir,
    cache: tempfile::TempDir,
    logs: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        Dirs {
            components: components(&GUESTS),
            cache: tempfile::tempdir().unwrap(),
            logs: tempfile::tempdir().unwrap(),
        }
    }
}

/// Any host's log says `text`.
fn logged(logs: &[PathBuf], text: &str) -> bool {
    logs.iter().any(|log| std::fs::read_to_string(log).is_ok_and(|t| t.contains(text)))
}

/// Every job done once, nothing left, the logged runs within their leases
/// and limits; then the hosts, each still the process the test started,
/// exit gracefully.
async fn check_and_stop(db: &TestDb, mut hosts: Vec<Host>, logs: &[PathBuf], serial: usize) {
    drained(db, WITHIN).await;
    let odd: Vec<(i64, String, String)> =
        db.rows("SELECT id, state, CAST(errors AS TEXT) FROM jobhost.archive WHERE state <> 'completed'").await;
    assert!(odd.is_empty(), "every job completed: {odd:?}");
    completed_once(db, "serial", serial).await;
    completed_once(db, "sleep", SLEEPS).await;
    nothing_left(db).await;
    let runs = assert_logged_runs_keep_leases_and_limits(db, logs, "serial", 1).await;
    assert!(runs >= serial + SLEEPS, "every run was logged: {runs}");
    for host in &mut hosts {
        assert!(host.is_running(), "host {} recovered by itself", host.pid());
    }
    for host in &mut hosts {
        host.stop().await;
    }
}

/// The disk under the file fills up while the fleet works: writes fail as
/// the disk being full (never as a refusal of the results), are retried,
/// and go through once there is room again; no host dies, nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_writes_until_there_is_room_and_loses_nothing() {
    let _one = ONE_FLEET.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let disk = Tmpfs::mount(dir.path(), 48 << 20);
    let db = TestDb::sqlite_in(dir).await;
    let dirs = Dirs::new();
    let (hosts, log_paths) = start_fleet(&db, &dirs, (240, 30)).await;
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await >= 100 }).await;

    // Fill every byte left.
    let filler_path = disk.path.join("filler");
    let mut filler = std::fs::File::create(&filler_path).expect("create the filler");
    let chunk = vec![0u8; 64 << 10];
    while filler.write_all(&chunk).is_ok() {}
    let _ = filler.sync_all();
    eprintln!("stage: the disk is full");
    eventually(WITHIN, || async { logged(&log_paths, "disk is full") }).await;
    eprintln!("stage: a host met the full disk; keeping it full a second longer");
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    while tokio::time::Instant::now() < until {
        assert_slots_match_jobs(&db).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(filler);
    std::fs::remove_file(&filler_path).expect("free the disk");
    eprintln!("stage: room again; draining");
    check_and_stop(&db, hosts, &log_paths, 240).await;
    assert!(!logged(&log_paths, "result cannot be stored"), "a full disk failed no job as unstorable");
}

/// The file's write lock is held past every lease (as by a process frozen
/// mid-write): no host can renew, expire or write anything meanwhile, so
/// each host's own clock must stop its guests before their leases run out;
/// once the lock is free, the jobs are redelivered and nothing ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_past_every_lease_keeps_every_guarantee() {
    use sqlx::{Connection, Executor};
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::sqlite().await;
    let dirs = Dirs::new();
    // Runs of three seconds, so that every key's holder is running when
    // the lock is taken, and must be stopped before its 2 s lease runs out.
    let (hosts, log_paths) = start_fleet(&db, &dirs, (3 * KEYS, 3_000)).await;
    let holding = "SELECT count(*) FROM jobhost.jobs WHERE job = 'serial' AND state = 'running'";
    eventually(WITHIN, || async { db.scalar(holding).await == KEYS as i64 }).await;

    let options: sqlx::sqlite::SqliteConnectOptions = db.url.parse().unwrap();
    let mut holder =
        sqlx::SqliteConnection::connect_with(&options.busy_timeout(Duration::from_secs(30))).await.unwrap();
    holder.execute("BEGIN IMMEDIATE").await.expect("take the write lock");
    eprintln!("stage: write lock taken");
    // Past the serial jobs' 2 s lease, and long enough for every fence.
    eventually(Duration::from_secs(30), || async {
        logged(&log_paths, "lease could not be renewed in time; stopping the run")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    holder.execute("COMMIT").await.unwrap();
    eprintln!("stage: write lock released; draining");
    check_and_stop(&db, hosts, &log_paths, 3 * KEYS).await;
}
