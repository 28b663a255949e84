//! The command line of batches and waits: `batch create/add/close/list/show`,
//! `jobs --batch`, and `enqueue --wait` / `job --wait` with their exit codes,
//! against a real host on both backends.

use crate::common;

use std::process::Output;

use jobhost::template::KeyTemplate;
use jobhost::types::{ConcurrencyConfig, OnConflict};
use serde_json::Value;

use common::db::{TestDb, jobhost, on_both_backends};
use common::{TestHost, eventually, job_config};

const WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json_of(output: &Output) -> Value {
    assert!(output.status.success(), "{}", stderr(output));
    serde_json::from_str(&stdout(output)).unwrap_or_else(|e| panic!("{e}: {}", stdout(output)))
}

async fn batches_are_created_from_a_file_and_shown_as_they_progress(db: TestDb) {
    let host = TestHost::start(&db, &["hello", "flaky"], |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.jsonl");
    let lines = [
        r#"{"job": "hello", "payload": {"name": "a"}}"#,
        r#"{"job": "hello", "payload": {"name": "b"}, "queue": "default", "priority": 1}"#,
        r#"{"job": "hello", "delay": "100ms"}"#,
        r#"{"job": "flaky", "payload": {"fail_times": 99}}"#,
    ];
    std::fs::write(&file, lines.join("\n")).unwrap();
    let file = file.to_str().unwrap();
    let created =
        jobhost(&db, &["batch", "create", "--file", file, "--label", "nightly import", "--on-finish", "hello"]);
    assert!(created.status.success(), "{}", stderr(&created));
    let out = stdout(&created);
    let mut lines_out = out.lines();
    let id: i64 = lines_out.next().unwrap().strip_prefix("batch ").expect("the batch first").parse().unwrap();
    assert_eq!(lines_out.count(), 4, "then each member's id: {out}");

    eventually(WITHIN, || async {
        json_of(&jobhost(&db, &["batch", "show", &id.to_string(), "--json"]))["state"] == "failed"
    })
    .await;
    let shown = json_of(&jobhost(&db, &["batch", "show", &id.to_string(), "--json"]));
    assert_eq!(shown["counts"]["completed"], 3);
    assert_eq!(shown["counts"]["failed"], 1);
    assert_eq!(shown["progress"], 1.0);
    assert!(shown["callback_jobs"]["on_finish"].is_i64(), "{shown}");

    let text = stdout(&jobhost(&db, &["batch", "show", &id.to_string()]));
    assert!(text.starts_with(&format!("batch {id} \"nightly import\": failed\n")), "{text}");
    assert!(text.contains("[########################################] 100%  4 of 4 ended"), "{text}");
    assert!(text.contains("on_finish hello: enqueued as job"), "{text}");
    let list = stdout(&jobhost(&db, &["batch", "list"]));
    assert!(list.contains("failed    [################] 100%  4/4 1 failed  nightly import"), "{list}");
    for line in text.lines().chain(list.lines()) {
        assert!(line.chars().count() <= 80, "wider than a terminal: {line}");
    }
    let members = stdout(&jobhost(&db, &["jobs", "--batch", &id.to_string(), "--json"]));
    assert_eq!(members.lines().count(), 4, "{members}");

    // Bad input is refused with its reason, and stores nothing.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"job\": \"hello\"}\n{\"name\": \"no job\"}\n").unwrap();
    let (unknown, not_object) = (dir.path().join("unknown.jsonl"), dir.path().join("not_object.jsonl"));
    std::fs::write(&unknown, "{\"job\": \"hello\"}\n\n{\"job\": \"helo\"}\n").unwrap();
    std::fs::write(&not_object, "{\"job\": \"hello\"}\n{\"job\": \"hello\", \"payload\": [1]}\n").unwrap();
    let before = db.scalar("SELECT count(*) FROM jobhost.batches").await;
    for (args, message) in [
        (vec!["batch", "create", "--file", bad.to_str().unwrap()], "line 2 is not a job"),
        (vec!["batch", "create", "--file", unknown.to_str().unwrap()], "line 3: unknown job type \"helo\""),
        (
            vec!["batch", "create", "--file", not_object.to_str().unwrap()],
            "line 2: the payload must be a JSON object, got an array",
        ),
        (vec!["batch", "create", "--file", file, "--on-success", "nope"], "unknown job type \"nope\""),
        (vec!["batch", "create", "--file", file, "--callback-payload", "[1]"], "must be a JSON object"),
        (vec!["batch", "close", "424242"], "batch 424242 does not exist"),
        (vec!["batch", "show", "424242"], "batch 424242 does not exist"),
    ] {
        let refused = jobhost(&db, &args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        assert!(stderr(&refused).contains(message), "{args:?}: {}", stderr(&refused));
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.batches").await, before);
    host.stop().await;
}

async fn an_open_batch_takes_jobs_until_closed(db: TestDb) {
    db.store.job_types_register(&[(job_config("mail"), "d".into())]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.jsonl");
    std::fs::write(&file, "{\"job\": \"mail\"}\n").unwrap();
    let file = file.to_str().unwrap();
    let created = jobhost(&db, &["batch", "create", "--open", "--file", file, "--json"]);
    let first: Value = serde_json::from_str(stdout(&created).lines().next().unwrap()).unwrap();
    let id = first["batch"].as_i64().unwrap().to_string();
    let member: Value = serde_json::from_str(stdout(&created).lines().nth(1).unwrap()).unwrap();
    assert!(member["id"].is_i64(), "then each member: {member}");
    assert!(jobhost(&db, &["enqueue", "mail", "--batch", &id]).status.success());
    assert!(jobhost(&db, &["batch", "add", &id, "--file", file]).status.success());
    let shown = json_of(&jobhost(&db, &["batch", "show", &id, "--json"]));
    assert_eq!((shown["state"].as_str(), shown["counts"]["total"].as_i64()), (Some("open"), Some(3)));
    let closed = jobhost(&db, &["batch", "close", &id]);
    assert!(stdout(&closed).contains("closed: it finishes once every member has ended"), "{}", stdout(&closed));
    assert!(stdout(&jobhost(&db, &["batch", "close", &id])).contains("was closed already"));
    let late = jobhost(&db, &["enqueue", "mail", "--batch", &id]);
    assert_eq!(late.status.code(), Some(2));
    assert!(stderr(&late).contains("is closed"), "{}", stderr(&late));
}

async fn waiting_prints_the_output_and_exits_by_how_the_job_ended(db: TestDb) {
    let host = TestHost::start(&db, &["hello", "flaky"], |_| {}).await;
    let ok = jobhost(&db, &["enqueue", "hello", "--payload", r#"{"name": "w"}"#, "--wait", "--timeout", "30s"]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    let out = stdout(&ok);
    let mut lines = out.lines();
    let id: i64 = lines.next().unwrap().parse().expect("the id first");
    let output: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(output["greeting"], "hello, w");
    let again = jobhost(&db, &["job", &id.to_string(), "--wait"]);
    assert_eq!((again.status.code(), stdout(&again).trim()), (Some(0), output.to_string().as_str()));

    let failed = jobhost(&db, &["enqueue", "flaky", "--payload", r#"{"fail_times": 99}"#, "--wait"]);
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    assert!(stderr(&failed).contains("failed: attempt 5 failed on purpose"), "{}", stderr(&failed));

    let later = stdout(&jobhost(&db, &["enqueue", "hello", "--delay", "1h"])).trim().to_string();
    let timed_out = jobhost(&db, &["job", &later, "--wait", "--timeout", "500ms"]);
    assert_eq!(timed_out.status.code(), Some(6));
    assert!(stderr(&timed_out).contains("did not end within 500ms"), "{}", stderr(&timed_out));
    assert!(jobhost(&db, &["cancel", &later]).status.success());
    assert_eq!(jobhost(&db, &["job", &later, "--wait"]).status.code(), Some(5), "cancelled");

    let mut limited = job_config("lim");
    limited.concurrency = Some(ConcurrencyConfig {
        limit: 1,
        key: KeyTemplate::parse("{k}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Discard,
    });
    db.store.job_types_register(&[(limited, "d".into())]).await.unwrap();
    assert!(jobhost(&db, &["enqueue", "lim", "--payload", r#"{"k": 1}"#]).status.success());
    let discarded = jobhost(&db, &["enqueue", "lim", "--payload", r#"{"k": 1}"#, "--wait"]);
    assert_eq!(discarded.status.code(), Some(4), "{}", stderr(&discarded));

    let many = jobhost(&db, &["enqueue", "hello", "--file", "-", "--wait"]);
    assert_eq!(many.status.code(), Some(2), "--wait waits for one job");
    let missing = jobhost(&db, &["job", "424242", "--wait"]);
    assert!(stderr(&missing).contains("job 424242 does not exist"), "{}", stderr(&missing));
    host.stop().await;
}

on_both_backends!(
    batches_are_created_from_a_file_and_shown_as_they_progress,
    an_open_batch_takes_jobs_until_closed,
    waiting_prints_the_output_and_exits_by_how_the_job_ended,
);
