//! W3C trace context as jobhost carries it from an enqueue to its run: the
//! `traceparent` text, checked and written by OpenTelemetry's own
//! propagator, so what the database holds is what every collector reads.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The header (and the SQL argument, and the column) that carries it.
pub const TRACEPARENT: &str = "traceparent";

/// The span context a `traceparent` names, if it is a valid one (version,
/// lowercase hex ids that are not all zeros, flags). Invalid text names
/// none: by the W3C rules a receiver then starts a trace of its own.
pub fn parse(traceparent: &str) -> Option<SpanContext> {
    // The propagator reads ids of any length up to theirs; W3C fixes them.
    let lengths: Vec<usize> = traceparent.trim().split('-').map(str::len).collect();
    if lengths.len() < 4 || lengths[..4] != [2, 32, 16, 2] {
        return None;
    }
    let carrier = HashMap::from([(TRACEPARENT.to_string(), traceparent.trim().to_string())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    let span = context.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// The `traceparent` of a span context (version 00, the sampled flag
/// only), or none for an invalid one.
pub fn format(span: &SpanContext) -> Option<String> {
    if !span.is_valid() {
        return None;
    }
    let context = opentelemetry::Context::new().with_remote_span_context(span.clone());
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// A `traceparent` as stored: the canonical text of a valid one.
///
/// # Errors
/// The text is not a valid trace context; the message says what one is.
pub fn canonical(traceparent: &str) -> Result<String, String> {
    parse(traceparent).and_then(|span| format(&span)).ok_or_else(|| {
        format!(
            "traceparent {traceparent:?} is not a W3C trace context: \
             00-<32 lowercase hex, not all 0>-<16 lowercase hex, not all 0>-<2 hex flags>"
        )
    })
}

/// The trace context of the caller: its current `tracing` span where an
/// OpenTelemetry layer records it, else OpenTelemetry's current context.
/// None outside any trace.
pub fn current() -> Option<String> {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let of_tracing = tracing::Span::current().context();
    [of_tracing, opentelemetry::Context::current()].iter().find_map(|context| format(context.span().span_context()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_reads_back_as_written() {
        let span = parse(VALID).unwrap();
        assert_eq!(span.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span.span_id().to_string(), "00f067aa0ba902b7");
        assert!(span.is_sampled());
        assert_eq!(format(&span).as_deref(), Some(VALID));
        assert_eq!(canonical(&format!("  {VALID} ")).unwrap(), VALID);
    }

    #[test]
    fn flags_other_than_sampled_are_dropped() {
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert_eq!(canonical(unsampled).unwrap(), unsampled);
        let other = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03";
        assert_eq!(canonical(other).unwrap(), VALID);
    }

    #[test]
    fn invalid_traceparents_name_no_span() {
        for bad in [
            "",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert!(parse(bad).is_none(), "{bad}");
            assert!(canonical(bad).unwrap_err().contains("W3C trace context"), "{bad}");
        }
    }

    #[test]
    fn outside_any_trace_there_is_no_current_context() {
        assert_eq!(current(), None);
    }
}
