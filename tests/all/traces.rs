//! Traces, on both backends: a host exporting to an OTLP/HTTP receiver the
//! test starts makes a span per run, each a child of the span its enqueue
//! carried through the database (the HTTP `traceparent` header, the Rust
//! client's current context, SQL's argument), children of the run that
//! enqueued them, retries each a span of the same parent, and untraced
//! jobs roots of traces of their own.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use hyper::Method;
use opentelemetry::context::FutureExt;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use serde_json::json;

use common::db::{Backend, TestDb, jobhost, on_both_backends};
use common::http::{TOKEN, TestServer};
use common::{TestHost, eventually, job_config};
use jobhost::Client;
use jobhost::telemetry::OtlpConfig;

/// A span as the receiver got it.
#[derive(Debug, Clone)]
struct Received {
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: i32,
    attributes: HashMap<String, String>,
    status_code: i32,
    status_message: String,
    service: String,
}

impl Received {
    fn job_id(&self) -> i64 {
        self.attributes["jobhost.job.id"].parse().unwrap()
    }
}

/// An OTLP/HTTP receiver on 127.0.0.1: every span of every request, decoded.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .route("/headers", axum::routing::get(traceparent_of))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { url, spans }
    }

    /// The spans of job `id`'s runs, by attempt.
    fn runs_of(&self, id: i64) -> Vec<Received> {
        let mut runs: Vec<Received> = self.spans.lock().unwrap().iter().filter(|s| s.job_id() == id).cloned().collect();
        runs.sort_by_key(|s| s.attributes["jobhost.attempt"].parse::<i64>().unwrap());
        runs
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<Received>>>>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
    let mut received = spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
            received.push(Received {
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                name: span.name,
                kind: span.kind,
                attributes: span
                    .attributes
                    .iter()
                    .map(|kv| (kv.key.clone(), text(kv.value.as_ref().and_then(|v| v.value.as_ref()))))
                    .collect(),
                status_code: span.status.as_ref().map_or(0, |s| s.code),
                status_message: span.status.map(|s| s.message).unwrap_or_default(),
                service: service.clone(),
            });
        }
    }
    Vec::new()
}

/// What a service a run calls sees: the request's traceparent.
async fn traceparent_of(headers: axum::http::HeaderMap) -> String {
    headers.get("traceparent").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default()
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(n)) => n.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A caller's span, as a W3C traceparent and its two ids.
struct Caller {
    trace_id: &'static str,
    span_id: &'static str,
}

impl Caller {
    fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }
}

const BY_HTTP: Caller = Caller { trace_id: "4bf92f3577b34da6a3ce929d0e0e4736", span_id: "00f067aa0ba902b7" };
const BY_CLIENT: Caller = Caller { trace_id: "0af7651916cd43dd8448eb211c80319c", span_id: "b7ad6b7169203331" };
const BY_SQL: Caller = Caller { trace_id: "11111111111111111111111111111111", span_id: "2222222222222222" };
const FETCHING: Caller = Caller { trace_id: "feedfacefeedfacefeedfacefeedface", span_id: "1234123412341234" };
const RETRIED: Caller = Caller { trace_id: "abcdefabcdefabcdefabcdefabcdef01", span_id: "0123456789abcdef" };

