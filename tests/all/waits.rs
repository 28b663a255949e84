//! Durable waits and events against real databases (docs/events.md,
//! DESIGN guarantee 17): a step that waits for an event or a time is
//! released once its dependencies have ended *and* its wait has, exactly
//! once, by its event, its time or its timeout, whichever comes first; an
//! event sent in an application's transaction delivers on commit only.

use std::time::Duration;

use crate::common;

use jobhost::store::wait::WaitEnd;
use jobhost::store::{FetchedJob, FinishOutcome, StepState, Workflow, WorkflowState};
use jobhost::types::JsonText;
use serde_json::{Value, json};

use common::db::{Backend, TestDb, on_both_backends};
use common::{completed, finish, job_config};

/// Registers `work`, one attempt a job.
async fn register(db: &TestDb) {
    let mut work = job_config("work");
    work.max_attempts = 1;
    db.store.job_types_register(&[(work, "v1".into())]).await.unwrap();
}

async fn create(db: &TestDb, steps: Value) -> i64 {
    let workflow = serde_json::from_value(json!({ "label": "waits", "steps": steps })).unwrap();
    db.store.workflow_create(&workflow).await.unwrap().id
}

async fn shown(db: &TestDb, id: i64) -> Workflow {
    db.store.workflow_get(id).await.unwrap().expect("the workflow exists")
}

async fn step_state(db: &TestDb, id: i64, name: &str) -> StepState {
    shown(db, id).await.steps.into_iter().find(|s| s.name == name).expect("the step").state
}

async fn ended_by(db: &TestDb, id: i64, name: &str) -> Option<WaitEnd> {
    let step = shown(db, id).await.steps.into_iter().find(|s| s.name == name).expect("the step");
    step.wait.expect("the step waits").ended_by
}

/// Leases every available `work` job, by its payload's `step`.
async fn fetch_steps(db: &TestDb) -> Vec<(String, FetchedJob)> {
    let mut jobs: Vec<(String, FetchedJob)> = db
        .fetch("work", 5000)
        .await
        .into_iter()
        .map(|j| (j.payload["step"].as_str().unwrap_or_default().to_string(), j))
        .collect();
    jobs.sort_by(|a, b| a.0.cmp(&b.0));
    jobs
}

fn completed_with(output: Value) -> FinishOutcome {
    FinishOutcome::Completed {
        output: Some(JsonText::from(&output)),
        children: Vec::new().into(),
        batches: Default::default(),
        workflows: Default::default(),
        events: Default::default(),
        schedules: Default::default(),
    }
}

/// Jobs, live or archived, whose payload's `step` is `name`.
async fn jobs_named(db: &TestDb, name: &str) -> i64 {
    let step = db.dialect("payload->>'step'", "payload ->> 'step'");
    db.scalar(format!(
        "SELECT (SELECT count(*) FROM jobhost.jobs WHERE {step} = '{name}')
              + (SELECT count(*) FROM jobhost.archive WHERE {step} = '{name}')"
    ))
    .await
}

async fn send(db: &TestDb, key: &str, payload: Value) -> i64 {
    db.store.event_send(key, &payload, None, "test").await.unwrap().released
}

fn later(hours: i64) -> Option<chrono::DateTime<chrono::Utc>> {
    Some(chrono::Utc::now() + chrono::Duration::hours(hours))
}

async fn an_event_wait_is_armed_when_its_dependencies_end_and_released_once_by_a_match(db: TestDb) {
    register(&db).await;
    let id = create(
        &db,
        json!([
            {"name": "charge", "job": "work", "payload": {"step": "charge"}},
            {"name": "ship", "job": "work", "payload": {"step": "ship", "order": 42}, "after": ["charge"],
             "wait": {"event": "order.confirmed", "match": {"order_id": "{order}"}}},
        ]),
    )
    .await;
    // Not armed yet: an event now is before the wait, and ends nothing.
    assert_eq!(send(&db, "order.confirmed", json!({"order_id": 42})).await, 0);
    let charge = fetch_steps(&db).await.remove(0).1;
    db.store.job_finish(vec![finish(&charge, completed_with(json!({"charged": 10})))]).await.unwrap();
    assert_eq!(step_state(&db, id, "ship").await, StepState::Waiting, "its dependency ended; its wait holds it");
    let wait = shown(&db, id).await.steps.into_iter().find(|s| s.name == "ship").unwrap().wait.unwrap();
    assert!(wait.armed_at.is_some() && wait.ended_by.is_none(), "{wait:?}");
    assert_eq!(wait.matching["order_id"], "42", "the match is rendered from the step's payload");

    assert_eq!(send(&db, "order.confirmed", json!({"order_id": 41})).await, 0, "another order's event");
    assert_eq!(send(&db, "order.cancelled", json!({"order_id": 42})).await, 0, "another key");
    assert!(fetch_steps(&db).await.is_empty());
    assert_eq!(send(&db, "order.confirmed", json!({"order_id": 42, "by": "mail"})).await, 1);
    assert_eq!(send(&db, "order.confirmed", json!({"order_id": 42})).await, 0, "a second event finds it ended");
    let ship = fetch_steps(&db).await;
    assert_eq!(ship.len(), 1);
    assert_eq!(ship[0].1.payload["_event"], json!({"order_id": 42, "by": "mail"}));
    assert_eq!(ship[0].1.payload["_deps"], json!({"charge": {"charged": 10}}));
    assert_eq!(ended_by(&db, id, "ship").await, Some(WaitEnd::Event));
    db.store.job_finish(vec![finish(&ship[0].1, completed())]).await.unwrap();
    assert_eq!(shown(&db, id).await.state, WorkflowState::Succeeded);
    assert_eq!(jobs_named(&db, "ship").await, 1, "released once");
    let events = db.store.event_list(Some("order.confirmed"), 10).await.unwrap();
    assert_eq!(events.iter().map(|e| e.released).collect::<Vec<_>>(), [0, 1, 0, 0], "newest first");
}

