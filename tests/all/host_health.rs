//! A host never silently stops doing part of its job: a watcher that lost
//! its directory says so on the host's row and in `jobhost stats`, and
//! still loads what is added later; registrations are retried through a
//! database outage, and a host started before its database waits for it;
//! registrations only move forward, and a type served with different
//! components across the fleet is reported.

use crate::common;

use std::time::Duration;

use jobhost::store::{EnqueueParams, HostInfo};
use serde_json::{Value, json};

use common::db::{TestDb, jobhost, on_both_backends};
use common::fleet::{Host, ONE_FLEET, components, host_command, wait_serving};
use common::pg_server::PgServer;
use common::{TestHost, eventually, guest, job_config};

const WITHIN: Duration = Duration::from_secs(60);

/// The digest stored for a job type.
async fn registered_digest(db: &TestDb, job: &str) -> Option<String> {
    let rows: Vec<(String,)> = db.rows(format!("SELECT digest FROM jobhost.job_types WHERE name = '{job}'")).await;
    rows.into_iter().next().map(|(d,)| d)
}

/// The stored configuration's priority of a job type.
async fn registered_priority(db: &TestDb, job: &str) -> i16 {
    db.store.job_types_get(&[job.to_string()]).await.unwrap()[job].priority
}

/// A type's registration is replaced only by a digest first registered
/// later: an older build registered again (an old host restarting, or
/// loading anything) leaves the newer settings alone.
async fn registration_only_moves_forward(db: TestDb) {
    let v1 = job_config("mail");
    let v2 = jobhost::types::JobConfig { priority: 5, ..job_config("mail") };
    let v3 = jobhost::types::JobConfig { priority: 7, ..job_config("mail") };
    db.store.job_types_register(&[(v1.clone(), "v1".into())]).await.unwrap();
    db.store.job_types_register(&[(v2, "v2".into())]).await.unwrap();
    assert_eq!(registered_priority(&db, "mail").await, 5);

    db.store.job_types_register(&[(v1, "v1".into()), (job_config("other"), "o1".into())]).await.unwrap();
    assert_eq!(registered_digest(&db, "mail").await.as_deref(), Some("v2"), "the older build does not come back");
    assert_eq!(registered_priority(&db, "mail").await, 5);
    assert_eq!(registered_digest(&db, "other").await.as_deref(), Some("o1"), "the rest of the batch is written");

    db.store.job_types_register(&[(v3, "v3".into())]).await.unwrap();
    assert_eq!(registered_digest(&db, "mail").await.as_deref(), Some("v3"));
    assert_eq!(registered_priority(&db, "mail").await, 7);
}

