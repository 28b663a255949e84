//! The HTTP server against a hostile client (issue 33), with real sockets
//! and a real `jobhost serve` process where its own memory is measured.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use std::time::Duration;

use axum::http::{Method, StatusCode};
use jobhost::http::{ConnectionLimits, HttpConfig};
use jobhost::store::{EnqueueParams, FinishOutcome};
use jobhost::types::JsonText;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::db::{TestDb, on_both_backends};
use common::http::TestServer;
use common::{fetch_params, finish, job_config};

/// A `jobhost serve` process, killed when dropped.
struct Served {
    child: Child,
    address: SocketAddr,
}

impl Served {
    fn start(db: &TestDb, args: &[&str]) -> Served {
        // JOBHOST_BENCH_BIN runs another build's binary, to measure a change.
        let binary = std::env::var("JOBHOST_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_jobhost").to_string());
        let mut child = Command::new(binary)
            .args(["serve", "--no-migrate", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("DATABASE_URL", &db.url)
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start jobhost serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("its address");
        let address = line.split("http://").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap();
        Served { address: address.parse().unwrap(), child }
    }

    /// A figure of `/proc/PID/status` in bytes: `VmRSS` (resident now) or
    /// `VmHWM` (the most it has been resident).
    fn memory(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const MIB: usize = 1 << 20;

/// Fifty archived jobs, each with a payload, an output and a log of about
/// a mebibyte: what made one listing cost the server gigabytes.
async fn fifty_heavy_jobs(db: &TestDb) {
    db.store.job_types_register(&[(job_config("heavy"), "v1".into())]).await.unwrap();
    let blob = |c: char, bytes: usize| c.to_string().repeat(bytes);
    let jobs: Vec<_> =
        (0..50).map(|i| EnqueueParams::new("heavy", json!({ "i": i, "blob": blob('p', MIB - 64) }))).collect();
    for chunk in jobs.chunks(10) {
        db.store.job_enqueue(chunk).await.unwrap();
    }
    loop {
        let runs = db.store.job_fetch(&fetch_params("h", &["heavy"], 10)).await.unwrap();
        if runs.is_empty() {
            break;
        }
        let results = runs
            .iter()
            .map(|run| {
                let output = JsonText::from(&json!({ "report": blob('o', MIB) }));
                let outcome = FinishOutcome::Completed {
                    output: Some(output),
                    children: Vec::new().into(),
                    batches: Default::default(),
                    workflows: Default::default(),
                    events: Default::default(),
                    schedules: Default::default(),
                };
                jobhost::store::Finish { log: json!({ "lines": [blob('l', MIB)] }), ..finish(run, outcome) }
            })
            .collect();
        db.store.job_finish(results).await.unwrap();
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.archive").await, 50);
}

/// Issue 33, item 1: a listing reads a summary of each job, never its
/// payload, output or log, so no listing, however large its page and
/// whatever the jobs hold, takes the server past 50 MB above idle. Before,
/// `/api/jobs?limit=50` over these jobs took it from 15 MB to 3.3 GB.
async fn a_listing_costs_the_server_little_whatever_the_jobs_hold(db: TestDb) {
    fifty_heavy_jobs(&db).await;
    let served = Served::start(&db, &[]);
    let client = TestServer::at(served.address);
    assert!(client.get("/api/health").await.status.is_success());
    let idle = served.memory("VmRSS");
    let above_idle = || served.memory("VmHWM").saturating_sub(idle) as f64 / MIB as f64;
    for path in ["/api/jobs?limit=50", "/api/jobs?limit=500", "/api/jobs?state=completed", "/jobs", "/jobs?job=heavy"] {
        let answer = client.get(path).await;
        assert!(answer.status.is_success(), "{path}: {}", answer.status);
        assert!(answer.body.len() < 200_000, "{path} answered {} bytes", answer.body.len());
        assert!(!answer.body.contains("ooooooooo"), "{path} carries an output");
        let above = above_idle();
        assert!(above < 50.0, "{path} took the server {above:.1} MiB above idle");
    }
    eprintln!(
        "{:?}: idle {:.1} MiB; every listing alone, {:.1} MiB above",
        db.backend,
        idle as f64 / MIB as f64,
        above_idle()
    );
    // Ten at once: each takes a connection of its own, and on SQLite each
    // connection's page cache and thread are this process's.
    let mut lists = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let client = TestServer::at(served.address);
        lists.spawn(async move { client.get("/api/jobs?limit=500").await });
    }
    while let Some(answer) = lists.join_next().await {
        assert_eq!(answer.unwrap().json()["jobs"].as_array().unwrap().len(), 50);
    }
    let above = above_idle();
    eprintln!("{:?}: ten listings at once, {above:.1} MiB above idle", db.backend);
    assert!(above < 100.0, "ten listings at once took the server {above:.1} MiB above idle");
    // One job in full still has it all.
    let one = client.get("/api/jobs?limit=1").await.json()["jobs"][0]["id"].as_i64().unwrap();
    let detail = client.get(&format!("/api/jobs/{one}")).await.json();
    assert_eq!(detail["output"]["report"].as_str().map(str::len), Some(MIB));
}

/// A server holding only `max_connections` at once, closing one that has
/// not sent a request head within `header_timeout`.
async fn bounded_server(db: &TestDb, max_connections: usize, header_timeout: Duration) -> TestServer {
    let config = HttpConfig {
        connections: ConnectionLimits { max_connections, header_timeout },
        ..HttpConfig::new("127.0.0.1:0".parse().unwrap())
    };
    TestServer::serving(&config, db.dyn_store(), jobhost::metrics::Metrics::default()).await
}

/// A connection that sends half a request head and then nothing.
async fn half_request(address: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream.write_all(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").await.expect("write half a head");
    stream
}

/// Issue 33, item 2 (slowloris): a connection that never finishes its
/// request head is closed after the header timeout, and more of them than
/// the server serves at once only wait their turn in the kernel's queue;
/// `/api/health` is still answered. Before, such connections stayed open
/// for ever, and 1,030 of them took every descriptor of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_requests_past_the_connection_cap_never_keep_health_from_answering() {
    let db = TestDb::sqlite().await;
    let server = bounded_server(&db, 16, Duration::from_millis(500)).await;
    let mut held = Vec::new();
    for _ in 0..40 {
        held.push(half_request(server.address).await);
    }
    let health = tokio::time::timeout(Duration::from_secs(30), server.get("/api/health")).await;
    assert_eq!(health.expect("answered while half-requests wait").status, StatusCode::OK);
    for mut stream in held {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest))
            .await
            .expect("the server closed the half-request")
            .ok();
    }
}

/// The cap holds: while as many half-requests as the server serves are
/// open (its header timeout long), a whole request on one more connection
/// waits, and is answered as soon as one of them goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_a_free_one() {
    let db = TestDb::sqlite().await;
    let server = bounded_server(&db, 4, Duration::from_secs(120)).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(half_request(server.address).await);
    }
    let mut waiting = tokio::spawn({
        let client = TestServer::at(server.address);
        async move { client.get("/api/health").await }
    });
    // Not answered while every connection the server serves is held (a
    // server without the cap answers at once).
    let early = tokio::time::timeout(Duration::from_secs(1), &mut waiting).await;
    assert!(early.is_err(), "answered beyond the cap: {early:?}");
    drop(held.pop());
    let answer = tokio::time::timeout(Duration::from_secs(30), waiting).await.expect("answered once a connection went");
    assert_eq!(answer.unwrap().status, StatusCode::OK);
}

