//! Workflows against real databases: a step released exactly once, in the
//! transaction that ends its last dependency, whichever path ends it
//! (guarantee 14); its dependencies' outputs under `_deps`; each policy on
//! each way a dependency can end; cascades; cancel; refusals that store
//! nothing; retention (docs/workflows.md).

use crate::common;

use jobhost::store::{
    EnqueueParams, Enqueued, FetchedJob, FinishOutcome, IfFailed, JobState, NewStep, NewWorkflow, StepState, Workflow,
    WorkflowState,
};
use jobhost::template::KeyTemplate;
use jobhost::types::{ConcurrencyConfig, JsonText, OnConflict};
use serde_json::{Value, json};

use common::db::{TestDb, on_both_backends};
use common::{completed, finish, job_config};

/// Registers `work`, and `dis`: one run per `key`, discarding the rest.
async fn register(db: &TestDb) {
    let mut dis = job_config("dis");
    dis.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{key}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Discard,
    });
    let mut work = job_config("work");
    work.max_attempts = 2;
    db.store.job_types_register(&[(work, "v1".into()), (dis, "v1".into())]).await.unwrap();
}

fn workflow(steps: Value) -> NewWorkflow {
    serde_json::from_value(json!({ "label": "test", "steps": steps })).unwrap()
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

async fn shown(db: &TestDb, id: i64) -> Workflow {
    db.store.workflow_get(id).await.unwrap().expect("the workflow exists")
}

/// Each step's state, by name.
async fn states(db: &TestDb, id: i64) -> Vec<(String, StepState)> {
    shown(db, id).await.steps.into_iter().map(|s| (s.name, s.state)).collect()
}

async fn state_of_step(db: &TestDb, id: i64, name: &str) -> StepState {
    shown(db, id).await.steps.into_iter().find(|s| s.name == name).expect("the step").state
}

/// Leases every available `work` job, by step name (read from the payload's `step`).
async fn fetch_steps(db: &TestDb) -> Vec<(String, FetchedJob)> {
    let mut jobs: Vec<(String, FetchedJob)> = db
        .fetch("work", 1000)
        .await
        .into_iter()
        .map(|j| (j.payload["step"].as_str().unwrap_or_default().to_string(), j))
        .collect();
    jobs.sort_by(|a, b| a.0.cmp(&b.0));
    jobs
}

fn step(name: &str, after: &[&str]) -> Value {
    json!({ "name": name, "job": "work", "payload": { "step": name }, "after": after })
}

/// How many jobs, live or archived, a step's name has in its payload.
async fn jobs_named(db: &TestDb, name: &str) -> i64 {
    let step = db.dialect("payload->>'step'", "payload ->> 'step'");
    db.scalar(format!(
        "SELECT (SELECT count(*) FROM jobhost.jobs WHERE {step} = '{name}')
              + (SELECT count(*) FROM jobhost.archive WHERE {step} = '{name}')
              + (SELECT count(*) FROM jobhost.blocked_jobs WHERE {step} = '{name}')"
    ))
    .await
}

async fn a_diamond_runs_its_join_once_after_both_with_both_outputs(db: TestDb) {
    register(&db).await;
    let created = db
        .store
        .workflow_create(&workflow(json!([
            step("d", &["b", "c"]),
            step("b", &["a"]),
            step("c", &["a"]),
            {"name": "a", "job": "work", "payload": {"step": "a", "image": 7}},
        ])))
        .await
        .unwrap();
    assert_eq!(created.released.keys().collect::<Vec<_>>(), ["a"], "only the root is enqueued");
    let wf = shown(&db, created.id).await;
    assert_eq!(wf.state, WorkflowState::Running);
    let order: Vec<&str> = wf.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(order, ["a", "b", "c", "d"], "dependency order");

    let a = fetch_steps(&db).await;
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].1.payload, json!({"step": "a", "image": 7}), "a root carries no _deps");
    db.store.job_finish(vec![finish(&a[0].1, completed_with(json!({"url": "a.png"})))]).await.unwrap();

    let bc = fetch_steps(&db).await;
    assert_eq!(bc.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["b", "c"]);
    assert_eq!(bc[0].1.payload["_deps"], json!({"a": {"url": "a.png"}}));
    let b_done = finish(&bc[0].1, completed_with(json!({"from": "b"})));
    db.store.job_finish(vec![b_done.clone()]).await.unwrap();
    assert_eq!(state_of_step(&db, created.id, "d").await, StepState::Waiting, "d waits for c");
    assert!(fetch_steps(&db).await.is_empty());
    // A duplicate delivery of b's result releases nothing (guarantee 5).
    db.store.job_finish(vec![b_done]).await.unwrap();
    assert!(fetch_steps(&db).await.is_empty());

    db.store.job_finish(vec![finish(&bc[1].1, completed_with(json!({"from": "c"})))]).await.unwrap();
    let d = fetch_steps(&db).await;
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].1.payload["_deps"], json!({"b": {"from": "b"}, "c": {"from": "c"}}));
    assert!(d[0].1.payload.get("_deps_failed").is_none());
    db.store.job_finish(vec![finish(&d[0].1, completed())]).await.unwrap();

    let done = shown(&db, created.id).await;
    assert_eq!(done.state, WorkflowState::Succeeded);
    assert!(done.finished_at.is_some());
    assert_eq!(done.counts.by_state.get("completed"), Some(&4));
    assert_eq!(jobs_named(&db, "d").await, 1, "d ran once");
    assert_eq!(
        db.store.workflow_of_job(d[0].1.id).await.unwrap(),
        Some((created.id, "d".to_string())),
        "a step's job knows its workflow"
    );
}

