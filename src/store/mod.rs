//! Everything durable, and all SQL. The rest of the host speaks to storage
//! only through the [`Store`] trait.
//!
//! Two layers. Above, the job rules, decided once for both backends:
//! [`enqueue`] (defaults, checks, the concurrency key: a [`PreparedJob`])
//! and [`finish`] (current runs, each run's fate, its children: a
//! [`FinishPlan`]). Below, the `Backend` each of [`postgres`] and
//! [`sqlite`] implements, which only reads configurations and writes what
//! the rules prepared, plus the operations that are a statement or two of
//! SQL with no rule to share (fetch, leases, sweeps, operator commands).
//!
//! The vocabulary, one file per entity: [`job`] (states, enqueue and fetch
//! parameters, results, listings), [`lease`] (runs and renewals), [`host`]
//! (fleet membership and job types), [`concurrency`] (per-key slots and
//! blocked jobs), [`schedule`] (cursors, and the jobs of ticks), [`batch`]
//! (groups of jobs, their counts and callbacks), [`deploy`] (components
//! deployed through the database and their history).

mod backend;
pub mod batch;
pub mod concurrency;
pub mod deploy;
pub mod enqueue;
pub mod finish;
pub mod grant;
pub mod host;
pub mod job;
pub mod lease;
pub mod postgres;
pub mod schedule;
mod schema;
pub mod secret;
pub mod session;
pub mod sqlite;
mod timestamp;
pub mod variable;

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

