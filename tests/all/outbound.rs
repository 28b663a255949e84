//! Outbound HTTP from a real component (`guests/fetcher`, through the
//! standard wasi:http interface) to servers these tests start on
//! 127.0.0.1: a request goes out only when the component declares it and
//! a grant in the database allows it, a refusal leaves the fix in the
//! job's log, private addresses need a grant that says so, a grant changed
//! between runs is obeyed by the next, and a run stopped mid-request closes
//! its connection at once. Refusals of addresses the tests cannot start a
//! server on are checked as pure functions in `src/outbound/`.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::response::IntoResponse;
use axum::routing::any;
use jobhost::component::{LiveProgress, Runtime, StopSignal, grants_from, secrets_from, variables_from};
use jobhost::config::RuntimeConfig;
use jobhost::outbound::secrets::SecretKey;
use jobhost::store::grant::{GrantTimeouts, NewGrant};
use jobhost::types::RunReport;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use common::bodies::Trickle;
use common::db::{TestDb, on_both_backends};
use common::{completed_output, context, load};

/// What the test server saw: each request's method and path, and the
/// `authorization` header of each request to `/echo`.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Sent when a request to `/hang` is dropped: its connection closed.
struct Hung(mpsc::UnboundedSender<()>);

impl Drop for Hung {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// A test server and what it tells.
struct Server {
    address: SocketAddr,
    seen: Seen,
    /// A request to `/hang` arrived.
    hung: mpsc::UnboundedReceiver<()>,
    /// A request to `/hang` went away.
    closed: mpsc::UnboundedReceiver<()>,
    /// A request to `/wait` arrived.
    waiting: mpsc::UnboundedReceiver<()>,
    /// Lets every request to `/wait` answer.
    release: tokio::sync::watch::Sender<bool>,
    /// How many connections the server accepted.
    accepted: Arc<std::sync::atomic::AtomicUsize>,
}

/// A server on 127.0.0.1 answering `pong PATH` to everything, except
/// `/hang`, which never answers (and says when its client goes away),
/// `/wait`, which answers once released, `/trickle`, which sends three
/// bytes and then nothing, `/upload`, which answers the body's size, and
/// `/traced`, which records the request's `traceparent`.
async fn server() -> Server {
    let seen = Seen::default();
    let (hung_tx, hung) = mpsc::unbounded_channel();
    let (closed_tx, closed) = mpsc::unbounded_channel();
    let (waiting_tx, waiting) = mpsc::unbounded_channel();
    let (release, released) = tokio::sync::watch::channel(false);
    let recorder = seen.clone();
    let app = Router::new().fallback(any(move |request: Request| {
        let (recorder, hung_tx, closed_tx) = (recorder.clone(), hung_tx.clone(), closed_tx.clone());
        let (waiting_tx, mut released) = (waiting_tx.clone(), released.clone());
        async move {
            let path = request.uri().path().to_string();
            recorder.0.lock().unwrap().push(format!("{} {path}", request.method()));
            if path == "/headers" {
                let header = |name: &str| request.headers().get(name).map(|v| v.to_str().unwrap().to_string());
                return json!({"idempotency-key": header("idempotency-key"), "traceparent": header("traceparent")})
                    .to_string()
                    .into_response();
            }
            if path == "/traced" {
                let header = request.headers().get("traceparent").map(|v| v.to_str().unwrap().to_string());
                recorder.0.lock().unwrap().push(format!("traceparent: {}", header.unwrap_or_default()));
                // Read whole, so a body's sender is never cut off by the answer.
                let _ = axum::body::to_bytes(request.into_body(), 1 << 20).await;
                return "traced".into_response();
            }
            if path == "/echo" {
                let header = request.headers().get("authorization").map(|v| v.to_str().unwrap().to_string());
                let header = header.unwrap_or_default();
                recorder.0.lock().unwrap().push(format!("authorization: {header}"));
                return header.into_response();
            }
            if path == "/mirror" {
                for name in ["authorization", "x-request-id"] {
                    let header = request.headers().get(name).map(|v| v.to_str().unwrap_or_default().to_string());
                    recorder.0.lock().unwrap().push(format!("mirrored {name}: {}", header.unwrap_or_default()));
                }
                return mirror(request).await;
            }
            if path == "/gzipped" {
                let gzipped = [("content-encoding", "gzip")];
                return (gzipped, "not really gzip, but the host may not look").into_response();
            }
            if path == "/hang" {
                let _guard = Hung(closed_tx);
                let _ = hung_tx.send(());
                std::future::pending::<()>().await;
            }
            if path == "/wait" {
                let _ = waiting_tx.send(());
                let _ = released.wait_for(|go| *go).await;
            }
            if path == "/trickle" {
                return axum::body::Body::new(Trickle { first: Some("abc".into()) }).into_response();
            }
            if path == "/capture" {
                let query = request.uri().query().unwrap_or_default().to_string();
                let body = axum::body::to_bytes(request.into_body(), 1 << 20).await.unwrap_or_default();
                recorder.0.lock().unwrap().push(format!("query: {query}"));
                recorder.0.lock().unwrap().push(format!("body: {}", String::from_utf8_lossy(&body)));
                return "captured".into_response();
            }
            if path == "/upload" {
                let size = axum::body::to_bytes(request.into_body(), usize::MAX).await.map(|b| b.len());
                recorder.0.lock().unwrap().push(format!("uploaded {size:?}"));
                return format!("{size:?}").into_response();
            }
            format!("pong {path}").into_response()
        }
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    let listener = axum::serve::ListenerExt::tap_io(listener, move |_| {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Server { address, seen, hung, closed, waiting, release, accepted }
}

/// What a debugging endpoint does: every request header back as a
/// response header (`x-echo-NAME`), and a body holding the headers, the
/// query and the body as JSON, again as JSON inside a JSON string, and
/// once more inside that, sent in 7-byte frames so a value falls across
/// frames.
async fn mirror(request: Request) -> axum::response::Response {
    let mut echoed = axum::http::HeaderMap::new();
    let mut headers = serde_json::Map::new();
    for (name, value) in request.headers() {
        headers.insert(name.to_string(), json!(value.to_str().unwrap_or_default()));
        let echo = axum::http::HeaderName::from_bytes(format!("x-echo-{name}").as_bytes()).unwrap();
        echoed.append(echo, value.clone());
    }
    let query = request.uri().query().unwrap_or_default().to_string();
    let body = axum::body::to_bytes(request.into_body(), 1 << 20).await.unwrap_or_default();
    let inner = json!({"headers": headers, "query": query, "body": String::from_utf8_lossy(&body)});
    let nested = inner.to_string();
    let document = json!({"inner": inner, "nested": nested, "twice": json!({"nested": nested}).to_string()});
    let text = document.to_string().into_bytes();
    let frames: std::collections::VecDeque<bytes::Bytes> = text.chunks(7).map(bytes::Bytes::copy_from_slice).collect();
    (echoed, axum::body::Body::new(common::bodies::Frames(frames))).into_response()
}

fn runtime(db: &TestDb) -> (Runtime, tempfile::TempDir) {
    let (runtime, cache) = common::runtime();
    (runtime.with_grants(grants_from(db.dyn_store())), cache)
}

async fn grant(db: &TestDb, origin: &str, methods: &[&str], private: bool) {
    let methods = methods.iter().map(|m| m.to_string()).collect();
    let new = NewGrant { job_type: "fetcher".into(), origin: origin.into(), methods, private, ..Default::default() };
    db.store.grant_set(&new).await.unwrap();
}

async fn fetch(runtime: &Runtime, component: &jobhost::component::LoadedComponent, request: Value) -> RunReport {
    runtime.run(component, &context(41, 1), &request.to_string(), StopSignal::new()).await
}

fn logged(report: &RunReport) -> String {
    report.effects.logs.iter().map(|line| line.message.as_str()).collect::<Vec<_>>().join("\n")
}

async fn requests_go_out_only_when_declared_and_granted(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let (runtime, _cache) = runtime(&db);
    let fetcher = load(&runtime, "fetcher").await;
    let port = address.port();
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");

    // Declared, not granted: refused in the guest, the fix in the log.
    let refused = fetch(&runtime, &fetcher, json!({"url": url("/one")})).await;
    assert_eq!(completed_output(&refused.outcome), json!({"error": "ErrorCode::HttpRequestDenied"}));
    let hint = format!(
        "GET http://127.0.0.1:{port} refused: not granted; `jobhost grant fetcher 'http://127.0.0.1:*' --methods GET,POST` allows it"
    );
    assert!(logged(&refused).contains(&hint), "{}", logged(&refused));

    // Granted for GET: it goes out and the answer comes back.
    grant(&db, &format!("http://127.0.0.1:{port}"), &["GET"], false).await;
    let answered = fetch(&runtime, &fetcher, json!({"url": url("/two")})).await;
    let output = completed_output(&answered.outcome);
    assert_eq!((&output["status"], &output["body"]), (&json!(200), &json!("pong /two")), "{output}");
    // Each request is kept with the run (never its query) and counted.
    let call = &answered.effects.outbound[..];
    assert_eq!(call.len(), 1);
    assert_eq!(
        (call[0].path.as_str(), call[0].status, call[0].response_bytes, call[0].rule.as_str()),
        ("/two", Some(200), "pong /two".len() as u64, "http://127.0.0.1:*")
    );
    let line = format!("outbound GET http://127.0.0.1:{port}/two: 200, 9 bytes in ");
    assert!(logged(&answered).contains(&line), "{}", logged(&answered));
    assert_eq!(refused.effects.outbound[0].error.as_deref(), Some("refused"));
    let metrics = jobhost::metrics::Metrics::default();
    metrics.outbound_calls("fetcher", &answered.effects.outbound);
    metrics.outbound_calls("fetcher", &refused.effects.outbound);
    let mut scrape = String::new();
    prometheus_client::encoding::text::encode(&mut scrape, metrics.registry()).unwrap();
    for sample in [
        r#"jobhost_outbound_requests_total{job_type="fetcher",rule="http://127.0.0.1:*",result="2xx"} 1"#,
        r#"jobhost_outbound_requests_total{job_type="fetcher",rule="http://127.0.0.1:*",result="refused"} 1"#,
        r#"jobhost_outbound_request_seconds_count{job_type="fetcher",rule="http://127.0.0.1:*"} 1"#,
    ] {
        assert!(scrape.contains(sample), "{sample} in {scrape}");
    }

    // POST is declared but the grant allows GET only; PUT is not declared.
    let post = fetch(&runtime, &fetcher, json!({"url": url("/three"), "method": "POST", "body": "x"})).await;
    assert_eq!(completed_output(&post.outcome), json!({"error": "ErrorCode::HttpRequestDenied"}));
    assert!(logged(&post).contains("POST http://127.0.0.1"), "{}", logged(&post));
    let put = fetch(&runtime, &fetcher, json!({"url": url("/four"), "method": "PUT"})).await;
    assert_eq!(completed_output(&put.outcome), json!({"error": "ErrorCode::HttpRequestDenied"}));
    assert!(logged(&put).contains("declares http://127.0.0.1"), "{}", logged(&put));
    assert!(logged(&put).contains("for other methods only"), "{}", logged(&put));

    // An origin the component does not declare, whatever is granted.
    grant(&db, "http://*:*", &[], true).await;
    let undeclared = fetch(&runtime, &fetcher, json!({"url": format!("http://127.0.0.2:{port}/five")})).await;
    assert_eq!(completed_output(&undeclared.outcome), json!({"error": "ErrorCode::HttpRequestDenied"}));
    assert!(logged(&undeclared).contains("does not declare http://127.0.0.2"), "{}", logged(&undeclared));
    assert_eq!(undeclared.effects.outbound[0].rule, "undeclared");
    db.store.grant_revoke("fetcher", "http://*:*").await.unwrap();

    // Revoked: the next run is refused again.
    db.store.grant_revoke("fetcher", &format!("http://127.0.0.1:{port}")).await.unwrap();
    let revoked = fetch(&runtime, &fetcher, json!({"url": url("/six")})).await;
    assert_eq!(completed_output(&revoked.outcome), json!({"error": "ErrorCode::HttpRequestDenied"}));

    assert_eq!(seen.all(), ["GET /two"], "only the allowed request reached the server");
}

/// A name is checked by the addresses it resolves to: `localhost` is
/// loopback, refused unless the grant lets the name reach private addresses.
async fn a_name_resolving_to_loopback_needs_a_private_grant(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let (runtime, _cache) = runtime(&db);
    let fetcher = load(&runtime, "fetcher").await;
    let origin = format!("http://localhost:{}", address.port());
    grant(&db, &origin, &[], false).await;
    let refused = fetch(&runtime, &fetcher, json!({"url": format!("{origin}/a")})).await;
    assert_eq!(completed_output(&refused.outcome), json!({"error": "ErrorCode::HttpRequestDenied"}));
    assert!(logged(&refused).contains("which is loopback"), "{}", logged(&refused));
    assert!(logged(&refused).contains("--private"), "{}", logged(&refused));
    assert!(seen.all().is_empty());

    grant(&db, &origin, &[], true).await;
    let answered = fetch(&runtime, &fetcher, json!({"url": format!("{origin}/b")})).await;
    assert_eq!(completed_output(&answered.outcome)["body"], "pong /b", "{:?}", answered.outcome);
    assert_eq!(seen.all(), ["GET /b"]);
}

/// A run stopped while its request waits for an answer (as a lost lease or
/// a cancel stops it) closes the connection at once.
async fn a_stopped_run_closes_its_connection(db: TestDb) {
    let Server { address, mut hung, mut closed, .. } = server().await;
    let (runtime, _cache) = runtime(&db);
    let fetcher = load(&runtime, "fetcher").await;
    grant(&db, &format!("http://127.0.0.1:{}", address.port()), &[], false).await;
    let signal = StopSignal::new();
    let request = json!({"url": format!("http://127.0.0.1:{}/hang", address.port())}).to_string();
    let run = {
        let (runtime, signal) = (runtime.clone(), signal.clone());
        tokio::spawn(async move { runtime.run(&fetcher, &context(42, 1), &request, signal).await })
    };
    tokio::time::timeout(Duration::from_secs(30), hung.recv()).await.expect("the request reached the server");
    signal.stop("cancelled");
    let report = run.await.unwrap();
    assert!(!report.outcome.is_completed(), "{:?}", report.outcome);
    tokio::time::timeout(Duration::from_secs(5), closed.recv()).await.expect("the server saw the connection close");
}

/// Runs reuse a connection a finished request left open, once their own
/// grant has judged its address; a run stopped mid-request leaves none
/// behind (its connection is closed, not kept).
async fn runs_reuse_kept_connections(db: TestDb) {
    let Server { address, accepted, mut hung, mut closed, .. } = server().await;
    let (runtime, _cache) = runtime(&db);
    let fetcher = Arc::new(load(&runtime, "fetcher").await);
    let origin = format!("http://127.0.0.1:{}", address.port());
    grant(&db, &origin, &[], false).await;
    for n in 0..5 {
        let answered = fetch(&runtime, &fetcher, json!({"url": format!("{origin}/run-{n}")})).await;
        assert_eq!(completed_output(&answered.outcome)["status"], 200, "{:?}", answered.outcome);
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1, "five runs, one after another, one connection");
    // Revoked: the kept connection does not carry a request the grant no longer allows.
    db.store.grant_revoke("fetcher", &origin).await.unwrap();
    let refused = fetch(&runtime, &fetcher, json!({"url": format!("{origin}/revoked")})).await;
    assert_eq!(completed_output(&refused.outcome), json!({"error": "ErrorCode::HttpRequestDenied"}));
    grant(&db, &origin, &[], false).await;
    let signal = StopSignal::new();
    let request = json!({"url": format!("{origin}/hang")}).to_string();
    let run = {
        let (runtime, fetcher, signal) = (runtime.clone(), fetcher.clone(), signal.clone());
        tokio::spawn(async move { runtime.run(&fetcher, &context(43, 1), &request, signal).await })
    };
    tokio::time::timeout(Duration::from_secs(30), hung.recv()).await.expect("the request reached the server");
    signal.stop("cancelled");
    run.await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), closed.recv()).await.expect("the server saw the connection close");
    let after = fetch(&runtime, &fetcher, json!({"url": format!("{origin}/after")})).await;
    assert_eq!(completed_output(&after.outcome)["status"], 200, "{:?}", after.outcome);
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2, "the stopped run's connection was not kept");
}

/// A grant may ask for an Idempotency-Key: the same on every attempt of
/// one job, another for another job. Every request carries a traceparent.
async fn retried_requests_repeat_their_idempotency_key(db: TestDb) {
    let Server { address, .. } = server().await;
    let (runtime, _cache) = runtime(&db);
    let fetcher = load(&runtime, "fetcher").await;
    let origin = format!("http://127.0.0.1:{}", address.port());
    let new =
        NewGrant { job_type: "fetcher".into(), origin: origin.clone(), idempotency_key: true, ..Default::default() };
    db.store.grant_set(&new).await.unwrap();
    let request = json!({"url": format!("{origin}/headers")}).to_string();
    let headers = |job: u64, attempt: u32| {
        let (runtime, request, fetcher) = (&runtime, &request, &fetcher);
        async move {
            let report = runtime.run(fetcher, &context(job, attempt), request, StopSignal::new()).await;
            let body = completed_output(&report.outcome)["body"].as_str().unwrap().to_string();
            serde_json::from_str::<Value>(&body).unwrap()
        }
    };
    let (first, retry, other) = (headers(500, 1).await, headers(500, 2).await, headers(501, 1).await);
    let key = first["idempotency-key"].as_str().expect("an Idempotency-Key");
    assert!(key.starts_with("jobhost-500-") && key.ends_with("-1"), "{key}");
    assert_eq!(retry["idempotency-key"], key, "the same on the retry");
    assert_ne!(other["idempotency-key"], key, "another job, another key");
    let trace = |headers: &Value| headers["traceparent"].as_str().unwrap().to_string();
    for headers in [&first, &retry] {
        let parts: Vec<&str> = trace(headers).leak().split('-').collect();
        assert_eq!((parts[0], parts[1].len(), parts[2].len(), parts[3]), ("00", 32, 16, "01"), "{headers}");
    }
    assert_ne!(trace(&first)[3..35], trace(&retry)[3..35], "a trace per run");
    // Without the grant's ask, no key.
    grant(&db, &origin, &[], false).await;
    assert_eq!(headers(500, 3).await["idempotency-key"], Value::Null);
}

/// With no trace exported, a run's requests share one trace id drawn for
/// the run (each its own span id); another run draws another.
async fn a_runs_requests_share_its_trace_id(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let (runtime, _cache) = runtime(&db);
    let fetcher = load(&runtime, "fetcher").await;
    let origin = format!("http://127.0.0.1:{}", address.port());
    grant(&db, &origin, &["GET", "POST"], false).await;
    // Two requests in one run: the fetch, then the answer forwarded.
    let request = json!({"url": format!("{origin}/traced"), "forward": format!("{origin}/traced")}).to_string();
    for (job, runs) in [(600, 1), (601, 2)] {
        let report = runtime.run(&fetcher, &context(job, 1), &request, StopSignal::new()).await;
        assert_eq!(completed_output(&report.outcome)["forwarded"], 200, "{:?}", report.outcome);
        let traced: Vec<String> =
            seen.all().iter().filter_map(|line| line.strip_prefix("traceparent: ").map(String::from)).collect();
        assert_eq!(traced.len(), 2 * runs, "{traced:?}");
    }
    let traced: Vec<String> =
        seen.all().iter().filter_map(|line| line.strip_prefix("traceparent: ").map(String::from)).collect();
    let trace_id = |parent: &str| parent[3..35].to_string();
    let span_id = |parent: &str| parent[36..52].to_string();
    assert_eq!(trace_id(&traced[0]), trace_id(&traced[1]), "one trace for a run's requests: {traced:?}");
    assert_ne!(span_id(&traced[0]), span_id(&traced[1]), "a span per request: {traced:?}");
    assert_eq!(trace_id(&traced[2]), trace_id(&traced[3]), "{traced:?}");
    assert_ne!(trace_id(&traced[0]), trace_id(&traced[2]), "another run, another trace: {traced:?}");
}

/// Through a running host and its database: a grant and a revoke made
/// while it runs are obeyed from the next run on, with no restart, and the
/// stored job keeps the request in its log.
async fn a_host_obeys_a_grant_changed_while_it_runs(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let host = common::TestHost::start(&db, &["fetcher"], |_| {}).await;
    let client = jobhost::Client::from_store(db.dyn_store());
    let url = format!("http://127.0.0.1:{}/hosted", address.port());
    let output_of = |id: i64| {
        let client = &client;
        async move {
            let job = client.wait(id, Duration::from_secs(30)).await.unwrap().expect("the job ended");
            (job.output.clone().unwrap_or_default(), format!("{:?}", job))
        }
    };
    let before = client.enqueue("fetcher", json!({"url": url})).await.unwrap();
    let (output, _) = output_of(before).await;
    assert_eq!(output, json!({"error": "ErrorCode::HttpRequestDenied"}));
    grant(&db, &format!("http://127.0.0.1:{}", address.port()), &["GET"], false).await;
    let granted = client.enqueue("fetcher", json!({"url": url})).await.unwrap();
    let (output, job) = output_of(granted).await;
    assert_eq!(output["body"], "pong /hosted", "{output}");
    assert!(job.contains("outbound GET http://127.0.0.1"), "the request is in the stored log: {job}");
    db.store.grant_revoke("fetcher", &format!("http://127.0.0.1:{}", address.port())).await.unwrap();
    let revoked = client.enqueue("fetcher", json!({"url": url})).await.unwrap();
    assert_eq!(output_of(revoked).await.0, json!({"error": "ErrorCode::HttpRequestDenied"}));
    assert_eq!(seen.all(), ["GET /hosted"]);
    host.stop().await;
}

const SECRET: &str = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";

/// The guest reads its secret as an environment variable holding a
/// placeholder; the host puts the value in the headers of requests to the
/// origin granted to carry it, and nowhere else; what the run leaves has
/// no value in it even when the server echoes it back.
async fn a_secret_reaches_only_the_granted_origin_and_is_kept_nowhere(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let key = SecretKey::generate().unwrap();
    db.store.secret_set("API_KEY", &key.seal("API_KEY", SECRET).unwrap()).await.unwrap();
    let as_hex = db.dialect("encode(ciphertext, 'hex')", "hex(ciphertext)");
    let stored = db.texts(format!("SELECT {as_hex} FROM jobhost.outbound_secrets")).await;
    let stored = hex::decode(&stored[0]).unwrap();
    assert!(!stored.windows(7).any(|w| w == b"sk_live"), "sealed at rest");
    let (granting, _cache) = runtime(&db);
    let runtime = granting.with_secrets(secrets_from(db.dyn_store(), Some(key.clone())));
    let fetcher = load(&runtime, "fetcher").await;
    let port = address.port();
    let new = NewGrant {
        job_type: "fetcher".into(),
        origin: format!("http://127.0.0.1:{port}"),
        secrets: vec!["API_KEY".into()],
        ..Default::default()
    };
    db.store.grant_set(&new).await.unwrap();
    grant(&db, &format!("http://localhost:{port}"), &[], true).await;

    let headers = json!({"authorization": "Bearer ${API_KEY}"});
    let carried =
        fetch(&runtime, &fetcher, json!({"url": format!("http://127.0.0.1:{port}/echo"), "headers": headers})).await;
    let output = completed_output(&carried.outcome);
    let echoed = output["body"].as_str().unwrap();
    assert!(echoed.starts_with("Bearer jobhost-secret-"), "echoed back as the placeholder: {output}");
    let placeholder = logged(&carried);
    assert!(placeholder.contains("sending authorization: Bearer jobhost-secret-"), "{placeholder}");
    // The other origin is allowed, but not to carry the secret.
    let other =
        fetch(&runtime, &fetcher, json!({"url": format!("http://localhost:{port}/echo"), "headers": headers})).await;
    assert!(completed_output(&other.outcome)["body"].as_str().unwrap().starts_with("Bearer jobhost-secret-"));
    let seen = seen.all();
    assert_eq!(seen[1], format!("authorization: Bearer {SECRET}"), "the server got the value");
    assert!(seen[3].starts_with("authorization: Bearer jobhost-secret-"), "{seen:?}");
    for report in [&carried, &other] {
        let everything = format!("{:?}", report);
        assert!(!everything.contains(SECRET), "no value in the report: {everything}");
    }

    // A host without the key, or with another, refuses to start the run.
    let (keyless, _cache2) = self::runtime(&db);
    let keyless = keyless.with_secrets(secrets_from(db.dyn_store(), None));
    let fetcher = load(&keyless, "fetcher").await;
    let refused = fetch(&keyless, &fetcher, json!({"url": format!("http://127.0.0.1:{port}/echo")})).await;
    let jobhost::types::RunOutcome::Retry { reason } = &refused.outcome else { panic!("{:?}", refused.outcome) };
    assert!(reason.contains("needs secrets this host cannot give: this host has no key"), "{reason}");
    let (other_key, _cache3) = self::runtime(&db);
    let other_key = other_key.with_secrets(secrets_from(db.dyn_store(), Some(SecretKey::generate().unwrap())));
    let fetcher = load(&other_key, "fetcher").await;
    let refused = fetch(&other_key, &fetcher, json!({"url": format!("http://127.0.0.1:{port}/echo")})).await;
    let jobhost::types::RunOutcome::Retry { reason } = &refused.outcome else { panic!("{:?}", refused.outcome) };
    assert!(reason.contains(&format!("was sealed with key {}", key.fingerprint())), "{reason}");
    assert_eq!(seen.len(), 4, "no request left the refused runs");
}

/// The command a refusal prints, run as printed in a POSIX shell, makes
/// the same request go through: for an address the pattern names, and for
/// `localhost` (loopback by definition, so the command says `--private`).
async fn a_refusal_hint_run_as_printed_makes_the_request_go_through(db: TestDb) {
    let Server { address, .. } = server().await;
    let (runtime, _cache) = runtime(&db);
    let fetcher = load(&runtime, "fetcher").await;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_jobhost")).parent().unwrap().to_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    for host in ["127.0.0.1", "localhost"] {
        let request = json!({"url": format!("http://{host}:{}/hinted", address.port())});
        let refused = fetch(&runtime, &fetcher, request.clone()).await;
        let log = logged(&refused);
        let command = log.split('`').nth(1).unwrap_or_else(|| panic!("no command in {log}"));
        assert!(command.starts_with("jobhost grant fetcher "), "{log}");
        let ran = std::process::Command::new("sh")
            .args(["-c", command])
            .env("PATH", &path)
            .env("DATABASE_URL", &db.url)
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        assert!(ran.status.success(), "{command}: {}", String::from_utf8_lossy(&ran.stderr));
        let through = fetch(&runtime, &fetcher, request).await;
        assert_eq!(completed_output(&through.outcome)["status"], 200, "after `{command}`: {}", logged(&through));
    }
}

/// `jobhost exec` with a database runs a handler that calls an API as a
/// host of that fleet would (its grants, secrets and variables); without
/// one it says why its requests are refused.
async fn exec_reads_a_fleets_grants_secrets_and_variables(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let port = address.port();
    let key = SecretKey::generate().unwrap();
    let _granted = mirror_granted(&db, port, &key).await;
    let payload =
        json!({"url": format!("http://127.0.0.1:{port}/echo"), "headers": {"authorization": "Bearer ${API_KEY}"}});
    let exec = |database: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_jobhost"));
        command.args(["exec", common::guest("fetcher").to_str().unwrap(), "--payload", &payload.to_string()]);
        command.env_remove("DATABASE_URL").env("JOBHOST_SECRET_KEY", key.to_hex()).env("RUST_LOG", "error");
        if let Some(url) = database {
            command.args(["--database-url", url]);
        }
        command.output().unwrap()
    };
    let ran = exec(Some(&db.url));
    let output: Value =
        serde_json::from_slice(&ran.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&ran.stderr)));
    assert_eq!(output["status"], 200, "{output}");
    assert!(seen.all().contains(&format!("authorization: Bearer {AWKWARD}")), "{:?}", seen.all());
    let alone = exec(None);
    let said = String::from_utf8_lossy(&alone.stderr);
    assert!(said.contains("without --database-url (or DATABASE_URL) this run reads no grants"), "{said}");
}

