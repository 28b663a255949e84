//! Two runs at a time per payload `key`; a job that finds both slots taken
//! is discarded.
//! Sleeps the payload's `ms` and reports when it ran.

use jobhost_guest::{Concurrency, JobConfig, JobContext, JobError, OnConflict};

struct LimitedDiscard;

impl jobhost_guest::Guest for LimitedDiscard {
    fn describe() -> JobConfig {
        JobConfig {
            concurrency: Some(Concurrency {
                limit: 2,
                key: Some("{key}".to_string()),
                duration_secs: 10,
                on_conflict: OnConflict::Discard,
            }),
            ..JobConfig::named("limited_discard")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        jobhost_guest::sleep_for_payload(&payload)
    }
}

jobhost_guest::export!(LimitedDiscard);
