//! Declares a concurrency limit of zero: a configuration the host must refuse.

use jobhost_guest::{Concurrency, JobConfig, JobContext, JobError, OnConflict};

struct Misconfigured;

impl jobhost_guest::Guest for Misconfigured {
    fn describe() -> JobConfig {
        JobConfig {
            concurrency: Some(Concurrency { limit: 0, key: None, duration_secs: 30, on_conflict: OnConflict::Block }),
            ..JobConfig::named("misconfigured")
        }
    }

    fn run(_ctx: JobContext, _payload: String) -> Result<Option<String>, JobError> {
        Ok(None)
    }
}

jobhost_guest::export!(Misconfigured);
