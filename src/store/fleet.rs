//! Fleet membership: who is serving which job types, with which
//! components, and whether each can still see new ones.

use std::collections::BTreeMap;

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
    /// The digest of the component serving each job type, so operators see
    /// a type that hosts serve with different builds.
    pub digests: BTreeMap<String, String>,
    /// Why this host's directory watcher is down (`None` while it watches):
    /// it serves what it has loaded but may not see new components.
    pub watcher_error: Option<String>,
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

/// This machine's name, or `localhost` where it has none to read.
pub fn this_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

impl HostInfo {
    /// This process's identity, serving `job_types`, heartbeating every `heartbeat`.
    pub fn current(job_types: Vec<String>, heartbeat: std::time::Duration) -> Self {
        let hostname = this_hostname();
        let pid = std::process::id();
        let suffix: u32 = rand_suffix();
        HostInfo {
            id: format!("{hostname}-{pid}-{suffix:08x}"),
            hostname,
            pid,
            version: env!("CARGO_PKG_VERSION").to_string(),
            job_types,
            digests: BTreeMap::new(),
            watcher_error: None,
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
        .partition(|h| is_alive(h.silent_secs, h.heartbeat_ms));
    (alive.len() as i64, silent)
}

/// Whether a host silent for `silent_secs` is alive by its own heartbeat.
fn is_alive(silent_secs: f64, heartbeat_ms: i64) -> bool {
    silent_secs * 1000.0 <= (MISSED_HEARTBEATS * heartbeat_ms) as f64
}

/// A host's row as its health is judged: how long it has been silent, its
/// heartbeat, the digest serving each of its job types, its watcher's error.
#[derive(Debug, Clone)]
pub struct HostHealthRow {
    /// The host's id.
    pub id: String,
    /// Seconds since it last renewed its row.
    pub silent_secs: f64,
    /// Its heartbeat interval, in milliseconds.
    pub heartbeat_ms: i64,
    /// Job type → digest of the component serving it there.
    pub digests: BTreeMap<String, String>,
    /// Why its directory watcher is down, if it is.
    pub watcher_error: Option<String>,
}

/// What a registration changed: the job types whose configuration it
/// replaced, and how many blocked jobs their new limits promoted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registered {
    /// The job types registered anew or with a new configuration.
    pub changed: Vec<String>,
    /// Blocked jobs of those types promoted into slots a raised limit freed.
    pub promoted: u64,
}

/// A live host that cannot watch its components directory: it rescans it
/// on an interval instead, and says so until the watch is back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WatcherDown {
    /// The host's id.
    pub host: String,
    /// Why its watcher is down.
    pub error: String,
}

/// A job type live hosts serve with different components (a rollout in
/// progress, or one host left behind): its runs differ by host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MixedComponents {
    /// The job type.
    pub job: String,
    /// Each digest serving it, with the hosts serving that digest.
    pub digests: BTreeMap<String, Vec<String>>,
}

/// `stats` with what operators should hear about the live hosts (see
/// [`fleet_warnings`]), from every host's health row.
pub(crate) fn with_fleet_warnings(mut stats: super::Stats, rows: Vec<HostHealthRow>) -> super::Stats {
    (stats.watchers_down, stats.mixed_components) = fleet_warnings(rows);
    stats
}

/// What operators should hear about the live hosts: watchers that are down,
/// and job types served with different components. Hosts presumed dead are
/// left out (they are reported as such).
pub fn fleet_warnings(rows: Vec<HostHealthRow>) -> (Vec<WatcherDown>, Vec<MixedComponents>) {
    let alive: Vec<HostHealthRow> = rows.into_iter().filter(|h| is_alive(h.silent_secs, h.heartbeat_ms)).collect();
    let watchers_down = alive
        .iter()
        .filter_map(|h| h.watcher_error.as_ref().map(|error| WatcherDown { host: h.id.clone(), error: error.clone() }))
        .collect();
    let mut served: BTreeMap<&str, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for host in &alive {
        for (job, digest) in &host.digests {
            served.entry(job).or_default().entry(digest.clone()).or_default().push(host.id.clone());
        }
    }
    let mixed = served
        .into_iter()
        .filter(|(_, digests)| digests.len() > 1)
        .map(|(job, mut digests)| {
            digests.values_mut().for_each(|hosts| hosts.sort());
            MixedComponents { job: job.to_string(), digests }
        })
        .collect();
    (watchers_down, mixed)
}

