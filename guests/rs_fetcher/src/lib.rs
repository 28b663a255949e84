//! The fetcher handler written with the Rust SDK's HTTP helper, as
//! `py_fetcher` and `js_fetcher` are with theirs (`guests/fetcher` speaks
//! wasi:http directly, to test what the helpers hide): sends the payload's
//! request (`url`, `method`, `headers`, `body`; `${NAME}` in a header value
//! is the environment variable NAME, where a secret's placeholder is) and
//! returns `{"status", "body"}`, or `{"error"}` with the wasi:http error's
//! name. Declares the same origins.

use jobhost_guest::host::{Level, log};
use jobhost_guest::{Guest, JobConfig, JobContext, JobError, OutboundRule, export, http, parse_payload};
use serde_json::json;

struct RsFetcher;

/// `text` with each `${NAME}` replaced by the environment variable NAME.
fn expand(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else { break };
        out.push_str(&std::env::var(&rest[start + 2..start + end]).unwrap_or_default());
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

impl Guest for RsFetcher {
    fn describe() -> JobConfig {
        JobConfig {
            max_attempts: Some(1),
            outbound: Some(vec![
                OutboundRule::allow("http://127.0.0.1:*", &["GET", "POST"], &["API_KEY"]),
                OutboundRule::allow("http://localhost:*", &[], &[]),
                OutboundRule::allow("https://api.example.com", &["GET"], &[]),
            ]),
            ..JobConfig::named("rs_fetcher")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = parse_payload(&payload)?;
        let url = payload["url"].as_str().ok_or_else(|| JobError::Fail("no url".into()))?;
        let mut request = http::request(payload["method"].as_str().unwrap_or("GET"), url);
        for (name, value) in payload["headers"].as_object().into_iter().flatten() {
            let value = expand(value.as_str().unwrap_or_default());
            log(Level::Info, &format!("sending {name}: {value}"));
            request = request.header(name, &value);
        }
        if let Some(body) = payload["body"].as_str() {
            request = request.body(body);
        }
        let answer = match request.send() {
            Ok(response) => json!({ "status": response.status, "body": response.text() }),
            Err(error) => json!({ "error": format!("ErrorCode::{}", error.code) }),
        };
        Ok(Some(answer.to_string()))
    }
}

export!(RsFetcher);
