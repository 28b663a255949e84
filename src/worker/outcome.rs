//! Turns a sandbox's report into what the store records.

use crate::store::{FetchedJob, Finish, FinishOutcome};
use crate::types::{Crash, JobConfig, JsonText, RunOutcome, RunReport, head, tail};

use super::backoff::retry_delay_ms;

/// Bytes of stdout and stderr each kept in the log of one attempt.
const LOG_TAIL_BYTES: usize = 8 << 10;

/// Bytes of an attempt's error reason kept with the job: a guest may return
/// a reason of any size, and every failed attempt's is stored.
pub const ERROR_REASON_BYTES: usize = 8 << 10;

/// The shortest snooze: a job that snoozes for 0 seconds would be leased
/// again at once, forever, and spin its host.
pub const MIN_SNOOZE_SECS: u32 = 1;

/// The store's record of how a run ended. A failure on the last attempt
/// fails the job; a run the host stopped (shutdown, lost lease) gives its
/// attempt back.
/// `host` is this host's id, kept in the attempt's log for its timeline.
pub fn finish_of(job: &FetchedJob, config: &JobConfig, report: RunReport, host: &str) -> Finish {
    let attempts_left = job.attempt < job.max_attempts;
    let retry_or_fail = |error: String| {
        let error = head(error, ERROR_REASON_BYTES);
        if attempts_left {
            let delay_ms = retry_delay_ms(&config.backoff, job.attempt.max(1) as u32);
            FinishOutcome::Retry { error, delay_ms }
        } else {
            FinishOutcome::Failed { error }
        }
    };
    let RunReport { outcome, mut effects, elapsed_us, .. } = report;
    let outcome = match outcome {
        RunOutcome::Completed { output } => {
            let children = std::mem::take(&mut effects.children).into();
            let batches = std::mem::take(&mut effects.batches).into();
            let workflows = std::sync::Arc::new(std::mem::take(&mut effects.workflows));
            let events = std::mem::take(&mut effects.events).into();
            let schedules = std::mem::take(&mut effects.schedules).into();
            FinishOutcome::Completed { output, children, batches, workflows, events, schedules }
        }
        RunOutcome::Retry { reason } => retry_or_fail(reason),
        RunOutcome::Failed { reason } => FinishOutcome::Failed { error: head(reason, ERROR_REASON_BYTES) },
        RunOutcome::Snooze { seconds } => {
            FinishOutcome::Snooze { delay_ms: u64::from(seconds.max(MIN_SNOOZE_SECS)) * 1000 }
        }
        // The key's throttle was written first (`Worker::start`); the job
        // itself waits as a snooze does, spending no attempt.
        RunOutcome::Throttled { retry_after_ms } => {
            FinishOutcome::Snooze { delay_ms: retry_after_ms.clamp(1, crate::store::rate::MAX_THROTTLE_MS) }
        }
        RunOutcome::Crashed { crash: Crash::Interrupted { reason } } => FinishOutcome::Release { reason },
        RunOutcome::Crashed { crash } if crash.is_deterministic() => FinishOutcome::Failed { error: crash.to_string() },
        RunOutcome::Crashed { crash } => retry_or_fail(crash.to_string()),
    };
    let mut log = serde_json::json!({
        "lines": effects.logs,
        "stdout": tail(&effects.stdout, LOG_TAIL_BYTES),
        "stderr": tail(&effects.stderr, LOG_TAIL_BYTES),
        "truncated": effects.truncated,
        "elapsed_us": elapsed_us,
        "host": host,
    });
    // The attempt's outbound requests, as records: the job's page shows them
    // as a table (their lines are in `lines` too, in order with the rest).
    if !effects.outbound.is_empty() {
        log["outbound"] = serde_json::to_value(&effects.outbound).unwrap_or_default();
    }
    let progress = effects.progress.map(|(done, total)| serde_json::json!({ "done": done, "total": total }));
    let outcome = without_nul_outcome(outcome);
    Finish {
        id: job.id,
        lease_token: job.lease_token,
        attempt: job.attempt,
        outcome,
        log: without_nul(log),
        progress,
        concurrency_key: job.concurrency_key.clone(),
        batch_id: job.batch_id,
        traceparent: None,
    }
}

/// PostgreSQL's `jsonb` cannot hold U+0000; a guest that prints one must not
/// make its result unstorable, so it becomes U+FFFD. Rewritten in place:
/// every run's log passes here, and almost none holds one.
fn without_nul(mut value: serde_json::Value) -> serde_json::Value {
    strip_nul(&mut value);
    value
}

fn strip_nul(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(text) if text.contains('\0') => *text = text.replace('\0', "\u{FFFD}"),
        Value::Array(items) => items.iter_mut().for_each(strip_nul),
        Value::Object(map) if map.keys().any(|k| k.contains('\0')) => {
            let entries = std::mem::take(map);
            *map = entries.into_iter().map(|(k, v)| (without_nul_text(k), without_nul(v))).collect();
        }
        Value::Object(map) => map.values_mut().for_each(strip_nul),
        _ => {}
    }
}

/// An output without U+0000: JSON text holds one only as the escape
/// `\u0000`, so only an output containing that is parsed and rewritten.
fn output_without_nul(output: JsonText) -> JsonText {
    if !output.get().contains("\\u0000") {
        return output;
    }
    match output.to_value() {
        Ok(value) => JsonText::from(&without_nul(value)),
        Err(_) => output,
    }
}

