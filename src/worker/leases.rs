//! The leases this host holds: renewed together each heartbeat, and fenced
//! locally, so a host that cannot renew a lease stops that guest before the
//! database could hand the job to another host (guarantee 6).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::component::StopSignal;
use crate::store::{HostInfo, Store};

use super::WorkerConfig;

/// One running job's lease as this host sees it.
struct Held {
    token: i64,
    lease: Duration,
    /// When this host stops the guest unless a renewal succeeds first:
    /// measured from before the statement that last set the lease was sent,
    /// so it always falls before the database's expiry.
    fence_at: Instant,
    signal: StopSignal,
    /// The run has ended and its result is on its way to the database; the
    /// lease is still renewed (so a slow write does not cause a redelivery)
    /// but there is no guest left to stop.
    ended: bool,
}

/// The running jobs of this host.
#[derive(Clone, Default)]
pub struct Leases {
    held: Arc<Mutex<HashMap<i64, Held>>>,
}

impl Leases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Held>> {
        // Updates are plain map operations that cannot panic midway.
        self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a lease taken by a fetch sent at `sent_at`.
    pub fn hold(&self, id: i64, token: i64, lease: Duration, margin: Duration, sent_at: Instant, signal: StopSignal) {
        let fence_at = sent_at + lease.saturating_sub(margin);
        self.lock().insert(id, Held { token, lease, fence_at, signal, ended: false });
    }

    /// Notes that a run's guest has returned.
    pub fn ended(&self, id: i64) {
        if let Some(held) = self.lock().get_mut(&id) {
            held.ended = true;
        }
    }

    /// Forgets a lease once its run is written back.
    pub fn release(&self, id: i64) {
        self.lock().remove(&id);
    }

    /// How many leases this host holds (running or prefetched jobs).
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// Stops every running guest with `reason`.
    pub fn stop_all(&self, reason: &str) {
        for held in self.lock().values() {
            held.signal.stop(reason);
        }
    }

    fn snapshot(&self) -> Vec<(i64, i64)> {
        self.lock().iter().map(|(id, h)| (*id, h.token)).collect()
    }

    /// Applies a renewal sent at `sent_at`: renewed leases move their fence;
    /// a lease the database did not renew belongs to another host now, so its
    /// guest is stopped at once.
    fn renewed(&self, asked: &[(i64, i64)], renewed: &[i64], margin: Duration, sent_at: Instant) {
        let renewed: std::collections::HashSet<i64> = renewed.iter().copied().collect();
        let mut held = self.lock();
        for (id, token) in asked {
            let Some(lease) = held.get_mut(id).filter(|h| h.token == *token) else { continue };
            if renewed.contains(id) {
                lease.fence_at = sent_at + lease.lease.saturating_sub(margin);
            } else if !lease.ended {
                tracing::warn!(job_id = id, "lease lost to another host; stopping the run");
                lease.signal.stop("lease lost: another host owns this job now");
            }
        }
    }

    /// Stops guests whose fence has passed; returns the next fence time.
    fn enforce_fences(&self, now: Instant) -> Option<Instant> {
        let held = self.lock();
        let live = |h: &&Held| !h.ended && !h.signal.is_stopped();
        for (id, lease) in held.iter().filter(|(_, h)| h.fence_at <= now && live(h)) {
            tracing::warn!(job_id = id, "lease could not be renewed in time; stopping the run");
            lease.signal.stop("lease could not be renewed before it expired");
        }
        held.values().filter(live).map(|h| h.fence_at).min()
    }
}

/// Renews leases and the host's row every heartbeat and enforces fences in
/// between, until `shutdown`.
pub async fn heartbeat_loop(
    store: Arc<dyn Store>,
    leases: Leases,
    host: impl Fn() -> HostInfo + Send,
    config: WorkerConfig,
    shutdown: CancellationToken,
) {
    let margin = config.fence_margin();
    let mut tick = tokio::time::interval(config.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next_fence = leases.enforce_fences(Instant::now());
        let fence = async {
            match next_fence {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = fence => continue,
            _ = tick.tick() => {}
        }
        let asked = leases.snapshot();
        let sent_at = Instant::now();
        match store.lease_renew(&host().id, &asked).await {
            Ok(renewed) => leases.renewed(&asked, &renewed, margin, sent_at),
            Err(error) => tracing::warn!(%error, "cannot renew leases; fencing continues"),
        }
        if let Err(error) = store.host_upsert(&host()).await {
            tracing::warn!(%error, "cannot refresh this host's fleet membership");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(1);

    #[test]
    fn an_unrenewed_lease_is_fenced_before_it_expires() {
        let leases = Leases::default();
        let signal = StopSignal::new();
        let fetched = Instant::now();
        leases.hold(1, 7, LEASE, MARGIN, fetched, signal.clone());
        assert_eq!(leases.enforce_fences(fetched + Duration::from_secs(8)), Some(fetched + Duration::from_secs(9)));
        assert!(!signal.is_stopped());
        leases.enforce_fences(fetched + Duration::from_secs(9));
        assert!(signal.is_stopped(), "stopped a full margin before the database would expire the lease");
    }

    #[test]
    fn a_renewal_moves_the_fence_and_a_refused_one_stops_the_run() {
        let leases = Leases::default();
        let (kept, lost) = (StopSignal::new(), StopSignal::new());
        let fetched = Instant::now();
        leases.hold(1, 7, LEASE, MARGIN, fetched, kept.clone());
        leases.hold(2, 8, LEASE, MARGIN, fetched, lost.clone());
        let renewed_at = fetched + Duration::from_secs(5);
        leases.renewed(&[(1, 7), (2, 8)], &[1], MARGIN, renewed_at);
        assert!(lost.is_stopped(), "a lease the database did not renew is someone else's");
        assert!(!kept.is_stopped());
        assert_eq!(leases.enforce_fences(fetched + Duration::from_secs(12)), Some(renewed_at + LEASE - MARGIN));
        assert!(!kept.is_stopped());
    }
}
