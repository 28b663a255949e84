//! jobhost: a durable background-job host whose handlers are sandboxed
//! WebAssembly components.
//!
//! A handler is a component implementing the `jobhost:job` WIT world
//! (`wit/job.wit`): it declares its job type through `describe()` and does
//! the work in `run()`. The host owns everything else.
//!
//! # Layout
//! - [`config`]: host settings, their defaults and validation.
//! - [`types`]: the shared vocabulary (job configuration, run outcomes).
//! - [`template`]: concurrency and uniqueness key templates.
//! - [`schedule`]: cron expressions in a time zone, and their ticks.
//! - [`timer`]: sleeps timed finer than tokio's millisecond wheel.
//! - [`component`]: everything WebAssembly: engine, artifact cache,
//!   sandbox, component metadata, registry and directory watcher.
//! - [`store`]: everything durable and all SQL, behind the [`store::Store`]
//!   trait: the job rules decided once ([`store::enqueue`],
//!   [`store::finish`]) over one writer per backend (an embedded SQLite
//!   file by default; PostgreSQL for fleets).
//! - [`worker`]: fetches, runs, heartbeats and completes jobs.
//! - [`maintenance`]: the sweeps (due jobs, expired leases, retention).
//! - [`http`]: the JSON API, the dashboard and `/metrics`; [`metrics`]:
//!   what this process counts for them.
//! - [`scheduler`]: the schedule loop, enqueueing each due tick's job once.
//! - [`registration`]: job types recorded in the database as components load.
//! - [`supervisor`]: background tasks whose panic stops the host.
//! - [`host`]: a whole host wired together; [`client`]: the enqueue API.
//! - [`cli`]: the `jobhost` command line.

#![warn(missing_docs)]

pub mod cli;
pub mod client;
pub mod component;
pub mod config;
pub mod deployments;
pub mod host;
pub mod http;
pub mod maintenance;
pub mod metrics;
pub mod outbound;
pub mod registration;
pub mod schedule;
pub mod scheduler;
pub mod store;
pub mod supervisor;
pub mod template;
pub mod timer;
pub mod types;
pub mod worker;

pub use client::Client;
pub use host::{HostConfig, run};
