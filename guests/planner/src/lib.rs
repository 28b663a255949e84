//! Changes schedules made at run time through the `schedules` import (WIT
//! 0.8.0), as an onboarding job would for each customer it signs up. Its
//! payload's `changes` are made in order, each one of:
//! - `{"set": JOB, "key", "cron", "time_zone"?, "payload"?, "overlap"?,
//!   "jitter_ms"?, "backfill"?}` (`overlap`: `allow`, `skip`, `buffer-one`);
//! - `{"pause": JOB, "key", "note"?}`, `{"resume": JOB, "key"}`,
//!   `{"remove": JOB, "key"}`.
//!
//! With `fail_attempts`, attempts up to that number (of two) return a
//! retry after making the changes, so those are never written. Its output is
//! `{"results": ["ok" or the error the import returned, ...], "attempt"}`:
//! a refused change is reported, not a failed run.

use jobhost_guest::schedules::{self, Overlap, ScheduleSpec};
use jobhost_guest::{JobConfig, JobContext, JobError};
use serde_json::{Value, json};

struct Planner;

fn text<'a>(change: &'a Value, field: &str) -> &'a str {
    change.get(field).and_then(Value::as_str).unwrap_or("")
}

fn spec_of(change: &Value) -> ScheduleSpec {
    let mut spec = ScheduleSpec::cron(text(change, "cron"));
    spec.time_zone = change.get("time_zone").and_then(Value::as_str).map(str::to_string);
    spec.payload = change.get("payload").map(Value::to_string);
    spec.overlap = change.get("overlap").and_then(Value::as_str).map(|name| match name {
        "skip" => Overlap::Skip,
        "buffer-one" => Overlap::BufferOne,
        _ => Overlap::Allow,
    });
    spec.jitter_ms = change.get("jitter_ms").and_then(Value::as_u64);
    spec.backfill = change.get("backfill").and_then(Value::as_u64).map(|n| n as u32);
    spec
}

fn make(change: &Value) -> Result<(), String> {
    let key = text(change, "key");
    if let Some(job) = change.get("set").and_then(Value::as_str) {
        schedules::set(job, key, &spec_of(change))
    } else if let Some(job) = change.get("pause").and_then(Value::as_str) {
        schedules::pause(job, key, change.get("note").and_then(Value::as_str))
    } else if let Some(job) = change.get("resume").and_then(Value::as_str) {
        schedules::resume(job, key)
    } else if let Some(job) = change.get("remove").and_then(Value::as_str) {
        schedules::remove(job, key)
    } else {
        Err(format!("not a change: {change}"))
    }
}

impl jobhost_guest::Guest for Planner {
    fn describe() -> JobConfig {
        JobConfig { max_attempts: Some(2), ..JobConfig::named("planner") }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let results: Vec<String> = payload
            .get("changes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|change| make(change).map_or_else(|error| error, |()| "ok".to_string()))
            .collect();
        let fail_attempts = payload.get("fail_attempts").and_then(Value::as_u64).unwrap_or(0);
        if u64::from(ctx.attempt) <= fail_attempts {
            return Err(JobError::Retry(format!("attempt {} told to fail", ctx.attempt)));
        }
        Ok(Some(json!({"results": results, "attempt": ctx.attempt}).to_string()))
    }
}

jobhost_guest::export!(Planner);
