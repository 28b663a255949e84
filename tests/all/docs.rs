//! The command-line sessions in the docs are transcripts that run here
//! (trycmd): each ```console block of a doc runs in order, one command per
//! `$ ` line, against a fresh embedded database of that doc's own, and the
//! output (stdout then stderr) and exit code (`? N`, 0 when absent) must be
//! the doc's. A doc example whose output changes fails here. `[..]` in a
//! doc stands for what differs between runs: times, ids of hosts, digests.
//!
//! The sessions run from the repository's root, so they name the example
//! components by their built paths (`guests/dist/NAME.wasm`) and their input
//! files under `docs/examples/`.

use std::path::Path;
use std::time::Duration;

/// The docs whose console sessions run here: each has a test below.
const WITH_SESSIONS: &[&str] = &[
    "docs/batches.md",
    "docs/concurrency.md",
    "docs/deploy.md",
    "docs/events.md",
    "docs/queue.md",
    "docs/schedules.md",
    "docs/uniqueness.md",
    "docs/workflows.md",
];

/// Every fenced block of the README and docs/ that shows a `$ jobhost`
/// session is a `console` block of a doc listed in [`WITH_SESSIONS`]: a
/// session written as plain text, or in a doc no test runs, would drift
/// from the binary unseen.
#[test]
fn every_session_in_the_docs_is_run() {
    let mut docs = vec!["README.md".to_string(), "guests/README.md".to_string()];
    for entry in std::fs::read_dir("docs").unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(path.to_string_lossy().into_owned());
        }
    }
    let mut unrun = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let mut fence: Option<&str> = None;
        for (number, line) in text.lines().enumerate() {
            match (fence, line.trim_start().strip_prefix("```")) {
                (None, Some(info)) => fence = Some(info.trim()),
                (Some(_), Some(_)) => fence = None,
                (Some(info), None)
                    if line.starts_with("$ jobhost")
                        && (info != "console" || !WITH_SESSIONS.contains(&doc.as_str())) =>
                {
                    unrun.push(format!("{doc}:{}: {line} (in a `{info}` block)", number + 1));
                }
                _ => {}
            }
        }
    }
    assert!(unrun.is_empty(), "sessions no test runs:\n{}", unrun.join("\n"));
}

/// Runs the console blocks of `doc` (a path from the repository's root).
fn transcripts_of(doc: &str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let database = format!("sqlite://{}", dir.path().join("jobhost.db").display());
    trycmd::TestCases::new()
        .register_bin("jobhost", Path::new(env!("CARGO_BIN_EXE_jobhost")))
        .env("DATABASE_URL", database)
        // The filter a user gets without RUST_LOG, whatever the test runner has.
        .env("RUST_LOG", "warn,jobhost=info")
        .env("NO_COLOR", "1")
        .timeout(Duration::from_secs(120))
        .case(doc)
        .run();
}

#[test]
fn queue() {
    transcripts_of("docs/queue.md");
}

#[test]
fn uniqueness() {
    transcripts_of("docs/uniqueness.md");
}

#[test]
fn batches() {
    transcripts_of("docs/batches.md");
}

#[test]
fn concurrency() {
    transcripts_of("docs/concurrency.md");
}

#[test]
fn deploy() {
    transcripts_of("docs/deploy.md");
}

#[test]
fn schedules() {
    transcripts_of("docs/schedules.md");
}

#[test]
fn events() {
    transcripts_of("docs/events.md");
}

#[test]
fn workflows() {
    transcripts_of("docs/workflows.md");
}
