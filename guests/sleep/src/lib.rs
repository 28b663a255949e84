//! Sleeps the payload's `ms` on the WASI clock and reports when it ran, so
//! tests can check from outside which runs overlapped.

use jobhost_guest::{JobConfig, JobContext, JobError};

struct Sleep;

impl jobhost_guest::Guest for Sleep {
    fn describe() -> JobConfig {
        JobConfig::named("sleep")
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        jobhost_guest::sleep_for_payload(&payload)
    }
}

jobhost_guest::export!(Sleep);
