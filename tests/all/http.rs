//! The HTTP API against a real server on both backends (docs/http.md):
//! status codes, filters and cursor pagination, the token, oversized and
//! malformed bodies, the gate's refusals, bulk actions, and `/metrics`
//! agreeing with `jobhost stats`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use jobhost::store::{EnqueueParams, FinishOutcome, HostInfo, JobState, NewBatch};
use jobhost::template::KeyTemplate;
use jobhost::types::{ConcurrencyConfig, OnConflict};
use serde_json::{Value, json};

use common::db::{TestDb, on_both_backends};
use common::http::{TOKEN, TestServer};
use common::{fetch_params, finish, job_config};

/// Registers `mail` (queue `default`), `pdf` (queue `docs`) and `gated`
/// (one slot per payload `k`, refusing with `raise`).
async fn register(db: &TestDb) {
    let mut pdf = job_config("pdf");
    pdf.queue = "docs".into();
    let mut gated = job_config("gated");
    gated.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{k}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Raise,
    });
    let mut blocking = job_config("blocking");
    blocking.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{k}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    let types = [job_config("mail"), pdf, gated, blocking].map(|c| (c, "v1".to_string()));
    db.store.job_types_register(&types).await.unwrap();
}

/// Jobs in every state: returns their ids by state.
async fn every_state(db: &TestDb) -> BTreeMap<JobState, i64> {
    register(db).await;
    let mut ids = BTreeMap::new();
    let failed = db.enqueue_new("mail", json!({"n": "failed"})).await;
    let completed = db.enqueue_new("mail", json!({"n": "completed"})).await;
    let fetched = db.store.job_fetch(&fetch_params("h1", &["mail"], 2)).await.unwrap();
    let outcome = |job: &jobhost::store::FetchedJob| {
        if job.id == failed { FinishOutcome::Failed { error: "it broke".into() } } else { common::completed() }
    };
    db.store.job_finish(fetched.iter().map(|j| finish(j, outcome(j))).collect()).await.unwrap();
    ids.insert(JobState::Failed, failed);
    ids.insert(JobState::Completed, completed);
    let running = db.enqueue_new("blocking", json!({"k": "a"})).await;
    db.store.job_fetch(&fetch_params("h1", &["blocking"], 1)).await.unwrap();
    ids.insert(JobState::Running, running);
    ids.insert(JobState::Blocked, db.enqueue_new("blocking", json!({"k": "a"})).await);
    ids.insert(JobState::Available, db.enqueue_new("pdf", json!({"n": 1})).await);
    let scheduled = EnqueueParams { delay_ms: Some(3_600_000), ..EnqueueParams::new("mail", json!({})) };
    ids.insert(JobState::Scheduled, db.store.job_enqueue(&[scheduled]).await.unwrap()[0]);
    let cancelled = db.enqueue_new("mail", json!({"n": "cancelled"})).await;
    db.store.job_cancel(cancelled).await.unwrap();
    ids.insert(JobState::Cancelled, cancelled);
    ids
}

async fn reads_show_jobs_of_every_state(db: TestDb) {
    let ids = every_state(&db).await;
    let server = TestServer::start(db.dyn_store(), None).await;
    let stats = server.get("/api/stats").await;
    assert_eq!(stats.status, StatusCode::OK);
    // The same document as `jobhost stats --json`, but for the wait, which grows.
    let without_wait = |mut stats: Value| {
        stats.as_object_mut().unwrap().remove("oldest_available_secs");
        stats
    };
    let expected = serde_json::to_value(db.store.job_stats().await.unwrap()).unwrap();
    assert_eq!(without_wait(stats.json()), without_wait(expected));
    for (state, id) in &ids {
        let listed = server.get(&format!("/api/jobs?state={}", state.as_str())).await.json();
        let listed: Vec<i64> = listed["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_i64().unwrap()).collect();
        assert_eq!(listed, [*id], "jobs in state {state}");
        let job = server.get(&format!("/api/jobs/{id}")).await;
        assert_eq!(job.status, StatusCode::OK);
        assert_eq!(job.json()["state"], state.as_str());
    }
    let failed = server.get(&format!("/api/jobs/{}", ids[&JobState::Failed])).await.json();
    assert_eq!(failed["errors"][0]["error"], "it broke");
    assert_eq!(failed["payload"], json!({"n": "failed"}));
    let completed = server.get(&format!("/api/jobs/{}", ids[&JobState::Completed])).await.json();
    assert_eq!(completed["output"], json!({"ok": true}));
    // Each narrowing field.
    let count = |path: String| {
        let server = &server;
        async move { server.get(&path).await.json()["jobs"].as_array().unwrap().len() }
    };
    assert_eq!(count("/api/jobs?queue=docs".into()).await, 1);
    assert_eq!(count("/api/jobs?job=blocking".into()).await, 2);
    assert_eq!(count("/api/jobs?key=a".into()).await, 2);
    assert_eq!(count("/api/jobs?job=mail&state=failed".into()).await, 1);
    assert_eq!(count("/api/jobs?since=2000-01-01T00:00:00Z".into()).await, ids.len());
    assert_eq!(count("/api/jobs?until=2000-01-01T00:00:00Z".into()).await, 0);
    let keys = server.get("/api/keys").await.json();
    assert_eq!(keys[0]["holders"], 1);
    assert_eq!(keys[0]["blocked"], 1);
    assert_eq!(keys[0]["holding"][0]["id"], ids[&JobState::Running]);
    let queues = server.get("/api/queues").await.json();
    let names: Vec<&str> = queues.as_array().unwrap().iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["default", "docs"]);
    assert_eq!(queues[1]["counts"]["available"], 1);
    let throughput = server.get("/api/throughput?window=1h").await.json();
    assert_eq!(throughput["finished"], json!({"completed": 1, "failed": 1, "discarded": 0, "cancelled": 1}));
}

