//! Tenants: who is calling ([`identity`]: API keys, JWTs, a tenant header from trusted peers),
//! how much each may use ([`limits`]) and how they show in metrics ([`metrics`]).
//!
//! ```text
//! request headers + peer --Credentials--+
//! model --resolve--> pool --PoolAuth----+--Authenticator::authenticate--> Some(tenant) | None (anonymous)
//!            api keys: SecretFiles (--secrets-dir, re-read every 2 s) --KeyTable (sha256)
//!            JWTs:     JwksStore (Secret file or https URL, cached)   --jwt::verify (RS256/ES256)
//! tenant --TenantLimiter::acquire(scope, tenant, LimitSpec, tokens)--> LimitPermit | 429
//! tenant --TenantMetrics::tenant_label (allow-list)--> label: name | other | anonymous
//! ```
//!
//! Pure pieces ([`apikeys`], [`jwt`], [`limits`]) take their inputs and `now` as arguments;
//! [`secrets`] and [`jwks`] read files and URLs; [`Tenants`] bundles what the gateway and the
//! Pick API share. Nothing here reads Secrets from the API server: the operator mounts them
//! under `--secrets-dir` (docs/control-plane.md, "Tenant identity").

pub mod apikeys;
pub mod identity;
pub mod jwks;
pub mod jwt;
pub mod limits;
pub mod metrics;
pub mod refresh;
pub mod secrets;

use std::path::PathBuf;
use std::sync::Arc;

pub use identity::{AuthError, Authenticator, Credentials, PoolAuth, TENANT_HEADER};
pub use limits::{LimitExceeded, LimitKind, LimitPermit, LimitSpec, TenantLimiter};
pub use metrics::TenantMetrics;

/// Is `s` a tenant name: `[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?` (a DNS label)?
pub fn valid_tenant(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(inner)
        && b.last().is_some_and(inner)
        && b.iter().all(|c| inner(c) || *c == b'-')
}

/// What a running request reports about its tenant: the request itself, TTFT and tokens per
/// (model, class, tenant), and the settlement of its token charge. Its limit permit ends when
/// it is dropped (with the gateway's assignment guard, or the Pick API's decision id).
///
/// Every admitted request is counted once: by [`TenantTap::routed`] in the class of its
/// decision, or, when it ends before one (no ready worker, a policy reject or shed, a failed
/// send), on drop in the `default` class.
#[derive(Debug)]
pub struct TenantTap {
    /// Where the series live.
    pub metrics: TenantMetrics,
    /// The client-facing model (a known name).
    pub model: String,
    /// The service class label.
    pub class: String,
    /// The verified tenant.
    pub tenant: Option<String>,
    /// The hold on the tenant's limits.
    pub permit: LimitPermit,
    /// The hold on the matched policy rule's limits, when a rule limits this request (both
    /// holds last as long as the request and are settled to its usage).
    pub rule_permit: Option<LimitPermit>,
    /// The request is counted already.
    counted: bool,
}

impl Drop for TenantTap {
    fn drop(&mut self) {
        if !self.counted {
            self.metrics
                .admitted(&self.model, &self.class, self.tenant.as_deref());
        }
    }
}

impl TenantTap {
    /// The tap of a request of `tenant` for `model` (class `default` until routed), holding
    /// `permit`.
    pub fn new(
        metrics: TenantMetrics,
        model: &str,
        tenant: Option<String>,
        permit: LimitPermit,
    ) -> Self {
        Self {
            metrics,
            model: model.to_string(),
            class: crate::gateway::DEFAULT_CLASS.to_string(),
            tenant,
            permit,
            rule_permit: None,
            counted: false,
        }
    }

