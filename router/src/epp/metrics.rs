//! The endpoint picker's metrics: decisions by outcome, protocol errors by reason, which
//! endpoint served, streams open, and whether the listener authenticates. Every label set is
//! fixed (outcomes are [`crate::gateway::GatewayError::label`]s or the names below); nothing a
//! client sends becomes a label.

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

/// Label values of `kvroute_router_epp_errors_total`.
pub const ERRORS: &[&str] = &[
    // A message out of order (a body before headers, a second request, ...).
    "unexpected_message",
    // The request body went over --max-body-bytes.
    "body_too_large",
    // The data plane's stream broke (reset, transport error).
    "stream_error",
    // The caller's certificate may not pick (not a picker, another pool's).
    "refused_caller",
    // The served endpoint is none the picker named.
    "served_unknown",
    // The assignment could not be moved to the fallback that served.
    "reassign_failed",
];

/// Label values of `kvroute_router_epp_served_total`.
pub const SERVED: &[&str] = &["primary", "fallback", "unknown", "unreported"];

/// The endpoint picker's metrics.
#[derive(Clone, Debug)]
pub struct EppMetrics {
    /// Decisions by outcome: `routed`, or the gateway error label of the refusal.
    pub decisions: IntCounterVec,
    /// Protocol errors by reason ([`ERRORS`]).
    pub errors: IntCounterVec,
    /// Responses by which endpoint served them ([`SERVED`]).
    pub served: IntCounterVec,
    /// ext_proc streams open now.
    pub streams: IntGauge,
    /// 1 when the listener runs without mTLS.
    pub unauthenticated: IntGauge,
}

impl EppMetrics {
    /// Creates the metrics in `registry`, every fixed series at 0.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::unregistered()?;
        registry.register(Box::new(m.decisions.clone()))?;
        registry.register(Box::new(m.errors.clone()))?;
        registry.register(Box::new(m.served.clone()))?;
        registry.register(Box::new(m.streams.clone()))?;
        registry.register(Box::new(m.unauthenticated.clone()))?;
        Ok(m)
    }

    /// Metrics that are not exported (tests).
    pub fn unregistered() -> prometheus::Result<Self> {
        let m = Self {
            decisions: IntCounterVec::new(
                Opts::new(
                    "kvroute_router_epp_decisions_total",
                    "Endpoint picker decisions, by outcome (routed, or the refusal's error code).",
                ),
                &["outcome"],
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    "kvroute_router_epp_errors_total",
                    "Endpoint picker protocol errors, by reason.",
                ),
                &["reason"],
            )?,
            served: IntCounterVec::new(
                Opts::new(
                    "kvroute_router_epp_served_total",
                    "Responses seen by the endpoint picker, by the endpoint that served them (primary, fallback, unknown, unreported).",
                ),
                &["endpoint"],
            )?,
            streams: IntGauge::new(
                "kvroute_router_epp_streams",
                "ext_proc streams open on the endpoint picker.",
            )?,
            unauthenticated: IntGauge::new(
                "kvroute_router_epp_unauthenticated",
                "1 when the endpoint picker listener runs without mTLS (any caller may pick).",
            )?,
        };
        m.decisions.with_label_values(&["routed"]);
        for r in ERRORS {
            m.errors.with_label_values(&[r]);
        }
        for s in SERVED {
            m.served.with_label_values(&[s]);
        }
        Ok(m)
    }

    /// Counts a protocol error (`reason` from [`ERRORS`]).
    pub fn error(&self, reason: &'static str) {
        self.errors.with_label_values(&[reason]).inc();
    }
}