/// A host as operators see it: who it is, what it serves, and whether it
/// is alive by its own heartbeat.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HostRow {
    /// The host's id.
    pub id: String,
    /// The machine's name.
    pub hostname: String,
    /// The process id.
    pub pid: i64,
    /// The jobhost version it runs.
    pub version: String,
    /// The job types it has loaded and fetches.
    pub job_types: Vec<String>,
    /// Job type → digest of the component serving it there.
    pub digests: BTreeMap<String, String>,
    /// Why its directory watcher is down, if it is.
    pub watcher_error: Option<String>,
    /// How often it renews its row, in milliseconds.
    pub heartbeat_ms: i64,
    /// When it started.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Seconds since it last renewed its row.
    pub silent_secs: f64,
    /// Whether it renewed its row within [`MISSED_HEARTBEATS`] of its interval.
    pub alive: bool,
}

impl HostRow {
    /// Whether it is alive, judged by its own heartbeat.
    pub fn judged(self) -> HostRow {
        HostRow { alive: is_alive(self.silent_secs, self.heartbeat_ms), silent_secs: self.silent_secs.max(0.0), ..self }
    }
}

/// A registered job type: the configuration its latest loaded component
/// declared, which every enqueuer applies.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JobTypeRow {
    /// The job type.
    pub name: String,
    /// The declared configuration; `None` when the stored one cannot be
    /// read (see `config_error`).
    #[serde(serialize_with = "crate::types::serialize_config_document")]
    pub config: Option<crate::types::JobConfig>,
    /// Why the stored configuration cannot be read: enqueues of this type
    /// are refused until a component registers it again.
    pub config_error: Option<String>,
    /// The digest of the component that declared it.
    pub digest: String,
    /// When it was last registered with a different component.
    #[serde(serialize_with = "super::timestamp::serialize")]
    pub updated_at: chrono::DateTime<chrono::Utc>,
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

/// Job type rows from (name, stored configuration, digest, updated) rows:
/// one whose configuration cannot be read is listed with the reason, so
/// one bad row hides none of the others.
pub fn job_type_rows(
    rows: impl Iterator<Item = (String, serde_json::Value, String, chrono::DateTime<chrono::Utc>)>,
) -> super::Result<Vec<JobTypeRow>> {
    Ok(rows
        .map(|(name, config, digest, updated_at)| {
            let (config, config_error) = match serde_json::from_value(config) {
                Ok(config) => (Some(config), None),
                Err(e) => (None, Some(e.to_string())),
            };
            JobTypeRow { name, config, config_error, digest, updated_at }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(id: &str, silent_secs: f64, digests: &[(&str, &str)], watcher_error: Option<&str>) -> HostHealthRow {
        HostHealthRow {
            id: id.into(),
            silent_secs,
            heartbeat_ms: 1_000,
            digests: digests.iter().map(|(j, d)| (j.to_string(), d.to_string())).collect(),
            watcher_error: watcher_error.map(str::to_string),
        }
    }

    #[test]
    fn live_hosts_serving_one_type_with_different_components_are_reported() {
        let rows = vec![
            health("a", 0.5, &[("mail", "d1"), ("pdf", "p1")], None),
            health("b", 0.5, &[("mail", "d2"), ("pdf", "p1")], Some("directory removed")),
            health("c", 0.5, &[("mail", "d1")], None),
            health("dead", 60.0, &[("pdf", "p0")], Some("old news")),
        ];
        let (down, mixed) = fleet_warnings(rows);
        assert_eq!(down, [WatcherDown { host: "b".into(), error: "directory removed".into() }]);
        assert_eq!(mixed.len(), 1, "pdf is served by one component among live hosts: {mixed:?}");
        assert_eq!(mixed[0].job, "mail");
        assert_eq!(mixed[0].digests["d1"], ["a", "c"]);
        assert_eq!(mixed[0].digests["d2"], ["b"]);
    }

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
