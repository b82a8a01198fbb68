//! The router's HTTP gateway: OpenAI `/v1/chat/completions`, `/v1/completions`, `/v1/models`
//! and Anthropic `/v1/messages`, proxied to the worker the router picks.
//!
//! ```text
//!            +---------------- gateway ----------------------------------------------+
//! client --> | admission: in-flight caps (503 / 429 + Retry-After)                      |
//!            | proxy (axum): body limit, decode (openai | anthropic), resolve model     |
//!            | tenancy: credentials vs the pool's auth (401/403), tenant limits (429)   |
//!            |   --Dispatch::pick (decision pool)--> Assignment guard --upstream--> worker
//!            |   <-- sse parser / translator, TTFT/ITL/usage --Dispatch::first_token/done|
//!            +-----------------------------------------------------------------------+
//! ```
//!
//! Wire formats live in their own pure modules ([`openai`], [`anthropic`], [`sse`], [`error`]);
//! [`proxy`] is the only one that touches sockets; connection limits and TLS are the
//! listener's ([`crate::listener`]), request limits [`admission`]'s. The routing headers
//! (`x-kvroute-worker`, `x-kvroute-predicted-ttft-ms`) are sent only with
//! `--expose-routing-headers`: they tell any client which worker holds which prefix. The router is reached through the
//! [`Dispatch`] trait, so the gateway can be tested against a fake router and the router can
//! change its internals freely.

pub mod admission;
pub mod anthropic;
pub mod dispatch;
pub mod error;
pub mod openai;
pub mod overflow;
mod proxy;
pub mod sse;
pub(crate) mod tenancy;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

use crate::blocking_pool::{BlockingPool, PoolConfig};
use crate::listener::ListenerMetrics;

pub use admission::AdmissionConfig;
pub use dispatch::{AssignmentGuard, Dispatch, GatewayRequest, PickError, Picked, Resolved};
pub use error::GatewayError;
pub use overflow::OverflowPlan;
pub use proxy::{PREDICTED_TTFT_HEADER, TTFT_BOUND_HEADER, WORKER_HEADER};
pub use tenancy::DEFAULT_CLASS;
pub use upstream::UpstreamConfig;

/// Gateway settings (the router's `--max-body-bytes`, `--upstream-*`, admission flags).
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: usize,
    /// How many other workers to try when a request never started on the one picked.
    pub max_retries: u32,
    /// Upstream client timeouts and pool.
    pub upstream: UpstreamConfig,
    /// Send `x-kvroute-worker` and `x-kvroute-predicted-ttft-ms` (off by default: they are a
    /// cache-probing side channel).
    pub expose_routing_headers: bool,
    /// In-flight caps.
    pub admission: AdmissionConfig,
    /// The listener's body deadline (named in the 408 message).
    pub body_timeout: Duration,
    /// Where routing decisions run.
    pub pool: BlockingPool,
    /// Refusal counters (listener `gateway`).
    pub metrics: ListenerMetrics,
    /// Tenant identity, limits and metrics (shared with the Pick API).
    pub tenants: Arc<crate::tenant::Tenants>,
    /// Overflow providers (none: requests never leave the cluster).
    pub providers: Option<crate::provider::Providers>,
    /// OpenTelemetry decision spans and trace-context propagation (`--otlp-endpoint`);
    /// `None`: off, the client's trace context is passed to the worker unchanged.
    pub traces: Option<Arc<crate::traces::Traces>>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 << 20,
            max_retries: 2,
            upstream: UpstreamConfig::default(),
            expose_routing_headers: false,
            admission: AdmissionConfig::default(),
            body_timeout: Duration::from_secs(30),
            pool: BlockingPool::unregistered(PoolConfig::new(0, 256))
                .expect("the pool's metric names are valid"),
            metrics: ListenerMetrics::unregistered().expect("the metric names are valid"),
            tenants: crate::tenant::Tenants::unregistered(),
            providers: None,
            traces: None,
        }
    }
}

/// The gateway's routes, serving with `dispatch` as the router.
pub fn router_with(
    dispatch: Arc<dyn Dispatch>,
    cfg: GatewayConfig,
) -> Result<Router, reqwest::Error> {
    let upstream = upstream::Upstream::new(&cfg.upstream)?;
    let gw = proxy::Gateway {
        dispatch,
        upstream,
        max_body_bytes: cfg.max_body_bytes,
        max_retries: cfg.max_retries,
        expose_routing_headers: cfg.expose_routing_headers,
        admission: admission::Admission::new(cfg.admission, cfg.metrics.clone()),
        body_timeout: cfg.body_timeout,
        pool: cfg.pool,
        metrics: cfg.metrics,
        tenants: cfg.tenants,
        providers: cfg.providers,
        traces: cfg.traces,
    };
    let generation = Router::new()
        .route("/v1/chat/completions", post(proxy::chat_completions))
        .route("/v1/completions", post(proxy::completions))
        .route("/v1/messages", post(proxy::messages))
        .route_layer(axum::middleware::from_fn_with_state(
            gw.clone(),
            proxy::admit,
        ));
    Ok(generation
        .route("/v1/models", get(proxy::models))
        // Clients and load generators (GuideLLM, OpenAI-compatible health checks) probe
        // `GET /health` on the API port, as vLLM serves it; the router answers while it runs.
        // Readiness (crate::readiness) is the admin port's `/readyz`.
        .route("/health", get(|| async { axum::http::StatusCode::OK }))
        .with_state(gw))
}