/// The ways a dependency can end without completing.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// Failed by its run.
    Failed,
    /// Its lease expired on its last attempt.
    Expired,
    /// Cancelled by an operator before it ran.
    Cancelled,
    /// Cancelled while it ran, its host reporting the cancel.
    CancelledRunning,
    /// Discarded at its concurrency limit's gate as it was released.
    Discarded,
    /// Quarantined by maintenance.
    Quarantined,
}

/// Ends the root `a` of a workflow the way `ending` says; returns the state it ended in.
async fn end_root(db: &TestDb, ending: Ending, root_job: i64) -> &'static str {
    let run_to_last_attempt = async || {
        let first = db.fetch("work", 1).await.remove(0);
        let retry = FinishOutcome::Retry { error: "again".into(), delay_ms: 0 };
        db.store.job_finish(vec![finish(&first, retry)]).await.unwrap();
        db.fetch("work", 1).await.remove(0)
    };
    match ending {
        Ending::Failed => {
            let run = run_to_last_attempt().await;
            db.store.job_finish(vec![finish(&run, FinishOutcome::Failed { error: "boom".into() })]).await.unwrap();
            "failed"
        }
        Ending::Expired => {
            let run = run_to_last_attempt().await;
            common::confirm_started(db, &[jobhost::store::RunId { job_id: run.id, lease_token: run.lease_token }])
                .await;
            let later = chrono::Utc::now() + chrono::Duration::hours(1);
            assert_eq!(db.store.lease_expire(Some(later)).await.unwrap(), (0, 1));
            "failed"
        }
        Ending::Cancelled => {
            db.store.job_cancel(root_job).await.unwrap();
            "cancelled"
        }
        Ending::CancelledRunning => {
            let run = db.fetch("work", 1).await.remove(0);
            let stop = FinishOutcome::Cancelled { reason: "stopped by an operator".into() };
            db.store.job_finish(vec![finish(&run, stop)]).await.unwrap();
            "cancelled"
        }
        Ending::Discarded => "discarded",
        Ending::Quarantined => {
            assert!(db.store.job_quarantine(root_job, "unreadable payload").await.unwrap());
            "failed"
        }
    }
}

