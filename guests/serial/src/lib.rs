//! One run at a time per payload `key`, with a one-second lease: the
//! shape of a serial queue, and short enough to test heartbeats past it.
//! Sleeps the payload's `ms` and reports when it ran.

use jobhost_guest::{Concurrency, JobConfig, JobContext, JobError, OnConflict};

struct Serial;

impl jobhost_guest::Guest for Serial {
    fn describe() -> JobConfig {
        JobConfig {
            concurrency: Some(Concurrency {
                limit: 1,
                key: Some("{key}".to_string()),
                duration_secs: 1,
                on_conflict: OnConflict::Block,
            }),
            ..JobConfig::named("serial")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        jobhost_guest::sleep_for_payload(&payload)
    }
}

jobhost_guest::export!(Serial);
