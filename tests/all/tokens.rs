//! Named tokens with roles (docs/http.md, "Access"): each route answers
//! each role as its row in the route table says, a token limited to queues
//! changes only their jobs, and a revoked or expired token is refused from
//! its next request on every server, its sessions with it.

use crate::common;

use axum::http::{Method, StatusCode};
use jobhost::http::{Need, ROUTES};
use jobhost::store::token::{Created, NewToken, Role};
use jobhost::store::{EnqueueParams, JobState, NewBatch};
use serde_json::json;
use sha2::{Digest, Sha256};

use common::db::{TestDb, jobhost, on_both_backends};
use common::http::{TOKEN, TestServer};
use common::job_config;

/// Makes a token named `name` with `role`, limited to `queues`, and
/// returns its value.
pub(crate) async fn token(db: &TestDb, name: &str, role: Role, queues: Option<&[&str]>) -> String {
    token_seeing(db, name, role, queues, false).await
}

/// [`token`], shown payloads if `payloads`.
async fn token_seeing(db: &TestDb, name: &str, role: Role, queues: Option<&[&str]>, payloads: bool) -> String {
    let value = format!("jh_test_{name}_{role}_{}", "7f3a9c".repeat(8));
    let made = NewToken {
        name: name.into(),
        digest: hex::encode(Sha256::digest(value.as_bytes())),
        role,
        queues: queues.map(|q| q.iter().map(|q| q.to_string()).collect()),
        payloads,
        expires_at: None,
        created_by: "tests@here".into(),
    };
    assert_eq!(db.store.token_create(&made).await.unwrap(), Created::Made);
    value
}

/// A route's path with its parameters filled in.
fn concrete(path: &str, job: i64, batch: i64, workflow: i64) -> String {
    let id = if path.contains("batches") {
        batch
    } else if path.contains("workflows") {
        workflow
    } else {
        job
    };
    path.replace("{id}", &id.to_string())
        .replace("{name}", "default")
        .replace("{job_type}", "mail")
        .replace("{job}", "mail")
        .replace("{key}", "acme")
        .replace("{verb}", "pause")
        .replace("{action}", "pause")
}

/// Signs in to the dashboard with `value`: the session's cookie, and the
/// CSRF token its pages carry.
pub(crate) async fn sign_in(server: &TestServer, value: &str) -> (String, String) {
    let form = format!("token={value}&return_to=%2F");
    let answer = server.send(Method::POST, "/login", Some(("application/x-www-form-urlencoded", form)), None).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let cookie = answer
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("jobhost_session_"))
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    let page = server.send_with(Method::GET, "/", None, &[("cookie", &cookie)]).await;
    let csrf = page.body.split("name=\"csrf\" value=\"").nth(1).expect("a form with the CSRF token");
    let csrf = csrf.split('"').next().unwrap().to_string();
    (cookie, csrf)
}

