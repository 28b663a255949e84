//! Every attempt's story, on both backends: a job retried by a real host
//! reads as its attempts (host, start, run time, ending, error) with the
//! waits between, through the API and `jobhost job ID --attempts`.

use crate::common;

use std::time::Duration;

use serde_json::json;

use common::db::{TestDb, jobhost, on_both_backends};
use common::http::TestServer;
use common::{TestHost, eventually};

async fn a_retried_job_reads_as_its_attempts_and_the_waits_between(db: TestDb) {
    let host = TestHost::start(&db, &["flaky"], |_| {}).await;
    let id = db.enqueue_new("flaky", json!({"fail_times": 2})).await;
    eventually(Duration::from_secs(60), || async { db.scalar("SELECT count(*) FROM jobhost.archive").await == 1 })
        .await;
    let hosts = db.texts("SELECT id FROM jobhost.hosts").await;
    host.stop().await;

    let server = TestServer::start(db.dyn_store(), None).await;
    let job = server.get(&format!("/api/jobs/{id}")).await.json();
    let attempts = job["attempts"].as_array().unwrap_or_else(|| panic!("attempts in {job}"));
    let endings: Vec<&str> = attempts.iter().map(|a| a["ending"].as_str().unwrap()).collect();
    assert_eq!(endings, ["retried", "retried", "completed"]);
    for (n, attempt) in attempts.iter().enumerate() {
        assert_eq!(attempt["attempt"], n + 1);
        assert!(hosts.iter().any(|h| attempt["host"] == json!(h)), "the host that ran it: {attempt}");
        assert!(attempt["ran_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{attempt}");
        assert!(attempt["started_at"].is_string() && attempt["ended_at"].is_string(), "{attempt}");
    }
    assert_eq!(attempts[0]["error"], "attempt 1 failed on purpose");
    assert!(attempts[0]["waited_ms"].is_null());
    // flaky backs off 10 ms, then 20 ms (doubling, capped at 100 ms).
    for later in &attempts[1..] {
        assert!(later["waited_ms"].as_f64().is_some_and(|ms| ms >= 5.0), "a backoff before it: {later}");
    }

    let cli = jobhost(&db, &["job", &id.to_string(), "--attempts"]);
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    let text = String::from_utf8(cli.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("#1 retried   on "), "{text}");
    assert_eq!(lines[1], "   attempt 1 failed on purpose");
    assert!(lines[2].starts_with("   waited "), "{text}");
    assert!(lines.iter().any(|l| l.starts_with("#3 completed")), "{text}");
    assert!(lines.iter().all(|l| l.chars().count() <= 80), "{text}");
    let json = jobhost(&db, &["job", &id.to_string(), "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["attempts"].as_array().map(Vec::len), Some(3), "the JSON carries them too");
}

on_both_backends!(a_retried_job_reads_as_its_attempts_and_the_waits_between);
