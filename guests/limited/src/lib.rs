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
        jobhost_guest::sleep_for_payload(&payload)
    }
}

jobhost_guest::export!(Limited);
