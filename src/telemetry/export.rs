//! A span per run, exported to an OpenTelemetry collector over OTLP/HTTP
//! (protobuf) by the SDK's batch processor, from a thread of its own: a
//! slow or absent collector delays no run (spans past the processor's
//! queue are dropped, and the SDK says so in its own log).

use std::sync::Arc;

use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};

use crate::store::{FetchedJob, FinishOutcome};
use crate::types::OutboundCall;

/// Where spans go. `endpoint` is the collector's base URL, as in
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` is appended); without one
/// the exporter reads the standard `OTEL_EXPORTER_OTLP_*` variables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The collector's base URL.
    pub endpoint: Option<String>,
}

/// Why traces cannot be exported.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces: {0}")]
pub struct TraceError(String);

/// A host's spans: exported to a collector, or (the default) not made at
/// all, at no cost to a run.
#[derive(Clone, Default)]
pub struct Traces {
    exporting: Option<Arc<Exporting>>,
}

struct Exporting {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Traces {
    /// Starts exporting as `config` says.
    ///
    /// # Errors
    /// The endpoint is not an http(s) URL, or the exporter cannot be built.
    pub fn export(config: &OtlpConfig) -> Result<Self, TraceError> {
        // The exporter's client takes TLS from the process's provider: the
        // ring one the outbound stack uses (already installed is fine).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = SpanExporter::builder().with_http();
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(traces_url(endpoint)?);
        }
        let exporter = builder.build().map_err(|error| TraceError(error.to_string()))?;
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource()).build();
        let tracer = provider.tracer("jobhost");
        Ok(Traces { exporting: Some(Arc::new(Exporting { provider, tracer })) })
    }

    /// Whether spans are made: a host looks up a job's trace context only then.
    pub fn is_on(&self) -> bool {
        self.exporting.is_some()
    }

    /// Starts the span of `job`'s run on `host`, a child of the span that
    /// `parent` (the enqueue's traceparent) names, or a trace's root.
    pub fn run_span(&self, job: &FetchedJob, host: &str, parent: Option<&str>) -> RunSpan {
        let Some(exporting) = &self.exporting else {
            return RunSpan(None);
        };
        let parent = parent
            .and_then(super::context::parse)
            .map_or_else(Context::new, |span| Context::new().with_remote_span_context(span));
        let mut attributes = vec![
            KeyValue::new("messaging.system", "jobhost"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.destination.name", job.queue.clone()),
            KeyValue::new("messaging.message.id", job.id.to_string()),
            KeyValue::new("jobhost.job.type", job.job.clone()),
            KeyValue::new("jobhost.job.id", job.id),
            KeyValue::new("jobhost.attempt", i64::from(job.attempt)),
            KeyValue::new("jobhost.queue", job.queue.clone()),
            KeyValue::new("jobhost.host", host.to_string()),
        ];
        if let Some(key) = &job.concurrency_key {
            attributes.push(KeyValue::new("jobhost.concurrency_key", key.clone()));
        }
        let span = exporting
            .tracer
            .span_builder(format!("run {}", job.job))
            .with_kind(SpanKind::Consumer)
            .with_attributes(attributes)
            .start_with_context(&exporting.tracer, &parent);
        RunSpan(Some(span))
    }

    /// Sends the spans still queued and stops exporting; waits at most the
    /// exporter's timeout.
    pub async fn shut_down(&self) {
        if let Some(exporting) = self.exporting.clone() {
            let stopped = tokio::task::spawn_blocking(move || exporting.provider.shutdown()).await;
            if let Ok(Err(error)) = stopped {
                tracing::warn!(%error, "traces not all exported at shutdown");
            }
        }
    }
}

/// The span of one run, ended with its outcome; the default is none.
#[derive(Default)]
pub struct RunSpan(Option<Span>);

impl RunSpan {
    /// Whether there is a span (the host exports traces).
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// This span's trace context, which the jobs the run enqueues carry.
    pub fn traceparent(&self) -> Option<String> {
        self.0.as_ref().and_then(|span| super::context::format(span.span_context()))
    }

    /// Ends the span with how the run ended (`jobhost.outcome`: completed,
    /// retried, failed, snoozed, released or cancelled; an error status
    /// with the error for the failing ones) and an event per outbound
    /// request.
    pub fn end(self, outcome: &FinishOutcome, outbound: &[OutboundCall]) {
        let Some(mut span) = self.0 else {
            return;
        };
        let (name, error) = match outcome {
            FinishOutcome::Completed { .. } => ("completed", None),
            FinishOutcome::Retry { error, .. } => ("retried", Some(error)),
            FinishOutcome::Failed { error } => ("failed", Some(error)),
            FinishOutcome::Snooze { .. } => ("snoozed", None),
            FinishOutcome::Release { .. } => ("released", None),
            FinishOutcome::Cancelled { reason } => ("cancelled", Some(reason)),
        };
        span.set_attribute(KeyValue::new("jobhost.outcome", name));
        for call in outbound {
            let mut attributes = vec![
                KeyValue::new("http.request.method", call.method.clone()),
                KeyValue::new("url.full", format!("{}{}", call.origin, call.path)),
                KeyValue::new("jobhost.outbound.rule", call.rule.clone()),
                KeyValue::new("jobhost.outbound.ms", call.ms as i64),
            ];
            if let Some(status) = call.status {
                attributes.push(KeyValue::new("http.response.status_code", i64::from(status)));
            }
            if let Some(error) = &call.error {
                attributes.push(KeyValue::new("error.type", error.clone()));
            }
            span.add_event("outbound request", attributes);
        }
        if let Some(error) = error {
            span.set_status(Status::error(error.clone()));
        }
        span.end();
    }
}

/// The collector URL for spans: the base URL with `/v1/traces` appended,
/// as the OTLP/HTTP specification says of `OTEL_EXPORTER_OTLP_ENDPOINT`.
fn traces_url(endpoint: &str) -> Result<String, TraceError> {
    let endpoint = endpoint.trim().trim_end_matches('/');
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(TraceError(format!(
            "the OTLP endpoint {endpoint:?} is not an http:// or https:// URL (e.g. http://localhost:4318)"
        )));
    }
    Ok(if endpoint.ends_with("/v1/traces") { endpoint.to_string() } else { format!("{endpoint}/v1/traces") })
}

/// The resource every span names: `OTEL_SERVICE_NAME` (or a `service.name`
/// in `OTEL_RESOURCE_ATTRIBUTES`) if set, else `jobhost`.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::new("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    if named { detected } else { Resource::builder().with_service_name("jobhost").build() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_url_is_the_base_with_the_signal_path() {
        assert_eq!(traces_url("http://localhost:4318").unwrap(), "http://localhost:4318/v1/traces");
        assert_eq!(traces_url("https://otel.example/").unwrap(), "https://otel.example/v1/traces");
        assert_eq!(traces_url("http://c:4318/v1/traces").unwrap(), "http://c:4318/v1/traces");
        assert!(traces_url("localhost:4318").unwrap_err().to_string().contains("http://localhost:4318"));
    }

    #[test]
    fn without_an_exporter_a_run_makes_no_span() {
        let traces = Traces::default();
        assert!(!traces.is_on());
        let job = FetchedJob {
            id: 1,
            lease_token: 1,
            job: "hello".into(),
            queue: "default".into(),
            payload: serde_json::json!({}),
            attempt: 1,
            max_attempts: 1,
            enqueued_at: chrono::Utc::now(),
            batch_id: None,
            concurrency_key: None,
            lease_secs: 30,
        };
        let span = traces.run_span(&job, "h", Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assert!(!span.is_on());
        assert_eq!(span.traceparent(), None);
        span.end(&FinishOutcome::Snooze { delay_ms: 1 }, &[]);
    }
}
