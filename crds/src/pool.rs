//! `InferencePool`: what a model name resolves to. Local WorkerSets and remote providers are
//! targets with a role; aliases map stable client-facing names to backend models. The router
//! routes a pool's models to its WorkerSet targets; provider targets and the overflow role are
//! validated and resolved but not acted on yet (providers never report Ready, so they are never
//! listed as ready targets).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::backend::SecretKeyRef;
use crate::condition::Condition;
use crate::validation::SpecIssue;

/// Desired state of an InferencePool.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kvroute.dev",
    version = "v1alpha1",
    kind = "InferencePool",
    plural = "inferencepools",
    namespaced,
    status = "InferencePoolStatus",
    shortname = "ipool",
    category = "kvroute",
    derive = "PartialEq",
    doc = "The targets (local InferenceWorkerSets and remote InferenceProviders) that requests for a model are routed to. The router uses WorkerSet targets only for now; provider targets and the overflow role are not acted on yet.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.targets.exists(t, !has(t.role) || t.role == 'primary')", "message": "a pool needs at least one primary target"}
]))]
pub struct InferencePoolSpec {
    /// Targets, each a WorkerSet (by name or label selector) or an InferenceProvider.
    #[schemars(length(min = 1, max = 64))]
    pub targets: Vec<PoolTarget>,
    /// Client-facing model names mapped to a model the targets serve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_aliases: Vec<ModelAlias>,
    /// How the router treats the pool's requests.
    #[serde(default, skip_serializing_if = "RoutingSpec::is_default")]
    pub routing: RoutingSpec,
    /// Where the mTLS certificates of the pool's identities (its WorkerSets' sidecars, its
    /// external picker, the router) come from: the operator's own CA unless an issuer is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<PoolTlsSpec>,
    /// The router's HTTP gateway for this pool's clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<PoolGatewaySpec>,
    /// Who may call the pool's models: API keys, JWTs, a tenant header from trusted peers.
    /// Absent: the pool serves anonymous requests (as before tenants existed; the router says
    /// so at start and in `kvroute_router_tenant_unauthenticated_pools`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<PoolAuthSpec>,
}

/// Tenant authentication of a pool (docs/control-plane.md, "Tenant identity"). A request is
/// checked in this order: a tenant header from a trusted peer, else an API key or JWT, else
/// anonymous (refused unless `allowAnonymous`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolAuthSpec {
    /// Secrets in the router's namespace holding hashed API keys: each data key is a tenant
    /// name, its value one or more lines `sha256:<64 hex>` (several lines while a key rotates).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub api_key_secrets: Vec<SecretName>,
    /// Bearer JWTs (RS256 or ES256) naming the tenant in a claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<JwtAuthSpec>,
    /// Peers whose `x-kvroute-tenant` header is believed (CIDRs such as `10.0.0.0/8` or
    /// single addresses). On the gRPC Pick API the pool's mTLS picker identity is trusted too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub trusted_peers: Vec<String>,
    /// Serve requests that carry no credential, as anonymous (no tenant). Default false.
    #[serde(default)]
    pub allow_anonymous: bool,
}

/// A Secret in the router's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretName {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// JWT verification settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.jwksUrl) != has(self.jwksSecretRef)", "message": "set exactly one of jwksUrl, jwksSecretRef"}
]))]
pub struct JwtAuthSpec {
    /// Required `iss`.
    #[schemars(length(min = 1, max = 1024))]
    pub issuer: String,
    /// Accepted `aud` values (the token must name at least one).
    #[schemars(length(min = 1, max = 16))]
    pub audiences: Vec<String>,
    /// The claim holding the tenant name (default `tenant`).
    #[serde(default = "JwtAuthSpec::default_tenant_claim")]
    #[schemars(length(min = 1, max = 253))]
    pub tenant_claim: String,
    /// An `https://` URL serving the issuer's JWKS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub jwks_url: Option<String>,
    /// A key of a Secret in the router's namespace holding the JWKS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_secret_ref: Option<SecretKeyRef>,
}

impl JwtAuthSpec {
    fn default_tenant_claim() -> String {
        "tenant".to_string()
    }
}

/// Certificate source of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolTlsSpec {
    /// A cert-manager issuer: the operator creates cert-manager `Certificate`s
    /// (cert-manager.io/v1) instead of issuing from its own CA. Every pool that names one must
    /// name the same; see docs/security.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,
}