/// Sends a request head declaring a body of `length` bytes, and only the
/// body's first byte; returns the status of the answer, read without
/// sending the rest.
async fn status_before_the_body(address: SocketAddr, path: &str, content_type: &str, length: usize) -> u16 {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n\r\nx"
    );
    stream.write_all(head.as_bytes()).await.expect("write the head");
    let mut answer = vec![0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut answer))
        .await
        .expect("answered before the body was sent")
        .expect("read the answer");
    let text = String::from_utf8_lossy(&answer[..read]).into_owned();
    text.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("no status in {text:?}"))
}

/// Issue 33, item 3: credentials are checked before any of a body is read.
/// A request that changes something without them is refused while its
/// 6 MB body is still unsent; before, the server read and parsed the whole
/// body first (200 MB of memory to refuse a 6.3 MB enqueue, seconds of a
/// worker for six 6 MiB forms), and here it would wait for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_without_credentials_is_refused_before_its_body() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(db.dyn_store(), Some(common::http::TOKEN)).await;
    let big = 6 << 20;
    assert_eq!(status_before_the_body(server.address, "/api/jobs", "application/json", big).await, 401);
    assert_eq!(status_before_the_body(server.address, "/api/jobs/retry", "application/json", big).await, 401);
    let form = "application/x-www-form-urlencoded";
    assert_eq!(status_before_the_body(server.address, "/jobs/retry", form, big).await, 401, "a dashboard form");
    assert_eq!(status_before_the_body(server.address, "/logout", form, big).await, 401);
    // Signing in reads its body, bounded far below a payload's.
    assert_eq!(status_before_the_body(server.address, "/login", form, big).await, 413);
    // A read-only server refuses every change the same way.
    let read_only = TestServer::start(db.dyn_store(), None).await;
    assert_eq!(status_before_the_body(read_only.address, "/api/jobs", "application/json", big).await, 403);
    assert_eq!(status_before_the_body(read_only.address, "/jobs/cancel", form, big).await, 403);
}

