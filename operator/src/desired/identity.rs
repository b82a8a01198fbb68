//! Conditions that say what the router really does with a pool's requests, beyond its
//! targets: how it tells the pool's tenants apart ([`TENANT_IDENTITY`]) and whether it sends
//! anything to the pool's provider targets ([`PROVIDER_TARGETS`]). Pure: spec in, condition
//! out.
//!
//! ```text
//! pool spec --pool_identity_methods()--> ["API keys (Secret k)", "JWT (issuer i)", ...]
//!           + JWKS Secret content (pool_jwks_uses, jwks_problem)
//!           --tenant_identity()--> TenantIdentity: True Verified | False InvalidJWKS | False Anonymous
//! pool spec --provider_targets()--> ProviderTargets (only with provider or overflow targets)
//! ```

use std::collections::BTreeMap;

use kvroute_crds::condition::{self, Condition, ConditionStatus, Reason, Time};
use kvroute_crds::pool::{InferencePoolSpec, TargetRole};

use super::secrets::SecretUse;

/// Condition type: whether the router verifies a tenant for the pool's requests.
pub const TENANT_IDENTITY: &str = "TenantIdentity";
/// Condition type, on pools with provider targets: whether the router acts on them.
pub const PROVIDER_TARGETS: &str = "ProviderTargets";
/// Condition type, on pools with overflow-role WorkerSet targets: whether the router holds
/// them back for overflow (it does not yet).
pub const OVERFLOW_WORKER_SETS: &str = "OverflowWorkerSets";

/// How the router verifies the tenant of the pool's requests, one phrase per method.
///
/// Plug-in point of the pool's `spec.auth` block (part B of issue 13: API keys, JWT, trusted
/// peers). Until it exists the router verifies no tenant: every request is anonymous.
pub fn pool_identity_methods(spec: &InferencePoolSpec) -> Vec<String> {
    let Some(auth) = &spec.auth else {
        return Vec::new();
    };
    let mut methods = Vec::new();
    if !auth.api_key_secrets.is_empty() {
        let names: Vec<&str> = auth
            .api_key_secrets
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        methods.push(format!("API keys (Secrets {})", names.join(", ")));
    }
    if let Some(jwt) = &auth.jwt {
        methods.push(format!("JWTs of issuer {}", jwt.issuer));
    }
    if !auth.trusted_peers.is_empty() {
        methods.push(format!(
            "the tenant header from {} trusted peers",
            auth.trusted_peers.len()
        ));
    }
    methods
}

/// The JWKS Secret keys a pool names (`spec.auth.jwt.jwksSecretRef`), whose content the
/// operator checks ([`jwks_problem`]); a JWKS from a URL is the router's to fetch and check.
///
/// Plug-in point of the pool's `spec.auth.jwt` (part B of issue 13); none until it exists.
pub fn pool_jwks_uses(spec: &InferencePoolSpec) -> Vec<SecretUse> {
    spec.auth
        .as_ref()
        .and_then(|a| a.jwt.as_ref())
        .and_then(|j| j.jwks_secret_ref.as_ref())
        .map(|r| SecretUse::new("spec.auth.jwt.jwksSecretRef", &r.name, Some(&r.key)))
        .into_iter()
        .collect()
}

/// Why `bytes` is not a JWKS the router can verify RS256 or ES256 tokens with; `None` when it
/// is one (a JSON object whose `keys` hold at least one RSA key with `n` and `e` or one P-256
/// EC key with `x` and `y`). A JWKS is public: checking its content reveals nothing secret.
pub fn jwks_problem(bytes: &[u8]) -> Option<String> {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return Some("not JSON".to_string());
    };
    let Some(keys) = doc.get("keys").and_then(|k| k.as_array()) else {
        return Some("no \"keys\" array".to_string());
    };
    let has = |k: &serde_json::Value, f: &str| k.get(f).and_then(|v| v.as_str()).is_some();
    let usable = keys
        .iter()
        .any(|k| match k.get("kty").and_then(|v| v.as_str()) {
            Some("RSA") => has(k, "n") && has(k, "e"),
            Some("EC") => {
                k.get("crv").and_then(|v| v.as_str()) == Some("P-256") && has(k, "x") && has(k, "y")
            }
            _ => false,
        });
    (!usable).then(|| {
        format!(
            "none of its {} keys is an RSA or P-256 EC public key",
            keys.len()
        )
    })
}