/// A cert-manager issuer reference.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    /// Issuer name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// `Issuer` (namespaced: it must exist in every namespace that gets a Certificate) or
    /// `ClusterIssuer`.
    #[serde(default)]
    pub kind: IssuerKind,
    /// API group of the issuer.
    #[serde(default = "IssuerRef::default_group")]
    #[schemars(length(min = 1, max = 253))]
    pub group: String,
}

impl IssuerRef {
    fn default_group() -> String {
        "cert-manager.io".to_string()
    }
}

/// Kind of a cert-manager issuer.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum IssuerKind {
    /// A namespaced issuer.
    #[default]
    Issuer,
    /// A cluster-wide issuer.
    ClusterIssuer,
}

/// Gateway settings of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolGatewaySpec {
    /// TLS termination of the HTTP gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<GatewayTlsSpec>,
}

/// TLS termination of the router's HTTP gateway.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayTlsSpec {
    /// A `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) in the router's namespace; the
    /// router terminates TLS with it.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// Routing settings of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoutingSpec {
    /// Route on load alone while a model's tokenizer is not loaded (still downloading, or
    /// failing). Default false: the router answers 503 for the model until its tokenizer is
    /// loaded, because a decision without tokens ignores every worker's KV cache.
    #[serde(default)]
    pub allow_load_only: bool,
}

impl RoutingSpec {
    fn is_default(&self) -> bool {
        self == &Self::default()
    }
}

/// Role of a target in its pool.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TargetRole {
    /// Serves traffic normally.
    #[default]
    Primary,
    /// Receives traffic only when a policy overflows. A provider target is reached through
    /// an InferencePolicy overflow rule (queue or predicted TTFT too high). For a WorkerSet
    /// target the role is not enforced yet: the router routes to it like a primary one (the
    /// pool's `OverflowWorkerSets` condition says so).
    Overflow,
}

/// One target: exactly one of `workerSet`, `workerSetSelector` or `provider`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(has(self.workerSet) ? 1 : 0) + (has(self.workerSetSelector) ? 1 : 0) + (has(self.provider) ? 1 : 0) == 1", "message": "set exactly one of workerSet, workerSetSelector, provider"}
]))]
pub struct PoolTarget {
    /// Name of an InferenceWorkerSet in the pool's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub worker_set: Option<String>,
    /// Label selector over InferenceWorkerSets in the pool's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_set_selector: Option<LabelSelector>,
    /// Name of an InferenceProvider in the pool's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub provider: Option<String>,
    /// `primary` (default) or `overflow`.
    #[serde(default)]
    pub role: TargetRole,
}

/// Most extra models an alias may split to.
pub const MAX_ALIAS_SPLIT: u32 = 8;

/// A stable client-facing name for a backend model, optionally split between models (a
/// canary): each `split` entry takes its percentage of the alias's requests, `model` the rest.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelAlias {
    /// The name clients send in `model`.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The model a target serves (a WorkerSet's served name or a provider model); it takes
    /// the requests that no `split` entry takes.
    #[schemars(length(min = 1, max = 253))]
    pub model: String,
    /// Other models that take a share of the alias's requests (percentages summing to at
    /// most 100), drawn per request deterministically from its request id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ALIAS_SPLIT))]
    pub split: Vec<AliasSplit>,
}

/// One share of a split alias.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AliasSplit {
    /// The model this share goes to.
    #[schemars(length(min = 1, max = 253))]
    pub model: String,
    /// Percentage of the alias's requests (0-100).
    #[schemars(range(min = 0, max = 100))]
    pub percent: i32,
}

impl ModelAlias {
    /// `(model, percent)` of every share, `model` first with the remainder. Percentages are
    /// clamped to 0-100 and the remainder to at least 0 (validation refuses the rest).
    pub fn shares(&self) -> Vec<(&str, u32)> {
        let split: u32 = self
            .split
            .iter()
            .map(|s| s.percent.clamp(0, 100).unsigned_abs())
            .sum();
        let mut out = vec![(self.model.as_str(), 100u32.saturating_sub(split))];
        out.extend(
            self.split
                .iter()
                .map(|s| (s.model.as_str(), s.percent.clamp(0, 100).unsigned_abs())),
        );
        out
    }
}

/// Observed state of an InferencePool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready targets grouped by the model they serve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelTargets>,
    /// `Accepted` (the spec is valid), `ResolvedRefs` (what it names exists) and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The ready targets of one model.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelTargets {
    /// Model name as clients send it (served name or provider model).
    pub model: String,
    /// Aliases that resolve to this model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// Targets currently able to serve it.
    #[serde(default)]
    pub ready_targets: Vec<ReadyTarget>,
}

