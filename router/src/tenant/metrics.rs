//! Tenant metrics: per-(model, class, tenant) requests, tokens and TTFT, with a tenant label
//! only for an allow-list, and the counters of authentication, limits and Secret files.
//!
//! ```text
//! tenant --tenant_label--> allow-listed name | "other" | "anonymous"   (never the raw string)
//! request admitted --requests{model,class,tenant}
//! first token      --ttft_seconds{model,class,tenant}      (histogram, TTFT_BUCKETS)
//! done(usage)      --tokens{model,class,tenant,kind=prompt|completion}
//! ```
//!
//! Series per (model, class, tenant): 1 request counter + 2 token counters + the TTFT
//! histogram's 10 buckets, `+Inf`, `_sum` and `_count` = [`SERIES_PER_TENANT`] (16). With an
//! allow-list of A tenants the tenant label takes at most A + 2 values.

use std::collections::HashSet;
use std::sync::Arc;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};

/// TTFT histogram buckets, seconds.
pub const TTFT_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0];
/// Exported series per (model, class, tenant).
pub const SERIES_PER_TENANT: usize = 1 + 2 + TTFT_BUCKETS.len() + 3;
/// The label of every tenant outside the allow-list.
pub const OTHER: &str = "other";
/// The label of requests without a tenant.
pub const ANONYMOUS: &str = "anonymous";

/// The tenant series and counters.
#[derive(Clone)]
pub struct TenantMetrics {
    allow: Arc<HashSet<String>>,
    /// Admitted requests by model, class and tenant label.
    pub requests: IntCounterVec,
    /// Tokens by model, class, tenant label and kind (`prompt`, `completion`).
    pub tokens: IntCounterVec,
    /// Observed TTFT by model, class and tenant label.
    pub ttft: HistogramVec,
    /// Authentication outcomes by result (`tenant`, `anonymous`, `open_pool`, or an
    /// [`crate::tenant::AuthError`] label).
    pub auth: IntCounterVec,
    /// Requests refused at a tenant limit, by limit (`requests_per_minute`, ...).
    pub limited: IntCounterVec,
    /// Secret files that could not be used, by reason.
    pub secret_errors: IntCounterVec,
    /// JWKS loads that failed, by reason.
    pub jwks_errors: IntCounterVec,
    /// Pools that serve anonymous requests because they have no `auth` block.
    pub open_pools: IntGauge,
    /// (scope, tenant) entries the limiter holds.
    pub limiter_entries: IntGauge,
}

impl std::fmt::Debug for TenantMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantMetrics")
            .field("allow", &self.allow)
            .finish_non_exhaustive()
    }
}

