//! Greets the payload's `name`: the smallest useful handler. An optional
//! `delay_ms` keeps a run in flight, for tests that swap versions under it;
//! `log_times` logs the greeting that many times (default once); an `echo`
//! field comes back in the output as it arrived, for tests that follow a
//! value from enqueue to output; a workflow step's `_deps` (its
//! dependencies' outputs) comes back as `deps`.

use jobhost_guest::{JobConfig, JobContext, JobError, host};

struct Hello;

impl jobhost_guest::Guest for Hello {
    fn describe() -> JobConfig {
        JobConfig::named("hello")
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let name = payload.get("name").and_then(|n| n.as_str()).unwrap_or("world");
        if let Some(ms) = payload.get("delay_ms").and_then(|n| n.as_u64()) {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        let times = payload.get("log_times").and_then(|n| n.as_u64()).unwrap_or(1);
        for _ in 0..times {
            host::log(host::Level::Info, &format!("greeting {name}"));
        }
        println!("attempt {} of job {}", ctx.attempt, ctx.job_id);
        let mut output = serde_json::json!({ "greeting": format!("hello, {name}"), "job_id": ctx.job_id });
        if let Some(echo) = payload.get("echo") {
            output["echo"] = echo.clone();
        }
        if let Some(deps) = payload.get("_deps") {
            output["deps"] = deps.clone();
        }
        Ok(Some(output.to_string()))
    }
}

jobhost_guest::export!(Hello);
