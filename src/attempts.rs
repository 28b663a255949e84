//! Every attempt of a job, as a timeline: which host ran it, when it
//! started, how long it ran, how it ended, its error, its log and its
//! outbound requests, and how long the job waited before the next. Read
//! from what the job already keeps: an entry per attempt that did not
//! complete (its error, with the attempt's log, in which the host records
//! itself and the run's time) and the last attempt's row and log.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use crate::store::{JobDetail, JobState};

/// One attempt of a job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    /// Its number, from 1 (0 for an error the job got before any attempt:
    /// refused at the gate, its workflow's dependency failed).
    pub attempt: i64,
    /// The host that ran it, when recorded.
    pub host: Option<String>,
    /// When it started: the end less the run's time, or the row's start
    /// for the last attempt.
    #[serde(serialize_with = "crate::store::timestamp::serialize_option")]
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended (none while it runs).
    #[serde(serialize_with = "crate::store::timestamp::serialize_option")]
    pub ended_at: Option<DateTime<Utc>>,
    /// How long the guest ran, in milliseconds.
    pub ran_ms: Option<f64>,
    /// How it ended: `completed`, `retried`, `failed`, `cancelled`,
    /// `discarded`, or `running`.
    pub ending: String,
    /// Its error.
    pub error: Option<String>,
    /// Its outbound HTTP requests.
    pub outbound: usize,
    /// Its log (lines, stdout, stderr, outbound requests), bounded per
    /// attempt by the host.
    pub log: Option<serde_json::Value>,
    /// How long the job waited after the previous attempt ended before
    /// this one started (a backoff, a wait at the gate, a snooze).
    pub waited_ms: Option<f64>,
}

/// The attempts of `job`, oldest first.
pub fn of(job: &JobDetail) -> Vec<Attempt> {
    let entries = job.errors.as_array().cloned().unwrap_or_default();
    let last_attempt = i64::from(job.row.attempts);
    let mut attempts: Vec<Attempt> = entries
        .iter()
        .map(|entry| {
            let attempt = entry.get("attempt").and_then(|a| a.as_i64()).unwrap_or(0);
            let log = entry.get("log").filter(|log| log.is_object()).cloned();
            let ended_at = entry.get("at").and_then(|a| a.as_str()).and_then(parse_time);
            let ran_ms = log.as_ref().and_then(elapsed_ms);
            let final_failure = attempt == last_attempt && job.row.state.is_final();
            Attempt {
                attempt,
                host: log.as_ref().and_then(host_of),
                started_at: ended_at.zip(ran_ms).map(|(end, ms)| end - Duration::microseconds((ms * 1000.0) as i64)),
                ended_at,
                ran_ms,
                ending: if final_failure { job.row.state.as_str().to_string() } else { "retried".to_string() },
                error: entry.get("error").and_then(|e| e.as_str()).map(str::to_string),
                outbound: log.as_ref().map_or(0, outbound_of),
                log,
                waited_ms: None,
            }
        })
        .collect();
    // The last attempt, when its ending left no error entry: it completed,
    // or it runs now.
    let recorded = attempts.last().is_some_and(|a| a.attempt == last_attempt);
    let ran = matches!(job.row.state, JobState::Completed | JobState::Running);
    if last_attempt > 0 && !recorded && ran {
        let running = job.row.state == JobState::Running;
        // While it runs, the job's log is still its previous attempt's.
        let log = job.log.clone().filter(|log| log.is_object() && !running);
        attempts.push(Attempt {
            attempt: last_attempt,
            host: log.as_ref().and_then(host_of).or_else(|| job.host_id.clone()),
            started_at: job.row.started_at,
            ended_at: if running { None } else { job.row.finished_at },
            ran_ms: log.as_ref().and_then(elapsed_ms),
            ending: job.row.state.as_str().to_string(),
            error: None,
            outbound: log.as_ref().map_or(0, outbound_of),
            log,
            waited_ms: None,
        });
    }
    for i in 1..attempts.len() {
        let (before, after) = attempts.split_at_mut(i);
        let waited =
            before[i - 1].ended_at.zip(after[0].started_at).map(|(end, start)| (start - end).num_microseconds());
        after[0].waited_ms = waited.flatten().map(|us| (us as f64 / 1000.0).max(0.0));
    }
    attempts
}

/// A job as `GET /api/jobs/ID` and `jobhost job ID` show it: its detail
/// with its [`Attempt`]s.
pub fn with_attempts(job: &JobDetail) -> serde_json::Value {
    let mut value = serde_json::to_value(job).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        object.insert("attempts".into(), serde_json::to_value(of(job)).unwrap_or_default());
    }
    value
}

