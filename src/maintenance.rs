//! The sweeps every host runs, safe when several run at once (each locks
//! what it works on with `SKIP LOCKED`, or one key at a time): due scheduled
//! jobs pass the gate, expired leases are rescued, parked jobs of keys with
//! a free slot are promoted, semaphores that disagree with their jobs are
//! repaired, old archive rows and the rows of hosts long gone are pruned.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::config::ConfigError;
use crate::store::Store;

/// Settings of the maintenance sweeps.
#[derive(Debug, Clone)]
pub struct MaintenanceConfig {
    /// Time between passes; also the latest a delayed job starts after it is due.
    pub interval: Duration,
    /// How long finished jobs stay in the archive.
    pub retention: Duration,
    /// Archive rows deleted per pass at most, so pruning never holds long locks.
    pub prune_batch: i64,
    /// A host not seen for this long is dropped from the fleet's records
    /// (its jobs were rescued long before, when their leases expired).
    pub host_silence: Duration,
    /// Keys whose parked jobs are promoted per pass at most, the keys with
    /// the oldest parked job first.
    pub promote_keys: i64,
    /// Time between semaphore repairs (they lock every idle semaphore briefly).
    pub repair_interval: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            interval: Duration::from_secs(1),
            retention: Duration::from_secs(7 * 24 * 3600),
            prune_batch: 10_000,
            host_silence: Duration::from_secs(24 * 3600),
            promote_keys: 1_000,
            repair_interval: Duration::from_secs(30),
        }
    }
}

impl MaintenanceConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// A zero interval or batch.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.interval.is_zero() {
            return Err(ConfigError { field: "interval", reason: "must be positive".into() });
        }
        if self.prune_batch <= 0 {
            return Err(ConfigError { field: "prune_batch", reason: "must be positive".into() });
        }
        if self.promote_keys <= 0 {
            return Err(ConfigError { field: "promote_keys", reason: "must be positive".into() });
        }
        Ok(())
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Scheduled jobs made available.
    pub promoted: u64,
    /// Jobs with expired leases made available again.
    pub requeued: u64,
    /// Jobs with expired leases failed (their last attempt).
    pub failed: u64,
    /// Parked jobs promoted into free slots.
    pub unparked: u64,
    /// Semaphores whose holder count was corrected.
    pub repaired: u64,
    /// Archive rows deleted.
    pub pruned: u64,
    /// Rows of silent hosts deleted.
    pub hosts_pruned: u64,
}

/// The sweeps of one host.
pub struct Maintenance {
    store: Arc<dyn Store>,
    config: MaintenanceConfig,
}

impl Maintenance {
    /// Sweeps over `store`.
    ///
    /// # Errors
    /// Invalid settings.
    pub fn new(store: Arc<dyn Store>, config: MaintenanceConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Maintenance { store, config })
    }

    /// One pass of every sweep, the semaphore repair included. `now`
    /// overrides the database's clock, for tests.
    ///
    /// # Errors
    /// The first sweep that failed; later ones did not run.
    pub async fn run_once(&self, now: Option<DateTime<Utc>>) -> crate::store::Result<PassReport> {
        self.pass(now, true).await
    }

    async fn pass(&self, now: Option<DateTime<Utc>>, repair: bool) -> crate::store::Result<PassReport> {
        let promoted = self.store.job_promote_due(now).await?;
        let (requeued, failed) = self.store.lease_expire(now).await?;
        // Repair before promoting, so a slot the repair freed is used in this pass.
        let repaired = if repair { self.store.semaphores_repair().await?.len() as u64 } else { 0 };
        let unparked = self.store.parked_promote(self.config.promote_keys).await?;
        let retention_secs = self.config.retention.as_secs_f64();
        let pruned = self.store.archive_prune(now, retention_secs, self.config.prune_batch).await?;
        let hosts_pruned = self.store.host_prune(self.config.host_silence.as_secs_f64()).await?;
        Ok(PassReport { promoted, requeued, failed, unparked, repaired, pruned, hosts_pruned })
    }

    /// Runs a pass every interval until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_repair: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let repair = last_repair.is_none_or(|at| at.elapsed() >= self.config.repair_interval);
            if repair {
                last_repair = Some(tokio::time::Instant::now());
            }
            match self.pass(None, repair).await {
                Ok(report) if report != PassReport::default() => tracing::debug!(?report, "maintenance pass"),
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "maintenance pass failed"),
            }
        }
    }
}
