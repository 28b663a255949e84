//! Handlers written in Python (`guests/python/`, built with componentize-py)
//! and JavaScript (`guests/js/`, built with componentize-js) against
//! `wit/job.wit`, in a real host on both backends: output, a log line,
//! progress, child jobs, a retry, an uncaught exception, and a concurrency
//! limit kept. Each language's pair of handlers behaves alike, so one body
//! checks both.

use crate::common;

use std::time::Duration;

use jobhost::store::{EnqueueParams, JobDetail, JobFilter, JobState};
use serde_json::{Value, json};

use common::db::{TestDb, on_both_backends};
use common::fleet::{drained, most_at_once, runs_by_key};
use common::{TestHost, eventually};

/// These components bundle an interpreter; the first load compiles it.
const WITHIN: Duration = Duration::from_secs(120);

/// One language's handlers and what sets them apart.
struct Language {
    /// `{prefix}_hello` and `{prefix}_limited`.
    prefix: &'static str,
    /// The greeting's opening words.
    greeting: &'static str,
    /// A payload on which the hello handler raises an exception it does not catch.
    crashing: fn() -> Value,
    /// What the exception's text says.
    crash_says: &'static str,
}

const PYTHON: Language = Language {
    prefix: "py",
    greeting: "hello from Python, ",
    crashing: || json!({"name": "x", "fail_times": "many"}),
    crash_says: "ValueError: invalid literal for int()",
};

const JAVASCRIPT: Language = Language {
    prefix: "js",
    greeting: "hello from JavaScript, ",
    crashing: || json!({"name": "x", "children": "not a list"}),
    crash_says: "TypeError",
};

impl Language {
    fn hello(&self) -> String {
        format!("{}_hello", self.prefix)
    }

    fn limited(&self) -> String {
        format!("{}_limited", self.prefix)
    }
}

async fn ended(db: &TestDb, id: i64) -> JobDetail {
    eventually(WITHIN, || async { db.store.job_get(id).await.unwrap().unwrap().row.state.is_final() }).await;
    db.store.job_get(id).await.unwrap().unwrap()
}

async fn logs_reports_progress_and_enqueues(db: TestDb, lang: &Language) {
    let host = TestHost::start(&db, &[&lang.hello(), "hello"], |_| {}).await;
    let id = db.enqueue_new(&lang.hello(), json!({"name": "Ada", "children": ["Grace", "Edsger"]})).await;
    let job = ended(&db, id).await;
    assert_eq!(job.row.state, JobState::Completed, "{job:?}");
    let greeting = format!("{}Ada", lang.greeting);
    assert_eq!(job.output, Some(json!({"greeting": greeting, "attempt": 1})));
    let lines = &job.log.as_ref().unwrap()["lines"];
    assert_eq!(lines[0]["message"], "greeting Ada", "{lines}");
    assert_eq!(lines[0]["level"], "info");
    assert_eq!(job.progress, Some(json!({"done": 2, "total": 2})));
    eventually(WITHIN, || async {
        let filter = JobFilter {
            job: Some("hello".into()),
            state: Some(JobState::Completed),
            limit: 10,
            ..JobFilter::default()
        };
        db.store.job_list(&filter).await.unwrap().len() == 2
    })
    .await;
    let children: Vec<(String, i64)> =
        db.rows("SELECT payload->>'name', parent_id FROM jobhost.archive WHERE job = 'hello' ORDER BY id").await;
    assert_eq!(children, [("Grace".to_string(), id), ("Edsger".to_string(), id)]);
    host.stop().await;
}

async fn is_retried_and_an_exception_traps(db: TestDb, lang: &Language) {
    let host = TestHost::start(&db, &[&lang.hello()], |_| {}).await;
    let id = db.enqueue_new(&lang.hello(), json!({"name": "Barbara", "fail_times": 2})).await;
    let job = ended(&db, id).await;
    assert_eq!(job.row.state, JobState::Completed, "{job:?}");
    assert_eq!(job.output.as_ref().unwrap()["attempt"], 3);
    let errors = job.errors.as_array().unwrap();
    assert_eq!(errors.len(), 2);
    assert_eq!(errors[1]["error"], "attempt 2 failed on purpose");
    // An uncaught exception traps: each attempt fails, naming the error.
    let bad = db.enqueue_new(&lang.hello(), (lang.crashing)()).await;
    let bad = ended(&db, bad).await;
    assert_eq!((bad.row.state, bad.row.attempts), (JobState::Failed, 5), "{bad:?}");
    let error = bad.row.error.unwrap();
    assert!(error.contains(lang.crash_says), "{error}");
    host.stop().await;
}

async fn keeps_its_limit_across_its_runs(db: TestDb, lang: &Language) {
    let job = lang.limited();
    let host = TestHost::start(&db, &[&job], |config| config.worker.concurrency = 4).await;
    let jobs: Vec<_> = (0..8)
        .map(|i| EnqueueParams::new(&job, json!({ "key": if i % 2 == 0 { "a" } else { "b" }, "ms": 60, "i": i })))
        .collect();
    db.store.job_enqueue(&jobs).await.unwrap();
    drained(&db, WITHIN).await;
    common::fleet::completed_once(&db, &job, 8).await;
    let runs = runs_by_key(&db, &job).await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    for (key, runs) in runs {
        assert_eq!(runs.len(), 4);
        assert!(runs.iter().all(|(start, end)| end - start >= 60), "each run waited its 60 ms: {runs:?}");
        assert_eq!(most_at_once(runs), 1, "one run of key {key} at a time");
    }
    host.stop().await;
}

