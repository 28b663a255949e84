//! Fleet membership: who is serving which job types.

/// A host's row in the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    /// Unique per process: hostname, pid and a random suffix.
    pub id: String,
    /// The machine's name.
    pub hostname: String,
    /// The process id.
    pub pid: u32,
    /// The jobhost version.
    pub version: String,
    /// The job types this host has loaded and fetches.
    pub job_types: Vec<String>,
    /// How often it renews its row: it is presumed dead once it has been
    /// silent for [`MISSED_HEARTBEATS`] of these.
    pub heartbeat_ms: i64,
}

/// Heartbeats a host may miss before it is presumed dead: one late or lost
/// renewal is normal on a busy machine, three in a row is not.
pub const MISSED_HEARTBEATS: i64 = 3;

/// A host presumed dead: it has not renewed its row for [`MISSED_HEARTBEATS`]
/// of its own heartbeat intervals. Its leases expire by themselves; its row
/// stays until the maintenance prunes it, so operators can see it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SilentHost {
    /// The host's id.
    pub id: String,
    /// Seconds since it last renewed its row.
    pub silent_secs: f64,
    /// Its heartbeat interval, in milliseconds.
    pub heartbeat_ms: i64,
}

impl HostInfo {
    /// This process's identity, serving `job_types`, heartbeating every `heartbeat`.
    pub fn current(job_types: Vec<String>, heartbeat: std::time::Duration) -> Self {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_string());
        let pid = std::process::id();
        let suffix: u32 = rand_suffix();
        HostInfo {
            id: format!("{hostname}-{pid}-{suffix:08x}"),
            hostname,
            pid,
            version: env!("CARGO_PKG_VERSION").to_string(),
            job_types,
            heartbeat_ms: i64::try_from(heartbeat.as_millis()).unwrap_or(i64::MAX).max(1),
        }
    }
}

/// Splits hosts, as (id, seconds since last seen, heartbeat interval in ms)
/// rows, into the number alive and those presumed dead.
pub fn liveness(rows: Vec<(String, f64, i64)>) -> (i64, Vec<SilentHost>) {
    let (alive, silent): (Vec<_>, Vec<_>) = rows
        .into_iter()
        .map(|(id, silent_secs, heartbeat_ms)| SilentHost { id, silent_secs: silent_secs.max(0.0), heartbeat_ms })
        .partition(|h| h.silent_secs * 1000.0 <= (MISSED_HEARTBEATS * h.heartbeat_ms) as f64);
    (alive.len() as i64, silent)
}

/// A few random bits so a restarted process with a recycled pid gets a new id.
fn rand_suffix() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish() as u32
}

/// Reads stored job type configurations back, naming any that cannot be read.
///
/// # Errors
/// [`super::Error::CorruptJobType`] for a configuration that no longer parses.
pub fn decode_configs(
    rows: Vec<(String, serde_json::Value)>,
) -> super::Result<std::collections::HashMap<String, crate::types::JobConfig>> {
    rows.into_iter()
        .map(|(name, config)| match serde_json::from_value(config) {
            Ok(config) => Ok((name, config)),
            Err(e) => Err(super::Error::CorruptJobType { name, reason: e.to_string() }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_judged_by_its_own_heartbeat() {
        let rows = vec![
            ("fast-and-silent".to_string(), 1.0, 250),
            ("slow-and-on-time".to_string(), 20.0, 10_000),
            ("slow-and-silent".to_string(), 31.0, 10_000),
        ];
        let (alive, silent) = liveness(rows);
        assert_eq!(alive, 1);
        let silent: Vec<&str> = silent.iter().map(|h| h.id.as_str()).collect();
        assert_eq!(silent, ["fast-and-silent", "slow-and-silent"]);
    }
}