const TOKEN: &str = common::http::TOKEN;

/// A form body.
fn form(body: &str) -> Option<(&'static str, String)> {
    Some(("application/x-www-form-urlencoded", body.to_string()))
}

/// Signs in to `server`'s dashboard, as a browser behind `forwarded_proto`
/// (if any) would: the `Set-Cookie` of its session.
async fn sign_in(server: &TestServer, forwarded_proto: Option<&str>) -> String {
    let headers: Vec<(&str, &str)> = forwarded_proto.map(|p| ("x-forwarded-proto", p)).into_iter().collect();
    let answer = server.send_with(Method::POST, "/login", form(&format!("token={TOKEN}&return_to=/")), &headers).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let name = format!("jobhost_session_{}=", server.address.port());
    answer
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|c| c.starts_with(&name))
        .expect("a session cookie named for the server's port")
}

/// The `name=value` of a `Set-Cookie`.
fn pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_string()
}

/// What an anonymous client gets at `path` of `server`.
async fn anonymous(server: &TestServer, path: &str) -> StatusCode {
    server.anonymous().get(path).await.status
}

/// Issue 33, item 5: a server with a token shows nothing without it: every
/// page and `GET` needs the bearer token or a signed-in session, but for
/// whether it is up, its API's description, the sign-in page and its
/// style. A page sends the browser to sign in and back. `--public-read`
/// keeps reads open; `/metrics` has a token of its own when given one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_need_the_token_or_a_session() {
    let db = TestDb::sqlite().await;
    db.store.job_types_register(&[(job_config("mail"), "v1".into())]).await.unwrap();
    let id = db.store.job_enqueue(&[EnqueueParams::new("mail", json!({"secret": "s3cr3t"}))]).await.unwrap()[0];
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    for path in ["/api/jobs", &format!("/api/jobs/{id}"), "/api/stats", "/api/keys", "/api/hosts"] {
        assert_eq!(anonymous(&server, path).await, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(server.get(path).await.status, StatusCode::OK, "{path} with the token");
    }
    for path in ["/api/health", "/api/openapi.json", "/login", "/assets/style.css", "/metrics"] {
        assert_eq!(anonymous(&server, path).await, StatusCode::OK, "{path} is for everyone");
    }
    let page = server.anonymous().get(&format!("/jobs/{id}?x=1")).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    assert_eq!(page.headers["location"], format!("/login?return_to=/jobs/{id}%3Fx%3D1"));
    assert!(!page.body.contains("s3cr3t"));
    let live = server.anonymous().send_with(Method::GET, "/jobs", None, &[("x-jobhost-live", "1")]).await;
    assert_eq!(live.status, StatusCode::UNAUTHORIZED, "a page's live refresh is refused, not redirected");
    // A signed-in session reads the pages.
    let session = pair(&sign_in(&server, None).await);
    let page = server.anonymous().send_with(Method::GET, &format!("/jobs/{id}"), None, &[("cookie", &session)]).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("s3cr3t"));

    let public = TestServer::start_public(db.dyn_store(), Some(TOKEN)).await;
    assert_eq!(anonymous(&public, "/api/jobs").await, StatusCode::OK, "--public-read");
    assert_eq!(public.anonymous().post("/api/jobs", json!({"job": "mail"})).await.status, StatusCode::CREATED);
    assert_eq!(
        public.anonymous().send(Method::POST, "/api/jobs", Some(("application/json", "{}".into())), None).await.status,
        StatusCode::UNAUTHORIZED,
        "changes still need the token"
    );

    let metrics_token = "metrics-9f8e7d6c5b4a3210";
    let config = HttpConfig {
        token: Some(TOKEN.into()),
        metrics_token: Some(metrics_token.into()),
        ..HttpConfig::new("127.0.0.1:0".parse().unwrap())
    };
    let scraped = TestServer::serving(&config, db.dyn_store(), jobhost::metrics::Metrics::default()).await;
    assert_eq!(anonymous(&scraped, "/metrics").await, StatusCode::UNAUTHORIZED);
    let scrape = scraped.anonymous().send(Method::GET, "/metrics", None, Some(metrics_token)).await;
    assert_eq!(scrape.status, StatusCode::OK);
    assert_eq!(scraped.get("/metrics").await.status, StatusCode::OK, "the server's token scrapes too");
    let reads = scraped.anonymous().send(Method::GET, "/api/jobs", None, Some(metrics_token)).await;
    assert_eq!(reads.status, StatusCode::UNAUTHORIZED, "the metrics token reads nothing else");
}

