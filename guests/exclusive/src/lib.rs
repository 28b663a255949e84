//! Like `sleep`, but unique `while-executing` on the payload's `key`: any
//! number may wait, one runs at a time. Sleeps the payload's `ms` and
//! reports when it ran.

use jobhost_guest::{JobConfig, JobContext, JobError, UniqueStrategy, Uniqueness};

struct Exclusive;

impl jobhost_guest::Guest for Exclusive {
    fn describe() -> JobConfig {
        JobConfig {
            unique: Some(Uniqueness {
                key: "{key}".to_string(),
                strategy: UniqueStrategy::WhileExecuting,
                on_duplicate: None,
            }),
            ..JobConfig::named("exclusive")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        jobhost_guest::sleep_for_payload(&payload)
    }
}

jobhost_guest::export!(Exclusive);
