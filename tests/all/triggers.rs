//! Event triggers and events sent by jobs (docs/events.md, WIT 0.7.0):
//! an event enqueues one job of each type subscribed to its key, with its
//! payload, in the transaction that stores it (so exactly once per event
//! and type, a refused type recorded without losing the event); a running
//! job's events are sent with its completion, never by an attempt that
//! failed; a step a run grows may wait for an event; and a fleet with a
//! host SIGKILLed mid-run still runs each (event, type) once.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common;

use jobhost::store::wait::TriggeredJob;
use jobhost::store::{StepState, Workflow};
use jobhost::template::KeyTemplate;
use jobhost::types::{ConcurrencyConfig, OnConflict};
use serde_json::json;

use common::db::{Backend, TestDb, on_both_backends};
use common::fleet::{Host, ONE_FLEET, components, nothing_left, start_host, wait_serving};
use common::{eventually, job_config};

const WITHIN: Duration = Duration::from_secs(120);

/// Registers `name`, subscribed to `keys`.
async fn subscribe(db: &TestDb, name: &str, keys: &[&str]) {
    let mut config = job_config(name);
    config.on_events = keys.iter().map(|k| k.to_string()).collect();
    db.store.job_types_register(&[(config, "v1".into())]).await.unwrap();
}

fn by_type(jobs: &[TriggeredJob]) -> BTreeMap<&str, &TriggeredJob> {
    jobs.iter().map(|job| (job.job.as_str(), job)).collect()
}

/// One event, three subscribers: a job of each subscribed type with the
/// event's payload, none of the type subscribed to another key, and a type
/// whose enqueue is refused (a full `raise` limit) recorded with its
/// reason while the event and the other jobs stand. A duplicate send
/// enqueues nothing more.
async fn an_event_enqueues_one_job_of_each_subscribed_type(db: TestDb) {
    subscribe(&db, "mail", &["order.paid"]).await;
    subscribe(&db, "stock", &["order.refunded", "order.paid"]).await;
    subscribe(&db, "audit", &["order.refunded"]).await;
    let mut limited = job_config("limited");
    limited.on_events = vec!["order.paid".into()];
    limited.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("order:{order}").unwrap(),
        duration_secs: 60,
        on_conflict: OnConflict::Raise,
    });
    db.store.job_types_register(&[(limited, "v1".into())]).await.unwrap();

    let payload = json!({"order": 7, "total": "12.50"});
    let sent = db.store.event_send("order.paid", &payload, Some("pay-7"), "test").await.unwrap();
    assert!(!sent.duplicate);
    let jobs = by_type(&sent.jobs);
    assert_eq!(jobs.keys().copied().collect::<Vec<_>>(), ["limited", "mail", "stock"], "{sent:?}");
    for (job, triggered) in &jobs {
        let id = triggered.id.unwrap_or_else(|| panic!("{job} was enqueued: {triggered:?}"));
        let detail = db.store.job_get(id).await.unwrap().unwrap();
        assert_eq!(detail.row.job, *job);
        assert_eq!(detail.payload, payload, "the event's payload is the job's");
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE job = 'audit'").await, 0);

    let again = db.store.event_send("order.paid", &payload, Some("pay-7"), "test").await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.id, sent.id);
    assert_eq!(again.jobs, sent.jobs, "a duplicate reports the first send's jobs");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 3, "and enqueues none");

    // The same order paid again: `limited`'s key is held, its `raise`
    // refuses; the event and the others' jobs stand.
    let second = db.store.event_send("order.paid", &payload, None, "test").await.unwrap();
    let jobs = by_type(&second.jobs);
    assert!(jobs["mail"].id.is_some() && jobs["stock"].id.is_some(), "{second:?}");
    assert_eq!(jobs["limited"].id, None);
    assert!(jobs["limited"].error.as_deref().is_some_and(|e| e.contains("order:7")), "{:?}", jobs["limited"]);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 5);

    let listed = db.store.event_list(Some("order.paid"), 10).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].jobs, second.jobs, "the list shows what each event enqueued");
    assert_eq!(listed[1].jobs, sent.jobs);
}