/// A grant naming the headers its secrets may go in swaps them into those
/// only: a placeholder in a header the server echoes goes out as it is.
async fn a_grant_naming_headers_keeps_a_secret_out_of_the_others(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let port = address.port();
    let key = SecretKey::generate().unwrap();
    db.store.secret_set("API_KEY", &key.seal("API_KEY", SECRET).unwrap()).await.unwrap();
    let (granting, _cache) = runtime(&db);
    let runtime = granting.with_secrets(secrets_from(db.dyn_store(), Some(key)));
    let fetcher = load(&runtime, "fetcher").await;
    let new = NewGrant {
        job_type: "fetcher".into(),
        origin: format!("http://127.0.0.1:{port}"),
        secrets: vec!["API_KEY".into()],
        secret_headers: vec!["authorization".into()],
        ..Default::default()
    };
    db.store.grant_set(&new).await.unwrap();
    let listed = db.store.grants(Some("fetcher")).await.unwrap();
    assert_eq!(listed[0].secret_headers, ["authorization"], "stored and read back");
    let headers = json!({"authorization": "Bearer ${API_KEY}", "x-request-id": "${API_KEY}"});
    let report =
        fetch(&runtime, &fetcher, json!({"url": format!("http://127.0.0.1:{port}/mirror"), "headers": headers})).await;
    let output = completed_output(&report.outcome);
    assert_eq!(output["status"], 200, "{output}");
    assert!(seen.all().contains(&format!("mirrored authorization: Bearer {SECRET}")), "{:?}", seen.all());
    let body: Value = serde_json::from_str(output["body"].as_str().unwrap()).unwrap();
    let request_id = body["inner"]["headers"]["x-request-id"].as_str().unwrap();
    assert!(request_id.starts_with("jobhost-secret-"), "echoed as the placeholder: {request_id}");
    let received = seen.all().into_iter().find(|line| line.starts_with("mirrored x-request-id: ")).unwrap();
    assert!(
        received.starts_with("mirrored x-request-id: jobhost-secret-"),
        "the server got the placeholder: {received}"
    );
}