/// Issue 33, item 4: a session is a random id per sign-in, known to the
/// database only by its digest, so every server of a fleet accepts it; it
/// ends at sign-out on every server, when idle too long, and in all after
/// its lifetime. Its cookie is named for the server's port, lasts as long
/// as the session, and is `Secure` when the request came over TLS. Before,
/// the cookie was the token's digest: the same at every sign-in, never
/// expiring, valid after sign-out, and shared with any app on the host.
async fn sessions_are_random_shared_by_the_fleet_and_end(db: TestDb) {
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let other = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let first = sign_in(&server, None).await;
    let second = sign_in(&server, Some("https")).await;
    assert_ne!(pair(&first), pair(&second), "a new id at each sign-in");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=604800"] {
        assert!(first.contains(attribute), "{attribute} in {first}");
    }
    assert!(!first.contains("Secure") && second.contains("; Secure"), "Secure only over TLS: {second}");
    let id = pair(&first).split('=').nth(1).unwrap().to_string();
    assert_eq!(id.len(), 64);
    assert_eq!(
        db.scalar(format!("SELECT count(*) FROM jobhost.http_sessions WHERE digest = '{id}'")).await,
        0,
        "the database keeps only a digest"
    );

    // The other server of the fleet reads the sessions by their digests:
    // its own cookie name, the same id.
    let reads = |server: &TestServer, set_cookie: &str| {
        let id = pair(set_cookie).split('=').nth(1).unwrap().to_string();
        let cookie = format!("jobhost_session_{}={id}", server.address.port());
        let client = server.anonymous();
        async move { client.send_with(Method::GET, "/api/jobs", None, &[("cookie", &cookie)]).await.status }
    };
    assert_eq!(reads(&server, &first).await, StatusCode::OK);
    assert_eq!(reads(&other, &first).await, StatusCode::OK, "another server of the fleet");

    // Signing out at one server ends the session at every one.
    let page = server.anonymous().send_with(Method::GET, "/", None, &[("cookie", &pair(&first))]).await;
    let csrf = page.body.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
    let out = server
        .anonymous()
        .send_with(Method::POST, "/logout", form(&format!("csrf={csrf}")), &[("cookie", &pair(&first))])
        .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    let cleared = out.headers.get_all("set-cookie").iter().any(|c| c.to_str().unwrap().contains("Max-Age=0"));
    assert!(cleared, "the browser is told to drop the cookie");
    assert_eq!(reads(&server, &first).await, StatusCode::UNAUTHORIZED, "ended");
    assert_eq!(reads(&other, &first).await, StatusCode::UNAUTHORIZED, "ended everywhere");
    assert_eq!(reads(&server, &second).await, StatusCode::OK, "the other session goes on");

    // Idle past 8 hours, or a week old, a session is over.
    let hours_ago = |hours: i64| {
        db.dialect("now() - interval '1 hour' * HOURS", "CAST(unixepoch('subsec') * 1000 AS INTEGER) - 3600000 * HOURS")
            .replace("HOURS", &hours.to_string())
    };
    db.execute(format!("UPDATE jobhost.http_sessions SET last_seen_at = {}", hours_ago(9))).await;
    assert_eq!(reads(&server, &second).await, StatusCode::UNAUTHORIZED, "idle too long");
    let third = sign_in(&server, None).await;
    assert_eq!(reads(&server, &third).await, StatusCode::OK);
    db.execute(format!("UPDATE jobhost.http_sessions SET created_at = {}", hours_ago(24 * 7 + 1))).await;
    assert_eq!(reads(&server, &third).await, StatusCode::UNAUTHORIZED, "past its lifetime, however used");
}