/// A job's events are sent when it completes: an attempt that fails sends
/// nothing, the attempt that completes sends each once, named as its job's.
/// Three types subscribed to `relay.ping` (one source built under three
/// names) each relay it once as `relay.echo`.
async fn a_job_sends_its_events_with_its_completion(db: TestDb) {
    let host = common::TestHost::start(&db, &["relay", "relay_b", "relay_c"], |_| {}).await;
    let ping = json!({"order": 1, "fail_attempts": 1, "send": [{"key": "relay.echo", "payload": {"n": 1}}]});
    let sent = db.store.event_send("relay.ping", &ping, None, "test").await.unwrap();
    let ids: Vec<i64> = sent.jobs.iter().map(|job| job.id.expect("enqueued")).collect();
    assert_eq!(ids.len(), 3, "{sent:?}");
    eventually(WITHIN, || async {
        db.scalar("SELECT count(*) FROM jobhost.archive WHERE job LIKE 'relay%' AND state = 'completed'").await == 3
    })
    .await;
    let echoes = db.store.event_list(Some("relay.echo"), 100).await.unwrap();
    assert_eq!(echoes.len(), 3, "one per job, none from the failed attempts: {echoes:?}");
    let mut sources: Vec<String> = echoes.iter().map(|e| e.source.clone()).collect();
    sources.sort();
    let mut expected: Vec<String> = ids.iter().map(|id| format!("job:{id}")).collect();
    expected.sort();
    assert_eq!(sources, expected);
    let mut from: Vec<&str> = echoes.iter().map(|e| e.payload["from"].as_str().unwrap()).collect();
    from.sort_unstable();
    assert_eq!(from, ["relay", "relay_b", "relay_c"]);
    assert!(echoes.iter().all(|e| e.payload["n"] == 1 && e.payload["order"] == 1));
    for id in ids {
        let output = db.store.job_get(id).await.unwrap().unwrap().output.unwrap();
        assert_eq!(output["attempt"], 2, "the first attempt failed: {output}");
    }
    host.stop().await;
}

async fn shown(db: &TestDb, id: i64) -> Workflow {
    db.store.workflow_get(id).await.unwrap().expect("the workflow exists")
}

/// A step a run adds to its own workflow (WIT 0.7.0 `new-step.wait`) waits
/// for its event once its dependencies have ended: an event for another
/// order leaves it waiting, the matching one releases it with the event's
/// payload under `_event`.
async fn a_grown_step_waits_for_its_event(db: TestDb) {
    let host = common::TestHost::start(&db, &["grower", "hello"], |_| {}).await;
    let wait = json!({"event": "order.shipped", "match": {"order": "{order}"}});
    let grow = json!({"count": 1, "join": true, "join_payload": {"order": 5}, "join_wait": wait});
    let workflow = serde_json::from_value(json!({
        "label": "grown wait",
        "steps": [{"name": "g", "job": "grower", "payload": {"grow": grow}}],
    }))
    .unwrap();
    let id = db.store.workflow_create(&workflow).await.unwrap().id;
    let join_armed = || async {
        let wf = shown(&db, id).await;
        wf.steps.iter().any(|s| s.name == "g/join" && s.wait.as_ref().is_some_and(|w| w.armed_at.is_some()))
    };
    eventually(WITHIN, join_armed).await;
    let join = || async { shown(&db, id).await.steps.into_iter().find(|s| s.name == "g/join").unwrap() };
    let waiting = join().await;
    assert_eq!(waiting.state, StepState::Waiting);
    assert_eq!(waiting.wait.as_ref().unwrap().matching, BTreeMap::from([("order".into(), "5".into())]));

    let other = db.store.event_send("order.shipped", &json!({"order": 6}), None, "test").await.unwrap();
    assert_eq!(other.released, 0, "another order's event");
    let shipped = db.store.event_send("order.shipped", &json!({"order": 5, "carrier": "dhl"}), None, "test").await;
    assert_eq!(shipped.unwrap().released, 1);
    eventually(WITHIN, || async { join().await.state == StepState::Completed }).await;
    let released = db.store.job_get(join().await.job_id.unwrap()).await.unwrap().unwrap();
    assert_eq!(released.payload["_event"], json!({"order": 5, "carrier": "dhl"}));
    host.stop().await;
}

