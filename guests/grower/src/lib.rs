//! Works with workflows through the `workflows` imports of WIT 0.5.0.
//! Payload:
//! - `grow`: `{"count", "job", "join"}` adds `count` steps `part-0`,
//!   `part-1`, ... of `job` (default `hello`, payload `{"i": n}`) to the
//!   workflow this job is a step of, and, with `join`, a step `join` of
//!   `hello` after all of them;
//! - `open`: `{"label"}` opens a workflow of a diamond (`a`, then `b` and
//!   `c`, then `d`, all `hello`);
//! - `probe`: tries calls that must be refused and returns their errors;
//! - `fail_attempts`: returns a retry on attempts up to this number, after
//!   adding all of the above, which are then not written.
//!
//! Its output is `{"step", "grew", "opened", "errors"}`.

use jobhost_guest::workflows::{self, EventWait, NewStep, StepWait, WorkflowRef};
use jobhost_guest::{JobConfig, JobContext, JobError};
use serde_json::{Value, json};

struct Grower;

fn grow(spec: &Value) -> Result<u64, JobError> {
    let count = spec.get("count").and_then(Value::as_u64).unwrap_or(1);
    let job = spec.get("job").and_then(Value::as_str).unwrap_or("hello");
    let mut parts = Vec::new();
    for i in 0..count {
        let name = format!("part-{i}");
        workflows::add_step(WorkflowRef::Current, &NewStep::new(&name, job, &json!({ "i": i })))
            .map_err(JobError::Fail)?;
        parts.push(name);
    }
    if spec.get("join").and_then(Value::as_bool) == Some(true) {
        let names: Vec<&str> = parts.iter().map(String::as_str).collect();
        let join_payload = spec.get("join_payload").cloned().unwrap_or_else(|| json!({}));
        let mut join = NewStep::new("join", "hello", &join_payload).after(&names);
        join.wait = spec.get("join_wait").map(wait_of);
        workflows::add_step(WorkflowRef::Current, &join).map_err(JobError::Fail)?;
    }
    Ok(count)
}

/// A step's wait from its JSON spec: `{"sleep_ms"}` or `{"event", "match", "timeout_ms"}`.
fn wait_of(spec: &Value) -> StepWait {
    if let Some(ms) = spec.get("sleep_ms").and_then(Value::as_u64) {
        return StepWait::SleepMs(ms);
    }
    let fields = spec.get("match").and_then(Value::as_object);
    StepWait::Event(EventWait {
        key: spec.get("event").and_then(Value::as_str).unwrap_or_default().to_string(),
        match_fields: fields
            .into_iter()
            .flatten()
            .map(|(field, template)| (field.clone(), template.as_str().unwrap_or_default().to_string()))
            .collect(),
        timeout_ms: spec.get("timeout_ms").and_then(Value::as_u64),
        on_timeout: None,
        lookback_ms: None,
    })
}

fn open(spec: &Value) -> Result<u32, JobError> {
    let label = spec.get("label").and_then(Value::as_str).map(str::to_string);
    let opened = workflows::open(label.as_deref()).map_err(JobError::Fail)?;
    let at = WorkflowRef::Opened(opened);
    let steps = [
        NewStep::new("a", "hello", &json!({"step": "a"})),
        NewStep::new("b", "hello", &json!({"step": "b"})).after(&["a"]),
        NewStep::new("c", "hello", &json!({"step": "c"})).after(&["a"]),
        NewStep::new("d", "hello", &json!({"step": "d"})).after(&["b", "c"]),
    ];
    for step in &steps {
        workflows::add_step(at, step).map_err(JobError::Fail)?;
    }
    Ok(opened)
}

/// Calls that must be refused, with the errors they returned.
fn probe() -> Vec<String> {
    let empty = json!({});
    let mut errors = Vec::new();
    let mut attempt = |workflow: WorkflowRef, step: NewStep| {
        if let Err(error) = workflows::add_step(workflow, &step) {
            errors.push(error);
        }
    };
    attempt(WorkflowRef::Opened(7), NewStep::new("x", "hello", &empty));
    attempt(WorkflowRef::Current, NewStep::new("bad/name", "hello", &empty));
    attempt(WorkflowRef::Current, NewStep::new("y", "hello", &empty).after(&["never-added"]));
    attempt(WorkflowRef::Current, NewStep::new("z", "no_such_type", &empty));
    attempt(WorkflowRef::Current, NewStep::new("w", "hello", &json!({"_deps": {}})));
    let mut not_json = NewStep::new("v", "hello", &empty);
    not_json.payload = "{not json".to_string();
    attempt(WorkflowRef::Current, not_json);
    errors
}

impl jobhost_guest::Guest for Grower {
    fn describe() -> JobConfig {
        JobConfig { max_attempts: Some(3), ..JobConfig::named("grower") }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let step = workflows::current_step()
            .map_err(JobError::Retry)?
            .map(|s| json!({ "workflow_id": s.workflow_id, "name": s.name }));
        let errors = if payload.get("probe").is_some() { probe() } else { Vec::new() };
        let grew = match payload.get("grow") {
            Some(spec) => grow(spec)?,
            None => 0,
        };
        let opened = match payload.get("open") {
            Some(spec) => Some(open(spec)?),
            None => None,
        };
        let fail_attempts = payload.get("fail_attempts").and_then(Value::as_u64).unwrap_or(0);
        if u64::from(ctx.attempt) <= fail_attempts {
            return Err(JobError::Retry(format!("attempt {} fails on purpose", ctx.attempt)));
        }
        Ok(Some(json!({ "step": step, "grew": grew, "opened": opened, "errors": errors }).to_string()))
    }
}

jobhost_guest::export!(Grower);
