//! Guests' sleeps, timed to within a fraction of a millisecond.
//!
//! wasmtime-wasi answers `wasi:clocks/monotonic-clock`'s `subscribe-duration`
//! and `subscribe-instant` with tokio timers, which fire on a 1 ms wheel and
//! round up: a guest's 5 ms sleep took about 6 ms, a fifth of a short job's
//! time spent waiting on nothing. This module answers them with
//! [`crate::timer`]'s sleeps instead, which end within the kernel's timer
//! slack. Everything else in the interface (`now`, `resolution`) stays
//! wasmtime-wasi's.

use std::time::{Duration, Instant};

use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::clocks::WasiClocksView;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};

/// The interface whose subscriptions are replaced; the linker matches any
/// guest's `0.2.x` import to it.
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// Replaces the monotonic clock's two subscriptions in a linker that already
/// holds wasmtime-wasi's.
///
/// # Errors
/// Only if the interface is missing from the linker, which is a host bug.
pub fn link_precise_sleeps<T: WasiClocksView + Send + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap("subscribe-duration", |mut store, (nanos,): (u64,)| {
        let deadline = Instant::now().checked_add(Duration::from_nanos(nanos));
        Ok((subscribe_deadline(WasiClocksView::clocks(store.data_mut()).table, deadline, nanos == 0)?,))
    })?;
    clock.func_wrap("subscribe-instant", |mut store, (when,): (u64,)| {
        // The guest's instants are wasmtime-wasi's clock's nanoseconds; only
        // the distance from its `now` matters.
        let mut clocks = WasiClocksView::clocks(store.data_mut());
        let nanos = when.saturating_sub(monotonic_clock::Host::now(&mut clocks)?);
        let deadline = Instant::now().checked_add(Duration::from_nanos(nanos));
        Ok((subscribe_deadline(clocks.table, deadline, nanos == 0)?,))
    })?;
    linker.allow_shadowing(false);
    Ok(())
}

fn subscribe_deadline(
    table: &mut wasmtime::component::ResourceTable,
    deadline: Option<Instant>,
    already_due: bool,
) -> wasmtime::Result<Resource<DynPollable>> {
    let sleep = if already_due {
        GuestSleep::Due { yielded: false }
    } else {
        // Past what an `Instant` can hold: wait forever rather than trap, as
        // wasmtime-wasi does.
        deadline.map_or(GuestSleep::Never, GuestSleep::Until)
    };
    let resource = table.push(sleep)?;
    subscribe(table, resource)
}

/// One subscription's deadline.
enum GuestSleep {
    /// A zero-length sleep: ready after yielding once, so a guest polling in
    /// a loop with a zero timeout lets the reactor run (as wasmtime-wasi does).
    Due {
        yielded: bool,
    },
    Until(Instant),
    Never,
}

#[async_trait::async_trait]
impl Pollable for GuestSleep {
    async fn ready(&mut self) {
        match self {
            GuestSleep::Due { yielded: true } => {}
            GuestSleep::Due { yielded } => {
                *yielded = true;
                tokio::task::yield_now().await;
            }
            GuestSleep::Until(deadline) => crate::timer::sleep_until(*deadline).await,
            GuestSleep::Never => std::future::pending().await,
        }
    }
}