async fn pages_follow_the_cursor_without_repeats_or_gaps(db: TestDb) {
    register(&db).await;
    let params: Vec<_> = (0..23).map(|i| EnqueueParams::new("mail", json!({ "i": i }))).collect();
    let mut all = db.store.job_enqueue(&params).await.unwrap();
    all.reverse();
    let server = TestServer::start(db.dyn_store(), None).await;
    let (mut seen, mut path) = (Vec::new(), "/api/jobs?limit=5".to_string());
    loop {
        let page = server.get(&path).await.json();
        seen.extend(page["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_i64().unwrap()));
        // A job enqueued while paging lands before the cursor, never in a later page.
        db.enqueue_new("mail", json!({})).await;
        match page["next"].as_i64() {
            Some(next) => path = format!("/api/jobs?limit=5&before={next}"),
            None => break,
        }
    }
    assert_eq!(seen, all, "newest first, each once");
}

async fn bad_queries_and_paths_are_named(db: TestDb) {
    let server = TestServer::start(db.dyn_store(), None).await;
    for (path, expected) in [
        ("/api/jobs?state=done", "state must be one of"),
        ("/api/jobs?limit=0", "limit must be between 1 and 500"),
        ("/api/jobs?batch=seven", "batch must be a whole number"),
        ("/api/jobs?since=yesterday", "since must be an RFC 3339 time"),
        ("/api/jobs?colour=red", "unknown field `colour`"),
        ("/api/jobs/abc", "the id in the path must be a whole number"),
        ("/api/throughput?window=forever", "window must be a duration"),
        ("/api/batches?limit=9999", "limit must be between 1 and 500"),
    ] {
        let answer = server.get(path).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{path}: {}", answer.body);
        assert!(answer.json()["error"].as_str().unwrap().contains(expected), "{path}: {}", answer.body);
    }
    // A name rebound to this address by another site is refused; addresses pass.
    for path in ["/api/jobs", "/"] {
        let rebound = server.send_with(Method::GET, path, None, &[("host", "evil.example:8080")]).await;
        assert_eq!(rebound.status, StatusCode::FORBIDDEN, "{path}: {}", rebound.body);
        assert!(rebound.body.contains("--allow-host"), "{}", rebound.body);
    }
    let local = server.send_with(Method::GET, "/api/jobs", None, &[("host", "localhost:8080")]).await;
    assert_eq!(local.status, StatusCode::OK);
    assert_eq!(server.get("/api/jobs/424242").await.status, StatusCode::NOT_FOUND);
    assert_eq!(server.get("/api/batches/424242").await.status, StatusCode::NOT_FOUND);
    assert_eq!(server.get("/api/nothing-here").await.status, StatusCode::NOT_FOUND);
}

/// Every endpoint that changes something, with a body it would accept.
fn changes(id: i64) -> Vec<(String, Value)> {
    vec![
        ("/api/jobs".into(), json!({"job": "mail"})),
        (format!("/api/jobs/{id}/cancel"), json!({})),
        (format!("/api/jobs/{id}/retry"), json!({})),
        ("/api/jobs/retry".into(), json!({"state": "failed"})),
        ("/api/jobs/cancel".into(), json!({"state": "available"})),
        ("/api/queues/default/pause".into(), json!({})),
        ("/api/queues/default/resume".into(), json!({})),
    ]
}

async fn without_the_token_nothing_changes(db: TestDb) {
    register(&db).await;
    let id = db.enqueue_new("mail", json!({})).await;
    let read_only = TestServer::start(db.dyn_store(), None).await;
    let guarded = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    for (path, body) in changes(id) {
        let body = Some(("application/json", body.to_string()));
        let refused = read_only.send(Method::POST, &path, body.clone(), None).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{path} on a read-only server");
        assert!(refused.json()["error"].as_str().unwrap().contains("read-only"));
        // A token it does not know, named or its own, is a wrong token there.
        let unknown = read_only.send(Method::POST, &path, body.clone(), Some(TOKEN)).await;
        assert_eq!(unknown.status, StatusCode::UNAUTHORIZED, "{path} on a read-only server");
        assert_eq!(guarded.send(Method::POST, &path, body.clone(), None).await.status, StatusCode::UNAUTHORIZED);
        let wrong = guarded.send(Method::POST, &path, body, Some("not-the-token-at-all")).await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{path} with the wrong token");
    }
    // Nothing above changed anything.
    let job = db.store.job_get(id).await.unwrap().unwrap();
    assert_eq!(job.row.state, JobState::Available);
    assert_eq!(db.store.job_stats().await.unwrap().states[&JobState::Available], 1);
    assert!(db.store.job_stats().await.unwrap().paused_queues.is_empty());
    // With it, each one is answered.
    for (path, body) in changes(id) {
        let answer = guarded.post(&path, body).await;
        assert!(answer.status.is_success(), "{path}: {} {}", answer.status, answer.body);
    }
}

async fn enqueues_pass_the_gate_and_bad_ones_are_named(db: TestDb) {
    register(&db).await;
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let created = server.post("/api/jobs", json!({"job": "pdf", "payload": {"n": 1}, "priority": -3})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let id = created.json()["id"].as_i64().unwrap();
    let job = db.store.job_get(id).await.unwrap().unwrap();
    assert_eq!((job.row.queue.as_str(), job.priority, job.payload.clone()), ("docs", -3, json!({"n": 1})));
    let delayed = server.post("/api/jobs", json!({"job": "mail", "delay": "1h"})).await.json();
    let delayed = db.store.job_get(delayed["id"].as_i64().unwrap()).await.unwrap().unwrap();
    assert_eq!(delayed.row.state, JobState::Scheduled);
    // The gate: the one slot of key "x" is taken, and `raise` refuses the second.
    assert_eq!(
        server.post("/api/jobs", json!({"job": "gated", "payload": {"k": "x"}})).await.status,
        StatusCode::CREATED
    );
    let refused = server.post("/api/jobs", json!({"job": "gated", "payload": {"k": "x"}})).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert!(refused.json()["error"].as_str().unwrap().contains("gated"), "{}", refused.body);
    let bad = |body: &str| {
        let server = &server;
        let body = body.to_string();
        async move { server.send(Method::POST, "/api/jobs", Some(("application/json", body)), Some(TOKEN)).await }
    };
    for (body, status, expected) in [
        (r#"{"job": "nobody", "payload": {}}"#, StatusCode::NOT_FOUND, "unknown job type"),
        (r#"{"job": "mail", "payload": [1, 2]}"#, StatusCode::BAD_REQUEST, "must be a JSON object, got an array"),
        (r#"{"job": "mail", "payload": {"#, StatusCode::BAD_REQUEST, "EOF"),
        (r#"{"job": "mail", "colour": "red"}"#, StatusCode::BAD_REQUEST, "unknown field `colour`"),
        (r#"{"job": "mail", "delay": "soon"}"#, StatusCode::BAD_REQUEST, "delay must be a duration"),
        (r#"{"job": "mail", "delay": "500000000000years"}"#, StatusCode::BAD_REQUEST, "at most 100 years"),
        (r#"{"job": "mail", "delay": "1s", "run_at": "2030-01-01T00:00:00Z"}"#, StatusCode::BAD_REQUEST, "not both"),
        (r#"{"job": "mail", "batch": 424242}"#, StatusCode::CONFLICT, "424242"),
        ("[]", StatusCode::BAD_REQUEST, "the body must be a JSON object"),
    ] {
        let answer = bad(body).await;
        assert_eq!(answer.status, status, "{body}: {}", answer.body);
        let error = answer.json()["error"].as_str().unwrap().to_string();
        assert!(error.contains(expected), "{body}: {}", answer.body);
        assert!(!error.contains("struct"), "no Rust type names: {error}");
    }
    let not_json = server.send(Method::POST, "/api/jobs", Some(("text/plain", "{}".into())), Some(TOKEN)).await;
    assert_eq!(not_json.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // A body past the limit is refused by its length, before it is read.
    let head = format!(
        "POST /api/jobs HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{{\"job\": \"mail\", ",
        server.address,
        8 << 20
    );
    let answer = server.send_raw(&head).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let limit = jobhost::http::body_limit(1 << 20);
    assert!(answer.contains(&format!("more than the {limit} bytes accepted")), "{answer}");
    // A body within the limit whose payload is past the payload limit is a bad payload.
    let large = json!({"job": "mail", "payload": {"blob": "x".repeat(3 << 19)}});
    let answer = server.post("/api/jobs", large).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
    assert!(answer.json()["error"].as_str().unwrap().contains("more than the largest accepted"), "{}", answer.body);
    // Refused enqueues stored nothing: the pdf, the delayed mail and one gated job.
    let listed = server.get("/api/jobs?limit=500").await.json();
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 3, "{listed}");
}

async fn retry_and_cancel_follow_the_jobs_state(db: TestDb) {
    let ids = every_state(&db).await;
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let failed = ids[&JobState::Failed];
    assert_eq!(server.post(&format!("/api/jobs/{failed}/retry"), json!({})).await.status, StatusCode::OK);
    assert_eq!(db.store.job_get(failed).await.unwrap().unwrap().row.state, JobState::Available);
    let running = server.post(&format!("/api/jobs/{}/retry", ids[&JobState::Running]), json!({})).await;
    assert_eq!(running.status, StatusCode::CONFLICT, "{}", running.body);
    assert!(running.json()["error"].as_str().unwrap().contains("running"));
    assert_eq!(server.post("/api/jobs/424242/retry", json!({})).await.status, StatusCode::NOT_FOUND);
    let cancelled = server.post(&format!("/api/jobs/{}/cancel", ids[&JobState::Available]), json!({})).await;
    assert_eq!(cancelled.json()["cancel"], "cancelled");
    let requested = server.post(&format!("/api/jobs/{}/cancel", ids[&JobState::Running]), json!({})).await;
    assert_eq!(requested.json()["cancel"], "requested");
    let again = server.post(&format!("/api/jobs/{}/cancel", ids[&JobState::Completed]), json!({})).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
}

async fn bulk_actions_apply_the_filter_on_the_server(db: TestDb) {
    register(&db).await;
    let mut failing = Vec::new();
    for job in ["mail", "mail", "mail", "pdf"] {
        failing.push(db.enqueue_new(job, json!({})).await);
    }
    for job in ["mail", "pdf"] {
        let mut params = fetch_params("h1", &[job], 10);
        params.queues = vec!["default".into(), "docs".into()];
        let fetched = db.store.job_fetch(&params).await.unwrap();
        let failed = fetched.iter().map(|j| finish(j, FinishOutcome::Failed { error: "no".into() })).collect();
        db.store.job_finish(failed).await.unwrap();
    }
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let everything = server.post("/api/jobs/retry", json!({})).await;
    assert_eq!(everything.status, StatusCode::BAD_REQUEST, "a bulk action needs a filter");
    let retried = server.post("/api/jobs/retry", json!({"state": "failed", "job": "mail"})).await.json();
    assert_eq!((retried["matched"].as_i64(), retried["changed"].as_i64()), (Some(3), Some(3)), "{retried}");
    assert_eq!(retried["more"], false);
    let states = |db: &TestDb| {
        let store = db.dyn_store();
        let ids = failing.clone();
        async move {
            let mut states = Vec::new();
            for id in ids {
                states.push(store.job_get(id).await.unwrap().unwrap().row.state);
            }
            states
        }
    };
    use JobState::{Available, Cancelled, Failed};
    assert_eq!(states(&db).await, [Available, Available, Available, Failed]);
    let paged = server.post("/api/jobs/cancel", json!({"job": "mail", "limit": 2})).await.json();
    assert_eq!((paged["changed"].as_i64(), paged["more"].as_bool()), (Some(2), Some(true)), "{paged}");
    let rest = server.post("/api/jobs/cancel", json!({"job": "mail", "state": "available"})).await.json();
    assert_eq!(rest["changed"], 1, "{rest}");
    assert_eq!(states(&db).await, [Cancelled, Cancelled, Cancelled, Failed]);
    // A job whose state does not allow the action is left, with the reason.
    let left = server.post("/api/jobs/cancel", json!({"job": "pdf"})).await.json();
    assert_eq!((left["changed"].as_i64(), left["unchanged"][0]["id"].as_i64()), (Some(0), Some(failing[3])));
}

async fn queues_pause_and_resume(db: TestDb) {
    register(&db).await;
    db.enqueue_new("mail", json!({})).await;
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let paused = server.post("/api/queues/default/pause", json!({})).await.json();
    assert_eq!((paused["paused"].as_bool(), paused["changed"].as_bool()), (Some(true), Some(true)));
    assert_eq!(server.get("/api/queues").await.json()[0]["paused"], true);
    assert!(
        db.store.job_fetch(&fetch_params("h1", &["mail"], 1)).await.unwrap().is_empty(),
        "a paused queue leases nothing"
    );
    assert_eq!(server.post("/api/queues/default/pause", json!({})).await.json()["changed"], false);
    assert_eq!(server.post("/api/queues/default/resume", json!({})).await.json()["changed"], true);
    assert_eq!(server.get("/api/queues").await.json()[0]["paused"], false);
    let bad = server.post("/api/queues/bad%20name/pause", json!({})).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
}

async fn hosts_types_batches_and_schedules_are_listed(db: TestDb) {
    register(&db).await;
    let mut host = HostInfo::current(vec!["mail".into()], std::time::Duration::from_secs(5));
    host.digests.insert("mail".into(), "d".repeat(64));
    db.store.host_upsert(&host).await.unwrap();
    let (batch, _) = db
        .store
        .batch_create(
            &NewBatch { label: Some("nightly".into()), ..NewBatch::default() },
            &[EnqueueParams::new("mail", json!({}))],
        )
        .await
        .unwrap();
    let server = TestServer::start(db.dyn_store(), None).await;
    let hosts = server.get("/api/hosts").await.json();
    assert_eq!((hosts[0]["id"].as_str(), hosts[0]["alive"].as_bool()), (Some(host.id.as_str()), Some(true)));
    let types = server.get("/api/job-types").await.json();
    let mail = types.as_array().unwrap().iter().find(|t| t["name"] == "mail").unwrap();
    assert_eq!(mail["config"]["max_attempts"], 3);
    assert_eq!(mail["hosts"][0]["host"], host.id.as_str());
    assert_eq!(mail["hosts"][0]["digest"], "d".repeat(64));
    let gated = types.as_array().unwrap().iter().find(|t| t["name"] == "gated").unwrap();
    assert_eq!(gated["config"]["concurrency"]["limit"], 1);
    assert_eq!(gated["hosts"], json!([]));
    let listed = server.get("/api/batches").await.json();
    assert_eq!((listed[0]["id"].as_i64(), listed[0]["label"].as_str()), (Some(batch), Some("nightly")));
    let one = server.get(&format!("/api/batches/{batch}")).await.json();
    assert_eq!(one["counts"]["total"], 1);
    let members = server.get(&format!("/api/jobs?batch={batch}")).await.json();
    assert_eq!(members["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(server.get("/api/schedules").await.json(), json!([]));
    assert_eq!(server.get("/api/health").await.json()["database"], "ok");
}

/// `/metrics` as (name, sorted labels) → value, for the samples of `prefix`.
fn samples(text: &str, prefix: &str) -> BTreeMap<(String, String), f64> {
    text.lines()
        .filter(|line| line.starts_with(prefix))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels: BTreeSet<&str> = labels.split(',').filter(|l| !l.is_empty()).collect();
            let labels = labels.into_iter().collect::<Vec<_>>().join(",");
            Some(((name.to_string(), labels), value.parse().ok()?))
        })
        .collect()
}

async fn metrics_agree_with_stats(db: TestDb) {
    every_state(&db).await;
    let metrics = jobhost::metrics::Metrics::default();
    metrics.run_ended(
        "mail",
        "completed",
        std::time::Duration::from_millis(30),
        Some(std::time::Duration::from_micros(80)),
    );
    let server = TestServer::start_with(db.dyn_store(), None, metrics).await;
    let scrape = server.get("/metrics").await;
    assert_eq!(scrape.status, StatusCode::OK);
    assert!(scrape.headers["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
    assert!(scrape.body.ends_with("# EOF\n"), "one OpenMetrics document");
    let stats = db.store.job_stats().await.unwrap();
    let jobs = samples(&scrape.body, "jobhost_jobs{");
    let mut expected = BTreeMap::new();
    for (queue, states) in &stats.queues {
        for (state, count) in states {
            expected
                .insert(("jobhost_jobs".to_string(), format!("queue=\"{queue}\",state=\"{state}\"")), *count as f64);
        }
    }
    assert_eq!(jobs, expected, "jobhost_jobs equals stats --json by queue and state");
    let holders = samples(&scrape.body, "jobhost_concurrency_");
    assert_eq!(holders[&("jobhost_concurrency_holders".into(), "job_type=\"blocking\"".into())], 1.0);
    assert_eq!(holders[&("jobhost_concurrency_blocked".into(), "job_type=\"blocking\"".into())], 1.0);
    let runs = samples(&scrape.body, "jobhost_run");
    assert_eq!(runs[&("jobhost_runs_total".into(), "job_type=\"mail\",outcome=\"completed\"".into())], 1.0);
    assert_eq!(runs[&("jobhost_run_duration_seconds_count".into(), "job_type=\"mail\"".into())], 1.0);
    let hosts = samples(&scrape.body, "jobhost_hosts");
    assert_eq!(hosts[&("jobhost_hosts".into(), "state=\"alive\"".into())], stats.hosts_alive as f64);
}

async fn every_documented_endpoint_answers(db: TestDb) {
    register(&db).await;
    let id = db.enqueue_new("mail", json!({})).await;
    let (batch, _) =
        db.store.batch_create(&NewBatch::default(), &[EnqueueParams::new("mail", json!({}))]).await.unwrap();
    let steps = vec![jobhost::store::NewStep::new("only", "mail", json!({}))];
    let workflow = db.store.workflow_create(&jobhost::store::NewWorkflow { label: None, steps }).await.unwrap().id;
    let schedule = jobhost::store::keyed_schedule::KeyedSchedule::new("mail", "acme", "0 0 9 * * *");
    db.store.keyed_schedule_upsert(&schedule).await.unwrap();
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let hello = std::fs::read(common::guest("hello")).unwrap();
    assert_eq!(server.post_bytes("/api/deployments", "application/wasm", hello).await.status, StatusCode::CREATED);
    let openapi = server.get("/api/openapi.json").await;
    assert_eq!(openapi.status, StatusCode::OK);
    let openapi = openapi.json();
    assert!(openapi["openapi"].as_str().unwrap().starts_with("3."));
    let paths = openapi["paths"].as_object().unwrap();
    assert!(paths.len() >= 19, "{} paths", paths.len());
    for (path, operations) in paths {
        let concrete = path
            .replace(
                "{id}",
                &match path {
                    p if p.contains("batches") => batch,
                    p if p.contains("workflows") => workflow,
                    _ => id,
                }
                .to_string(),
            )
            .replace("{name}", "default")
            .replace("{job_type}", "hello")
            .replace("{job}", "mail")
            .replace("{key}", "acme");
        for method in operations.as_object().unwrap().keys().filter(|m| ["get", "post"].contains(&m.as_str())) {
            let answer = match method.as_str() {
                "get" => server.get(&concrete).await,
                _ => server.post(&concrete, json!({"job": "mail", "state": "failed"})).await,
            };
            assert!(
                answer.status != StatusCode::NOT_FOUND && answer.status != StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path} is documented but answers {}: {}",
                answer.status,
                answer.body
            );
        }
    }
}

/// Issue 33, "Also": deployments over the API, as `jobhost deploy`,
/// `undeploy`, `rollback` and `components` have them. A deploy posts the
/// component's bytes and is validated as a host loads it; one that would
/// not load is refused with the reason and nothing is stored. The job
/// types say which version is deployed and which hosts run which.
async fn components_are_deployed_rolled_back_and_undeployed_over_the_api(db: TestDb) {
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let bytes = |name: &str| std::fs::read(common::guest(name)).unwrap();
    let v1 = server.post_bytes("/api/deployments", "application/wasm", bytes("hello")).await;
    assert_eq!(v1.status, StatusCode::CREATED, "{}", v1.body);
    let v1 = v1.json();
    assert_eq!(
        (v1["job_type"].as_str(), v1["previous"].clone(), v1["changed"].clone()),
        (Some("hello"), Value::Null, json!(true))
    );
    let first = v1["current"].as_str().unwrap().to_string();
    let again = server.post_bytes("/api/deployments", "application/wasm", bytes("hello")).await;
    assert_eq!(
        (again.status, again.json()["changed"].clone()),
        (StatusCode::OK, json!(false)),
        "the same version again"
    );
    let v2 = server.post_bytes("/api/deployments", "application/wasm", bytes("hello_v2")).await.json();
    let second = v2["current"].as_str().unwrap().to_string();
    assert_ne!(first, second);
    let current = server.get("/api/deployments").await.json();
    assert_eq!(current[0]["digest"], second.as_str());
    // The job types page and API say which version is deployed.
    let types = server.get("/api/job-types").await.json();
    let hello = types.as_array().unwrap().iter().find(|t| t["name"] == "hello").unwrap();
    assert_eq!(hello["deployed"]["digest"], second.as_str());
    let page = server.get("/types").await;
    assert!(page.body.contains(&second[..12]), "the job types page shows the deployed version");

    let back = server.post("/api/deployments/hello/rollback", json!({})).await;
    assert_eq!(back.status, StatusCode::OK, "{}", back.body);
    assert_eq!(back.json()["current"], first.as_str());
    let history = server.get("/api/deployments/hello").await.json();
    let actions: Vec<&str> = history.as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["rollback", "deploy", "deploy"], "newest first");
    let to = server.post("/api/deployments/hello/rollback", json!({"to": &second[..10]})).await.json();
    assert_eq!(to["current"], second.as_str());
    let gone = server.post("/api/deployments/hello/undeploy", json!({})).await;
    assert_eq!((gone.status, gone.json()["current"].clone()), (StatusCode::OK, Value::Null));
    assert_eq!(server.get("/api/deployments").await.json(), json!([]));

    // What would not load is refused, naming why; nothing is stored.
    let broken = server.post_bytes("/api/deployments", "application/wasm", b"\0asm not really".to_vec()).await;
    assert_eq!(broken.status, StatusCode::BAD_REQUEST);
    assert!(broken.body.contains("nothing was deployed"), "{}", broken.body);
    let misconfigured = server.post_bytes("/api/deployments", "application/wasm", bytes("misconfigured")).await;
    assert_eq!(misconfigured.status, StatusCode::BAD_REQUEST, "{}", misconfigured.body);
    let entries = server.get("/api/deployments/hello").await.json().as_array().unwrap().len();
    assert_eq!(entries, 5, "deploy, deploy, rollback, rollback, undeploy: nothing since");
    let unknown = server.post("/api/deployments/nope/rollback", json!({})).await;
    assert_eq!(unknown.status, StatusCode::CONFLICT, "{}", unknown.body);
    // Each change is in the audit trail once, as the server's token over
    // the API, the refused rollback too; an upload refused before it
    // reached the store is not a change.
    let family = jobhost::store::audit::Filter { action: Some("component.".into()), limit: 100, ..Default::default() };
    let trail = db.store.audit_list(&family).await.unwrap();
    let changes: Vec<(&str, &str)> = trail.iter().rev().map(|r| (r.action.as_str(), r.object.as_str())).collect();
    let hello = "type hello";
    assert_eq!(
        changes,
        [
            ("component.deploy", hello),
            ("component.deploy", hello),
            ("component.deploy", hello),
            ("component.rollback", hello),
            ("component.rollback", hello),
            ("component.undeploy", hello),
            ("component.rollback", "type nope"),
        ],
        "{trail:#?}"
    );
    assert!(trail.iter().all(|r| r.via == "api" && r.who == "--token"), "{trail:#?}");
    assert!(trail[0].outcome.starts_with("refused: ") && trail[6].outcome.starts_with("none -> "), "{trail:#?}");
    // Without the token nothing is deployed, and the body is never read.
    let refused = server.anonymous().post_bytes("/api/deployments", "application/wasm", bytes("hello")).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
}

on_both_backends!(
    components_are_deployed_rolled_back_and_undeployed_over_the_api,
    reads_show_jobs_of_every_state,
    pages_follow_the_cursor_without_repeats_or_gaps,
    bad_queries_and_paths_are_named,
    without_the_token_nothing_changes,
    enqueues_pass_the_gate_and_bad_ones_are_named,
    retry_and_cancel_follow_the_jobs_state,
    bulk_actions_apply_the_filter_on_the_server,
    queues_pause_and_resume,
    hosts_types_batches_and_schedules_are_listed,
    metrics_agree_with_stats,
    every_documented_endpoint_answers,
);

/// The first line of `reader` containing `marker`, read on a thread (the
/// rest is drained so the process never blocks on a full pipe).
fn line_with(reader: impl std::io::Read + Send + 'static, marker: &'static str) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (found, line) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for text in std::io::BufReader::new(reader).lines().map_while(Result::ok) {
            if text.contains(marker) {
                let _ = found.send(text);
            }
        }
    });
    line
}

/// The `host:port` after `prefix` in `line`.
fn address_in(line: &str, prefix: &str) -> std::net::SocketAddr {
    let start = line.find(prefix).unwrap_or_else(|| panic!("no {prefix:?} in {line:?}")) + prefix.len();
    let address: String = line[start..].chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':').collect();
    address.parse().unwrap_or_else(|e| panic!("{address:?} in {line:?}: {e}"))
}

/// A client for a server some process started, presenting `token` if given.
async fn client_for(address: std::net::SocketAddr, token: Option<&str>) -> TestServer {
    match token {
        Some(token) => TestServer::at_with_token(address, token),
        None => TestServer::at(address),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_prints_its_address_and_stops_on_sigterm() {
    let db = TestDb::sqlite().await;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_jobhost"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--database-url", &db.url])
        .env("RUST_LOG", "warn")
        .env_remove("JOBHOST_TOKEN")
        .stdout(std::process::Stdio::piped());
    let mut serving = common::fleet::Host::start(&mut command);
    let line = line_with(serving.take_stdout(), "dashboard and API on").recv().expect("serve prints its address");
    assert!(line.contains("read-only"), "{line}");
    let server = client_for(address_in(&line, "http://"), None).await;
    assert_eq!(server.get("/api/health").await.json()["database"], "ok");
    // A token it does not know is refused; none at all, as read-only.
    assert_eq!(server.post("/api/queues/default/pause", json!({})).await.status, StatusCode::UNAUTHORIZED);
    let none = server.send(Method::POST, "/api/queues/default/pause", None, None).await;
    assert_eq!(none.status, StatusCode::FORBIDDEN, "{}", none.body);
    serving.stop().await;
}

/// Starts `command` (a `jobhost run`) serving the HTTP API on a free port,
/// and waits until its job types are registered; returns the running host
/// (stopped when dropped) and a client of its API.
async fn serving_host(command: &mut std::process::Command) -> (common::fleet::Host, TestServer) {
    command
        .args(["--http", "127.0.0.1:0", "--token", TOKEN])
        .env("RUST_LOG", "warn,jobhost::host=info")
        .stderr(std::process::Stdio::piped());
    let mut host = common::fleet::Host::start(command);
    // The words `serve` prints, so both read alike.
    let line = line_with(host.take_stderr(), "dashboard and API on http://").recv().expect("the host logs its address");
    assert!(line.contains("(reads and changes need the token)"), "{line}");
    let server = client_for(address_in(&line, "http://"), Some(TOKEN)).await;
    common::eventually(Duration::from_secs(60), || async {
        server.get("/api/job-types").await.json().as_array().is_some_and(|types| !types.is_empty())
    })
    .await;
    (host, server)
}

/// A host handing one key's jobs along, one at a time, leases each next job
/// with the write of its holder's result. Its fetch loop, idle meanwhile,
/// must not fetch after each of them (it did: an empty fetch per job), nor
/// be woken by each promotion (it was: another). With polling set aside
/// (`--poll 1h`), only the startup and the enqueue's announcement send it
/// fetching, whatever the machine's speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_host_handing_a_keys_jobs_along_does_not_fetch_for_each() {
    const JOBS: usize = 40;
    let _fleet = common::fleet::ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = common::fleet::components(&["serial"]);
    let cache = tempfile::tempdir().unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_jobhost"));
    command
        .args(["run", "--no-migrate", "--concurrency", "8", "--poll", "1h"])
        .arg("--components")
        .arg(components.path())
        .arg("--cache-dir")
        .arg(cache.path())
        .env("DATABASE_URL", &db.url)
        .stdout(std::process::Stdio::null());
    let (_host, server) = serving_host(&mut command).await;
    // The host listens once its first fetch came back empty: a job enqueued
    // before then would wait for the poll.
    let listening = "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND query LIKE '%LISTEN%jobhost_available%'";
    common::eventually(Duration::from_secs(60), || async { db.scalar(listening).await > 0 }).await;
    let jobs: Vec<EnqueueParams> =
        (0..JOBS).map(|_| EnqueueParams::new("serial", json!({"key": "k", "ms": 0}))).collect();
    db.store.job_enqueue(&jobs).await.unwrap();
    let archived = "SELECT count(*) FROM jobhost.archive WHERE state = 'completed'";
    common::eventually(Duration::from_secs(60), || async { db.scalar(archived).await == JOBS as i64 }).await;

    let scrape = server.get("/metrics").await.body;
    let fetches = samples(&scrape, "jobhost_fetches");
    let empty = fetches.get(&("jobhost_fetches_total".to_string(), "found=\"none\"".to_string())).copied();
    assert!(empty.unwrap_or(0.0) <= 3.0, "{empty:?} empty fetches for {JOBS} jobs handed along one key:\n{scrape}");
    let found = fetches.get(&("jobhost_fetches_total".to_string(), "found=\"jobs\"".to_string())).copied();
    assert_eq!(found, Some(1.0), "only the enqueue's announcement found a job; the rest were leased with results");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_host_serves_the_metrics_of_its_runs() {
    let _fleet = common::fleet::ONE_FLEET.lock().await;
    let db = TestDb::postgres().await;
    let components = common::fleet::components(&["hello"]);
    let cache = tempfile::tempdir().unwrap();
    let mut command = common::fleet::host_command(&db.url, components.path(), cache.path());
    let (mut host, server) = serving_host(&mut command).await;
    let mut ids = Vec::new();
    for name in ["Ada", "Grace", "Edsger"] {
        let created = server.post("/api/jobs", json!({"job": "hello", "payload": {"name": name}})).await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
        ids.push(created.json()["id"].as_i64().unwrap());
    }
    for id in &ids {
        let path = format!("/api/jobs/{id}");
        common::eventually(Duration::from_secs(60), || async {
            server.get(&path).await.json()["state"] == "completed"
        })
        .await;
    }
    let scrape = server.get("/metrics").await.body;
    let runs = samples(&scrape, "jobhost_");
    let value = |name: &str, labels: &str| runs.get(&(name.to_string(), labels.to_string())).copied();
    assert_eq!(value("jobhost_runs_total", "job_type=\"hello\",outcome=\"completed\""), Some(3.0), "{scrape}");
    assert_eq!(value("jobhost_run_duration_seconds_count", "job_type=\"hello\""), Some(3.0));
    assert_eq!(value("jobhost_sandbox_instantiate_seconds_count", "job_type=\"hello\""), Some(3.0));
    assert_eq!(value("jobhost_enqueued_total", "job_type=\"hello\""), Some(3.0));
    assert_eq!(value("jobhost_jobs", "queue=\"default\",state=\"completed\""), Some(3.0));
    assert_eq!(value("jobhost_hosts", "state=\"alive\""), Some(1.0));
    assert_eq!(value("jobhost_database_up", ""), Some(1.0));
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_cut_off_is_answered_503_and_scraped_as_down() {
    let db = TestDb::postgres().await;
    register(&db).await;
    db.enqueue_new("mail", json!({})).await;
    let proxy = common::proxy::Proxy::start(common::proxy::server_address()).await;
    let store = jobhost::store::open(&common::proxy::url_via(&db.url, proxy.port()), 4).await.unwrap();
    let config = jobhost::http::HttpConfig {
        request_timeout: Duration::from_secs(1),
        ..jobhost::http::HttpConfig::new("127.0.0.1:0".parse().unwrap())
    };
    let metrics = jobhost::metrics::Metrics::default();
    metrics.run_ended("mail", "completed", Duration::from_millis(5), None);
    let server = TestServer::serving(&config, store, metrics).await;
    assert_eq!(server.get("/api/stats").await.status, StatusCode::OK);
    proxy.freeze();
    // The statements hang on a cut cable; the deadline answers instead.
    for path in ["/api/stats", "/api/health", "/api/jobs", "/"] {
        let answer = server.get(path).await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {}", answer.body);
        assert!(answer.body.contains("no answer within 1s"), "{path}: {}", answer.body);
    }
    let scrape = server.get("/metrics").await;
    assert_eq!(scrape.status, StatusCode::OK, "a scrape still answers: {}", scrape.body);
    let down = samples(&scrape.body, "jobhost_");
    assert_eq!(down.get(&("jobhost_database_up".into(), String::new())), Some(&0.0), "{}", scrape.body);
    assert_eq!(down.get(&("jobhost_runs_total".into(), "job_type=\"mail\",outcome=\"completed\"".into())), Some(&1.0));
    assert!(!scrape.body.contains("jobhost_jobs{"), "no stale numbers for the database");
    proxy.thaw();
    common::eventually(Duration::from_secs(30), || async { server.get("/api/stats").await.status == StatusCode::OK })
        .await;
    assert_eq!(
        samples(&server.get("/metrics").await.body, "jobhost_database_up")
            [&("jobhost_database_up".into(), String::new())],
        1.0
    );
}
