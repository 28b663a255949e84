//! Leases: how long a running job may go without a heartbeat, and what a
//! renewal answers about each run.

use std::time::Duration;

use crate::types::JobConfig;

/// What a pass of lease expiry did, as a backend reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    /// Jobs back to `available` (or their attempt given back).
    pub requeued: u64,
    /// Jobs archived as failed (or cancelled): their attempts were spent.
    pub failed: u64,
    /// Expired leases left for the next pass: another transaction held
    /// their key or batch (PostgreSQL's sweep skips locked rows).
    pub held_back: u64,
}

impl Expired {
    /// Says what the pass did in the host's log, in the same words on every
    /// backend and path, and returns what the store reports: (requeued, failed).
    pub(crate) fn logged(self) -> (u64, u64) {
        let Expired { requeued, failed, held_back } = self;
        if requeued > 0 || failed > 0 {
            tracing::warn!(requeued, failed, "rescued jobs whose lease expired");
        }
        if held_back > 0 {
            tracing::info!(held_back, "expired leases wait for a key or batch another transaction holds");
        }
        (requeued, failed)
    }
}

/// One run of a job: the job and the lease token its fetch issued. A job
/// leased again gets a new token, so two runs of one job (a lingering old
/// one and its redelivery) are never mistaken for each other (guarantee 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId {
    /// The job.
    pub job_id: i64,
    /// The token of this run's lease.
    pub lease_token: i64,
}

/// A run's latest `progress(done, total)`, sent with a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunProgress {
    /// The run.
    pub run: RunId,
    /// Work done.
    pub done: u64,
    /// Work in all.
    pub total: u64,
}

impl RunProgress {
    /// The document a job keeps as its progress.
    pub fn document(&self) -> serde_json::Value {
        serde_json::json!({ "done": self.done, "total": self.total })
    }
}

/// What a host asks of its leases at a heartbeat.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRenew<'a> {
    /// The host.
    pub host_id: &'a str,
    /// The runs whose leases it renews.
    pub runs: &'a [RunId],
    /// Those of `runs` whose guests have started: their leases are
    /// confirmed, so an expiry of them spends the attempt (guarantee 5).
    pub started: &'a [RunId],
    /// The latest progress of running ones, recorded where renewed.
    pub progress: &'a [RunProgress],
}

/// A run leased to a host that the host neither asked to renew nor ever
/// confirmed: leased by a write whose answer never reached it (a lost
/// reply, an abandoned write), or one still on its way. What the host needs
/// to hand it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrayLease {
    /// The run.
    pub run: RunId,
    /// Its attempt, as the lease counted it.
    pub attempt: i32,
    /// Its concurrency key, if limited.
    pub concurrency_key: Option<String>,
    /// Its batch, if a member.
    pub batch_id: Option<i64>,
}

/// A stray as both backends read it: job id, lease token, attempt,
/// concurrency key, batch.
pub(crate) type StrayRow = (i64, i64, i32, Option<String>, Option<i64>);

impl From<StrayRow> for StrayLease {
    fn from((job_id, lease_token, attempt, concurrency_key, batch_id): StrayRow) -> Self {
        StrayLease { run: RunId { job_id, lease_token }, attempt, concurrency_key, batch_id }
    }
}

/// How many times a job's lease may expire unconfirmed and give its attempt
/// back; after that, an unconfirmed expiry is charged too, so a job whose
/// run brings every host that takes it down before its first heartbeat is
/// not retried for ever. PostgreSQL's `jobhost.expiry_charges` says the same.
pub const UNCONFIRMED_EXPIRIES_REFUNDED: i32 = 3;

/// What a renewal found for the runs it was asked about. A run in neither
/// list is still this host's but its row was locked by another transaction
/// (this host's own result write, an operator's statement): it was not
/// renewed this time and keeps its fence, but it is not lost either, so a
/// renewal never waits on a row lock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseRenewal {
    /// Runs whose lease now runs a full lease from the renewal.
    pub renewed: Vec<RunId>,
    /// Runs that are no longer this host's: the job was re-leased or
    /// finished. Their guests must stop at once.
    pub lost: Vec<RunId>,
    /// Runs (renewed too) an operator asked to cancel: their guests stop
    /// and they end as cancelled.
    pub cancelled: Vec<RunId>,
    /// The host's other running jobs that it never confirmed, which it may
    /// not know of: see [`StrayLease`].
    pub strays: Vec<StrayLease>,
}

/// The lease a job of this type gets: its concurrency `duration` for a
/// limited type, the host's default otherwise (guarantee 6).
pub fn lease_secs(config: &JobConfig, default_lease: Duration) -> i32 {
    match &config.concurrency {
        Some(limit) => limit.duration_secs as i32,
        None => default_lease.as_secs().max(1) as i32,
    }
}