/// Kind of a resolved target.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum TargetKind {
    /// A local InferenceWorkerSet.
    InferenceWorkerSet,
    /// A remote InferenceProvider.
    InferenceProvider,
}

/// A target that can serve traffic now.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadyTarget {
    /// `InferenceWorkerSet` or `InferenceProvider`.
    pub kind: TargetKind,
    /// Object name.
    pub name: String,
    /// Role in the pool.
    pub role: TargetRole,
    /// Ready workers (WorkerSets only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
}

impl PoolTarget {
    /// How many of the three reference fields are set (the CEL rule wants exactly one).
    fn refs_set(&self) -> usize {
        usize::from(self.worker_set.is_some())
            + usize::from(self.worker_set_selector.is_some())
            + usize::from(self.provider.is_some())
    }
}

impl InferencePoolSpec {
    /// The CEL rules of this type, evaluated locally (see [`crate::validation`]).
    pub fn validate(&self) -> Vec<SpecIssue> {
        let mut issues = Vec::new();
        if self.targets.is_empty() {
            issues.push(SpecIssue::new(
                "spec.targets",
                "a pool needs at least one target",
            ));
        } else if !self.targets.iter().any(|t| t.role == TargetRole::Primary) {
            issues.push(SpecIssue::new(
                "spec.targets",
                "a pool needs at least one primary target",
            ));
        }
        for (i, t) in self.targets.iter().enumerate() {
            if t.refs_set() != 1 {
                issues.push(SpecIssue::new(
                    format!("spec.targets[{i}]"),
                    "set exactly one of workerSet, workerSetSelector, provider",
                ));
            }
        }
        for (i, a) in self.model_aliases.iter().enumerate() {
            if a.name.trim().is_empty() || a.model.trim().is_empty() {
                issues.push(SpecIssue::new(
                    format!("spec.modelAliases[{i}]"),
                    "alias name and model must not be empty",
                ));
            }
            let total: i64 = a.split.iter().map(|s| i64::from(s.percent)).sum();
            if a.split.iter().any(|s| !(0..=100).contains(&s.percent)) || total > 100 {
                issues.push(SpecIssue::new(
                    format!("spec.modelAliases[{i}].split"),
                    "split percentages must be 0-100 and sum to at most 100",
                ));
            }
            if a.split
                .iter()
                .enumerate()
                .any(|(j, s)| s.model == a.model || a.split[..j].iter().any(|t| t.model == s.model))
            {
                issues.push(SpecIssue::new(
                    format!("spec.modelAliases[{i}].split"),
                    "each model may appear once in an alias",
                ));
            }
            if self.model_aliases[..i].iter().any(|b| b.name == a.name) {
                issues.push(SpecIssue::new(
                    format!("spec.modelAliases[{i}]"),
                    format!("duplicate alias {:?}", a.name),
                ));
            }
        }
        if let Some(auth) = &self.auth {
            issues.extend(auth.validate());
        }
        issues
    }
}

impl PoolAuthSpec {
    /// Local checks of the auth block (CIDRs parse, one JWKS source, an https JWKS URL).
    pub fn validate(&self) -> Vec<SpecIssue> {
        let mut issues = Vec::new();
        for (i, p) in self.trusted_peers.iter().enumerate() {
            if parse_cidr(p).is_none() {
                issues.push(SpecIssue::new(
                    format!("spec.auth.trustedPeers[{i}]"),
                    format!("{p:?} is not an IP address or CIDR"),
                ));
            }
        }
        if let Some(jwt) = &self.jwt {
            if jwt.jwks_url.is_some() == jwt.jwks_secret_ref.is_some() {
                issues.push(SpecIssue::new(
                    "spec.auth.jwt",
                    "set exactly one of jwksUrl, jwksSecretRef",
                ));
            }
            if jwt
                .jwks_url
                .as_deref()
                .is_some_and(|u| !u.starts_with("https://"))
            {
                issues.push(SpecIssue::new(
                    "spec.auth.jwt.jwksUrl",
                    "the JWKS URL must be https://",
                ));
            }
            if jwt.audiences.is_empty() {
                issues.push(SpecIssue::new(
                    "spec.auth.jwt.audiences",
                    "name at least one audience",
                ));
            }
        }
        issues
    }
}