    /// The request was routed (to a local worker or a provider) in service `class` (a
    /// declared class, [`crate::state::PolicyHooks::class`]; `None`: `default`): counted,
    /// and the class labels the request's TTFT and tokens from now on.
    pub fn routed(&mut self, class: Option<&str>) {
        if self.counted {
            return;
        }
        if let Some(c) = class {
            self.class = c.to_string();
        }
        self.counted = true;
        self.metrics
            .admitted(&self.model, &self.class, self.tenant.as_deref());
    }

    /// The first token came after `ttft_s`.
    pub fn first_token(&self, ttft_s: f64) {
        self.metrics
            .first_token(&self.model, &self.class, self.tenant.as_deref(), ttft_s);
    }

    /// The request ended with this usage: counted, and the token charge settled.
    pub fn done(&mut self, prompt: u64, completion: u64) {
        self.metrics.usage(
            &self.model,
            &self.class,
            self.tenant.as_deref(),
            prompt,
            completion,
        );
        self.permit.settle(prompt.saturating_add(completion));
        if let Some(p) = self.rule_permit.as_mut() {
            p.settle(prompt.saturating_add(completion));
        }
    }
}

/// Tenant settings from the router's flags.
#[derive(Clone, Debug)]
pub struct TenantConfig {
    /// `--secrets-dir`: Secrets mounted as `<dir>/<secret>/<key>` (unset: no Secrets).
    pub secrets_dir: Option<PathBuf>,
    /// `--router-replicas`: how many router replicas share each tenant limit.
    pub replicas: u32,
    /// `--tenant-default-limits`: limits of every tenant that no policy rule limits.
    pub default_limits: Option<LimitSpec>,
    /// `--tenant-metrics-allow`: tenants that get their own metric label.
    pub metrics_allow: Vec<String>,
}

impl Default for TenantConfig {
    fn default() -> Self {
        Self {
            secrets_dir: None,
            replicas: 1,
            default_limits: None,
            metrics_allow: Vec::new(),
        }
    }
}

/// What the gateway and the Pick API share: the authenticator, the limiter, the metrics.
pub struct Tenants {
    /// Verifies credentials.
    pub authenticator: Authenticator,
    /// Per-tenant limits of this replica.
    pub limiter: TenantLimiter,
    /// Tenant-labelled series and the auth counters.
    pub metrics: TenantMetrics,
    /// Limits of every tenant no policy rule limits.
    pub default_limits: Option<LimitSpec>,
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenants")
            .field("default_limits", &self.default_limits)
            .finish_non_exhaustive()
    }
}

impl Tenants {
    /// Built from the flags, its metrics registered in `registry`.
    pub fn new(
        cfg: &TenantConfig,
        registry: &prometheus::Registry,
    ) -> Result<Arc<Self>, prometheus::Error> {
        let metrics = TenantMetrics::register(registry, &cfg.metrics_allow)?;
        Ok(Arc::new(Self {
            authenticator: Authenticator::new(cfg.secrets_dir.clone(), metrics.clone()),
            limiter: TenantLimiter::new(cfg.replicas, limits::DEFAULT_MAX_ENTRIES),
            metrics,
            default_limits: cfg.default_limits,
        }))
    }

    /// With default settings and metrics in a registry of their own (tests, benches).
    pub fn unregistered() -> Arc<Self> {
        Self::new(&TenantConfig::default(), &prometheus::Registry::new())
            .expect("the tenant metric names are valid")
    }

    /// The limits that apply to `tenant` when no policy rule sets any: the router's
    /// `--tenant-default-limits`, for tenants only (anonymous requests are not limited per
    /// tenant). Returns the scope name and the spec.
    pub fn default_limits_for(&self, tenant: Option<&str>) -> Option<(&'static str, LimitSpec)> {
        tenant?;
        self.default_limits.map(|s| ("default", s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names() {
        for ok in ["a", "team-a", "0", "a1-b2", &"x".repeat(63)] {
            assert!(valid_tenant(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "Team", "a_b", "a.b", &"x".repeat(64), "é"] {
            assert!(!valid_tenant(bad), "{bad}");
        }
    }
}
