//! Enqueues `count` jobs of type `job` (default `hello`) with payload
//! `child` (default a greeting), reporting progress, then sleeps `sleep_ms`
//! (default 0) and fails if the payload says `fail: true`: a failed or
//! cancelled parent must leave no children. A refused enqueue fails the run
//! with the host's reason.

use jobhost_guest::{JobConfig, JobContext, JobError, host};

struct Fanout;

impl jobhost_guest::Guest for Fanout {
    fn describe() -> JobConfig {
        JobConfig { max_attempts: Some(1), ..JobConfig::named("fanout") }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let count = payload.get("count").and_then(|n| n.as_u64()).unwrap_or(1);
        let job = payload.get("job").and_then(|j| j.as_str()).unwrap_or("hello");
        let options = host::EnqueueOptions { queue: None, priority: None, delay_ms: None };
        for i in 0..count {
            let child = match payload.get("child") {
                Some(child) => child.clone(),
                None => serde_json::json!({ "name": format!("child {i} of {}", ctx.job_id) }),
            };
            host::enqueue(job, &child.to_string(), &options).map_err(JobError::Fail)?;
            host::progress(i + 1, count);
            host::heartbeat();
        }
        if let Some(ms) = payload.get("sleep_ms").and_then(|n| n.as_u64()) {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        if payload.get("fail").and_then(|f| f.as_bool()) == Some(true) {
            return Err(JobError::Fail("failing after enqueueing, on purpose".to_string()));
        }
        // Rejected enqueues come back as errors the guest can handle.
        let bad = host::enqueue("Not A Job", "{}", &options);
        let not_json = host::enqueue("hello", "{oops", &options);
        let unknown = host::enqueue("no-such-job", "{}", &options);
        Ok(Some(
            serde_json::json!({
                "enqueued": count,
                "bad_name_error": bad.err(),
                "bad_payload_error": not_json.err(),
                "unknown_type_error": unknown.err(),
            })
            .to_string(),
        ))
    }
}

jobhost_guest::export!(Fanout);