async fn every_policy_on_every_way_a_dependency_ends(db: TestDb) {
    register(&db).await;
    let endings = [
        Ending::Failed,
        Ending::Expired,
        Ending::Cancelled,
        Ending::CancelledRunning,
        Ending::Discarded,
        Ending::Quarantined,
    ];
    for ending in endings {
        for policy in [IfFailed::Cancel, IfFailed::Run, IfFailed::Fail] {
            let case = format!("{ending:?} under {}", policy.as_str());
            // A `dis` root with the key held by another job is discarded as it is released.
            let holder = db.enqueue_one(EnqueueParams::new("dis", json!({"key": "held"}))).await;
            let root = match ending {
                Ending::Discarded => json!({"name": "a", "job": "dis", "payload": {"key": "held"}}),
                _ => step("a", &[]),
            };
            let created = db
                .store
                .workflow_create(&workflow(json!([
                    root,
                    {"name": "z", "job": "work", "payload": {"step": "z"}, "after": ["a"], "if_failed": policy},
                ])))
                .await
                .unwrap();
            let state = end_root(&db, ending, created.released["a"]).await;
            let wf = shown(&db, created.id).await;
            assert_eq!(wf.steps[0].state, StepState::decode(state).unwrap(), "{case}");
            let z = &wf.steps[1];
            match policy {
                IfFailed::Cancel | IfFailed::Fail => {
                    let expected = if policy == IfFailed::Cancel { JobState::Cancelled } else { JobState::Failed };
                    assert_eq!(z.state.as_str(), expected.as_str(), "{case}");
                    let error = z.error.as_deref().unwrap_or_default();
                    assert!(error.starts_with("dependency \"a\""), "{case}: {error}");
                    let job = z.job_id.expect("an ended step has a job");
                    assert_eq!(db.state_of(job).await, expected, "{case}: its job is in the archive");
                    assert_eq!(wf.state, WorkflowState::Failed, "{case}");
                }
                IfFailed::Run => {
                    let runs = fetch_steps(&db).await;
                    assert_eq!(runs.len(), 1, "{case}: z runs anyway");
                    let deps = &runs[0].1.payload["_deps"]["a"];
                    assert_eq!(deps["state"], state, "{case}: {deps}");
                    assert_eq!(runs[0].1.payload["_deps_failed"], json!(["a"]), "{case}");
                    db.store.job_finish(vec![finish(&runs[0].1, completed())]).await.unwrap();
                    assert_eq!(
                        shown(&db, created.id).await.state,
                        WorkflowState::Failed,
                        "{case}: a step did not complete"
                    );
                }
            }
            db.store.job_cancel(holder).await.unwrap();
            assert!(fetch_steps(&db).await.is_empty(), "{case}: nothing left over");
        }
    }
}

async fn a_cancel_cascades_three_levels_in_the_ending_transaction(db: TestDb) {
    register(&db).await;
    let created = db
        .store
        .workflow_create(&workflow(json!([
            step("a", &[]),
            step("b", &["a"]),
            step("c", &["b"]),
            step("d", &["c"]),
            {"name": "e", "job": "work", "payload": {"step": "e"}, "after": [{"step": "d", "if_failed": "run"}]},
            step("side", &[]),
        ])))
        .await
        .unwrap();
    let runs = fetch_steps(&db).await;
    let a = &runs.iter().find(|(n, _)| n == "a").unwrap().1;
    db.store.job_finish(vec![finish(a, FinishOutcome::Failed { error: "no source".into() })]).await.unwrap();
    // Read right after a's end: nothing else ran in between.
    let after: Vec<(String, StepState)> = states(&db, created.id).await;
    assert_eq!(
        after,
        [
            ("a".into(), StepState::Failed),
            ("side".into(), StepState::Running),
            ("b".into(), StepState::Cancelled),
            ("c".into(), StepState::Cancelled),
            ("d".into(), StepState::Cancelled),
            ("e".into(), StepState::Available),
        ]
    );
    let wf = shown(&db, created.id).await;
    let c = wf.steps.iter().find(|s| s.name == "c").unwrap();
    assert_eq!(c.error.as_deref(), Some("dependency \"b\" was cancelled: dependency \"a\" failed: no source"));
    let e = fetch_steps(&db).await;
    assert_eq!(e[0].1.payload["_deps"]["d"]["state"], "cancelled");
}

