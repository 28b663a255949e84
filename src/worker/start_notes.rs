//! Late start times, written in batches. A job that waited on its host for
//! a run slot after its lease has `started_at` set again when its guest
//! starts: the fetch set it to the lease time, and operators (and the
//! "started" column of a listing) should see when it ran. A write per job
//! would add a statement per prefetched job on the hot path; instead the
//! notes queue here and one statement records every note that arrived while
//! the previous one was being written.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::store::{RunId, Store};

/// The most runs one statement records.
const BATCH: usize = 1000;

/// Where a run reports that its guest started late.
#[derive(Clone)]
pub struct StartNotes {
    notes: mpsc::UnboundedSender<RunId>,
}

impl StartNotes {
    /// A queue of notes, and the task that writes them: it ends once every
    /// clone of the queue is dropped and what was queued is written.
    pub fn new(store: Store, deadline: Duration) -> (StartNotes, impl Future<Output = ()> + Send) {
        let (notes, queued) = mpsc::unbounded_channel();
        (StartNotes { notes }, write_loop(store, queued, deadline))
    }

    /// Records, soon, that `run`'s guest starts now. Best effort: a note the
    /// database does not take leaves the lease time in place.
    pub fn note(&self, run: RunId) {
        // The writer is gone only at shutdown, when the start time no longer matters.
        let _ = self.notes.send(run);
    }
}

async fn write_loop(store: Store, mut queued: mpsc::UnboundedReceiver<RunId>, deadline: Duration) {
    let mut runs = Vec::new();
    while queued.recv_many(&mut runs, BATCH).await > 0 {
        match tokio::time::timeout(deadline, store.lease_started(&runs)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(%error, runs = runs.len(), "cannot record when runs started"),
            Err(_) => tracing::debug!(runs = runs.len(), "recording when runs started took too long"),
        }
        runs.clear();
    }
}
