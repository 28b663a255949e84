//! Workflows from inside a run (WIT 0.5.0 `workflows`): a step that adds
//! steps to its own workflow, which join its dependents' waits before it
//! ends; a run that opens a workflow; the calls refused at once; and the
//! guarantees around them: a failed run adds nothing, a repeated result
//! adds nothing twice, and a dependent of a growing step is released once,
//! after the steps it grew, however the endings race (docs/workflows.md).

use crate::common;

use std::sync::Arc;

use jobhost::store::{
    FetchedJob, FinishOutcome, FinishResult, NewStep, NewWorkflow, StepState, Workflow, WorkflowState,
};
use jobhost::types::{JsonText, StepRequest, StepTarget, WorkflowEffects};
use serde_json::{Value, json};

use common::db::{TestDb, on_both_backends};
use common::{finish, job_config};

fn workflow(steps: Value) -> NewWorkflow {
    serde_json::from_value(json!({ "label": "growth", "steps": steps })).unwrap()
}

async fn shown(db: &TestDb, id: i64) -> Workflow {
    db.store.workflow_get(id).await.unwrap().expect("the workflow exists")
}

/// Waits until the workflow has ended, and returns it.
async fn ended(db: &TestDb, id: i64) -> Workflow {
    common::eventually(std::time::Duration::from_secs(60), || async {
        shown(db, id).await.state != WorkflowState::Running
    })
    .await;
    shown(db, id).await
}

fn step_named<'a>(wf: &'a Workflow, name: &str) -> &'a jobhost::store::workflow::WorkflowStep {
    wf.steps.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no step {name} in {:?}", names(wf)))
}

fn names(wf: &Workflow) -> Vec<&str> {
    wf.steps.iter().map(|s| s.name.as_str()).collect()
}

async fn output_of(db: &TestDb, wf: &Workflow, name: &str) -> Value {
    let job = step_named(wf, name).job_id.expect("a released step");
    db.store.job_get(job).await.unwrap().unwrap().output.unwrap_or(Value::Null)
}

/// A step grows its workflow by five parts and a join over them; the step
/// that waited for it waits for all six too, runs once after them, and
/// receives every output.
async fn a_step_grows_its_workflow_and_its_dependents_wait_for_the_new_steps(db: TestDb) {
    let host = common::TestHost::start(&db, &["grower", "hello"], |_| {}).await;
    let created = db
        .store
        .workflow_create(&workflow(json!([
            {"name": "g", "job": "grower", "payload": {"grow": {"count": 5, "join": true}}},
            {"name": "d", "job": "hello", "payload": {"name": "d"}, "after": ["g"]},
        ])))
        .await
        .unwrap();
    let wf = ended(&db, created.id).await;
    assert_eq!(wf.state, WorkflowState::Succeeded, "{wf:?}");
    let mut expected = vec!["g", "d", "g/part-0", "g/part-1", "g/part-2", "g/part-3", "g/part-4", "g/join"];
    let mut got = names(&wf);
    expected.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, expected);
    let g = output_of(&db, &wf, "g").await;
    assert_eq!(g["step"], json!({ "workflow_id": created.id, "name": "g" }), "the run knew its step");
    assert_eq!(g["grew"], 5);
    // A grown part waits for the step that grew it and gets its output.
    let part = output_of(&db, &wf, "g/part-3").await;
    assert_eq!(part["deps"]["g"]["grew"], 5, "{part}");
    let join = output_of(&db, &wf, "g/join").await;
    let join_deps = join["deps"].as_object().unwrap();
    assert_eq!(join_deps.len(), 6, "g and its five parts: {join}");
    // The old dependent waited for every grown step, under its policy for g.
    let d = output_of(&db, &wf, "d").await;
    let d_deps: Vec<&String> = d["deps"].as_object().unwrap().keys().collect();
    assert_eq!(d_deps.len(), 7, "g, five parts and the join: {d_deps:?}");
    let d_started = {
        let job = step_named(&wf, "d").job_id.unwrap();
        db.store.job_get(job).await.unwrap().unwrap().row.started_at.unwrap()
    };
    for grown in wf.steps.iter().filter(|s| s.name.starts_with("g/")) {
        assert!(d_started >= grown.ended_at.unwrap(), "d ran after {}", grown.name);
        assert_eq!(grown.state, StepState::Completed);
    }
    host.stop().await;
}

