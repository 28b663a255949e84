//! Whether this host's result writes get through. A host that can renew
//! leases and lease jobs but cannot write results is a black hole: its jobs
//! would neither finish nor be redelivered. Once writes have failed for
//! longer than a lease, it stops renewing and fetching, says so at error
//! level, and lets the fleet take its jobs over. Any write of results that
//! gets through ends that, on whichever path it was sent, and so does the
//! probe the fetch loop sends while it waits: a host may have no result
//! left to write.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::Store;

/// Shared by the completer, which reports, and the heartbeat and fetch
/// loops, which ask.
#[derive(Clone)]
pub struct WriteHealth {
    failing_since: Arc<Mutex<Option<Instant>>>,
    /// How long writes may fail before the host gives its jobs up.
    tolerance: Duration,
}

impl WriteHealth {
    /// A healthy host that tolerates failing writes for `tolerance`.
    pub fn new(tolerance: Duration) -> Self {
        WriteHealth { failing_since: Arc::new(Mutex::new(None)), tolerance }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        // A plain assignment cannot panic midway.
        self.failing_since.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A write of results failed; the first failure since the last success
    /// starts the clock.
    pub fn failed(&self) {
        let mut since = self.lock();
        if since.is_none() {
            *since = Some(Instant::now());
        }
    }

    /// A write of results got through.
    pub fn succeeded(&self) {
        let was = self.lock().take();
        if let Some(since) = was.filter(|since| since.elapsed() > self.tolerance) {
            tracing::warn!(failed_for = ?since.elapsed(), "results are written again; renewing and fetching again");
        }
    }

    /// How long writes have been failing, if they have been for longer than
    /// the tolerance: the host should stop renewing and fetching.
    pub fn given_up_for(&self) -> Option<Duration> {
        let since = (*self.lock())?;
        Some(since.elapsed()).filter(|failing| *failing > self.tolerance)
    }

    /// While the host has given its jobs up: waits `interval`, then sends a
    /// result write that changes nothing ([`Store::result_write_probe`]),
    /// and one that gets through within `deadline` ends the give-up. The
    /// host's own results end it too, but it may have none left: the last
    /// were written or dropped on paths that need no retry, and it leases
    /// no more until it resumes.
    pub async fn probe(&self, store: &Store, interval: Duration, deadline: Duration) {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(deadline, store.result_write_probe()).await {
            Ok(Ok(())) => self.succeeded(),
            Ok(Err(error)) => tracing::debug!(%error, "a probe of result writes failed"),
            Err(_) => tracing::debug!("a probe of result writes got no answer in time"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn gives_up_only_after_failing_for_longer_than_the_tolerance() {
        let health = WriteHealth::new(Duration::from_secs(10));
        health.failed();
        tokio::time::advance(Duration::from_secs(9)).await;
        health.failed();
        assert_eq!(health.given_up_for(), None, "the clock runs from the first failure, and 9 s is tolerated");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(health.given_up_for(), Some(Duration::from_secs(11)));
        health.succeeded();
        assert_eq!(health.given_up_for(), None, "one write that gets through ends it");
    }
}