async fn a_sleep_ends_by_the_clock_and_not_before(db: TestDb) {
    register(&db).await;
    let id = create(
        &db,
        json!([
            {"name": "welcome", "job": "work", "payload": {"step": "welcome"}},
            {"name": "tips", "job": "work", "payload": {"step": "tips"}, "after": ["welcome"],
             "wait": {"sleep": "24h"}},
            {"name": "at", "job": "work", "payload": {"step": "at"},
             "wait": {"until": "2000-01-01T00:00:00Z"}},
        ]),
    )
    .await;
    let first = fetch_steps(&db).await;
    assert_eq!(
        first.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["at", "welcome"],
        "a past instant is no wait"
    );
    db.store.job_finish(vec![finish(&first[1].1, completed())]).await.unwrap();
    assert_eq!(db.store.waits_due(later(23), 100).await.unwrap(), 0, "not due before 24 hours");
    assert_eq!(step_state(&db, id, "tips").await, StepState::Waiting);
    assert_eq!(db.store.waits_due(later(25), 100).await.unwrap(), 1);
    assert_eq!(step_state(&db, id, "tips").await, StepState::Available);
    assert_eq!(ended_by(&db, id, "tips").await, Some(WaitEnd::Time));
    assert_eq!(db.store.waits_due(later(26), 100).await.unwrap(), 0, "a wait ends once");
    assert_eq!(jobs_named(&db, "tips").await, 1);
}

async fn a_timeout_applies_the_steps_policy_and_a_late_event_ends_nothing(db: TestDb) {
    register(&db).await;
    let waiting = |name: &str, policy: &str| {
        json!({"name": name, "job": "work", "payload": {"step": name},
               "wait": {"event": format!("confirm.{name}"), "timeout": "1h", "on_timeout": policy}})
    };
    let id = create(
        &db,
        json!([
            waiting("f", "fail"),
            waiting("c", "cancel"),
            waiting("r", "run"),
            {"name": "d", "job": "work", "payload": {"step": "d"}, "wait": {"event": "confirm.d", "timeout": "1h"}},
            {"name": "after-f", "job": "work", "payload": {"step": "after-f"}, "after": ["f"]},
        ]),
    )
    .await;
    assert!(fetch_steps(&db).await.is_empty(), "every root waits");
    assert_eq!(db.store.waits_due(later(2), 100).await.unwrap(), 4);
    let wf = shown(&db, id).await;
    let state = |name: &str| wf.steps.iter().find(|s| s.name == name).unwrap().clone();
    assert_eq!(state("f").state, StepState::Failed);
    assert!(state("f").error.unwrap().contains("wait for event \"confirm.f\" timed out"));
    assert_eq!(state("c").state, StepState::Cancelled);
    assert_eq!(state("d").state, StepState::Failed, "fail is the default");
    assert_eq!(state("after-f").state, StepState::Cancelled, "a failed wait's dependents decide in turn");
    let runs = fetch_steps(&db).await;
    assert_eq!(runs.len(), 1, "r runs anyway");
    assert!(runs[0].1.payload.get("_event").is_none(), "with no event: {}", runs[0].1.payload);
    for name in ["f", "c", "r", "d"] {
        assert_eq!(ended_by(&db, id, name).await, Some(WaitEnd::Timeout), "{name}");
        assert_eq!(send(&db, &format!("confirm.{name}"), json!({})).await, 0, "{name}: after its timeout");
        assert_eq!(jobs_named(&db, name).await, 1, "{name}");
    }
}

