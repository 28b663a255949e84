//! A second version of `hello` (same job name, different greeting), for
//! tests of hot reload.

use jobhost_guest::{JobConfig, JobContext, JobError};

struct HelloV2;

impl jobhost_guest::Guest for HelloV2 {
    fn describe() -> JobConfig {
        JobConfig { priority: Some(-1), ..JobConfig::named("hello") }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = jobhost_guest::parse_payload(&payload)?;
        let name = payload.get("name").and_then(|n| n.as_str()).unwrap_or("world");
        Ok(Some(serde_json::json!({ "greeting": format!("hi, {name}"), "version": 2 }).to_string()))
    }
}

jobhost_guest::export!(HelloV2);
