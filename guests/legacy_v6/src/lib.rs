//! A handler built against `jobhost:job@0.6.0` (`wit/archive/0.6.0`),
//! without the SDK: hosts keep loading and running components built before
//! 0.7.0. It declares a rate limit, logs through the 0.6.0 host imports,
//! asks the 0.6.0 `workflows` imports which step it is, and returns its
//! payload, or `throttled` when the payload holds `throttle_ms`.

// The generated exports take a function's arguments one by one, as the
// SDK's bindings do (which allow the lint the same way).
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../wit/archive/0.6.0",
    world: "job",
});

use jobhost::job::host;
use jobhost::job::types::RateLimit;
use jobhost::job::workflows;

struct LegacyV6;

impl Guest for LegacyV6 {
    fn describe() -> JobConfig {
        JobConfig {
            name: "legacy_v6".to_string(),
            queue: None,
            priority: None,
            max_attempts: Some(6),
            backoff: None,
            timeout_ms: None,
            memory_limit_bytes: None,
            concurrency: None,
            unique: None,
            schedule: None,
            outbound: None,
            rate_limit: Some(RateLimit { limit: 7, period_ms: 1000, key: None }),
        }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let step = match workflows::current_step() {
            Ok(Some(step)) => format!("{}/{}", step.workflow_id, step.name),
            Ok(None) => "none".to_string(),
            Err(reason) => format!("unknown: {reason}"),
        };
        host::log(host::Level::Info, &format!("0.6.0 run of job {}, step: {step}", ctx.job_id));
        if let Some(ms) = payload.split("\"throttle_ms\":").nth(1).and_then(|rest| {
            rest.trim_start().split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse::<u64>().ok())
        }) {
            return Err(JobError::Throttled(ms));
        }
        Ok(Some(payload))
    }
}

export!(LegacyV6);