on_both_backends!(
    a_listing_costs_the_server_little_whatever_the_jobs_hold,
    sessions_are_random_shared_by_the_fleet_and_end
);

/// Issue 33, item 6: wrong tokens are counted per address and logged; an
/// address that sends more than ten within a minute is refused (429) for
/// the rest of it, even with the right token. Before, 3,000 wrong tokens
/// went through in 0.35 s, unlogged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_guessing_tokens_is_refused_for_a_while() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(db.dyn_store(), Some(TOKEN)).await;
    let guess = |n: usize| {
        let client = server.anonymous();
        async move { client.send(Method::GET, "/api/jobs", None, Some(&format!("guess-number-{n:04}"))).await.status }
    };
    for n in 0..10 {
        assert_eq!(guess(n).await, StatusCode::UNAUTHORIZED, "guess {n}");
    }
    assert_eq!(guess(10).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(server.get("/api/jobs").await.status, StatusCode::TOO_MANY_REQUESTS, "this address, for a while");
    let signing_in = server.anonymous().send(Method::POST, "/login", form(&format!("token={TOKEN}")), None).await;
    assert_eq!(signing_in.status, StatusCode::TOO_MANY_REQUESTS, "the sign-in form too");
}

/// Issue 33, item 6: a request whose `Host` cannot be told (none, two, or
/// not ASCII) is refused, as one naming an unknown host is: the check
/// failed open for them before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_host_cannot_be_told_is_refused() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start_public(db.dyn_store(), None).await;
    let status = |raw: &str| {
        let server = &server;
        let raw = raw.to_string();
        async move {
            let answer = server.send_raw(&raw).await;
            answer.split_whitespace().nth(1).unwrap_or_default().to_string()
        }
    };
    assert_eq!(status("GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await, "200");
    assert_eq!(status("GET /api/jobs HTTP/1.0\r\n\r\n").await, "400", "no Host");
    let two = "GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n";
    assert_eq!(status(two).await, "400", "two Hosts");
    let bytes = "GET /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\u{00e9}\r\nConnection: close\r\n\r\n";
    assert_eq!(status(bytes).await, "400", "not ASCII");
}

/// Issue 33, item 6: the notice a form leaves for the next page is signed;
/// one another page on the host set in the cookie is not shown. Before,
/// the dashboard showed whatever text the cookie held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_the_server_did_not_sign_is_not_shown() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start_public(db.dyn_store(), Some(TOKEN)).await;
    let forged = hex::encode("Your session expired: sign in again at http://evil.example/jobhost");
    for cookie in [format!("jobhost_notice={forged}"), format!("jobhost_notice={forged}.{}", "0".repeat(64))] {
        let page = server.anonymous().send_with(Method::GET, "/", None, &[("cookie", &cookie)]).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(!page.body.contains("evil.example"), "a forged notice showed");
    }
}

