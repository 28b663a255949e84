//! Outbound HTTP from a real component (`guests/fetcher`, through the
//! standard wasi:http interface) to servers these tests start on
//! 127.0.0.1: a request goes out only when the component declares it and
//! a grant in the database allows it, a refusal leaves the fix in the
//! job's log, private addresses need a grant that says so, a grant changed
//! between runs is obeyed by the next, and a run stopped mid-request closes
//! its connection at once. Refusals of addresses the tests cannot start a
//! server on are checked as pure functions in `src/outbound/`.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::routing::any;
use jobhost::component::{Runtime, StopSignal, grants_from, secrets_from};
use jobhost::outbound::secrets::SecretKey;
use jobhost::store::grant::NewGrant;
use jobhost::types::RunReport;
use serde_json::{Value, json};
use tokio::sync::mpsc;

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

/// A server on 127.0.0.1 answering `pong PATH` to everything, except
/// `/hang`, which never answers (and says when its client goes away).
async fn server() -> (SocketAddr, Seen, mpsc::UnboundedReceiver<()>, mpsc::UnboundedReceiver<()>) {
    let seen = Seen::default();
    let (hung_tx, hung) = mpsc::unbounded_channel();
    let (closed_tx, closed) = mpsc::unbounded_channel();
    let recorder = seen.clone();
    let app = Router::new().fallback(any(move |request: Request| {
        let (recorder, hung_tx, closed_tx) = (recorder.clone(), hung_tx.clone(), closed_tx.clone());
        async move {
            let path = request.uri().path().to_string();
            recorder.0.lock().unwrap().push(format!("{} {path}", request.method()));
            if path == "/headers" {
                let header = |name: &str| request.headers().get(name).map(|v| v.to_str().unwrap().to_string());
                return json!({"idempotency-key": header("idempotency-key"), "traceparent": header("traceparent")})
                    .to_string();
            }
            if path == "/echo" {
                let header = request.headers().get("authorization").map(|v| v.to_str().unwrap().to_string());
                let header = header.unwrap_or_default();
                recorder.0.lock().unwrap().push(format!("authorization: {header}"));
                return header;
            }
            if path == "/hang" {
                let _guard = Hung(closed_tx);
                let _ = hung_tx.send(());
                std::future::pending::<()>().await;
            }
            format!("pong {path}")
        }
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (address, seen, hung, closed)
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
    let (address, seen, _, _) = server().await;
    let (runtime, _cache) = runtime(&db);
    let fetcher = load(&runtime, "fetcher").await;
    let port = address.port();
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");

    // Declared, not granted: refused in the guest, the fix in the log.
    let refused = fetch(&runtime, &fetcher, json!({"url": url("/one")})).await;
    assert_eq!(completed_output(&refused.outcome), json!({"error": "ErrorCode::HttpRequestDenied"}));
    let hint = format!(
        "GET http://127.0.0.1:{port} refused: not granted; `jobhost grant fetcher http://127.0.0.1:* --methods GET,POST --secret API_KEY` allows it"
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
    let (address, seen, _, _) = server().await;
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
    let (address, _seen, mut hung, mut closed) = server().await;
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

/// A grant may ask for an Idempotency-Key: the same on every attempt of
/// one job, another for another job. Every request carries a traceparent.
async fn retried_requests_repeat_their_idempotency_key(db: TestDb) {
    let (address, _seen, _, _) = server().await;
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

/// Through a running host and its database: a grant and a revoke made
/// while it runs are obeyed from the next run on, with no restart, and the
/// stored job keeps the request in its log.
async fn a_host_obeys_a_grant_changed_while_it_runs(db: TestDb) {
    let (address, seen, _, _) = server().await;
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
    let (address, seen, _, _) = server().await;
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
    assert_eq!(output["body"], "Bearer [secret API_KEY]", "echoed back, redacted: {output}");
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

on_both_backends!(
    a_host_obeys_a_grant_changed_while_it_runs,
    retried_requests_repeat_their_idempotency_key,
    a_secret_reaches_only_the_granted_origin_and_is_kept_nowhere,
    requests_go_out_only_when_declared_and_granted,
    a_name_resolving_to_loopback_needs_a_private_grant,
    a_stopped_run_closes_its_connection,
);
