//! A 1,001-step workflow (a root, a fan-out of 999 under it, a fan-in
//! after all of them) across a fleet of real `jobhost run` processes with
//! one SIGKILLed mid-run, on both backends: every step ends once, and the
//! fan-in is released once, after all 999, with their 999 outputs
//! (guarantee 14).

use crate::common;

use std::time::Duration;

use jobhost::store::{NewStep, NewWorkflow, StepState, WorkflowState};
use serde_json::json;

use common::db::{Backend, TestDb};
use common::eventually;
use common::fleet::{Host, ONE_FLEET, components, nothing_left, start_host, wait_serving};

const FAN_OUT: usize = 999;
const WITHIN: Duration = Duration::from_secs(120);

async fn a_thousand_step_workflow_survives_a_killed_host(db: TestDb) {
    let _one = ONE_FLEET.lock().await;
    let components = components(&["sleep", "hello"]);
    let cache = tempfile::tempdir().unwrap();
    let mut hosts: Vec<Host> = (0..3).map(|_| start_host(&db, components.path(), cache.path())).collect();
    wait_serving(&db, &hosts.iter().collect::<Vec<_>>(), 2).await;

    let names: Vec<String> = (0..FAN_OUT).map(|i| format!("part-{i}")).collect();
    let mut steps = vec![NewStep::new("root", "hello", json!({"name": "root"}))];
    steps.extend(names.iter().map(|n| NewStep::new(n, "sleep", json!({"ms": 20, "part": n})).after(["root"])));
    steps.push(NewStep::new("join", "hello", json!({"name": "join"})).after(names.iter().map(String::as_str)));
    let created = db.store.workflow_create(&NewWorkflow { label: Some("fleet".into()), steps }).await.unwrap();

    let ended = |at_least: i64| {
        let db = &db;
        async move {
            let wf = db.store.workflow_get(created.id).await.unwrap().unwrap();
            wf.counts.ended() >= at_least
        }
    };
    eventually(WITHIN, || ended(200)).await;
    let doomed = hosts[0].id_pattern();
    let on_doomed = format!("SELECT count(*) FROM jobhost.jobs WHERE state = 'running' AND host_id LIKE '{doomed}'");
    eventually(WITHIN, || async { db.scalar(&on_doomed).await > 0 }).await;
    hosts[0].signal(libc::SIGKILL);
    hosts[0].wait().await;

    eventually(WITHIN, || async {
        db.store.workflow_get(created.id).await.unwrap().unwrap().state != WorkflowState::Running
    })
    .await;
    let wf = db.store.workflow_get(created.id).await.unwrap().unwrap();
    assert_eq!(wf.state, WorkflowState::Succeeded);
    assert_eq!(wf.counts.by_state.get("completed"), Some(&(FAN_OUT as i64 + 2)));
    assert!(wf.steps.iter().all(|s| s.state == StepState::Completed && s.job_id.is_some()));

    // Every step's job ended once: one archived row each, none live.
    let jobs: Vec<i64> = wf.steps.iter().filter_map(|s| s.job_id).collect();
    let list = jobs.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    assert_eq!(
        db.scalar(format!("SELECT count(*) FROM jobhost.archive WHERE id IN ({list})")).await,
        jobs.len() as i64
    );
    let hello_runs = db.scalar("SELECT count(*) FROM jobhost.archive WHERE job = 'hello'").await;
    assert_eq!(hello_runs, 2, "the root and the join, once each");
    let killed = db.dialect("errors::text", "errors");
    assert!(
        db.scalar(format!("SELECT count(*) FROM jobhost.archive WHERE {killed} LIKE '%lease expired%host {doomed}'"))
            .await
            > 0,
        "the killed host's steps were redelivered"
    );

    // The join was released once, after every part had ended: its payload,
    // built in the release, holds all 999 outputs, which exist only once
    // each part's result is written. (No comparison of instants: the
    // release is stamped with its transaction's start, which may precede a
    // concurrent part's result write that it waited on.)
    let join = wf.steps.last().unwrap();
    let detail = db.store.job_get(join.job_id.unwrap()).await.unwrap().unwrap();
    let deps = detail.payload["_deps"].as_object().expect("_deps");
    assert_eq!(deps.len(), FAN_OUT);
    assert!(names.iter().all(|n| deps.contains_key(n)));
    assert_eq!(detail.output.unwrap()["deps"].as_object().unwrap().len(), FAN_OUT, "the guest read them");

    for host in &mut hosts[1..] {
        host.stop().await;
    }
    nothing_left(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_thousand_step_workflow_survives_a_killed_host() {
    a_thousand_step_workflow_survives_a_killed_host(TestDb::new(Backend::Postgres).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_thousand_step_workflow_survives_a_killed_host() {
    a_thousand_step_workflow_survives_a_killed_host(TestDb::new(Backend::Sqlite).await).await;
}