fn without_nul_text(text: String) -> String {
    if text.contains('\0') { text.replace('\0', "\u{FFFD}") } else { text }
}

fn without_nul_outcome(outcome: FinishOutcome) -> FinishOutcome {
    match outcome {
        FinishOutcome::Completed { output, children, batches, workflows, events, schedules } => {
            let output = output.map(output_without_nul);
            FinishOutcome::Completed { output, children, batches, workflows, events, schedules }
        }
        FinishOutcome::Retry { error, delay_ms } => FinishOutcome::Retry { error: without_nul_text(error), delay_ms },
        FinishOutcome::Failed { error } => FinishOutcome::Failed { error: without_nul_text(error) },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Backoff, RunEffects};
    use chrono::Utc;

    fn job(attempt: i32, max_attempts: i32) -> FetchedJob {
        FetchedJob {
            id: 1,
            lease_token: 9,
            job: "x".into(),
            queue: "default".into(),
            payload: serde_json::json!({}),
            attempt,
            max_attempts,
            enqueued_at: Utc::now(),
            batch_id: None,
            concurrency_key: None,
            lease_secs: 30,
        }
    }

    fn config() -> JobConfig {
        JobConfig {
            name: "x".into(),
            queue: "default".into(),
            priority: 0,
            max_attempts: 3,
            backoff: Backoff { base_ms: 1000, cap_ms: 1000 },
            timeout_ms: 1000,
            memory_limit_bytes: 1 << 20,
            concurrency: None,
            unique: None,
            schedule: None,
            outbound: Vec::new(),
            rate_limit: None,
            on_events: Vec::new(),
        }
    }

    fn report(outcome: RunOutcome) -> RunReport {
        RunReport { outcome, effects: RunEffects::default(), elapsed_us: 1, instantiate_us: None }
    }

    #[test]
    fn a_crash_is_retried_while_attempts_remain_then_fails() {
        let crash = RunOutcome::Crashed { crash: Crash::Timeout { limit_ms: 5 } };
        let early = finish_of(&job(1, 3), &config(), report(crash.clone()), "host");
        assert!(matches!(early.outcome, FinishOutcome::Retry { delay_ms: 500..=1000, .. }), "{early:?}");
        let last = finish_of(&job(3, 3), &config(), report(crash), "host");
        assert_eq!(last.outcome, FinishOutcome::Failed { error: "timed out after 5 ms".into() });
    }

    #[test]
    fn an_interrupted_run_is_handed_back() {
        let stopped = RunOutcome::Crashed { crash: Crash::Interrupted { reason: "shutdown".into() } };
        let finish = finish_of(&job(3, 3), &config(), report(stopped), "host");
        assert_eq!(finish.outcome, FinishOutcome::Release { reason: "shutdown".into() });
    }

    #[test]
    fn nul_characters_never_reach_the_database() {
        let output = JsonText::from(&serde_json::json!({"a\0": ["x\0y"]}));
        let mut report = report(RunOutcome::Completed { output: Some(output) });
        report.effects.stdout = "before\0after".into();
        let finish = finish_of(&job(1, 3), &config(), report, "host");
        let text = format!("{:?} {}", finish.outcome, finish.log);
        assert!(!text.contains('\0') && !text.contains("\\u0000"), "{text}");
        assert!(finish.log["stdout"].as_str().unwrap().contains("before\u{FFFD}after"));
    }

    #[test]
    fn a_huge_error_reason_is_stored_bounded() {
        let reason = "x".repeat(10 * ERROR_REASON_BYTES);
        let retried = finish_of(&job(1, 3), &config(), report(RunOutcome::Retry { reason: reason.clone() }), "host");
        let failed = finish_of(&job(1, 3), &config(), report(RunOutcome::Failed { reason }), "host");
        for outcome in [retried.outcome, failed.outcome] {
            let (FinishOutcome::Retry { error, .. } | FinishOutcome::Failed { error }) = outcome else { panic!() };
            assert!(error.len() < ERROR_REASON_BYTES + 64, "{} bytes kept", error.len());
            assert!(error.ends_with(&format!("[{} more bytes cut]", 9 * ERROR_REASON_BYTES)));
        }
    }

    #[test]
    fn snooze_waits_in_milliseconds() {
        let finish = finish_of(&job(1, 3), &config(), report(RunOutcome::Snooze { seconds: 2 }), "host");
        assert_eq!(finish.outcome, FinishOutcome::Snooze { delay_ms: 2000 });
    }

    #[test]
    fn a_snooze_of_nothing_waits_the_minimum() {
        let finish = finish_of(&job(1, 3), &config(), report(RunOutcome::Snooze { seconds: 0 }), "host");
        assert_eq!(finish.outcome, FinishOutcome::Snooze { delay_ms: u64::from(MIN_SNOOZE_SECS) * 1000 });
    }

    #[test]
    fn an_output_too_large_fails_at_once_with_attempts_left() {
        let crash = Crash::OutputTooLarge { bytes: 2048, limit_bytes: 1024 };
        let finish = finish_of(&job(1, 3), &config(), report(RunOutcome::Crashed { crash }), "host");
        let error = "output is 2048 bytes, more than the limit of 1024 bytes".to_string();
        assert_eq!(finish.outcome, FinishOutcome::Failed { error });
    }
}
