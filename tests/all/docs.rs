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
