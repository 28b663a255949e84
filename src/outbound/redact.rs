//! The run's secrets as the guest and the host see them: each a random
//! placeholder in the guest's environment, swapped for its value only in
//! the headers (and, where a grant says so, the query string and body) of
//! requests allowed to carry it; swapped back, value to placeholder, in
//! every response the run reads, so a server echoing it hands the guest
//! only the placeholder; and, as defence in depth, every form of a value
//! in what the run leaves behind (log, stdout, stderr, reasons, output,
//! the lines echoed into the host's own log) replaced by `[secret NAME]`.

use std::collections::HashMap;

use bytes::Bytes;
use wasmtime_wasi_http::WasiBody;

use super::policy::SecretRoute;
use super::substitute::{self, Swaps};
use crate::types::{Crash, JsonText, RunOutcome, RunReport};

/// The shortest secret value redacted from what a run leaves.
pub const MIN_REDACTED_BYTES: usize = 6;

/// How many times over a JSON-escaped form of a value is looked for: a
/// value in a JSON string (once), in JSON carried inside a JSON string
/// (twice), and once more.
const JSON_DEPTHS: usize = 3;

/// One run's secrets: placeholders for every declared name, and the values
/// of those both sides let requests carry.
#[derive(Clone, Default)]
pub struct RunSecrets {
    /// By name: the placeholder the guest sees.
    placeholders: HashMap<String, String>,
    /// By name: the value, for the names that may be sent.
    values: HashMap<String, String>,
    /// Every form of every value worth looking for, each to `[secret NAME]`.
    redacting: Option<Swaps>,
    /// Every form of every value worth looking for, each to its placeholder.
    swapping_back: Option<Swaps>,
    /// Each placeholder with a value, to its value, and the names in the
    /// same order: a request body's swaps, kept to the names it may carry.
    sending: Option<(Swaps, Vec<String>)>,
}

impl std::fmt::Debug for RunSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&String> = self.values.keys().collect();
        f.debug_struct("RunSecrets").field("placeholders", &self.placeholders).field("values_of", &names).finish()
    }
}

/// The forms a value takes on its way out and back: as the host sends it
/// (as it is in a header or a body, percent-encoded in a query) and as a
/// server echoing it, or a guest printing what came back, commonly writes
/// it (JSON-escaped, once or more, with `/` escaped or not). Longest first.
pub fn forms(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_string()];
    let mut escaped = value.to_string();
    for _ in 0..JSON_DEPTHS {
        escaped = serde_json::to_string(&escaped).unwrap_or_default();
        escaped = escaped[1..escaped.len() - 1].to_string();
        forms.push(escaped.clone());
        forms.push(escaped.replace('/', "\\/"));
        // JSON writers that escape markup (Go's `<>&` as `\u003c`) or
        // every non-ASCII character (Python's default).
        forms.push(escaped.chars().map(unicode_escaped).collect());
    }
    let percent = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string();
    forms.push(percent.replace("%20", "+"));
    forms.push(lower_hex_escapes(&percent));
    forms.push(percent);
    // An HTML page quoting the request (an error page).
    forms.push(
        value
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
            .replace('\'', "&#39;"),
    );
    forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    forms.dedup();
    forms
}

/// A character as a JSON writer that escapes markup and non-ASCII writes it.
fn unicode_escaped(c: char) -> String {
    match c {
        '<' | '>' | '&' | '\'' => format!("\\u{:04x}", c as u32),
        c if c.is_ascii() => c.to_string(),
        c => c.encode_utf16(&mut [0; 2]).iter().map(|unit| format!("\\u{unit:04x}")).collect(),
    }
}

