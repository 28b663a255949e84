//! The store's connection pools and the session settings every connection
//! starts with: what a session may wait for, and when a pooled connection
//! is checked before use.

use std::time::Duration;

use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::store::{Error, Result};

/// How long the server lets a session sit idle inside a transaction.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "5s";

/// How long a maintenance sweep waits for a row another transaction holds
/// (an application's open transaction on a key, an operator's statement)
/// before it leaves that row for its next pass: a sweep never stalls behind
/// one lock, and the rows it could not lock are busy, not bad (guarantee 13).
/// jobhost's own transactions hold a row for milliseconds.
const SWEEP_LOCK_TIMEOUT: &str = "250ms";

/// A pooled connection idle at least this long is pinged before it is
/// handed out, so one a server restart ended is dropped, not used; one used
/// more recently goes straight to its statement (the ping is a round trip
/// of its own, about 100 µs of a serial-shape result write: BENCHMARKS.md,
/// "Pings only for idle connections"). A server takes longer than this to
/// go down and come back, so a busy connection is one it opened since. A
/// session ended under a busy connection (`pg_terminate_backend`) fails
/// that connection's next statement, as a session ended mid-statement
/// does; the host's loops retry either.
pub(super) const PING_AFTER_IDLE: Duration = Duration::from_millis(100);

/// How long a new session outside the pools (the first, the result
/// writer's) may take before the server counts as unreachable.
const FIRST_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a checkout waits for a free connection.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The settings every session of the store starts with.
///
/// A host frozen inside a transaction (SIGSTOP, a paused VM) keeps its
/// socket and its row locks, and every other host's SKIP LOCKED sweep would
/// pass over those rows for as long as it stays frozen; the server aborts
/// such a transaction instead. jobhost's own transactions last milliseconds.
///
/// A `lock_timeout` or `statement_timeout` set for the whole database or
/// role would make a result write that waits for an application's lock fail
/// as if its result were bad: jobhost's sessions wait instead, bounding
/// their waits themselves (deadlines, fences, SKIP LOCKED), and its sweeps
/// wait briefly ([`SWEEP_LOCK_TIMEOUT`]). A session's startup options take
/// precedence over database and role settings. Statements are logged at
/// trace level only: the hot path runs thousands a second.
pub(super) fn session_options(options: PgConnectOptions) -> PgConnectOptions {
    options
        .application_name("jobhost")
        .options([
            ("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION_TIMEOUT),
            ("statement_timeout", "0"),
            ("lock_timeout", "0"),
        ])
        .log_statements(tracing::log::LevelFilter::Trace)
}

/// Refuses a server that is down or unreachable at once, naming its address:
/// the pool would retry quietly until its acquire timeout and then say only
/// that it timed out. Anything the server itself answers (a wrong password,
/// a database that does not exist) is its own error.
pub(super) async fn reachable(options: &PgConnectOptions) -> Result<()> {
    let _ = sqlx::Connection::close(connect(options).await?).await;
    Ok(())
}

/// A session of its own, outside the pools (the result writer's), given up
/// after [`FIRST_CONNECT_TIMEOUT`] as unreachable, naming the address.
pub(super) async fn connect(options: &PgConnectOptions) -> Result<sqlx::PgConnection> {
    let address = || format!("{}:{}", options.get_host(), options.get_port());
    match tokio::time::timeout(FIRST_CONNECT_TIMEOUT, options.connect()).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(sqlx::Error::Io(error))) => Err(Error::Unreachable { address: address(), reason: error.to_string() }),
        Ok(Err(error)) => Err(error.into()),
        Err(_) => Err(Error::Unreachable {
            address: address(),
            reason: format!("no answer within {} s", FIRST_CONNECT_TIMEOUT.as_secs()),
        }),
    }
}

/// The pool the work runs on, each statement given up after
/// `statement_timeout` when one is given. Connects one connection now.
pub(super) async fn work(
    options: &PgConnectOptions,
    max_connections: u32,
    statement_timeout: Option<Duration>,
) -> Result<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE
                    && let Err(error) = sqlx::Connection::ping(conn).await
                {
                    tracing::info!(%error, "an idle connection did not answer its ping; dropping it");
                    return Ok(false);
                }
                Ok(true)
            })
        })
        .connect_with(work_options(options, statement_timeout))
        .await?)
}

/// The work's session settings: the store's, with `statement_timeout`.
pub(super) fn work_options(options: &PgConnectOptions, statement_timeout: Option<Duration>) -> PgConnectOptions {
    let statement_timeout = statement_timeout.map_or("0".to_string(), |t| t.as_millis().to_string());
    options.clone().options([("statement_timeout", statement_timeout)])
}

/// The maintenance sweeps' pool, whose lock waits are bounded
/// ([`SWEEP_LOCK_TIMEOUT`]); connects when first used.
pub(super) fn sweeps(options: &PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_lazy_with(options.clone().options([("lock_timeout", SWEEP_LOCK_TIMEOUT)]))
}

/// The LISTEN connections' pool; connects when first used.
pub(super) fn listeners(options: &PgConnectOptions) -> PgPool {
    PgPoolOptions::new().max_connections(2).connect_lazy_with(options.clone())
}
