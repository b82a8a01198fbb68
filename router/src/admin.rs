//! The admin HTTP server: metrics, health, and debugging views.
//!
//! ```text
//! GET  /metrics        Prometheus text (scrape-time gauges refreshed first)
//! GET  /healthz        200 while the process runs
//! GET  /readyz         200 when this replica should get traffic (crate::readiness: discovery
//!                      synced, tokenizers loaded or failed, a listed worker streaming here;
//!                      not draining), else 503 and why; `?model=NAME` asks whether one model
//!                      can be served now (its tokenizer loaded or not needed, a routable worker)
//! GET  /drain          the preStop hook: starts draining (/readyz and gRPC health say not
//!                      ready, requests are still served) and answers after `--drain-delay-s`
//!                      (GET because a kubelet httpGet hook can only GET)
//! GET  /debug/workers  JSON: index size, and per worker its blocks, load, in-flight, state
//! GET  /debug/tokenizers JSON: per model where its tokenizer comes from and whether it is
//!                      loaded (state, failures, last error)
//! POST /debug/explain  body: an OpenAI chat/completions (or completions) request; the
//!                      request's headers count as the client's (service class, TTFT target,
//!                      x-request-id, policy header rules); returns the decision record
//!                      (with the InferencePolicy verdict) without assigning anything
//!                      (decided on the bounded decision pool; 503 when it is full); a
//!                      policy refusal answers its status with the policy and rule named
//! GET  /debug/policies JSON: the InferencePolicy set in force and refused reloads
//! ```
//!
//! `/debug/*` answer loopback callers and callers with the admin bearer token only
//! ([`crate::admin_token`]); the rest stays open for scrapers, probes and the preStop hook.

use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::admin_token::{self, AdminAuth};
use crate::blocking_pool::{BlockingPool, Caller, PoolError};
use crate::readiness::Phase;
use crate::state::{BodyKind, PickError, PickInput, RouterState};
use crate::tokenizer_registry::refresh_gauges;

/// The admin routes: `auth` guards `/debug/*`; explain decides on `pool`.
pub fn router(state: RouterState, auth: AdminAuth, pool: BlockingPool) -> Router {
    let limit = state.config().max_body_bytes;
    let debug = Router::new()
        .route("/debug/workers", get(workers))
        .route("/debug/tokenizers", get(tokenizers))
        .route("/debug/explain", post(explain))
        .route("/debug/policies", get(policies))
        .layer(axum::Extension(pool))
        .route_layer(axum::middleware::from_fn_with_state(
            auth.clone(),
            admin_token::require,
        ));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(debug)
        .route(
            "/drain",
            get(drain).route_layer(axum::middleware::from_fn_with_state(
                auth.clone(),
                admin_token::require_drain,
            )),
        )
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn metrics(State(state): State<RouterState>) -> Response {
    state.refresh_gauges(Instant::now());
    refresh_gauges(state.tokenizers(), &state.metrics().tokenizer_loaded);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics().encode(),
    )
        .into_response()
}

/// `/readyz?model=NAME`.
#[derive(Debug, serde::Deserialize)]
struct ReadyQuery {
    model: Option<String>,
}

