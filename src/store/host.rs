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
}

impl HostInfo {
    /// This process's identity, serving `job_types`.
    pub fn current(job_types: Vec<String>) -> Self {
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
        }
    }
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
