//! The HTTP server against a hostile client (issue 33), with real sockets
//! and a real `jobhost serve` process where its own memory is measured.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use std::time::Duration;

use axum::http::StatusCode;
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
        let mut child = Command::new(env!("CARGO_BIN_EXE_jobhost"))
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

on_both_backends!(a_listing_costs_the_server_little_whatever_the_jobs_hold);

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
