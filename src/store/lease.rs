//! Leases: how long a running job may go without a heartbeat.

use std::time::Duration;

use crate::types::JobConfig;

/// The lease a job of this type gets: its concurrency `duration` for a
/// limited type, the host's default otherwise (guarantee 6).
pub fn lease_secs(config: &JobConfig, default_lease: Duration) -> i32 {
    match &config.concurrency {
        Some(limit) => limit.duration_secs as i32,
        None => default_lease.as_secs().max(1) as i32,
    }
}