/// The mixed-version fleet: a host still serving `hello` v1 loads an
/// unrelated component after another host registered `hello` v2; the v2
/// settings stay, and `stats` reports the type served by two components.
async fn an_old_host_loading_another_component_keeps_the_newer_settings(db: TestDb) {
    let old = TestHost::start(&db, &["hello"], |_| {}).await;
    let new = TestHost::start(&db, &[], |_| {}).await;
    std::fs::copy(guest("hello_v2"), new.components.path().join("hello.wasm")).unwrap();
    eventually(WITHIN, || async { registered_priority(&db, "hello").await == -1 }).await;
    let v2 = registered_digest(&db, "hello").await;

    std::fs::copy(guest("sleep"), old.components.path().join("sleep.wasm")).unwrap();
    eventually(WITHIN, || async { registered_digest(&db, "sleep").await.is_some() }).await;
    assert_eq!(registered_digest(&db, "hello").await, v2, "v1's host did not reset the type");
    assert_eq!(registered_priority(&db, "hello").await, -1);

    eventually(WITHIN, || async { db.store.job_stats().await.unwrap().mixed_components.len() == 1 }).await;
    let output = jobhost(&db, &["stats"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("warning: type hello is served with 2 different components"), "{text}");
    let json: Value = serde_json::from_slice(&jobhost(&db, &["stats", "--json"]).stdout).unwrap();
    let mixed = &json["mixed_components"][0];
    assert_eq!(mixed["job"], "hello");
    assert_eq!(mixed["digests"].as_object().map(|d| d.len()), Some(2), "{json}");
    old.stop().await;
    new.stop().await;
}

/// A host whose components directory disappears keeps running, reports
/// its watcher down on its row and in `stats`, and loads and registers a
/// component added once the directory is back.
async fn a_host_that_lost_its_directory_says_so_and_loads_what_comes_later(db: TestDb) {
    let host = TestHost::start(&db, &["hello"], |_| {}).await;
    let dir = host.components.path().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    let down = "SELECT count(*) FROM jobhost.hosts WHERE watcher_error IS NOT NULL";
    eventually(WITHIN, || async { db.scalar(down).await == 1 }).await;
    let stats: Value = serde_json::from_slice(&jobhost(&db, &["stats", "--json"]).stdout).unwrap();
    assert_eq!(stats["watchers_down"].as_array().map(Vec::len), Some(1), "{stats}");
    let text = String::from_utf8_lossy(&jobhost(&db, &["stats"]).stdout).into_owned();
    assert!(text.contains("is not watching its components directory"), "{text}");

    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(guest("hello"), dir.join("hello.wasm")).unwrap();
    std::fs::copy(guest("sleep"), dir.join("sleep.wasm")).unwrap();
    eventually(WITHIN, || async { registered_digest(&db, "sleep").await.is_some() }).await;
    eventually(WITHIN, || async { db.scalar(down).await == 0 }).await;
    db.store.job_enqueue(&[EnqueueParams::new("sleep", json!({"ms": 1}))]).await.unwrap();
    eventually(WITHIN, || async { db.scalar("SELECT count(*) FROM jobhost.archive").await == 1 }).await;
    assert!(!host.task.is_finished());
    host.stop().await;
}

/// Hosts' rows say which component serves each type and whether their
/// watcher is down; `stats` leaves hosts presumed dead out of both.
async fn stats_report_live_hosts_watchers_and_components(db: TestDb) {
    let mut a = HostInfo { id: "a".into(), ..HostInfo::current(vec!["mail".into()], Duration::from_secs(60)) };
    a.digests.insert("mail".into(), "1111111111111111".into());
    let mut b = HostInfo { id: "b".into(), watcher_error: Some("inotify: too many instances".into()), ..a.clone() };
    b.digests.insert("mail".into(), "2222222222222222".into());
    db.store.host_upsert(&a).await.unwrap();
    db.store.host_upsert(&b).await.unwrap();
    let stats = db.store.job_stats().await.unwrap();
    assert_eq!(stats.watchers_down.len(), 1);
    assert_eq!(stats.watchers_down[0].host, "b");
    assert_eq!(stats.mixed_components.len(), 1);
    assert_eq!(stats.mixed_components[0].digests["1111111111111111"], ["a"]);

    // Fixed on its next heartbeat.
    b.watcher_error = None;
    b.digests.insert("mail".into(), "1111111111111111".into());
    db.store.host_upsert(&b).await.unwrap();
    let stats = db.store.job_stats().await.unwrap();
    assert!(stats.watchers_down.is_empty() && stats.mixed_components.is_empty(), "{stats:?}");
}

on_both_backends!(
    registration_only_moves_forward,
    an_old_host_loading_another_component_keeps_the_newer_settings,
    a_host_that_lost_its_directory_says_so_and_loads_what_comes_later,
    stats_report_live_hosts_watchers_and_components,
);

/// Waits until the host's log (written by another process) contains `text`.
async fn logged(log: &std::path::Path, text: &str) {
    eventually(WITHIN, || async { std::fs::read_to_string(log).unwrap_or_default().contains(text) }).await;
}

/// A host started while its database is down says so with the server's
/// address and waits for it (instead of exiting), and a component it loads during a later outage is registered
/// once the database is back, so its type becomes enqueueable without a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_waits_for_its_database_and_registers_what_it_loaded_during_an_outage() {
    let _one = ONE_FLEET.lock().await;
    let server = tokio::task::block_in_place(PgServer::start);
    let db = TestDb::postgres_on(&server.url()).await;
    let components = components(&["sleep"]);
    let cache = tempfile::tempdir().unwrap();
    let log = cache.path().join("host.log");
    tokio::task::block_in_place(|| server.stop());

    let mut command = host_command(&db.url, components.path(), cache.path());
    command.env("RUST_LOG", "info").stderr(std::fs::File::create(&log).unwrap());
    let mut host = Host::start(&mut command);
    logged(&log, "the database is unavailable; waiting for it").await;
    // Named by its address at once, not after the pool's quiet ten seconds.
    let authority = db.url.split("://").nth(1).unwrap();
    let address = authority.rsplit('@').next().unwrap().split('/').next().unwrap();
    logged(&log, &format!("cannot reach the database at {address}: ")).await;
    assert!(!std::fs::read_to_string(&log).unwrap().contains("pool timed out"));
    assert!(host.is_running(), "the host waits for its database");
    tokio::task::block_in_place(|| server.start_again());
    wait_serving(&db, &[&host], 1).await;

    tokio::task::block_in_place(|| server.stop());
    std::fs::copy(guest("hello"), components.path().join("hello.wasm")).unwrap();
    logged(&log, "cannot register the job type in the database").await;
    assert!(host.is_running());
    tokio::task::block_in_place(|| server.start_again());
    eventually(WITHIN, || async { registered_digest(&db, "hello").await.is_some() }).await;
    db.store.job_enqueue(&[EnqueueParams::new("hello", json!({"name": "back"}))]).await.expect("hello is known");
    logged(&log, "job type registered after retrying").await;
    host.stop().await;
}

/// A host asks for no transparent huge pages: with the machine's setting at
/// `always`, each pooled memory and allocator page a run touches would take
/// 2 MiB (the memory figures in BENCHMARKS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_takes_no_transparent_huge_pages() {
    let _one = ONE_FLEET.lock().await;
    let db = TestDb::new(common::db::Backend::Postgres).await;
    let components = components(&["hello"]);
    let cache = tempfile::tempdir().unwrap();
    let mut host = common::fleet::start_host(&db, components.path(), cache.path());
    wait_serving(&db, &[&host], 1).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", host.pid())).unwrap();
    let thp = status.lines().find(|l| l.starts_with("THP_enabled:")).expect("a kernel that reports THP_enabled");
    assert_eq!(thp.split_whitespace().nth(1), Some("0"), "{thp}");
    host.stop().await;
}
