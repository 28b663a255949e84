// The relay handler, built under each crate's own name (see lib.rs).

use jobhost_guest::{JobConfig, JobContext, JobError, events};
use serde_json::{Value, json};

const NAME: &str = env!("CARGO_PKG_NAME");

struct Relay;

impl jobhost_guest::Guest for Relay {
    fn describe() -> JobConfig {
        let on_events = vec!["order.paid".to_string(), "relay.ping".to_string()];
        JobConfig { max_attempts: Some(5), on_events: Some(on_events), ..JobConfig::named(NAME) }
    }

    fn run(ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload: Value = serde_json::from_str(&payload).map_err(|e| JobError::Fail(e.to_string()))?;
        if let Some(ms) = payload.get("ms").and_then(Value::as_u64) {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        let order = payload.get("order").cloned().unwrap_or(Value::Null);
        for event in payload.get("send").and_then(Value::as_array).into_iter().flatten() {
            let key = event.get("key").and_then(Value::as_str).unwrap_or("");
            let mut body = event.get("payload").cloned().unwrap_or_else(|| json!({}));
            if let Some(fields) = body.as_object_mut() {
                fields.insert("from".into(), json!(NAME));
                fields.insert("order".into(), order.clone());
            }
            events::send(key, &body.to_string()).map_err(JobError::Fail)?;
        }
        let fail_attempts = payload.get("fail_attempts").and_then(Value::as_u64).unwrap_or(0);
        if u64::from(ctx.attempt) <= fail_attempts {
            return Err(JobError::Retry(format!("attempt {} told to fail", ctx.attempt)));
        }
        Ok(Some(json!({"type": NAME, "order": order, "attempt": ctx.attempt}).to_string()))
    }
}

jobhost_guest::export!(Relay);