/// The pool's [`TENANT_IDENTITY`] condition; `jwks` holds the content of the JWKS Secret keys
/// it names ([`pool_jwks_uses`]; a missing one is `SecretsMounted`'s to report).
///
/// True, reason `Verified`: the router verifies tenants by the methods listed. False, reason
/// `InvalidJWKS`: a JWKS Secret the pool names holds no usable key, so JWTs are refused (other
/// methods still work). False, reason `Anonymous`: the pool has no `spec.auth`, so its
/// requests carry no verified tenant: rules that match tenants and per-tenant limits never
/// apply to them, and a tenant header is not believed.
pub fn tenant_identity(
    spec: &InferencePoolSpec,
    jwks: &BTreeMap<(String, String), Vec<u8>>,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let methods = pool_identity_methods(spec);
    let bad: Vec<String> = pool_jwks_uses(spec)
        .iter()
        .filter_map(|u| {
            let key = u.key.clone().unwrap_or_default();
            let bytes = jwks.get(&(u.name.clone(), key.clone()))?;
            jwks_problem(bytes).map(|p| format!("{}: Secret {}, key {key}: {p}", u.field, u.name))
        })
        .collect();
    let (status, reason, message) = if !bad.is_empty() {
        (
            ConditionStatus::False,
            Reason::InvalidJWKS,
            format!("the router refuses JWTs for this pool: {}", bad.join("; ")),
        )
    } else if methods.is_empty() {
        (
            ConditionStatus::False,
            Reason::Anonymous,
            "the pool has no spec.auth: its requests carry no verified tenant, so rules that \
             match tenants and per-tenant limits do not apply to them"
                .to_string(),
        )
    } else {
        (
            ConditionStatus::True,
            Reason::Verified,
            format!("the router verifies tenants by {}", methods.join(", ")),
        )
    };
    condition::condition(TENANT_IDENTITY, status, reason, message, generation, now)
}

/// The pool's [`PROVIDER_TARGETS`] condition (with provider targets: the router relays what
/// policy overflow rules send them, `router/src/provider`) and its [`OVERFLOW_WORKER_SETS`]
/// condition (with overflow-role WorkerSet targets: False, the role is not enforced; the
/// router routes to them like primaries). Neither when the pool has no such target.
pub fn provider_targets(
    spec: &InferencePoolSpec,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let providers = spec.targets.iter().filter(|t| t.provider.is_some()).count();
    let overflow_sets = spec
        .targets
        .iter()
        .filter(|t| t.role == TargetRole::Overflow && t.provider.is_none())
        .count();
    let mut out = Vec::new();
    if providers > 0 {
        out.push(condition::condition(
            PROVIDER_TARGETS,
            ConditionStatus::True,
            Reason::Enforced,
            format!(
                "the router relays to the pool's {providers} provider targets the requests \
                 that InferencePolicy overflow rules send them (a provider no overflow rule \
                 names receives nothing)"
            ),
            generation,
            now,
        ));
    }
    if overflow_sets > 0 {
        out.push(condition::condition(
            OVERFLOW_WORKER_SETS,
            ConditionStatus::False,
            Reason::NotEnforced,
            format!(
                "the overflow role of the pool's {overflow_sets} WorkerSet targets is not \
                 enforced yet: the router routes to them like primaries"
            ),
            generation,
            now,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::from_second(1_700_000_000).expect("valid"))
    }

    fn spec(yaml: &str) -> InferencePoolSpec {
        serde_saphyr::from_str(yaml).expect("pool")
    }

    #[test]
    fn a_pool_without_auth_is_anonymous() {
        let c = tenant_identity(
            &spec("targets: [{workerSet: a}]\n"),
            &BTreeMap::new(),
            Some(2),
            &now(),
        );
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            (TENANT_IDENTITY, "False", "Anonymous")
        );
        assert_eq!(c.observed_generation, Some(2));
    }

    #[test]
    fn a_jwks_needs_an_rsa_or_p256_public_key() {
        assert!(jwks_problem(b"this is not a JWKS").is_some());
        assert!(jwks_problem(b"{\"keys\": []}").is_some());
        assert!(jwks_problem(br#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).is_some());
        assert!(
            jwks_problem(br#"{"keys": [{"kty": "EC", "crv": "P-384", "x": "a", "y": "b"}]}"#)
                .is_some()
        );
        assert_eq!(
            jwks_problem(
                br#"{"keys": [{"kty": "oct"}, {"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}"#
            ),
            None
        );
        assert_eq!(
            jwks_problem(br#"{"keys": [{"kty": "EC", "crv": "P-256", "x": "a", "y": "b"}]}"#),
            None
        );
    }

    #[test]
    fn provider_and_overflow_targets_say_whether_the_router_acts_on_them() {
        assert!(provider_targets(&spec("targets: [{workerSet: a}]\n"), None, &now()).is_empty());
        let c = provider_targets(
            &spec("targets: [{workerSet: a}, {provider: p, role: overflow}]\n"),
            None,
            &now(),
        );
        assert_eq!(c.len(), 1);
        assert_eq!(
            (
                c[0].type_.as_str(),
                c[0].status.as_str(),
                c[0].reason.as_str()
            ),
            (PROVIDER_TARGETS, "True", "Enforced")
        );
        assert!(
            c[0].message.contains("1 provider targets"),
            "{}",
            c[0].message
        );
        let c = provider_targets(
            &spec("targets: [{workerSet: a}, {workerSet: b, role: overflow}]\n"),
            None,
            &now(),
        );
        assert_eq!(c.len(), 1);
        assert_eq!(
            (
                c[0].type_.as_str(),
                c[0].status.as_str(),
                c[0].reason.as_str()
            ),
            (OVERFLOW_WORKER_SETS, "False", "NotEnforced")
        );
    }
}