impl TenantMetrics {
    /// Registers the series; `allow` lists the tenants that get their own label (invalid
    /// names, `other` and `anonymous` are ignored with a warning).
    pub fn register(registry: &Registry, allow: &[String]) -> Result<Self, prometheus::Error> {
        let mut set = HashSet::new();
        for t in allow.iter().map(|t| t.trim()).filter(|t| !t.is_empty()) {
            if super::valid_tenant(t) && t != OTHER && t != ANONYMOUS {
                set.insert(t.to_string());
            } else {
                tracing::warn!(
                    tenant = t,
                    "--tenant-metrics-allow: not a tenant name; ignored"
                );
            }
        }
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
        };
        let m = Self {
            allow: Arc::new(set),
            requests: counter(
                "kvroute_router_tenant_requests_total",
                "Admitted requests by model, service class and tenant (allow-listed, other, anonymous).",
                &["model", "class", "tenant"],
            )?,
            tokens: counter(
                "kvroute_router_tenant_tokens_total",
                "Tokens by model, service class, tenant and kind (prompt, completion).",
                &["model", "class", "tenant", "kind"],
            )?,
            ttft: HistogramVec::new(
                HistogramOpts::new(
                    "kvroute_router_tenant_ttft_seconds",
                    "Observed time to first token by model, service class and tenant.",
                )
                .buckets(TTFT_BUCKETS.to_vec()),
                &["model", "class", "tenant"],
            )?,
            auth: counter(
                "kvroute_router_tenant_auth_total",
                "Tenant authentication outcomes by result.",
                &["result"],
            )?,
            limited: counter(
                "kvroute_router_tenant_limited_total",
                "Requests refused (429) at a tenant limit, by limit.",
                &["limit"],
            )?,
            secret_errors: counter(
                "kvroute_router_tenant_secret_errors_total",
                "Secret files (API keys, JWKS) that could not be used, by reason; the last good value stays.",
                &["reason"],
            )?,
            jwks_errors: counter(
                "kvroute_router_tenant_jwks_errors_total",
                "JWKS loads that failed, by reason; the last good JWKS stays.",
                &["reason"],
            )?,
            open_pools: IntGauge::new(
                "kvroute_router_tenant_open_pools",
                "Pools without an auth block: they serve anonymous requests.",
            )?,
            limiter_entries: IntGauge::new(
                "kvroute_router_tenant_limiter_entries",
                "(scope, tenant) entries held by the tenant limiter.",
            )?,
        };
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.tokens.clone()))?;
        registry.register(Box::new(m.ttft.clone()))?;
        registry.register(Box::new(m.auth.clone()))?;
        registry.register(Box::new(m.limited.clone()))?;
        registry.register(Box::new(m.secret_errors.clone()))?;
        registry.register(Box::new(m.jwks_errors.clone()))?;
        registry.register(Box::new(m.open_pools.clone()))?;
        registry.register(Box::new(m.limiter_entries.clone()))?;
        Ok(m)
    }

    /// The metric label of `tenant`: its name when allow-listed, else [`OTHER`]; no tenant is
    /// [`ANONYMOUS`].
    pub fn tenant_label<'a>(&self, tenant: Option<&'a str>) -> &'a str {
        match tenant {
            None => ANONYMOUS,
            Some(t) if self.allow.contains(t) => t,
            Some(_) => OTHER,
        }
    }

    /// A request was admitted.
    pub fn admitted(&self, model: &str, class: &str, tenant: Option<&str>) {
        self.requests
            .with_label_values(&[model, class, self.tenant_label(tenant)])
            .inc();
    }

    /// Its first token came after `ttft_s`.
    pub fn first_token(&self, model: &str, class: &str, tenant: Option<&str>, ttft_s: f64) {
        self.ttft
            .with_label_values(&[model, class, self.tenant_label(tenant)])
            .observe(ttft_s);
    }

    /// It finished with these token counts.
    pub fn usage(
        &self,
        model: &str,
        class: &str,
        tenant: Option<&str>,
        prompt: u64,
        completion: u64,
    ) {
        let t = self.tenant_label(tenant);
        self.tokens
            .with_label_values(&[model, class, t, "prompt"])
            .inc_by(prompt);
        self.tokens
            .with_label_values(&[model, class, t, "completion"])
            .inc_by(completion);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exported series (sample lines) of the tenant families in `registry`.
    fn tenant_series(registry: &Registry) -> usize {
        let mut n = 0;
        for family in registry.gather() {
            let per_metric = match family.get_field_type() {
                prometheus::proto::MetricType::HISTOGRAM => TTFT_BUCKETS.len() + 3,
                _ => 1,
            };
            if [
                "kvroute_router_tenant_requests_total",
                "kvroute_router_tenant_tokens_total",
                "kvroute_router_tenant_ttft_seconds",
            ]
            .contains(&family.name())
            {
                n += family.get_metric().len() * per_metric;
            }
        }
        n
    }

    #[test]
    fn labels_are_allow_listed() {
        let m = TenantMetrics::register(
            &Registry::new(),
            &["team-a".into(), "Other".into(), "other".into()],
        )
        .expect("metrics");
        assert_eq!(m.tenant_label(Some("team-a")), "team-a");
        assert_eq!(m.tenant_label(Some("team-b")), OTHER);
        assert_eq!(m.tenant_label(Some("other")), OTHER);
        assert_eq!(m.tenant_label(None), ANONYMOUS);
    }

    #[test]
    fn series_per_model_class_tenant_are_as_documented() {
        let registry = Registry::new();
        let m = TenantMetrics::register(&registry, &["team-a".into(), "team-b".into()])
            .expect("metrics");
        let request = |tenant: Option<&str>| {
            m.admitted("llama", "interactive", tenant);
            m.first_token("llama", "interactive", tenant, 0.2);
            m.usage("llama", "interactive", tenant, 100, 20);
        };
        request(Some("team-a"));
        assert_eq!(tenant_series(&registry), SERIES_PER_TENANT);
        assert_eq!(SERIES_PER_TENANT, 16);
        request(Some("team-a"));
        assert_eq!(
            tenant_series(&registry),
            SERIES_PER_TENANT,
            "same tenant, same series"
        );
        request(Some("team-b"));
        // A thousand tenants outside the allow-list fold into one `other` series set.
        for i in 0..1000 {
            request(Some(&format!("tenant-{i}")));
        }
        request(None);
        assert_eq!(tenant_series(&registry), 4 * SERIES_PER_TENANT);
        // The text exposition counts the same lines.
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .expect("encode");
        let lines = text
            .lines()
            .filter(|l| {
                !l.starts_with('#')
                    && l.starts_with("kvroute_router_tenant_")
                    && l.contains("model=\"llama\"")
            })
            .count();
        assert_eq!(lines, 4 * SERIES_PER_TENANT);
    }
}