/// A value with characters every encoding changes: JSON escapes `"` and
/// `\\`, percent-encoding everything but letters and digits, and `/` is
/// escaped by some JSON writers.
const AWKWARD: &str = "sk_live/4eC3\\9\"Hq y&T1zdp";

/// Grants `API_KEY` (valued [`AWKWARD`]) to the mirror's origin in the
/// headers, the query and the body, and lets `localhost` on the same port
/// be reached without it: the runtime, and the fetcher loaded on it.
async fn mirror_granted(
    db: &TestDb,
    port: u16,
    key: &SecretKey,
) -> (Runtime, jobhost::component::LoadedComponent, tempfile::TempDir) {
    db.store.secret_set("API_KEY", &key.seal("API_KEY", AWKWARD).unwrap()).await.unwrap();
    let (granting, cache) = runtime(db);
    let runtime = granting.with_secrets(secrets_from(db.dyn_store(), Some(key.clone())));
    let fetcher = load(&runtime, "fetcher").await;
    let new = NewGrant {
        job_type: "fetcher".into(),
        origin: format!("http://127.0.0.1:{port}"),
        secrets: vec!["API_KEY".into()],
        secrets_in: vec!["query".into(), "body".into()],
        ..Default::default()
    };
    db.store.grant_set(&new).await.unwrap();
    grant(db, &format!("http://localhost:{port}"), &[], true).await;
    (runtime, fetcher, cache)
}

