//! One rule for keys (docs/concurrency.md, "Keys"): the same payload gives
//! the same concurrency key whoever enqueues it (the CLI, the Rust client,
//! `jobhost.enqueue` in SQL, a running job) on either backend, every path
//! refuses the same payloads, and a payload's numbers keep their exact value
//! from enqueue to the guest and back.

use crate::common;

use std::time::Duration;

use jobhost::store::JobState;
use jobhost::template::KeyTemplate;
use jobhost::types::{ConcurrencyConfig, OnConflict};
use serde_json::Value;

use common::db::{Backend, TestDb, jobhost, on_both_backends};
use common::{TestHost, eventually, job_config};

const WITHIN: Duration = Duration::from_secs(60);

/// A limited job type no host serves, so its jobs stay where enqueue put them.
const KEYED: &str = "keyed";

/// The value of the payload's field `v`, as JSON text, and the key it gives
/// under the template `k:{v}`.
const RENDERED: &[(&str, &str)] = &[
    ("1e2", "k:100"),
    ("100", "k:100"),
    ("1E+2", "k:100"),
    ("1.0", "k:1.0"),
    ("-0", "k:0"),
    ("-0.0", "k:0.0"),
    ("1.50e1", "k:15.0"),
    ("1e-3", "k:0.001"),
    ("18446744073709551617", "k:18446744073709551617"),
    ("-0.1234567890123456789012345678901234567890", "k:-0.1234567890123456789012345678901234567890"),
    ("true", "k:true"),
    (r#""""#, "k:"),
    (r#""Zürich ✓ 😀""#, "k:Zürich ✓ 😀"),
    (r#""caf\u00e9 \ud83d\ude00""#, "k:café 😀"),
    (r#""a \"quoted\" {brace} \\ tab\t""#, "k:a \"quoted\" {brace} \\ tab\t"),
];

/// Payloads every path refuses, with what the refusal says. The SQL enqueue
/// says the same but for a key too long, which the table's check refuses.
const REFUSED: &[(&str, &str, &str)] = &[
    (r#"{"other": 1}"#, r#"payload has no field "v" for key "k:{v}""#, ""),
    (r#"{"v": null}"#, r#"payload has no field "v" for key "k:{v}""#, ""),
    (r#"{"v": {"a": 1}}"#, r#"field "v" for key "k:{v}" must be a string, number or boolean"#, ""),
    (r#"{"v": [1]}"#, r#"field "v" for key "k:{v}" must be a string, number or boolean"#, ""),
    (r#"{"v": 1e2000}"#, "more than the most a key may have, 1024 bytes", "concurrency_key_at_most_1024_bytes"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Cli,
    Client,
    Sql,
    /// A running `fanout` job's `enqueue`, written with its completion.
    Child,
}

/// Every path that `db` offers: the SQL enqueue is PostgreSQL's.
fn paths(db: &TestDb) -> Vec<Path> {
    let mut paths = vec![Path::Cli, Path::Client, Path::Child];
    if db.backend == Backend::Postgres {
        paths.push(Path::Sql);
    }
    paths
}

async fn with_keyed_type(db: &TestDb) {
    let mut config = job_config(KEYED);
    config.concurrency = Some(ConcurrencyConfig {
        limit: 1000,
        key: KeyTemplate::parse("k:{v}").unwrap(),
        duration_secs: 30,
        on_conflict: OnConflict::Block,
    });
    db.store.job_types_register(&[(config, "v1".into())]).await.unwrap();
}

fn parse(payload: &str) -> Value {
    serde_json::from_str(payload).unwrap_or_else(|e| panic!("{payload}: {e}"))
}

/// Enqueues `payload` (JSON text) as a `keyed` job through `path`: the job's
/// id, or the refusal's message.
async fn enqueue(db: &TestDb, path: Path, payload: &str) -> Result<i64, String> {
    match path {
        Path::Cli => {
            let output = jobhost(db, &["enqueue", KEYED, "--payload", payload]);
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            match output.status.code() {
                Some(0) => Ok(String::from_utf8_lossy(&output.stdout).trim().parse().expect("an id")),
                Some(2) => Err(stderr),
                other => panic!("jobhost enqueue exited with {other:?}: {stderr}"),
            }
        }
        Path::Client => {
            let client = jobhost::Client::from_store(db.dyn_store());
            client.enqueue(KEYED, parse(payload)).await.map_err(|e| {
                assert!(matches!(e, jobhost::store::Error::InvalidEnqueue(_)), "{e:?}");
                e.to_string()
            })
        }
        Path::Sql => sqlx::query_scalar("SELECT jobhost.enqueue($1, $2::jsonb)")
            .bind(KEYED)
            .bind(payload)
            .fetch_one(db.pool())
            .await
            .map_err(|e| {
                let code = e.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
                assert!(matches!(code.as_deref(), Some("22023" | "23514")), "{e}");
                e.to_string()
            }),
        Path::Child => {
            let client = jobhost::Client::from_store(db.dyn_store());
            let fanout = format!(r#"{{"count": 1, "job": "{KEYED}", "child": {payload}}}"#);
            let parent = client.enqueue("fanout", parse(&fanout)).await.unwrap();
            let store = db.dyn_store();
            let finished = || async {
                let job = store.job_get(parent).await.unwrap().unwrap();
                matches!(job.row.state, JobState::Completed | JobState::Failed).then_some(job)
            };
            eventually(WITHIN, || async { finished().await.is_some() }).await;
            let job = finished().await.unwrap();
            match job.row.state {
                JobState::Completed => {
                    let child = format!("SELECT id FROM jobhost.jobs WHERE parent_id = {parent}");
                    Ok(db.scalar(child).await)
                }
                _ => Err(job.row.error.unwrap_or_default()),
            }
        }
    }
}

async fn key_of(db: &TestDb, id: i64) -> Option<String> {
    db.store.job_get(id).await.unwrap().expect("job exists").row.concurrency_key
}

async fn every_path_stores_the_same_key(db: TestDb) {
    with_keyed_type(&db).await;
    let host = TestHost::start(&db, &["fanout"], |_| {}).await;
    for (value, expected) in RENDERED {
        let payload = format!(r#"{{"v": {value}, "other": [1, {{"a": 2}}]}}"#);
        for path in paths(&db) {
            let id = enqueue(&db, path, &payload).await.unwrap_or_else(|e| panic!("{path:?} {payload}: {e}"));
            assert_eq!(key_of(&db, id).await.as_deref(), Some(*expected), "{path:?} {payload}");
        }
    }
    host.stop().await;
}

async fn every_path_refuses_the_same_payloads(db: TestDb) {
    with_keyed_type(&db).await;
    let host = TestHost::start(&db, &["fanout"], |_| {}).await;
    for (payload, message, sql_message) in REFUSED {
        for path in paths(&db) {
            let refusal = enqueue(&db, path, payload).await.expect_err(&format!("{path:?} refuses {payload}"));
            let expected = if path == Path::Sql && !sql_message.is_empty() { sql_message } else { message };
            assert!(refusal.contains(expected), "{path:?} {payload}: {refusal}");
        }
    }
    let stored = format!("SELECT count(*) FROM jobhost.jobs WHERE job = '{KEYED}'");
    assert_eq!(db.scalar(stored).await, 0, "nothing was stored");
    host.stop().await;
}

/// An integer past 64 bits and a 40-digit decimal, as a payload's field.
const EXACT: &str = r#"{"big": 18446744073709551617, "negative": -18446744073709551617,
    "decimal": 0.1234567890123456789012345678901234567891, "tiny": 1.0000000000000000000000000000000000000001e-30}"#;

async fn numbers_reach_the_guest_and_come_back_unchanged(db: TestDb) {
    let host = TestHost::start(&db, &["hello"], |_| {}).await;
    let payload = format!(r#"{{"name": "n", "echo": {EXACT}}}"#);
    let client = jobhost::Client::from_store(db.dyn_store());
    let by_client = client.enqueue("hello", parse(&payload)).await.unwrap();
    let by_cli = jobhost(&db, &["enqueue", "hello", "--payload", &payload]);
    assert!(by_cli.status.success(), "{}", String::from_utf8_lossy(&by_cli.stderr));
    let by_cli: i64 = String::from_utf8_lossy(&by_cli.stdout).trim().parse().unwrap();

    // Stored documents may spell a number differently (PostgreSQL writes
    // `1e-30` out in full), never with another value: compare the values'
    // canonical text, the one a key would use.
    let exact = |value: &Value| -> Vec<(String, String)> {
        let object = value.as_object().expect("an object");
        object.iter().map(|(k, v)| (k.clone(), jobhost::template::number_text(&v.to_string()).unwrap())).collect()
    };
    let sent = exact(&parse(EXACT));
    assert_eq!(sent[0], ("big".to_string(), "18446744073709551617".to_string()));
    for id in [by_client, by_cli] {
        eventually(WITHIN, || async { db.store.job_get(id).await.unwrap().unwrap().row.state == JobState::Completed })
            .await;
        let job = db.store.job_get(id).await.unwrap().unwrap();
        assert_eq!(exact(&job.payload["echo"]), sent, "the stored payload");
        assert_eq!(exact(&job.output.unwrap()["echo"]), sent, "what the guest saw, echoed");

        let shown = jobhost(&db, &["job", &id.to_string(), "--json"]);
        let shown: Value = serde_json::from_slice(&shown.stdout).expect("jobhost job prints JSON");
        assert_eq!(exact(&shown["payload"]["echo"]), sent, "jobhost job's payload");
        assert_eq!(exact(&shown["output"]["echo"]), sent, "jobhost job's output");
        let text = serde_json::to_string(&shown).unwrap();
        for digits in ["18446744073709551617", "0.1234567890123456789012345678901234567891"] {
            assert!(text.contains(digits), "{digits} in {text}");
        }
    }
    host.stop().await;
}

/// A random JSON number: sign, leading zero or not, fraction, exponent.
fn random_number() -> String {
    let digits = |n: usize| (0..n).map(|_| char::from(b'0' + fastrand::u8(0..10))).collect::<String>();
    let mut text = String::new();
    if fastrand::bool() {
        text.push('-');
    }
    match fastrand::u8(0..3) {
        0 => text.push('0'),
        _ => {
            text.push(char::from(b'1' + fastrand::u8(0..9)));
            text.push_str(&digits(fastrand::usize(0..25)));
        }
    }
    if fastrand::bool() {
        text.push('.');
        text.push_str(&digits(fastrand::usize(1..25)));
    }
    if fastrand::bool() {
        text.push(if fastrand::bool() { 'e' } else { 'E' });
        text.push_str(["", "+", "-"][fastrand::usize(0..3)]);
        text.push_str(&fastrand::u32(0..60).to_string());
    }
    text
}

// PostgreSQL only: the canonical text is, by definition, what PostgreSQL's
// `->>` gives for a jsonb number; SQLite has no second renderer.
#[tokio::test]
async fn rust_writes_numbers_as_postgres_does() {
    let db = TestDb::postgres().await;
    let numbers: Vec<String> = (0..2000).map(|_| random_number()).collect();
    let postgres: Vec<String> = sqlx::query_scalar(
        "SELECT ('{\"x\": ' || n || '}')::jsonb ->> 'x' FROM unnest($1::text[]) WITH ORDINALITY AS u(n, ord)
         ORDER BY ord",
    )
    .bind(&numbers)
    .fetch_all(db.pool())
    .await
    .unwrap();
    for (number, postgres) in numbers.iter().zip(postgres) {
        assert_eq!(jobhost::template::number_text(number).as_deref(), Ok(postgres.as_str()), "{number}");
    }
}

on_both_backends!(
    every_path_stores_the_same_key,
    every_path_refuses_the_same_payloads,
    numbers_reach_the_guest_and_come_back_unchanged,
);
