//! The run's secrets as the guest and the host see them: each a random
//! placeholder in the guest's environment, swapped for its value only in
//! the headers (and, where a grant says so, the query string and body) of
//! requests allowed to carry it; and, as defence in depth,
//! every exact value in what the run leaves behind (log, stdout, stderr,
//! reasons, output) replaced by `[secret NAME]`.

use std::collections::HashMap;

use wasmtime_wasi_http::WasiBody;

use super::substitute::{self, Places};
use crate::types::{Crash, JsonText, RunOutcome, RunReport};

/// The shortest secret value redacted from what a run leaves.
pub const MIN_REDACTED_BYTES: usize = 6;

/// One run's secrets: placeholders for every declared name, and the values
/// of those both sides let requests carry.
#[derive(Debug, Clone, Default)]
pub struct RunSecrets {
    /// By name: the placeholder the guest sees.
    placeholders: HashMap<String, String>,
    /// By name: the value, for the names that may be sent.
    values: HashMap<String, String>,
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
        Ok(RunSecrets { placeholders, values: values.into_iter().collect() })
    }

    /// The guest's environment: each declared name, its placeholder.
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut env: Vec<_> = self.placeholders.iter().map(|(n, p)| (n.clone(), p.clone())).collect();
        env.sort();
        env
    }

    /// Swaps the placeholders of `allowed` for their values in the header
    /// values of `request`, and in its query string and body where `places`
    /// allow; any other placeholder goes out as it is. A body that may
    /// change length loses its `Content-Length` and goes out chunked.
    pub fn substitute(
        &self,
        mut request: http::Request<WasiBody>,
        allowed: &[String],
        places: Places,
    ) -> http::Request<WasiBody> {
        let swaps: Vec<(&str, &str)> = allowed
            .iter()
            .filter_map(|name| Some((self.placeholders.get(name)?.as_str(), self.values.get(name)?.as_str())))
            .collect();
        if swaps.is_empty() {
            return request;
        }
        for value in request.headers_mut().values_mut() {
            let Ok(text) = value.to_str() else { continue };
            if !swaps.iter().any(|(placeholder, _)| text.contains(placeholder)) {
                continue;
            }
            let mut swapped = text.to_string();
            for (placeholder, secret) in &swaps {
                swapped = swapped.replace(placeholder, secret);
            }
            if let Ok(mut header) = http::HeaderValue::from_str(&swapped) {
                header.set_sensitive(true);
                *value = header;
            }
        }
        if places.query
            && let Some(query) = request.uri().query().and_then(|q| substitute::swap_in_query(q, &swaps))
        {
            let path_and_query = format!("{}?{query}", request.uri().path());
            let mut parts = request.uri().clone().into_parts();
            if let Ok(swapped) = path_and_query.parse() {
                parts.path_and_query = Some(swapped);
                if let Ok(uri) = http::Uri::from_parts(parts) {
                    *request.uri_mut() = uri;
                }
            }
        }
        if places.body {
            request.headers_mut().remove(http::header::CONTENT_LENGTH);
            return request.map(|body| {
                use http_body_util::BodyExt;
                substitute::Substituted::new(body, &swaps).boxed_unsync()
            });
        }
        request
    }

    /// Replaces every exact secret value in what the run leaves behind.
    pub fn redact(&self, report: &mut RunReport) {
        if self.values.is_empty() {
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
                let mut text = output.get().to_string();
                if self.redact_json(&mut text)
                    && let Ok(redacted) = JsonText::parse(text)
                {
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

    fn redact_text(&self, text: &mut String) {
        for (name, value) in self.redactable() {
            if text.contains(value.as_str()) {
                *text = text.replace(value.as_str(), &format!("[secret {name}]"));
            }
        }
    }

    /// In JSON text a value appears escaped: the escaped form is replaced.
    fn redact_json(&self, text: &mut String) -> bool {
        let mut changed = false;
        for (name, value) in self.redactable() {
            let escaped = serde_json::to_string(value).unwrap_or_default();
            let escaped = escaped.trim_matches('"');
            if !escaped.is_empty() && text.contains(escaped) {
                *text = text.replace(escaped, &format!("[secret {name}]"));
                changed = true;
            }
        }
        changed
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
        let allowed = one.substitute(request(), &["API_KEY".into()], Places::default());
        assert_eq!(allowed.headers()["authorization"], "Bearer s3cr\"et-value");
        let elsewhere = one.substitute(request(), &[], Places::default());
        assert_eq!(elsewhere.headers()["authorization"].to_str().unwrap(), format!("Bearer {placeholder}"));
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