/// The attempts as a terminal shows them, each line at most 80 columns:
/// a line per attempt, then its error's first line, then the wait before
/// the next.
pub fn lines(attempts: &[Attempt]) -> String {
    let mut out = String::new();
    for attempt in attempts {
        if let Some(waited) = attempt.waited_ms {
            out.push_str(&format!("   waited {}\n", crate::text::millis(waited.round() as i64)));
        }
        let mut line = format!("#{} {:<9}", attempt.attempt, attempt.ending);
        if let Some(host) = &attempt.host {
            line.push_str(&format!(" on {}", crate::text::clip(host, 24)));
        }
        if let Some(started) = attempt.started_at {
            line.push_str(&format!(" at {}", started.format("%H:%M:%S%.3f")));
        }
        if let Some(ms) = attempt.ran_ms {
            line.push_str(&format!(" ran {}", crate::text::millis(ms.round() as i64)));
        }
        if attempt.outbound > 0 {
            line.push_str(&format!(" {} requests", attempt.outbound));
        }
        out.push_str(&crate::text::clip(&line, 80));
        out.push('\n');
        if let Some(error) = attempt.error.as_deref().and_then(|e| e.lines().next()) {
            out.push_str(&crate::text::clip(&format!("   {error}"), 80));
            out.push('\n');
        }
    }
    out
}

fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text).ok().map(|t| t.with_timezone(&Utc))
}

fn elapsed_ms(log: &serde_json::Value) -> Option<f64> {
    log.get("elapsed_us").and_then(|e| e.as_f64()).map(|us| us / 1000.0)
}

fn host_of(log: &serde_json::Value) -> Option<String> {
    log.get("host").and_then(|h| h.as_str()).map(str::to_string)
}

fn outbound_of(log: &serde_json::Value) -> usize {
    log.get("outbound").and_then(|o| o.as_array()).map_or(0, Vec::len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::JobRow;
    use serde_json::json;

    fn detail(state: JobState, attempts: i32, errors: serde_json::Value, log: serde_json::Value) -> JobDetail {
        let at = |s: &str| Some(DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc));
        JobDetail {
            row: JobRow {
                id: 7,
                job: "flaky".into(),
                queue: "default".into(),
                state,
                attempts,
                concurrency_key: None,
                error: None,
                enqueued_at: at("2026-12-04T09:00:00Z").unwrap(),
                started_at: at("2026-12-04T09:00:03Z"),
                finished_at: at("2026-12-04T09:00:03.5Z"),
            },
            output: None,
            priority: 0,
            payload: json!({}),
            max_attempts: 5,
            errors,
            log: Some(log),
            progress: None,
            run_at: None,
            host_id: Some("row-host".into()),
            parent_id: None,
            batch_id: None,
            workflow: None,
        }
    }

    #[test]
    fn a_retried_job_that_completed_reads_as_its_attempts_and_the_waits_between() {
        let errors = json!([
            {"attempt": 1, "at": "2026-12-04T09:00:01Z", "error": "boom",
             "log": {"host": "a-1", "elapsed_us": 250000, "outbound": [{}, {}]}},
            {"attempt": 2, "at": "2026-12-04T09:00:02Z", "error": "boom again",
             "log": {"host": "b-2", "elapsed_us": 500000}},
        ]);
        let job = detail(JobState::Completed, 3, errors, json!({"host": "a-1", "elapsed_us": 400000}));
        let attempts = of(&job);
        assert_eq!(attempts.len(), 3);
        assert_eq!((attempts[0].ending.as_str(), attempts[0].host.as_deref()), ("retried", Some("a-1")));
        assert_eq!(attempts[0].outbound, 2);
        assert_eq!(attempts[0].started_at.unwrap().to_rfc3339(), "2026-12-04T09:00:00.750+00:00");
        assert_eq!(attempts[1].waited_ms, Some(500.0), "from the first's end to the second's start");
        assert_eq!(attempts[2].ending, "completed");
        assert_eq!(attempts[2].ran_ms, Some(400.0));
        assert_eq!(attempts[2].waited_ms, Some(1000.0));
    }

    #[test]
    fn a_job_that_failed_ends_with_its_last_error_and_a_running_one_with_its_run() {
        let errors = json!([{"attempt": 1, "at": "2026-12-04T09:00:01Z", "error": "no", "log": {}}]);
        let failed = of(&detail(JobState::Failed, 1, errors.clone(), json!({})));
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].ending, "failed");
        // Its log is still the first attempt's: nothing of it is the running one's.
        let previous = json!({"host": "a-1", "elapsed_us": 1000, "outbound": [{}]});
        let running = of(&detail(JobState::Running, 2, errors, previous));
        assert_eq!(running.len(), 2);
        assert_eq!((running[1].ending.as_str(), running[1].ended_at), ("running", None));
        assert_eq!(running[1].host.as_deref(), Some("row-host"), "the lease holder's");
        assert_eq!((running[1].ran_ms, running[1].outbound), (None, 0));
    }
}
