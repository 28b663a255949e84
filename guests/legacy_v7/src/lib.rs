//! A handler built against `jobhost:job@0.7.0` (`wit/archive/0.7.0`),
//! without the SDK: hosts keep loading and running components built before
//! 0.8.0. It subscribes to the event `legacy.ping`, sends `legacy.pong`
//! through the 0.7.0 `events` import, adds a step that sleeps through the
//! 0.7.0 `workflows` import to a workflow it opens, and returns its payload.

// The generated exports take a function's arguments one by one, as the
// SDK's bindings do (which allow the lint the same way).
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../wit/archive/0.7.0",
    world: "job",
});

use jobhost::job::host::{self, EnqueueOptions};
use jobhost::job::{events, workflows};

struct LegacyV7;

impl Guest for LegacyV7 {
    fn describe() -> JobConfig {
        JobConfig {
            name: "legacy_v7".to_string(),
            queue: None,
            priority: None,
            max_attempts: Some(7),
            backoff: None,
            timeout_ms: None,
            memory_limit_bytes: None,
            concurrency: None,
            unique: None,
            schedule: None,
            outbound: None,
            rate_limit: None,
            on_events: Some(vec!["legacy.ping".to_string()]),
        }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        host::log(host::Level::Info, &format!("0.7.0 run of job {}", ctx.job_id));
        events::send("legacy.pong", &payload).map_err(JobError::Fail)?;
        let workflow = workflows::open(Some("legacy")).map_err(JobError::Fail)?;
        let step = workflows::NewStep {
            name: "later".to_string(),
            job: "legacy_v7".to_string(),
            payload: "{}".to_string(),
            options: EnqueueOptions { queue: None, priority: None, delay_ms: None },
            after: Vec::new(),
            if_failed: None,
            wait: Some(workflows::StepWait::SleepMs(1500)),
        };
        workflows::add_step(workflows::WorkflowRef::Opened(workflow), &step).map_err(JobError::Fail)?;
        Ok(Some(payload))
    }
}

export!(LegacyV7);
