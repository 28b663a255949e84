//! Handlers written in JavaScript (`guests/js/`, built with componentize-js
//! against `wit/job.wit`) in a real host on both backends: output, a log
//! line, progress, child jobs, a retry, an exception, and a concurrency limit
//! kept while runs wait on timers.

mod common;

use std::time::Duration;

use jobhost::store::{EnqueueParams, JobDetail, JobFilter, JobState};
use serde_json::{Value, json};

use common::db::{TestDb, on_both_backends};
use common::fleet::{drained, most_at_once, runs_by_key};
use common::{TestHost, eventually};

/// JavaScript components bundle the engine; the first load compiles it.
const WITHIN: Duration = Duration::from_secs(120);

async fn enqueue(db: &TestDb, job: &str, payload: Value) -> i64 {
    db.store.job_enqueue(&[EnqueueParams::new(job, payload)]).await.unwrap()[0]
}

async fn ended(db: &TestDb, id: i64) -> JobDetail {
    eventually(WITHIN, || async { db.store.job_get(id).await.unwrap().unwrap().row.state.is_final() }).await;
    db.store.job_get(id).await.unwrap().unwrap()
}

async fn a_javascript_handler_logs_reports_progress_and_enqueues(db: TestDb) {
    let host = TestHost::start(&db, &["js_hello", "hello"], |_| {}).await;
    let id = enqueue(&db, "js_hello", json!({"name": "Ada", "children": ["Grace", "Edsger"]})).await;
    let job = ended(&db, id).await;
    assert_eq!(job.row.state, JobState::Completed, "{job:?}");
    assert_eq!(job.row.output, Some(json!({"greeting": "hello from JavaScript, Ada", "attempt": 1})));
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

async fn a_javascript_handler_is_retried_and_an_exception_traps(db: TestDb) {
    let host = TestHost::start(&db, &["js_hello"], |_| {}).await;
    let id = enqueue(&db, "js_hello", json!({"name": "Barbara", "fail_times": 2})).await;
    let job = ended(&db, id).await;
    assert_eq!(job.row.state, JobState::Completed, "{job:?}");
    assert_eq!(job.row.output.as_ref().unwrap()["attempt"], 3);
    let errors = job.errors.as_array().unwrap();
    assert_eq!(errors.len(), 2);
    assert_eq!(errors[1]["error"], "attempt 2 failed on purpose");
    // An uncaught exception traps: each attempt fails, naming the error.
    let bad = enqueue(&db, "js_hello", json!({"name": "x", "children": "not a list"})).await;
    let bad = ended(&db, bad).await;
    assert_eq!((bad.row.state, bad.row.attempts), (JobState::Failed, 5), "{bad:?}");
    let error = bad.row.error.unwrap();
    assert!(error.contains("TypeError"), "{error}");
    host.stop().await;
}

async fn a_javascript_handlers_limit_holds_across_its_runs(db: TestDb) {
    let host = TestHost::start(&db, &["js_limited"], |config| config.worker.concurrency = 4).await;
    let jobs: Vec<_> = (0..8)
        .map(|i| {
            EnqueueParams::new("js_limited", json!({ "key": if i % 2 == 0 { "a" } else { "b" }, "ms": 60, "i": i }))
        })
        .collect();
    db.store.job_enqueue(&jobs).await.unwrap();
    drained(&db, WITHIN).await;
    common::fleet::completed_once(&db, "js_limited", 8).await;
    let runs = runs_by_key(&db, "js_limited").await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    for (key, runs) in runs {
        assert_eq!(runs.len(), 4);
        assert!(runs.iter().all(|(start, end)| end - start >= 60), "each run waited its 60 ms: {runs:?}");
        assert_eq!(most_at_once(runs), 1, "one run of key {key} at a time");
    }
    host.stop().await;
}

on_both_backends!(
    a_javascript_handler_logs_reports_progress_and_enqueues,
    a_javascript_handler_is_retried_and_an_exception_traps,
    a_javascript_handlers_limit_holds_across_its_runs,
);