async fn every_route_answers_each_role_as_its_row_says(db: TestDb) {
    db.store.job_types_register(&[(job_config("mail"), "v1".to_string())]).await.unwrap();
    let job = db.enqueue_new("mail", json!({})).await;
    let (batch, _) =
        db.store.batch_create(&NewBatch::default(), &[EnqueueParams::new("mail", json!({}))]).await.unwrap();
    let steps = vec![jobhost::store::NewStep::new("only", "mail", json!({}))];
    let workflow = db.store.workflow_create(&jobhost::store::NewWorkflow { label: None, steps }).await.unwrap().id;
    let schedule = jobhost::store::keyed_schedule::KeyedSchedule::new("mail", "acme", "0 0 9 * * *");
    db.store.keyed_schedule_upsert(&schedule).await.unwrap();
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let mut holders = vec![];
    for role in Role::ALL {
        holders.push((role, token(&db, role.as_str(), role, None).await));
    }
    let mut checked = 0;
    for (method, path, need) in ROUTES {
        let Need::Role(needs) = need else { continue };
        let url = concrete(path, job, batch, workflow);
        let method: Method = method.parse().unwrap();
        for (role, value) in &holders {
            let answer = if path.starts_with("/api") {
                let body = json!({"job": "mail", "state": "failed", "cron": "0 0 9 * * *"}).to_string();
                server.send(method.clone(), &url, Some(("application/json", body)), Some(value)).await
            } else {
                let (cookie, csrf) = sign_in(&server, value).await;
                let body = Some(("application/x-www-form-urlencoded", format!("csrf={csrf}")));
                server.send_with(method.clone(), &url, body, &[("cookie", &cookie)]).await
            };
            if role < needs {
                assert_eq!(answer.status, StatusCode::FORBIDDEN, "{method} {path} as {role}: {}", answer.body);
                // As JSON escapes it, or HTML.
                let said = answer.body.replace("\\\"", "\"").replace("&quot;", "\"");
                let needed = format!("this needs the {needs} role; the token \"{role}\" has {role}");
                assert!(said.contains(&needed), "{method} {path} as {role}: {}", answer.body);
            } else {
                assert!(
                    ![StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&answer.status),
                    "{method} {path} as {role} answers {}: {}",
                    answer.status,
                    answer.body
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 200, "{checked} requests");
    // The server's own token is an admin: it deploys and writes schedules.
    let put = json!({"cron": "0 0 9 * * *"}).to_string();
    let answer =
        server.send(Method::PUT, "/api/schedules/mail/other", Some(("application/json", put)), Some(TOKEN)).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    // A reader's pages show no buttons that change things; an operator's do.
    let cancel = format!("action=\"/jobs/{job}/cancel\"");
    let job_page = format!("/jobs/{job}");
    for (role, value) in &holders {
        let (cookie, _) = sign_in(&server, value).await;
        let page = server.send_with(Method::GET, &job_page, None, &[("cookie", &cookie)]).await;
        assert_eq!(page.status, StatusCode::OK);
        let state = db.store.job_get(job).await.unwrap().unwrap().row.state;
        if state != JobState::Available {
            break;
        }
        assert_eq!(page.body.contains(&cancel), *role >= Role::Operate, "{role}'s page of an available job");
        assert!(page.body.contains(&format!("{} · {}", role.as_str(), role.as_str())), "who is signed in");
    }
}

async fn a_token_limited_to_queues_changes_only_their_jobs(db: TestDb) {
    db.store.job_types_register(&[(job_config("mail"), "v1".to_string())]).await.unwrap();
    let enqueue_in = |queue: &str| EnqueueParams { queue: Some(queue.into()), ..EnqueueParams::new("mail", json!({})) };
    let ids = db.store.job_enqueue_outcomes(&[enqueue_in("ours"), enqueue_in("theirs")]).await.unwrap();
    let [ours, theirs] = [ids[0].id(), ids[1].id()];
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let desk = token(&db, "desk", Role::Operate, Some(&["ours"])).await;
    let post = |path: String, body: serde_json::Value| {
        let server = &server;
        let desk = &desk;
        async move { server.send(Method::POST, &path, Some(("application/json", body.to_string())), Some(desk)).await }
    };
    let refused = post(format!("/api/jobs/{theirs}/cancel"), json!({})).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(refused.body.contains("may not cancel a job in queue \\\"theirs\\\""), "{}", refused.body);
    for (path, body) in [
        ("/api/jobs/cancel".to_string(), json!({"state": "available"})),
        ("/api/jobs/cancel".to_string(), json!({"queue": "theirs"})),
        ("/api/queues/theirs/pause".to_string(), json!({})),
        ("/api/jobs".to_string(), json!({"job": "mail"})),
        ("/api/jobs".to_string(), json!({"job": "mail", "queue": "theirs"})),
        ("/api/jobs".to_string(), json!({"job": "mail", "queue": "ours", "batch": 1})),
        ("/api/workflows".to_string(), json!({"steps": [{"name": "a", "job": "mail"}]})),
        ("/api/events/k".to_string(), json!({})),
        ("/api/schedules/mail/acme/trigger".to_string(), json!({})),
    ] {
        let answer = post(path.clone(), body).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{path}: {}", answer.body);
    }
    assert_eq!(db.store.job_get(theirs).await.unwrap().unwrap().row.state, JobState::Available);
    assert!(db.store.job_stats().await.unwrap().paused_queues.is_empty());
    // Its own queue's jobs it changes.
    assert_eq!(post(format!("/api/jobs/{ours}/cancel"), json!({})).await.status, StatusCode::OK);
    assert_eq!(db.store.job_get(ours).await.unwrap().unwrap().row.state, JobState::Cancelled);
    let made = post("/api/jobs".into(), json!({"job": "mail", "queue": "ours"})).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert_eq!(post("/api/queues/ours/pause".into(), json!({})).await.status, StatusCode::OK);
    // The dashboard's forms are held to the same queues.
    let (cookie, csrf) = sign_in(&server, &desk).await;
    let form = Some(("application/x-www-form-urlencoded", format!("csrf={csrf}")));
    let answer = server.send_with(Method::POST, &format!("/jobs/{theirs}/cancel"), form, &[("cookie", &cookie)]).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    assert_eq!(db.store.job_get(theirs).await.unwrap().unwrap().row.state, JobState::Available);
}

async fn a_revoked_or_expired_token_is_refused_at_once_everywhere(db: TestDb) {
    let value = token(&db, "ci", Role::Deploy, None).await;
    let one = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    // Another server of the fleet, started without a token of its own.
    let two = TestServer::start(db.dyn_store(), None).await;
    for server in [&one, &two] {
        assert_eq!(server.send(Method::GET, "/api/stats", None, Some(&value)).await.status, StatusCode::OK);
    }
    let (cookie, _) = sign_in(&two, &value).await;
    let signed_in = two.send_with(Method::GET, "/", None, &[("cookie", &cookie)]).await;
    assert!(signed_in.body.contains("ci · deploy"), "the session carries its token");
    let revoked = jobhost(&db, &["token", "revoke", "ci"]);
    assert!(revoked.status.success(), "{}", String::from_utf8_lossy(&revoked.stderr));
    assert_eq!(one.send(Method::GET, "/api/stats", None, Some(&value)).await.status, StatusCode::UNAUTHORIZED);
    let change = Some(("application/json", "{}".to_string()));
    let refused = two.send(Method::POST, "/api/queues/default/pause", change, Some(&value)).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{}", refused.body);
    let after = two.send_with(Method::GET, "/", None, &[("cookie", &cookie)]).await;
    assert!(!after.body.contains("ci · deploy"), "its session ended with it");
    // Its name may be taken again; the old value stays refused, and signs
    // in no session even if it was checked before the name was taken.
    let again = token(&db, "ci", Role::Read, None).await;
    let old = jobhost::store::session::SignedInWith {
        name: "ci".into(),
        digest: hex::encode(Sha256::digest(value.as_bytes())),
    };
    let lifetime = jobhost::store::session::SessionLifetime::default();
    assert!(!db.store.session_create(&"d".repeat(64), lifetime, Some(&old)).await.unwrap());
    let new = jobhost::store::session::SignedInWith {
        name: "ci".into(),
        digest: hex::encode(Sha256::digest(again.as_bytes())),
    };
    assert!(db.store.session_create(&"e".repeat(64), lifetime, Some(&new)).await.unwrap());
    assert_eq!(one.send(Method::GET, "/api/stats", None, Some(&value)).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(one.send(Method::GET, "/api/stats", None, Some(&again)).await.status, StatusCode::OK);
    // A live name is not taken twice.
    let taken = NewToken {
        name: "ci".into(),
        digest: "0".repeat(64),
        role: Role::Admin,
        queues: None,
        payloads: false,
        expires_at: None,
        created_by: "tests@here".into(),
    };
    assert_eq!(db.store.token_create(&taken).await.unwrap(), Created::NameTaken);
    // An expired token is refused like a revoked one.
    let expired_value = format!("jh_expired_{}", "a1b2c3".repeat(8));
    let expired = NewToken {
        name: "old".into(),
        digest: hex::encode(Sha256::digest(expired_value.as_bytes())),
        expires_at: Some(chrono::Utc::now() - chrono::Duration::minutes(1)),
        ..taken
    };
    assert_eq!(db.store.token_create(&expired).await.unwrap(), Created::Made);
    let answer = one.send(Method::GET, "/api/stats", None, Some(&expired_value)).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
}

/// What every job, batch, step, event and schedule here carries.
const MARKER: &str = "CUSTOMER-DATA-7731";

async fn a_token_without_payloads_is_shown_none_on_any_page_or_answer(db: TestDb) {
    db.store.job_types_register(&[(job_config("mail"), "v1".to_string())]).await.unwrap();
    let carried = json!({"marker": MARKER});
    let done = db.enqueue_new("mail", carried.clone()).await;
    let failed = db.enqueue_new("mail", carried.clone()).await;
    let fetched = db.store.job_fetch(&common::fetch_params("h1", &["mail"], 2)).await.unwrap();
    let finishes = fetched
        .iter()
        .map(|job| {
            let mut finish = common::finish(job, common::completed());
            finish.log = json!({"lines": [{"level": "info", "message": MARKER}], "stdout": MARKER});
            if let jobhost::store::FinishOutcome::Completed { output, .. } = &mut finish.outcome {
                *output = Some(jobhost::types::JsonText::from(&carried));
            }
            finish
        })
        .collect();
    db.store.job_finish(finishes).await.unwrap();
    let callback = NewBatch { callback_payload: Some(carried.clone()), ..NewBatch::default() };
    let (batch, _) = db.store.batch_create(&callback, &[EnqueueParams::new("mail", carried.clone())]).await.unwrap();
    // A step waiting for an event whose match is taken from its payload.
    let waiting = json!({"steps": [
        {"name": "only", "job": "mail", "payload": {"order": MARKER},
         "wait": {"event": "order.approved", "match": {"order_id": "{order}"}, "timeout": "3d"}},
    ]});
    let waiting = serde_json::from_value(waiting).unwrap();
    let workflow = db.store.workflow_create(&waiting).await.unwrap().id;
    db.store.event_send("k", &carried, None, "test").await.unwrap();
    let mut schedule = jobhost::store::keyed_schedule::KeyedSchedule::new("mail", "acme", "0 0 9 * * *");
    schedule.payload = carried.as_object().unwrap().clone();
    db.store.keyed_schedule_upsert(&schedule).await.unwrap();
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let desk = token(&db, "desk", Role::Operate, None).await;
    let (cookie, _) = sign_in(&server, &desk).await;
    let mut read = 0;
    for job in [done, failed] {
        for (method, path, need) in ROUTES {
            if *method != "GET" || !matches!(need, Need::Role(_)) || *path == "/metrics" {
                continue;
            }
            let url = concrete(path, job, batch, workflow);
            let answer = if path.starts_with("/api") {
                server.send(Method::GET, &url, None, Some(&desk)).await
            } else {
                server.send_with(Method::GET, &url, None, &[("cookie", &cookie)]).await
            };
            assert!(!answer.status.is_server_error(), "GET {url}: {}", answer.body);
            assert!(!answer.body.contains(MARKER), "GET {url} shows what a job carries: {}", answer.body);
            read += 1;
        }
    }
    assert!(read > 50, "{read} pages and answers read");
    for path in ["/api/events", "/api/schedules/keyed", "/api/jobs?state=completed"] {
        let answer = server.send(Method::GET, path, None, Some(&desk)).await;
        assert!(!answer.body.contains(MARKER), "{path}: {}", answer.body);
    }
    let hidden = server.send(Method::GET, &format!("/api/jobs/{done}"), None, Some(&desk)).await;
    assert!(hidden.headers.contains_key("jobhost-hidden"));
    assert_eq!(hidden.json()["payload"], serde_json::Value::Null);
    let page = server.send_with(Method::GET, &format!("/jobs/{done}"), None, &[("cookie", &cookie)]).await;
    assert!(page.body.contains("made without --payloads"), "the page says why");
    // A token granted them, and the server's own, are shown them.
    let seeing = token_seeing(&db, "auditor", Role::Read, None, true).await;
    for value in [seeing.as_str(), TOKEN] {
        let answer = server.send(Method::GET, &format!("/api/jobs/{done}"), None, Some(value)).await;
        assert_eq!(answer.json()["payload"], carried);
        assert_eq!(answer.json()["output"], carried);
        assert!(!answer.headers.contains_key("jobhost-hidden"));
    }
}

on_both_backends!(
    a_token_without_payloads_is_shown_none_on_any_page_or_answer,
    every_route_answers_each_role_as_its_row_says,
    a_token_limited_to_queues_changes_only_their_jobs,
    a_revoked_or_expired_token_is_refused_at_once_everywhere,
);

/// `jobhost token`: the value printed once and never again, the list
/// within 80 columns, a name taken by a live token refused, revoking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_command_makes_lists_and_revokes() {
    let db = TestDb::postgres().await;
    let made =
        jobhost(&db, &["token", "create", "support", "--role", "read", "--queues", "mail,pdf", "--expires", "90d"]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let value = String::from_utf8(made.stdout).unwrap().trim().to_string();
    assert!(value.starts_with("jh_") && value.len() == 67, "{value}");
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    assert_eq!(server.send(Method::GET, "/api/stats", None, Some(&value)).await.status, StatusCode::OK);
    let list = jobhost(&db, &["token", "list"]);
    let text = String::from_utf8(list.stdout).unwrap();
    assert!(text.contains("support read · queues mail,pdf"), "{text}");
    assert!(text.contains("expires ") && text.contains("used "), "{text}");
    assert!(text.lines().all(|line| line.chars().count() <= 80), "{text}");
    let json = String::from_utf8(jobhost(&db, &["token", "list", "--json"]).stdout).unwrap();
    let listed: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(listed["role"], "read");
    assert_eq!(listed["queues"], json!(["mail", "pdf"]));
    let digest = hex::encode(Sha256::digest(value.as_bytes()));
    for shown in [&text, &json] {
        assert!(!shown.contains(&value) && !shown.contains(&digest), "no value or digest is listed");
    }
    let twice = jobhost(&db, &["token", "create", "support", "--role", "admin"]);
    assert!(!twice.status.success());
    assert!(String::from_utf8_lossy(&twice.stderr).contains("a live token is named support"));
    let bad = jobhost(&db, &["token", "create", "two words", "--role", "read"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not a token name"));
    let wide = jobhost(&db, &["token", "create", "ci", "--role", "deploy", "--queues", "mail"]);
    assert!(String::from_utf8_lossy(&wide.stderr).contains("--queues limits an operate token"));
    let unknown = jobhost(&db, &["token", "create", "x", "--role", "root"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("is no role"));
    assert!(jobhost(&db, &["token", "revoke", "support"]).status.success());
    assert_eq!(server.send(Method::GET, "/api/stats", None, Some(&value)).await.status, StatusCode::UNAUTHORIZED);
    let listed = String::from_utf8(jobhost(&db, &["token", "list"]).stdout).unwrap();
    assert!(listed.contains("revoked "), "{listed}");
    let again = jobhost(&db, &["token", "revoke", "support"]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("no live token is named support"));
}
