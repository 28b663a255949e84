//! Why a storage operation failed, and which failures are the database
//! being unavailable (retried, waited out) rather than refusing a statement.

use super::JobState;

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database could not be reached or answered with an error.
    #[error("database error: {}", database_text(.0))]
    Database(#[from] sqlx::Error),
    /// The database server could not be reached at all (down, or nothing
    /// listening at its address).
    #[error("cannot reach the database at {address}: {reason}")]
    Unreachable {
        /// The server's host and port.
        address: String,
        /// Why: the connection's error, or that it got no answer in time.
        reason: String,
    },
    /// Migrations could not be applied.
    #[error("cannot apply migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A SQL function's living file that the database refused.
    #[error("cannot apply src/store/postgres/functions/{name}.sql: {reason}")]
    FunctionRefused {
        /// The function's name (its file's).
        name: String,
        /// What the database said.
        reason: String,
    },
    /// An enqueue named a job type no host has registered.
    #[error(
        "unknown job type {0:?}: no host has loaded a component for it (start a host whose components include it, \
         or register it without running jobs: `jobhost deploy COMPONENT.wasm`)"
    )]
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
    /// A new workflow is malformed (a cycle, an unknown step, a bad step):
    /// nothing was stored.
    #[error("invalid workflow: {0}")]
    InvalidWorkflow(String),
    /// An event is malformed (its key or payload): nothing was sent.
    #[error("invalid event: {0}")]
    InvalidEvent(String),
    /// A schedule is malformed (its key, calendar, payload or bounds),
    /// naming the field: nothing was stored.
    #[error("invalid schedule: {0}")]
    InvalidSchedule(String),
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

    /// True when another transaction changed the same catalog row (a
    /// function's definition) while this statement waited for it, as an
    /// operator's `CREATE OR REPLACE` committing does: PostgreSQL reports
    /// it as an internal error, and the same statement tried again passes.
    pub fn is_concurrent_definition(&self) -> bool {
        self.database_error().is_some_and(|db| {
            db.code().as_deref() == Some(INTERNAL_ERROR) && db.message() == "tuple concurrently updated"
        })
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
            Error::Unreachable { .. } => return true,
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
    /// The database's own error, whether a statement or a migration met it.
    fn database_error(&self) -> Option<&dyn sqlx::error::DatabaseError> {
        use sqlx::migrate::MigrateError;
        match self {
            Error::Database(sqlx::Error::Database(db))
            | Error::Migrate(
                MigrateError::Execute(sqlx::Error::Database(db))
                | MigrateError::ExecuteMigration(sqlx::Error::Database(db), _),
            ) => Some(db.as_ref()),
            _ => None,
        }
    }

    fn database_code(&self) -> Option<DatabaseCode> {
        let db = self.database_error()?;
        if let Some(sqlite) = db.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
            // The primary result code, without the extended code's high bits.
            let code = sqlx::error::DatabaseError::code(sqlite).and_then(|c| c.parse::<i32>().ok())?;
            return Some(DatabaseCode::Sqlite(code & 0xff));
        }
        db.code().map(|code| DatabaseCode::Sqlstate(code.into_owned()))
    }
}

/// PostgreSQL's SQLSTATE for an error it raises from inside (`elog`), as
/// for a catalog row another transaction changed meanwhile.
const INTERNAL_ERROR: &str = "XX000";

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

/// A database error's text: the server's message, with its hint when it
/// gave one, and without sqlx's " at line N" (a line of PostgreSQL's own C
/// source, noise to anyone reading the error). Not the detail: for a
/// constraint it holds the whole failing row, a payload included, which
/// has no place in a host's log.
fn database_text(error: &sqlx::Error) -> String {
    let sqlx::Error::Database(db) = error else { return error.to_string() };
    let mut text = db.message().to_string();
    if let Some(hint) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().and_then(|pg| pg.hint()) {
        text += &format!("; hint: {hint}");
    }
    text
}

/// Shorthand for store results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
