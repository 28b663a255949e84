//! OpenTelemetry traces (docs/observability.md, "Traces"): the trace
//! context an enqueue carries through the database, and the span a host
//! exports for each run, joined to it.

pub mod context;
mod export;

pub use export::{OtlpConfig, RunSpan, TraceError, Traces};
