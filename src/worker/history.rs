//! This host's share of the fleet's history: the attempts it scheduled
//! again, counted in memory and added to the history's minutes every
//! [`FLUSH_EVERY`] and at shutdown. A write that fails keeps its counts for
//! the next; a host killed loses at most its unwritten counts.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::Store;
use crate::store::history::RetryShare;

/// How often the counts are written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(10);

/// Writes `share` every [`FLUSH_EVERY`] until `stop`, then once more.
pub async fn flush_loop(store: Store, share: RetryShare, stop: CancellationToken) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => flush(&store, &share).await,
        }
    }
    flush(&store, &share).await;
}

async fn flush(store: &Store, share: &RetryShare) {
    let counts = share.take();
    if counts.is_empty() {
        return;
    }
    if let Err(error) = store.history_add_retries(&counts).await {
        tracing::debug!(%error, "cannot add this host's retries to the history; the next write will");
        share.restore(counts);
    }
}
