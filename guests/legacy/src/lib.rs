//! A handler built against the first world version, `jobhost:job@0.1.0`
//! (`wit/archive/0.1.0`), without the SDK: hosts keep loading and running
//! components built before 0.2.0. It logs through the old host imports and
//! returns the payload it was given.

// The generated exports take a function's arguments one by one, as the
// SDK's bindings do (which allow the lint the same way).
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../wit/archive/0.1.0",
    world: "job",
});

use jobhost::job::host;
use jobhost::job::types::{UniqueStrategy, Uniqueness};

struct Legacy;

impl Guest for Legacy {
    fn describe() -> JobConfig {
        JobConfig {
            name: "legacy".to_string(),
            queue: None,
            priority: None,
            max_attempts: Some(3),
            backoff: None,
            timeout_ms: None,
            memory_limit_bytes: None,
            concurrency: None,
            unique: Some(Uniqueness { key: "{id}".to_string(), strategy: UniqueStrategy::UntilExecuted }),
            schedule: None,
        }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        host::log(host::Level::Info, &format!("legacy run of job {}", ctx.job_id));
        Ok(Some(payload))
    }
}

export!(Legacy);