/// A step in the language grows its workflow through the SDK: the step
/// that waited for it receives the grown steps' outputs too.
async fn grows_its_workflow(db: TestDb, lang: &Language) {
    let host = TestHost::start(&db, &[&lang.hello(), "hello"], |_| {}).await;
    let steps = json!({ "steps": [
        {"name": "s", "job": lang.hello(), "payload": {"name": "s", "grow": ["x", "y"]}},
        {"name": "d", "job": "hello", "payload": {"name": "d"}, "after": ["s"]},
    ]});
    let created = db.store.workflow_create(&serde_json::from_value(steps).unwrap()).await.unwrap();
    eventually(WITHIN, || async {
        db.store.workflow_get(created.id).await.unwrap().unwrap().state != jobhost::store::WorkflowState::Running
    })
    .await;
    let wf = db.store.workflow_get(created.id).await.unwrap().unwrap();
    assert_eq!(wf.state, jobhost::store::WorkflowState::Succeeded, "{wf:?}");
    let output = |name: &str| {
        let job = wf.steps.iter().find(|s| s.name == name).and_then(|s| s.job_id).expect(name);
        let db = &db;
        async move { db.store.job_get(job).await.unwrap().unwrap().output.unwrap() }
    };
    assert_eq!(output("s").await["step"], "s", "the handler knew its step");
    assert_eq!(output("s/x").await["greeting"], "hello, x");
    let deps: Vec<String> = output("d").await["deps"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(deps, ["s", "s/x", "s/y"]);
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_step_grows_its_workflow() {
    grows_its_workflow(TestDb::postgres().await, &PYTHON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_step_grows_its_workflow() {
    grows_its_workflow(TestDb::postgres().await, &JAVASCRIPT).await;
}

/// A handler in the language makes a schedule through the SDK, written
/// with its completion, and receives the refusal of a bad one, naming the field.
async fn makes_a_schedule(db: TestDb, lang: &Language) {
    let host = TestHost::start(&db, &[&lang.hello(), "hello"], |_| {}).await;
    let schedule = json!({"key": "ada", "cron": "0 9 * * MON", "zone": "Europe/Berlin", "overlap": "buffer-one", "jitter_ms": 250});
    let id =
        db.enqueue_new(&lang.hello(), json!({"name": "Ada", "schedule": schedule, "bad_cron": "61 * * * *"})).await;
    let job = ended(&db, id).await;
    assert_eq!(job.row.state, JobState::Completed, "{job:?}");
    let refused = job.output.as_ref().unwrap()["refused"].as_str().unwrap_or_default().to_string();
    assert!(refused.starts_with("cron:"), "the refusal names the field: {job:?}");
    let listed = db.store.keyed_schedules(Some("hello"), None).await.unwrap();
    assert_eq!(listed.len(), 1, "the refused schedule stored nothing: {listed:?}");
    let made = &listed[0].schedule;
    assert_eq!(
        (made.key.as_str(), made.cron.as_str(), made.time_zone.as_str()),
        ("ada", "0 9 * * MON", "Europe/Berlin")
    );
    assert_eq!(made.overlap, jobhost::store::keyed_schedule::Overlap::BufferOne);
    assert_eq!((made.jitter_ms, made.payload["name"].as_str()), (250, Some("ada")));
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_handler_makes_a_schedule() {
    makes_a_schedule(TestDb::postgres().await, &PYTHON).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_handler_makes_a_schedule() {
    makes_a_schedule(TestDb::postgres().await, &JAVASCRIPT).await;
}

async fn a_python_handler_logs_reports_progress_and_enqueues(db: TestDb) {
    logs_reports_progress_and_enqueues(db, &PYTHON).await;
}

async fn a_python_handler_is_retried_and_an_exception_traps(db: TestDb) {
    is_retried_and_an_exception_traps(db, &PYTHON).await;
}

async fn a_python_handler_keeps_its_limit_across_its_runs(db: TestDb) {
    keeps_its_limit_across_its_runs(db, &PYTHON).await;
}

async fn a_javascript_handler_logs_reports_progress_and_enqueues(db: TestDb) {
    logs_reports_progress_and_enqueues(db, &JAVASCRIPT).await;
}

async fn a_javascript_handler_is_retried_and_an_exception_traps(db: TestDb) {
    is_retried_and_an_exception_traps(db, &JAVASCRIPT).await;
}

async fn a_javascript_handler_keeps_its_limit_across_its_runs(db: TestDb) {
    keeps_its_limit_across_its_runs(db, &JAVASCRIPT).await;
}

on_both_backends!(
    a_python_handler_logs_reports_progress_and_enqueues,
    a_python_handler_is_retried_and_an_exception_traps,
    a_python_handler_keeps_its_limit_across_its_runs,
    a_javascript_handler_logs_reports_progress_and_enqueues,
    a_javascript_handler_is_retried_and_an_exception_traps,
    a_javascript_handler_keeps_its_limit_across_its_runs,
);
