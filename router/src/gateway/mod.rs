//! The router's HTTP gateway: OpenAI `/v1/chat/completions`, `/v1/completions`, `/v1/models`
//! and Anthropic `/v1/messages`, proxied to the worker the router picks.
//!
//! ```text
//!            +---------------- gateway ----------------------------------------------+
//! client --> | proxy (axum): body limit, decode (openai | anthropic), resolve model     |
//!            |   --Dispatch::pick--> Assignment guard --upstream (pooled reqwest)--> worker
//!            |   <-- sse parser / translator, TTFT/ITL/usage --Dispatch::first_token/done|
//!            +-----------------------------------------------------------------------+
//! ```
//!
//! Wire formats live in their own pure modules ([`openai`], [`anthropic`], [`sse`], [`error`]);
//! [`proxy`] is the only one that touches sockets. The router is reached through the
//! [`Dispatch`] trait, so the gateway can be tested against a fake router and the router can
//! change its internals freely.

pub mod anthropic;
pub mod dispatch;
pub mod error;
pub mod openai;
mod proxy;
pub mod sse;
pub mod upstream;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

pub use dispatch::{AssignmentGuard, Dispatch, GatewayRequest, PickError, Picked, Resolved};
pub use error::GatewayError;
pub use proxy::{PREDICTED_TTFT_HEADER, WORKER_HEADER};
pub use upstream::UpstreamConfig;

/// Gateway settings (the router's `--max-body-bytes`, `--upstream-*` flags).
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: usize,
    /// How many other workers to try when a request never started on the one picked.
    pub max_retries: u32,
    /// Upstream client timeouts and pool.
    pub upstream: UpstreamConfig,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 << 20,
            max_retries: 2,
            upstream: UpstreamConfig::default(),
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
    };
    Ok(Router::new()
        .route("/v1/chat/completions", post(proxy::chat_completions))
        .route("/v1/completions", post(proxy::completions))
        .route("/v1/messages", post(proxy::messages))
        .route("/v1/models", get(proxy::models))
        // Clients and load generators (GuideLLM, OpenAI-compatible health checks) probe
        // `GET /health` on the API port, as vLLM serves it; the router answers while it runs.
        // Readiness (crate::readiness) is the admin port's `/readyz`.
        .route("/health", get(|| async { axum::http::StatusCode::OK }))
        .with_state(gw))
}
