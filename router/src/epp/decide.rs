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
    // Counted even when no decision follows (dropped with the error).
    let mut tap =
        crate::gateway::tenancy::tap(tenants, &model, admitted.tenant.clone(), admitted.permit);
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
    tap.rule_permit = rule_permit;
    tap.routed(plan.class.as_deref());
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
        let bytes = crate::gateway::openai::with_model(&req.body, &picked.backend_model)
            .ok_or_else(|| GatewayError::MalformedJson("not a JSON object".into()))?;
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
    use crate::metrics::RouterMetrics;
    use crate::state::{RouterConfig, SidecarIdentity};
    use std::time::Instant;

    /// A state routing `tiny` to three workers (`wN:8000`) that only sidecars report.
    fn state() -> (RouterState, Arc<dyn Dispatch>) {
        let metrics = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let cfg = RouterConfig {
            route_unlisted: true,
            seed: 3,
            ..RouterConfig::default()
        };
        let s = RouterState::new(cfg, metrics).expect("state");
        for (i, id) in ["w0", "w1", "w2"].iter().enumerate() {
            let identity = SidecarIdentity {
                worker_id: (*id).into(),
                address: format!("{id}:8000"),
                model: "tiny".into(),
                block_size: 4,
                epoch: 1,
                worker_set: "ws".into(),
            };
            let now = Instant::now();
            s.sidecar_snapshot_start(i as u64, &identity, &[], now)
                .expect("snapshot");
            assert!(s.sidecar_snapshot_chunk(i as u64, id, &[], true, now));
        }
        let d: Arc<dyn Dispatch> = Arc::new(s.clone());
        (s, d)
    }

    fn request(path: &str, body: serde_json::Value, subset: Subset) -> EppRequest {
        EppRequest {
            path: path.into(),
            headers: HeaderMap::new(),
            body: Bytes::from(body.to_string()),
            subset,
            caller: Caller::Anonymous,
            max_fallbacks: 2,
        }
    }

    fn chat() -> serde_json::Value {
        serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    }

    #[test]
    fn a_decision_names_the_primary_and_distinct_fallbacks_and_holds_one_assignment() {
        let (s, d) = state();
        let decided = decide(&s, &d, request("/v1/chat/completions", chat(), Subset::Any))
            .unwrap_or_else(|_| panic!("routed"));
        assert_eq!(decided.endpoints.len(), 3);
        assert_eq!(decided.endpoints[0], decided.guard.picked().address);
        let mut distinct = decided.endpoints.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3);
        assert!(!decided.rewritten);
        assert_eq!(s.in_flight(), 1);
        drop(decided);
        assert_eq!(s.in_flight(), 0, "dropping the decision releases it");
    }

    #[test]
    fn the_subset_hint_restricts_primary_and_fallbacks() {
        let (s, d) = state();
        for only in ["w0:8000", "w1:8000", "w2:8000"] {
            let subset = Subset::Only(vec![only.into(), "192.0.2.1:9".into()]);
            let decided = decide(
                &s,
                &d,
                request(
                    "/v1/completions",
                    serde_json::json!({"model": "tiny", "prompt": "hi"}),
                    subset,
                ),
            )
            .unwrap_or_else(|_| panic!("routed"));
            assert_eq!(decided.endpoints, vec![only.to_string()]);
        }
        for subset in [
            Subset::Only(Vec::new()),
            Subset::Only(vec!["192.0.2.1:9".into()]),
        ] {
            match decide(&s, &d, request("/v1/chat/completions", chat(), subset)) {
                Err(Refusal::Client(e)) => assert_eq!(e.status(), 503),
                Err(other) => panic!("expected 503, got {other:?}"),
                Ok(_) => panic!("expected 503, got a destination"),
            }
        }
        assert_eq!(s.in_flight(), 0);
    }

    #[test]
    fn anthropic_bodies_route_and_bad_bodies_are_client_errors() {
        let (s, d) = state();
        let body = serde_json::json!({"model": "tiny", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]});
        let decided = decide(&s, &d, request("/v1/messages", body.clone(), Subset::Any))
            .unwrap_or_else(|_| panic!("routed"));
        assert_eq!(
            decided.body,
            body.to_string().into_bytes(),
            "sent on as received"
        );
        drop(decided);
        let mut bad = request("/v1/chat/completions", chat(), Subset::Any);
        bad.body = Bytes::from_static(b"{not json");
        match decide(&s, &d, bad) {
            Err(Refusal::Client(e)) => assert_eq!(e.status(), 400),
            _ => panic!("expected 400"),
        }
        match decide(
            &s,
            &d,
            request(
                "/v1/chat/completions",
                serde_json::json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
                Subset::Any,
            ),
        ) {
            Err(Refusal::Client(e)) => assert_eq!(e.status(), 404),
            _ => panic!("expected 404"),
        }
        assert_eq!(s.in_flight(), 0);
    }

    #[test]
    fn a_fallback_that_served_takes_over_the_accounting() {
        let (s, d) = state();
        let decided = decide(&s, &d, request("/v1/chat/completions", chat(), Subset::Any))
            .unwrap_or_else(|_| panic!("routed"));
        let fallback = decided.endpoints[1].clone();
        let moved = reassign(&s, &d, &decided.held, &fallback).expect("reassigned");
        assert_eq!(moved.picked().address, fallback);
        assert_eq!(s.in_flight(), 2);
        drop(decided);
        assert_eq!(s.in_flight(), 1);
        drop(moved);
        assert_eq!(s.in_flight(), 0);
        assert!(
            reassign(
                &s,
                &d,
                &{
                    let decided =
                        decide(&s, &d, request("/v1/chat/completions", chat(), Subset::Any))
                            .unwrap_or_else(|_| panic!("routed"));
                    decided.held
                },
                "192.0.2.1:9"
            )
            .is_err()
        );
    }

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
