//! Works with batches through the `batches` imports of WIT 0.3.0. Payload:
//! - `open`: `{"count", "job", "child", "on_finish", "on_success",
//!   "on_failure", "label"}` opens a batch of `count` jobs of `job` (default
//!   `hello`), each with payload `child` (default `{}`) plus its number `i`;
//! - `extend`: `{"count", "job", "child"}` adds jobs to the batch this job
//!   is a member of;
//! - `steps` and `step_ms`: reports progress `i/steps` after each step of
//!   `step_ms` milliseconds, so a test sees it while the job runs;
//! - `fail`: fails after all of that, leaving no batch and no member.

use jobhost_guest::batches::{self, BatchOptions, BatchRef};
use jobhost_guest::{JobConfig, JobContext, JobError, host};
use serde_json::Value;

struct Batcher;

fn text(value: &Value, field: &str) -> Option<String> {
    value.get(field).and_then(Value::as_str).map(str::to_string)
}

/// Enqueues `spec`'s `count` jobs into `batch`.
fn fill(batch: BatchRef, spec: &Value) -> Result<u64, JobError> {
    let count = spec.get("count").and_then(Value::as_u64).unwrap_or(1);
    let job = text(spec, "job").unwrap_or_else(|| "hello".to_string());
    let options = host::EnqueueOptions { queue: None, priority: None, delay_ms: None };
    for i in 0..count {
        let mut child = spec.get("child").cloned().unwrap_or_else(|| serde_json::json!({}));
        child["i"] = i.into();
        batches::enqueue(batch, &job, &child.to_string(), &options).map_err(JobError::Fail)?;
    }
    Ok(count)
}

impl jobhost_guest::Guest for Batcher {
    fn describe() -> JobConfig {
        JobConfig { max_attempts: Some(1), ..JobConfig::named("batcher") }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let mut opened = None;
        if let Some(spec) = payload.get("open") {
            let options = BatchOptions {
                label: text(spec, "label"),
                on_finish: text(spec, "on_finish"),
                on_success: text(spec, "on_success"),
                on_failure: text(spec, "on_failure"),
                callback_payload: spec.get("callback_payload").map(Value::to_string),
            };
            let batch = batches::open(&options).map_err(JobError::Fail)?;
            fill(BatchRef::Opened(batch), spec)?;
            opened = Some(batch);
        }
        let extended = match payload.get("extend") {
            Some(spec) => fill(BatchRef::Current, spec)?,
            None => 0,
        };
        let steps = payload.get("steps").and_then(Value::as_u64).unwrap_or(0);
        let step_ms = payload.get("step_ms").and_then(Value::as_u64).unwrap_or(0);
        for i in 1..=steps {
            std::thread::sleep(std::time::Duration::from_millis(step_ms));
            host::progress(i, steps);
        }
        if payload.get("fail").and_then(Value::as_bool) == Some(true) {
            return Err(JobError::Fail("failing after opening a batch, on purpose".to_string()));
        }
        let output = serde_json::json!({ "opened": opened, "extended": extended, "batch_id": ctx.batch_id });
        Ok(Some(output.to_string()))
    }
}

jobhost_guest::export!(Batcher);
