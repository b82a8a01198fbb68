//! One endpoint-picker decision, through the gateway's own steps: decode the body with the
//! gateway's OpenAI / Anthropic parsers, check the caller and the client's credentials against
//! the model's pool (tenancy), pick with [`Dispatch::pick`] (InferencePolicy verdict, routing
//! policy, assignment), take the matched rule's per-tenant limits, and hold the assignment in
//! the gateway's [`AssignmentGuard`] (released exactly once, whatever ends the stream).
//!
//! ```text
//! path + headers + body --decode (openai | anthropic)--> model, OpenAI body
//!   --authorize_pick (mTLS picker of the model's pool)--> --tenancy::admit--> tenant, permit
//!   --subset hint: Dispatch::pick excluding every routable worker outside it-->
//!   AssignmentGuard + [primary, fallbacks (in the subset)] + the body to send (model rewritten
//!   for an alias)
//! ```
//!
//! Runs on the decision pool (it tokenizes); nothing here touches a socket.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{Map, Value};

use super::protocol::{Subset, same_endpoint};
use crate::auth::{Caller, PickRefused, authorize_pick};
use crate::gateway::openai::{self, Endpoint};
use crate::gateway::{
    AssignmentGuard, Dispatch, GatewayError, GatewayRequest, OverflowPlan, Resolved, anthropic,
};
use crate::state::{RouterState, max_tokens_of};

/// The generation APIs the picker routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// OpenAI chat completions or completions.
    OpenAi(Endpoint),
    /// Anthropic messages.
    Messages,
}

impl Api {
    /// The API of a request path (the query ignored).
    pub fn of_path(path: &str) -> Result<Self, GatewayError> {
        match path.split('?').next().unwrap_or_default() {
            "/v1/chat/completions" => Ok(Api::OpenAi(Endpoint::ChatCompletions)),
            "/v1/completions" => Ok(Api::OpenAi(Endpoint::Completions)),
            "/v1/messages" => Ok(Api::Messages),
            _ => Err(GatewayError::InvalidField {
                field: ":path".into(),
                reason: "the endpoint picker routes POST /v1/chat/completions, /v1/completions and /v1/messages".into(),
            }),
        }
    }
}

/// A whole request, as the data plane sent it.
pub struct EppRequest {
    /// `:path`.
    pub path: String,
    /// The request headers (credentials, policy headers).
    pub headers: HeaderMap,
    /// The body, as received.
    pub body: Bytes,
    /// The data plane's subset hint.
    pub subset: Subset,
    /// Who called the picker.
    pub caller: Caller,
    /// Fallback endpoints to list after the primary at most.
    pub max_fallbacks: usize,
}

/// Why no destination was picked.
#[derive(Debug)]
pub enum Refusal {
    /// A refusal the client gets as an immediate response, in the gateway's error shape.
    Client(GatewayError),
    /// The data plane's certificate may not pick for this model (a gRPC error: a proxy
    /// misconfiguration, not the client's fault).
    Caller(PickRefused),
}

impl From<GatewayError> for Refusal {
    fn from(e: GatewayError) -> Self {
        Refusal::Client(e)
    }
}

/// The routing-relevant part of a request, kept until the response says which endpoint
/// served it (to move the assignment when a fallback did).
pub struct Held {
    resolved: Resolved,
    client_model: String,
    endpoint: Endpoint,
    body: Map<String, Value>,
    headers: HeaderMap,
    tenant: Option<String>,
}

impl Held {
    fn request(&self) -> GatewayRequest<'_> {
        GatewayRequest {
            resolved: &self.resolved,
            client_model: &self.client_model,
            endpoint: self.endpoint,
            body: &self.body,
            headers: &self.headers,
            tenant: self.tenant.as_deref(),
        }
    }
}

/// A picked destination.
pub struct Decided {
    /// The assignment (dropped without `done`: aborted).
    pub guard: AssignmentGuard,
    /// The primary endpoint, then the fallbacks.
    pub endpoints: Vec<String>,
    /// The body to send on.
    pub body: Vec<u8>,
    /// `body` differs from what the client sent (the model was an alias).
    pub rewritten: bool,
    /// What a reassignment needs.
    pub held: Held,
}

