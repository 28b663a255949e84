//! A digest mail per account: unique `until-executed` on the payload's
//! `account`, so while one account's digest waits or runs, another enqueue
//! for that account is a duplicate (answered with the waiting job's id).
//! Sleeps the payload's `ms` and reports when it ran.

use jobhost_guest::{JobConfig, JobContext, JobError, OnDuplicate, UniqueStrategy, Uniqueness};

struct Digest;

impl jobhost_guest::Guest for Digest {
    fn describe() -> JobConfig {
        JobConfig {
            unique: Some(Uniqueness {
                key: "account:{account}".to_string(),
                strategy: UniqueStrategy::UntilExecuted,
                on_duplicate: Some(OnDuplicate::Skip),
            }),
            ..JobConfig::named("digest")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        jobhost_guest::sleep_for_payload(&payload)
    }
}

jobhost_guest::export!(Digest);
