//! Overflow metrics. The `provider` label is an InferenceProvider name (operator-declared,
//! bounded by the objects that exist); no label takes a client-controlled string.
//!
//! ```text
//! kvroute_router_provider_requests_total{provider, outcome}   relayed requests by how they ended
//! kvroute_router_provider_refused_total{provider, reason}     overflows not taken (limits, pii, ...)
//! kvroute_router_provider_tokens_total{provider, kind}        prompt / completion tokens (usage)
//! kvroute_router_provider_ttft_seconds{provider}              first token through the relay
//! kvroute_router_provider_in_flight{provider}                 requests at the provider now
//! kvroute_router_provider_ready{provider}                     1 usable, 0 not (the reason is logged)
//! kvroute_router_provider_insecure{provider}                  1 when certificate checks are off
//! kvroute_router_provider_config_errors_total{reason}         unusable objects, bad Secrets
//! ```

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::metrics::LATENCY_BUCKETS;

/// Overflow metrics.
#[derive(Clone, Debug)]
pub struct ProviderMetrics {
    /// Relayed requests by provider and outcome.
    pub requests: IntCounterVec,
    /// Overflows not taken, by provider and reason.
    pub refused: IntCounterVec,
    /// Tokens the providers reported, by provider and kind (`prompt`, `completion`).
    pub tokens: IntCounterVec,
    /// Time to first token through the relay, seconds.
    pub ttft: HistogramVec,
    /// Requests in flight at each provider.
    pub in_flight: IntGaugeVec,
    /// 1 when the provider is usable.
    pub ready: IntGaugeVec,
    /// 1 when the provider's backend skips certificate verification.
    pub insecure: IntGaugeVec,
    /// Configuration errors (unusable objects, unreadable Secrets) by reason.
    pub config_errors: IntCounterVec,
}

impl ProviderMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &["provider"])?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let ttft = HistogramVec::new(
            HistogramOpts::new(
                "kvroute_router_provider_ttft_seconds",
                "Time to first token of requests overflowed to a provider.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["provider"],
        )?;
        registry.register(Box::new(ttft.clone()))?;
        Ok(Self {
            requests: counter(
                "kvroute_router_provider_requests_total",
                "Requests relayed to an overflow provider, by outcome.",
                &["provider", "outcome"],
            )?,
            refused: counter(
                "kvroute_router_provider_refused_total",
                "Overflows not taken, by provider and reason.",
                &["provider", "reason"],
            )?,
            tokens: counter(
                "kvroute_router_provider_tokens_total",
                "Tokens reported by overflow providers, by kind (prompt, completion).",
                &["provider", "kind"],
            )?,
            ttft,
            in_flight: gauge(
                "kvroute_router_provider_in_flight",
                "Requests in flight at each overflow provider.",
            )?,
            ready: gauge(
                "kvroute_router_provider_ready",
                "1 when the router can send to the provider (backend, Secrets and TLS in order).",
            )?,
            insecure: gauge(
                "kvroute_router_provider_insecure",
                "1 when the provider's GatewayBackend skips certificate verification.",
            )?,
            config_errors: counter(
                "kvroute_router_provider_config_errors_total",
                "Provider configuration errors (unusable objects, unreadable Secrets), by reason.",
                &["reason"],
            )?,
        })
    }

    /// Metrics on a throwaway registry (tests, gateways without providers).
    pub fn unregistered() -> Self {
        Self::register(&Registry::new()).expect("the provider metric names are valid")
    }
}