/// The request that sends the secret everywhere a grant lets it go, to a
/// server that echoes it everywhere; the guest logs the answer, returns it
/// reversed and base64-encoded, and posts it on to `localhost`.
fn leaking_request(port: u16) -> Value {
    json!({
        "url": format!("http://127.0.0.1:{port}/mirror?key=${{API_KEY}}"),
        "method": "POST",
        "headers": {"authorization": "Bearer ${API_KEY}", "x-request-id": "${API_KEY}", "accept-encoding": "gzip"},
        "body": "{\"key\": \"${API_KEY}\"}",
        "log_answer": true,
        "encode": true,
        "forward": format!("http://localhost:{port}/capture"),
    })
}

/// Whether `text` holds the value in any form the tests know: as it is,
/// JSON-escaped once or twice, or percent-encoded.
fn holds_value(text: &str) -> bool {
    jobhost::outbound::redact::forms(AWKWARD).iter().any(|form| text.contains(form.as_str()))
}

/// A server that echoes the secret back in its headers and its body (as
/// JSON, JSON in JSON, JSON in JSON in JSON, split across frames) hands the
/// guest only the placeholder: what the guest computes from the answer
/// (reversed, base64), logs, returns and sends onward holds no value.
async fn a_server_echoing_a_secret_hands_the_guest_only_its_placeholder(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let port = address.port();
    let (runtime, fetcher, _cache) = mirror_granted(&db, port, &SecretKey::generate().unwrap()).await;
    let report = fetch(&runtime, &fetcher, leaking_request(port)).await;
    let output = completed_output(&report.outcome);
    assert_eq!(output["status"], 200, "{output}");
    assert_eq!(output["forwarded"], 200, "{output}");

    // The value went out to the server the grant names.
    let seen = seen.all();
    assert!(seen.contains(&format!("mirrored authorization: Bearer {AWKWARD}")), "{seen:?}");
    // The guest held placeholders only: the echoed header, the query and
    // the body came back as the placeholder the guest sent.
    let echoed = output["headers"]["x-echo-authorization"].as_str().unwrap();
    assert!(echoed.starts_with("Bearer jobhost-secret-"), "{echoed}");
    let body: Value = serde_json::from_str(output["body"].as_str().unwrap()).unwrap();
    let inner = &body["inner"];
    assert_eq!(inner["headers"]["authorization"].as_str().unwrap(), echoed, "{inner}");
    assert!(inner["query"].as_str().unwrap().starts_with("key=jobhost-secret-"), "{inner}");
    assert!(inner["body"].as_str().unwrap().contains("jobhost-secret-"), "{inner}");
    assert_eq!(inner["headers"]["accept-encoding"], "identity", "an echo comes back searchable: {inner}");
    let twice: Value = serde_json::from_str(body["twice"].as_str().unwrap()).unwrap();
    let nested: Value = serde_json::from_str(twice["nested"].as_str().unwrap()).unwrap();
    assert_eq!(nested["headers"]["x-request-id"].as_str().unwrap(), output["headers"]["x-echo-x-request-id"]);

    // Nothing the guest made of it holds the value, in any form it could compute.
    let reversed: String = output["reversed"].as_str().unwrap().chars().rev().collect();
    let decoded = String::from_utf8(base64_decode(output["base64"].as_str().unwrap())).unwrap();
    for (what, text) in [("reversed", reversed), ("base64", decoded), ("report", format!("{report:?}"))] {
        assert!(text.contains("jobhost-secret-"), "{what}: the answer is in it");
        assert!(!holds_value(&text), "{what} holds the value: {text}");
    }
    let forwarded = seen.iter().find(|line| line.starts_with("body: ")).unwrap();
    assert!(forwarded.contains("jobhost-secret-") && !holds_value(forwarded), "sent onward: {forwarded}");
    assert!(logged(&report).contains("answer {"), "the guest logged the answer");

    // A body encoded although the request asked for none cannot be
    // searched: the guest gets an error, not the bytes.
    let encoded = fetch(&runtime, &fetcher, json!({"url": format!("http://127.0.0.1:{port}/gzipped")})).await;
    let error = completed_output(&encoded.outcome)["error"].clone();
    assert!(error.as_str().unwrap_or_default().contains("HttpResponseContentCoding"), "{error}");
}

