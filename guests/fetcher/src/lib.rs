//! Sends one HTTP request through the standard `wasi:http/outgoing-handler`
//! and returns what came back. Payload: `{"url": "http://127.0.0.1:8080/x",
//! "method": "GET", "body": "text", "headers": {"name": "value"}}` (method,
//! body and headers optional; `${NAME}` in the url, the body or a header
//! value is the environment variable NAME, where a secret's placeholder
//! is, and each header sent is logged). Output: `{"status": 200, "body": "...",
//! "headers": {...}}`, or `{"error": "..."}` with the wasi:http error code
//! when the request failed or was refused. `"parallel": N` sends N copies
//! at once and returns each one's status or error; `"discard": true` counts
//! the body's bytes instead of keeping them; `"upload_bytes": N` sends N
//! bytes as the body; `"between_bytes_ms"` asks for that read timeout. It declares loopback and one
//! public API as its outbound origins; an operator grants what it may use.

use jobhost_guest::{Guest, JobConfig, JobContext, JobError, OutboundRule, export, parse_payload};
use serde_json::{Value, json};
use wasi::http::outgoing_handler;
use wasi::http::types::{
    Fields, FutureIncomingResponse, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use wasi::io::streams::StreamError;

struct Fetcher;

/// `text` with each `${NAME}` replaced by the environment variable NAME.
fn expand(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else { break };
        let name = &rest[start + 2..start + end];
        out.push_str(&std::env::var(name).unwrap_or_default());
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

impl Guest for Fetcher {
    fn describe() -> JobConfig {
        JobConfig {
            max_attempts: Some(1),
            outbound: Some(vec![
                OutboundRule::allow("http://127.0.0.1:*", &["GET", "POST"], &["API_KEY"]),
                OutboundRule::allow("http://localhost:*", &[], &[]),
                OutboundRule::allow("https://api.example.com", &["GET"], &[]),
            ]),
            ..JobConfig::named("fetcher")
        }
    }

    fn run(_ctx: JobContext, payload: String) -> Result<Option<String>, JobError> {
        let payload = parse_payload(&payload)?;
        let answer = match fetch(&payload) {
            Ok(answer) => answer,
            Err(error) => json!({ "error": error }),
        };
        Ok(Some(answer.to_string()))
    }
}

/// The request the payload describes, sent (`parallel` copies of it at
/// once when the payload asks); each response read whole.
fn fetch(payload: &Value) -> Result<Value, String> {
    let Some(copies) = payload["parallel"].as_u64() else {
        let pending = send(payload)?;
        let answer = receive(pending, payload)?;
        return Ok(spread(answer, payload));
    };
    // Every copy is sent before any answer is awaited, and progress says
    // so: all are in flight at once.
    let pending: Vec<_> = (0..copies).map(|_| send(payload)).collect();
    jobhost_guest::host::progress(copies, copies);
    let answers = pending
        .into_iter()
        .map(|sent| match sent.and_then(|pending| receive(pending, payload)) {
            Ok(answer) => json!({ "status": answer["status"] }),
            Err(error) => json!({ "error": error }),
        })
        .collect();
    Ok(Value::Array(answers))
}

/// What a handler bent on leaking what it read would do with an answer,
/// as the payload asks: `"log_answer"` logs it whole, `"encode"` returns it
/// reversed and base64-encoded beside it, `"forward"` posts it to that URL.
fn spread(mut answer: Value, payload: &Value) -> Value {
    let text = answer.to_string();
    if payload["log_answer"].as_bool() == Some(true) {
        jobhost_guest::host::log(jobhost_guest::host::Level::Info, &format!("answer {text}"));
    }
    if payload["encode"].as_bool() == Some(true) {
        answer["reversed"] = Value::String(text.chars().rev().collect());
        answer["base64"] = Value::String(base64(text.as_bytes()));
    }
    if let Some(url) = payload["forward"].as_str() {
        let onward = json!({"url": url, "method": "POST", "body": text});
        answer["forwarded"] = match send(&onward).and_then(|sent| receive(sent, &onward)) {
            Ok(forwarded) => forwarded["status"].clone(),
            Err(error) => Value::String(error),
        };
    }
    answer
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            let c = if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' };
            out.push(c);
        }
    }
    out
}

