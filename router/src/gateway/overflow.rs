//! The gateway's one call for overflow: route locally, or relay to the policy's provider.
//!
//! ```text
//! handler --forward_or_overflow(route, body, api, raw)-->
//!   plan = Dispatch::overflow_plan(request)            (policy: action, stay-local, tenant)
//!   no action: forward locally (stay-local + no capacity -> 503 NoLocalCapacity)
//!   action:    pick locally (predicted TTFT) --should_overflow?--
//!                no  -> forward with that assignment
//!                yes -> Providers::admit --ok--> abort the local assignment, relay
//!                                         \-not taken-> local if a worker can take it,
//!                                                       else the refusal (503/429 + reason)
//! ```
//!
//! Local-only and `pii` requests never reach a provider: [`crate::provider::Providers::admit`]
//! refuses them again even if a plan asked.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;

use super::dispatch::AssignmentGuard;
use super::error::GatewayError;
use super::proxy::{Gateway, Route, Sent};
use crate::provider::{ClientApi, OverflowAction, RelayRequest, should_overflow};

/// Response header naming the provider an overflowed request went to (only with
/// `--expose-routing-headers`).
pub const PROVIDER_HEADER: &str = "x-kvroute-provider";

/// The policy's verdict on leaving the cluster, for one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverflowPlan {
    /// Overflow action of the matching rule, if any.
    pub action: Option<OverflowAction>,
    /// The request must stay local (a local-only rule, or `pii` labels): see
    /// [`crate::provider::must_stay_local`].
    pub stay_local: bool,
    /// The verified tenant (usage accounting).
    pub tenant: Option<String>,
    /// Waiting requests at the best local worker, when the policy engine knows it.
    pub best_local_queue: Option<u32>,
}

/// Where a request went.
pub(super) enum Routed {
    /// To a local worker, which answered with headers.
    Local(Sent),
    /// To a provider: the client's response.
    Provider(axum::response::Response),
}

/// No local worker can take the request (as opposed to a bad request or a broken worker).
fn no_local_capacity(e: &GatewayError) -> bool {
    matches!(
        e,
        GatewayError::NoReadyWorker(_) | GatewayError::DecisionPoolFull
    )
}

fn stay_local_error(e: GatewayError, plan: &OverflowPlan) -> GatewayError {
    if plan.stay_local && no_local_capacity(&e) {
        GatewayError::NoLocalCapacity(
            "the request must stay on local workers (local-only or personal data) and none can take it now; retry later".into(),
        )
    } else {
        e
    }
}

impl Gateway {
    /// Routes `route` locally or overflows it, per [`super::Dispatch::overflow_plan`].
    /// `body` is the body for a local worker, `raw` the client's body as received.
    pub(super) async fn forward_or_overflow(
        &self,
        route: Arc<Route>,
        body: Bytes,
        api: ClientApi,
        raw: Bytes,
    ) -> Result<Routed, GatewayError> {
        let plan = self.dispatch.overflow_plan(&route.request());
        let (Some(providers), Some(action)) = (&self.providers, plan.action.as_ref()) else {
            return self
                .forward(route, body, None)
                .await
                .map(Routed::Local)
                .map_err(|e| stay_local_error(e, &plan));
        };
        let first = self.pick(&route, &[]).await;
        let (ttft, queue_full) = match &first {
            Ok(a) => (Some(a.picked().predicted_ttft_s), false),
            Err(e) if no_local_capacity(e) => (None, true),
            Err(_) => (None, false),
        };
        let first: Option<AssignmentGuard> = match first {
            Ok(a) => Some(a),
            Err(e) if !queue_full => return Err(e),
            Err(_) => None,
        };
        if should_overflow(ttft, plan.best_local_queue, queue_full, action) {
            let request = RelayRequest {
                api,
                raw,
                client_model: route.client_model.clone(),
                backend_model: route.resolved.backend_model.clone(),
                headers: route.headers.clone(),
                tenant: plan.tenant.clone(),
            };
            match providers.admit(&action.provider, &request, plan.stay_local) {
                Ok(admitted) => {
                    // The local assignment is released before the provider is called.
                    drop(first);
                    let mut resp = admitted.relay(&request.headers).await;
                    if self.expose_routing_headers
                        && let Ok(v) = HeaderValue::from_str(&action.provider)
                    {
                        resp.headers_mut().insert(PROVIDER_HEADER, v);
                    }
                    return Ok(Routed::Provider(resp));
                }
                Err(refused) if first.is_none() => return Err(refused.error(&action.provider)),
                Err(refused) => {
                    tracing::debug!(provider = %action.provider, reason = refused.label(), "overflow not taken; serving locally");
                }
            }
        }
        match first {
            Some(a) => self.forward(route, body, Some(a)).await.map(Routed::Local),
            None => Err(stay_local_error(
                GatewayError::NoReadyWorker(route.client_model.clone()),
                &plan,
            )),
        }
    }
}
