//! The gateway's one call for overflow: route locally, or relay to the policy's provider.
//!
//! ```text
//! handler --forward_or_overflow(route, body, api, raw, tenant tap)-->
//!   pick locally: the decision path evaluates the InferencePolicy; its hooks say the
//!     overflow provider and whether the pool crossed the rule's threshold, stay-local, limits
//!   no local capacity: Dispatch::overflow_plan (the policy on an empty pool: triggers)
//!   the rule's per-tenant limits -> 429 (the local assignment is released)
//!   triggered -> Providers::admit --ok--> release the local assignment, relay
//!                                \-not taken-> local if a worker can take it,
//!                                              else the refusal (503/429 + reason)
//!   else forward with the local assignment (stay-local + no capacity -> 503 NoLocalCapacity)
//! ```
//!
//! Local-only and `pii` requests never reach a provider: [`crate::provider::Providers::admit`]
//! refuses them again even if a plan asked.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderValue;

use super::error::GatewayError;
use super::proxy::{Gateway, Route, Sent};
use crate::provider::{ClientApi, OverflowAction, RelayRequest, should_overflow};
use crate::tenant::{LimitPermit, LimitSpec, TenantTap};

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
    /// The matched rule's per-tenant limits, with their scope (`policy/rule`).
    pub limits: Option<(String, kvroute_policy::Limits)>,
    /// The declared service class ([`crate::state::PolicyHooks::class`]).
    pub class: Option<String>,
}

impl OverflowPlan {
    /// The plan of a decision's policy hooks (the rule decided whether its threshold was
    /// crossed; the action carries no thresholds of its own).
    pub fn of_hooks(hooks: &crate::state::PolicyHooks, tenant: Option<&str>) -> Self {
        Self {
            action: hooks.overflow.as_ref().map(|(provider, _)| OverflowAction {
                provider: provider.clone(),
                ttft_threshold_ms: None,
                queue_threshold: None,
            }),
            stay_local: hooks.stay_local,
            tenant: tenant.map(str::to_string),
            best_local_queue: None,
            limits: hooks
                .limits
                .zip(hooks.rule.as_ref())
                .map(|(l, (p, r))| (format!("{p}/{r}"), l)),
            class: hooks.class.clone(),
        }
    }
}

/// Where a request went. Either way the request's tenant tap went with it: on the local
/// assignment, or in the provider relay.
pub(super) enum Routed {
    /// To a local worker, which answered with headers.
    Local(Box<Sent>),
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
    /// Routes `route` locally or overflows it, per the policy verdict of the local pick (or,
    /// without local capacity, [`super::Dispatch::overflow_plan`]), after the matched rule's
    /// per-tenant limits. `body` is the body for a local worker, `raw` the client's body as
    /// received. `tap` is the request's tenant tap: it learns the service class and takes the
    /// hold on the rule's limits, if one applies, and goes with the request (to the local
    /// assignment or into the provider relay), which reports the first token and the usage
    /// to it and holds it until the answer ends.
    pub(super) async fn forward_or_overflow(
        &self,
        route: Arc<Route>,
        body: Bytes,
        api: ClientApi,
        raw: Bytes,
        mut tap: TenantTap,
    ) -> Result<Routed, GatewayError> {
        let (plan, triggered, first) = match self.pick(&route, &[]).await {
            Ok(a) => {
                let hooks = &a.picked().policy;
                let triggered = hooks.overflow.as_ref().is_some_and(|o| o.1);
                let plan = OverflowPlan::of_hooks(hooks, route.tenant.as_deref());
                (plan, triggered, Some(a))
            }
            Err(e) if no_local_capacity(&e) => {
                let plan = self.dispatch.overflow_plan(&route.request());
                if plan.action.is_none() || self.providers.is_none() {
                    return Err(stay_local_error(e, &plan));
                }
                let queue_full = true;
                let triggered = plan
                    .action
                    .as_ref()
                    .is_some_and(|a| should_overflow(None, None, queue_full, a));
                (plan, triggered, None)
            }
            Err(e) => return Err(e),
        };
        // Dropping `first` on a refusal releases the local assignment.
        let permit = self.policy_permit(&route, plan.limits.as_ref(), &raw)?;
        if let (Some(providers), Some(action), true) =
            (&self.providers, plan.action.as_ref(), triggered)
        {
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
                    tap.routed(plan.class.as_deref());
                    tap.rule_permit = permit;
                    let mut resp = admitted
                        .with_tenant(tap, route.received_at)
                        .relay(&request.headers)
                        .await;
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
            Some(a) => {
                let mut sent = self.forward(route, body, Some(a)).await?;
                tap.routed(sent.assignment.picked().policy.class.as_deref());
                tap.rule_permit = permit;
                sent.assignment.set_tenant(tap);
                Ok(Routed::Local(Box::new(sent)))
            }
            None => Err(stay_local_error(
                GatewayError::NoReadyWorker(route.client_model.clone()),
                &plan,
            )),
        }
    }

    /// Takes the matched rule's per-tenant limits for this request (anonymous requests have
    /// no tenant to limit). Over a limit: 429 with Retry-After.
    fn policy_permit(
        &self,
        route: &Route,
        limits: Option<&(String, kvroute_policy::Limits)>,
        raw: &Bytes,
    ) -> Result<Option<LimitPermit>, GatewayError> {
        let tokens =
            super::tenancy::estimated_tokens(raw.len(), crate::state::max_tokens_of(&route.body));
        rule_permit(&self.tenants, route.tenant.as_deref(), limits, tokens)
    }
}

/// Takes a matched policy rule's per-tenant `limits` (scope, limits) for a request of
/// `tenant` costing about `tokens` (anonymous requests have no tenant to limit). Over a
/// limit: [`GatewayError::TenantLimit`] (429 with Retry-After), counted. Shared by the
/// gateway and the endpoint picker.
pub(crate) fn rule_permit(
    tenants: &crate::tenant::Tenants,
    tenant: Option<&str>,
    limits: Option<&(String, kvroute_policy::Limits)>,
    tokens: u64,
) -> Result<Option<LimitPermit>, GatewayError> {
    let (Some((scope, l)), Some(tenant)) = (limits, tenant) else {
        return Ok(None);
    };
    let spec = LimitSpec {
        requests_per_minute: l
            .requests_per_minute
            .map(|v| u32::try_from(v).unwrap_or(u32::MAX)),
        tokens_per_minute: l.tokens_per_minute,
        max_concurrency: l
            .max_concurrency
            .map(|v| u32::try_from(v).unwrap_or(u32::MAX)),
    };
    tenants
        .limiter
        .acquire(scope, tenant, &spec, tokens, std::time::Instant::now())
        .map(Some)
        .map_err(|e| {
            tenants
                .metrics
                .limited
                .with_label_values(&[e.limit.label()])
                .inc();
            GatewayError::TenantLimit(e)
        })
}
