//! OpenTelemetry traces of routing decisions. With `--otlp-endpoint` the gateway reads the
//! client's W3C trace context (`traceparent`, `tracestate`), opens one span per routing
//! decision as its child (a new trace when the client sent none), puts the chosen worker, the
//! predicted TTFT and why on it, and sends the span's context to the worker, so the worker's
//! own spans hang under the router's. Spans leave in batches over OTLP/gRPC.
//!
//! ```text
//! client --traceparent--> gateway --Traces::decision--> span "kvroute.route" --batch--> OTLP
//!                                        '--traceparent (same trace, parent = the span)--> worker
//! ```
//!
//! Off (the default), nothing here runs: the gateway only passes the client's trace context
//! through to the worker unchanged (two header lookups), see [`pass_through`].

use std::time::Duration;

use anyhow::Context as _;
use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanExporter};

/// The W3C trace-context headers.
pub const TRACEPARENT: &str = "traceparent";
/// The vendor part of the W3C trace context.
pub const TRACESTATE: &str = "tracestate";
/// Name of the span of one routing decision.
pub const SPAN_NAME: &str = "kvroute.route";
/// The service name the spans carry (`service.name`).
pub const SERVICE_NAME: &str = "kvroute-router";

/// Span attribute: the chosen worker's id.
pub const ATTR_WORKER: &str = "kvroute.worker";
/// Span attribute: the chosen worker's `host:port`.
pub const ATTR_WORKER_ADDRESS: &str = "kvroute.worker.address";
/// Span attribute: the predicted time to first token on the chosen worker, seconds.
pub const ATTR_PREDICTED_TTFT: &str = "kvroute.predicted_ttft_s";
/// Span attribute: the decision reason (`lowest_predicted_ttft`, ...).
pub const ATTR_REASON: &str = "kvroute.reason";
/// Span attribute: the decision was made on load alone.
pub const ATTR_DEGRADED: &str = "kvroute.degraded";
/// Span attribute: the model name the client asked for.
pub const ATTR_MODEL: &str = "kvroute.model";
/// Span attribute: the model name sent to the worker.
pub const ATTR_BACKEND_MODEL: &str = "kvroute.backend_model";
/// Span attribute: 0 for the first pick of a request, 1.. for retries on other workers.
pub const ATTR_ATTEMPT: &str = "kvroute.attempt";
/// Span attribute: the error label when no worker was picked (troubleshooting.md).
pub const ATTR_ERROR: &str = "kvroute.error";

/// What a decision span records.
#[derive(Debug, Clone, Copy)]
pub struct Decision<'a> {
    /// The client's model name.
    pub model: &'a str,
    /// The model sent to the worker.
    pub backend_model: &'a str,
    /// Chosen worker id.
    pub worker: &'a str,
    /// Its `host:port`.
    pub address: &'a str,
    /// Predicted TTFT, seconds (NaN when the policy predicts none: then not recorded).
    pub predicted_ttft_s: f64,
    /// Why it was chosen.
    pub reason: &'a str,
    /// Chosen on load alone.
    pub degraded: bool,
    /// Which attempt of the request (retries pick again).
    pub attempt: u32,
}

/// The trace pipeline: a tracer whose spans go to an OTLP collector in batches.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct Outgoing<'a>(&'a mut HeaderMap);

impl Injector for Outgoing<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// The client's trace-context headers, copied for the worker when traces are off.
pub fn pass_through(incoming: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in [TRACEPARENT, TRACESTATE] {
        if let Some(v) = incoming.get(name) {
            out.insert(name, v.clone());
        }
    }
    out
}

impl Traces {
    /// Exports to the OTLP/gRPC collector at `endpoint` (e.g. `http://otel-collector:4317`).
    /// Needs a Tokio runtime (the gRPC channel runs on it); connects lazily, so a collector
    /// that is down costs dropped spans, never a failed start or a slow request.
    pub fn otlp(endpoint: &str) -> anyhow::Result<Self> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(Duration::from_secs(5))
            .build()
            .with_context(|| format!("--otlp-endpoint {endpoint}"))?;
        Ok(Self::with_exporter(exporter))
    }

    /// The pipeline over any exporter, batched.
    pub fn with_exporter(exporter: impl SpanExporter + 'static) -> Self {
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(SERVICE_NAME).build())
            .build();
        let tracer = provider.tracer(SERVICE_NAME);
        Self {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
        }
    }

    /// `--otlp-endpoint`: `None` when empty (traces off).
    pub fn from_flag(endpoint: &str) -> anyhow::Result<Option<Self>> {
        let endpoint = endpoint.trim();
        if endpoint.is_empty() {
            return Ok(None);
        }
        Self::otlp(endpoint).map(Some)
    }

    fn span(&self, incoming: &HeaderMap, attributes: Vec<KeyValue>) -> Context {
        let parent = self.propagator.extract(&Headers(incoming));
        let span = self
            .tracer
            .span_builder(SPAN_NAME)
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        parent.with_span(span)
    }

    /// Records one decision as a span, child of the client's trace context in `incoming`,
    /// and returns the trace-context headers for the request to the worker (the same trace,
    /// the span as parent).
    pub fn decision(&self, incoming: &HeaderMap, d: &Decision<'_>) -> HeaderMap {
        let mut attributes = vec![
            KeyValue::new(ATTR_MODEL, d.model.to_string()),
            KeyValue::new(ATTR_BACKEND_MODEL, d.backend_model.to_string()),
            KeyValue::new(ATTR_WORKER, d.worker.to_string()),
            KeyValue::new(ATTR_WORKER_ADDRESS, d.address.to_string()),
            KeyValue::new(ATTR_REASON, d.reason.to_string()),
            KeyValue::new(ATTR_DEGRADED, d.degraded),
            KeyValue::new(ATTR_ATTEMPT, i64::from(d.attempt)),
        ];
        if d.predicted_ttft_s.is_finite() {
            attributes.push(KeyValue::new(ATTR_PREDICTED_TTFT, d.predicted_ttft_s));
        }
        let cx = self.span(incoming, attributes);
        let mut out = HeaderMap::new();
        self.propagator.inject_context(&cx, &mut Outgoing(&mut out));
        cx.span().end();
        out
    }

    /// Records a decision that picked no worker (its error label), as an error span.
    pub fn failed(&self, incoming: &HeaderMap, model: &str, error: &'static str) {
        let cx = self.span(
            incoming,
            vec![
                KeyValue::new(ATTR_MODEL, model.to_string()),
                KeyValue::new(ATTR_ERROR, error),
            ],
        );
        let span = cx.span();
        span.set_status(Status::error(error));
        span.end();
    }

    /// Sends the spans still buffered (tests; shutdown).
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::debug!(error = %e, "flushing spans failed");
        }
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        // The batch's last spans; a collector that is down only costs them.
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!(error = %e, "shutting the span exporter down failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_through_copies_only_the_trace_context() {
        let mut h = HeaderMap::new();
        h.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        h.insert(TRACESTATE, HeaderValue::from_static("vendor=x"));
        h.insert("authorization", HeaderValue::from_static("Bearer k"));
        let out = pass_through(&h);
        assert_eq!(out.len(), 2);
        assert!(out.get("authorization").is_none());
        assert!(pass_through(&HeaderMap::new()).is_empty());
    }

    #[test]
    fn an_empty_flag_is_off() {
        assert!(Traces::from_flag("  ").expect("ok").is_none());
    }
}