/// Issue 33, items 5 and 6: a server refuses to start with a token too
/// easy to guess, or without a token where other machines reach it
/// (unless told to serve reads to all).
#[tokio::test]
async fn a_server_refuses_to_start_open_to_the_network_or_with_a_weak_token() {
    let config = |listen: &str, token: Option<&str>, public_read: bool| HttpConfig {
        token: token.map(str::to_string),
        public_read,
        ..HttpConfig::new(listen.parse().unwrap())
    };
    let weak = config("127.0.0.1:0", Some(&"a".repeat(16)), false).validate().unwrap_err().to_string();
    assert!(weak.contains("too easy to guess") && weak.contains("openssl rand -hex 32"), "{weak}");
    let open = config("0.0.0.0:8080", None, false).validate().unwrap_err().to_string();
    assert!(open.contains("--public-read"), "{open}");
    assert!(config("0.0.0.0:8080", None, true).validate().is_ok());
    assert!(config("0.0.0.0:8080", Some(TOKEN), false).validate().is_ok());
    assert!(config("127.0.0.1:8080", None, false).validate().is_ok(), "this machine only");
    let db = TestDb::sqlite().await;
    let refused = Command::new(env!("CARGO_BIN_EXE_jobhost"))
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env("DATABASE_URL", &db.url)
        .env_remove("JOBHOST_TOKEN")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--public-read"));
}

/// Issue 33, item 6: the HTTP server's store gives up each statement at
/// half a request's deadline, on a pool of its own. Listings stuck behind
/// a lock on the archive (standing in for a filter no index serves over
/// millions of rows) fail at once as unavailable instead of holding every
/// connection, and `/api/health` is answered meanwhile. Before, 24 slow
/// listings took all the pool's connections and health answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reads_give_up_their_connection_and_health_still_answers() {
    let db = TestDb::postgres().await;
    let limits = jobhost::store::EnqueueLimits::default();
    let store = jobhost::store::open_for_http(&db.url, 2, limits, Duration::from_millis(300)).await.unwrap();
    let config = HttpConfig::new("127.0.0.1:0".parse().unwrap());
    let server = TestServer::serving(&config, store, jobhost::metrics::Metrics::default()).await;
    let mut holder = db.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE jobhost.archive IN ACCESS EXCLUSIVE MODE").execute(&mut *holder).await.unwrap();
    let mut listings = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let client = server.anonymous();
        listings.spawn(async move { client.get("/api/jobs?key=nope").await });
    }
    let health = server.get("/api/health").await;
    assert_eq!(health.status, StatusCode::OK, "{}", health.body);
    while let Some(listing) = listings.join_next().await {
        let listing = listing.unwrap();
        assert_eq!(listing.status, StatusCode::SERVICE_UNAVAILABLE);
        // Given up by the database at the statement timeout, not held to
        // the request's deadline.
        assert!(listing.body.contains("the database is unavailable"), "{}", listing.body);
        assert!(!listing.body.contains("jobhost_test_"), "no database name reaches the caller: {}", listing.body);
    }
    holder.rollback().await.unwrap();
    assert_eq!(server.get("/api/jobs?key=nope").await.status, StatusCode::OK);
}
