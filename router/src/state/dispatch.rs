//! The embedded gateway's view of the router: [`crate::gateway::Dispatch`] over the state.
//!
//! ```text
//! gateway --resolve_model--> Resolved --pick(GatewayRequest{resolved, body})--> Picked
//!         --first_token / inter_token / done / abort--> RouterState reports
//! ```

use std::time::{Duration, Instant};

use super::RouterState;
use super::catalog::Resolved;
use super::pick::{BodyKind, PickError, PickInput, Picked, Usage};
use crate::gateway::openai::Endpoint;
use crate::gateway::{Dispatch, GatewayRequest};

impl Dispatch for RouterState {
    fn model_names(&self) -> Vec<String> {
        self.models().into_iter().map(|m| m.id).collect()
    }

    fn resolve_model(&self, client_model: &str) -> Option<Resolved> {
        RouterState::resolve_model(self, client_model)
    }

    fn resolve_request(&self, client_model: &str, headers: &http::HeaderMap) -> Option<Resolved> {
        self.resolve_with_headers(client_model, Some(headers))
    }

    fn pick(&self, request: &GatewayRequest<'_>, exclude: &[String]) -> Result<Picked, PickError> {
        let kind = match request.endpoint {
            Endpoint::ChatCompletions => BodyKind::Chat,
            Endpoint::Completions => BodyKind::Completion,
        };
        let mut input = PickInput::from_body(
            request.client_model,
            kind,
            request.body,
            Some(request.headers),
            exclude,
        );
        input.resolved = Some(request.resolved);
        input.tenant = request.tenant;
        RouterState::pick(self, &input, Instant::now())
    }

    fn overflow_plan(&self, request: &GatewayRequest<'_>) -> crate::gateway::OverflowPlan {
        let kind = match request.endpoint {
            Endpoint::ChatCompletions => BodyKind::Chat,
            Endpoint::Completions => BodyKind::Completion,
        };
        let mut input = PickInput::from_body(
            request.client_model,
            kind,
            request.body,
            Some(request.headers),
            &[],
        );
        input.resolved = Some(request.resolved);
        input.tenant = request.tenant;
        let Some(hooks) = self.hooks_without_capacity(&input) else {
            return crate::gateway::OverflowPlan::default();
        };
        crate::gateway::OverflowPlan::of_hooks(&hooks, request.tenant)
    }

    fn pool_auth(&self, pool: &str) -> Option<std::sync::Arc<crate::tenant::PoolAuth>> {
        RouterState::pool_auth(self, pool)
    }

    fn pool_auths(&self) -> Vec<(String, Option<std::sync::Arc<crate::tenant::PoolAuth>>)> {
        RouterState::pool_auths(self)
    }

    fn first_token(&self, picked: &Picked, ttft: Duration) {
        Dispatch::first_token_served(self, picked, ttft, None);
    }

    fn first_token_served(&self, picked: &Picked, ttft: Duration, served: Option<Duration>) {
        RouterState::first_token_served(
            self,
            picked.assignment,
            Some(ttft.as_secs_f64()),
            served.map(|s| s.as_secs_f64()),
            Instant::now(),
        );
    }

    fn inter_token(&self, picked: &Picked, gap: Duration) {
        self.observe_itl(picked.assignment, gap.as_secs_f64());
    }

    fn done(&self, picked: &Picked, usage: Option<crate::gateway::openai::Usage>, e2e: Duration) {
        let sat = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        let usage = Usage {
            prompt_tokens: usage.map_or(0, |u| sat(u.prompt_tokens)),
            cached_prompt_tokens: usage.map_or(0, |u| sat(u.cached_tokens)),
            completion_tokens: usage.map_or(0, |u| sat(u.completion_tokens)),
            e2e_seconds: Some(e2e.as_secs_f64()),
        };
        RouterState::done(self, picked.assignment, usage);
    }

    fn abort(&self, picked: &Picked) {
        RouterState::abort(self, picked.assignment, "gateway");
    }

    fn failed(&self, picked: &Picked, kind: crate::routing::FailureKind) {
        RouterState::failed(self, picked.assignment, kind);
    }
}
