//! `--log-format json`: a host's log is one JSON object per line, and every
//! line about a run carries the run's job id, type, attempt and host.

use crate::common;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use serde_json::{Value, json};

use common::db::TestDb;
use common::eventually;
use common::fleet::{Host, components, host_command, wait_serving};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_run_on_every_line_about_it() {
    let db = TestDb::sqlite().await;
    let dir = components(&["hello", "flaky"]);
    let cache = tempfile::tempdir().unwrap();
    let mut command = host_command(&db.url, dir.path(), cache.path());
    command.args(["--log-format", "json", "-v"]).env_remove("RUST_LOG").stderr(std::process::Stdio::piped());
    let mut host = Host::start(&mut command);
    let stderr = host.take_stderr();
    let lines = std::thread::spawn(move || BufReader::new(stderr).lines().map(Result::unwrap).collect::<Vec<_>>());
    wait_serving(&db, &[&host], 2).await;
    let hello = db.enqueue_new("hello", json!({"name": "logs"})).await;
    let flaky = db.enqueue_new("flaky", json!({"fail_times": 1})).await;
    eventually(Duration::from_secs(60), || async { db.scalar("SELECT count(*) FROM archive").await == 2 }).await;
    host.stop().await;
    let lines = lines.join().unwrap();
    assert!(!lines.is_empty());
    let objects: Vec<Value> =
        lines.iter().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))).collect();
    for object in &objects {
        assert!(object["timestamp"].is_string() && object["level"].is_string(), "{object}");
    }
    let about = |id: i64| -> Vec<&Value> { objects.iter().filter(|o| o["span"]["job_id"] == json!(id)).collect() };
    let hello_lines = about(hello);
    assert!(!hello_lines.is_empty(), "lines about the hello run: {lines:?}");
    for line in &hello_lines {
        let span = &line["span"];
        assert_eq!(span["job"], "hello", "{line}");
        assert_eq!(span["attempt"], 1, "{line}");
        assert!(span["host"].as_str().is_some_and(|h| h.contains(&format!("-{}-", host.pid()))), "{line}");
    }
    // Both of the flaky job's attempts, each line with its own.
    let attempts: std::collections::BTreeSet<i64> =
        about(flaky).iter().filter_map(|line| line["span"]["attempt"].as_i64()).collect();
    assert_eq!(attempts, [1, 2].into());
}
