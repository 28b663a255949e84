//! The connection a store's result writes go out on, one after another,
//! kept between them instead of taken from the pool and given back.
//!
//! A pool checkout and return is more than a hand-over: sqlx pings every
//! connection given back before another task may take it, a round trip
//! that wakes the server's session once more per write. On the serial
//! shape, where one write at a time carries every hand-off, the kept
//! connection moved the hand-off and throughput measurably (BENCHMARKS.md,
//! "The result writer's own connection").
//!
//! It is lent to one write at a time; a write that finds it lent (a second
//! write sent while one hangs) goes to the pool. It is kept only after a
//! write that got its answer: a write that failed or was given up (its
//! future dropped at a deadline) drops it, so no later write can read an
//! earlier statement's reply, and the next write opens a new session. One
//! idle past [`PING_AFTER_IDLE`] is pinged before use, as the pool's are,
//! so one a server restart ended is replaced, not used.

use std::sync::Mutex;
use std::time::Instant;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use super::pool::PING_AFTER_IDLE;
use crate::store::Result;

/// The result writes' connection, opened when the host starts
/// ([`Writer::warm`]) or at the first write.
pub(super) struct Writer {
    options: PgConnectOptions,
    slot: Mutex<Slot>,
}

enum Slot {
    /// None open: the next write opens one.
    Closed,
    /// Open and free since the instant.
    Idle(PgConnection, Instant),
    /// A write has it.
    Lent,
}

/// The connection lent to one write. Dropped without [`Lent::give_back`],
/// it closes the connection.
pub(super) struct Lent<'a> {
    writer: &'a Writer,
    connection: Option<PgConnection>,
    given_back: bool,
}

impl Writer {
    /// A writer whose sessions start with `options` (those of the pool).
    pub(super) fn new(options: PgConnectOptions) -> Self {
        Writer { options, slot: Mutex::new(Slot::Closed) }
    }

    /// The connection for one write, opened or checked first if need be;
    /// `None` while another write has it.
    ///
    /// # Errors
    /// A new session could not be opened.
    pub(super) async fn lend(&self) -> Result<Option<Lent<'_>>> {
        let kept = {
            let mut slot = self.slot.lock().expect("the writer's slot is never poisoned");
            match std::mem::replace(&mut *slot, Slot::Lent) {
                Slot::Lent => return Ok(None),
                Slot::Idle(connection, since) => Some((connection, since)),
                Slot::Closed => None,
            }
        };
        // From here the slot says Lent: dropping `lent` (an error below, or
        // the write's future given up) closes it again.
        let mut lent = Lent { writer: self, connection: None, given_back: false };
        let connection = match kept {
            Some((connection, since)) if since.elapsed() < PING_AFTER_IDLE => connection,
            Some((mut connection, _)) => match connection.ping().await {
                Ok(()) => connection,
                Err(error) => {
                    tracing::info!(%error, "the result writer's idle connection did not answer its ping; opening another");
                    super::pool::connect(&self.options).await?
                }
            },
            None => super::pool::connect(&self.options).await?,
        };
        lent.connection = Some(connection);
        Ok(Some(lent))
    }

    /// Opens the connection now, unless a write has it, and runs a write's
    /// statements on it once ([`super::finish::warm`]), so a host's first
    /// result write need not open the session, compile the write's
    /// functions and plan its statements (a new host's first write took
    /// 12-13 ms, 3-5 ms after this, 0.9 ms once settled: BENCHMARKS.md,
    /// "A warm result writer").
    ///
    /// # Errors
    /// The session could not be opened or the statements failed; the
    /// connection is then closed, and the next write opens another.
    pub(super) async fn warm(&self) -> Result<()> {
        let Some(mut lent) = self.lend().await? else { return Ok(()) };
        super::finish::warm(lent.connection()).await?;
        lent.give_back();
        Ok(())
    }

    fn put(&self, slot: Slot) {
        *self.slot.lock().expect("the writer's slot is never poisoned") = slot;
    }
}

impl Lent<'_> {
    /// The lent connection.
    pub(super) fn connection(&mut self) -> &mut PgConnection {
        self.connection.as_mut().expect("a lent connection is held until it is given back")
    }

    /// Keeps the connection for the next write: only after a write that
    /// got its answer.
    pub(super) fn give_back(mut self) {
        let connection = self.connection.take().expect("a lent connection is held until it is given back");
        self.writer.put(Slot::Idle(connection, Instant::now()));
        self.given_back = true;
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if !self.given_back {
            // Whatever state its session is in (a statement in flight, an
            // error), the connection is not reused: dropping it closes it.
            self.connection = None;
            self.writer.put(Slot::Closed);
        }
    }
}