/// A run that fails adds nothing: one that fails for good leaves its
/// workflow as it was (its dependent cancelled), and one that fails once
/// and then completes adds its steps once.
async fn a_failed_run_adds_no_steps(db: TestDb) {
    let host = common::TestHost::start(&db, &["grower", "hello"], |_| {}).await;
    let failing = db
        .store
        .workflow_create(&workflow(json!([
            {"name": "g", "job": "grower", "payload": {"grow": {"count": 3}, "fail_attempts": 3}},
            {"name": "d", "job": "hello", "after": ["g"]},
        ])))
        .await
        .unwrap();
    let retried = db
        .store
        .workflow_create(&workflow(json!([
            {"name": "g", "job": "grower", "payload": {"grow": {"count": 3}, "fail_attempts": 1}},
            {"name": "d", "job": "hello", "after": ["g"]},
        ])))
        .await
        .unwrap();
    let wf = ended(&db, failing.id).await;
    assert_eq!(wf.state, WorkflowState::Failed);
    assert_eq!(names(&wf), ["g", "d"], "three failed runs added nothing");
    assert_eq!(step_named(&wf, "d").state, StepState::Cancelled);
    let wf = ended(&db, retried.id).await;
    assert_eq!(wf.state, WorkflowState::Succeeded, "{wf:?}");
    assert_eq!(wf.steps.len(), 5, "the second attempt's three steps, once: {:?}", names(&wf));
    let g = db.store.job_get(step_named(&wf, "g").job_id.unwrap()).await.unwrap().unwrap();
    assert_eq!(g.row.attempts, 2);
    let d = output_of(&db, &wf, "d").await;
    assert_eq!(d["deps"].as_object().unwrap().len(), 4, "{d}");
    host.stop().await;
}

/// A plain job opens a workflow: it is created with the job's completion
/// and runs like one created from outside.
async fn a_run_opens_a_workflow_that_runs_after_it_completes(db: TestDb) {
    let host = common::TestHost::start(&db, &["grower", "hello"], |_| {}).await;
    let opener = db.enqueue_new("grower", json!({ "open": { "label": "from a run" } })).await;
    common::eventually(std::time::Duration::from_secs(60), || async {
        db.store.workflow_list(10).await.unwrap().iter().any(|w| w.state != WorkflowState::Running)
    })
    .await;
    let listed = db.store.workflow_list(10).await.unwrap();
    assert_eq!(listed.len(), 1, "one workflow opened");
    assert_eq!(listed[0].label.as_deref(), Some("from a run"));
    let wf = ended(&db, listed[0].id).await;
    assert_eq!(wf.state, WorkflowState::Succeeded);
    assert_eq!(names(&wf), ["a", "b", "c", "d"]);
    let d = output_of(&db, &wf, "d").await;
    assert_eq!(d["deps"]["b"]["greeting"], "hello, world", "{d}");
    let opened = db.store.job_get(opener).await.unwrap().unwrap();
    assert_eq!(opened.output.unwrap()["opened"], 0);
    assert!(opened.workflow.is_none(), "the opener is no step of it");
    host.stop().await;
}

