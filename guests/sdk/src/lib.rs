//! Bindings for writing a jobhost job handler in Rust.
//!
//! A handler implements [`Guest`] and registers itself with
//! `jobhost_guest::export!(MyJob);`. The WIT world lives in the repository's
//! `wit/` folder; this crate only generates its Rust bindings once so each
//! handler does not have to.

/// The generated bindings. They live in a module of their own because
/// wit-bindgen's exported world macro collides with its re-export at a crate
/// root.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "job",
        pub_export_macro: true,
        default_bindings_module: "jobhost_guest::bindings",
    });
}

/// Outbound HTTP through the host's allow-list (the `http` feature).
#[cfg(feature = "http")]
pub mod http;

pub use bindings::jobhost::job::types::{
    Backoff, Concurrency, OnConflict, OnDuplicate, OutboundRule, RateLimit, Schedule, UniqueStrategy, Uniqueness,
};
pub use bindings::jobhost::job::{batches, events, host, schedules, workflows};
pub use bindings::{Guest, JobConfig, JobContext, JobError, export};

impl JobConfig {
    /// A configuration that takes the host's default for everything but the name.
    pub fn named(name: &str) -> Self {
        JobConfig {
            name: name.to_string(),
            queue: None,
            priority: None,
            max_attempts: None,
            backoff: None,
            timeout_ms: None,
            memory_limit_bytes: None,
            concurrency: None,
            unique: None,
            schedule: None,
            outbound: None,
            rate_limit: None,
            on_events: None,
        }
    }
}

impl OutboundRule {
    /// A rule declaring `origin` (a pattern: `https://api.example.com`,
    /// `http://127.0.0.1:*`), the methods its requests may use (none: any)
    /// and the secrets they may carry, as Python's `allow()` does.
    pub fn allow(origin: &str, methods: &[&str], secrets: &[&str]) -> Self {
        let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        OutboundRule { origin: origin.into(), methods: strings(methods), secrets: strings(secrets) }
    }
}

impl schedules::ScheduleSpec {
    /// A schedule on the cron expression `cron` with every other field the
    /// host's default: UTC, an empty payload, overlap allowed, no jitter,
    /// one catch-up tick, no start or end.
    pub fn cron(cron: &str) -> Self {
        schedules::ScheduleSpec {
            cron: cron.to_string(),
            time_zone: None,
            payload: None,
            overlap: None,
            jitter_ms: None,
            backfill: None,
            starts_at_ms: None,
            ends_at_ms: None,
        }
    }
}

impl workflows::NewStep {
    /// A step named `name` running `job` with `payload` (a JSON value),
    /// waiting for nothing yet, with its type's queue and priority.
    pub fn new(name: &str, job: &str, payload: &serde_json::Value) -> Self {
        workflows::NewStep {
            name: name.to_string(),
            job: job.to_string(),
            payload: payload.to_string(),
            options: host::EnqueueOptions { queue: None, priority: None, delay_ms: None },
            after: Vec::new(),
            if_failed: None,
            wait: None,
        }
    }

    /// The same step, waiting for `steps` (added before it) under its own policy.
    pub fn after(mut self, steps: &[&str]) -> Self {
        self.after.extend(steps.iter().map(|s| workflows::Dependency { step: s.to_string(), if_failed: None }));
        self
    }
}

/// Parses a payload as a JSON document, turning a parse failure into a
/// non-retryable error: the same payload would fail the same way again.
pub fn parse_payload(payload: &str) -> Result<serde_json::Value, JobError> {
    serde_json::from_str(payload).map_err(|e| JobError::Fail(format!("payload is not JSON: {e}")))
}

/// Microseconds since the Unix epoch by the WASI wall clock.
pub fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Milliseconds since the Unix epoch by the WASI wall clock.
pub fn now_ms() -> u64 {
    now_us() / 1000
}

/// Sleeps `ms` milliseconds and returns when it started and ended by the
/// wall clock (`started_ms`, `ended_ms`, and the same in microseconds as
/// `started_us`, `ended_us`), so an observer outside the sandbox can tell
/// which runs overlapped.
pub fn timed_sleep(ms: u64) -> serde_json::Value {
    let started_us = now_us();
    std::thread::sleep(std::time::Duration::from_millis(ms));
    let ended_us = now_us();
    serde_json::json!({
        "started_ms": started_us / 1000,
        "ended_ms": ended_us / 1000,
        "started_us": started_us,
        "ended_us": ended_us,
    })
}

/// The whole `run` of a job that sleeps its payload's `ms` (0 when absent)
/// and reports its start and end times: the sample limited handlers share it.
pub fn sleep_for_payload(payload: &str) -> Result<Option<String>, JobError> {
    let payload = parse_payload(payload)?;
    let ms = payload.get("ms").and_then(|m| m.as_u64()).unwrap_or(0);
    Ok(Some(timed_sleep(ms).to_string()))
}

/// Declares a handler named `$name` that sleeps its payload's `ms` and
/// reports when it ran, limited to `limit` runs at once per payload `key`:
/// the sample limited handlers differ only in their limits.
#[macro_export]
macro_rules! keyed_sleeper {
    ($handler:ident, $name:literal, limit: $limit:expr, duration_secs: $duration:expr, on_conflict: $on_conflict:ident) => {
        struct $handler;

        impl $crate::Guest for $handler {
            fn describe() -> $crate::JobConfig {
                $crate::JobConfig {
                    concurrency: Some($crate::Concurrency {
                        limit: $limit,
                        key: Some("{key}".to_string()),
                        duration_secs: $duration,
                        on_conflict: $crate::OnConflict::$on_conflict,
                    }),
                    ..$crate::JobConfig::named($name)
                }
            }

            fn run(_ctx: $crate::JobContext, payload: String) -> Result<Option<String>, $crate::JobError> {
                $crate::sleep_for_payload(&payload)
            }
        }

        $crate::export!($handler);
    };
}
