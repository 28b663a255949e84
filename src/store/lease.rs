//! Leases: how long a running job may go without a heartbeat, and what a
//! renewal answers about each run.

use std::time::Duration;

use crate::types::JobConfig;

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
}

/// The lease a job of this type gets: its concurrency `duration` for a
/// limited type, the host's default otherwise (guarantee 6).
pub fn lease_secs(config: &JobConfig, default_lease: Duration) -> i32 {
    match &config.concurrency {
        Some(limit) => limit.duration_secs as i32,
        None => default_lease.as_secs().max(1) as i32,
    }
}