pub(crate) use backend::Backend;
pub use batch::{Batch, BatchCounts, BatchState, Callbacks, NewBatch};
pub use concurrency::{Holder, KeyCursor, KeyPage, KeyStatus, SemaphoreFix, Slots};
pub use deploy::{DeployAction, DeployChange, DeployRequest, Deployment, DeploymentEntry};
pub use enqueue::{EnqueueLimits, PreparedJob};
pub use finish::FinishPlan;
pub use host::{HostInfo, HostRow, JobTypeRow};
pub use job::{
    Cancel, EnqueueParams, Enqueued, FetchParams, FetchedJob, Finish, FinishOutcome, FinishResult, JobDetail,
    JobFilter, JobRow, JobState, LockedKeys, Stats,
};
pub use lease::{LeaseRenew, LeaseRenewal, RunId, RunProgress, StrayLease};
pub use schedule::{Fired, ScheduleState, ScheduleStatus, Schedules, Tick};

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database could not be reached or answered with an error.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Migrations could not be applied.
    #[error("cannot apply migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// An enqueue named a job type no host has registered.
    #[error("unknown job type {0:?}: no host has loaded a component for it")]
    UnknownJobType(String),
    /// An enqueue's payload is not a JSON object.
    #[error("payload of job {job:?} must be a JSON object, got {kind}")]
    PayloadNotObject {
        /// The job type.
        job: String,
        /// What it was instead (`string`, `array`, ...).
        kind: &'static str,
    },
    /// An enqueue's payload is larger than the store's limit allows.
    #[error("payload of job {job:?} is {bytes} bytes of JSON, more than the largest accepted, {max} bytes")]
    PayloadTooLarge {
        /// The job type.
        job: String,
        /// The payload's size as JSON text.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A command that works on an existing database named an embedded file
    /// that does not exist (and was not created).
    #[error("the database file {0} does not exist: check the database URL (`jobhost migrate` creates it)")]
    DatabaseMissing(String),
    /// The database records migrations up to a version this binary does not carry.
    #[error(
        "this database was migrated by a newer jobhost (schema version {database}; this binary knows up to {known}): \
         upgrade jobhost"
    )]
    SchemaTooNew {
        /// The database's newest applied migration.
        database: i64,
        /// The newest migration this binary carries.
        known: i64,
    },
    /// The database records a migration this binary does not carry, older
    /// than its newest one: it was migrated by a different build.
    #[error("this database has migration {0}, which this jobhost does not carry: use the jobhost that migrated it")]
    SchemaUnknown(i64),
    /// A migration kept giving up on its locks: a transaction held its
    /// tables for longer than migrating waits.
    #[error(
        "migration {version} could not take its locks for {waited_secs} s: another transaction holds its tables; \
         end it (see pg_stat_activity) or migrate again later"
    )]
    MigrationBlocked {
        /// The migration.
        version: i64,
        /// How long it kept trying.
        waited_secs: u64,
    },
    /// The database URL names no supported backend.
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://USER@HOST/DB")]
    UnsupportedUrl(String),
    /// An enqueue's options are invalid.
    #[error("invalid enqueue: {0}")]
    InvalidEnqueue(String),
    /// No job, live or archived, has this id.
    #[error("job {id} does not exist")]
    NotFound {
        /// The job.
        id: i64,
    },
    /// The job is in a state the operation does not apply to: nothing changed.
    #[error("job {id} is {state} and cannot be {action}")]
    WrongState {
        /// The job.
        id: i64,
        /// The state it is in.
        state: JobState,
        /// What the operation would have done to it ("retried", "cancelled").
        action: &'static str,
    },
    /// The job's concurrency key has no free slot and its type's
    /// `on_conflict` is `raise`: nothing was enqueued.
    #[error("{0}")]
    LimitReached(String),
    /// The job's uniqueness key is held by another job and its type's
    /// `on_duplicate` is `raise`: nothing was enqueued.
    #[error("job {job:?} with unique key {key:?} is a duplicate of job {claimant}")]
    Duplicate {
        /// The job type.
        job: String,
        /// The rendered key.
        key: String,
        /// The job holding the key.
        claimant: i64,
    },
    /// An enqueue named a batch that does not exist, or one that is closed:
    /// nothing was enqueued.
    #[error("{0}")]
    BatchRefused(String),
    /// A deploy, undeploy or rollback that cannot apply (nothing deployed,
    /// no earlier version, an unknown or ambiguous digest): nothing changed.
    #[error("{0}")]
    DeployRefused(String),
    /// A row the database returned does not read as the store expects (an
    /// unknown state name, a missing result row): the schema and this
    /// binary disagree.
    #[error("unreadable database row: {0}")]
    Decode(String),
    /// A stored configuration could not be read back.
    #[error("stored job type {name:?} has an unreadable configuration: {reason}")]
    CorruptJobType {
        /// The job type.
        name: String,
        /// Why it could not be read.
        reason: String,
    },
}

impl Error {
    /// Why an operator's `action` did not apply to job `id`, from the state
    /// it is in (none: it is nowhere).
    pub(crate) fn not_applied(id: i64, state: Option<JobState>, action: &'static str) -> Error {
        match state {
            None => Error::NotFound { id },
            Some(state) => Error::WrongState { id, state, action },
        }
    }

    /// True for a transaction rolled back for a deadlock or serialization
    /// failure (PostgreSQL SQLSTATE class 40), for a statement that waited
    /// too long or was cancelled (a lock timeout, a statement timeout, an
    /// idle-in-transaction timeout, an operator's cancel), and for a write
    /// that found the SQLite file busy or locked: the same statement may
    /// pass later, and nothing is wrong with its rows.
    pub fn is_transient(&self) -> bool {
        match self.database_code() {
            Some(DatabaseCode::Sqlite(code)) => matches!(code, SQLITE_BUSY | SQLITE_LOCKED),
            Some(DatabaseCode::Sqlstate(code)) => code.starts_with("40") || SQLSTATE_WAITS.contains(&code.as_str()),
            None => false,
        }
    }

    /// True when a PostgreSQL statement gave up waiting for a lock another
    /// transaction holds (SQLSTATE 55P03, from a `lock_timeout`): the rows
    /// it wanted are busy, not bad. Maintenance, whose sessions wait only
    /// briefly, leaves such rows for its next pass.
    pub fn is_lock_timeout(&self) -> bool {
        matches!(self.database_code(), Some(DatabaseCode::Sqlstate(code)) if code == LOCK_NOT_AVAILABLE)
    }

