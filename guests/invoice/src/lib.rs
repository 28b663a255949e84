//! One invoice per order: unique `until-executed` on the payload's `order`
//! with `on-duplicate: raise`, so a second enqueue for an order whose invoice
//! waits or runs is refused with an error naming the holder (the sample for
//! `raise`; `digest` answers a duplicate with the holder's id instead).
//! Sleeps the payload's `ms` and reports when it ran.

use jobhost_guest::{JobConfig, JobContext, JobError, OnDuplicate, UniqueStrategy, Uniqueness};

struct Invoice;

impl jobhost_guest::Guest for Invoice {
    fn describe() -> JobConfig {
        JobConfig {
            unique: Some(Uniqueness {
                key: "order:{order}".to_string(),
                strategy: UniqueStrategy::UntilExecuted,
                on_duplicate: Some(OnDuplicate::Raise),
            }),
            ..JobConfig::named("invoice")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        jobhost_guest::sleep_for_payload(&payload)
    }
}

jobhost_guest::export!(Invoice);