async fn the_lookback_finds_an_event_sent_before_the_wait_and_none_without_it(db: TestDb) {
    register(&db).await;
    assert_eq!(send(&db, "signed", json!({"user": 7})).await, 0);
    let id = create(
        &db,
        json!([
            {"name": "back", "job": "work", "payload": {"step": "back", "user": 7},
             "wait": {"event": "signed", "match": {"user": "{user}"}, "lookback": "1h"}},
            {"name": "other", "job": "work", "payload": {"step": "other", "user": 8},
             "wait": {"event": "signed", "match": {"user": "{user}"}, "lookback": "1h"}},
            {"name": "none", "job": "work", "payload": {"step": "none", "user": 7},
             "wait": {"event": "signed", "match": {"user": "{user}"}}},
        ]),
    )
    .await;
    let runs = fetch_steps(&db).await;
    assert_eq!(runs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["back"]);
    assert_eq!(runs[0].1.payload["_event"], json!({"user": 7}));
    assert_eq!(ended_by(&db, id, "none").await, None, "no look back: the earlier event is not its");
    assert_eq!(send(&db, "signed", json!({"user": 7})).await, 1, "the next one is");
    assert_eq!(db.store.event_list(Some("signed"), 10).await.unwrap().last().unwrap().released, 1);
}

async fn a_cancelled_workflow_ends_its_waits_and_a_failed_dependency_skips_one(db: TestDb) {
    register(&db).await;
    let id = create(
        &db,
        json!([
            {"name": "a", "job": "work", "payload": {"step": "a"}},
            {"name": "w", "job": "work", "payload": {"step": "w"}, "after": ["a"], "wait": {"event": "go"}},
            {"name": "x", "job": "work", "payload": {"step": "x"}, "wait": {"event": "go"}},
        ]),
    )
    .await;
    let other =
        create(&db, json!([{"name": "y", "job": "work", "payload": {"step": "y"}, "wait": {"event": "go"}}])).await;
    db.store.workflow_cancel(other).await.unwrap().unwrap();
    assert_eq!(step_state(&db, other, "y").await, StepState::Cancelled);
    assert_eq!(ended_by(&db, other, "y").await, Some(WaitEnd::Skipped));

    let a = fetch_steps(&db).await.remove(0).1;
    db.store.job_finish(vec![finish(&a, FinishOutcome::Failed { error: "no card".into() })]).await.unwrap();
    assert_eq!(step_state(&db, id, "w").await, StepState::Cancelled, "not waited for: its dependency did not complete");
    assert_eq!(ended_by(&db, id, "w").await, Some(WaitEnd::Skipped));
    assert_eq!(send(&db, "go", json!({})).await, 1, "only x was still waiting");
    assert_eq!(fetch_steps(&db).await.len(), 1);
}

async fn an_event_and_a_timeout_at_once_end_each_wait_once(db: TestDb) {
    register(&db).await;
    let steps: Vec<Value> = (0..200)
        .map(|i| {
            json!({"name": format!("s{i}"), "job": "work", "payload": {"step": format!("s{i}"), "n": i},
                   "wait": {"event": "race", "match": {"n": "{n}"}, "timeout": "1h", "on_timeout": "run"}})
        })
        .collect();
    let id = create(&db, Value::Array(steps)).await;
    let store = db.store.clone();
    let timeouts = tokio::spawn(async move {
        let mut ended = 0;
        for _ in 0..20 {
            ended += store.waits_due(later(2), 10).await.unwrap();
        }
        ended
    });
    let mut senders = Vec::new();
    for part in 0..4 {
        let store = db.store.clone();
        senders.push(tokio::spawn(async move {
            let mut released = 0;
            for i in (part..200).step_by(4) {
                released += store.event_send("race", &json!({"n": i}), None, "test").await.unwrap().released;
            }
            released
        }));
    }
    let mut by_event = 0;
    for sender in senders {
        by_event += sender.await.unwrap();
    }
    let mut by_timeout = timeouts.await.unwrap() as i64;
    by_timeout += db.store.waits_due(later(3), 1000).await.unwrap() as i64;
    assert_eq!(by_event + by_timeout, 200, "each wait ended once: {by_event} by events, {by_timeout} by timeouts");
    let wf = shown(&db, id).await;
    for step in &wf.steps {
        assert_eq!(jobs_named(&db, &step.name).await, 1, "{} released once", step.name);
        let end = step.wait.as_ref().unwrap().ended_by;
        assert!(matches!(end, Some(WaitEnd::Event | WaitEnd::Timeout)), "{}: {end:?}", step.name);
    }
    let with_event = fetch_steps(&db).await.iter().filter(|(_, j)| j.payload.get("_event").is_some()).count() as i64;
    assert_eq!(with_event, by_event, "a step released by its event carries it; one by its timeout does not");
}