async fn readyz(State(state): State<RouterState>, Query(q): Query<ReadyQuery>) -> Response {
    let unavailable = |why: String| (StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    let Some(name) = q.model else {
        return match state.check_ready(Instant::now()) {
            Ok(()) => "ready\n".into_response(),
            Err(why) => unavailable(format!("{why}\n")),
        };
    };
    if !state.discovery_synced() {
        return unavailable("discovery has not synced\n".into());
    }
    if state.readiness().phase() == Phase::Draining {
        return unavailable("shutting down\n".into());
    }
    let Some(resolved) = state.resolve_model(&name) else {
        return (StatusCode::NOT_FOUND, format!("unknown model {name}\n")).into_response();
    };
    let backend = resolved.served_model().to_string();
    if state.tokenizers().blocked_models().contains(&backend) {
        unavailable(format!("tokenizer of {backend} not loaded\n"))
    } else if !state
        .workers_report(Instant::now())
        .workers
        .iter()
        .any(|w| {
            w.routable
                && w.model == backend
                && resolved
                    .lora()
                    .is_none_or(|l| w.lora_adapters.iter().any(|a| a == l))
        })
    {
        unavailable(format!("no routable worker for {backend}\n"))
    } else {
        "ready\n".into_response()
    }
}

/// The preStop hook: drain, then answer once the listeners may close (the kubelet sends
/// SIGTERM after the answer; the router then closes at once, the delay having passed).
async fn drain(State(state): State<RouterState>) -> Response {
    let close_at = state.readiness().start_drain(tokio::time::Instant::now());
    tracing::info!(
        delay_s = close_at
            .saturating_duration_since(tokio::time::Instant::now())
            .as_secs_f64(),
        "draining (preStop)"
    );
    tokio::time::sleep_until(close_at).await;
    "drained\n".into_response()
}

async fn tokenizers(State(state): State<RouterState>) -> Response {
    axum::Json(state.tokenizers().report()).into_response()
}

async fn policies(State(state): State<RouterState>) -> Response {
    axum::Json(state.policies_report()).into_response()
}

async fn workers(State(state): State<RouterState>) -> Response {
    axum::Json(state.workers_report(Instant::now())).into_response()
}

fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(json!({"error": {"message": message.into(), "type": kind}})),
    )
        .into_response()
}

async fn explain(
    State(state): State<RouterState>,
    axum::Extension(pool): axum::Extension<BlockingPool>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("body is not JSON: {e}"),
            );
        }
    };
    if body.get("model").and_then(Value::as_str).is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "body has no string `model`",
        );
    }
    let explained = pool
        .run(Caller::Explain, move || {
            let model = body
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let empty = serde_json::Map::new();
            let obj = body.as_object().unwrap_or(&empty);
            let input =
                PickInput::from_body(model, BodyKind::of("", &body), obj, Some(&headers), &[]);
            state.explain(&input, Instant::now())
        })
        .await;
    let explained = match explained {
        Ok(r) => r,
        Err(PoolError::Full) => {
            let mut resp = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "the router is busy routing other requests; retry later",
            );
            resp.headers_mut()
                .insert(header::RETRY_AFTER, axum::http::HeaderValue::from(1u64));
            return resp;
        }
        Err(PoolError::Panicked) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal_error",
                "internal error",
            );
        }
    };
    match explained {
        Ok(record) => axum::Json(record).into_response(),
        Err(e @ PickError::UnknownModel(_)) => {
            error(StatusCode::NOT_FOUND, "model_not_found", e.to_string())
        }
        Err(e @ PickError::NoReadyWorker(_)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_ready_worker",
            e.to_string(),
        ),
        Err(e @ PickError::TokenizerNotReady { .. }) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "tokenizer_not_ready",
            e.to_string(),
        ),
        Err(e) => policy_refusal(&e),
    }
}

/// A policy refusal as explain shows it: the gateway's status, the message, and the
/// policy and rule that decided it.
fn policy_refusal(e: &PickError) -> Response {
    let (policy, rule) = match e {
        PickError::Rejected { policy, rule, .. } => (Some(policy.as_str()), rule.as_str()),
        PickError::Shed { rule, .. } | PickError::NoLocalCapacity { rule, .. } => {
            (None, rule.as_str())
        }
        _ => (None, ""),
    };
    let gw = crate::gateway::GatewayError::from_policy(e)
        .unwrap_or(crate::gateway::GatewayError::Internal);
    let status = StatusCode::from_u16(gw.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        axum::Json(json!({
            "error": {"message": e.to_string(), "type": e.label()},
            "verdict": {"policy": policy, "rule": rule},
        })),
    )
        .into_response()
}
