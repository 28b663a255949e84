//! A 1,000-member batch across a fleet of real `jobhost run` processes with
//! one SIGKILLed mid-run, on both backends: every member ends once, the
//! batch's counts equal the archive, and each due callback is enqueued
//! exactly once, by the transaction that ended the last member (guarantee 12).

use crate::common;

use std::time::Duration;

use jobhost::store::{BatchState, Callbacks, EnqueueParams, NewBatch};
use serde_json::json;

use common::db::{Backend, TestDb};
use common::eventually;
use common::fleet::{Host, ONE_FLEET, components, nothing_left, start_host, wait_serving};

const MEMBERS: usize = 1_000;
/// Every this many members fails after its last attempt.
const FAILING_EVERY: usize = 25;
const WITHIN: Duration = Duration::from_secs(120);

async fn a_thousand_member_batch_survives_a_killed_host(db: TestDb) {
    let _one = ONE_FLEET.lock().await;
    let components = components(&["sleep", "flaky", "hello"]);
    let cache = tempfile::tempdir().unwrap();
    let mut hosts: Vec<Host> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
    wait_serving(&db, &hosts.iter().collect::<Vec<_>>(), 3).await;

    // Most members sleep 20 ms; every 10th fails once and then succeeds
    // (a success), every 25th fails all five of its attempts.
    let members: Vec<_> = (0..MEMBERS)
        .map(|i| match i {
            i if i % FAILING_EVERY == 0 => EnqueueParams::new("flaky", json!({"fail_times": 99, "i": i})),
            i if i % 10 == 0 => EnqueueParams::new("flaky", json!({"fail_times": 1, "i": i})),
            i => EnqueueParams::new("sleep", json!({"ms": 20, "i": i})),
        })
        .collect();
    let callbacks = Callbacks {
        on_finish: Some("hello".into()),
        on_success: Some("hello".into()),
        on_failure: Some("hello".into()),
    };
    let batch = NewBatch { label: Some("fleet".into()), callbacks, callback_payload: None, open: false };
    let (id, _) = db.store.batch_create(&batch, &members).await.unwrap();

    eventually(WITHIN, || async {
        db.scalar(format!("SELECT count(*) FROM jobhost.archive WHERE batch_id = {id}")).await >= 200
    })
    .await;
    let doomed = hosts[0].id_pattern();
    let on_doomed = format!("SELECT count(*) FROM jobhost.jobs WHERE state = 'running' AND host_id LIKE '{doomed}'");
    eventually(WITHIN, || async { db.scalar(&on_doomed).await > 0 }).await;
    hosts[0].signal(libc::SIGKILL);
    hosts[0].wait().await;

    eventually(WITHIN, || async { db.store.batch_get(id).await.unwrap().unwrap().finished_at.is_some() }).await;
    let done = db.store.batch_get(id).await.unwrap().unwrap();
    let failing = MEMBERS.div_ceil(FAILING_EVERY) as i64;
    assert_eq!(done.state, BatchState::Failed);
    assert_eq!(
        (done.counts.total, done.counts.completed, done.counts.failed, done.counts.discarded, done.counts.cancelled),
        (MEMBERS as i64, MEMBERS as i64 - failing, failing, 0, 0)
    );
    let archived: Vec<(String, i64)> =
        db.rows(format!("SELECT state, count(*) FROM jobhost.archive WHERE batch_id = {id} GROUP BY state")).await;
    let mut archived: Vec<(String, i64)> = archived;
    archived.sort();
    assert_eq!(
        archived,
        vec![("completed".to_string(), MEMBERS as i64 - failing), ("failed".to_string(), failing)],
        "the counts equal the archive"
    );
    let i = db.dialect("(payload->>'i')::int", "payload->>'i'");
    assert_eq!(
        db.scalar(format!("SELECT count(DISTINCT {i}) FROM jobhost.archive WHERE batch_id = {id}")).await,
        MEMBERS as i64,
        "every member ended once"
    );
    let killed = db.dialect("errors::text", "errors");
    assert!(
        db.scalar(format!(
            "SELECT count(*) FROM jobhost.archive WHERE batch_id = {id} AND {killed} LIKE '%lease expired%host {doomed}'"
        ))
        .await
            > 0,
        "the killed host's members were redelivered"
    );

    // on_finish and on_failure, once each; on_success not at all.
    assert_eq!(done.callback_jobs.keys().collect::<Vec<_>>(), ["on_failure", "on_finish"]);
    eventually(WITHIN, || async {
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE job = 'hello' AND state = 'completed'").await == 2
    })
    .await;
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE job = 'hello'").await, 0, "no callback twice");
    let callback = db.store.job_get(done.callback_jobs["on_finish"]).await.unwrap().unwrap();
    assert_eq!(callback.payload["_batch"]["failed"], failing);
    assert_eq!(callback.payload["_batch"]["completed"], MEMBERS as i64 - failing);
    for host in &mut hosts[1..] {
        host.stop().await;
    }
    nothing_left(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_thousand_member_batch_survives_a_killed_host() {
    a_thousand_member_batch_survives_a_killed_host(TestDb::new(Backend::Postgres).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_thousand_member_batch_survives_a_killed_host() {
    a_thousand_member_batch_survives_a_killed_host(TestDb::new(Backend::Sqlite).await).await;
}