/// The host's own log, in its text and JSON formats, and the spans it
/// exports hold no form of the value while a guest logs a server's echo of
/// the secret whole (the line reaches the host's log), returns it and
/// sends it on.
async fn the_hosts_log_and_spans_hold_no_secret_a_server_echoes(db: TestDb) {
    let Server { address, .. } = server().await;
    let port = address.port();
    let key = SecretKey::generate().unwrap();
    let _granted = mirror_granted(&db, port, &key).await;
    let (spans_url, spans) = span_receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let components = dir.path().join("components");
    std::fs::create_dir(&components).unwrap();
    std::fs::copy(common::guest("fetcher"), components.join("fetcher.wasm")).unwrap();
    for format in ["text", "json"] {
        let log = dir.path().join(format!("{format}.log"));
        let mut host = std::process::Command::new(env!("CARGO_BIN_EXE_jobhost"))
            .args(["run", "--components", components.to_str().unwrap(), "--log-format", format])
            .args(["--otlp-endpoint", &spans_url, "--cache-dir", dir.path().join("cache").to_str().unwrap()])
            .env("DATABASE_URL", &db.url)
            .env("JOBHOST_SECRET_KEY", key.to_hex())
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // The guest logs each header it sends: one carries the value itself,
        // from the payload, so only the redaction keeps it out of the log.
        let mut payload = leaking_request(port);
        payload["headers"]["x-literal"] = json!(AWKWARD);
        let params = jobhost::store::EnqueueParams::new("fetcher", payload);
        // Accepted once the host has registered the type it loaded.
        let id = Arc::new(Mutex::new(None));
        common::eventually(Duration::from_secs(60), || {
            let (store, params, id) = (db.store.clone(), params.clone(), id.clone());
            async move {
                let enqueued = store.job_enqueue(&[params]).await.ok().map(|ids| ids[0]);
                *id.lock().unwrap() = enqueued;
                enqueued.is_some()
            }
        })
        .await;
        let id = id.lock().unwrap().unwrap();
        common::eventually(Duration::from_secs(60), || async {
            db.state_of(id).await == jobhost::store::JobState::Completed
        })
        .await;
        // A graceful stop flushes the spans.
        unsafe { libc::kill(host.id() as i32, libc::SIGTERM) };
        assert!(host.wait().unwrap().success());
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("answer {") && text.contains("jobhost-secret-"), "{format}: the echo is logged: {text}");
        assert!(text.contains("sending x-literal: [secret API_KEY]"), "{format}: the guest's line, redacted: {text}");
        assert!(!holds_value(&text), "{format}: the host's log holds the value: {text}");
    }
    let exported = spans.lock().unwrap().join("\n");
    assert!(exported.contains("run fetcher"), "spans were exported");
    assert!(!holds_value(&exported), "a span holds the value");
}

