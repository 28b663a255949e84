//! The sweeps every host runs, safe when several run at once (each locks
//! what it works on with `SKIP LOCKED`, or one key at a time): due scheduled
//! jobs pass the gate, expired leases are rescued, blocked jobs of keys with
//! a free slot are promoted, semaphores that disagree with their jobs are
//! repaired, due durable waits end (sleeps and timeouts), old archive rows,
//! events and the rows of hosts long gone are pruned,
//! and, every `history_interval`, the fleet's history gets its next minutes
//! from the archive and a sample of the queues' depth.
//!
//! Nothing in a pass grows with the size of the queue: each sweep takes a
//! bounded batch through an index. The sweep of blocked jobs and the repair
//! page through concurrency keys in (job type, key) order, a page per pass,
//! keeping their place in this service's memory and starting again from the
//! first key after the last; so every key is visited within
//! ceil(keys / page) passes, however many others are busy.
//!
//! Between passes a timer passes each scheduled job the gate at the instant
//! it is due, when that comes before the next pass: a job a rate limit sent
//! back to wait becomes available when its start frees up (guarantee 15),
//! not up to an interval later. A fetch that sends jobs back tells the
//! timers to look again.
//!
//! No row stalls them (guarantee 13): each sweep runs whatever the others
//! did, and a set-based sweep the database refuses is split until the row
//! it cannot process stands alone, which is failed with the reason.

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::config::ConfigError;
use crate::store::{KeyCursor, Store};

/// A sweep's place, read and written between awaits (never held across one).
fn lock(cursor: &Mutex<Option<KeyCursor>>) -> std::sync::MutexGuard<'_, Option<KeyCursor>> {
    // A poisoned place is still a place: at worst a page is visited twice.
    cursor.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    /// Keys with blocked jobs the sweep visits per pass (a page; the next
    /// pass goes on after the last), promoting those with a free slot.
    pub promote_keys: i64,
    /// Keys the semaphore repair checks per repair (a page, as for
    /// `promote_keys`): it locks each idle semaphore of the page briefly.
    pub repair_keys: i64,
    /// Time between semaphore repairs.
    pub repair_interval: Duration,
    /// Time between computations of the history's minutes (and samples of
    /// the queues' depth).
    pub history_interval: Duration,
    /// How long the history's minutes are kept.
    pub history_retention: Duration,
    /// How long the audit trail's rows are kept (pruned with the history,
    /// `prune_batch` rows at a time).
    pub audit_retention: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            interval: Duration::from_secs(1),
            retention: Duration::from_secs(7 * 24 * 3600),
            prune_batch: 10_000,
            host_silence: Duration::from_secs(24 * 3600),
            promote_keys: 1_000,
            repair_keys: 1_000,
            repair_interval: Duration::from_secs(5),
            history_interval: Duration::from_secs(10),
            history_retention: Duration::from_secs(7 * 24 * 3600),
            audit_retention: crate::store::audit::DEFAULT_RETENTION,
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
        if self.repair_keys <= 0 {
            return Err(ConfigError { field: "repair_keys", reason: "must be positive".into() });
        }
        if self.history_interval.is_zero() {
            return Err(ConfigError { field: "history_interval", reason: "must be positive".into() });
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
    /// Blocked jobs promoted into free slots.
    pub unblocked: u64,
    /// Semaphores whose holder count was corrected.
    pub repaired: u64,
    /// Archive rows deleted.
    pub pruned: u64,
    /// Rows of silent hosts deleted.
    pub hosts_pruned: u64,
    /// Jobs maintenance could not process, failed with the reason.
    pub quarantined: u64,
    /// Jobs left for the next pass because another transaction held what
    /// they needed (an application's open transaction on their key) for
    /// longer than a sweep waits.
    pub busy: u64,
    /// Rows of the history's minutes computed from the archive.
    pub history: u64,
    /// Durable waits ended by their time or timeout, or armed late.
    pub waits: u64,
}

impl PassReport {
    fn add(&mut self, other: PassReport) {
        self.promoted += other.promoted;
        self.requeued += other.requeued;
        self.failed += other.failed;
        self.unblocked += other.unblocked;
        self.repaired += other.repaired;
        self.pruned += other.pruned;
        self.hosts_pruned += other.hosts_pruned;
        self.quarantined += other.quarantined;
        self.busy += other.busy;
        self.history += other.history;
        self.waits += other.waits;
    }
}