async fn an_idempotency_key_sends_once_and_bad_events_send_nothing(db: TestDb) {
    register(&db).await;
    create(&db, json!([{"name": "w", "job": "work", "payload": {"step": "w"}, "wait": {"event": "paid"}}])).await;
    let first = db.store.event_send("paid", &json!({"n": 1}), Some("stripe-evt-1"), "test").await.unwrap();
    let again = db.store.event_send("paid", &json!({"n": 1}), Some("stripe-evt-1"), "test").await.unwrap();
    assert_eq!((first.released, first.duplicate), (1, false));
    assert_eq!((again.id, again.released, again.duplicate), (first.id, 1, true), "a lost reply, retried");
    assert_eq!(db.store.event_list(None, 10).await.unwrap().len(), 1);
    for (key, payload) in [("", json!({})), ("k", json!([1])), ("k\n", json!({}))] {
        let error = db.store.event_send(key, &payload, None, "test").await.unwrap_err();
        assert!(matches!(error, jobhost::store::Error::InvalidEvent(_)), "{key:?} {payload}: {error}");
    }
    let bad =
        serde_json::from_value(json!({"steps": [{"name": "w", "job": "work", "payload": {"_event": 1}}]})).unwrap();
    assert!(db.store.workflow_create(&bad).await.is_err(), "a payload may not carry _event");
    let forever = serde_json::from_value(
        json!({"steps": [{"name": "w", "job": "work", "payload": {}, "wait": {"event": "k", "timeout": "101years"}}]}),
    )
    .unwrap();
    let error = db.store.workflow_create(&forever).await.unwrap_err().to_string();
    assert!(error.contains("100 years"), "{error}");
    let bad = serde_json::from_value(
        json!({"steps": [{"name": "w", "job": "work", "payload": {}, "wait": {"event": "k", "match": {"a": "{gone}"}}}]}),
    )
    .unwrap();
    let error = db.store.workflow_create(&bad).await.unwrap_err().to_string();
    assert!(error.contains("its wait") && error.contains("gone"), "{error}");
    assert_eq!(db.store.event_list(None, 10).await.unwrap().len(), 1, "nothing more was sent");
}

/// A match naming a field the step's payload lacks is rendered when the
/// wait is armed, from the payload and its dependency's output (the payload
/// first); one naming a field neither holds fails its step, and its
/// dependents decide by their policies.
async fn a_match_is_rendered_from_a_dependencys_output_when_armed(db: TestDb) {
    register(&db).await;
    let wait = json!({"event": "order.confirmed", "match": {"order_id": "{order}", "step": "{step}"}});
    let id = create(
        &db,
        json!([
            {"name": "charge", "job": "work", "payload": {"step": "charge"}},
            {"name": "ship", "job": "work", "payload": {"step": "ship"}, "after": ["charge"], "wait": wait},
            {"name": "other", "job": "work", "payload": {"step": "other"}},
            {"name": "lost", "job": "work", "payload": {"step": "lost"}, "after": ["other"], "wait": wait},
            {"name": "after-lost", "job": "work", "payload": {"step": "after-lost"}, "after": ["lost"]},
            {"name": "huge", "job": "work", "payload": {"step": "huge"}, "after": ["charge"],
             "wait": {"event": "order.confirmed", "match": {"order_id": "{blob}"}}},
        ]),
    )
    .await;
    let before = shown(&db, id).await.steps.into_iter().find(|s| s.name == "ship").unwrap().wait.unwrap();
    assert!(before.matching.is_empty(), "nothing to match until it is armed");
    assert_eq!(
        before.describe(chrono::Utc::now()),
        "event order.confirmed {order_id={order}, step={step}}, after its dependencies",
        "its templates, until then"
    );
    let firsts = fetch_steps(&db).await;
    let ends = firsts
        .iter()
        .map(|(name, job)| match name.as_str() {
            "charge" => {
                finish(job, completed_with(json!({"order": 42, "step": "from charge", "blob": "x".repeat(2000)})))
            }
            _ => finish(job, completed_with(json!({"nothing": "here"}))),
        })
        .collect();
    db.store.job_finish(ends).await.unwrap();
    let wf = shown(&db, id).await;
    let step = |name: &str| wf.steps.iter().find(|s| s.name == name).unwrap().clone();
    let ship = step("ship").wait.unwrap();
    assert_eq!(ship.match_later, None, "rendered");
    assert_eq!(
        ship.matching,
        std::collections::BTreeMap::from([("order_id".into(), "42".into()), ("step".into(), "ship".into())]),
        "the order from charge's output, the step from its own payload"
    );
    assert_eq!(step("lost").state, StepState::Failed);
    assert_eq!(step("lost").wait.unwrap().ended_by, Some(WaitEnd::Unmatched));
    assert!(step("lost").error.unwrap().contains("could not render its match"), "{:?}", step("lost"));
    assert_eq!(step("after-lost").state, StepState::Cancelled, "its dependent decides by its policy");
    let huge = step("huge");
    assert_eq!(
        (huge.state, huge.wait.unwrap().ended_by),
        (StepState::Failed, Some(WaitEnd::Unmatched)),
        "a key's most is 1,024 bytes"
    );
    assert_eq!(send(&db, "order.confirmed", json!({"order_id": 41, "step": "ship"})).await, 0);
    assert_eq!(send(&db, "order.confirmed", json!({"order_id": 42, "step": "ship"})).await, 1);
    assert_eq!(step_state(&db, id, "ship").await, StepState::Available);
}

