//! The command line's contract: output shapes, exit codes, and bad input
//! refused with a clear message and nothing written.

use crate::common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use jobhost::store::{EnqueueParams, FetchParams, Finish, FinishOutcome};
use serde_json::{Value, json};

use common::db::{TestDb, jobhost, on_both_backends};
use common::job_config;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn with_mail(db: TestDb) -> TestDb {
    db.store.job_types_register(&[(job_config("mail"), "d".into())]).await.unwrap();
    db
}

async fn enqueue_prints_ids_and_refuses_bad_input_with_exit_code_2(db: TestDb) {
    let db = with_mail(db).await;
    let ok = jobhost(&db, &["enqueue", "mail", "--payload", r#"{"to": "ada"}"#]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    let id: i64 = stdout(&ok).trim().parse().expect("an id");

    let delayed = jobhost(&db, &["enqueue", "mail", "--payload", "{}", "--delay", "1h", "--json"]);
    let delayed: Value = serde_json::from_str(stdout(&delayed).trim()).unwrap();
    assert!(delayed["id"].as_i64().unwrap() > id);

    for (args, message) in [
        (vec!["enqueue", "mail", "--payload", "{oops"], "--payload is not valid JSON"),
        (vec!["enqueue", "nope", "--payload", "{}"], "unknown job type \"nope\""),
        (vec!["enqueue", "mail", "--payload", "[1, 2]"], "must be a JSON object"),
        // As the HTTP API refuses it, on both backends (SQLite stored 1970).
        (vec!["enqueue", "mail", "--payload", "{}", "--delay", "200y"], "delay must be at most 100 years"),
        (vec!["enqueue", "mail", "--payload", "{}", "--delay", "500000y"], "delay must be at most 100 years"),
        (vec!["enqueue", "mail", "--payload", "{}", "--at", "2300-01-01T00:00:00Z"], "within 100 years"),
    ] {
        let refused = jobhost(&db, &args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        assert!(stderr(&refused).contains(message), "{args:?}: {}", stderr(&refused));
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 2);
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'scheduled'").await, 1);
}

async fn bulk_enqueue_from_a_file_is_all_or_nothing(db: TestDb) {
    let db = with_mail(db).await;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.jsonl");
    std::fs::write(&good, "{\"n\": 1}\n{\"n\": 2}\n\n{\"n\": 3}\n").unwrap();
    let output = jobhost(&db, &["enqueue", "mail", "--file", good.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output).lines().count(), 3);

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"n\": 4}\n{\"n\": \n").unwrap();
    let output = jobhost(&db, &["enqueue", "mail", "--file", bad.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("line 2"), "{}", stderr(&output));
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs").await, 3, "nothing from the bad file");
}

async fn jobs_and_stats_print_the_documented_json(db: TestDb) {
    let db = with_mail(db).await;
    let ids = db
        .store
        .job_enqueue(&[EnqueueParams::new("mail", json!({"n": 1})), EnqueueParams::new("mail", json!({}))])
        .await
        .unwrap();
    let params = FetchParams {
        host_id: "h".into(),
        queues: vec!["default".into()],
        job_types: vec![("mail".into(), 30)],
        limit: 1,
    };
    let job = db.store.job_fetch(&params).await.unwrap().remove(0);
    let output = jobhost::types::JsonText::from(&json!({"sent": true}));
    let outcome = FinishOutcome::Completed {
        output: Some(output),
        children: Vec::new().into(),
        batches: Default::default(),
        workflows: Default::default(),
        events: Default::default(),
        schedules: Default::default(),
    };
    let finish = Finish {
        id: job.id,
        lease_token: job.lease_token,
        attempt: 1,
        outcome,
        log: json!({}),
        progress: None,
        concurrency_key: job.concurrency_key.clone(),
        batch_id: None,
        traceparent: None,
    };
    db.store.job_finish(vec![finish]).await.unwrap();

    let output = jobhost(&db, &["jobs", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let rows: Vec<Value> = stdout(&output).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2);
    for row in &rows {
        for key in [
            "id",
            "job",
            "queue",
            "state",
            "attempts",
            "concurrency_key",
            "error",
            "enqueued_at",
            "started_at",
            "finished_at",
        ] {
            assert!(row.get(key).is_some(), "missing {key} in {row}");
        }
    }
    for row in &rows {
        assert!(row.get("output").is_none() && row.get("payload").is_none(), "a listing is a summary: {row}");
    }
    let done = rows.iter().find(|r| r["state"] == "completed").unwrap();
    let detail = jobhost(&db, &["job", &done["id"].to_string(), "--json"]);
    let detail: Value = serde_json::from_str(&stdout(&detail)).unwrap();
    assert_eq!(detail["output"], json!({"sent": true}), "the output is a JSON document, not a string");

    let output = jobhost(&db, &["jobs", "--state", "available", "--json"]);
    assert_eq!(stdout(&output).lines().count(), 1);
    let output = jobhost(&db, &["jobs", "--state", "bogus"]);
    assert_eq!(output.status.code(), Some(2));

    let stats: Value = serde_json::from_str(stdout(&jobhost(&db, &["stats", "--json"])).trim()).unwrap();
    for state in ["scheduled", "available", "running", "blocked", "completed", "failed", "discarded", "cancelled"] {
        assert!(stats["states"][state].is_i64(), "state {state} missing from {stats}");
    }
    assert_eq!(stats["states"]["completed"], 1);
    assert_eq!(stats["queues"]["default"]["available"], 1);
    assert!(stats["oldest_available_secs"].is_f64());
    assert_eq!(stats["hosts_alive"], 0);

    let detail: Value = serde_json::from_str(&stdout(&jobhost(&db, &["job", &ids[0].to_string(), "--json"]))).unwrap();
    assert_eq!(detail["payload"], json!({"n": 1}));
}

async fn cancel_and_retry_report_what_they_did(db: TestDb) {
    let db = with_mail(db).await;
    let id = db.store.job_enqueue(&[EnqueueParams::new("mail", json!({}))]).await.unwrap()[0].to_string();
    assert!(jobhost(&db, &["cancel", &id]).status.success());
    let again = jobhost(&db, &["cancel", &id]);
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("is cancelled"), "{}", stderr(&again));
    assert!(jobhost(&db, &["retry", &id]).status.success());
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'available'").await, 1);
    let missing = jobhost(&db, &["retry", "999999"]);
    assert!(stderr(&missing).contains("does not exist"), "{}", stderr(&missing));
}

/// `queue pause` and `resume` say what they did and `stats` shows the
/// paused queue; `enqueue --max-payload` holds a payload to that size; a
/// running job's cancel says its host will stop it.
async fn queues_pause_payloads_are_limited_and_running_jobs_cancel(db: TestDb) {
    let db = with_mail(db).await;
    let paused = jobhost(&db, &["queue", "pause", "default"]);
    assert!(stdout(&paused).contains("queue default paused"), "{}", stderr(&paused));
    assert!(stdout(&jobhost(&db, &["queue", "pause", "default"])).contains("was paused already"));
    db.store.job_enqueue(&[EnqueueParams::new("mail", json!({}))]).await.unwrap();
    let stats = stdout(&jobhost(&db, &["stats"]));
    assert!(stats.contains("queue default (paused): available 1"), "{stats}");
    let stats: Value = serde_json::from_str(stdout(&jobhost(&db, &["stats", "--json"])).trim()).unwrap();
    assert_eq!(stats["paused_queues"], json!(["default"]));
    assert!(stdout(&jobhost(&db, &["queue", "resume", "default"])).contains("queue default resumed"));
    let bad = jobhost(&db, &["queue", "pause", "Not A Queue"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));

    let payload = format!(r#"{{"blob": "{}"}}"#, "x".repeat(2000));
    let refused = jobhost(&db, &["enqueue", "mail", "--max-payload", "1KiB", "--payload", &payload]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(stderr(&refused).contains("more than the largest accepted, 1024 bytes"), "{}", stderr(&refused));
    assert!(jobhost(&db, &["enqueue", "mail", "--payload", &payload]).status.success(), "the default is 1 MiB");

    let params = FetchParams {
        host_id: "h".into(),
        queues: vec!["default".into()],
        job_types: vec![("mail".into(), 30)],
        limit: 1,
    };
    let running = db.store.job_fetch(&params).await.unwrap().remove(0).id.to_string();
    let cancelled = jobhost(&db, &["cancel", &running]);
    assert!(
        stdout(&cancelled).contains("is running: its host stops it within two heartbeats"),
        "{}",
        stderr(&cancelled)
    );
}

/// Every timestamp in `jobs --json` and `job` (the error entries' `at`
/// included) is RFC 3339 UTC with six fractional digits, on both backends,
/// so they have one width and sort as text.
async fn json_timestamps_have_one_fixed_width(db: TestDb) {
    let db = with_mail(db).await;
    let ids = db
        .store
        .job_enqueue(&[EnqueueParams::new("mail", json!({})), EnqueueParams::new("mail", json!({}))])
        .await
        .unwrap();
    let params = FetchParams {
        host_id: "h".into(),
        queues: vec!["default".into()],
        job_types: vec![("mail".into(), 30)],
        limit: 2,
    };
    let finishes = db
        .store
        .job_fetch(&params)
        .await
        .unwrap()
        .into_iter()
        .map(|job| Finish {
            id: job.id,
            lease_token: job.lease_token,
            attempt: job.attempt,
            outcome: if job.id == ids[0] {
                FinishOutcome::Failed { error: "no such mailbox".into() }
            } else {
                FinishOutcome::Completed {
                    output: None,
                    children: Vec::new().into(),
                    batches: Default::default(),
                    workflows: Default::default(),
                    events: Default::default(),
                    schedules: Default::default(),
                }
            },
            log: json!({}),
            progress: None,
            concurrency_key: None,
            batch_id: None,
            traceparent: None,
        })
        .collect();
    db.store.job_finish(finishes).await.unwrap();
    let retried = jobhost(&db, &["retry", &ids[0].to_string()]);
    assert!(retried.status.success(), "{}", stderr(&retried));

    let mut documents: Vec<Value> =
        stdout(&jobhost(&db, &["jobs", "--json"])).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for id in &ids {
        documents.push(serde_json::from_str(&stdout(&jobhost(&db, &["job", &id.to_string(), "--json"]))).unwrap());
    }
    let mut times = Vec::new();
    for document in &documents {
        collect_times(document, &mut times);
    }
    // enqueued_at of each listing and detail, started_at and finished_at
    // of the completed job, run_at of both details, and the error's at.
    assert!(times.len() >= 10, "{times:?} in {documents:?}");
    for time in &times {
        assert!(fixed_width_utc(time), "{time:?} is not YYYY-MM-DDTHH:MM:SS.ffffffZ");
    }
}

/// The text of every timestamp field (`…_at`, or an error entry's `at`) in a document.
fn collect_times(value: &Value, times: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields {
                match field {
                    Value::String(text) if key == "at" || key.ends_with("_at") => times.push(text.clone()),
                    _ => collect_times(field, times),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_times(item, times)),
        _ => {}
    }
}

/// Whether `text` is `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
fn fixed_width_utc(text: &str) -> bool {
    let pattern = "dddd-dd-ddTdd:dd:dd.ddddddZ";
    text.len() == pattern.len()
        && text.chars().zip(pattern.chars()).all(|(c, p)| if p == 'd' { c.is_ascii_digit() } else { c == p })
}

/// A binary whose migrations stop short of the database's refuses it, naming
/// both versions, instead of failing on the migrator's "migration … missing".
async fn an_older_binary_refuses_a_database_a_newer_one_migrated(db: TestDb) {
    let dir = db.dialect("postgres", "sqlite");
    let known = std::fs::read_dir(format!("{}/migrations/{dir}", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
        .filter_map(|entry| entry.unwrap().file_name().to_str()?.split('_').next()?.parse::<i64>().ok())
        .max()
        .unwrap();
    let newer = known + 2;
    let checksum = db.dialect("'\\x00'::bytea", "x'00'");
    db.execute(format!(
        "INSERT INTO jobhost._sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ({newer}, 'from a newer jobhost', TRUE, {checksum}, 0)"
    ))
    .await;
    let refused = jobhost(&db, &["migrate"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stdout(&refused));
    let expected = format!(
        "this database was migrated by a newer jobhost (schema version {newer}; this binary knows up to {known}): \
         upgrade jobhost"
    );
    assert!(stderr(&refused).contains(&expected), "{}", stderr(&refused));
    assert!(matches!(
        db.store.schema_migrate().await,
        Err(jobhost::store::Error::SchemaTooNew { database, known: k }) if database == newer && k == known
    ));
}

/// Commands that read or change existing jobs never create the embedded
/// file: a mistyped path is reported as missing and leaves nothing behind.
#[test]
fn commands_on_a_missing_file_say_so_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("typo.db").display());
    for args in [
        vec!["stats"],
        vec!["stats", "--json"],
        vec!["jobs"],
        vec!["job", "1"],
        vec!["concurrency"],
        vec!["retry", "1"],
        vec!["cancel", "1"],
        vec!["queue", "pause", "default"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_jobhost"))
            .args(&args)
            .env("DATABASE_URL", &url)
            .env("RUST_LOG", "error")
            .output()
            .expect("run jobhost");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let expected = format!("the database file {} does not exist", dir.path().join("typo.db").display());
        assert!(stderr(&output).contains(&expected), "{args:?}: {}", stderr(&output));
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(files.is_empty(), "{args:?} left {files:?}");
    }
    let migrated = Command::new(env!("CARGO_BIN_EXE_jobhost"))
        .args(["migrate", "--database-url", &url])
        .env("RUST_LOG", "error")
        .output()
        .expect("run jobhost");
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    assert!(dir.path().join("typo.db").exists(), "migrate creates the file");
}

/// A count of 0 where it would do nothing (a page of no jobs) or stall a
/// host (no run slots, no result writes) is refused by its flag's name,
/// before anything opens the database or starts.
#[test]
fn a_count_of_zero_is_refused_by_its_flag() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("jobhost.db").display());
    for (args, flag) in [
        (vec!["jobs", "--limit", "0"], "--limit"),
        (vec!["jobs", "--limit=-3"], "--limit"),
        (vec!["run", "--components", "components", "--concurrency", "0"], "--concurrency"),
        (vec!["run", "--components", "components", "--result-writes", "0"], "--result-writes"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_jobhost"))
            .args(&args)
            .env("DATABASE_URL", &url)
            .env("RUST_LOG", "error")
            .output()
            .expect("run jobhost");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let said = stderr(&output);
        assert!(said.contains(flag) && said.contains("at least 1 (e.g. 10)"), "{args:?}: {said}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{args:?} created a file");
    }
}

/// A database without jobhost's schema is named with the command that
/// makes it, and nothing is left half made: an enqueue into a new embedded
/// file creates and migrates it, as a host would; an empty file, or an empty
/// PostgreSQL database, is refused by every command but `migrate` and `run`.
#[tokio::test]
async fn a_database_without_the_schema_is_named_with_the_command_that_makes_it() {
    let dir = tempfile::tempdir().unwrap();
    let run = |url: Option<&str>, args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_jobhost"));
        command.args(args).current_dir(dir.path()).env_remove("DATABASE_URL").env("RUST_LOG", "error");
        if let Some(url) = url {
            command.env("DATABASE_URL", url);
        }
        command.output().expect("run jobhost")
    };
    let enqueued = run(None, &["enqueue", "hello", "--payload", "{}"]);
    assert_eq!(enqueued.status.code(), Some(2));
    assert!(stderr(&enqueued).contains("unknown job type \"hello\""), "{}", stderr(&enqueued));
    assert!(stderr(&enqueued).contains("`jobhost deploy COMPONENT.wasm`"), "how to register it: {}", stderr(&enqueued));
    for args in [&["jobs"][..], &["stats"], &["concurrency"]] {
        let read = run(None, args);
        assert!(read.status.success(), "{args:?} on the file enqueue made: {}", stderr(&read));
    }

    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let sqlite = format!("sqlite://{}", empty.display());
    let admin = sqlx::PgPool::connect(&format!("{}/postgres", common::db::server_url())).await.unwrap();
    let name = format!("jobhost_unmigrated_{}", std::process::id());
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}"))).execute(&admin).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&admin).await.unwrap();
    let postgres = format!("{}/{name}", common::db::server_url());
    for url in [sqlite.as_str(), postgres.as_str()] {
        let mut commands = vec![&["jobs"][..], &["stats"], &["components"]];
        if url.starts_with("postgres") {
            commands.push(&["enqueue", "hello", "--payload", "{}"]);
        }
        for args in commands {
            let refused = run(Some(url), args);
            assert_eq!(refused.status.code(), Some(2), "{url} {args:?}");
            let said = stderr(&refused);
            assert!(said.contains("has no jobhost schema yet: run `jobhost migrate` first"), "{url} {args:?}: {said}");
        }
        // At the level an operator sees by default: a fresh database has no
        // fleet to build indexes around, so nothing is said of that.
        let mut migrate = Command::new(env!("CARGO_BIN_EXE_jobhost"));
        migrate.args(["migrate"]).env("DATABASE_URL", url).env_remove("RUST_LOG");
        let migrated = migrate.output().expect("run jobhost");
        assert!(migrated.status.success(), "{url}: {}", stderr(&migrated));
        assert!(!stderr(&migrated).contains("concurrently"), "{url}: {}", stderr(&migrated));
        assert!(run(Some(url), &["jobs"]).status.success(), "{url}: usable once migrated");
    }
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)"))).execute(&admin).await.unwrap();
}

/// A time or a duration that does not parse is refused with the form
/// expected and an example, not the parser's own words.
#[test]
fn a_bad_time_or_duration_shows_the_form_expected() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("jobhost.db").display());
    let components = tempfile::tempdir().unwrap();
    let components = components.path().to_str().unwrap();
    let duration = "give one such as 30s, 5m, 2h or 7days";
    for (args, said) in [
        (vec!["enqueue", "hello", "--at", "2026-12-24T18:00:00"], "such as 2026-12-24T18:00:00Z"),
        (vec!["enqueue", "hello", "--at", "tomorrow"], "give an RFC 3339 time with its zone"),
        (vec!["enqueue", "hello", "--delay", "-5s"], "must not be negative: give a duration such as 30s"),
        (vec!["enqueue", "hello", "--delay", "soon"], duration),
        (vec!["run", "--components", components, "--retention", "forever"], duration),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_jobhost"))
            .args(&args)
            .env("DATABASE_URL", &url)
            .env("RUST_LOG", "error")
            .output()
            .expect("run jobhost");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let text = stderr(&output);
        assert!(text.contains(said), "{args:?}: {text}");
        assert!(!text.contains("expected number at") && !text.contains("unexpected argument"), "{args:?}: {text}");
    }
}

/// A host's setting that cannot work is named by its flag, with what to
/// give instead, before anything starts (no database file is made).
#[test]
fn a_setting_that_cannot_work_names_its_flag_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("jobhost.db").display());
    let components = tempfile::tempdir().unwrap();
    for (flags, said) in [
        (vec!["--poll", "0s"], "--poll must be positive (e.g. --poll 1s)"),
        (vec!["--heartbeat", "0s"], "--heartbeat must be positive"),
        (vec!["--lease", "1s"], "--lease must be at least twice --heartbeat"),
        (vec!["--maintenance-interval", "0s"], "--maintenance-interval must be positive"),
        (vec!["--prefetch-wait", "0s"], "--prefetch-wait must be positive"),
        (vec!["--max-output", "32MiB"], "--run-budget (default 16MiB) must be at least --max-output"),
        (vec!["--queues", "Not A Queue"], "--queues: \"Not A Queue\" is not a queue name"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_jobhost"))
            .args(["run", "--components"])
            .arg(components.path())
            .args(&flags)
            .env("DATABASE_URL", &url)
            .env("RUST_LOG", "error")
            .output()
            .expect("run jobhost");
        assert_eq!(output.status.code(), Some(2), "{flags:?}");
        let text = stderr(&output);
        assert!(text.contains(said), "{flags:?}: {text}");
        assert!(!text.contains("invalid setting"), "{flags:?} names an internal field: {text}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{flags:?} made a database file");
    }
}