/// Sends the payload's request, its body (`body` text, or `upload_bytes`
/// bytes of `x`) written after the request is handed over, so a body larger
/// than the pipe's buffer streams.
fn send(payload: &Value) -> Result<Sent, String> {
    let url = expand(payload["url"].as_str().ok_or("no url")?);
    let url = url.as_str();
    let (scheme, rest) = url.split_once("://").ok_or("the url has no scheme")?;
    let (authority, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    };
    let headers = Fields::new();
    if let Some(pairs) = payload["headers"].as_object() {
        for (name, value) in pairs {
            let value = expand(value.as_str().unwrap_or_default());
            jobhost_guest::host::log(jobhost_guest::host::Level::Info, &format!("sending {name}: {value}"));
            headers.append(name, value.as_bytes()).map_err(|e| format!("header {name}: {e:?}"))?;
        }
    }
    let request = OutgoingRequest::new(headers);
    let method = match payload["method"].as_str().unwrap_or("GET") {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        other => Method::Other(other.to_string()),
    };
    request.set_method(&method).map_err(|_| "bad method")?;
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => Scheme::Other(other.to_string()),
    };
    request.set_scheme(Some(&scheme)).map_err(|_| "bad scheme")?;
    request.set_authority(Some(authority)).map_err(|_| "bad authority")?;
    request.set_path_with_query(Some(path)).map_err(|_| "bad path")?;
    let options = match payload["between_bytes_ms"].as_u64() {
        Some(ms) => {
            let options = RequestOptions::new();
            options.set_between_bytes_timeout(Some(ms * 1_000_000)).map_err(|_| "bad timeout")?;
            Some(options)
        }
        None => None,
    };
    let body = request.body().map_err(|_| "no body")?;
    let pending = outgoing_handler::handle(request, options).map_err(|e| format!("{e:?}"))?;
    let stream = body.write().map_err(|_| "no body stream")?;
    let upload = |chunk: &[u8]| stream.blocking_write_and_flush(chunk).map_err(|e| format!("writing the body: {e:?}"));
    let mut written = Ok(());
    if let Some(text) = payload["body"].as_str() {
        written = expand(text).as_bytes().chunks(4096).try_for_each(upload);
    }
    if let Some(bytes) = payload["upload_bytes"].as_u64() {
        let chunk = vec![b'x'; 4096];
        written = written.and_then(|()| (0..bytes.div_ceil(4096)).try_for_each(|_| upload(&chunk)));
    }
    drop(stream);
    // A body the host stopped taking (a refused request, a budget spent)
    // is not finished; the response then says why.
    let written = written.and_then(|()| OutgoingBody::finish(body, None).map_err(|e| format!("{e:?}")));
    Ok((pending, written.err()))
}

/// A request handed over, and why its body could not be written whole.
type Sent = (FutureIncomingResponse, Option<String>);

/// The response to a request sent, read to its end: kept as text, or
/// only counted (`"discard": true`) for a body larger than the guest's memory.
fn receive((pending, unwritten): Sent, payload: &Value) -> Result<Value, String> {
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(format!("{code:?}")),
        Some(Err(())) | None => return Err("the response was taken already".into()),
    };
    if let Some(unwritten) = unwritten {
        return Err(unwritten);
    }
    let status = response.status();
    let mut seen = serde_json::Map::new();
    for (name, value) in response.headers().entries() {
        seen.insert(name, Value::String(String::from_utf8_lossy(&value).into_owned()));
    }
    let incoming = response.consume().map_err(|_| "no body")?;
    let stream = incoming.stream().map_err(|_| "no body stream")?;
    let discard = payload["discard"].as_bool().unwrap_or(false);
    let (mut bytes, mut count) = (Vec::new(), 0u64);
    loop {
        match stream.blocking_read(64 << 10) {
            Ok(chunk) if discard => count += chunk.len() as u64,
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                let read = if discard { count } else { bytes.len() as u64 };
                return Err(format!("reading the body after {read} bytes: {}", e.to_debug_string()));
            }
        }
    }
    if discard {
        return Ok(json!({ "status": status, "bytes": count, "headers": seen }));
    }
    Ok(json!({ "status": status, "body": String::from_utf8_lossy(&bytes), "headers": seen }))
}

export!(Fetcher);