on_both_backends!(
    a_match_is_rendered_from_a_dependencys_output_when_armed,
    an_event_wait_is_armed_when_its_dependencies_end_and_released_once_by_a_match,
    a_sleep_ends_by_the_clock_and_not_before,
    a_timeout_applies_the_steps_policy_and_a_late_event_ends_nothing,
    the_lookback_finds_an_event_sent_before_the_wait_and_none_without_it,
    a_cancelled_workflow_ends_its_waits_and_a_failed_dependency_skips_one,
    an_event_and_a_timeout_at_once_end_each_wait_once,
    an_idempotency_key_sends_once_and_bad_events_send_nothing,
);

/// The application's own transaction: an event sent in one that rolls back
/// delivers nothing; in one that commits, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_from_an_application_transaction_delivers_on_commit_only() {
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let id = create(&db, json!([{"name": "w", "job": "work", "payload": {"step": "w"}, "wait": {"event": "k"}}])).await;
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("SELECT jobhost.send_event('k', '{\"from\": \"app\"}')").execute(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(step_state(&db, id, "w").await, StepState::Waiting);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.events").await, 0, "a rolled back send stores nothing");

    let mut tx = db.pool().begin().await.unwrap();
    let event: i64 =
        sqlx::query_scalar("SELECT jobhost.send_event('k', '{\"from\": \"app\"}')").fetch_one(&mut *tx).await.unwrap();
    assert_eq!(step_state(&db, id, "w").await, StepState::Waiting, "not before the commit");
    tx.commit().await.unwrap();
    assert_eq!(step_state(&db, id, "w").await, StepState::Available);
    let job = fetch_steps(&db).await.remove(0).1;
    assert_eq!(job.payload["_event"], json!({"from": "app"}));
    assert_eq!(db.scalar(format!("SELECT released::bigint FROM jobhost.events WHERE id = {event}")).await, 1);

    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(&mut *tx).await.unwrap();
    let refused = sqlx::query("SELECT jobhost.send_event('k')").execute(&mut *tx).await.unwrap_err();
    assert!(refused.to_string().contains("READ COMMITTED"), "{refused}");
}

