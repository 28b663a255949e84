//! Fails its first `fail_times` attempts with a retryable error, then succeeds.

use jobhost_guest::{Backoff, JobConfig, JobContext, JobError};

struct Flaky;

impl jobhost_guest::Guest for Flaky {
    fn describe() -> JobConfig {
        JobConfig {
            max_attempts: Some(5),
            backoff: Some(Backoff { base_ms: 10, cap_ms: 100 }),
            ..JobConfig::named("flaky")
        }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let fail_times = payload.get("fail_times").and_then(|n| n.as_u64()).unwrap_or(1);
        if u64::from(ctx.attempt) <= fail_times {
            return Err(JobError::Retry(format!("attempt {} failed on purpose", ctx.attempt)));
        }
        Ok(Some(serde_json::json!({ "succeeded_on_attempt": ctx.attempt }).to_string()))
    }
}

jobhost_guest::export!(Flaky);
