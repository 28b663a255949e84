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
//! - [`template`]: concurrency and uniqueness key templates; [`text`]: text
//!   clipped to fit a terminal or a box.
//! - [`calendar`]: cron expressions in a time zone, and their ticks.
//! - [`timer`]: sleeps timed finer than tokio's millisecond wheel.
//! - [`component`]: everything WebAssembly: engine, artifact cache,
//!   sandbox, component metadata, registry and directory watcher.
//! - [`store`]: everything durable and all SQL, behind the [`store::Store`]
//!   front: the job rules decided once ([`store::enqueue`],
//!   [`store::finish`]) over one driver per backend (an embedded SQLite
//!   file by default; PostgreSQL for fleets).
//! - [`worker`]: fetches, runs, heartbeats and completes jobs.
//! - [`outbound`]: handlers' HTTP requests through the two-sided
//!   allow-list, with secrets the guest never sees.
//! - [`background`]: the loops beside the workers: the sweeps (due jobs,
//!   expired leases, blocked jobs, retention), the schedule loop, the
//!   deployment follower and job type registration.
//! - [`http`]: the JSON API, the dashboard and `/metrics`; [`metrics`]:
//!   what this process counts for them.
//! - [`supervisor`]: background tasks whose panic stops the host.
//! - [`host`]: a whole host wired together; [`client`]: the enqueue API.
//! - [`cli`]: the `jobhost` command line.

#![warn(missing_docs)]

pub mod attempts;
pub mod background;
pub mod calendar;
pub mod cli;
pub mod client;
pub mod component;
pub mod config;
pub mod host;
pub mod http;
pub mod metrics;
pub mod outbound;
pub mod schedule_spec;
pub mod step;
pub mod store;
pub mod supervisor;
pub mod telemetry;
pub mod template;
pub mod text;
pub mod timer;
pub mod types;
pub mod webhook;
pub mod worker;

pub use client::Client;
pub use host::{HostConfig, run};