/// The sweeps a pass runs besides those it always runs: each has its own
/// interval, longer than a pass's.
#[derive(Debug, Clone, Copy)]
struct Extras {
    /// The semaphore repair.
    repair: bool,
    /// The history's computation.
    history: bool,
}

/// The most due waits one pass ends (each releases its step).
const WAITS_BATCH: i64 = 1_000;

/// The most rows one isolating pass reads when a batch is refused.
const ISOLATE_BATCH: i64 = 1_000;

/// The sweeps of one host.
pub struct Maintenance {
    store: Store,
    config: MaintenanceConfig,
    metrics: crate::metrics::Metrics,
    /// The last key the sweep of blocked jobs visited; `None` starts from
    /// the first. In memory: a host that restarts starts again from the
    /// first key, which costs one page, and hosts need not agree.
    promote_cursor: Mutex<Option<KeyCursor>>,
    /// The last key the semaphore repair checked, as `promote_cursor`.
    repair_cursor: Mutex<Option<KeyCursor>>,
}

impl Maintenance {
    /// Sweeps over `store`.
    ///
    /// # Errors
    /// Invalid settings.
    pub fn new(store: Store, config: MaintenanceConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Maintenance {
            store,
            config,
            metrics: crate::metrics::Metrics::default(),
            promote_cursor: Mutex::new(None),
            repair_cursor: Mutex::new(None),
        })
    }

    /// Counts the leases its sweeps expire in `metrics`.
    pub fn with_metrics(self, metrics: crate::metrics::Metrics) -> Self {
        Maintenance { metrics, ..self }
    }

    /// One pass of every sweep, the semaphore repair included. `now`
    /// overrides the database's clock, for tests.
    ///
    /// # Errors
    /// The first sweep that failed; the others ran all the same.
    pub async fn run_once(&self, now: Option<DateTime<Utc>>) -> crate::store::Result<PassReport> {
        let (report, mut errors) = self.pass(now, Extras { repair: true, history: true }).await;
        match errors.drain(..).next() {
            Some(error) => Err(error),
            None => Ok(report),
        }
    }

    /// Runs every sweep, each whatever the others did: one that fails (the
    /// database unreachable, a statement refused) cannot stop the rest
    /// (guarantee 13). Returns what was done and what failed.
    async fn pass(&self, now: Option<DateTime<Utc>>, extras: Extras) -> (PassReport, Vec<crate::store::Error>) {
        let mut report = PassReport::default();
        let mut errors = Vec::new();
        let mut record = |outcome: crate::store::Result<PassReport>| match outcome {
            Ok(done) => report.add(done),
            Err(error) => errors.push(error),
        };
        record(self.promote_due(now).await);
        record(self.expire_leases(now).await);
        // Repair before promoting, so a slot the repair freed is used in this pass.
        if extras.repair {
            record(self.repair_page().await);
        }
        record(self.promote_page().await);
        record(self.store.waits_due(now, WAITS_BATCH).await.map(|waits| PassReport { waits, ..Default::default() }));
        let retention_secs = self.config.retention.as_secs_f64();
        record(
            self.store
                .event_prune(now, retention_secs, self.config.prune_batch)
                .await
                .map(|pruned| PassReport { pruned, ..Default::default() }),
        );
        record(
            self.store
                .archive_prune(now, retention_secs, self.config.prune_batch)
                .await
                .map(|pruned| PassReport { pruned, ..Default::default() }),
        );
        record(
            self.store
                .host_prune(self.config.host_silence.as_secs_f64())
                .await
                .map(|hosts_pruned| PassReport { hosts_pruned, ..Default::default() }),
        );
        if extras.history {
            let retention_secs = self.config.history_retention.as_secs_f64();
            record(
                self.store
                    .history_roll(retention_secs)
                    .await
                    .map(|history| PassReport { history, ..Default::default() }),
            );
            record(
                self.store
                    .audit_prune(now, self.config.audit_retention.as_secs_f64(), self.config.prune_batch)
                    .await
                    .map(|pruned| PassReport { pruned, ..Default::default() }),
            );
        }
        (report, errors)
    }

    /// Promotes the blocked jobs of the next page of keys that have a free
    /// slot, and moves the place on. A page that fails leaves the place
    /// where it was, so the next pass tries those keys again; a key the
    /// database refuses is passed over inside the page (guarantee 13).
    async fn promote_page(&self) -> crate::store::Result<PassReport> {
        let after = lock(&self.promote_cursor).clone();
        let page = self.store.blocked_promote(after.as_ref(), self.config.promote_keys).await?;
        *lock(&self.promote_cursor) = page.next;
        Ok(PassReport { unblocked: page.done, ..Default::default() })
    }

    /// Repairs the semaphores of the next page of keys and moves the place on.
    async fn repair_page(&self) -> crate::store::Result<PassReport> {
        let after = lock(&self.repair_cursor).clone();
        let page = self.store.semaphore_repair_page(after.as_ref(), self.config.repair_keys).await?;
        *lock(&self.repair_cursor) = page.next;
        Ok(PassReport { repaired: page.done.len() as u64, ..Default::default() })
    }

    /// Due scheduled jobs pass the gate, set-based; when the database
    /// refuses the batch, a part at a time.
    async fn promote_due(&self, now: Option<DateTime<Utc>>) -> crate::store::Result<PassReport> {
        let store = self.store.clone();
        let whole = async { Ok(PassReport { promoted: self.store.job_promote_due(now).await?, ..Default::default() }) };
        let ids = self.store.job_due_ids(now, ISOLATE_BATCH);
        self.sweep_isolating("passing the gate when due", whole, ids, move |ids| {
            let store = store.clone();
            async move { Ok(PassReport { promoted: store.job_promote_due_ids(now, &ids).await?, ..Default::default() }) }
        })
        .await
    }

    /// Expired leases are rescued, set-based; when the database refuses the
    /// batch, a part at a time.
    async fn expire_leases(&self, now: Option<DateTime<Utc>>) -> crate::store::Result<PassReport> {
        let report = |(requeued, failed)| PassReport { requeued, failed, ..Default::default() };
        let store = self.store.clone();
        let whole = async { self.store.lease_expire(now).await.map(report) };
        let ids = self.store.lease_expired_ids(now, ISOLATE_BATCH);
        let expired = self
            .sweep_isolating("rescuing its expired lease", whole, ids, move |ids| {
                let store = store.clone();
                async move { store.lease_expire_ids(now, &ids).await.map(report) }
            })
            .await;
        if let Ok(pass) = &expired {
            self.metrics.leases_expired(pass.requeued, pass.failed);
        }
        expired
    }

    /// Runs a set-based sweep (`whole`); when the database refuses it, reads
    /// the rows it would take (`ids`) and goes through them with `step`,
    /// isolating the ones it cannot process.
    async fn sweep_isolating<W, I, F, Fut>(
        &self,
        what: &str,
        whole: W,
        ids: I,
        step: F,
    ) -> crate::store::Result<PassReport>
    where
        W: std::future::Future<Output = crate::store::Result<PassReport>>,
        I: std::future::Future<Output = crate::store::Result<Vec<i64>>>,
        F: Fn(Vec<i64>) -> Fut,
        Fut: std::future::Future<Output = crate::store::Result<PassReport>>,
    {
        match whole.await {
            Err(error) if error.is_refusal() => {
                tracing::error!(%error, sweep = what, "the database refused a sweep; isolating the rows it cannot take");
                self.isolated(what, ids.await?, step).await
            }
            Err(error) if error.is_lock_timeout() => {
                tracing::info!(%error, sweep = what, "another transaction holds rows a sweep needs; sweeping around them");
                self.isolated(what, ids.await?, step).await
            }
            done => done,
        }
    }

    /// Runs `step` over `ids`, halving every part the database refuses (or
    /// that waits too long for a lock) until each row it cannot process
    /// stands alone; the rest are done (guarantee 13). A row the database
    /// refuses is quarantined with the reason; a row another transaction
    /// holds is busy, not bad, and is left for the next pass. k such rows
    /// among n cost about k·log2(n) statements.
    async fn isolated<F, Fut>(&self, what: &str, ids: Vec<i64>, step: F) -> crate::store::Result<PassReport>
    where
        F: Fn(Vec<i64>) -> Fut,
        Fut: std::future::Future<Output = crate::store::Result<PassReport>>,
    {
        let mut report = PassReport::default();
        let mut parts = vec![ids];
        while let Some(part) = parts.pop() {
            match step(part.clone()).await {
                Ok(done) => report.add(done),
                Err(error) if (error.is_refusal() || error.is_lock_timeout()) && part.len() > 1 => {
                    let (first, second) = part.split_at(part.len() / 2);
                    parts.push(second.to_vec());
                    parts.push(first.to_vec());
                }
                Err(error) if error.is_lock_timeout() => {
                    tracing::info!(
                        job_id = part[0],
                        sweep = what,
                        "another transaction holds this job's rows; next pass"
                    );
                    report.busy += 1;
                }
                Err(error) if error.is_refusal() => {
                    let id = part[0];
                    let reason = format!("maintenance could not process this job ({what}): {error}");
                    tracing::error!(job_id = id, %error, "failing a job maintenance cannot process");
                    match self.store.job_quarantine(id, &reason).await {
                        Ok(true) => report.quarantined += 1,
                        Ok(false) => {}
                        // Left where it is: the next pass finds it again, and
                        // the other rows go on meanwhile.
                        Err(error) => tracing::error!(job_id = id, %error, "cannot fail the job either; skipping it"),
                    }
                }
                Err(error) => return Err(error),
            }
        }
        Ok(report)
    }

    /// The instant the soonest scheduled job is due, when that is before
    /// the next pass would see it. After `idle_looks` looks at due jobs in a
    /// row that promoted none, an overdue one (another host promoting it
    /// now, or an application holding its row) is looked at again after a
    /// wait that doubles from 5 ms, not at once.
    async fn next_due(&self, idle_looks: u32) -> Option<std::time::Instant> {
        match self.store.job_next_due().await {
            Ok(Some(wait)) => {
                let wait = if wait.is_zero() && idle_looks > 0 {
                    Duration::from_millis(5 << idle_looks.min(10))
                } else {
                    wait
                };
                (wait < self.config.interval).then(|| std::time::Instant::now() + wait)
            }
            Ok(None) => None,
            Err(error) => {
                tracing::debug!(%error, "cannot read when the next scheduled job is due; the next pass will");
                None
            }
        }
    }

    /// Runs a pass every interval until `shutdown`, and passes due jobs
    /// the gate in between, at the instant they are due.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_repair: Option<tokio::time::Instant> = None;
        let mut last_history: Option<tokio::time::Instant> = None;
        let mut due_at: Option<std::time::Instant> = None;
        let mut idle_looks = 0;
        loop {
            let due = async move {
                match due_at {
                    Some(at) => crate::timer::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
                () = due => {
                    let promoted = match self.promote_due(None).await {
                        Ok(report) => report.promoted,
                        Err(error) => {
                            tracing::warn!(%error, "passing due jobs the gate failed; the next pass retries");
                            0
                        }
                    };
                    idle_looks = if promoted == 0 { idle_looks + 1 } else { 0 };
                    due_at = self.next_due(idle_looks).await;
                    continue;
                }
                () = self.store.job_wait_sent_back(Duration::from_secs(3600)) => {
                    due_at = self.next_due(idle_looks).await;
                    continue;
                }
            }
            let repair = last_repair.is_none_or(|at| at.elapsed() >= self.config.repair_interval);
            if repair {
                last_repair = Some(tokio::time::Instant::now());
            }
            let history = last_history.is_none_or(|at| at.elapsed() >= self.config.history_interval);
            if history {
                last_history = Some(tokio::time::Instant::now());
            }
            let (report, errors) = self.pass(None, Extras { repair, history }).await;
            if report != PassReport::default() {
                tracing::debug!(?report, "maintenance pass");
            }
            for error in errors {
                tracing::warn!(%error, "a maintenance sweep failed; the others ran");
            }
            idle_looks = 0;
            due_at = self.next_due(idle_looks).await;
        }
    }
}
