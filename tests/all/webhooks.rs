//! Inbound webhooks on a real server (docs/events.md, "Webhooks in"): a
//! request signed with the webhook's secret becomes an event that releases
//! the waits it matches, once; a bad signature, an old timestamp, an
//! unsigned request and a replay store nothing; no token is needed, and
//! refusals are counted in `/metrics`.

use crate::common;

use axum::http::Method;
use jobhost::http::HttpConfig;
use jobhost::outbound::secrets::SecretKey;
use jobhost::store::StepState;
use jobhost::store::webhook::Webhook;
use jobhost::webhook::{Style, sign};
use serde_json::json;

use common::db::{TestDb, on_both_backends};
use common::http::{TOKEN, TestServer};

const STRIPE_SECRET: &str = "whsec_stripe_test_secret";
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A server with a token and the hosts' key, and three webhooks: Stripe's
/// style (key `stripe.{type}`), GitHub's and Standard Webhooks'.
async fn serve(db: &TestDb, metrics: jobhost::metrics::Metrics) -> TestServer {
    let key = SecretKey::generate().unwrap();
    for (name, value) in
        [("stripe-signing", STRIPE_SECRET), ("gh-signing", "gh secret"), ("std-signing", STANDARD_SECRET)]
    {
        db.store.secret_set(name, &key.seal(name, value).unwrap()).await.unwrap();
    }
    for (name, style, secret, event_key) in [
        ("stripe", Style::Stripe, "stripe-signing", "stripe.{type}"),
        ("github", Style::Github, "gh-signing", "github.{action}"),
        ("svix", Style::Standard, "std-signing", "svix.{kind}"),
    ] {
        let webhook = Webhook {
            name: name.into(),
            event_key: event_key.into(),
            style,
            secret: secret.into(),
            tolerance_secs: 300,
            created_at: chrono::Utc::now(),
        };
        db.store.webhook_set(&webhook).await.unwrap();
    }
    let config = HttpConfig {
        token: Some(TOKEN.into()),
        secret_key: Some(key),
        ..HttpConfig::new("127.0.0.1:0".parse().unwrap())
    };
    TestServer::serving(&config, db.dyn_store(), metrics).await
}

async fn deliver(server: &TestServer, hook: &str, headers: &[(String, String)], body: &str) -> common::http::Answer {
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    server
        .send_with(Method::POST, &format!("/hooks/{hook}"), Some(("application/json", body.to_string())), &headers)
        .await
}