/// Runs the binary without a database, with a private component cache.
fn offline(args: &[&str], cache: &tempfile::TempDir) -> Output {
    Command::new(env!("CARGO_BIN_EXE_jobhost"))
        .args(args)
        .env("JOBHOST_CACHE_DIR", cache.path())
        .env("RUST_LOG", "error")
        .output()
        .expect("run jobhost")
}

#[test]
fn inspect_prints_the_validated_config_as_one_json_object() {
    let cache = tempfile::tempdir().unwrap();
    let limited = common::guest("limited");
    let output = offline(&["inspect", limited.to_str().unwrap()], &cache);
    assert!(output.status.success(), "{}", stderr(&output));
    let config: Value = serde_json::from_str(stdout(&output).trim()).expect("one JSON object");
    assert_eq!(config["name"], "limited");
    assert_eq!(config["queue"], "default");
    assert_eq!(config["max_attempts"], 20);
    assert!(config["timeout_ms"].is_u64() && config["priority"].is_i64());
    assert_eq!(config["concurrency"], json!({"limit": 2, "key": "{key}", "duration_secs": 10, "on_conflict": "block"}));

    let bad = common::guest("misconfigured");
    let output = offline(&["inspect", bad.to_str().unwrap()], &cache);
    assert_eq!(output.status.code(), Some(2));
    assert!(stdout(&output).is_empty());
    assert!(stderr(&output).contains("concurrency.limit"), "{}", stderr(&output));
}

