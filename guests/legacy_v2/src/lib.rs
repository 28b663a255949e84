//! A handler built against `jobhost:job@0.2.0` (`wit/archive/0.2.0`),
//! without the SDK: hosts keep loading and running components built before
//! 0.3.0. It logs and reports progress through the 0.2.0 host imports, and
//! returns its payload.

// The generated exports take a function's arguments one by one, as the
// SDK's bindings do (which allow the lint the same way).
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../wit/archive/0.2.0",
    world: "job",
});

use jobhost::job::host;
use jobhost::job::types::{OnDuplicate, UniqueStrategy, Uniqueness};

struct LegacyV2;

impl Guest for LegacyV2 {
    fn describe() -> JobConfig {
        JobConfig {
            name: "legacy_v2".to_string(),
            queue: None,
            priority: None,
            max_attempts: Some(2),
            backoff: None,
            timeout_ms: None,
            memory_limit_bytes: None,
            concurrency: None,
            unique: Some(Uniqueness {
                key: "{id}".to_string(),
                strategy: UniqueStrategy::UntilExecuted,
                on_duplicate: Some(OnDuplicate::Replace),
            }),
            schedule: None,
        }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        host::log(host::Level::Info, &format!("0.2.0 run of job {}", ctx.job_id));
        host::progress(1, 1);
        Ok(Some(payload))
    }
}

export!(LegacyV2);
