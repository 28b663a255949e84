//! Sleeps the payload's `ms` on the WASI clock and reports when it ran, so
//! tests can check from outside which runs overlapped.

use jobhost_guest::{JobConfig, JobContext, JobError};

struct Sleep;

impl jobhost_guest::Guest for Sleep {
    fn describe() -> JobConfig {
        JobConfig::named("sleep")
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let ms = payload.get("ms").and_then(|m| m.as_u64()).unwrap_or(0);
        Ok(Some(jobhost_guest::timed_sleep(ms).to_string()))
    }
}

jobhost_guest::export!(Sleep);