async fn a_workflow_cancel_ends_every_step_not_yet_ended(db: TestDb) {
    register(&db).await;
    let created = db
        .store
        .workflow_create(&workflow(json!([
            step("a", &[]),
            step("b", &[]),
            step("c", &[]),
            step("d", &["a"]),
            step("e", &["d", "b"]),
        ])))
        .await
        .unwrap();
    let mut runs = fetch_steps(&db).await;
    assert_eq!(runs.len(), 3);
    let (_, c) = runs.pop().unwrap();
    db.store.job_finish(vec![finish(&c, completed())]).await.unwrap();
    // a and b run; a new workflow's root waits in the queue instead.
    let done = db.store.workflow_cancel(created.id).await.unwrap().expect("it exists");
    assert_eq!((done.waiting_cancelled, done.jobs_cancelled, done.cancel_requested), (2, 0, 2));
    assert_eq!(shown(&db, created.id).await.state, WorkflowState::Cancelled);
    // The running steps end as their hosts report; nothing is released after.
    for (_, run) in &runs {
        let stop = FinishOutcome::Cancelled { reason: "cancelled".into() };
        db.store.job_finish(vec![finish(run, stop)]).await.unwrap();
    }
    let wf = shown(&db, created.id).await;
    let by_name: Vec<(&str, StepState)> = wf.steps.iter().map(|s| (s.name.as_str(), s.state)).collect();
    assert_eq!(
        by_name,
        [
            ("a", StepState::Cancelled),
            ("b", StepState::Cancelled),
            ("c", StepState::Completed),
            ("d", StepState::Cancelled),
            ("e", StepState::Cancelled),
        ]
    );
    assert!(fetch_steps(&db).await.is_empty());
    assert!(db.store.workflow_cancel(9_999_999).await.unwrap().is_none());
}

async fn a_completed_step_released_after_cancel_is_cancelled(db: TestDb) {
    register(&db).await;
    let created = db.store.workflow_create(&workflow(json!([step("a", &[]), step("b", &["a"])]))).await.unwrap();
    let a = fetch_steps(&db).await.remove(0).1;
    db.store.workflow_cancel(created.id).await.unwrap();
    // a's host finishes it before it learns of the cancel: b still never runs.
    db.store.job_finish(vec![finish(&a, completed())]).await.unwrap();
    assert_eq!(states(&db, created.id).await, [("a".into(), StepState::Completed), ("b".into(), StepState::Cancelled)]);
}

async fn a_bad_workflow_stores_nothing(db: TestDb) {
    register(&db).await;
    let cases = [
        (json!([step("a", &["c"]), step("b", &["a"]), step("c", &["b"])]), "cycle"),
        (json!([step("a", &["nope"])]), "\"nope\""),
        (json!([step("a", &[]), {"name": "b", "job": "ghost"}]), "unknown job type"),
        (json!([step("a", &[]), {"name": "b", "job": "work", "payload": "text"}]), "JSON object"),
        (json!([step("a", &[]), step("a", &[])]), "two steps"),
    ];
    for (steps, reason) in cases {
        let refused = db.store.workflow_create(&workflow(steps)).await.unwrap_err();
        assert!(matches!(refused, jobhost::store::Error::InvalidWorkflow(_)), "{refused}");
        assert!(refused.to_string().contains(reason), "{refused}");
    }
    let big = NewWorkflow {
        label: None,
        steps: (0..=10_000).map(|i| NewStep::new(format!("s{i}"), "work", json!({}))).collect(),
    };
    assert!(db.store.workflow_create(&big).await.unwrap_err().to_string().contains("10000"));
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.workflows").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.workflow_steps").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 0);
}

