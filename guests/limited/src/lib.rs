//! Like `sleep`, limited to two concurrent runs per payload `key`.

use jobhost_guest::{Concurrency, JobConfig, JobContext, JobError, OnConflict};

struct Limited;

impl jobhost_guest::Guest for Limited {
    fn describe() -> JobConfig {
        JobConfig {
            concurrency: Some(Concurrency {
                limit: 2,
                key: Some("{key}".to_string()),
                duration_secs: 10,
                on_conflict: OnConflict::Block,
            }),
            ..JobConfig::named("limited")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let ms = payload.get("ms").and_then(|m| m.as_u64()).unwrap_or(0);
        Ok(Some(jobhost_guest::timed_sleep(ms).to_string()))
    }
}

jobhost_guest::export!(Limited);