/// Calls a run makes wrongly are refused at the call, with reasons, and
/// add nothing; a plain job cannot grow a workflow it is not a step of.
async fn refused_calls_say_why_and_add_nothing(db: TestDb) {
    let host = common::TestHost::start(&db, &["grower", "hello"], |_| {}).await;
    let created = db
        .store
        .workflow_create(&workflow(json!([{"name": "g", "job": "grower", "payload": {"probe": true}}])))
        .await
        .unwrap();
    let plain = db.enqueue_new("grower", json!({ "grow": { "count": 1 } })).await;
    let wf = ended(&db, created.id).await;
    assert_eq!(names(&wf), ["g"], "nothing added");
    let output = output_of(&db, &wf, "g").await;
    let errors: Vec<&str> = output["errors"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    let expected = [
        "this run opened no workflow 7",
        "step name \"bad/name\" must be",
        "waits for \"never-added\", which this run has not added",
        "unknown job type \"no_such_type\"",
        "its payload has \"_deps\"",
        "payload is not valid JSON",
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:?}");
    for (error, want) in errors.iter().zip(expected) {
        assert!(error.contains(want), "{error:?} should say {want:?}");
    }
    common::eventually(std::time::Duration::from_secs(60), || async {
        db.store.job_get(plain).await.unwrap().unwrap().row.state.is_final()
    })
    .await;
    let plain = db.store.job_get(plain).await.unwrap().unwrap();
    assert_eq!(plain.row.state, jobhost::store::JobState::Failed);
    let error = plain.row.error.clone().unwrap_or_default();
    assert!(error.contains("this job is not a workflow step"), "{error}");
    host.stop().await;
}

/// Registers the type the store-level tests run.
async fn register_work(db: &TestDb) {
    db.store.job_types_register(&[(job_config("work"), "v1".into())]).await.unwrap();
}

/// A completion that adds `parts` steps named `p0`, `p1`, ... to the run's own workflow.
fn growing(parts: usize) -> FinishOutcome {
    let steps = (0..parts)
        .map(|i| StepRequest {
            target: StepTarget::Current,
            step: NewStep::new(format!("p{i}"), "work", json!({ "step": format!("p{i}") })),
        })
        .collect();
    FinishOutcome::Completed {
        output: Some(JsonText::from(&json!({ "grew": parts }))),
        children: Vec::new().into(),
        batches: Default::default(),
        workflows: Arc::new(WorkflowEffects { opened: Vec::new(), steps }),
        events: Default::default(),
        schedules: Default::default(),
    }
}

/// Leases every available `work` job, by its payload's `step`.
async fn leased(db: &TestDb) -> Vec<(String, FetchedJob)> {
    let mut jobs: Vec<(String, FetchedJob)> = db
        .fetch("work", 1000)
        .await
        .into_iter()
        .map(|j| (j.payload["step"].as_str().unwrap_or_default().to_string(), j))
        .collect();
    jobs.sort_by(|a, b| a.0.cmp(&b.0));
    jobs
}

/// A lost reply: the same result written again adds no step twice, and
/// the dependent still waits for the steps added once.
async fn a_repeated_result_grows_nothing_twice(db: TestDb) {
    register_work(&db).await;
    let created = db
        .store
        .workflow_create(&workflow(json!([
            {"name": "g", "job": "work", "payload": {"step": "g"}},
            {"name": "d", "job": "work", "payload": {"step": "d"}, "after": ["g"]},
        ])))
        .await
        .unwrap();
    let runs = leased(&db).await;
    assert_eq!(runs.len(), 1);
    let result = finish(&runs[0].1, growing(2));
    let first = db.store.job_finish(vec![result.clone()]).await.unwrap();
    let again = db.store.job_finish(vec![result]).await.unwrap();
    assert_eq!((first[0], again[0]), (FinishResult::Done, FinishResult::Duplicate));
    let wf = shown(&db, created.id).await;
    assert_eq!(names(&wf), ["g", "g/p0", "g/p1", "d"], "in dependency order");
    assert_eq!(step_named(&wf, "d").state, StepState::Waiting, "d waits for the new steps");
    let parts = leased(&db).await;
    assert_eq!(parts.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["p0", "p1"]);
    assert_eq!(parts[0].1.payload["_deps"]["g"]["grew"], 2, "a part gets g's output");
    db.store.job_finish(vec![finish(&parts[0].1, common::completed())]).await.unwrap();
    assert_eq!(step_named(&shown(&db, created.id).await, "d").state, StepState::Waiting, "one part left");
    db.store.job_finish(vec![finish(&parts[1].1, common::completed())]).await.unwrap();
    let d = leased(&db).await;
    assert_eq!(d.len(), 1, "d released once");
    let deps: Vec<&String> = d[0].1.payload["_deps"].as_object().unwrap().keys().collect();
    assert_eq!(deps, ["g", "g/p0", "g/p1"]);
}

/// The growing step and the dependent's other dependency end at once, as
/// from two hosts, many rounds: the dependent is never released before the
/// grown step ends, and once after it.
async fn a_growing_step_racing_another_dependency_releases_its_dependent_once(db: TestDb) {
    register_work(&db).await;
    for round in 0..20 {
        let created = db
            .store
            .workflow_create(&workflow(json!([
                {"name": "g", "job": "work", "payload": {"step": "g"}},
                {"name": "h", "job": "work", "payload": {"step": "h"}},
                {"name": "d", "job": "work", "payload": {"step": "d"}, "after": ["g", "h"]},
            ])))
            .await
            .unwrap();
        let runs = leased(&db).await;
        assert_eq!(runs.len(), 2, "round {round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let tasks: Vec<_> = runs
            .into_iter()
            .map(|(name, run)| {
                let (store, barrier) = (db.store.clone(), barrier.clone());
                let outcome = if name == "g" { growing(1) } else { common::completed() };
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.job_finish(vec![finish(&run, outcome)]).await.unwrap();
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let next = leased(&db).await;
        assert_eq!(
            next.len(),
            1,
            "round {round}: only the grown step, not d: {:?}",
            next.iter().map(|n| &n.0).collect::<Vec<_>>()
        );
        assert_eq!(next[0].0, "p0", "round {round}");
        db.store.job_finish(vec![finish(&next[0].1, common::completed())]).await.unwrap();
        let d = leased(&db).await;
        assert_eq!(d.len(), 1, "round {round}: d released once, not stranded");
        assert_eq!(d[0].1.payload["_deps"].as_object().unwrap().len(), 3, "round {round}");
        db.store.job_finish(vec![finish(&d[0].1, common::completed())]).await.unwrap();
        assert_eq!(shown(&db, created.id).await.state, WorkflowState::Succeeded, "round {round}");
    }
}

on_both_backends!(
    a_step_grows_its_workflow_and_its_dependents_wait_for_the_new_steps,
    a_failed_run_adds_no_steps,
    a_run_opens_a_workflow_that_runs_after_it_completes,
    refused_calls_say_why_and_add_nothing,
    a_repeated_result_grows_nothing_twice,
    a_growing_step_racing_another_dependency_releases_its_dependent_once,
);
