//! Outbound HTTP from a Rust handler, over the standard `wasi:http`
//! interface the host serves through its allow-list (docs/outbound.md).
//! Enabled by the crate's `http` feature.
//!
//! ```ignore
//! use jobhost_guest::http;
//!
//! let key = std::env::var("API_KEY").unwrap_or_default(); // a placeholder the host swaps
//! let answer = http::get("https://api.example.com/v1/things")
//!     .header("authorization", &format!("Bearer {key}"))
//!     .send()?;
//! let things: serde_json::Value = answer.json()?;
//! http::post("https://api.example.com/v1/things").json(&serde_json::json!({"name": "x"})).send()?;
//! ```
//!
//! A request the host refuses (not declared, not granted, a private
//! address) or one that fails on the way is an [`HttpError`], whose `code`
//! names the wasi:http error (`HttpRequestDenied`, `ConnectionTimeout`…);
//! the job's log then says why and, for a refusal, which grant would allow
//! it. `?` turns it into a retryable [`JobError`].

use std::fmt;

use wasi::http::outgoing_handler;
use wasi::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use wasi::io::streams::StreamError;

use crate::JobError;

/// How much of a body is written or read per call into the host.
const CHUNK: usize = 64 << 10;

/// A request being built; [`Request::send`] sends it and reads the answer whole.
#[derive(Debug, Clone)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    between_bytes_ms: Option<u64>,
}

/// A `GET` of `url`.
pub fn get(url: &str) -> Request {
    request("GET", url)
}

/// A `POST` to `url`.
pub fn post(url: &str) -> Request {
    request("POST", url)
}

/// A request of any method to `url` (`http://` or `https://`).
pub fn request(method: &str, url: &str) -> Request {
    Request {
        method: method.to_ascii_uppercase(),
        url: url.to_string(),
        headers: Vec::new(),
        body: Vec::new(),
        between_bytes_ms: None,
    }
}

impl Request {
    /// Adds a header (names are sent in lower case, as HTTP/2 wants them).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Sets the body to `value` as JSON, with its content type unless one is set.
    pub fn json(mut self, value: &serde_json::Value) -> Self {
        if !self.headers.iter().any(|(name, _)| name == "content-type") {
            self.headers.push(("content-type".into(), "application/json".into()));
        }
        self.body = value.to_string().into_bytes();
        self
    }

    /// Asks for a shorter wait between a response's bytes than the grant's
    /// (the host never waits longer than its grant says).
    pub fn between_bytes_timeout_ms(mut self, ms: u64) -> Self {
        self.between_bytes_ms = Some(ms);
        self
    }

    /// Sends the request, then reads the response whole.
    ///
    /// # Errors
    /// The host refused the request, or it failed on the way (see [`HttpError`]).
    pub fn send(self) -> Result<Response, HttpError> {
        let (pending, unwritten) = self.hand_over()?;
        receive(pending, unwritten)
    }

    /// Hands the request to the host, then writes its body, so a body
    /// larger than the pipe's buffer streams. Says why the body could not
    /// be written whole (the response then says more).
    fn hand_over(self) -> Result<(FutureIncomingResponse, Option<HttpError>), HttpError> {
        let invalid = |detail: &str| HttpError::new("HttpRequestUriInvalid", Some(format!("{detail}: {}", self.url)));
        let (scheme, rest) = self.url.split_once("://").ok_or_else(|| invalid("no scheme"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(invalid("neither http nor https")),
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(at) if rest[at..].starts_with('?') => (&rest[..at], format!("/{}", &rest[at..])),
            Some(at) => (&rest[..at], rest[at..].to_string()),
            None => (rest, "/".to_string()),
        };
        if authority.is_empty() {
            return Err(invalid("no host"));
        }
        let headers = Fields::new();
        for (name, value) in &self.headers {
            headers
                .append(name, value.as_bytes())
                .map_err(|e| HttpError::new("HttpRequestHeaderSize", Some(format!("header {name}: {e:?}"))))?;
        }
        let outgoing = OutgoingRequest::new(headers);
        let method = match self.method.as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "PATCH" => Method::Patch,
            "OPTIONS" => Method::Options,
            other => Method::Other(other.to_string()),
        };
        let refused = |what: &str| HttpError::new("HttpRequestMethodInvalid", Some(what.to_string()));
        outgoing.set_method(&method).map_err(|()| refused(&self.method))?;
        outgoing.set_scheme(Some(&scheme)).map_err(|()| invalid("bad scheme"))?;
        outgoing.set_authority(Some(authority)).map_err(|()| invalid("bad authority"))?;
        outgoing.set_path_with_query(Some(&path)).map_err(|()| invalid("bad path"))?;
        let options = match self.between_bytes_ms {
            Some(ms) => {
                let options = RequestOptions::new();
                let ns = ms.saturating_mul(1_000_000);
                options.set_between_bytes_timeout(Some(ns)).map_err(|()| HttpError::new("InternalError", None))?;
                Some(options)
            }
            None => None,
        };
        let body = outgoing.body().map_err(|()| HttpError::new("InternalError", Some("no request body".into())))?;
        let pending = outgoing_handler::handle(outgoing, options).map_err(HttpError::from)?;
        let unwritten = write_body(body, &self.body).err();
        Ok((pending, unwritten))
    }
}

