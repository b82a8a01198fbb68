//! What the gateway needs from the router (pick a worker, report what happened) and the guard
//! that makes "released exactly once" hold on every path.
//!
//! ```text
//! handler --pick()--> AssignmentGuard (guard) --first_token()--> ... --done()  (release)
//!                          |  dropped without done(): client gone, error, panic
//!                          +--Drop--> Dispatch::abort()                  (release)
//!                          +--failed(kind)--> Dispatch::failed() (passive health + release)
//! ```

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::openai::{Endpoint, Usage};
pub use crate::state::{PickError, Picked, Resolved};

/// The part of a request the router routes on.
#[derive(Debug, Clone, Copy)]
pub struct GatewayRequest<'a> {
    /// The client's model resolved once (served name and pool), by [`Dispatch::resolve_model`].
    pub resolved: &'a Resolved,
    /// The name the client used.
    pub client_model: &'a str,
    /// Which generation API the body is for.
    pub endpoint: Endpoint,
    /// The client's OpenAI body (an object: chat `messages`/`tools`/... or completion
    /// `prompt`); for Anthropic requests, its OpenAI translation.
    pub body: &'a Map<String, Value>,
    /// The client's request headers (for policy rules).
    pub headers: &'a http::HeaderMap,
    /// The verified tenant (`None`: anonymous); see [`crate::tenant`].
    pub tenant: Option<&'a str>,
}

/// The router as the gateway sees it. Implemented by `RouterState`; tests may fake it.
pub trait Dispatch: Send + Sync + 'static {
    /// Names clients may ask for: served model names and aliases.
    fn model_names(&self) -> Vec<String>;
    /// Where a client's model name (an alias or a served name) goes.
    fn resolve_model(&self, client_model: &str) -> Option<Resolved>;
    /// Where a request for `client_model` goes: a split alias draws its model from the
    /// request's `x-request-id` when it has one (so retries resolve alike).
    fn resolve_request(&self, client_model: &str, headers: &http::HeaderMap) -> Option<Resolved> {
        let _ = headers;
        self.resolve_model(client_model)
    }
    /// Chooses a worker, skipping `exclude` (workers that already failed this request).
    fn pick(&self, request: &GatewayRequest<'_>, exclude: &[String]) -> Result<Picked, PickError>;
    /// First generated token observed `ttft` after the request was sent to the worker.
    fn first_token(&self, picked: &Picked, ttft: Duration);
    /// Like [`Dispatch::first_token`], with `served`: the time since the gateway received the
    /// request (its parsing, decision and sending included; `None`: not known). The default
    /// ignores it.
    fn first_token_served(&self, picked: &Picked, ttft: Duration, served: Option<Duration>) {
        let _ = served;
        self.first_token(picked, ttft);
    }
    /// Time between two generated chunks.
    fn inter_token(&self, picked: &Picked, gap: Duration);
    /// Completion: releases the assignment.
    fn done(&self, picked: &Picked, usage: Option<Usage>, e2e: Duration);
    /// Failure, retry or disconnect: releases the assignment.
    fn abort(&self, picked: &Picked);
    /// The worker failed the request (`kind`: connect error, 5xx, stream cut, timeout):
    /// counts toward its passive health (ejection), then releases the assignment. The
    /// default only releases.
    fn failed(&self, picked: &Picked, kind: crate::routing::FailureKind) {
        let _ = kind;
        self.abort(picked);
    }
    /// The tenant auth block of `pool` (`None`: the pool serves anonymous requests). The
    /// default: no pool has one.
    fn pool_auth(&self, _pool: &str) -> Option<Arc<crate::tenant::PoolAuth>> {
        None
    }
    /// Every pool's name and auth block (for unknown models and `/v1/models`). The default:
    /// none.
    fn pool_auths(&self) -> Vec<(String, Option<Arc<crate::tenant::PoolAuth>>)> {
        Vec::new()
    }
    /// What the policy says about leaving the cluster for this request: the overflow action,
    /// whether it must stay local, its tenant. The default never overflows.
    fn overflow_plan(&self, request: &GatewayRequest<'_>) -> super::OverflowPlan {
        let _ = request;
        super::OverflowPlan::default()
    }
}

/// An outstanding assignment. Dropping it without [`AssignmentGuard::done`] aborts it, so every
/// assignment is released exactly once whatever path the request takes.
pub struct AssignmentGuard {
    dispatch: Arc<dyn Dispatch>,
    picked: Picked,
    released: bool,
    first_token_seen: bool,
    tenant: Option<crate::tenant::TenantTap>,
    received_at: Option<std::time::Instant>,
}

impl std::fmt::Debug for AssignmentGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AssignmentGuard")
            .field("picked", &self.picked)
            .field("released", &self.released)
            .finish()
    }
}

impl AssignmentGuard {
    /// Wraps a decision.
    pub fn new(dispatch: Arc<dyn Dispatch>, picked: Picked) -> Self {
        Self {
            dispatch,
            picked,
            released: false,
            first_token_seen: false,
            tenant: None,
            received_at: None,
        }
    }

    /// When the gateway received the request, so the first token is also timed from there.
    #[must_use]
    pub fn received_at(mut self, at: std::time::Instant) -> Self {
        self.received_at = Some(at);
        self
    }

    /// Reports this request's first token and usage for its tenant too; the tap (and its
    /// limit permit) lives as long as the assignment.
    pub fn set_tenant(&mut self, tap: crate::tenant::TenantTap) {
        self.tenant = Some(tap);
    }

    /// Takes the tenant tap back (to move it onto another assignment of the same request).
    pub fn take_tenant(&mut self) -> Option<crate::tenant::TenantTap> {
        self.tenant.take()
    }

    /// The decision.
    pub fn picked(&self) -> &Picked {
        &self.picked
    }

    /// Reports the first token (only the first call counts).
    pub fn first_token(&mut self, ttft: Duration) {
        if !self.first_token_seen && !self.released {
            self.first_token_seen = true;
            let served = self.received_at.map(|t| t.elapsed());
            self.dispatch.first_token_served(&self.picked, ttft, served);
            if let Some(t) = &self.tenant {
                // what the tenant waited: from the gateway's receipt where known
                t.first_token(served.unwrap_or(ttft).as_secs_f64());
            }
        }
    }

    /// Reports an inter-token gap.
    pub fn inter_token(&self, gap: Duration) {
        if !self.released {
            self.dispatch.inter_token(&self.picked, gap);
        }
    }

    /// Completion; releases.
    pub fn done(mut self, usage: Option<Usage>, e2e: Duration) {
        self.released = true;
        if let (Some(t), Some(u)) = (self.tenant.as_mut(), usage) {
            t.done(u.prompt_tokens, u.completion_tokens);
        }
        self.dispatch.done(&self.picked, usage, e2e);
    }

    /// Failure; releases (same as dropping, but explicit at call sites).
    pub fn abort(mut self) {
        self.released = true;
        self.dispatch.abort(&self.picked);
    }

    /// The worker failed the request: counts toward its passive health, releases.
    pub fn failed(mut self, kind: crate::routing::FailureKind) {
        self.released = true;
        self.dispatch.failed(&self.picked, kind);
    }
}

impl Drop for AssignmentGuard {
    fn drop(&mut self) {
        if !self.released {
            self.released = true;
            self.dispatch.abort(&self.picked);
        }
    }
}