/// A workflow whose step `pay` (a relay run) sends `shipment.ready` for
/// its order, and whose step `ship` waits for that event after `pay`.
async fn paid_then_shipped(db: &TestDb) -> i64 {
    let workflow = serde_json::from_value(json!({
        "label": "its own event",
        "steps": [
            {"name": "pay", "job": "relay", "payload": {"order": 1, "send": [{"key": "shipment.ready"}]}},
            {"name": "ship", "job": "hello", "payload": {"order": 1}, "after": ["pay"],
             "wait": {"event": "shipment.ready", "match": {"order": "{order}"}}},
        ],
    }))
    .unwrap();
    db.store.workflow_create(&workflow).await.unwrap().id
}

/// The event is `pay`'s own, and `ship` was released by it, once.
async fn shipped_by_pays_event(db: &TestDb, id: i64) {
    let ship = || async { shown(db, id).await.steps.into_iter().find(|s| s.name == "ship").unwrap() };
    eventually(WITHIN, || async { ship().await.state == StepState::Completed }).await;
    let released = db.store.job_get(ship().await.job_id.unwrap()).await.unwrap().unwrap();
    assert_eq!(released.payload["_event"]["from"], "relay", "{}", released.payload);
    let pay = shown(db, id).await.steps.into_iter().find(|s| s.name == "pay").unwrap();
    let events = db.store.event_list(Some("shipment.ready"), 10).await.unwrap();
    let own: Vec<_> = events.iter().filter(|e| e.source == format!("job:{}", pay.job_id.unwrap())).collect();
    assert_eq!(own.len(), 1);
    assert_eq!(own[0].released, 1);
    assert_eq!(ship().await.wait.unwrap().event_id, Some(own[0].id));
}

/// A step's run sends the event its dependent waits for: the completion
/// that ends the run arms the dependent's wait and then sends the event,
/// in one transaction, so the event ends the wait.
async fn a_runs_own_event_ends_the_wait_its_completion_armed(db: TestDb) {
    let host = common::TestHost::start(&db, &["relay", "hello"], |_| {}).await;
    let id = paid_then_shipped(&db).await;
    shipped_by_pays_event(&db, id).await;
    host.stop().await;
}

on_both_backends!(
    a_runs_own_event_ends_the_wait_its_completion_armed,
    an_event_enqueues_one_job_of_each_subscribed_type,
    a_job_sends_its_events_with_its_completion,
    a_grown_step_waits_for_its_event,
);

/// `jobhost.send_event` in the application's own transaction: a rollback
/// enqueues no subscriber's job, a commit enqueues each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_transaction_triggers_on_commit_only() {
    let db = TestDb::new(Backend::Postgres).await;
    subscribe(&db, "mail", &["signup"]).await;
    let send = "SELECT jobhost.send_event('signup', '{\"user\": 3}')";
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query(send).execute(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 0);
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query(send).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE job = 'mail' AND payload->>'user' = '3'").await, 1);
}

/// As above, while an application's transaction sending to the same key
/// is open: the completion cannot take the key, leaves the wait to
/// maintenance with its snapshot, and sends its own event. Maintenance
/// arms the wait after the application's transaction ends and finds that
/// event, which the snapshot of its own transaction could not tell apart
/// from an older one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_own_event_ends_a_wait_its_completion_left_to_maintenance() {
    let db = TestDb::new(Backend::Postgres).await;
    let host = common::TestHost::start(&db, &["relay", "hello"], |_| {}).await;
    let mut application = db.pool().begin().await.unwrap();
    sqlx::query("SELECT jobhost.send_event('shipment.ready', '{\"order\": 99}')")
        .execute(&mut *application)
        .await
        .unwrap();
    let id = paid_then_shipped(&db).await;
    let deferred = "SELECT count(*) FROM jobhost.workflow_waits WHERE deferred_by IS NOT NULL";
    eventually(WITHIN, || async { db.scalar(deferred).await == 1 }).await;
    // Another transaction commits meanwhile: the completion's own id is then
    // below every snapshot's horizon, "visible" to its own snapshot.
    db.execute("SELECT 1").await;
    application.commit().await.unwrap();
    shipped_by_pays_event(&db, id).await;
    host.stop().await;
}

