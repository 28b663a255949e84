//! The runs a host reports in its log: with `RUST_LOG=jobhost=debug` the
//! worker writes `run started` and `run ended` lines, each with the run's
//! lease token, inside the span `job{job_id=.. job=.. attempt=..}`, after
//! an RFC 3339 UTC timestamp (tracing's default format), e.g.
//!
//! ```text
//! 2026-12-01T10:00:00.123456Z DEBUG job{job_id=7 job=limited attempt=1}: jobhost::worker: run started lease_token=3
//! ```

use std::collections::BTreeMap;

/// One run of a job on the host whose log this is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRun {
    pub job_id: i64,
    pub job: String,
    pub lease_token: i64,
    /// Microseconds since the Unix epoch of the `run started` line.
    pub started_us: i64,
    /// Of the `run ended` line; `None` when the log has none.
    pub ended_us: Option<i64>,
}

/// Every run in `log`, in the order they started.
pub fn runs(log: &str) -> Vec<LoggedRun> {
    let mut runs: BTreeMap<(i64, i64), LoggedRun> = BTreeMap::new();
    for line in log.lines() {
        let started = line.contains(" run started ");
        if !started && !line.contains(" run ended ") {
            continue;
        }
        let (Some(at), Some(job_id), Some(job), Some(lease_token)) =
            (timestamp_us(line), field(line, "job_id"), field(line, "job"), field(line, "lease_token"))
        else {
            panic!("a run line the test cannot read: {line}");
        };
        let (job_id, lease_token) = (number(line, job_id), number(line, lease_token));
        let run = runs.entry((job_id, lease_token)).or_insert_with(|| LoggedRun {
            job_id,
            job: job.to_string(),
            lease_token,
            started_us: at,
            ended_us: None,
        });
        if started {
            run.started_us = at;
        } else {
            run.ended_us = Some(at);
        }
    }
    let mut runs: Vec<LoggedRun> = runs.into_values().collect();
    runs.sort_by_key(|run| run.started_us);
    runs
}

/// The line's leading timestamp in microseconds since the Unix epoch.
fn timestamp_us(line: &str) -> Option<i64> {
    let stamp = line.split_whitespace().next()?;
    Some(chrono::DateTime::parse_from_rfc3339(stamp).ok()?.timestamp_micros())
}

/// The value of `name=value` in the line, where `name` is a whole word.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let pattern = format!("{name}=");
    let mut from = 0;
    while let Some(found) = line[from..].find(&pattern) {
        let at = from + found;
        let whole_word = line[..at].chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if whole_word {
            let value = &line[at + pattern.len()..];
            let end = value.find([' ', '}', ',', ':']).unwrap_or(value.len());
            return Some(&value[..end]);
        }
        from = at + pattern.len();
    }
    None
}

fn number(line: &str, value: &str) -> i64 {
    value.parse().unwrap_or_else(|_| panic!("not a number: {value:?} in {line}"))
}

/// A wall-clock time in microseconds since the Unix epoch, for messages.
pub fn clock(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .map(|at| at.format("%H:%M:%S%.3f").to_string())
        .unwrap_or_else(|| us.to_string())
}