#[test]
fn exec_prints_the_output_on_stdout_and_why_it_failed_on_stderr() {
    let cache = tempfile::tempdir().unwrap();
    let path = |name: &str| common::guest(name).to_str().unwrap().to_string();
    // With the default log filter, as a person runs it.
    let hello = Command::new(env!("CARGO_BIN_EXE_jobhost"))
        .args(["exec", &path("hello"), "--payload", r#"{"name": "Ada"}"#])
        .env("JOBHOST_CACHE_DIR", cache.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("run jobhost");
    assert!(hello.status.success(), "{}", stderr(&hello));
    let out: Value = serde_json::from_str(stdout(&hello).trim()).expect("stdout is the output alone");
    assert_eq!(out["greeting"], "hello, Ada");
    assert!(stderr(&hello).contains("log [info] greeting Ada"), "{}", stderr(&hello));
    assert_eq!(stderr(&hello).matches("greeting Ada").count(), 1, "the log line once: {}", stderr(&hello));

    for (guest, payload, reason) in [
        ("trap", r#"{"message": "the disk is lava"}"#, "the disk is lava"),
        ("spin", "{}", "timed out after 500 ms (ran "),
        ("hog", "{}", "exceeded its memory limit"),
        ("flaky", r#"{"fail_times": 1}"#, "retry: attempt 1 failed on purpose"),
    ] {
        let run = offline(&["exec", &path(guest), "--payload", payload], &cache);
        assert_eq!(run.status.code(), Some(1), "{guest}");
        assert!(stdout(&run).is_empty(), "{guest}: {}", stdout(&run));
        assert!(stderr(&run).contains(reason), "{guest}: {}", stderr(&run));
        let ran = stderr(&run).lines().last().unwrap_or_default().to_string();
        assert!(ran.matches(" after ").count() <= 1, "{guest}: says how long once: {ran}");
        assert!(ran.contains(" ms"), "{guest}: in milliseconds: {ran}");
    }
    let not_json = offline(&["exec", &path("hello"), "--payload", "{"], &cache);
    assert_eq!(not_json.status.code(), Some(2));
    let not_an_object = offline(&["exec", &path("hello"), "--payload", r#""Ada""#], &cache);
    assert_eq!(not_an_object.status.code(), Some(2));
    assert!(stderr(&not_an_object).contains("--payload must be a JSON object"), "{}", stderr(&not_an_object));
    assert!(stderr(&not_an_object).contains("got a string"), "{}", stderr(&not_an_object));
}

async fn concurrency_lists_keys_and_a_raise_refusal_exits_with_code_3(db: TestDb) {
    let mut config = job_config("sync");
    config.concurrency = Some(jobhost::types::ConcurrencyConfig {
        limit: 1,
        key: jobhost::template::KeyTemplate::parse("acct:{id}").unwrap(),
        duration_secs: 30,
        on_conflict: jobhost::types::OnConflict::Raise,
    });
    let mut blocking = config.clone();
    blocking.name = "sync_later".into();
    blocking.concurrency.as_mut().unwrap().on_conflict = jobhost::types::OnConflict::Block;
    db.store.job_types_register(&[(config, "a".into()), (blocking, "b".into())]).await.unwrap();

    let first = jobhost(&db, &["enqueue", "sync", "--payload", r#"{"id": 7}"#]);
    assert!(first.status.success(), "{}", stderr(&first));
    let refused = jobhost(&db, &["enqueue", "sync", "--payload", r#"{"id": 7}"#]);
    assert_eq!(refused.status.code(), Some(3), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("slots of key \"acct:7\" are taken"), "{}", stderr(&refused));

    jobhost(&db, &["enqueue", "sync_later", "--payload", r#"{"id": 7}"#]);
    let blocked = jobhost(&db, &["enqueue", "sync_later", "--payload", r#"{"id": 7}"#]);
    let blocked_id = stdout(&blocked).trim().to_string();

    let listed = jobhost(&db, &["concurrency", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let keys: Vec<Value> = stdout(&listed).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(keys.len(), 2);
    let later = keys.iter().find(|k| k["job"] == "sync_later").unwrap();
    assert_eq!(
        (later["key"].as_str(), later["limit"].as_i64(), later["holders"].as_i64()),
        (Some("acct:7"), Some(1), Some(1))
    );
    assert_eq!(later["blocked"], 1);
    assert_eq!(later["holding"][0]["state"], "available");
    let human = jobhost(&db, &["concurrency"]);
    assert!(stdout(&human).contains("sync_later \"acct:7\": 1/1 slots"), "{}", stdout(&human));

    let cancelled = jobhost(&db, &["cancel", &blocked_id]);
    assert!(cancelled.status.success(), "{}", stderr(&cancelled));
    assert_eq!(db.scalar("SELECT count(*) FROM jobhost.blocked_jobs").await, 0);
}

#[tokio::test]
async fn with_no_database_flag_commands_share_the_embedded_file_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let default_file = format!("sqlite://{}", dir.path().join("jobhost.db").display());
    let store = jobhost::store::Store::new(jobhost::store::sqlite::SqliteStore::open(&default_file, 2).await.unwrap());
    store.schema_migrate().await.unwrap();
    store.job_types_register(&[(job_config("mail"), "d".into())]).await.unwrap();
    let bare = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_jobhost"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "error")
            .output()
            .expect("run jobhost")
    };
    let enqueued = bare(&["enqueue", "mail", "--payload", r#"{"to": "ada"}"#]);
    assert!(enqueued.status.success(), "{}", stderr(&enqueued));
    let id = stdout(&enqueued).trim().to_string();
    let listed = bare(&["jobs"]);
    assert!(stdout(&listed).contains(&format!("{id}  available  mail")), "{}", stdout(&listed));
    assert!(stdout(&bare(&["stats"])).contains("available  1"));
    assert!(bare(&["concurrency"]).status.success());
    let job = store.job_get(id.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(job.payload, json!({"to": "ada"}), "the CLI wrote to ./jobhost.db");
}

/// Issue 34: the operator's side of outbound HTTP, through the database.
/// A grant is stored in its printed form, replaced by a second grant of
/// the same origin, listed, and revoked; a bad pattern, method or secret
/// name is refused with the reason and nothing is stored.
async fn grants_are_stored_listed_replaced_and_revoked(db: TestDb) {
    let granted = jobhost(
        &db,
        &["grant", "mail", "HTTPS://API.Mailgun.net:443/", "--methods", "post", "--secret", "MAILGUN_KEY"],
    );
    assert!(granted.status.success(), "{}", stderr(&granted));
    assert!(stdout(&granted).contains("granted: mail may reach https://api.mailgun.net"), "{}", stdout(&granted));
    // A secret the grant names that no host can open is said at once, and
    // marked in the list, before any run meets it.
    let unset = "warning: secret MAILGUN_KEY is not set (`jobhost secret set MAILGUN_KEY`): every run of mail waits";
    assert!(stderr(&granted).contains(unset), "{}", stderr(&granted));
    let listed = stdout(&jobhost(&db, &["grants", "--json"]));
    assert!(listed.contains(r#""secret_problems":["secret MAILGUN_KEY is not set"#), "{listed}");
    let table = stdout(&jobhost(&db, &["grants"]));
    assert!(table.contains("  ! secret MAILGUN_KEY is not set"), "{table}");
    let with_key = |key: &str, args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut command = Command::new(env!("CARGO_BIN_EXE_jobhost"));
        command.args(args).env("DATABASE_URL", &db.url).env("RUST_LOG", "error").env("JOBHOST_SECRET_KEY", key);
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let (sealing, other) = ("11".repeat(32), "22".repeat(32));
    assert!(with_key(&sealing, &["secret", "set", "MAILGUN_KEY"], "key-value").status.success());
    let args = ["grant", "mail", "https://api.mailgun.net", "--methods", "post", "--secret", "MAILGUN_KEY"];
    let matching = with_key(&sealing, &args, "");
    assert!(matching.status.success() && stderr(&matching).is_empty(), "{}", stderr(&matching));
    let mismatched = with_key(&other, &args, "");
    assert!(stderr(&mismatched).contains("secret MAILGUN_KEY is sealed with key "), "{}", stderr(&mismatched));
    assert!(jobhost(&db, &["secret", "delete", "MAILGUN_KEY"]).status.success());
    let local = jobhost(&db, &["grant", "mail", "http://localhost:8025", "--private"]);
    assert!(local.status.success(), "{}", stderr(&local));
    let listed = stdout(&jobhost(&db, &["grants", "--json"]));
    let grants: Vec<Value> = listed.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(grants.len(), 2, "{listed}");
    assert_eq!(
        (&grants[1]["origin"], &grants[1]["methods"], &grants[1]["secrets"], &grants[1]["private"]),
        (&json!("https://api.mailgun.net"), &json!(["POST"]), &json!(["MAILGUN_KEY"]), &json!(false))
    );
    assert_eq!(
        (&grants[0]["origin"], &grants[0]["private"]),
        (&json!("http://localhost:8025"), &json!(true)),
        "by origin"
    );

    let again = jobhost(&db, &["grant", "mail", "https://api.mailgun.net", "--methods", "GET,POST"]);
    assert!(stdout(&again).starts_with("changed:"), "{}", stdout(&again));
    let listed = stdout(&jobhost(&db, &["grants", "mail", "--json"]));
    let one: Value = serde_json::from_str(listed.lines().nth(1).unwrap()).unwrap();
    assert_eq!((&one["methods"], &one["secrets"]), (&json!(["GET", "POST"]), &json!([])), "replaced whole");
    let table = stdout(&jobhost(&db, &["grants"]));
    assert!(table.contains("mail https://api.mailgun.net: GET,POST"), "{table}");

    let timed = [
        "--first-byte-timeout",
        "2m",
        "--between-bytes-timeout",
        "1500ms",
        "--secret-in",
        "query,body",
        "--secret-header",
        "Authorization,x-api-key",
    ];
    let timed =
        jobhost(&db, &[&["grant", "mail", "https://api.mailgun.net", "--methods", "GET,POST"][..], &timed].concat());
    assert!(timed.status.success(), "{}", stderr(&timed));
    let listed = stdout(&jobhost(&db, &["grants", "mail", "--json"]));
    let one: Value = serde_json::from_str(listed.lines().nth(1).unwrap()).unwrap();
    assert_eq!(one["timeouts"], json!({"connect_ms": null, "first_byte_ms": 120000, "between_bytes_ms": 1500}));
    assert_eq!(one["secrets_in"], json!(["query", "body"]));
    assert_eq!(one["secret_headers"], json!(["authorization", "x-api-key"]));
    let table = stdout(&jobhost(&db, &["grants"]));
    // Wrapped at 80 columns: read as one text.
    let text = table.split_whitespace().collect::<Vec<_>>().join(" ");
    let facts = "GET,POST, secrets also in the query and body, secrets in headers authorization,x-api-key only, \
                 timeouts: first byte 2m";
    assert!(text.contains(facts), "{table}");
    assert!(table.lines().all(|line| line.chars().count() <= 80), "{table}");

    for (args, message) in [
        (vec!["grant", "mail", "api.mailgun.net"], "is not an origin pattern"),
        (vec!["grant", "mail", "https://a.example/path"], "no path, query or user"),
        (vec!["grant", "mail", "https://a.example", "--methods", "G3T"], "is not an HTTP method"),
        (vec!["grant", "mail", "https://a.example", "--secret", "lower"], "is not a secret name"),
        (vec!["grant", "mail", "https://a.example", "--connect-timeout", "2h"], "is not between 1ms and 1h"),
        (vec!["grant", "mail", "https://a.example", "--connect-timeout", "soon"], "is not a duration like 30s"),
        (vec!["grant", "mail", "https://a.example", "--secret-in", "headers"], "is not a place for secrets"),
    ] {
        let refused = jobhost(&db, &args);
        assert!(!refused.status.success() && stderr(&refused).contains(message), "{args:?}: {}", stderr(&refused));
    }
    assert_eq!(stdout(&jobhost(&db, &["grants", "--json"])).lines().count(), 2, "nothing stored");

    let revoked = jobhost(&db, &["revoke", "mail", "https://api.mailgun.net"]);
    assert!(revoked.status.success(), "{}", stderr(&revoked));
    let missing = jobhost(&db, &["revoke", "mail", "https://api.mailgun.net"]);
    assert!(!missing.status.success() && stderr(&missing).contains("has no grant for https://api.mailgun.net"));
    assert_eq!(stdout(&jobhost(&db, &["grants", "--json"])).lines().count(), 1);
}

/// `jobhost var`: a job type's plain variables are set, listed with their
/// values, replaced and unset; a bad name or an oversized value is refused
/// and stores nothing.
async fn variables_are_set_listed_and_unset(db: TestDb) {
    let set = jobhost(&db, &["var", "set", "mail", "REGION", "eu-west"]);
    assert!(set.status.success(), "{}", stderr(&set));
    assert!(stdout(&set).starts_with("set: mail's runs see REGION"), "{}", stdout(&set));
    let again = jobhost(&db, &["var", "set", "mail", "REGION", "us-east"]);
    assert!(stdout(&again).starts_with("changed:"), "{}", stdout(&again));
    jobhost(&db, &["var", "set", "thumbs", "SIZE", "128"]);
    let listed = stdout(&jobhost(&db, &["var", "list", "--json"]));
    let all: Vec<Value> = listed.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let pairs: Vec<(&str, &str, &str)> = all
        .iter()
        .map(|v| (v["job_type"].as_str().unwrap(), v["name"].as_str().unwrap(), v["value"].as_str().unwrap()))
        .collect();
    assert_eq!(pairs, [("mail", "REGION", "us-east"), ("thumbs", "SIZE", "128")]);
    let table = stdout(&jobhost(&db, &["var", "list", "mail"]));
    assert!(table.starts_with("mail REGION=us-east  updated "), "{table}");

    let long = "x".repeat(jobhost::store::variable::MAX_VALUE_BYTES + 1);
    for (args, message) in [
        (vec!["var", "set", "mail", "region", "x"], "is not a variable name"),
        (vec!["var", "set", "mail", "BIG", long.as_str()], "a variable holds at most"),
    ] {
        let refused = jobhost(&db, &args);
        assert!(!refused.status.success() && stderr(&refused).contains(message), "{message}: {}", stderr(&refused));
    }
    assert_eq!(stdout(&jobhost(&db, &["var", "list", "--json"])).lines().count(), 2, "nothing stored");

    assert!(jobhost(&db, &["var", "unset", "mail", "REGION"]).status.success());
    let missing = jobhost(&db, &["var", "unset", "mail", "REGION"]);
    assert!(!missing.status.success() && stderr(&missing).contains("mail has no variable REGION"));
    assert_eq!(stdout(&jobhost(&db, &["var", "list", "--json"])).lines().count(), 1);
}

/// `jobhost secret`: a value is sealed with the key from the environment
/// (read from stdin, a variable or a file), listed by name and key only,
/// replaced and deleted; without a key nothing is stored.
async fn secrets_are_sealed_listed_by_name_and_deleted(db: TestDb) {
    let key = String::from_utf8(jobhost(&db, &["secret", "new-key"]).stdout).unwrap().trim().to_string();
    assert_eq!(key.len(), 64, "{key}");
    let secret = |args: &[&str], key: Option<&str>, stdin: &str| {
        use std::io::Write;
        let mut command = Command::new(env!("CARGO_BIN_EXE_jobhost"));
        command.args(args).env("DATABASE_URL", &db.url).env("RUST_LOG", "error").env("MAIL_TOKEN", "from-env-value");
        command.env_remove("JOBHOST_SECRET_KEY").env_remove("JOBHOST_SECRET_KEY_FILE");
        if let Some(key) = key {
            command.env("JOBHOST_SECRET_KEY", key);
        }
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let keyless = secret(&["secret", "set", "API_KEY"], None, "value\n");
    assert!(!keyless.status.success() && stderr(&keyless).contains("no key to seal with"), "{}", stderr(&keyless));
    let set = secret(&["secret", "set", "API_KEY"], Some(&key), "sk_live_value\n");
    assert!(set.status.success(), "{}", stderr(&set));
    assert!(stdout(&set).starts_with("set API_KEY (sealed with key "), "{}", stdout(&set));
    let from_env = secret(&["secret", "set", "MAIL_TOKEN", "--from-env", "MAIL_TOKEN"], Some(&key), "");
    assert!(stdout(&from_env).starts_with("set MAIL_TOKEN"), "{}", stderr(&from_env));
    let again = secret(&["secret", "set", "API_KEY"], Some(&key), "sk_live_other");
    assert!(stdout(&again).starts_with("replaced API_KEY"), "{}", stdout(&again));
    let bad = secret(&["secret", "set", "lower"], Some(&key), "x");
    assert!(stderr(&bad).contains("is not a secret name"), "{}", stderr(&bad));

    let listed = stdout(&jobhost(&db, &["secret", "list", "--json"]));
    let names: Vec<String> =
        listed.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["name"].as_str().unwrap().into()).collect();
    assert_eq!(names, ["API_KEY", "MAIL_TOKEN"]);
    let table = stdout(&jobhost(&db, &["secret", "list"]));
    for shown in [&listed, &table] {
        assert!(!shown.contains("sk_live") && !shown.contains("from-env-value"), "{shown}");
    }
    assert!(jobhost(&db, &["secret", "delete", "API_KEY"]).status.success());
    let missing = jobhost(&db, &["secret", "delete", "API_KEY"]);
    assert!(stderr(&missing).contains("no secret API_KEY"), "{}", stderr(&missing));
}

on_both_backends!(
    variables_are_set_listed_and_unset,
    secrets_are_sealed_listed_by_name_and_deleted,
    grants_are_stored_listed_replaced_and_revoked,
    enqueue_prints_ids_and_refuses_bad_input_with_exit_code_2,
    bulk_enqueue_from_a_file_is_all_or_nothing,
    jobs_and_stats_print_the_documented_json,
    cancel_and_retry_report_what_they_did,
    concurrency_lists_keys_and_a_raise_refusal_exits_with_code_3,
    queues_pause_payloads_are_limited_and_running_jobs_cancel,
    json_timestamps_have_one_fixed_width,
    an_older_binary_refuses_a_database_a_newer_one_migrated,
);

/// SQLite only: the file's locks. A host creating and migrating a new file
/// while other processes open it (`jobhost migrate` and four `jobhost stats`
/// started with it, then `stats` in a loop) must not fail, nor make them
/// fail, on the file being locked.
#[tokio::test]
async fn commands_racing_a_host_that_creates_the_file_never_meet_a_locked_database() {
    let dir = tempfile::tempdir().unwrap();
    let components = dir.path().join("components");
    std::fs::create_dir(&components).unwrap();
    std::fs::copy(common::guest("hello"), components.join("hello.wasm")).unwrap();
    let cache = dir.path().join("cache");
    let command = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_jobhost"));
        command.args(args).current_dir(dir.path()).env_remove("DATABASE_URL").env("RUST_LOG", "warn");
        command.env("JOBHOST_CACHE_DIR", &cache);
        command
    };
    for round in 0..10 {
        let _ = std::fs::remove_file(dir.path().join("jobhost.db"));
        let mut host =
            command(&["run", "--components", "components"]).stderr(Stdio::piped()).spawn().expect("start jobhost run");
        let piped = |args: &[&str]| command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let migrate = piped(&["migrate"]);
        let openers: Vec<_> = (0..4).map(|_| piped(&["stats"])).collect();
        let mut up = false;
        for _ in 0..400 {
            let stats = command(&["stats"]).output().unwrap();
            assert!(!stderr(&stats).contains("locked"), "round {round}: stats: {}", stderr(&stats));
            if stdout(&stats).contains("hosts alive: 1") {
                up = true;
                break;
            }
            if let Some(status) = host.try_wait().unwrap() {
                let output = host.wait_with_output().unwrap();
                panic!("round {round}: the host exited ({status}): {}", stderr(&output));
            }
        }
        // SAFETY: kill(2) on a child this test started and has not reaped.
        unsafe { libc::kill(host.id() as libc::pid_t, libc::SIGTERM) };
        let output = host.wait_with_output().unwrap();
        assert!(up, "round {round}: the host never came up: {}", stderr(&output));
        let migrated = migrate.wait_with_output().unwrap();
        assert!(migrated.status.success(), "round {round}: migrate: {}", stderr(&migrated));
        for opener in openers {
            let stats = opener.wait_with_output().unwrap();
            assert!(!stderr(&stats).contains("locked"), "round {round}: stats: {}", stderr(&stats));
        }
        assert!(output.status.success(), "round {round}: {}", stderr(&output));
        assert!(!stderr(&output).contains("locked"), "round {round}: host: {}", stderr(&output));
        for file in ["jobhost.db", "jobhost.db-wal", "jobhost.db-shm"] {
            let _ = std::fs::remove_file(dir.path().join(file));
        }
    }
}

/// A second SIGTERM while a host waits for its running jobs (a long grace
/// period) exits at once, non-zero, saying why; the first one only began
/// the graceful shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_a_host_at_once() {
    let db = TestDb::new(common::db::Backend::Sqlite).await;
    let components = common::fleet::components(&["sleep"]);
    let cache = tempfile::tempdir().unwrap();
    let log = cache.path().join("host.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_jobhost"));
    command
        .args(["run", "--no-migrate", "--heartbeat", "250ms", "--poll", "100ms", "--grace", "10m"])
        .arg("--components")
        .arg(components.path())
        .arg("--cache-dir")
        .arg(cache.path())
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut host = common::fleet::Host::start(&mut command);
    let logged = |text: &'static str| {
        let log = log.clone();
        move || {
            let log = log.clone();
            async move { std::fs::read_to_string(&log).unwrap_or_default().contains(text) }
        }
    };
    common::eventually(Duration::from_secs(60), logged("worker running")).await;
    db.store.job_enqueue(&[EnqueueParams::new("sleep", json!({"ms": 600_000}))]).await.unwrap();
    common::eventually(Duration::from_secs(60), || async {
        db.scalar("SELECT count(*) FROM jobhost.jobs WHERE state = 'running'").await == 1
    })
    .await;

    host.signal(libc::SIGTERM);
    common::eventually(Duration::from_secs(60), logged("shutdown requested")).await;
    assert!(host.is_running(), "the first signal waits for the running job");
    host.signal(libc::SIGTERM);
    let status = host.wait().await;
    assert_eq!(status.code(), Some(130), "{status}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("second signal"), "{text}");
}
