//! The admin HTTP server: `/metrics` (Prometheus text), `/healthz` for the pod's probes, and
//! `/debug/resident` (the resident kvroute hashes as JSON, for debugging and interop checks).
//! `/debug/resident` answers loopback callers only (`kubectl exec`, `kubectl port-forward`):
//! the resident set tells which prefixes the worker caches, and the admin port is open to
//! the cluster for Prometheus. Other callers get 403, counted in
//! `kvroute_sidecar_admin_refused_total`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::hub::Hub;
use crate::metrics::SidecarMetrics;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// The gauges set at scrape time (resident blocks, epoch).
    pub metrics: SidecarMetrics,
    /// The resident set `/debug/resident` lists.
    pub hub: Arc<Hub>,
}

/// The admin HTTP routes: `/metrics`, `/healthz` and `/debug/resident`.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/debug/resident", get(resident))
        .with_state(state)
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    // Internal sizes are read at scrape time.
    s.metrics
        .resident_blocks
        .set(i64::try_from(s.hub.resident_blocks()).unwrap_or(i64::MAX));
    s.metrics
        .epoch
        .set((s.hub.epoch() & (i64::MAX as u64)) as i64);
    s.metrics
        .lora_adapters
        .set(i64::try_from(s.hub.adapters().len()).unwrap_or(i64::MAX));
    s.metrics.refresh_runtime();
    let mut buf = Vec::new();
    match TextEncoder::new().encode(&s.registry.gather(), &mut buf) {
        Ok(()) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], buf).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn resident(
    State(s): State<AdminState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
) -> axum::response::Response {
    if !peer.ip().to_canonical().is_loopback() {
        s.metrics.admin_refused.inc();
        tracing::debug!(%peer, "/debug/resident refused: not from loopback");
        return (
            StatusCode::FORBIDDEN,
            "/debug/resident answers loopback callers only\n",
        )
            .into_response();
    }
    let mut blocks = s.hub.resident_set();
    blocks.sort_unstable();
    axum::Json(serde_json::json!({
        "epoch": s.hub.epoch(),
        "block_size": s.hub.block_size(),
        "blocks": blocks,
    }))
    .into_response()
}
