//! Two runs at a time per payload `key`; an enqueue that finds both slots
//! taken is refused with an error.
//! Sleeps the payload's `ms` and reports when it ran.

use jobhost_guest::{Concurrency, JobConfig, JobContext, JobError, OnConflict};

struct LimitedRaise;

impl jobhost_guest::Guest for LimitedRaise {
    fn describe() -> JobConfig {
        JobConfig {
            concurrency: Some(Concurrency {
                limit: 2,
                key: Some("{key}".to_string()),
                duration_secs: 10,
                on_conflict: OnConflict::Raise,
            }),
            ..JobConfig::named("limited_raise")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        jobhost_guest::sleep_for_payload(&payload)
    }
}

jobhost_guest::export!(LimitedRaise);
