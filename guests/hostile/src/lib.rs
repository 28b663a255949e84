//! Tries to make its host hold more than a run should, in the ways the
//! payload picks, in this order:
//!
//! - `{"log_bytes": N}`: log lines of 4 KiB until N bytes were logged;
//! - `{"stdout_bytes": N}`: N bytes to stdout;
//! - `{"children": N, "child_bytes": M, "job": T}`: N children of type T
//!   (default `hostile`), each with a payload of M bytes (at least 10); stops at the
//!   first refusal;
//! - `{"sleep_ms": N}`: sleeps N milliseconds (long enough to kill its host);
//! - `{"snooze": S}`: asks to run again in S seconds;
//! - `{"output_bytes": N}`: returns an output of N bytes.
//!
//! Children's payloads and the output are padded with one long string, or
//! with `"shape": "array"` an array of zeros: as many small values as fit,
//! the shape a parsed document is largest in.
//!
//! Unless it snoozes, its output reports what the host answered: how many
//! children and log lines it made, and the first `enqueue` error.

use jobhost_guest::{JobConfig, JobContext, JobError, host};

/// Bytes per log line: the host keeps at most 4 KiB of one.
const LOG_LINE_BYTES: u64 = 4 << 10;

struct Hostile;

impl jobhost_guest::Guest for Hostile {
    fn describe() -> JobConfig {
        JobConfig { max_attempts: Some(2), ..JobConfig::named("hostile") }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let number = |field: &str| payload.get(field).and_then(|n| n.as_u64());
        let array = payload.get("shape").and_then(|s| s.as_str()) == Some("array");

        let mut logged = 0u64;
        if let Some(bytes) = number("log_bytes") {
            let line = "l".repeat(LOG_LINE_BYTES as usize);
            let mut sent = 0;
            while sent < bytes {
                let size = (bytes - sent).min(LOG_LINE_BYTES) as usize;
                host::log(host::Level::Info, &line[..size]);
                sent += size as u64;
                logged += 1;
            }
        }

        if let Some(bytes) = number("stdout_bytes") {
            use std::io::Write;
            let chunk = vec![b'o'; 64 << 10];
            let mut out = std::io::stdout();
            let mut sent = 0;
            while sent < bytes {
                let size = (bytes - sent).min(chunk.len() as u64) as usize;
                let _ = out.write_all(&chunk[..size]);
                sent += size as u64;
            }
            let _ = out.flush();
        }

        let mut enqueued = 0u64;
        let mut enqueue_error = None;
        if let Some(count) = number("children") {
            let job = payload.get("job").and_then(|j| j.as_str()).unwrap_or("hostile");
            let mut child = String::from("{\"pad\":");
            pad(&mut child, number("child_bytes").unwrap_or(16), array);
            let options = host::EnqueueOptions { queue: None, priority: None, delay_ms: None };
            for _ in 0..count {
                match host::enqueue(job, &child, &options) {
                    Ok(()) => enqueued += 1,
                    Err(error) => {
                        enqueue_error = Some(error);
                        break;
                    }
                }
            }
        }

        if let Some(ms) = number("sleep_ms") {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }

        if let Some(seconds) = number("snooze") {
            return Err(JobError::Snooze(seconds as u32));
        }

        let report = serde_json::json!({
            "enqueued": enqueued,
            "enqueue_error": enqueue_error,
            "logged": logged,
        });
        let Some(bytes) = number("output_bytes") else {
            return Ok(Some(report.to_string()));
        };
        // One allocation of the output's size, so the guest's own memory
        // cap is not what stops it.
        let mut output = String::with_capacity(bytes as usize + 64);
        output.push_str("{\"report\":");
        output.push_str(&report.to_string());
        output.push_str(",\"blob\":");
        pad(&mut output, bytes, array);
        Ok(Some(output))
    }
}

/// Ends the object `text` has opened (with a key) with a value and `}`,
/// making `text` `bytes` long (or as short as the value can be).
fn pad(text: &mut String, bytes: u64, array: bool) {
    let bytes = bytes as usize;
    text.reserve(bytes.saturating_sub(text.len()));
    let (open, close) = if array { ('[', "0]}") } else { ('"', "\"}") };
    text.push(open);
    while text.len() + close.len() < bytes {
        if array && text.len() + close.len() + 2 <= bytes {
            text.push_str("0,");
        } else if array {
            text.push(' ');
        } else {
            text.push('x');
        }
    }
    text.push_str(close);
}

jobhost_guest::export!(Hostile);