/// From SQL alone: an application creates a workflow whose step waits
/// (`jobhost.workflow_create`, in SQL's spelling of a wait) and later sends
/// its event; a bad wait is refused with SQLSTATE 22023 and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_made_in_sql_waits_for_an_event_sent_in_sql() {
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let id: i64 = sqlx::query_scalar(
        r#"SELECT jobhost.workflow_create('[
             {"name": "w", "job": "work", "payload": {"step": "w", "order": 7},
              "wait": {"event": "paid", "match": {"order_id": "{order}"}, "timeout_ms": 3600000, "on_timeout": "run"}},
             {"name": "s", "job": "work", "payload": {"step": "s"}, "wait": {"sleep_ms": 7200000}}
           ]'::jsonb)"#,
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let wait = shown(&db, id).await.steps.into_iter().find(|s| s.name == "w").unwrap().wait.unwrap();
    assert_eq!((wait.key.as_deref(), wait.matching["order_id"].as_str()), (Some("paid"), "7"));
    assert_eq!(wait.on_timeout, jobhost::store::IfFailed::Run);
    assert!(wait.armed_at.is_some(), "a root's wait is armed at creation");
    let released: i64 = sqlx::query_scalar("SELECT (jobhost.event_send('paid', '{\"order_id\": 7}')).released::bigint")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(released, 1);
    assert_eq!(fetch_steps(&db).await.remove(0).1.payload["_event"], json!({"order_id": 7}));
    assert_eq!(db.store.waits_due(later(1), 10).await.unwrap(), 0);
    assert_eq!(db.store.waits_due(later(3), 10).await.unwrap(), 1, "the sleep of two hours");

    // A match field its payload lacks, on a step with a dependency: kept
    // for the arming, when the dependency's output may hold it.
    sqlx::query(
        r#"SELECT jobhost.workflow_create('[
             {"name": "a", "job": "work", "payload": {"step": "a"}},
             {"name": "b", "job": "work", "payload": {"step": "b"}, "after": ["a"],
              "wait": {"event": "paid", "match": {"order_id": "{order}"}}}
           ]'::jsonb)"#,
    )
    .execute(db.pool())
    .await
    .unwrap();
    let malformed = sqlx::query(
        r#"SELECT jobhost.workflow_create('[
             {"name": "a", "job": "work", "payload": {"step": "a"}},
             {"name": "b", "job": "work", "payload": {"step": "b"}, "after": ["a"],
              "wait": {"event": "paid", "match": {"order_id": "{order}{bad"}}}
           ]'::jsonb)"#,
    )
    .execute(db.pool())
    .await;
    assert!(malformed.is_err(), "a template that does not parse is refused at once, dependencies or not");
    let kept = "SELECT count(*) FROM jobhost.workflow_waits WHERE match_later = '{\"order_id\": \"{order}\"}' AND match = '{}'";
    assert_eq!(db.scalar(kept).await, 1);

    let workflows = db.scalar("SELECT count(*) FROM jobhost.workflows").await;
    for bad in [
        r#"{"event": "k", "sleep_ms": 1}"#,
        r#"{"sleep_ms": 1, "match": {"a": "b"}}"#,
        r#"{"event": "k", "match": {"a": "{missing}"}}"#,
        r#"{"event": "k", "on_timeout": "later"}"#,
        r#"{"event": "k", "timeout": "3d"}"#,
        r#"{"event": "k", "timeout_ms": 9300000000000000}"#,
    ] {
        let error = sqlx::query(
            "SELECT jobhost.workflow_create(jsonb_build_array(
                 jsonb_build_object('name', 'b', 'job', 'work', 'wait', $1::jsonb)))",
        )
        .bind(bad)
        .execute(db.pool())
        .await
        .unwrap_err();
        let code = error.as_database_error().and_then(|e| e.code()).map(|c| c.to_string());
        assert_eq!(code.as_deref(), Some("22023"), "{bad}: {error}");
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.workflows").await, workflows, "nothing stored");
}

/// An application transaction that sent an event and has not committed
/// while the wait's dependency ends: the wait is armed only after that
/// transaction ends, so its look back sees the event (without the key's
/// lock, the send's scan missed the wait and the arming missed the event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_in_flight_while_its_wait_is_armed_is_not_lost() {
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let id = create(
        &db,
        json!([
            {"name": "a", "job": "work", "payload": {"step": "a"}},
            {"name": "w", "job": "work", "payload": {"step": "w"}, "after": ["a"],
             "wait": {"event": "k", "lookback": "1m"}},
        ]),
    )
    .await;
    let a = fetch_steps(&db).await.remove(0).1;
    let mut app = db.pool().begin().await.unwrap();
    sqlx::query("SELECT jobhost.send_event('k', '{\"n\": 1}')").execute(&mut *app).await.unwrap();
    // The dependency ends while the application's transaction is open: the
    // result write does not wait for it, and leaves the wait unarmed.
    db.store.job_finish(vec![finish(&a, completed())]).await.unwrap();
    assert_eq!(step_state(&db, id, "w").await, StepState::Waiting);
    assert_eq!(db.store.waits_due(None, 100).await.unwrap(), 0, "maintenance waits for the sender, briefly");
    app.commit().await.unwrap();
    common::eventually(Duration::from_secs(10), || async {
        db.store.waits_due(None, 100).await.unwrap();
        step_state(&db, id, "w").await == StepState::Available
    })
    .await;
    assert_eq!(fetch_steps(&db).await.remove(0).1.payload["_event"], json!({"n": 1}));
    assert_eq!(ended_by(&db, id, "w").await, Some(WaitEnd::Event));
}

