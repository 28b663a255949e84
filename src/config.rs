//! Host settings with their defaults. Each field says why it exists; the CLI
//! maps flags onto these and `validate` rejects nonsense before anything starts.

use std::path::PathBuf;
use std::time::Duration;

/// Settings of the component runtime: the engine, its instance pool and the
/// limits every sandbox gets unless a component asks for less.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Runs that may be in flight at once; the instance pool is sized to it
    /// (plus a few slots for loading components), so address space reserved
    /// up front follows the host's real concurrency.
    pub max_concurrent_runs: u32,
    /// Memory cap of a run whose component declares none.
    pub default_memory_limit_bytes: u64,
    /// The largest memory cap a component may declare; each pool slot is sized to it.
    pub max_memory_limit_bytes: u64,
    /// Address space reserved up front for each linear-memory slot of the
    /// instance pool. `None` keeps wasmtime's (4 GiB and a guard region),
    /// which lets compiled guests skip bounds checks; a host at a concurrency
    /// of thousands reserves terabytes that way, so a smaller reservation
    /// (at least `max_memory_limit_bytes`) bounds it, at the price of an
    /// explicit bounds check on the guests' memory accesses.
    pub memory_reservation_bytes: Option<u64>,
    /// Timeout of a run whose component declares none.
    pub default_timeout: Duration,
    /// How often the worker renews leases. A concurrency `duration` is floored
    /// at twice this, so one late heartbeat never loses a lease.
    pub heartbeat_interval: Duration,
    /// Bound on each of stdout and stderr kept from one run.
    pub output_limit_bytes: usize,
    /// Bound on the lines a run may write through the `log` import.
    pub log_line_limit: usize,
    /// The largest payload, as JSON text, a run may give a child job: the
    /// enqueue limit of the host's store, checked at the guest's call.
    pub max_payload_bytes: usize,
    /// The largest output, as JSON text, a run may return; a larger one
    /// fails the job. One value for every job type: a per-type limit would
    /// need a new version of the WIT world.
    pub max_output_bytes: usize,
    /// The most bytes one run may make the host hold in all: children's
    /// payloads, log lines, kept stdout and stderr, and the output. Each of
    /// those has its own bound too; this one stops them adding up.
    pub run_budget_bytes: usize,
    /// The most bytes of outbound HTTP bodies, sent and received together,
    /// one run may move: a server sending without end stops at this.
    pub outbound_budget_bytes: u64,
    /// Where compiled components are cached by digest; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// How often the epoch advances: the granularity of timeouts and
    /// interruptions, and how often a busy guest yields its thread.
    pub epoch_tick: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            max_concurrent_runs: 16,
            default_memory_limit_bytes: 128 << 20,
            max_memory_limit_bytes: 1 << 30,
            memory_reservation_bytes: None,
            default_timeout: Duration::from_secs(300),
            heartbeat_interval: Duration::from_secs(5),
            output_limit_bytes: 64 << 10,
            log_line_limit: 1000,
            max_payload_bytes: crate::types::DEFAULT_MAX_PAYLOAD_BYTES,
            max_output_bytes: crate::types::DEFAULT_MAX_OUTPUT_BYTES,
            run_budget_bytes: crate::types::DEFAULT_RUN_BUDGET_BYTES,
            outbound_budget_bytes: crate::types::DEFAULT_OUTBOUND_BUDGET_BYTES,
            cache_dir: dirs::cache_dir().map(|d| d.join("jobhost").join("components")),
            epoch_tick: Duration::from_millis(10),
        }
    }
}

/// A setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting {field}: {reason}")]
pub struct ConfigError {
    /// The setting's name.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl RuntimeConfig {
    /// Checks that the settings can work together.
    ///
    /// # Errors
    /// Names the first setting that cannot work and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |field, reason: &str| Err(ConfigError { field, reason: reason.to_string() });
        if self.max_concurrent_runs == 0 || self.max_concurrent_runs > 10_000 {
            return fail("max_concurrent_runs", "must be between 1 and 10000");
        }
        if self.max_memory_limit_bytes < 1 << 20 || self.max_memory_limit_bytes > 4 << 30 {
            return fail("max_memory_limit_bytes", "must be between 1 MiB and 4 GiB");
        }
        if self.memory_reservation_bytes.is_some_and(|bytes| bytes < self.max_memory_limit_bytes) {
            return fail(
                "memory_reservation_bytes",
                "must be at least max_memory_limit_bytes, the largest memory a slot must hold",
            );
        }
        if self.default_memory_limit_bytes > self.max_memory_limit_bytes {
            return fail("default_memory_limit_bytes", "must not exceed max_memory_limit_bytes");
        }
        if self.default_timeout.is_zero() {
            return fail("default_timeout", "must be positive");
        }
        if self.heartbeat_interval.is_zero() {
            return fail("heartbeat_interval", "must be positive");
        }
        if self.max_output_bytes == 0 {
            return fail("max_output_bytes", "must be positive");
        }
        if self.run_budget_bytes < self.max_output_bytes {
            return fail(
                "run_budget_bytes",
                "must be at least max_output_bytes, or no output that large could be kept",
            );
        }
        if self.epoch_tick.is_zero() || self.epoch_tick > Duration::from_secs(1) {
            return fail("epoch_tick", "must be between 1 ns and 1 s");
        }
        Ok(())
    }

    /// The shortest lease a limited job may declare: two heartbeat intervals
    /// (guarantee 6), rounded up to whole seconds.
    pub fn min_lease_secs(&self) -> u32 {
        let twice = self.heartbeat_interval.as_secs_f64() * 2.0;
        twice.ceil().max(1.0) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        RuntimeConfig::default().validate().unwrap();
    }

    #[test]
    fn rejects_default_memory_above_max() {
        let config = RuntimeConfig { default_memory_limit_bytes: 2 << 30, ..RuntimeConfig::default() };
        assert_eq!(config.validate().unwrap_err().field, "default_memory_limit_bytes");
    }

    #[test]
    fn rejects_a_budget_smaller_than_the_largest_output() {
        let config = RuntimeConfig { run_budget_bytes: 1 << 10, max_output_bytes: 1 << 20, ..RuntimeConfig::default() };
        assert_eq!(config.validate().unwrap_err().field, "run_budget_bytes");
    }

    #[test]
    fn lease_floor_is_twice_the_heartbeat() {
        let config = RuntimeConfig { heartbeat_interval: Duration::from_millis(2500), ..RuntimeConfig::default() };
        assert_eq!(config.min_lease_secs(), 5);
        let config = RuntimeConfig { heartbeat_interval: Duration::from_millis(100), ..RuntimeConfig::default() };
        assert_eq!(config.min_lease_secs(), 1);
    }
}
