//! One job as `jobhost job ID` prints it for a person: what it is and
//! where it stands first, then its error, payload, output, progress, log
//! and attempts, each line within 80 columns. `--json` prints the document
//! `GET /api/jobs/ID` answers instead, whole.

use chrono::{DateTime, SecondsFormat, Utc};

use crate::store::JobDetail;

const WIDTH: usize = 80;

/// The lines of `job`'s view.
pub fn lines(job: &JobDetail) -> Vec<String> {
    let row = &job.row;
    let head = format!("job {} {}:", row.id, row.job);
    let standing = format!("{}, attempt {} of {}", row.state, row.attempts, job.max_attempts);
    // One line when it fits; a long type name puts where the job stands
    // on the next line rather than cut it off.
    let mut out = if head.chars().count() + 1 + standing.chars().count() <= WIDTH {
        vec![format!("{head} {standing}")]
    } else {
        vec![crate::text::clip(&head, WIDTH), format!("  {standing}")]
    };
    let mut facts = vec![format!("queue {}", row.queue), format!("priority {}", job.priority)];
    if let Some(key) = &row.concurrency_key {
        facts.push(format!("key {key:?}"));
    }
    if let Some(batch) = job.batch_id {
        facts.push(format!("batch {batch}"));
    }
    if let Some(step) = &job.workflow {
        facts.push(format!("workflow {} step {:?}", step.id, step.step));
    }
    if let Some(parent) = job.parent_id {
        facts.push(format!("enqueued by job {parent}"));
    }
    if let Some(host) = &job.host_id {
        facts.push(format!("on {host}"));
    }
    // A fact longer than a line (a long key) is cut; `--json` has it whole.
    let facts: Vec<String> = facts.iter().map(|fact| crate::text::clip(fact, WIDTH - 3)).collect();
    out.extend(crate::text::wrap_list("  ", &facts, WIDTH));
    let times = [
        ("enqueued", Some(row.enqueued_at)),
        ("due", job.run_at.filter(|_| !row.state.is_final())),
        ("started", row.started_at),
        ("finished", row.finished_at),
    ];
    let times: Vec<String> =
        times.iter().filter_map(|(what, at)| at.map(|at| format!("{what} {}", stamp(at)))).collect();
    out.extend(crate::text::wrap_list("  ", &times, WIDTH));
    if let Some(error) = &row.error {
        out.push("error:".into());
        out.extend(indented(error));
    }
    out.push("payload:".into());
    out.extend(document(&job.payload));
    if let Some(output) = &job.output {
        out.push("output:".into());
        out.extend(document(output));
    }
    if let Some(progress) = &job.progress {
        out.push("progress:".into());
        out.extend(document(progress));
    }
    let log_lines = job.log.as_ref().and_then(|log| log.get("lines")).and_then(|l| l.as_array());
    if let Some(log_lines) = log_lines.filter(|l| !l.is_empty()) {
        out.push(format!("log of the last attempt ({} lines):", log_lines.len()));
        for line in log_lines {
            let level = line.get("level").and_then(|l| l.as_str()).unwrap_or("info");
            let message = line.get("message").and_then(|m| m.as_str()).unwrap_or_default();
            out.push(crate::text::clip(&format!("  {level:<5} {}", one_line(message)), WIDTH));
        }
    }
    let attempts = crate::attempts::of(job);
    if !attempts.is_empty() {
        out.push("attempts:".into());
        out.extend(
            crate::attempts::lines(&attempts).lines().map(|line| crate::text::clip(&format!("  {line}"), WIDTH)),
        );
    }
    out
}

fn stamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A text's lines, indented two spaces, each cut to the width.
fn indented(text: &str) -> Vec<String> {
    text.lines().map(|line| crate::text::clip(&format!("  {line}"), WIDTH)).collect()
}

/// A JSON document, pretty-printed and indented; a line too long for the
/// terminal is cut (`--json` has it whole).
fn document(value: &serde_json::Value) -> Vec<String> {
    indented(&serde_json::to_string_pretty(value).unwrap_or_default())
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