async fn runs_join_the_trace_their_enqueue_carried(db: TestDb) {
    let receiver = Receiver::start().await;
    let endpoint = receiver.url.clone();
    let origin = receiver.url.clone();
    let grant =
        jobhost::store::grant::NewGrant { job_type: "fetcher".into(), origin: origin.clone(), ..Default::default() };
    db.store.grant_set(&grant).await.unwrap();
    let host = TestHost::start(&db, &["fanout", "hello", "flaky", "fetcher"], move |config| {
        config.otlp = Some(OtlpConfig { endpoint: Some(endpoint) });
    })
    .await;

    // HTTP: the request's traceparent; the fanout's two children continue it.
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let bearer = format!("Bearer {TOKEN}");
    let body = json!({"job": "fanout", "payload": {"count": 2}}).to_string();
    let answer = server
        .send_with(
            Method::POST,
            "/api/jobs",
            Some(("application/json", body)),
            &[("authorization", &bearer), ("traceparent", &BY_HTTP.traceparent())],
        )
        .await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let fanout = answer.json()["id"].as_i64().unwrap();
    // An invalid header is ignored, as the W3C rules say: the job is enqueued
    // and its run starts a trace.
    let body = json!({"job": "hello", "payload": {}}).to_string();
    let bad = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
    let answer = server
        .send_with(
            Method::POST,
            "/api/jobs",
            Some(("application/json", body)),
            &[("authorization", &bearer), ("traceparent", bad)],
        )
        .await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let badly_traced = answer.json()["id"].as_i64().unwrap();

    // The Rust client: the caller's current OpenTelemetry context.
    let client = Client::from_store(db.dyn_store());
    let caller = jobhost::telemetry::context::parse(&BY_CLIENT.traceparent()).unwrap();
    let context = opentelemetry::Context::new().with_remote_span_context(caller);
    let by_client = client.enqueue("hello", json!({"name": "client"})).with_context(context).await.unwrap();
    let untraced = client.enqueue("hello", json!({"name": "nobody"})).await.unwrap();

    // A retried job: each attempt a span of the same parent.
    let retried = db
        .enqueue_one(
            jobhost::store::EnqueueParams::new("flaky", json!({"fail_times": 1})).traceparent(RETRIED.traceparent()),
        )
        .await;

    // A run's outbound requests carry its span: the service it calls joins the trace.
    let fetching = jobhost::store::EnqueueParams::new("fetcher", json!({"url": format!("{origin}/headers")}));
    let fetching = db.enqueue_one(fetching.traceparent(FETCHING.traceparent())).await;

    // SQL (PostgreSQL): the optional argument, checked.
    let by_sql = if db.backend == Backend::Postgres {
        let refused = sqlx::query("SELECT jobhost.enqueue('hello', '{}', traceparent => 'nonsense')")
            .execute(db.pool())
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("is not a W3C trace context"), "{refused}");
        let sql = format!("SELECT jobhost.enqueue('hello', '{{}}', traceparent => '{}')", BY_SQL.traceparent());
        Some(db.scalar(sql).await)
    } else {
        None
    };

    eventually(Duration::from_secs(60), || async {
        db.scalar("SELECT count(*) FROM jobhost.archive").await == if by_sql.is_some() { 9 } else { 8 }
    })
    .await;
    let hosts = db.texts("SELECT id FROM jobhost.hosts").await;
    // The host sends what it still holds as it stops: no waiting for a batch.
    host.stop().await;

    let only_run = |id: i64| {
        let runs = receiver.runs_of(id);
        assert_eq!(runs.len(), 1, "one span for job {id}: {runs:?}");
        runs.into_iter().next().unwrap()
    };
    let fanout_run = only_run(fanout);
    assert_eq!((fanout_run.trace_id.as_str(), fanout_run.parent_span_id.as_str()), (BY_HTTP.trace_id, BY_HTTP.span_id));
    assert_eq!(fanout_run.name, "run fanout");
    assert_eq!(fanout_run.kind, 5, "a consumer span");
    assert_eq!(fanout_run.service, "jobhost");
    assert_eq!(fanout_run.attributes["jobhost.job.type"], "fanout");
    assert_eq!(fanout_run.attributes["jobhost.queue"], "default");
    assert_eq!(fanout_run.attributes["jobhost.attempt"], "1");
    assert_eq!(fanout_run.attributes["jobhost.outcome"], "completed");
    assert!(hosts.contains(&fanout_run.attributes["jobhost.host"]), "{fanout_run:?} run by one of {hosts:?}");

    let children = db.texts(format!("SELECT CAST(id AS TEXT) FROM jobhost.archive WHERE parent_id = {fanout}")).await;
    assert_eq!(children.len(), 2);
    for child in &children {
        let run = only_run(child.parse().unwrap());
        assert_eq!(run.trace_id, BY_HTTP.trace_id, "a child continues its parent's trace");
        assert_eq!(run.parent_span_id, fanout_run.span_id, "a child's run is a child of its parent's run");
    }

    let client_run = only_run(by_client);
    assert_eq!(
        (client_run.trace_id.as_str(), client_run.parent_span_id.as_str()),
        (BY_CLIENT.trace_id, BY_CLIENT.span_id)
    );

    for root in [untraced, badly_traced] {
        let run = only_run(root);
        assert!(run.parent_span_id.is_empty(), "a job enqueued outside a trace starts one: {run:?}");
        assert!(
            ![BY_HTTP.trace_id, BY_CLIENT.trace_id, BY_SQL.trace_id, RETRIED.trace_id].contains(&run.trace_id.as_str())
        );
    }

    let attempts = receiver.runs_of(retried);
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    for attempt in &attempts {
        assert_eq!((attempt.trace_id.as_str(), attempt.parent_span_id.as_str()), (RETRIED.trace_id, RETRIED.span_id));
    }
    assert_eq!(attempts[0].attributes["jobhost.outcome"], "retried");
    assert_eq!(attempts[0].status_code, 2, "an error status");
    assert_eq!(attempts[0].status_message, "attempt 1 failed on purpose");
    assert_eq!(attempts[1].attributes["jobhost.outcome"], "completed");
    assert_ne!(attempts[0].span_id, attempts[1].span_id);

    let fetch_run = only_run(fetching);
    assert_eq!(fetch_run.parent_span_id, FETCHING.span_id);
    let output: serde_json::Value = serde_json::from_str(
        &db.texts(format!("SELECT CAST(output AS TEXT) FROM jobhost.archive WHERE id = {fetching}")).await[0],
    )
    .unwrap();
    assert_eq!(output["body"], format!("00-{}-{}-01", fetch_run.trace_id, fetch_run.span_id), "{output}");

    if let Some(by_sql) = by_sql {
        let run = only_run(by_sql);
        assert_eq!((run.trace_id.as_str(), run.parent_span_id.as_str()), (BY_SQL.trace_id, BY_SQL.span_id));
    }

    // Only jobs enqueued inside a trace have a row; the archive's pruning
    // takes them along.
    let traced = db.scalar("SELECT count(*) FROM jobhost.job_traces").await;
    assert_eq!(
        traced,
        if by_sql.is_some() { 7 } else { 6 },
        "fanout, its two children, the client's, the retried, the fetch, SQL's"
    );
    db.dyn_store().archive_prune(None, 0.0, 1_000).await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.job_traces").await, 0);
}

on_both_backends!(runs_join_the_trace_their_enqueue_carried);

#[tokio::test]
async fn an_endpoint_that_is_not_a_url_stops_the_host_saying_why() {
    let db = TestDb::sqlite().await;
    let dir = tempfile::tempdir().unwrap();
    let components = dir.path().to_str().unwrap();
    let out = jobhost(&db, &["run", "--components", components, "--otlp-endpoint", "localhost:4318"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not an http:// or https:// URL (e.g. http://localhost:4318)"), "{stderr}");
}

#[tokio::test]
async fn the_cli_enqueue_carries_a_traceparent_and_refuses_a_bad_one() {
    let db = TestDb::sqlite().await;
    db.store.job_types_register(&[(job_config("hello"), "d".into())]).await.unwrap();
    let out = jobhost(&db, &["enqueue", "hello", "--payload", "{}", "--traceparent", &BY_HTTP.traceparent()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(db.dyn_store().job_traceparent(id).await.unwrap(), Some(BY_HTTP.traceparent()));
    let out = jobhost(&db, &["enqueue", "hello", "--payload", "{}", "--traceparent", "00-zz"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a W3C trace context"));
}