/// A wait its result write could not arm (a sender of its key was in its
/// transaction) is armed by maintenance: an event sent after the
/// dependency ended, before that, still ends it, without a look back; and
/// a sender that keeps another key's lock holds back only that key's wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_armed_late_takes_the_events_sent_since_its_dependency_ended() {
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let waiting = |key: &str| {
        json!([
            {"name": "a", "job": "work", "payload": {"step": format!("a-{key}")}},
            {"name": "w", "job": "work", "payload": {"step": format!("w-{key}"), "n": 1}, "after": ["a"],
             "wait": {"event": key, "match": {"n": "{n}"}}},
        ])
    };
    let k1 = create(&db, waiting("k1")).await;
    let k2 = create(&db, waiting("k2")).await;
    let mut firsts = fetch_steps(&db).await;
    // Senders of both keys in their transactions (events matching nothing).
    let mut slow = db.pool().begin().await.unwrap();
    sqlx::query("SELECT jobhost.send_event('k1', '{\"n\": 0}')").execute(&mut *slow).await.unwrap();
    let mut quick = db.pool().begin().await.unwrap();
    sqlx::query("SELECT jobhost.send_event('k2', '{\"n\": 0}')").execute(&mut *quick).await.unwrap();
    let ends: Vec<_> = firsts.drain(..).map(|(_, job)| finish(&job, completed())).collect();
    db.store.job_finish(ends).await.unwrap();
    quick.commit().await.unwrap();
    // Sent after the dependencies ended, while their waits were unarmed.
    assert_eq!(send(&db, "k2", json!({"n": 1})).await, 0, "not armed yet");
    db.store.waits_due(None, 100).await.unwrap();
    assert_eq!(step_state(&db, k2, "w").await, StepState::Available, "k2's sender held back nothing of k1's");
    assert_eq!(ended_by(&db, k2, "w").await, Some(WaitEnd::Event));
    assert_eq!(step_state(&db, k1, "w").await, StepState::Waiting, "k1's sender is still in its transaction");
    slow.commit().await.unwrap();
    assert_eq!(send(&db, "k1", json!({"n": 2})).await, 0, "another match");
    common::eventually(Duration::from_secs(10), || async {
        db.store.waits_due(None, 100).await.unwrap();
        shown(&db, k1).await.steps.iter().any(|s| s.name == "w" && s.wait.as_ref().unwrap().armed_at.is_some())
    })
    .await;
    assert_eq!(step_state(&db, k1, "w").await, StepState::Waiting, "k1's events since did not match");
    assert_eq!(send(&db, "k1", json!({"n": 1})).await, 1);
}

/// A transaction that makes a wait and then sends its event itself (an
/// application creating a workflow and sending in one transaction; a run
/// whose completion ends a dependency and sends the event its dependent
/// waits for), while another sender holds the key: the wait is left to
/// maintenance with the transaction's snapshot, in which the transaction's
/// own id reads as finished once a later one has finished first. Armed
/// late, the wait still takes the transaction's own event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_left_unarmed_takes_the_event_its_own_transaction_sent() {
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("SELECT jobhost.send_event('own', '{\"n\": 0}')").execute(&mut *holder).await.unwrap();
    let mut own = db.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()").execute(&mut *own).await.unwrap();
    // A later transaction id, finished before the wait is left unarmed.
    let mut later_one = db.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()").execute(&mut *later_one).await.unwrap();
    later_one.commit().await.unwrap();
    let id: i64 = sqlx::query_scalar(
        r#"SELECT jobhost.workflow_create('[{"name": "w", "job": "work", "payload": {"step": "w", "n": 1},
                                              "wait": {"event": "own", "match": {"n": "{n}"}}}]'::jsonb)"#,
    )
    .fetch_one(&mut *own)
    .await
    .unwrap();
    let event: i64 =
        sqlx::query_scalar("SELECT jobhost.send_event('own', '{\"n\": 1}')").fetch_one(&mut *own).await.unwrap();
    own.commit().await.unwrap();
    let wait = shown(&db, id).await.steps.remove(0).wait.unwrap();
    assert!(wait.armed_at.is_none(), "left to maintenance: the key was held");
    holder.commit().await.unwrap();
    db.store.waits_due(None, 100).await.unwrap();
    let wait = shown(&db, id).await.steps.remove(0).wait.unwrap();
    assert_eq!((wait.ended_by, wait.event_id), (Some(WaitEnd::Event), Some(event)), "{wait:?}");
    assert_eq!(step_state(&db, id, "w").await, StepState::Available);
}

