//! Every integration suite in one test binary, each a module, sharing
//! `tests/common` as their harness: one link of wasmtime, sqlx, axum and
//! the OpenTelemetry stack instead of one per suite. A new suite is a
//! module here, not a file of its own under `tests/`. `cargo test --test
//! all outbound::` runs one suite; `cargo test --test all NAME` one test.
//!
//! Three suites stay binaries of their own, since they measure a process's
//! reads or memory and must not share the machine with the other suites:
//! `tests/embedded.rs` (the bytes this process reads),
//! `tests/outbound_flood.rs` (its peak resident size) and
//! `tests/http_hostile.rs` (a server's peak resident size under ten
//! listings at once, which the other suites' load makes overlap more).

#[path = "../common/mod.rs"]
mod common;

mod attempts;
mod audit;
mod batch_cli;
mod batch_fleet;
mod batches;
mod cli;
mod cli_tables;
mod concurrency;
mod dashboard;
mod deploy;
mod docs;
mod faults;
mod faults_sqlite;
mod fleet;
mod guest_schedules;
mod handler_languages;
mod history;
mod host_health;
mod http;
mod keyed_schedules;
mod keys;
mod loading;
mod logs;
mod maintenance;
mod migrations;
mod modules;
mod new_project;
mod operations;
mod outbound;
mod queue;
mod rate_fleet;
mod rate_limits;
mod sandbox;
mod schedules;
mod schema;
mod tokens;
mod traces;
mod triggers;
mod uniqueness;
mod waits;
mod watcher;
mod webhooks;
mod workflow_fleet;
mod workflow_growth;
mod workflows;