const ORDERS: usize = 150;

/// 150 `order.paid` events (some sent twice with their idempotency key)
/// fan out to three types across three `jobhost run` processes, one
/// SIGKILLed mid-run; each job relays one `order.relayed` event when it
/// completes. Afterwards each (order, type) ran to completion once, and
/// each was relayed once: the killed runs' events died with them.
async fn an_event_fans_out_once_per_type_across_a_killed_host(db: TestDb) {
    let _one = ONE_FLEET.lock().await;
    let components = components(&["relay", "relay_b", "relay_c"]);
    let cache = tempfile::tempdir().unwrap();
    let mut hosts: Vec<Host> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
    wait_serving(&db, &hosts.iter().collect::<Vec<_>>(), 3).await;

    let send = |order: usize| {
        let store = db.store.clone();
        async move {
            let payload = json!({"order": order, "ms": 40, "send": [{"key": "order.relayed"}]});
            let idempotency = format!("paid-{order}");
            store.event_send("order.paid", &payload, Some(&idempotency), "test").await.unwrap()
        }
    };
    let mut sends = tokio::task::JoinSet::new();
    for order in 0..ORDERS {
        sends.spawn(send(order));
    }
    let doomed = hosts[0].id_pattern();
    let on_doomed = format!("SELECT count(*) FROM jobhost.jobs WHERE state = 'running' AND host_id LIKE '{doomed}'");
    eventually(WITHIN, || async { db.scalar(&on_doomed).await > 0 }).await;
    hosts[0].signal(libc::SIGKILL);
    hosts[0].wait().await;
    // Resent after the kill: duplicates, which enqueue nothing.
    for order in (0..ORDERS).step_by(10) {
        sends.spawn(send(order));
    }
    let mut duplicates = 0;
    while let Some(sent) = sends.join_next().await {
        let sent = sent.unwrap();
        assert_eq!(sent.jobs.len(), 3, "{sent:?}");
        duplicates += usize::from(sent.duplicate);
    }
    assert_eq!(duplicates, ORDERS / 10);

    let done = "SELECT count(*) FROM jobhost.archive WHERE job LIKE 'relay%' AND state = 'completed'";
    eventually(WITHIN, || async { db.scalar(done).await == 3 * ORDERS as i64 }).await;
    for host in &mut hosts[1..] {
        host.stop().await;
    }
    let repeated = "SELECT count(*) FROM (SELECT job, payload->>'order' FROM jobhost.archive
                    GROUP BY job, payload->>'order' HAVING count(*) <> 1) r";
    assert_eq!(db.scalar(repeated).await, 0, "each (order, type) has one job");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive").await, 3 * ORDERS as i64);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.events WHERE key = 'order.paid'").await, ORDERS as i64);
    let relayed = db.store.event_list(Some("order.relayed"), 10 * ORDERS as i64).await.unwrap();
    let mut once: BTreeMap<(String, String), usize> = BTreeMap::new();
    for event in &relayed {
        let from = event.payload["from"].as_str().unwrap().to_string();
        *once.entry((from, event.payload["order"].to_string())).or_default() += 1;
    }
    assert_eq!(relayed.len(), 3 * ORDERS, "one relay per job");
    assert!(once.values().all(|n| *n == 1), "each job relayed once");
    let killed = db.dialect("errors::text", "errors");
    let redone = format!("SELECT count(*) FROM jobhost.archive WHERE {killed} LIKE '%lease expired%host {doomed}'");
    assert!(db.scalar(&redone).await > 0, "the killed host's runs were redelivered");
    nothing_left(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_event_fans_out_once_per_type_across_a_killed_host() {
    an_event_fans_out_once_per_type_across_a_killed_host(TestDb::new(Backend::Postgres).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_event_fans_out_once_per_type_across_a_killed_host() {
    an_event_fans_out_once_per_type_across_a_killed_host(TestDb::new(Backend::Sqlite).await).await;
}