/// 1,000 waits, each released by its own event, 1,000 events sent at once
/// from 16 connections, each twice: each step is released exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_events_sent_at_once_release_a_thousand_waits_once_each() {
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let steps: Vec<Value> = (0..1000)
        .map(|i| {
            json!({"name": format!("s{i}"), "job": "work", "payload": {"step": format!("s{i}")},
                        "wait": {"event": format!("k.{i}")}})
        })
        .collect();
    let id = create(&db, Value::Array(steps)).await;
    let mut senders = Vec::new();
    for part in 0..16 {
        let pool = db.pool().clone();
        senders.push(tokio::spawn(async move {
            let mut released = 0i64;
            for round in 0..2 {
                for i in (part..1000).step_by(16) {
                    let i = if round == 0 { i } else { 999 - i };
                    let (n,): (i32,) =
                        sqlx::query_as("SELECT released FROM jobhost.event_send($1, '{}', NULL, 'test')")
                            .bind(format!("k.{i}"))
                            .fetch_one(&pool)
                            .await
                            .unwrap();
                    released += i64::from(n);
                }
            }
            released
        }));
    }
    let mut released = 0;
    for sender in senders {
        released += sender.await.unwrap();
    }
    assert_eq!(released, 1000, "each wait ended by one event");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE job = 'work'").await, 1000);
    assert_eq!(
        db.scalar("SELECT count(DISTINCT payload->>'step') FROM jobhost.jobs WHERE job = 'work'").await,
        1000,
        "one job a step"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.events WHERE released = 1").await, 1000);
    assert_eq!(shown(&db, id).await.counts.by_state.get("available"), Some(&1000));
}

/// A sleep of 2 s on hosts whose clocks are a minute off, one ahead and one
/// behind (libfaketime): it is due by the database's clock, so it neither
/// ends at once on the host ahead nor a minute late on the one behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_is_timed_by_the_database_clock_on_hosts_whose_clocks_are_off() {
    use common::fleet::{Host, ONE_FLEET, components, host_command, wait_serving};
    const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
    assert!(std::path::Path::new(LIBFAKETIME).exists(), "libfaketime is installed (scripts/faketime.sh)");
    let db = TestDb::new(Backend::Postgres).await;
    let _one = ONE_FLEET.lock().await;
    let components = components(&["hello"]);
    let cache = tempfile::tempdir().unwrap();
    for offset in ["+60s", "-60s"] {
        let mut command = host_command(&db.url, components.path(), cache.path());
        command.env("LD_PRELOAD", LIBFAKETIME).env("FAKETIME", offset).env("FAKETIME_DONT_RESET", "1");
        let mut host = Host::start(&mut command);
        wait_serving(&db, &[&host], 1).await;
        let id =
            create(&db, json!([{"name": "nap", "job": "hello", "payload": {"name": offset}, "wait": {"sleep": "2s"}}]))
                .await;
        common::eventually(Duration::from_secs(30), || async {
            step_state(&db, id, "nap").await == StepState::Completed
        })
        .await;
        let slept = db
            .scalar(format!(
                "SELECT (extract(epoch FROM s.released_at - w.armed_at) * 1000)::bigint
                 FROM jobhost.workflow_waits w JOIN jobhost.workflow_steps s ON s.id = w.step_id
                 WHERE s.workflow_id = {id}"
            ))
            .await;
        assert!((2_000..10_000).contains(&slept), "host at {offset}: released {slept} ms after its wait was armed");
        host.stop().await;
    }
}

/// A lost reply on a send: the send committed and its client saw only its
/// connection close. Sent again with its idempotency key, it is a
/// duplicate: no second event, and the wait it ended ended once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_whose_reply_is_lost_is_sent_again_as_a_duplicate() {
    use common::proxy::{Proxy, server_address, url_via};
    let db = TestDb::new(Backend::Postgres).await;
    register(&db).await;
    let id = create(
        &db,
        json!([
            {"name": "w", "job": "work", "payload": {"step": "w"}, "wait": {"event": "paid"}},
            {"name": "v", "job": "work", "payload": {"step": "v"}, "wait": {"event": "paid"}},
        ]),
    )
    .await;
    let proxy = Proxy::start(server_address()).await;
    let via = jobhost::store::open_existing(&url_via(&db.url, proxy.port()), 2, Default::default()).await.unwrap();
    let fired = proxy.lose_reply_to("event_send");
    let first = via.event_send("paid", &json!({"n": 1}), Some("pay-1"), "test").await;
    assert!(first.is_err(), "the client saw no answer: {first:?}");
    let lost = fired.await.expect("the send went through the proxy");
    assert!(lost.committed, "the send whose answer was lost committed: {lost:?}");
    let again = via.event_send("paid", &json!({"n": 1}), Some("pay-1"), "test").await.unwrap();
    assert!(again.duplicate, "{again:?}");
    assert_eq!(again.released, 2, "the first send's count, not a second");
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.events").await, 1);
    for name in ["w", "v"] {
        assert_eq!(jobs_named(&db, name).await, 1, "{name} released once");
        assert_eq!(ended_by(&db, id, name).await, Some(WaitEnd::Event));
    }
}