async fn a_signed_delivery_releases_its_wait_once_and_nothing_else_gets_in(db: TestDb) {
    db.store.job_types_register(&[(common::job_config("work"), "v1".into())]).await.unwrap();
    let workflow = serde_json::from_value(json!({"steps": [
        {"name": "paid", "job": "work", "payload": {"order": "pi_1"},
         "wait": {"event": "stripe.payment_intent.succeeded", "match": {"id": "{order}"}}}
    ]}))
    .unwrap();
    let id = db.store.workflow_create(&workflow).await.unwrap().id;
    let metrics = jobhost::metrics::Metrics::default();
    let server = serve(&db, metrics.clone()).await;
    let now = chrono::Utc::now().timestamp();
    let body = r#"{"id": "pi_1", "type": "payment_intent.succeeded", "amount": 1000}"#;

    let forged = sign(Style::Stripe, "not the secret", "", now, body.as_bytes());
    assert_eq!(deliver(&server, "stripe", &forged, body).await.status, 401, "a bad signature");
    let old = sign(Style::Stripe, STRIPE_SECRET, "", now - 3600, body.as_bytes());
    let answer = deliver(&server, "stripe", &old, body).await;
    assert_eq!(answer.status, 401, "an old timestamp: {}", answer.body);
    assert!(answer.body.contains("tolerance"), "{}", answer.body);
    assert_eq!(deliver(&server, "stripe", &[], body).await.status, 401, "unsigned");
    assert_eq!(deliver(&server, "nobody", &[], body).await.status, 404);
    assert!(db.store.event_list(None, 10).await.unwrap().is_empty(), "nothing refused was stored");
    let state = |db: &TestDb| {
        let db = db.dyn_store();
        async move { db.workflow_get(id).await.unwrap().unwrap().steps[0].state }
    };
    assert_eq!(state(&db).await, StepState::Waiting);

    let signed = sign(Style::Stripe, STRIPE_SECRET, "", now, body.as_bytes());
    let answer = deliver(&server, "stripe", &signed, body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!((answer.json()["released"].clone(), answer.json()["duplicate"].clone()), (json!(1), json!(false)));
    assert_eq!(state(&db).await, StepState::Available);
    // A replay of the same delivery, even signed again, is a duplicate.
    let again = sign(Style::Stripe, STRIPE_SECRET, "", now + 1, body.as_bytes());
    let replay = deliver(&server, "stripe", &again, body).await;
    assert_eq!((replay.status.as_u16(), replay.json()["duplicate"].clone()), (200, json!(true)));
    let events = db.store.event_list(None, 10).await.unwrap();
    assert_eq!(events.len(), 1, "one event for the delivery and its replay");
    assert_eq!(events[0].key, "stripe.payment_intent.succeeded");
    assert_eq!(events[0].source, "webhook:stripe");
    assert_eq!(events[0].payload["amount"], 1000);

    let scrape = server.get("/metrics").await.body;
    for (outcome, n) in [("bad_signature", 1), ("stale", 1), ("unsigned", 1), ("accepted", 1), ("duplicate", 1)] {
        let line = format!("jobhost_webhook_requests_total{{webhook=\"stripe\",outcome=\"{outcome}\"}} {n}");
        assert!(scrape.contains(&line), "{line} in:\n{scrape}");
    }
}

async fn github_and_standard_webhooks_signatures_verify_and_a_body_must_name_its_key(db: TestDb) {
    let server = serve(&db, jobhost::metrics::Metrics::default()).await;
    let now = chrono::Utc::now().timestamp();
    let body = r#"{"action": "opened", "number": 7}"#;
    let signed = sign(Style::Github, "gh secret", "delivery-1", now, body.as_bytes());
    let answer = deliver(&server, "github", &signed, body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let body = r#"{"kind": "invoice.paid", "n": 1}"#;
    let signed = sign(Style::Standard, STANDARD_SECRET, "msg_1", now, body.as_bytes());
    assert_eq!(deliver(&server, "svix", &signed, body).await.status, 200);
    let stale = sign(Style::Standard, STANDARD_SECRET, "msg_2", now - 600, body.as_bytes());
    assert_eq!(deliver(&server, "svix", &stale, body).await.status, 401);
    let keys: Vec<String> = db.store.event_list(None, 10).await.unwrap().into_iter().map(|e| e.key).collect();
    assert_eq!(keys, ["svix.invoice.paid", "github.opened"]);
    // Signed, but no field for the key, or no object at all: refused, nothing stored.
    let body = r#"{"number": 8}"#;
    let signed = sign(Style::Github, "gh secret", "delivery-2", now, body.as_bytes());
    assert_eq!(deliver(&server, "github", &signed, body).await.status, 400);
    let body = "[1]";
    let signed = sign(Style::Github, "gh secret", "delivery-3", now, body.as_bytes());
    assert_eq!(deliver(&server, "github", &signed, body).await.status, 400);
    assert_eq!(db.store.event_list(None, 10).await.unwrap().len(), 2);
}

on_both_backends!(
    a_signed_delivery_releases_its_wait_once_and_nothing_else_gets_in,
    github_and_standard_webhooks_signatures_verify_and_a_body_must_name_its_key,
);

/// Without the hosts' key, or with its secret unset, a webhook cannot
/// verify and says so (503), accepting nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_cannot_verify_accepts_nothing() {
    let db = TestDb::sqlite().await;
    let webhook = Webhook {
        name: "orphan".into(),
        event_key: "k".into(),
        style: Style::Github,
        secret: "never-set".into(),
        tolerance_secs: 300,
        created_at: chrono::Utc::now(),
    };
    db.store.webhook_set(&webhook).await.unwrap();
    for key in [None, Some(SecretKey::generate().unwrap())] {
        let config = HttpConfig { secret_key: key, ..HttpConfig::new("127.0.0.1:0".parse().unwrap()) };
        let server = TestServer::serving(&config, db.dyn_store(), jobhost::metrics::Metrics::default()).await;
        let signed = sign(Style::Github, "anything", "d", 0, b"{}");
        let answer = deliver(&server, "orphan", &signed, "{}").await;
        assert_eq!(answer.status, 503, "{}", answer.body);
    }
    assert!(db.store.event_list(None, 10).await.unwrap().is_empty());
    let bad = Webhook { name: "a/b".into(), ..webhook };
    assert!(db.store.webhook_set(&bad).await.is_err(), "a name that is no path segment");
}

/// A body past the server's bound is refused (413) before it is verified
/// or read as JSON, however well it is signed, and nothing is stored; one
/// within the bound is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_delivery_is_refused_and_stores_nothing() {
    let db = TestDb::sqlite().await;
    let key = SecretKey::generate().unwrap();
    db.store.secret_set("gh-signing", &key.seal("gh-signing", "gh secret").unwrap()).await.unwrap();
    let webhook = Webhook {
        name: "github".into(),
        event_key: "github.{action}".into(),
        style: Style::Github,
        secret: "gh-signing".into(),
        tolerance_secs: 300,
        created_at: chrono::Utc::now(),
    };
    db.store.webhook_set(&webhook).await.unwrap();
    let config =
        HttpConfig { secret_key: Some(key), max_body_bytes: 4096, ..HttpConfig::new("127.0.0.1:0".parse().unwrap()) };
    let server = TestServer::serving(&config, db.dyn_store(), jobhost::metrics::Metrics::default()).await;
    let large = json!({"action": "opened", "text": "x".repeat(8192)}).to_string();
    let signed = sign(Style::Github, "gh secret", "delivery-1", 0, large.as_bytes());
    let answer = deliver(&server, "github", &signed, &large).await;
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert!(db.store.event_list(None, 10).await.unwrap().is_empty(), "nothing stored");
    let small = json!({"action": "opened"}).to_string();
    let signed = sign(Style::Github, "gh secret", "delivery-2", 0, small.as_bytes());
    assert_eq!(deliver(&server, "github", &signed, &small).await.status, 200);
    assert_eq!(db.store.event_list(None, 10).await.unwrap().len(), 1);
}
