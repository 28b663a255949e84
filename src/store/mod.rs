//! Everything durable, and all SQL. The rest of the host speaks to storage
//! only through the [`Store`] front.
//!
//! Three layers. On top, the [`Store`] front (`front.rs`): every operation
//! the host has, each rule, loop over pages, retry and log line written
//! once for both backends. Beside it, the job rules it applies, decided
//! once: [`enqueue`] (defaults, checks, the concurrency key: a
//! [`PreparedJob`]), [`finish`] (current runs, each run's fate, its
//! children: a [`FinishPlan`]), [`batch`] callbacks, [`schedule`] ticks,
//! [`concurrency`]'s sweep of blocked jobs. Below, the [`Driver`] each of
//! [`postgres`] and [`sqlite`] implements ([`driver`]: one small trait per
//! entity, implemented in that entity's file of each backend, and the
//! crate-private `Backend` writer of what the rules prepared), which
//! states facts and writes what it is given.
//!
//! A new operation touches its entity's driver trait, that entity's file in
//! each backend, and the front.
//!
//! The vocabulary, one file per entity: [`job`] (states, enqueue and fetch
//! parameters, results, listings), [`lease`] (runs and renewals), [`fleet`]
//! (hosts and the job types they serve), [`concurrency`] (per-key slots and
//! blocked jobs), [`schedule`] (cursors, and the jobs of ticks), [`batch`]
//! (groups of jobs, their counts and callbacks), [`workflow`] (steps that
//! wait for other steps), [`deploy`] (components deployed through the
//! database and their history).

/// `sqlx::FromRow` for a struct read by column name, each field from the
/// column of its name: what sqlx's derive does, without building sqlx's
/// macro crate (and both database drivers again for it) into every build.
macro_rules! from_row {
    ($database_row:ty, $name:ident { $($field:ident),* $(,)? }) => {
        impl<'r> sqlx::FromRow<'r, $database_row> for $name {
            fn from_row(row: &'r $database_row) -> Result<Self, sqlx::Error> {
                use sqlx::Row;
                Ok($name { $($field: row.try_get(stringify!($field))?),* })
            }
        }
    };
}

pub mod audit;
mod backend;
pub mod batch;
pub mod concurrency;
pub mod deploy;
pub mod driver;
pub mod enqueue;
mod error;
pub mod finish;
pub mod fleet;
mod front;
pub mod grant;
pub mod history;
pub mod job;
pub mod keyed_schedule;
pub mod lease;
mod migrations;
pub mod postgres;
pub mod rate;
pub mod schedule;
mod schema;
pub mod secret;
pub mod session;
pub mod sqlite;
pub(crate) mod timestamp;
pub mod token;
pub mod variable;
pub mod wait;
pub mod webhook;
pub mod workflow;

pub(crate) use backend::Backend;
pub use batch::{Batch, BatchCounts, BatchState, Callbacks, NewBatch};
pub use concurrency::{Holder, KeyCursor, KeyPage, KeyStatus, SemaphoreFix, Slots};
pub use deploy::{DeployAction, DeployChange, DeployRequest, Deployment, DeploymentEntry};
pub use driver::Driver;
pub use enqueue::{EnqueueLimits, PreparedJob};
pub use error::{Error, Result};
pub use finish::FinishPlan;
pub use fleet::{HostInfo, HostRow, JobTypeRow};
pub use front::Store;
pub use job::{
    Cancel, EnqueueParams, Enqueued, FetchParams, FetchedJob, Finish, FinishOutcome, FinishResult, JobDetail,
    JobFilter, JobRow, JobState, LockedKeys, Stats,
};
pub use lease::{LeaseRenew, LeaseRenewal, RunId, RunProgress, StrayLease};
pub use schedule::{Fired, ScheduleState, ScheduleStatus, Schedules, Tick};
pub use workflow::{
    CreatedWorkflow, Dependency, IfFailed, NewStep, NewWorkflow, StepState, Workflow, WorkflowCancel, WorkflowState,
    WorkflowStep,
};

/// The database used when none is named: an embedded file in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://jobhost.db";

/// Opens the store a URL names: `sqlite://PATH` (the embedded backend) or
/// `postgres://` / `postgresql://` (a fleet across machines).
///
/// # Errors
/// An unsupported scheme, or a database that cannot be reached or opened.
pub async fn open(url: &str, max_connections: u32) -> Result<Store> {
    open_with(url, max_connections, EnqueueLimits::default()).await
}

/// [`open`], with the limits every enqueue through the store is held to.
///
/// # Errors
/// As [`open`].
pub async fn open_with(url: &str, max_connections: u32, limits: EnqueueLimits) -> Result<Store> {
    open_as(url, max_connections, limits, true).await
}

/// [`open_with`] for commands that work on a database that exists already:
/// an embedded file is never created, so a mistyped path is reported as
/// missing instead of leaving an empty file behind.
///
/// # Errors
/// As [`open`], and [`Error::DatabaseMissing`] when the file does not exist.
pub async fn open_existing(url: &str, max_connections: u32, limits: EnqueueLimits) -> Result<Store> {
    open_as(url, max_connections, limits, false).await
}

/// [`open_existing`] for the HTTP server: a pool of its own, apart from a
/// host's workers (which `run --http` would otherwise share), and on
/// PostgreSQL each statement given up after `statement_timeout`, so no
/// request (a filter the archive has no index for, a slow page) holds a
/// connection or the database past its deadline.
///
/// # Errors
/// As [`open_existing`].
pub async fn open_for_http(
    url: &str,
    max_connections: u32,
    limits: EnqueueLimits,
    statement_timeout: std::time::Duration,
) -> Result<Store> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = postgres::PgStore::connect_bounded(url, max_connections, Some(statement_timeout)).await?;
        return Ok(Store::new(store.with_limits(limits)));
    }
    open_existing(url, max_connections, limits).await
}

/// Opens the store a URL names; `create` lets an embedded file be created.
async fn open_as(url: &str, max_connections: u32, limits: EnqueueLimits, create: bool) -> Result<Store> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Store::new(postgres::PgStore::connect(url, max_connections).await?.with_limits(limits)));
    }
    if url.starts_with("sqlite:") {
        let store = if create {
            sqlite::SqliteStore::open(url, max_connections).await?
        } else {
            sqlite::SqliteStore::open_existing(url, max_connections).await?
        };
        return Ok(Store::new(store.with_limits(limits)));
    }
    Err(Error::UnsupportedUrl(url.to_string()))
}