    /// True when the database answered and refused the statement (bad data,
    /// a violated constraint, a full concurrency key): retrying the same
    /// statement will fail the same way. Neither a transient failure nor the
    /// database failing in itself (a full disk, an I/O error, a shutdown) is
    /// a refusal: those say nothing about the statement.
    pub fn is_refusal(&self) -> bool {
        match self {
            Error::LimitReached(_) | Error::Duplicate { .. } | Error::BatchRefused(_) | Error::DeployRefused(_) => true,
            Error::Database(sqlx::Error::Database(_)) => match self.database_code() {
                Some(DatabaseCode::Sqlite(code)) => !SQLITE_NOT_REFUSALS.contains(&code),
                Some(DatabaseCode::Sqlstate(code)) => {
                    !SQLSTATE_CLASSES_NOT_REFUSALS.iter().any(|class| code.starts_with(class))
                        && !SQLSTATE_WAITS.contains(&code.as_str())
                }
                None => true,
            },
            _ => false,
        }
    }

    /// True when the database answered that it is out of room or its
    /// storage failed (a full disk, out of memory, an I/O error): nothing
    /// about the statement is wrong, and the same write is to be sent again
    /// once there is room, never given up on, though the database still
    /// answers a ping. A timeout or a cancel is not this: it may be the
    /// statement's own fault.
    pub fn is_out_of_resources(&self) -> bool {
        match self.database_code() {
            Some(DatabaseCode::Sqlite(code)) => matches!(code, SQLITE_NOMEM | SQLITE_IOERR | SQLITE_FULL),
            Some(DatabaseCode::Sqlstate(code)) => code.starts_with("53") || code.starts_with("58"),
            None => false,
        }
    }

    /// True when the database cannot be used right now, whatever was asked:
    /// it refused or dropped the connection, no connection came free in
    /// time, the server is starting up or shutting down, or the file is
    /// busy. Waiting may help; nothing about the request is wrong. A host
    /// starting against such a database waits for it instead of exiting.
    pub fn is_unavailable(&self) -> bool {
        use sqlx::migrate::MigrateError;
        let error = match self {
            Error::Database(error)
            | Error::Migrate(MigrateError::Execute(error) | MigrateError::ExecuteMigration(error, _)) => error,
            _ => return false,
        };
        match error {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(_) => match self.database_code() {
                Some(DatabaseCode::Sqlite(code)) => matches!(code, SQLITE_BUSY | SQLITE_LOCKED),
                Some(DatabaseCode::Sqlstate(code)) => ["08", "53", "57"].iter().any(|class| code.starts_with(class)),
                None => false,
            },
            _ => false,
        }
    }

    /// The database's own error code, where the database answered.
    fn database_code(&self) -> Option<DatabaseCode> {
        use sqlx::migrate::MigrateError;
        let db = match self {
            Error::Database(sqlx::Error::Database(db))
            | Error::Migrate(
                MigrateError::Execute(sqlx::Error::Database(db))
                | MigrateError::ExecuteMigration(sqlx::Error::Database(db), _),
            ) => db,
            _ => return None,
        };
        if let Some(sqlite) = db.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
            // The primary result code, without the extended code's high bits.
            let code = sqlx::error::DatabaseError::code(sqlite).and_then(|c| c.parse::<i32>().ok())?;
            return Some(DatabaseCode::Sqlite(code & 0xff));
        }
        db.code().map(|code| DatabaseCode::Sqlstate(code.into_owned()))
    }
}

/// A database error's code: SQLite's primary result code, or PostgreSQL's SQLSTATE.
enum DatabaseCode {
    Sqlite(i32),
    Sqlstate(String),
}

const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_NOMEM: i32 = 7;
const SQLITE_IOERR: i32 = 10;
const SQLITE_FULL: i32 = 13;

