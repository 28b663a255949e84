//! What operators do to a working fleet: cancel a running job, pause and
//! resume a queue, and tell live hosts from dead ones, on both backends.

use crate::common;

use std::time::Duration;

use jobhost::store::{Cancel, EnqueueParams, HostInfo, JobState};
use serde_json::json;

use common::db::{Backend, TestDb, on_both_backends};
use common::{TestHost, eventually};

const WITHIN: Duration = Duration::from_secs(60);

/// A cancelled running job is stopped by its host and archived as cancelled
/// in the transaction that gives back its slot, so the job blocked behind it
/// runs, and never beside it; children it enqueued before are not written.
async fn a_running_job_is_cancelled_by_its_host(db: TestDb) {
    let host = TestHost::start(&db, &["serial", "fanout", "hello"], |_| {}).await;
    let client = jobhost::Client::from_store(db.dyn_store());
    let holder = client.enqueue("serial", json!({"key": "k", "ms": 600_000})).await.unwrap();
    let running = |id: i64| format!("SELECT count(*) FROM jobhost.jobs WHERE id = {id} AND state = 'running'");
    eventually(WITHIN, || async { db.scalar(running(holder)).await == 1 }).await;
    let blocked = client.enqueue("serial", json!({"key": "k", "ms": 0})).await.unwrap();
    assert_eq!(db.state_of(blocked).await, JobState::Blocked);
    let parent = client.enqueue("fanout", json!({"count": 3, "sleep_ms": 600_000})).await.unwrap();
    eventually(WITHIN, || async { db.scalar(running(parent)).await == 1 }).await;

    assert_eq!(db.store.job_cancel(holder).await.unwrap(), Cancel::Requested);
    assert_eq!(db.store.job_cancel(parent).await.unwrap(), Cancel::Requested);
    eventually(WITHIN, || async { db.state_of(blocked).await == JobState::Completed }).await;
    eventually(WITHIN, || async { db.state_of(parent).await == JobState::Cancelled }).await;
    for id in [holder, parent] {
        let job = db.store.job_get(id).await.unwrap().unwrap();
        assert_eq!(job.row.state, JobState::Cancelled);
        assert!(job.row.error.unwrap_or_default().contains("cancelled by an operator"));
    }
    // The blocked job started only once the holder's slot was given back.
    let ran_after: i64 = db
        .scalar(format!(
            "SELECT count(*) FROM jobhost.archive p, jobhost.archive h
             WHERE p.id = {blocked} AND h.id = {holder} AND p.started_at >= h.finished_at"
        ))
        .await;
    assert_eq!(ran_after, 1, "the blocked job never ran beside the cancelled holder");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive WHERE job = 'hello'").await, 0, "no children");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.semaphores").await, 0, "no slot left held");
    host.stop().await;
}

/// A cancel that reaches a running job whose host died is carried out by
/// the lease's expiry: archived as cancelled, not redelivered.
async fn a_cancelled_job_whose_host_died_is_not_redelivered(db: TestDb) {
    db.store.job_types_register(&[(common::job_config("mail"), "d".into())]).await.unwrap();
    let id = db.store.job_enqueue(&[EnqueueParams::new("mail", json!({}))]).await.unwrap()[0];
    assert_eq!(db.store.job_fetch(&common::fetch_params("dead-host", &["mail"], 1)).await.unwrap().len(), 1);
    assert_eq!(db.store.job_cancel(id).await.unwrap(), Cancel::Requested);
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (0, 1));
    assert_eq!(db.state_of(id).await, JobState::Cancelled);
}

/// After `pause` returns, no host leases from the queue; running jobs are
/// not touched; `resume` lets its jobs run.
async fn a_paused_queue_is_leased_by_no_host(db: TestDb) {
    let host = TestHost::start(&db, &["hello"], |config| {
        config.worker.queues = vec!["default".into(), "other".into()];
    })
    .await;
    assert!(db.store.queue_pause("default").await.unwrap());
    assert!(!db.store.queue_pause("default").await.unwrap(), "paused already");
    let client = jobhost::Client::from_store(db.dyn_store());
    let waiting = client.enqueue("hello", json!({})).await.unwrap();
    // A later job of another queue: once it has run, the host has fetched
    // since the first was enqueued, and passed it over.
    let witness = client
        .enqueue_with(EnqueueParams { queue: Some("other".into()), ..EnqueueParams::new("hello", json!({})) })
        .await
        .unwrap();
    eventually(WITHIN, || async { db.state_of(witness).await == JobState::Completed }).await;
    assert_eq!(db.state_of(waiting).await, JobState::Available, "a paused queue's job waits");
    assert_eq!(db.store.job_stats().await.unwrap().paused_queues, ["default"]);

    assert!(db.store.queue_resume("default").await.unwrap());
    eventually(WITHIN, || async { db.state_of(waiting).await == JobState::Completed }).await;
    assert!(db.store.job_stats().await.unwrap().paused_queues.is_empty());
    assert!(!db.store.queue_resume("default").await.unwrap(), "not paused");
    host.stop().await;
}

/// A host is alive while it renews its row within its own heartbeat's
/// allowance; a silent one is listed as presumed dead, whatever the others'
/// intervals are.
async fn hosts_are_judged_alive_by_their_own_heartbeat(db: TestDb) {
    let fast = HostInfo { id: "fast".into(), ..HostInfo::current(vec![], Duration::from_millis(100)) };
    let slow = HostInfo { id: "slow".into(), ..HostInfo::current(vec![], Duration::from_secs(3600)) };
    db.store.host_upsert(&fast).await.unwrap();
    db.store.host_upsert(&slow).await.unwrap();
    assert_eq!(db.store.job_stats().await.unwrap().hosts_alive, 2);
    // Both last seen ten seconds ago: a hundred of fast's heartbeats, a
    // fraction of slow's.
    db.execute(match db.backend {
        Backend::Postgres => "UPDATE jobhost.hosts SET last_seen_at = last_seen_at - interval '10 seconds'",
        Backend::Sqlite => "UPDATE hosts SET last_seen_at = last_seen_at - 10000",
    })
    .await;
    let stats = db.store.job_stats().await.unwrap();
    assert_eq!(stats.hosts_alive, 1);
    let silent: Vec<&str> = stats.hosts_silent.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(silent, ["fast"]);
    assert!(stats.hosts_silent[0].silent_secs >= 10.0);
}

on_both_backends!(
    a_running_job_is_cancelled_by_its_host,
    a_cancelled_job_whose_host_died_is_not_redelivered,
    a_paused_queue_is_leased_by_no_host,
    hosts_are_judged_alive_by_their_own_heartbeat,
);