/// Parses `addr` or `addr/prefix` (IPv4 or IPv6) into the network address and prefix length.
pub fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u8)> {
    let (addr, prefix) = match s.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    };
    let addr: std::net::IpAddr = addr.trim().parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        Some(p) => p.trim().parse::<u8>().ok().filter(|p| *p <= max)?,
        None => max,
    };
    Some((addr, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> InferencePoolSpec {
        serde_saphyr::from_str(yaml).expect("spec parses")
    }

    #[test]
    fn valid_pool() {
        let s = spec(
            "targets: [{workerSet: a}]\ntls: {issuerRef: {name: ca, kind: ClusterIssuer}}\ngateway: {tls: {secretName: gw}}\n",
        );
        assert!(s.validate().is_empty());
        let issuer = s.tls.and_then(|t| t.issuer_ref).expect("issuer");
        assert_eq!(
            (issuer.kind, issuer.group.as_str()),
            (IssuerKind::ClusterIssuer, "cert-manager.io")
        );
        let s = spec(
            "targets:\n- workerSet: qwen\n- provider: openai\n  role: overflow\nmodelAliases:\n- {name: chat, model: qwen}\n",
        );
        assert!(s.validate().is_empty(), "{:?}", s.validate());
        assert_eq!(s.targets[0].role, TargetRole::Primary);
    }

    #[test]
    fn target_with_two_refs_or_none_is_rejected() {
        let s = spec("targets:\n- workerSet: a\n  provider: b\n- role: primary\n");
        let issues = s.validate();
        assert_eq!(issues.len(), 2, "{issues:?}");
        assert_eq!(issues[1].field, "spec.targets[1]");
    }

    #[test]
    fn overflow_only_and_empty_pools_are_rejected() {
        assert_eq!(
            spec("targets:\n- {provider: p, role: overflow}\n")
                .validate()
                .len(),
            1
        );
        assert_eq!(spec("targets: []\n").validate().len(), 1);
    }

    #[test]
    fn auth_block() {
        let s = spec(
            "targets: [{workerSet: a}]\nauth:\n  apiKeySecrets: [{name: team-keys}]\n  trustedPeers: [10.0.0.0/8, '::1']\n  jwt: {issuer: https://idp, audiences: [kvroute], jwksSecretRef: {name: jwks, key: jwks.json}}\n",
        );
        assert!(s.validate().is_empty(), "{:?}", s.validate());
        let auth = s.auth.expect("auth");
        assert!(!auth.allow_anonymous);
        assert_eq!(auth.jwt.expect("jwt").tenant_claim, "tenant");
        let s = spec(
            "targets: [{workerSet: a}]\nauth:\n  trustedPeers: [10.0.0.0/33, nope]\n  jwt: {issuer: i, audiences: [a], jwksUrl: 'http://idp/jwks'}\n",
        );
        let fields: Vec<_> = s.validate().into_iter().map(|i| i.field).collect();
        assert_eq!(
            fields,
            [
                "spec.auth.trustedPeers[0]",
                "spec.auth.trustedPeers[1]",
                "spec.auth.jwt.jwksUrl"
            ]
        );
        assert_eq!(
            parse_cidr("192.168.1.0/24"),
            Some(("192.168.1.0".parse().expect("ip"), 24))
        );
    }

    #[test]
    fn alias_split_shares_and_validation() {
        let s = spec(
            "targets: [{workerSet: a}]\nmodelAliases:\n- {name: chat, model: v1, split: [{model: v2, percent: 10}]}\n- {name: x, model: v1, split: [{model: v2, percent: 60}, {model: v2, percent: 50}]}\n",
        );
        assert_eq!(s.model_aliases[0].shares(), vec![("v1", 90), ("v2", 10)]);
        let fields: Vec<String> = s.validate().into_iter().map(|i| i.field).collect();
        assert_eq!(
            fields,
            vec!["spec.modelAliases[1].split", "spec.modelAliases[1].split"]
        );
        // Today's shape still parses, with no split.
        let old = spec("targets: [{workerSet: a}]\nmodelAliases: [{name: c, model: m}]\n");
        assert_eq!(old.model_aliases[0].shares(), vec![("m", 100)]);
    }

    #[test]
    fn duplicate_alias_is_rejected() {
        let s = spec(
            "targets: [{workerSet: a}]\nmodelAliases: [{name: x, model: a}, {name: x, model: b}]\n",
        );
        assert_eq!(s.validate()[0].field, "spec.modelAliases[1]");
    }
}