/// SQLite result codes of the database failing rather than refusing a
/// statement: busy, locked, out of memory, read-only, interrupted, I/O
/// error, corrupt, full, cannot open, lock protocol, schema changed, not a
/// database.
const SQLITE_NOT_REFUSALS: [i32; 12] = [SQLITE_BUSY, SQLITE_LOCKED, 7, 8, 9, 10, 11, 13, 14, 15, 17, 26];

/// SQLSTATE classes of the server failing rather than refusing a statement:
/// connection exception, transaction rollback (deadlock, serialization),
/// insufficient resources (disk full, out of memory), operator intervention
/// (shutdown), system error (I/O), internal error.
const SQLSTATE_CLASSES_NOT_REFUSALS: [&str; 6] = ["08", "40", "53", "57", "58", "XX"];

/// SQLSTATEs of a statement that waited too long or was cancelled, which
/// say nothing about its rows: a lock timeout or a `NOWAIT` that found a row
/// locked (55P03, `lock_not_available`), an idle-in-transaction timeout
/// (25P03) and a statement timeout or cancel (57014, `query_canceled`).
/// jobhost's own sessions turn the first and the last off where waiting is
/// right (see `postgres::PgStore::connect`), but an operator's or a
/// database's setting may still reach them.
const SQLSTATE_WAITS: [&str; 3] = [LOCK_NOT_AVAILABLE, "25P03", "57014"];

/// SQLSTATE `lock_not_available`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The database used when none is named: an embedded file in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://jobhost.db";

/// Opens the store a URL names: `sqlite://PATH` (the embedded backend) or
/// `postgres://` / `postgresql://` (a fleet across machines).
///
/// # Errors
/// An unsupported scheme, or a database that cannot be reached or opened.
pub async fn open(url: &str, max_connections: u32) -> Result<std::sync::Arc<dyn Store>> {
    open_with(url, max_connections, EnqueueLimits::default()).await
}

/// [`open`], with the limits every enqueue through the store is held to.
///
/// # Errors
/// As [`open`].
pub async fn open_with(url: &str, max_connections: u32, limits: EnqueueLimits) -> Result<std::sync::Arc<dyn Store>> {
    open_as(url, max_connections, limits, true).await
}

/// [`open_with`] for commands that work on a database that exists already:
/// an embedded file is never created, so a mistyped path is reported as
/// missing instead of leaving an empty file behind.
///
/// # Errors
/// As [`open`], and [`Error::DatabaseMissing`] when the file does not exist.
pub async fn open_existing(
    url: &str,
    max_connections: u32,
    limits: EnqueueLimits,
) -> Result<std::sync::Arc<dyn Store>> {
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
) -> Result<std::sync::Arc<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = postgres::PgStore::connect_bounded(url, max_connections, Some(statement_timeout)).await?;
        return Ok(std::sync::Arc::new(store.with_limits(limits)));
    }
    open_existing(url, max_connections, limits).await
}

/// Opens the store a URL names; `create` lets an embedded file be created.
async fn open_as(
    url: &str,
    max_connections: u32,
    limits: EnqueueLimits,
    create: bool,
) -> Result<std::sync::Arc<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(std::sync::Arc::new(postgres::PgStore::connect(url, max_connections).await?.with_limits(limits)));
    }
    if url.starts_with("sqlite:") {
        let store = if create {
            sqlite::SqliteStore::open(url, max_connections).await?
        } else {
            sqlite::SqliteStore::open_existing(url, max_connections).await?
        };
        return Ok(std::sync::Arc::new(store.with_limits(limits)));
    }
    Err(Error::UnsupportedUrl(url.to_string()))
}