/// An OTLP/HTTP receiver on 127.0.0.1 keeping each export's bytes as text
/// (protobuf strings are UTF-8 as they are): its base URL, and the exports.
async fn span_receiver() -> (String, Arc<Mutex<Vec<String>>>) {
    let exports = Arc::new(Mutex::new(Vec::new()));
    let kept = exports.clone();
    let app = Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            kept.lock().unwrap().push(String::from_utf8_lossy(&body).into_owned());
            async { "" }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, exports)
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sextets: Vec<u32> =
        text.bytes().filter(|b| *b != b'=').map(|b| ALPHABET.iter().position(|a| *a == b).unwrap() as u32).collect();
    let mut out = Vec::new();
    for chunk in sextets.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, s)| n | s << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// A URL with a user name before `@` is refused before anything leaves;
/// what a server sees as `Host` is the origin the grant judged.
async fn a_url_with_userinfo_is_refused_and_host_is_the_judged_origin(db: TestDb) {
    let Server { address, .. } = server().await;
    let port = address.port();
    let (runtime, _cache) = runtime(&db);
    let fetcher = load(&runtime, "fetcher").await;
    grant(&db, &format!("http://127.0.0.1:{port}"), &[], false).await;
    let sneaky = format!("http://internal-admin.example:80@127.0.0.1:{port}/mirror");
    let refused = fetch(&runtime, &fetcher, json!({"url": sneaky})).await;
    assert_eq!(
        completed_output(&refused.outcome)["error"],
        "ErrorCode::HttpRequestUriInvalid",
        "{:?}",
        refused.outcome
    );
    assert!(logged(&refused).contains("user name or password"), "{}", logged(&refused));
    // The guest writes the name in capitals; the server sees the origin
    // as judged.
    grant(&db, &format!("http://localhost:{port}"), &[], true).await;
    let plain = fetch(&runtime, &fetcher, json!({"url": format!("http://LOCALHOST:{port}/mirror")})).await;
    let output = completed_output(&plain.outcome);
    assert_eq!(output["headers"]["x-echo-host"], format!("localhost:{port}"), "{output}");
}

/// The run's body budget counts what goes on the wire: a 16 KB secret
/// swapped into a body many times stops at the budget as sent, not as the
/// guest wrote it (placeholders of 47 bytes).
async fn a_body_budget_counts_bytes_as_sent_after_the_swap(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let port = address.port();
    let key = SecretKey::generate().unwrap();
    let large = "k".repeat(16 << 10);
    db.store.secret_set("API_KEY", &key.seal("API_KEY", &large).unwrap()).await.unwrap();
    let cache = tempfile::tempdir().unwrap();
    let budgeted = RuntimeConfig { outbound_budget_bytes: 1 << 20, ..common::runtime_config(&cache) };
    let runtime = Runtime::new(budgeted)
        .unwrap()
        .with_grants(grants_from(db.dyn_store()))
        .with_secrets(secrets_from(db.dyn_store(), Some(key)));
    let fetcher = load(&runtime, "fetcher").await;
    let new = NewGrant {
        job_type: "fetcher".into(),
        origin: format!("http://127.0.0.1:{port}"),
        secrets: vec!["API_KEY".into()],
        secrets_in: vec!["body".into()],
        ..Default::default()
    };
    db.store.grant_set(&new).await.unwrap();
    // 200 placeholders, each with 4,000 bytes beside it: 809 KB as
    // written, within the budget; 4 MB as sent, past it.
    let body = format!("${{API_KEY}}{}", " ".repeat(4000)).repeat(200);
    let report = fetch(
        &runtime,
        &fetcher,
        json!({"url": format!("http://127.0.0.1:{port}/upload"), "method": "POST", "body": body}),
    )
    .await;
    let calls = &report.effects.outbound;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(calls[0].request_bytes <= 1 << 20, "counted as sent, within the budget: {:?}", calls[0]);
    assert!(calls[0].request_bytes > 900 << 10, "counted as sent, up to the budget: {:?}", calls[0]);
    let error = calls[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("outbound budget"), "{:?}", calls[0]);
    assert!(
        !seen.all().iter().any(|line| line.starts_with("uploaded Ok")),
        "the upload never completed: {:?}",
        seen.all()
    );
}