/// Percent-encoded text with its hex digits in lower case.
fn lower_hex_escapes(percent: &str) -> String {
    let mut out = String::with_capacity(percent.len());
    let mut digits = 0;
    for c in percent.chars() {
        if c == '%' {
            digits = 2;
            out.push(c);
        } else if digits > 0 {
            digits -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

impl RunSecrets {
    /// Placeholders for `declared`, random for this run, and the `values`
    /// opened for it.
    ///
    /// # Errors
    /// The system has no randomness for the placeholders.
    pub fn new(declared: &[String], values: Vec<(String, String)>) -> Result<Self, String> {
        let mut placeholders = HashMap::new();
        for name in declared {
            let mut random = [0u8; 16];
            getrandom::fill(&mut random).map_err(|e| format!("no randomness for a placeholder: {e}"))?;
            placeholders.insert(name.clone(), format!("jobhost-secret-{}", hex::encode(random)));
        }
        let mut secrets = RunSecrets {
            placeholders,
            values: values.into_iter().collect(),
            redacting: None,
            swapping_back: None,
            sending: None,
        };
        secrets.redacting = secrets.swaps(|name, _| format!("[secret {name}]"));
        secrets.swapping_back = secrets.swaps(|_, placeholder| placeholder.to_string());
        // Fail closed: values to hide and no search to hide them with.
        if secrets.redactable().next().is_some() && (secrets.redacting.is_none() || secrets.swapping_back.is_none()) {
            return Err("the secrets' values could not be made searchable".into());
        }
        let sent: Vec<(String, Vec<u8>, Bytes)> = secrets
            .values
            .iter()
            .filter_map(|(name, value)| {
                let placeholder = secrets.placeholders.get(name)?;
                Some((name.clone(), placeholder.clone().into_bytes(), Bytes::from(value.clone())))
            })
            .collect();
        let names = sent.iter().map(|(name, ..)| name.clone()).collect();
        secrets.sending = Swaps::new(sent.into_iter().map(|(_, p, v)| (p, v)).collect()).map(|swaps| (swaps, names));
        Ok(secrets)
    }

    /// Every form of every value worth looking for, each to what `to`
    /// makes of its name and placeholder.
    fn swaps(&self, to: impl Fn(&str, &str) -> String) -> Option<Swaps> {
        let mut swaps = Vec::new();
        for (name, value) in self.redactable() {
            let placeholder = self.placeholders.get(name).map_or("", String::as_str);
            let replacement = Bytes::from(to(name, placeholder));
            swaps.extend(forms(value).into_iter().map(|form| (form.into_bytes(), replacement.clone())));
        }
        Swaps::new(swaps)
    }

    /// The guest's environment: each declared name, its placeholder.
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut env: Vec<_> = self.placeholders.iter().map(|(n, p)| (n.clone(), p.clone())).collect();
        env.sort();
        env
    }

    /// Swaps each placeholder a route allows for its value: in the header
    /// values its route allows, and in the query string and body where its
    /// route names them; any other placeholder goes out as it is. On a run
    /// with values, the guest's `Accept-Encoding` becomes `identity` and a
    /// `Range` goes (what comes back must be searchable whole: a compressed
    /// echo, or one cut into ranges, would carry a value past the swap
    /// back). A body that may change length loses its `Content-Length` and
    /// goes out chunked.
    pub fn substitute(&self, mut request: http::Request<WasiBody>, routes: &[SecretRoute]) -> http::Request<WasiBody> {
        if self.swapping_back.is_some() {
            let headers = request.headers_mut();
            headers.insert(http::header::ACCEPT_ENCODING, http::HeaderValue::from_static("identity"));
            headers.remove(http::header::RANGE);
            headers.remove(http::header::IF_RANGE);
        }
        let swaps: Vec<(&SecretRoute, &str, &str)> = routes
            .iter()
            .filter_map(|route| {
                let name = &route.name;
                Some((route, self.placeholders.get(name)?.as_str(), self.values.get(name)?.as_str()))
            })
            .collect();
        if swaps.is_empty() {
            return request;
        }
        for (name, value) in request.headers_mut().iter_mut() {
            let Ok(text) = value.to_str() else { continue };
            let here: Vec<(&str, &str)> = swaps
                .iter()
                .filter(|(route, placeholder, _)| text.contains(placeholder) && route.allows_header(name.as_str()))
                .map(|(_, placeholder, secret)| (*placeholder, *secret))
                .collect();
            if here.is_empty() {
                continue;
            }
            let mut swapped = text.to_string();
            for (placeholder, secret) in here {
                swapped = swapped.replace(placeholder, secret);
            }
            if let Ok(mut header) = http::HeaderValue::from_str(&swapped) {
                header.set_sensitive(true);
                *value = header;
            }
        }
        let in_query: Vec<(&str, &str)> =
            swaps.iter().filter(|(route, ..)| route.places.query).map(|(_, p, v)| (*p, *v)).collect();
        if let Some(query) = request.uri().query().and_then(|q| substitute::swap_in_query(q, &in_query)) {
            let path_and_query = format!("{}?{query}", request.uri().path());
            let mut parts = request.uri().clone().into_parts();
            if let Ok(swapped) = path_and_query.parse() {
                parts.path_and_query = Some(swapped);
                if let Ok(uri) = http::Uri::from_parts(parts) {
                    *request.uri_mut() = uri;
                }
            }
        }
        let in_body: Vec<&str> =
            swaps.iter().filter(|(route, ..)| route.places.body).map(|(route, ..)| route.name.as_str()).collect();
        if !in_body.is_empty()
            && let Some((sending, names)) = &self.sending
        {
            let swaps = sending.keeping(|n| in_body.contains(&names[n].as_str()));
            request.headers_mut().remove(http::header::CONTENT_LENGTH);
            return request.map(|body| {
                use http_body_util::BodyExt;
                substitute::Substituted::with(body, swaps).boxed_unsync()
            });
        }
        request
    }

    /// A response as the guest may read it: every form of every value of
    /// the run swapped back to its placeholder, in the header values, in
    /// the body as it streams and in its trailers. A body that may change
    /// length loses its `Content-Length`; a response with no body (to a
    /// `HEAD`, a 204 or a 304) keeps it. A run with no values reads
    /// responses untouched.
    ///
    /// # Errors
    /// A body encoded (`Content-Encoding` other than `identity`) although
    /// the request asked for `identity`: its bytes cannot be searched, so
    /// the guest gets wasi:http's content-coding error instead.
    pub fn swap_back(
        &self,
        mut response: http::Response<WasiBody>,
        head: bool,
    ) -> Result<http::Response<WasiBody>, wasmtime_wasi_http::Error> {
        let Some(swaps) = &self.swapping_back else { return Ok(response) };
        let coding = response.headers().get(http::header::CONTENT_ENCODING);
        if let Some(coding) = coding.filter(|c| !c.as_bytes().eq_ignore_ascii_case(b"identity")) {
            let coding = String::from_utf8_lossy(coding.as_bytes()).into_owned();
            return Err(wasmtime_wasi_http::Error::HttpResponseContentCoding(Some(coding)));
        }
        swaps.apply_to_headers(response.headers_mut());
        let status = response.status();
        if head || status == http::StatusCode::NO_CONTENT || status == http::StatusCode::NOT_MODIFIED {
            return Ok(response);
        }
        response.headers_mut().remove(http::header::CONTENT_LENGTH);
        let swaps = swaps.clone();
        Ok(response.map(|body| {
            use http_body_util::BodyExt;
            substitute::Substituted::with(body, swaps).swapping_trailers().boxed_unsync()
        }))
    }

    /// Replaces every form of every value in what the run leaves behind.
    pub fn redact(&self, report: &mut RunReport) {
        if self.redacting.is_none() {
            return;
        }
        let effects = &mut report.effects;
        for line in &mut effects.logs {
            self.redact_text(&mut line.message);
        }
        self.redact_text(&mut effects.stdout);
        self.redact_text(&mut effects.stderr);
        match &mut report.outcome {
            RunOutcome::Completed { output: Some(output) } => {
                if let Some(redacted) = self.redact_json(output) {
                    *output = redacted;
                }
            }
            RunOutcome::Retry { reason } | RunOutcome::Failed { reason } => self.redact_text(reason),
            RunOutcome::Crashed { crash } => match crash {
                Crash::Trap { message } | Crash::InvalidResult { message } => self.redact_text(message),
                Crash::Interrupted { reason } => self.redact_text(reason),
                _ => {}
            },
            _ => {}
        }
    }

    /// The values worth looking for: one shorter than
    /// [`MIN_REDACTED_BYTES`] would turn every occurrence of a common
    /// string into a marker and garble the record while hiding nothing.
    fn redactable(&self) -> impl Iterator<Item = (&String, &String)> {
        self.values.iter().filter(|(_, value)| value.len() >= MIN_REDACTED_BYTES)
    }

    /// Replaces every form of every value in `text`: a line of the run's
    /// own, before it reaches the job's record or the host's log.
    pub fn redact_text(&self, text: &mut String) {
        let Some(swaps) = &self.redacting else { return };
        if swaps.found_in(text.as_bytes()) {
            *text = String::from_utf8_lossy(&swaps.apply(text.as_bytes())).into_owned();
        }
    }

    /// `output` with every form of every value replaced in each of its
    /// strings (keys included), or `None` when it holds none. The document
    /// is walked, not its text edited, so it stays valid JSON whatever
    /// characters a value has.
    fn redact_json(&self, output: &JsonText) -> Option<JsonText> {
        let swaps = self.redacting.as_ref()?;
        if !swaps.found_in(output.get().as_bytes()) {
            return None;
        }
        let mut document: serde_json::Value = serde_json::from_str(output.get()).ok()?;
        self.redact_value(&mut document);
        JsonText::parse(document.to_string()).ok()
    }

    fn redact_value(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::String(text) => self.redact_text(text),
            Value::Array(items) => items.iter_mut().for_each(|item| self.redact_value(item)),
            Value::Object(fields) => {
                let taken = std::mem::take(fields);
                for (mut key, mut item) in taken {
                    self.redact_text(&mut key);
                    self.redact_value(&mut item);
                    fields.insert(key, item);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{LogLevel, LogLine};

    fn secrets() -> RunSecrets {
        RunSecrets::new(&["API_KEY".into(), "OTHER".into()], vec![("API_KEY".into(), "s3cr\"et-value".into())]).unwrap()
    }

    #[test]
    fn placeholders_are_random_per_run_and_swapped_only_where_allowed() {
        let (one, two) = (secrets(), secrets());
        assert_ne!(one.placeholders["API_KEY"], two.placeholders["API_KEY"]);
        let placeholder = one.placeholders["API_KEY"].clone();
        let request = || {
            http::Request::builder()
                .header("authorization", format!("Bearer {placeholder}"))
                .body(wasmtime_wasi_http::WasiBody::default())
                .unwrap()
        };
        let route =
            |headers: Option<Vec<String>>| SecretRoute { name: "API_KEY".into(), places: Default::default(), headers };
        let allowed = one.substitute(request(), &[route(None)]);
        assert_eq!(allowed.headers()["authorization"], "Bearer s3cr\"et-value");
        assert_eq!(allowed.headers()["accept-encoding"], "identity", "an echo must come back searchable");
        let elsewhere = one.substitute(request(), &[]);
        assert_eq!(elsewhere.headers()["authorization"].to_str().unwrap(), format!("Bearer {placeholder}"));
        let other_header = one.substitute(request(), &[route(Some(vec!["x-api-key".into()]))]);
        assert_eq!(other_header.headers()["authorization"].to_str().unwrap(), format!("Bearer {placeholder}"));
    }

    #[test]
    fn exact_values_are_redacted_from_what_the_run_leaves() {
        let mut report = RunReport {
            outcome: RunOutcome::Completed {
                output: Some(JsonText::parse(r#"{"echo":"s3cr\"et-value"}"#.into()).unwrap()),
            },
            effects: Default::default(),
            elapsed_us: 0,
            instantiate_us: None,
        };
        report.effects.logs.push(LogLine { level: LogLevel::Info, message: "got s3cr\"et-value back".into() });
        report.effects.stderr = "s3cr\"et-value".into();
        secrets().redact(&mut report);
        let RunOutcome::Completed { output: Some(output) } = &report.outcome else { panic!() };
        assert_eq!(output.get(), r#"{"echo":"[secret API_KEY]"}"#);
        assert_eq!(report.effects.logs[0].message, "got [secret API_KEY] back");
        assert_eq!(report.effects.stderr, "[secret API_KEY]");
    }

    #[test]
    fn every_form_the_host_or_an_echo_makes_is_redacted() {
        let secrets = secrets();
        let value = "s3cr\"et-value";
        let escaped_once = serde_json::to_string(value).unwrap();
        let escaped_twice = serde_json::to_string(&escaped_once).unwrap();
        let percent = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string();
        let html = "s3cr&quot;et-value".to_string();
        let lower = percent.to_ascii_lowercase().replace("et-value", "");
        assert!(forms(value).iter().any(|form| form.starts_with(&lower) && form != &percent), "lower-case hex");
        for form in [value.to_string(), escaped_once, escaped_twice, percent, html] {
            let mut line = format!("answer 200: {form}");
            secrets.redact_text(&mut line);
            assert!(line.contains("[secret API_KEY]") && !line.contains("et-value"), "{form}: {line}");
        }
        // A value in JSON carried inside a JSON string, in the output: the
        // document stays valid JSON.
        let inner = serde_json::json!({"headers": {"authorization": format!("Bearer {value}")}}).to_string();
        let output = serde_json::json!({"nested": inner}).to_string();
        let mut report = RunReport {
            outcome: RunOutcome::Completed { output: Some(JsonText::parse(output).unwrap()) },
            effects: Default::default(),
            elapsed_us: 0,
            instantiate_us: None,
        };
        secrets.redact(&mut report);
        let RunOutcome::Completed { output: Some(output) } = &report.outcome else { panic!() };
        assert!(!output.get().contains("et-value") && output.get().contains("[secret API_KEY]"), "{}", output.get());
    }

    #[tokio::test]
    async fn a_response_is_swapped_back_to_placeholders_wherever_its_frames_split() {
        use http_body_util::BodyExt;
        let secrets = secrets();
        let placeholder = secrets.placeholders["API_KEY"].clone();
        let value = "s3cr\"et-value";
        let body =
            format!(r#"{{"a": "{value}", "b": {}, "c": "{}"}}"#, serde_json::to_string(value).unwrap(), "x".repeat(40));
        for split in 0..body.len() {
            let (one, two) = body.split_at(split);
            let frames = [one, two].map(|frame| Bytes::copy_from_slice(frame.as_bytes()));
            let stream = Frames(frames.into_iter().collect());
            let response = http::Response::builder()
                .header("x-echo", format!("Bearer {value}"))
                .header("content-length", body.len())
                .body(stream.boxed_unsync())
                .unwrap();
            let response = secrets.swap_back(response, false).unwrap();
            assert_eq!(response.headers()["x-echo"].to_str().unwrap(), format!("Bearer {placeholder}"));
            assert!(!response.headers().contains_key("content-length"));
            let read = response.into_body().collect().await.unwrap().to_bytes();
            let read = String::from_utf8(read.to_vec()).unwrap();
            let expected = format!(r#"{{"a": "{placeholder}", "b": "{placeholder}", "c": "{}"}}"#, "x".repeat(40));
            assert_eq!(read, expected, "split at {split}");
        }
    }

    /// A body of the given frames, each ready at once.
    struct Frames(std::collections::VecDeque<Bytes>);

    impl hyper::body::Body for Frames {
        type Data = Bytes;
        type Error = wasmtime_wasi_http::Error;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            std::task::Poll::Ready(self.0.pop_front().map(|bytes| Ok(hyper::body::Frame::data(bytes))))
        }
    }

    #[test]
    fn a_value_too_short_to_hide_anything_is_not_looked_for() {
        let short = RunSecrets::new(&["PIN".into()], vec![("PIN".into(), "1".into())]).unwrap();
        let mut report = RunReport {
            outcome: RunOutcome::Failed { reason: "attempt 1 of 10".into() },
            effects: Default::default(),
            elapsed_us: 0,
            instantiate_us: None,
        };
        short.redact(&mut report);
        let RunOutcome::Failed { reason } = &report.outcome else { panic!() };
        assert_eq!(reason, "attempt 1 of 10");
    }
}
