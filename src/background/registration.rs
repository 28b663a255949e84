//! Records the job types this host loads in the database, so every enqueuer
//! (CLI, SQL, other hosts) applies their configuration.
//!
//! One component at a time, and only the one just loaded: a host never
//! re-registers a type it did not change, so an older host loading an
//! unrelated component cannot reset the settings a newer host recorded
//! (the database keeps the newest digest of each type; see
//! `docs/queue.md`). A registration the database does not take (it is
//! down, unreachable) is retried with backoff until it does: a component
//! loaded during an outage is served, and its type becomes enqueueable as
//! soon as the database is back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::component::{LoadedComponent, Registry, RegistryEvent};
use crate::store::Store;

/// The first wait after a failed registration; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(200);

/// The longest wait between attempts while the database stays unavailable.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Registers loaded components, retrying those the database has not taken.
pub struct Registrar {
    store: Store,
    registry: Arc<Registry>,
    /// Loaded components not registered yet, by job type: only the newest
    /// version of a type is worth registering.
    pending: BTreeMap<String, Arc<LoadedComponent>>,
    /// Failed attempts in a row, for the backoff and the logs.
    failures: u32,
}

impl Registrar {
    /// A registrar for the components of `registry`.
    pub fn new(store: Store, registry: Arc<Registry>) -> Self {
        Registrar { store, registry, pending: BTreeMap::new(), failures: 0 }
    }

    /// Queues every component loaded now (the startup scan, or events missed).
    pub fn queue_all(&mut self) {
        for component in self.registry.components() {
            self.pending.insert(component.config.name.clone(), component);
        }
    }

    /// Job types waiting to be registered.
    pub fn pending(&self) -> Vec<String> {
        self.pending.keys().cloned().collect()
    }

    /// Registers the queued components, one statement each, stopping at the
    /// first failure (the database is likely down for the rest too).
    /// Returns whether none is left.
    pub async fn register_pending(&mut self) -> bool {
        while let Some((name, component)) = self.pending.first_key_value().map(|(n, c)| (n.clone(), c.clone())) {
            let registration = [(component.config.clone(), component.digest.clone())];
            match self.store.job_types_register(&registration).await {
                Ok(()) => {
                    if self.failures > 0 {
                        tracing::info!(job = %name, attempts = self.failures + 1, "job type registered after retrying");
                    }
                    self.failures = 0;
                    // A newer version loaded meanwhile stays queued.
                    if self.pending.get(&name).is_some_and(|c| c.digest == component.digest) {
                        self.pending.remove(&name);
                    }
                }
                Err(error) => {
                    self.failures += 1;
                    tracing::warn!(
                        job = %name,
                        %error,
                        attempt = self.failures,
                        retry_in = ?self.retry_delay(),
                        "cannot register the job type in the database; enqueues of it fail until it is; retrying"
                    );
                    return false;
                }
            }
        }
        true
    }

    /// The wait before the next attempt after the failures so far.
    fn retry_delay(&self) -> Duration {
        retry_delay(self.failures)
    }

    /// Registers each component as it loads, retrying until `shutdown`.
    pub async fn run(mut self, mut events: broadcast::Receiver<RegistryEvent>, shutdown: CancellationToken) {
        loop {
            let waiting = !self.pending.is_empty();
            let retry = tokio::time::sleep(self.retry_delay());
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = retry, if waiting => {}
                event = events.recv() => match event {
                    Ok(RegistryEvent::Loaded { name, .. }) => {
                        if let Some(component) = self.registry.get(&name) {
                            self.pending.insert(name, component);
                        }
                    }
                    Ok(RegistryEvent::Unloaded { name, .. }) => {
                        self.pending.remove(&name);
                    }
                    Ok(RegistryEvent::Rejected { .. }) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => self.queue_all(),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
            self.register_pending().await;
        }
    }
}

/// The wait after `failures` failed attempts in a row: doubling, capped.
fn retry_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    RETRY_FIRST.saturating_mul(1 << doublings).min(RETRY_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_to_a_ceiling() {
        let delays: Vec<Duration> = (0..40).map(retry_delay).collect();
        assert_eq!(delays[1], RETRY_FIRST);
        assert_eq!(delays[2], RETRY_FIRST * 2);
        assert_eq!(delays[39], RETRY_MAX);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
    }
}