/// Writes and finishes a request's body. A body the host stopped taking
/// (a refused request, a budget spent) is left unfinished.
fn write_body(body: OutgoingBody, bytes: &[u8]) -> Result<(), HttpError> {
    let stream = body.write().map_err(|()| HttpError::new("InternalError", Some("no body stream".into())))?;
    let written = bytes.chunks(4096).try_for_each(|chunk| {
        stream.blocking_write_and_flush(chunk).map_err(|e| {
            HttpError::new("HttpRequestBodySize", Some(format!("the request body was not taken whole: {e:?}")))
        })
    });
    drop(stream);
    written?;
    OutgoingBody::finish(body, None).map_err(HttpError::from)
}

/// Waits for the response to a request handed over and reads its body.
fn receive(pending: FutureIncomingResponse, unwritten: Option<HttpError>) -> Result<Response, HttpError> {
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(code.into()),
        Some(Err(())) | None => return Err(HttpError::new("InternalError", Some("the response was taken".into()))),
    };
    if let Some(unwritten) = unwritten {
        return Err(unwritten);
    }
    let status = response.status();
    let headers = response
        .headers()
        .entries()
        .into_iter()
        .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
        .collect();
    let incoming = response.consume().map_err(|()| HttpError::new("InternalError", Some("no body".into())))?;
    let stream = incoming.stream().map_err(|()| HttpError::new("InternalError", Some("no body stream".into())))?;
    let mut body = Vec::new();
    loop {
        match stream.blocking_read(CHUNK as u64) {
            Ok(chunk) => body.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(error)) => {
                let detail = format!("reading the body after {} bytes: {}", body.len(), error.to_debug_string());
                return Err(HttpError::new("HttpResponseIncomplete", Some(detail)));
            }
        }
    }
    Ok(Response { status, headers, body })
}

/// A response read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Each header as sent (names in lower case), in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of a header, by its name in any case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    ///
    /// # Errors
    /// The body is not JSON: an [`HttpError`] with code `InvalidJson`.
    pub fn json(&self) -> Result<serde_json::Value, HttpError> {
        serde_json::from_slice(&self.body).map_err(|e| HttpError::new("InvalidJson", Some(e.to_string())))
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// A request refused or failed: `code` names the wasi:http error
/// (`HttpRequestDenied`, `ConnectionRefused`, `ConnectionTimeout`…),
/// `detail` says more where there is more to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    pub code: String,
    pub detail: Option<String>,
}

impl HttpError {
    fn new(code: &str, detail: Option<String>) -> Self {
        HttpError { code: code.to_string(), detail }
    }
}

impl From<ErrorCode> for HttpError {
    fn from(code: ErrorCode) -> Self {
        // wit-bindgen writes `ErrorCode::HttpRequestDenied`; a payload, if
        // any, becomes the detail (`ErrorCode::InternalError(Some("…"))`).
        let debug = format!("{code:?}");
        let debug = debug.strip_prefix("ErrorCode::").unwrap_or(&debug);
        match debug.split_once('(') {
            Some((name, rest)) => HttpError::new(name, Some(rest.trim_end_matches(')').to_string())),
            None => HttpError::new(debug, None),
        }
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.detail {
            Some(detail) => write!(f, "{}: {detail}", self.code),
            None => f.write_str(&self.code),
        }
    }
}

impl std::error::Error for HttpError {}

/// A failed request is retried, as a network's failures usually pass;
/// a handler that knows better maps the error itself.
impl From<HttpError> for JobError {
    fn from(error: HttpError) -> Self {
        JobError::Retry(format!("HTTP request failed: {error}"))
    }
}
