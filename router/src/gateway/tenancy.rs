//! The gateway's tenant step, between decoding a body and routing it: who is calling (the
//! model's pool decides how to check), whether the tenant's limits admit the request, and the
//! tap that reports its TTFT and tokens per tenant.
//!
//! ```text
//! model --resolve--> pool --Dispatch::pool_auth--> Authenticator::authenticate(headers, peer)
//!    401/403 (WWW-Authenticate) <--+            +--> tenant | anonymous
//! unknown model: 401 when some pool needs auth and the credentials pass none of them, else 404
//! tenant --limits (policy rule, or --tenant-default-limits)--> TenantLimiter::acquire --> 429
//!    --> TenantTap on the AssignmentGuard: first token, usage (settles the token charge)
//! ```
//!
//! An unauthenticated caller cannot tell a model that needs credentials from one that does
//! not exist: both answer 401 whenever some pool requires auth.

use std::net::IpAddr;
use std::time::{Instant, SystemTime};

use axum::http::HeaderMap;

use super::dispatch::{Dispatch, Resolved};
use super::error::GatewayError;
use crate::tenant::{Credentials, LimitPermit, LimitSpec, Tenants};

/// The service-class label of tenant metrics for a request without a declared class
/// (docs/control-plane.md, "Tenant metrics").
pub const DEFAULT_CLASS: &str = "default";

/// The tenant tap of an admitted request (series labels, and the limit permit).
pub(crate) fn tap(
    tenants: &Tenants,
    model: &str,
    admitted_tenant: Option<String>,
    permit: LimitPermit,
) -> crate::tenant::TenantTap {
    crate::tenant::TenantTap::new(tenants.metrics.clone(), model, admitted_tenant, permit)
}

/// A request the tenant step let through.
pub(crate) struct Admitted {
    /// Where the model goes.
    pub resolved: Resolved,
    /// The verified tenant (`None`: anonymous).
    pub tenant: Option<String>,
    /// The hold on the tenant's limits (released when the request ends).
    pub permit: LimitPermit,
}

/// A rough prompt size before tokenizing: a byte count / 4 (settled to the worker's usage).
pub(crate) fn estimated_tokens(body_bytes: usize, max_tokens: Option<u32>) -> u64 {
    (body_bytes as u64).div_ceil(4) + u64::from(max_tokens.unwrap_or(0))
}

/// Authenticates the caller of `model` and takes its limits. `limits`: the policy's limits
/// for this request (scope, spec), or `None` for the router's default.
/// `trusted_caller`: the caller may name the tenant in `x-kvroute-tenant` whatever its IP
/// (the Pick API's mTLS picker).
#[allow(clippy::too_many_arguments)]
pub(crate) fn admit(
    dispatch: &dyn Dispatch,
    tenants: &Tenants,
    model: &str,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
    trusted_caller: bool,
    tokens: u64,
    limits: Option<(&str, LimitSpec)>,
) -> Result<Admitted, GatewayError> {
    let creds = Credentials::from_headers(headers, peer, trusted_caller);
    let auth = &tenants.authenticator;
    let now = SystemTime::now();
    let Some(resolved) = dispatch.resolve_request(model, headers) else {
        let guarded: Vec<_> = dispatch
            .pool_auths()
            .into_iter()
            .filter_map(|(_, a)| a)
            .collect();
        if guarded.is_empty() {
            return Err(GatewayError::UnknownModel(model.to_string()));
        }
        let mut first_error = None;
        for a in &guarded {
            match auth.authenticate(Some(a), &creds, now) {
                Ok(Some(_)) => return Err(GatewayError::UnknownModel(model.to_string())),
                Ok(None) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let e = first_error.unwrap_or(crate::tenant::AuthError::MissingCredentials);
        auth.count(&Err(e), false);
        return Err(GatewayError::Auth(e));
    };
    let pool_auth = resolved.pool.as_deref().and_then(|p| dispatch.pool_auth(p));
    let result = auth.authenticate(pool_auth.as_deref(), &creds, now);
    auth.count(&result, pool_auth.is_none());
    let tenant = result.map_err(GatewayError::Auth)?;
    let permit = match (
        tenant.as_deref(),
        limits.or_else(|| tenants.default_limits_for(tenant.as_deref())),
    ) {
        (Some(t), Some((scope, spec))) => tenants
            .limiter
            .acquire(scope, t, &spec, tokens, Instant::now())
            .map_err(|e| {
                tenants
                    .metrics
                    .limited
                    .with_label_values(&[e.limit.label()])
                    .inc();
                GatewayError::TenantLimit(e)
            })?,
        _ => LimitPermit::unlimited(),
    };
    Ok(Admitted {
        resolved,
        tenant,
        permit,
    })
}

/// The models a caller may see in `GET /v1/models`: those of pools without auth or whose auth
/// its credentials pass, and models outside every pool. `Err` when some pool needs auth and
/// the caller sees nothing.
pub(crate) fn visible_models(
    dispatch: &dyn Dispatch,
    tenants: &Tenants,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
) -> Result<Vec<String>, GatewayError> {
    let names = dispatch.model_names();
    let pools = dispatch.pool_auths();
    if pools.iter().all(|(_, a)| a.is_none()) {
        return Ok(names);
    }
    let creds = Credentials::from_headers(headers, peer, false);
    let now = SystemTime::now();
    let mut first_error = None;
    let mut open_pools: Vec<&str> = Vec::new();
    for (name, a) in &pools {
        match tenants
            .authenticator
            .authenticate(a.as_deref(), &creds, now)
        {
            Ok(_) => open_pools.push(name),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let visible: Vec<String> = names
        .into_iter()
        .filter(|m| {
            dispatch
                .resolve_model(m)
                .is_some_and(|r| r.pool.as_deref().is_none_or(|p| open_pools.contains(&p)))
        })
        .collect();
    match first_error {
        Some(e) if visible.is_empty() => Err(GatewayError::Auth(e)),
        _ => Ok(visible),
    }
}
