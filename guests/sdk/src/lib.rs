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

pub use bindings::jobhost::job::host;
pub use bindings::jobhost::job::types::{Backoff, Concurrency, OnConflict, UniqueStrategy, Uniqueness};
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
        }
    }
}

/// Parses a payload as a JSON document, turning a parse failure into a
/// non-retryable error: the same payload would fail the same way again.
pub fn parse_payload(payload: &str) -> Result<serde_json::Value, JobError> {
    serde_json::from_str(payload).map_err(|e| JobError::Fail(format!("payload is not JSON: {e}")))
}

/// Milliseconds since the Unix epoch by the WASI wall clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Sleeps `ms` milliseconds and returns `{"started_ms", "ended_ms"}` by the
/// wall clock, so an observer outside the sandbox can tell which runs overlapped.
pub fn timed_sleep(ms: u64) -> serde_json::Value {
    let started_ms = now_ms();
    std::thread::sleep(std::time::Duration::from_millis(ms));
    let ended_ms = now_ms();
    serde_json::json!({ "started_ms": started_ms, "ended_ms": ended_ms })
}

/// The whole `run` of a job that sleeps its payload's `ms` (0 when absent)
/// and reports its start and end times: the sample limited handlers share it.
pub fn sleep_for_payload(payload: &str) -> Result<Option<String>, JobError> {
    let payload = parse_payload(payload)?;
    let ms = payload.get("ms").and_then(|m| m.as_u64()).unwrap_or(0);
    Ok(Some(timed_sleep(ms).to_string()))
}