/// Picks a destination for `req` through the gateway's decision path.
pub fn decide(
    state: &RouterState,
    dispatch: &Arc<dyn Dispatch>,
    req: EppRequest,
) -> Result<Decided, Refusal> {
    let api = Api::of_path(&req.path)?;
    let (model, endpoint, body) = match api {
        Api::OpenAi(endpoint) => {
            let r = openai::decode_request(endpoint, &req.body)?;
            (r.model, endpoint, r.body)
        }
        Api::Messages => {
            let r = anthropic::decode_request(&req.body)?;
            (r.model, Endpoint::ChatCompletions, r.chat)
        }
    };
    // The caller first: a data plane of another pool learns nothing about this one's tenants.
    let pool = state
        .resolve_with_headers(&model, Some(&req.headers))
        .and_then(|r| r.pool);
    authorize_pick(&req.caller, &model, pool.as_deref()).map_err(Refusal::Caller)?;
    // A verified picker (the pool's data plane) may name the tenant in `x-kvroute-tenant`,
    // as on the Pick API.
    let trusted = matches!(
        req.caller,
        Caller::Verified {
            identity: kvroute_tls::Identity::Picker { .. },
            ..
        }
    );
    let tokens = crate::gateway::tenancy::estimated_tokens(req.body.len(), max_tokens_of(&body));
    let tenants = state.tenants();
    let admitted = crate::gateway::tenancy::admit(
        dispatch.as_ref(),
        tenants,
        &model,
        &req.headers,
        None,
        trusted,
        tokens,
        None,
    )?;
    let held = Held {
        resolved: admitted.resolved,
        client_model: model.clone(),
        endpoint,
        body,
        headers: req.headers,
        tenant: admitted.tenant.clone(),
    };
    let exclude = match &req.subset {
        Subset::Any => Vec::new(),
        Subset::Only(list) if list.is_empty() => {
            return Err(GatewayError::NoReadyWorker(model).into());
        }
        Subset::Only(_) => state.routable_outside(&held.resolved, |a| req.subset.admits(a)),
    };
    let picked = dispatch
        .pick(&held.request(), &exclude)
        .map_err(|e| GatewayError::from_pick(&e, &model))?;
    let mut guard = AssignmentGuard::new(dispatch.clone(), picked);
    // A worker that appeared between the exclusion and the pick: never outside the subset.
    if !req.subset.admits(&guard.picked().address) {
        return Err(GatewayError::NoReadyWorker(model).into());
    }
    // The rule's overflow cannot be taken here (the data plane routes to the pool's
    // endpoints only): the request stays local, as when a provider refuses.
    let plan = OverflowPlan::of_hooks(&guard.picked().policy, held.tenant.as_deref());
    let rule_permit = crate::gateway::overflow::rule_permit(
        tenants,
        held.tenant.as_deref(),
        plan.limits.as_ref(),
        tokens,
    )?;
    let mut tap =
        crate::gateway::tenancy::tap(tenants, &model, admitted.tenant.clone(), admitted.permit);
    tap.rule_permit = rule_permit;
    guard.set_tenant(tap);

    let picked = guard.picked();
    let mut endpoints = vec![picked.address.clone()];
    for f in &picked.fallbacks {
        if endpoints.len() > req.max_fallbacks {
            break;
        }
        if req.subset.admits(f) && !endpoints.iter().any(|e| same_endpoint(e, f)) {
            endpoints.push(f.clone());
        }
    }
    let (body, rewritten) = if picked.backend_model == model {
        (req.body.to_vec(), false)
    } else {
        // The body parsed above as an object; only `model` changes.
        let mut obj: Map<String, Value> = serde_json::from_slice(&req.body)
            .map_err(|e| GatewayError::MalformedJson(e.to_string()))?;
        obj.insert("model".into(), Value::String(picked.backend_model.clone()));
        let bytes = serde_json::to_vec(&obj).map_err(|_| GatewayError::Internal)?;
        (bytes, true)
    };
    Ok(Decided {
        guard,
        endpoints,
        body,
        rewritten,
        held,
    })
}

/// Moves a request's accounting to `served`, the fallback endpoint that took it: a pick
/// restricted to that endpoint through the same decision path. `Err` when it is no longer
/// routable (the original assignment then stays).
pub fn reassign(
    state: &RouterState,
    dispatch: &Arc<dyn Dispatch>,
    held: &Held,
    served: &str,
) -> Result<AssignmentGuard, GatewayError> {
    let exclude = state.routable_outside(&held.resolved, |a| same_endpoint(a, served));
    let picked = dispatch
        .pick(&held.request(), &exclude)
        .map_err(|e| GatewayError::from_pick(&e, &held.client_model))?;
    let guard = AssignmentGuard::new(dispatch.clone(), picked);
    if same_endpoint(&guard.picked().address, served) {
        Ok(guard)
    } else {
        Err(GatewayError::NoReadyWorker(held.client_model.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            Api::of_path("/v1/chat/completions?x=1").ok(),
            Some(Api::OpenAi(Endpoint::ChatCompletions))
        );
        assert_eq!(
            Api::of_path("/v1/completions").ok(),
            Some(Api::OpenAi(Endpoint::Completions))
        );
        assert_eq!(Api::of_path("/v1/messages").ok(), Some(Api::Messages));
        let e = Api::of_path("/v1/embeddings").expect_err("unsupported");
        assert_eq!(e.status(), 400);
    }
}