async fn many_last_dependencies_ending_at_once_release_their_dependent_once(db: TestDb) {
    register(&db).await;
    const WIDTH: usize = 8;
    for round in 0..25 {
        let mut steps: Vec<Value> = (0..WIDTH).map(|i| step(&format!("r{round}-{i}"), &[])).collect();
        let names: Vec<String> = (0..WIDTH).map(|i| format!("r{round}-{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        steps.push(step(&format!("r{round}-join"), &names));
        let created = db.store.workflow_create(&workflow(json!(steps))).await.unwrap();
        let runs = fetch_steps(&db).await;
        assert_eq!(runs.len(), WIDTH);
        // Each result is its own transaction, as from its own host, all at once.
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(WIDTH));
        let tasks: Vec<_> = runs
            .into_iter()
            .map(|(name, run)| {
                let (store, barrier) = (db.store.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.job_finish(vec![finish(&run, completed_with(json!({ "from": name })))]).await.unwrap();
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let join = fetch_steps(&db).await;
        assert_eq!(join.len(), 1, "round {round}: the join released once, not stranded");
        assert_eq!(join[0].1.payload["_deps"].as_object().unwrap().len(), WIDTH, "round {round}");
        assert_eq!(jobs_named(&db, &format!("r{round}-join")).await, 1, "round {round}");
        db.store.job_finish(vec![finish(&join[0].1, completed())]).await.unwrap();
        assert_eq!(shown(&db, created.id).await.state, WorkflowState::Succeeded, "round {round}");
    }
}

/// The race forced, not hoped for: the join's row is held by another
/// transaction while every last dependency's result reaches it, so each
/// result's count-down queues behind the others' and reads what they
/// committed. Without the lock taken before the count is read, each would
/// see the others' dependencies as not ended, and the join would be stranded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn last_dependencies_queued_behind_a_lock_release_their_dependent_once() {
    let db = TestDb::postgres().await;
    register(&db).await;
    const WIDTH: usize = 6;
    for round in 0..4 {
        let names: Vec<String> = (0..WIDTH).map(|i| format!("q{round}-{i}")).collect();
        let mut steps: Vec<Value> = names.iter().map(|n| step(n, &[])).collect();
        let join = format!("q{round}-join");
        steps.push(step(&join, &names.iter().map(String::as_str).collect::<Vec<_>>()));
        db.store.workflow_create(&workflow(json!(steps))).await.unwrap();
        let runs = fetch_steps(&db).await;
        let mut locker = db.pool().begin().await.unwrap();
        sqlx::query("SELECT 1 FROM jobhost.workflow_steps WHERE name = $1 FOR UPDATE")
            .bind(&join)
            .execute(&mut *locker)
            .await
            .unwrap();
        let waiting_before = lock_waits(&db).await;
        let tasks: Vec<_> = runs
            .into_iter()
            .map(|(_, run)| {
                let store = db.store.clone();
                tokio::spawn(async move { store.job_finish(vec![finish(&run, completed())]).await.unwrap() })
            })
            .collect();
        common::eventually(std::time::Duration::from_secs(30), || async {
            lock_waits(&db).await >= waiting_before + WIDTH as i64
        })
        .await;
        locker.commit().await.unwrap();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(fetch_steps(&db).await.len(), 1, "round {round}: the join released once, not stranded");
        assert_eq!(jobs_named(&db, &join).await, 1, "round {round}");
    }
}

async fn lock_waits(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
        .await
}

async fn a_delayed_step_waits_after_its_release(db: TestDb) {
    register(&db).await;
    let created = db
        .store
        .workflow_create(&workflow(json!([
            step("a", &[]),
            {"name": "b", "job": "work", "payload": {"step": "b"}, "after": ["a"], "delay": "1h", "priority": -5},
        ])))
        .await
        .unwrap();
    let a = fetch_steps(&db).await.remove(0).1;
    db.store.job_finish(vec![finish(&a, completed())]).await.unwrap();
    assert_eq!(state_of_step(&db, created.id, "b").await, StepState::Scheduled);
    let later = chrono::Utc::now() + chrono::Duration::hours(2);
    assert_eq!(db.store.job_promote_due(Some(later)).await.unwrap(), 1);
    assert_eq!(state_of_step(&db, created.id, "b").await, StepState::Available);
}

async fn a_finished_workflow_goes_with_the_archive_and_a_live_one_stays(db: TestDb) {
    register(&db).await;
    let done = db.store.workflow_create(&workflow(json!([step("a", &[])]))).await.unwrap();
    let live = db.store.workflow_create(&workflow(json!([step("b", &[]), step("c", &["b"])]))).await.unwrap();
    let runs = fetch_steps(&db).await;
    let a = &runs.iter().find(|(n, _)| n == "a").unwrap().1;
    db.store.job_finish(vec![finish(a, completed())]).await.unwrap();
    let later = chrono::Utc::now() + chrono::Duration::days(30);
    db.store.archive_prune(Some(later), 3600.0, 1000).await.unwrap();
    assert!(db.store.workflow_get(done.id).await.unwrap().is_none(), "finished: deleted with the archive");
    assert!(db.store.workflow_get(live.id).await.unwrap().is_some(), "a live step keeps its workflow");
    assert_eq!(state_of_step(&db, live.id, "c").await, StepState::Waiting);
}

async fn a_step_duplicate_of_a_unique_job_is_discarded_and_its_dependents_decide(db: TestDb) {
    let mut unique = job_config("work");
    unique.unique = Some(jobhost::types::UniqueConfig {
        key: KeyTemplate::parse("{step}").unwrap(),
        strategy: jobhost::types::UniqueStrategy::UntilExecuted,
        on_duplicate: jobhost::types::OnDuplicate::Skip,
    });
    db.store.job_types_register(&[(unique, "v1".into())]).await.unwrap();
    let first = db.enqueue_outcome(EnqueueParams::new("work", json!({"step": "a"}))).await;
    assert!(matches!(first, Enqueued::New(_)));
    let created = db
        .store
        .workflow_create(&workflow(json!([
            step("a", &[]),
            {"name": "b", "job": "work", "payload": {"step": "b"}, "after": [{"step": "a", "if_failed": "run"}]},
        ])))
        .await
        .unwrap();
    let wf = shown(&db, created.id).await;
    assert_eq!(wf.steps[0].state, StepState::Discarded);
    assert!(wf.steps[0].error.as_deref().unwrap_or_default().contains("duplicate"), "{:?}", wf.steps[0]);
    assert_eq!(wf.steps[1].state, StepState::Available, "b runs anyway");
}

on_both_backends!(
    a_diamond_runs_its_join_once_after_both_with_both_outputs,
    every_policy_on_every_way_a_dependency_ends,
    a_cancel_cascades_three_levels_in_the_ending_transaction,
    a_workflow_cancel_ends_every_step_not_yet_ended,
    a_completed_step_released_after_cancel_is_cancelled,
    a_bad_workflow_stores_nothing,
    many_last_dependencies_ending_at_once_release_their_dependent_once,
    a_delayed_step_waits_after_its_release,
    a_finished_workflow_goes_with_the_archive_and_a_live_one_stays,
    a_step_duplicate_of_a_unique_job_is_discarded_and_its_dependents_decide,
    a_diamond_of_real_handlers_runs_on_a_host,
);

/// Real components on a real host: each step runs once, after its
/// dependencies, and the join's guest receives both outputs.
async fn a_diamond_of_real_handlers_runs_on_a_host(db: TestDb) {
    let host = common::TestHost::start(&db, &["hello"], |_| {}).await;
    let created = db
        .store
        .workflow_create(&workflow(json!([
            {"name": "a", "job": "hello", "payload": {"name": "a"}},
            {"name": "b", "job": "hello", "payload": {"name": "b"}, "after": ["a"]},
            {"name": "c", "job": "hello", "payload": {"name": "c"}, "after": ["a"]},
            {"name": "d", "job": "hello", "payload": {"name": "d"}, "after": ["b", "c"]},
        ])))
        .await
        .unwrap();
    common::eventually(std::time::Duration::from_secs(60), || async {
        shown(&db, created.id).await.state != WorkflowState::Running
    })
    .await;
    let wf = shown(&db, created.id).await;
    assert_eq!(wf.state, WorkflowState::Succeeded, "{wf:?}");
    let job = |name: &str| wf.steps.iter().find(|s| s.name == name).and_then(|s| s.job_id).unwrap();
    let d = db.store.job_get(job("d")).await.unwrap().unwrap();
    let output = d.output.expect("d's output");
    assert_eq!(output["deps"]["b"]["greeting"], "hello, b", "{output}");
    assert_eq!(output["deps"]["c"]["greeting"], "hello, c", "{output}");
    assert_eq!(output["deps"].as_object().unwrap().len(), 2);
    let started = |name: &str| {
        let id = job(name);
        let db = &db;
        async move { db.store.job_get(id).await.unwrap().unwrap().row.started_at.unwrap() }
    };
    assert!(started("d").await >= wf.steps[1].ended_at.unwrap().max(wf.steps[2].ended_at.unwrap()), "d after b and c");
    assert_eq!(d.workflow, Some(jobhost::store::job::StepOf { id: created.id, step: "d".into() }));
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_shows_lists_and_cancels_a_workflow() {
    let db = TestDb::postgres().await;
    register(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wf.json");
    std::fs::write(
        &file,
        json!({"label": "album 42", "steps": [
            step("page", &["resize-1", "resize-2"]),
            step("resize-1", &[]),
            step("resize-2", &[]),
            {"name": "email", "job": "work", "after": [{"step": "page", "if_failed": "run"}]},
        ]})
        .to_string(),
    )
    .unwrap();
    let out = common::db::jobhost(&db, &["workflow", "create", "--file", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let id: i64 = lines.next().unwrap().strip_prefix("workflow ").unwrap().parse().unwrap();
    let released: Vec<&str> = lines.map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(released, ["resize-1", "resize-2"]);

    let out = common::db::jobhost(&db, &["workflow", "show", &id.to_string()]);
    let shown = String::from_utf8(out.stdout).unwrap();
    for line in shown.lines() {
        assert!(line.chars().count() <= 80, "{line}");
    }
    let order: Vec<&str> = shown
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| ["page", "resize-1", "resize-2", "email"].contains(w))
        .collect();
    assert_eq!(order, ["resize-1", "resize-2", "page", "email"], "dependency order:\n{shown}");
    assert!(shown.contains("page (run)"), "{shown}");
    assert!(shown.starts_with(&format!("workflow {id} \"album 42\": running")), "{shown}");

    let out = common::db::jobhost(&db, &["workflow", "list"]);
    let list = String::from_utf8(out.stdout).unwrap();
    assert!(list.contains("0/4") && list.contains("album 42"), "{list}");

    let out = common::db::jobhost(&db, &["workflow", "cancel", &id.to_string()]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 waiting steps and 2 jobs cancelled"));
    let out = common::db::jobhost(&db, &["workflow", "show", &id.to_string(), "--json"]);
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["state"], "cancelled");
    assert_eq!(shown["counts"]["by_state"]["cancelled"], 4);

    // A cycle: refused, exit code 2, nothing stored.
    std::fs::write(&file, json!({"steps": [step("x", &["y"]), step("y", &["x"])]}).to_string()).unwrap();
    let out = common::db::jobhost(&db, &["workflow", "create", "--file", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cycle"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.workflows").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_creates_reads_and_cancels_workflows() {
    let db = TestDb::postgres().await;
    register(&db).await;
    let server = common::http::TestServer::start(db.dyn_store(), Some(common::http::TOKEN)).await;
    let body = json!({"label": "api", "steps": [step("a", &[]), step("b", &["a"])]});
    let created = server.post("/api/workflows", body.clone()).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let id = created.json()["id"].as_i64().unwrap();
    assert!(created.json()["released"]["a"].is_i64());
    let got = server.get(&format!("/api/workflows/{id}")).await.json();
    assert_eq!(got["steps"][1]["state"], "waiting");
    assert_eq!(got["steps"][1]["after"], json!([{"step": "a", "if_failed": "cancel"}]));
    let listed = server.get("/api/workflows?limit=5").await.json();
    assert_eq!(listed[0]["id"], id);
    assert!(listed[0].get("steps").is_none(), "a listing has no steps");

    let anonymous = server
        .anonymous()
        .send(axum::http::Method::POST, "/api/workflows", Some(("application/json", body.to_string())), None)
        .await;
    assert_eq!(anonymous.status, 401);
    let cycle = server.post("/api/workflows", json!({"steps": [step("x", &["x"])]})).await;
    assert_eq!(cycle.status, 400);
    assert!(cycle.body.contains("itself"), "{}", cycle.body);
    let unknown_field =
        server.post("/api/workflows", json!({"steps": [{"name": "x", "job": "work", "aftr": []}]})).await;
    assert_eq!(unknown_field.status, 400, "{}", unknown_field.body);
    assert_eq!(server.get("/api/workflows/999999").await.status, 404);

    let cancelled = server.post(&format!("/api/workflows/{id}/cancel"), json!({})).await;
    assert_eq!(cancelled.json(), json!({"waiting_cancelled": 1, "jobs_cancelled": 1, "cancel_requested": 0}));
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.workflows").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_created_from_sql_runs_like_any_other() {
    let db = TestDb::postgres().await;
    register(&db).await;
    let steps = json!([
        step("d", &["b", "c"]),
        {"name": "b", "job": "work", "payload": {"step": "b"}, "after": [{"step": "a", "if_failed": "run"}]},
        step("c", &["a"]),
        step("a", &[]),
    ]);
    let id: i64 = sqlx::query_scalar("SELECT jobhost.workflow_create($1, 'from sql')")
        .bind(&steps)
        .fetch_one(db.pool())
        .await
        .unwrap();
    let wf = shown(&db, id).await;
    assert_eq!(wf.label.as_deref(), Some("from sql"));
    let order: Vec<(&str, StepState)> = wf.steps.iter().map(|s| (s.name.as_str(), s.state)).collect();
    assert_eq!(
        order,
        [("a", StepState::Available), ("b", StepState::Waiting), ("c", StepState::Waiting), ("d", StepState::Waiting)],
        "stored dependencies first; the root enqueued at once"
    );
    assert_eq!(wf.steps[1].after[0].if_failed, IfFailed::Run);
    let a = fetch_steps(&db).await.remove(0).1;
    db.store.job_finish(vec![finish(&a, completed_with(json!({"n": 1})))]).await.unwrap();
    assert_eq!(fetch_steps(&db).await[0].1.payload["_deps"], json!({"a": {"n": 1}}));

    for (bad, reason) in [
        (json!([step("x", &["y"]), step("y", &["x"]), step("z", &[])]), "cycle (on or behind it: x, y)"),
        (json!([step("x", &["nope"])]), "\"nope\""),
        (json!([{"name": "x", "job": "ghost"}]), "unknown job type"),
        (json!([step("x", &[]), step("x", &[])]), "two steps"),
        (json!([]), "at least one step"),
    ] {
        let refused =
            sqlx::query("SELECT jobhost.workflow_create($1)").bind(&bad).execute(db.pool()).await.unwrap_err();
        assert!(refused.to_string().contains(reason), "{refused}");
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.workflows").await, 1, "nothing stored for a refusal");
}