/// A server that never answers fails the request at the grant's
/// first-byte timeout, and a response body that pauses longer than the
/// grant's between-bytes timeout fails the read at that bound (the host's
/// defaults are 30 s; the guest asks for a minute, which cannot raise it);
/// the request's record says how far it got.
async fn a_silent_server_and_a_paused_body_fail_at_the_grants_timeouts(db: TestDb) {
    let Server { address, .. } = server().await;
    let (runtime, _cache) = runtime(&db);
    let fetcher = load(&runtime, "fetcher").await;
    let origin = format!("http://127.0.0.1:{}", address.port());
    let timeouts = GrantTimeouts { between_bytes_ms: Some(200), first_byte_ms: Some(300), ..Default::default() };
    let new = NewGrant { job_type: "fetcher".into(), origin: origin.clone(), timeouts, ..Default::default() };
    db.store.grant_set(&new).await.unwrap();
    // A server that never answers: the grant's first-byte timeout.
    let started = std::time::Instant::now();
    let silent = fetch(&runtime, &fetcher, json!({"url": format!("{origin}/hang")})).await;
    assert!(started.elapsed() < Duration::from_secs(20), "timed out by the 30 s default: {:?}", started.elapsed());
    assert_eq!(completed_output(&silent.outcome), json!({"error": "ErrorCode::ConnectionReadTimeout"}));
    let started = std::time::Instant::now();
    let report =
        fetch(&runtime, &fetcher, json!({"url": format!("{origin}/trickle"), "between_bytes_ms": 60_000})).await;
    assert!(started.elapsed() < Duration::from_secs(20), "timed out by the 30 s default: {:?}", started.elapsed());
    let output = completed_output(&report.outcome);
    let error = output["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("reading the body after 3 bytes"), "{output}");
    let call = &report.effects.outbound[0];
    assert_eq!((call.status, call.response_bytes), (Some(200), 3));
    let why = call.error.as_deref().unwrap_or_default();
    assert_eq!(why, "ConnectionReadTimeout reading the response body", "{call:?}");
    assert!(logged(&report).contains("200, 3 bytes, then ConnectionReadTimeout"), "{}", logged(&report));
}

/// One run sending 100 requests at once has 16 in flight; the other 84
/// fail at once in the guest and never reach the server.
async fn a_run_has_at_most_16_requests_in_flight(db: TestDb) {
    let Server { address, seen, mut waiting, release, .. } = server().await;
    let (runtime, _cache) = runtime(&db);
    let fetcher = load(&runtime, "fetcher").await;
    let origin = format!("http://127.0.0.1:{}", address.port());
    grant(&db, &origin, &[], false).await;
    let request = json!({"url": format!("{origin}/wait"), "parallel": 100}).to_string();
    let progress = LiveProgress::new();
    let run = {
        let progress = progress.clone();
        tokio::spawn(async move {
            runtime.run_reporting(&fetcher, &context(41, 1), &request, StopSignal::new(), progress).await
        })
    };
    for arrived in 0..16 {
        tokio::time::timeout(Duration::from_secs(30), waiting.recv()).await.unwrap_or_else(|_| panic!("{arrived}"));
    }
    // Released only once the guest has sent all 100: none answered before.
    common::eventually(Duration::from_secs(30), || {
        let sent = progress.take_changed() == Some((100, 100));
        async move { sent }
    })
    .await;
    release.send(true).unwrap();
    let report = run.await.unwrap();
    let answers = completed_output(&report.outcome);
    let answers = answers.as_array().unwrap();
    assert_eq!(answers.len(), 100);
    let answered = answers.iter().filter(|a| a["status"] == 200).count();
    let capped = answers.iter().filter(|a| a["error"] == "ErrorCode::ConnectionLimitReached").count();
    assert_eq!((answered, capped), (16, 84), "{answers:?}");
    assert_eq!(seen.all().len(), 16, "only the requests in flight reached the server");
    assert!(logged(&report).contains("this run has 16 requests in flight already"), "{}", logged(&report));
}

/// A request body past the run's outbound budget stops there: the guest's
/// request fails, the record names the budget, and the server never
/// receives the whole body.
async fn an_upload_past_the_outbound_budget_stops_at_it(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let cache = tempfile::tempdir().unwrap();
    let config = RuntimeConfig { outbound_budget_bytes: 1 << 20, ..common::runtime_config(&cache) };
    let runtime = Runtime::new(config).unwrap().with_grants(grants_from(db.dyn_store()));
    let fetcher = load(&runtime, "fetcher").await;
    let origin = format!("http://127.0.0.1:{}", address.port());
    grant(&db, &origin, &[], false).await;
    let request = json!({"url": format!("{origin}/upload"), "method": "POST", "upload_bytes": 4 << 20});
    let report = fetch(&runtime, &fetcher, request).await;
    let output = completed_output(&report.outcome);
    assert!(output["error"].is_string(), "{output}");
    let call = &report.effects.outbound[0];
    assert!(call.request_bytes <= 1 << 20, "{call:?}");
    let why = call.error.as_deref().unwrap_or_default();
    assert_eq!(why, "the run's outbound budget of 1048576 bytes ran out sending the request body", "{call:?}");
    assert!(!seen.all().iter().any(|line| line == &format!("uploaded Ok({})", 4 << 20)), "{:?}", seen.all());
}

/// A job type's plain variables are in its runs' environment; a variable
/// named like a secret the component declares yields to the placeholder.
async fn a_type_variable_reaches_its_runs_and_yields_to_a_secret(db: TestDb) {
    let Server { address, .. } = server().await;
    let (runtime, _cache) = runtime(&db);
    let runtime = runtime.with_variables(variables_from(db.dyn_store()));
    db.store.var_set("fetcher", "REGION", "eu-west").await.unwrap();
    db.store.var_set("fetcher", "API_KEY", "plain-value").await.unwrap();
    db.store.var_set("other", "REGION", "us-east").await.unwrap();
    let fetcher = load(&runtime, "fetcher").await;
    let origin = format!("http://127.0.0.1:{}", address.port());
    let headers = json!({"x-region": "${REGION}", "x-key": "${API_KEY}"});
    let report = fetch(&runtime, &fetcher, json!({"url": format!("{origin}/"), "headers": headers})).await;
    let log = logged(&report);
    assert!(log.contains("sending x-region: eu-west"), "{log}");
    assert!(log.contains("sending x-key: jobhost-secret-"), "{log}");
    assert!(!log.contains("plain-value"), "{log}");
}

/// A grant may let its secrets go in the query string (percent-encoded)
/// and the body too (swapped as it streams); without that, a placeholder
/// there goes out as it is.
async fn a_grant_may_let_secrets_go_in_the_query_and_body(db: TestDb) {
    let Server { address, seen, .. } = server().await;
    let key = SecretKey::generate().unwrap();
    db.store.secret_set("API_KEY", &key.seal("API_KEY", "k&y 1").unwrap()).await.unwrap();
    let (granting, _cache) = runtime(&db);
    let runtime = granting.with_secrets(secrets_from(db.dyn_store(), Some(key)));
    let fetcher = load(&runtime, "fetcher").await;
    let origin = format!("http://127.0.0.1:{}", address.port());
    let request = json!({
        "url": format!("{origin}/capture?key=${{API_KEY}}&x=1"),
        "method": "POST",
        "body": format!("{{\"key\": \"${{API_KEY}}\", \"pad\": \"{}\"}}", "p".repeat(10_000)),
    });
    for (places, query, body) in [
        (vec![], "key=jobhost-secret-", "{\"key\": \"jobhost-secret-"),
        (vec!["query".to_string(), "body".to_string()], "key=k%26y%201&x=1", "{\"key\": \"k&y 1\", \"pad\""),
    ] {
        let new = NewGrant {
            job_type: "fetcher".into(),
            origin: origin.clone(),
            secrets: vec!["API_KEY".into()],
            secrets_in: places.clone(),
            ..Default::default()
        };
        db.store.grant_set(&new).await.unwrap();
        let report = fetch(&runtime, &fetcher, request.clone()).await;
        assert_eq!(completed_output(&report.outcome)["status"], 200, "{places:?}");
        let lines = seen.all();
        let sent_query = lines.iter().rev().find(|l| l.starts_with("query: ")).unwrap();
        let sent_body = lines.iter().rev().find(|l| l.starts_with("body: ")).unwrap();
        assert!(sent_query.starts_with(&format!("query: {query}")), "{places:?}: {sent_query}");
        assert!(sent_body.starts_with(&format!("body: {body}")), "{places:?}: {}", &sent_body[..80]);
        assert_eq!(sent_body.matches('p').count(), 10_000 + 1, "{places:?}: the body arrived whole");
    }
}

/// A run whose grants cannot be read (the database unreachable, a pool
/// drained) does not start: it is retried, saying why, instead of running
/// with every request refused as if nothing were granted.
#[tokio::test]
async fn a_run_whose_grants_cannot_be_read_is_retried_not_refused() {
    let (runtime, _cache) = common::runtime();
    let unreadable: jobhost::component::GrantSource =
        Arc::new(|_| Box::pin(async { Err("pool timed out while waiting for an open connection".to_string()) }));
    let runtime = runtime.with_grants(unreadable);
    let fetcher = load(&runtime, "fetcher").await;
    let report = fetch(&runtime, &fetcher, json!({"url": "http://127.0.0.1:9/never"})).await;
    match &report.outcome {
        jobhost::types::RunOutcome::Retry { reason } => assert_eq!(
            reason,
            "cannot read the outbound grants of job type fetcher: pool timed out while waiting for an open connection"
        ),
        other => panic!("expected a retry, got {other:?}"),
    }
    assert!(report.effects.outbound.is_empty(), "no request was tried");
}

/// The fetcher handler written in Rust (`guests/fetcher` over wasi:http
/// itself, `guests/rs_fetcher` through `jobhost_guest::http`), in Python
/// (`guests/python/py_fetcher`, through `jobhost_guest.http`) and in JavaScript
/// (`guests/js/js_fetcher`, through `fetch`) does the same: the server
/// receives the secret's value in the header, the output holds it redacted,
/// and a request declared but not granted is refused with the hint.
#[tokio::test]
async fn the_fetcher_in_rust_python_and_javascript_carries_a_secret_alike() {
    let db = TestDb::postgres().await;
    let Server { address, seen, .. } = server().await;
    let key = SecretKey::generate().unwrap();
    db.store.secret_set("API_KEY", &key.seal("API_KEY", SECRET).unwrap()).await.unwrap();
    let (granting, _cache) = runtime(&db);
    let runtime = granting.with_secrets(secrets_from(db.dyn_store(), Some(key)));
    let origin = format!("http://127.0.0.1:{}", address.port());
    for job_type in ["fetcher", "rs_fetcher", "py_fetcher", "js_fetcher"] {
        let component = load(&runtime, job_type).await;
        let new = NewGrant {
            job_type: job_type.into(),
            origin: origin.clone(),
            secrets: vec!["API_KEY".into()],
            ..Default::default()
        };
        db.store.grant_set(&new).await.unwrap();
        let headers = json!({"authorization": "Bearer ${API_KEY}"});
        let carried = fetch(&runtime, &component, json!({"url": format!("{origin}/echo"), "headers": headers})).await;
        let output = completed_output(&carried.outcome);
        assert_eq!(output["status"], 200, "{job_type}");
        let echoed = output["body"].as_str().unwrap_or_default();
        assert!(echoed.starts_with("Bearer jobhost-secret-"), "{job_type}: echoed back as the placeholder: {output}");
        assert_eq!(seen.all().last().unwrap(), &format!("authorization: Bearer {SECRET}"), "{job_type}");
        assert!(!format!("{carried:?}").contains(SECRET), "{job_type}: no value in the report");

        let refused = fetch(&runtime, &component, json!({"url": "https://api.example.com/v1"})).await;
        let output = completed_output(&refused.outcome);
        assert!(output["error"].is_string(), "{job_type}: {output}");
        if job_type != "js_fetcher" {
            // JavaScript's `fetch` says only that it failed; the others name the wasi:http error.
            assert_eq!(output["error"], json!("ErrorCode::HttpRequestDenied"), "{job_type}");
        }
        let hint = format!("`jobhost grant {job_type} https://api.example.com --methods GET` allows it");
        assert!(logged(&refused).contains(&hint), "{job_type}: {}", logged(&refused));
    }
}

/// A run whose variables are still being read (its host cut off from the
/// database: the read never answers) ends as soon as it is stopped, as the
/// fence stops it before its lease expires, without its guest starting;
/// not when the database answers again, after the job's next owner began.
#[tokio::test]
async fn a_run_stopped_while_its_variables_are_read_ends_at_once() {
    let (asked_tx, mut asked) = mpsc::unbounded_channel::<String>();
    let never_answers: jobhost::component::variables::VariableSource = Arc::new(move |job_type| {
        let _ = asked_tx.send(job_type);
        Box::pin(std::future::pending())
    });
    let (runtime, _cache) = common::runtime();
    let runtime = runtime.with_variables(never_answers);
    let hello = load(&runtime, "hello").await;
    let signal = StopSignal::new();
    let run = {
        let (runtime, signal) = (runtime.clone(), signal.clone());
        tokio::spawn(async move { runtime.run(&hello, &context(44, 1), r#"{"name": "Ada"}"#, signal).await })
    };
    assert_eq!(asked.recv().await.as_deref(), Some("hello"), "the run asked for its variables");
    signal.stop("lease could not be renewed before it expired");
    let report = tokio::time::timeout(Duration::from_secs(30), run).await.expect("ended once stopped").unwrap();
    assert_eq!(
        report.outcome,
        jobhost::types::RunOutcome::Crashed {
            crash: jobhost::types::Crash::Interrupted { reason: "lease could not be renewed before it expired".into() }
        }
    );
    assert!(report.effects.logs.is_empty(), "the guest never ran: {:?}", report.effects.logs);
}

on_both_backends!(
    a_grant_may_let_secrets_go_in_the_query_and_body,
    a_server_echoing_a_secret_hands_the_guest_only_its_placeholder,
    a_refusal_hint_run_as_printed_makes_the_request_go_through,
    a_grant_naming_headers_keeps_a_secret_out_of_the_others,
    exec_reads_a_fleets_grants_secrets_and_variables,
    the_hosts_log_and_spans_hold_no_secret_a_server_echoes,
    a_url_with_userinfo_is_refused_and_host_is_the_judged_origin,
    a_body_budget_counts_bytes_as_sent_after_the_swap,
    a_silent_server_and_a_paused_body_fail_at_the_grants_timeouts,
    a_run_has_at_most_16_requests_in_flight,
    an_upload_past_the_outbound_budget_stops_at_it,
    a_type_variable_reaches_its_runs_and_yields_to_a_secret,
    a_host_obeys_a_grant_changed_while_it_runs,
    retried_requests_repeat_their_idempotency_key,
    a_runs_requests_share_its_trace_id,
    a_secret_reaches_only_the_granted_origin_and_is_kept_nowhere,
    requests_go_out_only_when_declared_and_granted,
    a_name_resolving_to_loopback_needs_a_private_grant,
    a_stopped_run_closes_its_connection,
    runs_reuse_kept_connections,
);
