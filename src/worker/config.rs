//! Worker settings and their defaults.

use std::time::Duration;

use crate::config::ConfigError;

/// Settings of one host's worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Jobs run at once on this host.
    pub concurrency: usize,
    /// The most jobs leased beyond `concurrency`, waiting on this host for a
    /// free run slot, so the next fetch overlaps with running jobs instead
    /// of following them. Fewer while runs are long (see `prefetch_wait`).
    /// Their leases are renewed like running jobs'.
    ///
    /// Deep by default ([`WorkerConfig::default_prefetch`]): short jobs need
    /// it to keep every run slot busy, and long ones do not get it, since
    /// the host leases ahead only what its recent runs say will start
    /// within `prefetch_wait`.
    pub prefetch: usize,
    /// How long a prefetched job may wait here for a run slot: the host
    /// prefetches only as many jobs as its recent runs say will start within
    /// it, and hands back one that waited longer, with its attempt given
    /// back, for any host to start.
    pub prefetch_wait: Duration,
    /// The queues this host fetches from.
    pub queues: Vec<String>,
    /// How often running jobs' leases are renewed (one statement for all).
    pub heartbeat_interval: Duration,
    /// The lease of a job whose type has no concurrency `duration`: how long
    /// it may go without a heartbeat before another host takes it over.
    pub default_lease: Duration,
    /// How long an idle host waits for a notification before fetching anyway.
    pub poll_interval: Duration,
    /// At shutdown, how long running jobs may take to finish before they are
    /// interrupted and handed back.
    pub shutdown_grace: Duration,
    /// The most runs written back in one completion transaction.
    pub completion_batch: usize,
    /// The most result writes out at once, each on its own connection: the
    /// results behind a write that is slow to answer go out beside it.
    pub result_writes: usize,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 10,
            prefetch: WorkerConfig::default_prefetch(10),
            prefetch_wait: Duration::from_secs(1),
            queues: vec!["default".to_string()],
            heartbeat_interval: Duration::from_secs(5),
            default_lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(30),
            completion_batch: 500,
            result_writes: 2,
        }
    }
}

impl WorkerConfig {
    /// The most jobs leased ahead at a concurrency, unless set: four per
    /// run slot. At 10 slots of no-op jobs that took one host from about
    /// 7,000 to about 10,000 jobs/s (BENCHMARKS.md, "Prefetch depth").
    pub fn default_prefetch(concurrency: usize) -> usize {
        concurrency.saturating_mul(4)
    }

    /// Checks that the settings can work together.
    ///
    /// # Errors
    /// Names the first setting that cannot work and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |field, reason: &str| Err(ConfigError { field, reason: reason.to_string() });
        if self.concurrency == 0 {
            return fail("concurrency", "must be at least 1");
        }
        if self.queues.is_empty() {
            return fail("queues", "name at least one queue");
        }
        if let Some(bad) = self.queues.iter().find(|q| crate::types::check_name(q).is_err()) {
            return Err(ConfigError { field: "queues", reason: format!("{bad:?} is not a queue name") });
        }
        if self.heartbeat_interval.is_zero() {
            return fail("heartbeat_interval", "must be positive");
        }
        if self.poll_interval.is_zero() {
            return fail("poll_interval", "must be positive");
        }
        // A lease shorter than two heartbeats expires under a healthy host
        // after one late renewal (guarantee 6).
        if self.default_lease < self.heartbeat_interval * 2 {
            return fail("default_lease", "must be at least twice the heartbeat interval");
        }
        if self.prefetch_wait.is_zero() {
            return fail("prefetch_wait", "must be positive");
        }
        if self.completion_batch == 0 {
            return fail("completion_batch", "must be at least 1");
        }
        if self.result_writes == 0 {
            return fail("result_writes", "must be at least 1");
        }
        Ok(())
    }

    /// How long before a lease's expiry the host stops a guest whose lease it
    /// could not renew: half a heartbeat, so the guest is gone before the
    /// database could hand the job to another host.
    pub fn fence_margin(&self) -> Duration {
        self.heartbeat_interval / 2
    }

    /// How long a heartbeat's statement (a renewal, the host's row) may go
    /// unanswered before it is abandoned: the fence margin, so a hung
    /// statement never keeps the next heartbeat from being sent. Safety does
    /// not rest on it: fences run on the host's clock whatever the database does.
    pub fn heartbeat_deadline(&self) -> Duration {
        self.fence_margin()
    }

    /// How long a result write (with the jobs it leases) may go unanswered
    /// before it is abandoned and sent again. A retried write whose first
    /// send did commit finds its runs' tokens taken and changes nothing
    /// (guarantee 5). Generous, since a batch of many results is slower than
    /// a renewal: a lease's worth of heartbeats, at least ten seconds.
    pub fn write_deadline(&self) -> Duration {
        (self.heartbeat_interval * 4).max(Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        WorkerConfig::default().validate().unwrap();
    }

    #[test]
    fn a_lease_must_cover_two_heartbeats() {
        let config = WorkerConfig { default_lease: Duration::from_secs(9), ..WorkerConfig::default() };
        assert_eq!(config.validate().unwrap_err().field, "default_lease");
    }
}