/// Shorthand for store results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The durable queue, as every other module sees it. Enqueue and finish are
/// the shared rules over the backend's `Backend` writer, which is private to
/// this crate so that nothing outside can write a job the rules did not
/// prepare; the rest each backend implements.
#[async_trait]
#[allow(private_bounds)]
pub trait Store: Backend + 'static {
    /// Brings the schema up to date.
    async fn schema_migrate(&self) -> Result<()>;

    /// Where the data lives, for logs: a file's absolute path, or a
    /// server's host, port and database (never a password).
    fn location(&self) -> String;

    /// Changes what the fleet serves for `job_type` from the database, in
    /// one transaction holding the type's lock: stores a deployed
    /// component's bytes (once per digest), appends the history entry the
    /// request calls for, and tells listening hosts.
    ///
    /// # Errors
    /// [`Error::DeployRefused`] when the request cannot apply; database errors.
    async fn deployment_change(&self, job_type: &str, request: DeployRequest<'_>) -> Result<DeployChange>;

    /// What the fleet serves from the database: each deployed type's version.
    async fn deployments_current(&self) -> Result<Vec<Deployment>>;

    /// A job type's history, newest first.
    async fn deployment_history(&self, job_type: &str) -> Result<Vec<DeploymentEntry>>;

    /// A deployed component's bytes.
    async fn component_source(&self, digest: &str) -> Result<Option<Vec<u8>>>;

    /// Waits up to `timeout` for a change to the deployments: told at once
    /// on PostgreSQL; on SQLite, a short wait after which the caller looks.
    async fn deployments_wait(&self, timeout: std::time::Duration);

    /// Records the configurations this host loaded, so enqueuers without the
    /// component apply them.
    async fn job_types_register(&self, types: &[(crate::types::JobConfig, String)]) -> Result<()>;

    /// The names of every registered job type.
    async fn job_types_names(&self) -> Result<Vec<String>>;

    /// The registered configuration of each named job type that exists.
    async fn job_types_get(&self, names: &[String]) -> Result<HashMap<String, crate::types::JobConfig>> {
        self.configs_read(names).await
    }

    /// Adds or refreshes this host's row (fleet membership, job types served).
    async fn host_upsert(&self, host: &HostInfo) -> Result<()>;

    /// Every host's row, alive or presumed dead (until pruned), by id.
    async fn host_list(&self) -> Result<Vec<HostRow>>;

    /// Every registered job type with the configuration it declared, by name.
    async fn job_types_list(&self) -> Result<Vec<JobTypeRow>>;

    /// How many jobs ended within the last `secs` seconds, by final state:
    /// the throughput operators watch.
    async fn job_finished_since(&self, secs: f64) -> Result<std::collections::BTreeMap<JobState, i64>>;

    /// Removes this host's row at shutdown.
    async fn host_remove(&self, host_id: &str) -> Result<()>;

    /// Removes the rows of hosts not seen for `silent_secs` (killed hosts
    /// never leave by themselves). Returns how many.
    async fn host_prune(&self, silent_secs: f64) -> Result<u64>;

    /// Enqueues jobs, all or none, returning their ids in order: for a
    /// duplicate of a unique job, the id of the job holding its key.
    async fn job_enqueue(&self, jobs: &[EnqueueParams]) -> Result<Vec<i64>> {
        Ok(enqueue::enqueue(self, jobs).await?.into_iter().map(Enqueued::id).collect())
    }

    /// [`Store::job_enqueue`], saying of each job whether it was stored or
    /// was a duplicate (and whether it replaced the waiting job's payload).
    async fn job_enqueue_outcomes(&self, jobs: &[EnqueueParams]) -> Result<Vec<Enqueued>> {
        enqueue::enqueue(self, jobs).await
    }

    /// Leases up to `limit` available jobs to a host, each with a fresh token.
    async fn job_fetch(&self, params: &FetchParams) -> Result<Vec<FetchedJob>>;

    /// Ends or reschedules runs, each matched on its lease token, in one
    /// transaction with the children of those that completed. Superseded
    /// results are taken out first ([`finish::current_runs`]).
    async fn job_finish(&self, finishes: Vec<Finish>) -> Result<Vec<FinishResult>> {
        Ok(finish::finish(self, finishes, None, LockedKeys::Wait).await?.0)
    }

    /// [`Store::job_finish`], then leases up to `next.limit` jobs to the
    /// writing host as [`Store::job_fetch`] would, in one transaction: the
    /// jobs the finished runs made room for start without another round trip.
    /// It does not wait for a key's semaphore another transaction holds: those
    /// results come back [`FinishResult::Deferred`].
    async fn job_finish_and_fetch(
        &self,
        finishes: Vec<Finish>,
        next: &FetchParams,
    ) -> Result<(Vec<FinishResult>, Vec<FetchedJob>)> {
        finish::finish(self, finishes, Some(next), LockedKeys::Defer).await
    }

    /// Records that the guests of `runs` have started now, confirming their
    /// leases (an expiry of them then spends the attempt): for jobs that
    /// waited on their host for a run slot after their lease, whose
    /// `started_at` the fetch set to the lease time. A run no longer current
    /// changes nothing. One statement for all of them.
    async fn lease_started(&self, runs: &[RunId]) -> Result<()>;

    /// Renews the leases a host still holds, in one statement that never
    /// waits on a row lock: says which runs were renewed and which are no
    /// longer this host's (see [`LeaseRenewal`]). Each renewed run among
    /// `started` is confirmed, and each among `progress` records its latest
    /// progress, so it shows while the job runs. Also reads the host's
    /// running jobs it did not ask about and never confirmed (strays).
    async fn lease_renew(&self, renew: &LeaseRenew<'_>) -> Result<LeaseRenewal>;

    /// Returns jobs whose lease expired to `available`, or to the archive as
    /// failed when their attempts are spent (as cancelled when an operator
    /// asked to cancel them). A lease whose host never confirmed the run's
    /// start gives its attempt back instead (at most
    /// [`lease::UNCONFIRMED_EXPIRIES_REFUNDED`] times a job). Returns
    /// (requeued, archived).
    async fn lease_expire(&self, now: Option<DateTime<Utc>>) -> Result<(u64, u64)>;

    /// Passes scheduled jobs that have come due through the gate. Returns how many.
    async fn job_promote_due(&self, now: Option<DateTime<Utc>>) -> Result<u64>;

    /// Scheduled jobs due by `now`, at most `limit`, the longest due first:
    /// what [`Store::job_promote_due`] takes, so maintenance can pass them a
    /// part at a time when the database refuses the whole batch.
    async fn job_due_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>>;

    /// [`Store::job_promote_due`] for the named jobs only. Returns how many.
    async fn job_promote_due_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<u64>;

    /// Running jobs whose lease expired by `now`, at most `limit`.
    async fn lease_expired_ids(&self, now: Option<DateTime<Utc>>, limit: i64) -> Result<Vec<i64>>;

    /// [`Store::lease_expire`] for the named jobs only.
    async fn lease_expire_ids(&self, now: Option<DateTime<Utc>>, ids: &[i64]) -> Result<(u64, u64)>;

    /// Moves a live job that maintenance cannot process to the archive as
    /// failed, with `reason` as its last error, so the sweeps go on without
    /// it and operators see it (guarantee 13). A blocked job is never
    /// quarantined (guarantee 2). Returns whether the job was there.
    async fn job_quarantine(&self, id: i64, reason: &str) -> Result<bool> {
        // The job's own errors may be what the database refuses (a value
        // past a column's range): it goes without them rather than stay.
        match self.quarantine_write(id, reason, true).await {
            Err(error) if error.is_refusal() => self.quarantine_write(id, reason, false).await,
            other => other,
        }
    }

    /// Visits the next `max_keys` keys with blocked jobs after `after` (from
    /// the first key when `None`), in (job type, key) order, and promotes
    /// the blocked jobs of those that can take a slot now. A page, so a pass
    /// costs the same however many keys and blocked jobs there are; a
    /// sweep that follows `next` visits every key in turn, so busy keys
    /// cannot starve one with a free slot (guarantee 4). Returns how many
    /// jobs it promoted.
    async fn blocked_promote(&self, after: Option<&KeyCursor>, max_keys: i64) -> Result<KeyPage<u64>>;

    /// Corrects the semaphores of the next `max_keys` keys after `after`
    /// (from the first key when `None`) whose holder count disagrees with
    /// the live jobs holding their slots, and recreates the missing rows of
    /// keys with live holders; returns what it changed. A page, as for
    /// [`Store::blocked_promote`].
    async fn semaphore_repair_page(
        &self,
        after: Option<&KeyCursor>,
        max_keys: i64,
    ) -> Result<KeyPage<Vec<SemaphoreFix>>>;

    /// [`Store::semaphore_repair_page`] over every key, a page at a time:
    /// for operators and tests that want the whole table checked now.
    /// Returns what it changed.
    async fn semaphore_repair(&self) -> Result<Vec<SemaphoreFix>> {
        let mut fixes = Vec::new();
        let mut after: Option<KeyCursor> = None;
        loop {
            let page = self.semaphore_repair_page(after.as_ref(), 1_000).await?;
            fixes.extend(page.done);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(fixes),
            }
        }
    }

    /// Every key with holders or blocked jobs.
    async fn semaphore_list(&self) -> Result<Vec<KeyStatus>>;

    /// Slots of a key free right now (the limit minus its holders; at most
    /// zero when a lowered limit left it over). A snapshot, not a claim.
    async fn semaphore_free_slots(&self, job: &str, key: &str) -> Result<i64>;

    /// Deletes archived jobs that finished more than `retention_secs` before
    /// `now` (the database's clock by default), at most `limit`.
    async fn archive_prune(&self, now: Option<DateTime<Utc>>, retention_secs: f64, limit: i64) -> Result<u64>;

    /// Lists jobs, live and archived, newest first.
    async fn job_list(&self, filter: &JobFilter) -> Result<Vec<JobRow>>;

    /// One job with its payload, errors, log and output.
    async fn job_get(&self, id: i64) -> Result<Option<JobDetail>>;

    /// Counts by state and queue, the oldest wait, and live hosts.
    async fn job_stats(&self) -> Result<Stats>;

    /// Answers when the database does: tells a write the database will not
    /// take from a database that is down.
    async fn database_ping(&self) -> Result<()>;

    /// Runs a failed, discarded or cancelled job again (a new attempt budget),
    /// or a scheduled one now.
    async fn job_retry(&self, id: i64) -> Result<()>;

    /// Cancels a job: at once when it is waiting, available or blocked; a
    /// running one through its host (see [`Cancel::Requested`]).
    async fn job_cancel(&self, id: i64) -> Result<Cancel>;

    /// Pauses a queue: no host leases a job from it until it is resumed;
    /// running jobs finish. Returns false when it was paused already.
    async fn queue_pause(&self, queue: &str) -> Result<bool>;

    /// Resumes a paused queue. Returns false when it was not paused.
    async fn queue_resume(&self, queue: &str) -> Result<bool>;

    /// Creates a batch with its first members, all or none, and closes it
    /// unless [`NewBatch::open`]; returns its id and what became of each
    /// member (a duplicate of a unique job is not a member). Callbacks must
    /// be registered types whose keys render from the callback payload.
    async fn batch_create(&self, batch: &NewBatch, members: &[EnqueueParams]) -> Result<(i64, Vec<Enqueued>)> {
        batch::create(self, batch, members).await
    }

    /// Closes an open batch: it takes no more members, and finishes (its
    /// callbacks enqueued) once every member has ended, at once if they all
    /// have. False when it was closed already.
    async fn batch_close(&self, id: i64) -> Result<bool>;

    /// One batch with its counts and progress.
    async fn batch_get(&self, id: i64) -> Result<Option<Batch>>;

    /// Batches newest first, at most `limit`.
    async fn batch_list(&self, limit: i64) -> Result<Vec<Batch>>;

    /// Waits until a job has ended (completed, failed, discarded or
    /// cancelled) and returns it, or `None` when `timeout` passes first.
    /// Woken by the database's announcements, not by polling.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a job that does not exist.
    async fn job_wait(&self, id: i64, timeout: std::time::Duration) -> Result<Option<JobDetail>>;

    /// Waits until jobs may be available (a notification), or `timeout`.
    async fn job_wait_available(&self, timeout: std::time::Duration);

    /// Every scheduled job type with its cursor and whether a live host
    /// serves it, and the clock to read ticks by: the database's, or `now`
    /// when a test gives one (hosts' liveness is judged by the database's
    /// clock either way).
    async fn schedule_list(&self, now: Option<DateTime<Utc>>) -> Result<Schedules>;

    /// Records that a look at `at` (its clock) handled the schedules of
    /// `jobs`: it wrote their due ticks or found none due. The fleet's
    /// latest look, not one host's memory, tells a late tick from a missed
    /// one ([`ScheduleState::looked_at`]).
    async fn schedule_looked(&self, jobs: &[String], at: DateTime<Utc>) -> Result<()>;

    /// Records a new signed-in session, known by its id's digest, and
    /// forgets the sessions that expired under `lifetime`.
    async fn session_create(&self, digest: &str, lifetime: session::SessionLifetime) -> Result<()>;

    /// Whether the session is signed in and not expired under `lifetime`;
    /// records its use (every [`session::TOUCH_EVERY_SECS`] at most).
    async fn session_check(&self, digest: &str, lifetime: session::SessionLifetime) -> Result<bool>;

    /// Ends a session: a sign-out, on every server of the fleet.
    async fn session_revoke(&self, digest: &str) -> Result<()>;

    /// Stores an outbound grant, replacing the type's grant for the same
    /// origin; true when it replaced one.
    async fn grant_set(&self, grant: &grant::NewGrant) -> Result<bool>;

    /// Removes the type's grant for `origin`; false when there was none.
    async fn grant_revoke(&self, job_type: &str, origin: &str) -> Result<bool>;

    /// The grants of one job type, or of all, by type and origin.
    async fn grants(&self, job_type: Option<&str>) -> Result<Vec<grant::OutboundGrant>>;

    /// Stores a sealed secret, replacing its value; true when it replaced one.
    async fn secret_set(&self, name: &str, sealed: &secret::Sealed) -> Result<bool>;

    /// Removes a secret; false when there was none.
    async fn secret_delete(&self, name: &str) -> Result<bool>;

    /// Every secret's name, key and dates, by name: never a value.
    async fn secrets_list(&self) -> Result<Vec<secret::SecretInfo>>;

    /// The sealed values of those of `names` that are set.
    async fn secrets_sealed(&self, names: &[String]) -> Result<Vec<(String, secret::Sealed)>>;

    /// Sets a job type's plain variable; true when it replaced a value.
    async fn var_set(&self, job_type: &str, name: &str, value: &str) -> Result<bool>;

    /// Removes a job type's variable; false when there was none.
    async fn var_unset(&self, job_type: &str, name: &str) -> Result<bool>;

    /// The variables of one job type, or of all, by type and name.
    async fn vars(&self, job_type: Option<&str>) -> Result<Vec<variable::TypeVariable>>;

    /// Enqueues one job per tick of a schedule, moving its cursor past them
    /// in the same transaction, unless another host moved it first; a tick
    /// whose job the enqueue rules or the database refuse is skipped with
    /// the reason. `ticks` are due ticks after the cursor, oldest first.
    async fn schedule_fire(&self, state: &ScheduleState, ticks: &[DateTime<Utc>]) -> Result<Fired> {
        schedule::fire(self, state, ticks).await
    }
}
