//! A handler built against `jobhost:job@0.5.0` (`wit/archive/0.5.0`),
//! without the SDK: hosts keep loading and running components built before
//! 0.6.0. It declares an outbound rule, logs through the 0.5.0 host
//! imports, asks the 0.5.0 `workflows` imports which step it is, opens a
//! batch through the 0.5.0 `batches` imports, and returns its payload.

// The generated exports take a function's arguments one by one, as the
// SDK's bindings do (which allow the lint the same way).
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../wit/archive/0.5.0",
    world: "job",
});

use jobhost::job::batches::{self, BatchOptions, BatchRef};
use jobhost::job::host::{self, EnqueueOptions};
use jobhost::job::types::OutboundRule;
use jobhost::job::workflows;

struct LegacyV5;

impl Guest for LegacyV5 {
    fn describe() -> JobConfig {
        JobConfig {
            name: "legacy_v5".to_string(),
            queue: None,
            priority: None,
            max_attempts: Some(4),
            backoff: None,
            timeout_ms: None,
            memory_limit_bytes: None,
            concurrency: None,
            unique: None,
            schedule: None,
            outbound: Some(vec![OutboundRule {
                origin: "https://api.example.com".into(),
                methods: vec!["GET".into()],
                secrets: Vec::new(),
            }]),
        }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let step = match workflows::current_step() {
            Ok(Some(step)) => format!("{}/{}", step.workflow_id, step.name),
            Ok(None) => "none".to_string(),
            Err(reason) => format!("unknown: {reason}"),
        };
        host::log(host::Level::Info, &format!("0.5.0 run of job {}, step: {step}", ctx.job_id));
        let options = BatchOptions {
            label: Some("from 0.5.0".into()),
            on_finish: None,
            on_success: None,
            on_failure: None,
            callback_payload: None,
        };
        let batch = batches::open(&options).map_err(JobError::Fail)?;
        let child = EnqueueOptions { queue: None, priority: None, delay_ms: None };
        batches::enqueue(BatchRef::Opened(batch), "legacy_v5_child", "{}", &child).map_err(JobError::Fail)?;
        Ok(Some(payload))
    }
}

export!(LegacyV5);
