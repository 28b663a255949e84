//! Panics with the payload's `message`: pins how a trap is reported.

use jobhost_guest::{JobConfig, JobContext, JobError};

struct Trap;

impl jobhost_guest::Guest for Trap {
    fn describe() -> JobConfig {
        JobConfig { max_attempts: Some(1), ..JobConfig::named("trap") }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let message = payload.get("message").and_then(|m| m.as_str()).unwrap_or("boom");
        panic!("{message}");
    }
}

jobhost_guest::export!(Trap);
