//! Status of the status-only kinds (InferencePool, InferencePolicy, InferenceProvider,
//! GatewayBackend): validate the spec, resolve every name it mentions against an
//! [`Inventory`] of the namespace, and say in conditions what is missing and whether anything
//! acts on the resource.
//!
//! ```text
//! resource --needs()--> Needs --(controller lists/gets)--> Inventory
//! resource + Inventory + now --decide()--> status: Accepted, ResolvedRefs, Ready (+ pool models)
//! ```
//!
//! Honesty rule: Ready=True only for what the router acts on. It reads WorkerSets and Pools,
//! and enforces InferencePolicies: a policy is Ready=True with reason [`ENFORCED`] only when
//! the router's own compiler (`kvroute_policy::compile`) accepts it and everything it names
//! resolves; a route target that is an InferenceProvider cannot be routed to locally and is
//! Ready=False with reason [`UNROUTABLE_TARGET`]. It relays overflow to InferenceProviders
//! through GatewayBackends: a backend whose Secrets resolve and a provider whose backend is
//! Ready are Ready=True with reason [`ENFORCED`] (what the router cannot do with them, e.g.
//! translate OpenAI requests for an Anthropic provider, is a False condition of its own).
//! What nothing enforces yet ends at Accepted=True,
//! ResolvedRefs=True and Ready=False with reason [`NOT_ENFORCED`], and the message says so.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::object::HasStatus;
use kvroute_crds::backend::{AuthType, GatewayBackendSpec, GatewayBackendStatus};
use kvroute_crds::condition::{
    self, ACCEPTED, Condition, ConditionStatus, READY, RESOLVED_REFS, Reason, Time,
};
use kvroute_crds::policy::{InferencePolicySpec, InferencePolicyStatus};
use kvroute_crds::pool::{
    InferencePoolSpec, InferencePoolStatus, ModelTargets, ReadyTarget, TargetKind, TargetRole,
};
use kvroute_crds::provider::{InferenceProviderSpec, InferenceProviderStatus, ProviderKind};
use kvroute_crds::validation::{SpecIssue, summary};
use kvroute_crds::{
    GatewayBackend, InferencePolicy, InferencePool, InferenceProvider, InferenceWorkerSet,
};

use super::secrets::{
    SECRETS_MOUNTED, SecretFacts, SecretUse, backend_secret_uses, policy_secret_uses,
    pool_secret_uses, secrets_mounted,
};
use super::{Notable, Severity};

/// Ready reason of a resource that is valid and resolved but that nothing acts on yet.
pub const NOT_ENFORCED: &str = Reason::NotEnforced.as_str();
/// Ready reason of a policy the router compiles and enforces, or of a provider or backend
/// the router relays through.
pub const ENFORCED: &str = Reason::Enforced.as_str();
/// Ready reason of a policy whose route action names an InferenceProvider as a target (the
/// router restricts local candidates only; providers are reached through `overflow`).
pub const UNROUTABLE_TARGET: &str = Reason::UnroutableTarget.as_str();
/// Condition type: whether the backend's TLS certificate is verified (present only when it
/// is not: `insecureSkipVerify`).
pub const TLS_VERIFIED: &str = "TLSVerified";
/// Condition type of an Anthropic provider: OpenAI-API clients are not translated to it.
pub const OPENAI_CLIENTS: &str = "OpenAIClients";

/// What exists in one namespace, as far as a resource's references are concerned. Secrets
/// carry only their key names, never values.
#[derive(Debug, Default, Clone)]
pub struct Inventory {
    /// InferenceWorkerSets.
    pub worker_sets: Vec<InferenceWorkerSet>,
    /// InferenceProviders.
    pub providers: Vec<InferenceProvider>,
    /// GatewayBackends.
    pub backends: Vec<GatewayBackend>,
    /// InferencePools.
    pub pools: Vec<InferencePool>,
    /// Secret name -> its keys, in the router's namespace (where the router mounts them
    /// from, see [`super::secrets`]); only the Secrets a resource references are looked up.
    pub secrets: BTreeMap<String, BTreeSet<String>>,
    /// The router's namespace.
    pub router_namespace: String,
    /// Secrets the router Deployment mounts under [`super::secrets::SECRETS_DIR`]; `None`
    /// when there is no router Deployment (looked up only for resources that name Secrets).
    pub router_mounts: Option<BTreeSet<String>>,
    /// (Secret, key) -> content, for the JWKS keys a pool names (public keys; the only
    /// Secret values the operator keeps).
    pub jwks: BTreeMap<(String, String), Vec<u8>>,
    /// Transport security facts of a pool (only with `--mtls`, see [`super::tls`]).
    pub transport: Option<super::tls::TransportFacts>,
}

fn name_of<K: kube::Resource>(k: &K) -> &str {
    k.meta().name.as_deref().unwrap_or_default()
}

impl Inventory {
    /// What the [`super::secrets::SECRETS_MOUNTED`] condition reads.
    pub fn secret_facts(&self) -> SecretFacts {
        SecretFacts {
            router_namespace: self.router_namespace.clone(),
            keys: self.secrets.clone(),
            mounted: self.router_mounts.clone(),
        }
    }
    fn worker_set(&self, name: &str) -> Option<&InferenceWorkerSet> {
        self.worker_sets.iter().find(|w| name_of(*w) == name)
    }
    fn provider(&self, name: &str) -> Option<&InferenceProvider> {
        self.providers.iter().find(|p| name_of(*p) == name)
    }
}

/// True when `labels` satisfy `selector` (matchLabels and matchExpressions In, NotIn, Exists,
/// DoesNotExist; an unknown operator matches nothing).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_exprs = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_labels && by_exprs
}

/// What a status decision reads from its namespace; the controller fetches exactly this.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    /// List the InferenceWorkerSets.
    pub worker_sets: bool,
    /// List the InferenceProviders.
    pub providers: bool,
    /// List the InferencePools.
    pub pools: bool,
    /// List the GatewayBackends.
    pub backends: bool,
    /// Get these Secrets (by name, in the router's namespace) and the router Deployment's
    /// mounts; only the Secrets' key names are kept.
    pub secrets: BTreeSet<String>,
    /// Keep the content of these (Secret, key)s: JWKS, checked by the operator.
    pub jwks: BTreeSet<(String, String)>,
    /// Gather the transport security facts (pools only; the controller does it with
    /// `--mtls`): `Some(gateway Secret the pool names, if any)`.
    pub transport: Option<Option<String>>,
}

/// A kind whose controller writes nothing but its status, decided by [`RefStatus::decide`]
/// from the resource (spec, generation, previous status) and an [`Inventory`].
pub trait RefStatus:
    kube::Resource<DynamicType = ()> + HasStatus<Status: Clone + Default + PartialEq + serde::Serialize>
{
    /// What [`RefStatus::decide`] reads besides the resource itself.
    fn needs(&self) -> Needs;
    /// The status this resource should have. Pure: `now` stamps condition transitions.
    fn decide(&self, inv: &Inventory, now: &Time) -> Self::Status;
    /// The conditions of a status of this kind.
    fn conditions(status: &Self::Status) -> &[Condition];
    /// Key stems of the identities this resource owns (pools: picker and sidecars).
    fn identity_stems(&self, _inv: &Inventory) -> Vec<String> {
        Vec::new()
    }
    /// The Secrets this resource makes the router read (mounted by the operator).
    fn secret_uses(&self) -> Vec<SecretUse> {
        Vec::new()
    }
}

/// Adds the [`SECRETS_MOUNTED`] condition of `uses` (when there are any) to `conditions`.
fn with_secrets(
    mut conditions: Vec<Condition>,
    uses: &[SecretUse],
    inv: &Inventory,
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> Vec<Condition> {
    let next: Vec<Condition> = secrets_mounted(uses, &inv.secret_facts(), generation, now)
        .into_iter()
        .collect();
    conditions.extend(condition::merge_conditions(previous, next));
    conditions
}

fn previous_conditions<K: RefStatus>(obj: &K) -> &[Condition] {
    obj.status().map(K::conditions).unwrap_or_default()
}

impl RefStatus for InferencePool {
    fn needs(&self) -> Needs {
        Needs {
            worker_sets: true,
            providers: true,
            secrets: names(&self.secret_uses()),
            jwks: super::identity::pool_jwks_uses(&self.spec)
                .into_iter()
                .map(|u| (u.name, u.key.unwrap_or_default()))
                .collect(),
            transport: Some(
                self.spec
                    .gateway
                    .as_ref()
                    .and_then(|g| g.tls.as_ref())
                    .map(|t| t.secret_name.clone()),
            ),
            ..Needs::default()
        }
    }
    fn identity_stems(&self, inv: &Inventory) -> Vec<String> {
        super::tls::pool_stems(name_of(self), &self.spec, &inv.worker_sets)
    }
    fn secret_uses(&self) -> Vec<SecretUse> {
        pool_secret_uses(&self.spec)
    }
    fn decide(&self, inv: &Inventory, now: &Time) -> InferencePoolStatus {
        let generation = self.metadata.generation;
        let previous = previous_conditions(self);
        let (models, conditions) = pool_status(&self.spec, generation, previous, inv, now);
        let conditions = with_secrets(
            conditions,
            &self.secret_uses(),
            inv,
            generation,
            previous,
            now,
        );
        InferencePoolStatus {
            observed_generation: generation,
            models,
            conditions,
        }
    }
    fn conditions(status: &InferencePoolStatus) -> &[Condition] {
        &status.conditions
    }
}

impl RefStatus for InferencePolicy {
    fn needs(&self) -> Needs {
        Needs {
            worker_sets: true,
            providers: true,
            pools: true,
            secrets: names(&self.secret_uses()),
            ..Needs::default()
        }
    }
    fn secret_uses(&self) -> Vec<SecretUse> {
        policy_secret_uses(&self.spec)
    }
    fn decide(&self, inv: &Inventory, now: &Time) -> InferencePolicyStatus {
        let generation = self.metadata.generation;
        let previous = previous_conditions(self);
        let conditions = policy_conditions(&self.spec, generation, previous, inv, now);
        InferencePolicyStatus {
            observed_generation: generation,
            conditions: with_secrets(
                conditions,
                &self.secret_uses(),
                inv,
                generation,
                previous,
                now,
            ),
        }
    }
    fn conditions(status: &InferencePolicyStatus) -> &[Condition] {
        &status.conditions
    }
}

impl RefStatus for InferenceProvider {
    fn needs(&self) -> Needs {
        Needs {
            backends: true,
            ..Needs::default()
        }
    }
    fn decide(&self, inv: &Inventory, now: &Time) -> InferenceProviderStatus {
        let generation = self.metadata.generation;
        InferenceProviderStatus {
            observed_generation: generation,
            conditions: provider_conditions(
                &self.spec,
                generation,
                previous_conditions(self),
                inv,
                now,
            ),
        }
    }
    fn conditions(status: &InferenceProviderStatus) -> &[Condition] {
        &status.conditions
    }
}

impl RefStatus for GatewayBackend {
    fn needs(&self) -> Needs {
        Needs {
            secrets: names(&self.secret_uses()),
            ..Needs::default()
        }
    }
    fn secret_uses(&self) -> Vec<SecretUse> {
        backend_secret_uses(&self.spec)
    }
    fn decide(&self, inv: &Inventory, now: &Time) -> GatewayBackendStatus {
        let generation = self.metadata.generation;
        let previous = previous_conditions(self);
        let conditions = backend_conditions(&self.spec, generation, previous, inv, now);
        GatewayBackendStatus {
            observed_generation: generation,
            conditions: with_secrets(
                conditions,
                &self.secret_uses(),
                inv,
                generation,
                previous,
                now,
            ),
        }
    }
    fn conditions(status: &GatewayBackendStatus) -> &[Condition] {
        &status.conditions
    }
}

/// True when nothing is left to wait for: Ready, or valid and resolved but [`NOT_ENFORCED`],
/// and every Secret it names mounted. Unsettled resources are re-checked sooner (what they
/// wait for, a Secret, a router rollout or a WorkerSet becoming ready, may not trigger a
/// watch event on them).
pub fn settled(conditions: &[Condition]) -> bool {
    condition::find(conditions, READY)
        .is_some_and(|r| r.status == "True" || r.reason == NOT_ENFORCED)
        && condition::find(conditions, SECRETS_MOUNTED).is_none_or(|c| c.status == "True")
}

/// The Secret names of `uses` (what the controller gets, keys only).
fn names(uses: &[SecretUse]) -> BTreeSet<String> {
    uses.iter().map(|u| u.name.clone()).collect()
}

/// Events when Ready changes status or reason.
pub fn ready_events(old: &[Condition], new: &[Condition]) -> Vec<Notable> {
    let (Some(n), o) = (condition::find(new, READY), condition::find(old, READY)) else {
        return Vec::new();
    };
    if o.is_some_and(|o| o.status == n.status && o.reason == n.reason) {
        return Vec::new();
    }
    let severity = if n.status == "True" {
        Severity::Normal
    } else {
        Severity::Warning
    };
    vec![Notable {
        severity,
        reason: n.reason.clone(),
        note: n.message.clone(),
    }]
}

fn is_ready(conditions: Option<&[Condition]>) -> bool {
    conditions.is_some_and(|c| condition::is_true(c, READY))
}

/// Accepted and every reference resolved: usable by whatever refers to it.
fn is_accepted_and_resolved(conditions: Option<&[Condition]>) -> bool {
    conditions
        .is_some_and(|c| condition::is_true(c, ACCEPTED) && condition::is_true(c, RESOLVED_REFS))
}

/// What Ready says once the spec is accepted and its references resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Readiness {
    /// Ready=True, with this message.
    Ready(String),
    /// Ready=True with reason [`ENFORCED`]: the router acts on it (message).
    Enforced(String),
    /// Ready=False: waiting for something (reason, message).
    Waiting(Reason, String),
}

/// Conditions shared by the status-only kinds: Accepted (the spec is valid), ResolvedRefs
/// (everything it names exists), Ready (what `readiness` says, once the first two hold).
fn ref_conditions(
    issues: &[SpecIssue],
    missing: &[String],
    readiness: Readiness,
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> Vec<Condition> {
    let cond = |t, s, r: Reason, m: String| condition::condition(t, s, r, m, generation, now);
    let next = if !issues.is_empty() {
        let msg = summary(issues);
        vec![
            cond(
                ACCEPTED,
                ConditionStatus::False,
                Reason::InvalidSpec,
                msg.clone(),
            ),
            cond(
                RESOLVED_REFS,
                ConditionStatus::Unknown,
                Reason::InvalidSpec,
                "spec rejected before resolving".into(),
            ),
            cond(READY, ConditionStatus::False, Reason::InvalidSpec, msg),
        ]
    } else {
        let accepted = cond(
            ACCEPTED,
            ConditionStatus::True,
            Reason::Accepted,
            "spec is valid".into(),
        );
        if !missing.is_empty() {
            let msg = missing.join("; ");
            vec![
                accepted,
                cond(
                    RESOLVED_REFS,
                    ConditionStatus::False,
                    Reason::RefNotFound,
                    msg.clone(),
                ),
                cond(READY, ConditionStatus::False, Reason::RefNotFound, msg),
            ]
        } else {
            let resolved = cond(
                RESOLVED_REFS,
                ConditionStatus::True,
                Reason::Resolved,
                "all references exist".into(),
            );
            let ready = match readiness {
                Readiness::Ready(msg) => cond(READY, ConditionStatus::True, Reason::Ready, msg),
                Readiness::Enforced(msg) => {
                    cond(READY, ConditionStatus::True, Reason::Enforced, msg)
                }
                Readiness::Waiting(reason, msg) => cond(READY, ConditionStatus::False, reason, msg),
            };
            vec![accepted, resolved, ready]
        }
    };
    condition::merge_conditions(previous, next)
}

/// Pool status: conditions and the ready targets of each model.
pub fn pool_status(
    spec: &InferencePoolSpec,
    generation: Option<i64>,
    previous: &[Condition],
    inv: &Inventory,
    now: &Time,
) -> (Vec<ModelTargets>, Vec<Condition>) {
    let issues = spec.validate();
    let mut missing = Vec::new();
    let mut models: BTreeMap<String, Vec<ReadyTarget>> = BTreeMap::new();
    let mut served: BTreeSet<String> = BTreeSet::new();
    for (i, t) in spec.targets.iter().enumerate() {
        let mut sets: Vec<&InferenceWorkerSet> = Vec::new();
        if let Some(name) = &t.worker_set {
            match inv.worker_set(name) {
                Some(w) => sets.push(w),
                None => missing.push(format!(
                    "targets[{i}]: InferenceWorkerSet {name:?} not found"
                )),
            }
        }
        if let Some(sel) = &t.worker_set_selector {
            let matched: Vec<_> = inv
                .worker_sets
                .iter()
                .filter(|w| {
                    selector_matches(sel, w.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
                })
                .collect();
            if matched.is_empty() {
                missing.push(format!(
                    "targets[{i}]: workerSetSelector matches no InferenceWorkerSet"
                ));
            }
            sets.extend(matched);
        }
        for w in sets {
            let model = w.spec.model.served().to_string();
            served.insert(model.clone());
            let ready = w.status.as_ref().map(|s| s.ready_replicas).unwrap_or(0);
            if ready > 0 {
                models.entry(model).or_default().push(ReadyTarget {
                    kind: TargetKind::InferenceWorkerSet,
                    name: name_of(w).to_string(),
                    role: t.role,
                    ready_replicas: Some(ready),
                });
            }
        }
        if let Some(name) = &t.provider {
            match inv.provider(name) {
                Some(p) => {
                    served.extend(p.spec.models.iter().cloned());
                    if is_ready(p.status.as_ref().map(|s| s.conditions.as_slice())) {
                        for m in &p.spec.models {
                            models.entry(m.clone()).or_default().push(ReadyTarget {
                                kind: TargetKind::InferenceProvider,
                                name: name.clone(),
                                role: t.role,
                                ready_replicas: None,
                            });
                        }
                    }
                }
                None => missing.push(format!(
                    "targets[{i}]: InferenceProvider {name:?} not found"
                )),
            }
        }
    }
    if missing.is_empty() {
        for a in &spec.model_aliases {
            if !served.contains(&a.model) {
                missing.push(format!(
                    "modelAliases {:?}: no target serves model {:?}",
                    a.name, a.model
                ));
            }
        }
    }
    let out: Vec<ModelTargets> = models
        .into_iter()
        .map(|(model, mut ready_targets)| {
            ready_targets.sort_by(|a, b| {
                (a.role == TargetRole::Overflow, a.kind, &a.name).cmp(&(
                    b.role == TargetRole::Overflow,
                    b.kind,
                    &b.name,
                ))
            });
            let aliases = spec
                .model_aliases
                .iter()
                .filter(|a| a.model == model)
                .map(|a| a.name.clone())
                .collect();
            ModelTargets {
                model,
                aliases,
                ready_targets,
            }
        })
        .collect();
    let primaries = out
        .iter()
        .flat_map(|m| &m.ready_targets)
        .filter(|t| t.role == TargetRole::Primary)
        .count();
    let readiness = if primaries == 0 {
        Readiness::Waiting(
            Reason::NoReadyTargets,
            "no primary target is ready".to_string(),
        )
    } else {
        Readiness::Ready(format!(
            "{primaries} ready primary targets for {} models",
            out.len()
        ))
    };
    let mut conditions = ref_conditions(&issues, &missing, readiness, generation, previous, now);
    let mut extra = vec![
        tokenizer_routing(spec, generation, now),
        super::identity::tenant_identity(spec, &inv.jwks, generation, now),
    ];
    extra.extend(super::identity::provider_targets(spec, generation, now));
    if let Some(facts) = &inv.transport {
        extra.push(super::tls::transport_condition(
            spec, facts, generation, now,
        ));
    }
    extra.extend(super::tls::gateway_condition(
        spec,
        inv.transport.as_ref(),
        generation,
        now,
    ));
    conditions.extend(condition::merge_conditions(previous, extra));
    (out, conditions)
}

/// Condition type saying what the routers do with the pool's models while a tokenizer is not
/// loaded (the live state per router is its `/readyz?model=NAME` and `/debug/tokenizers`).
pub const TOKENIZER_ROUTING: &str = "TokenizerRouting";

/// The pool's [`TOKENIZER_ROUTING`] condition: refused until loaded, or load-only.
fn tokenizer_routing(spec: &InferencePoolSpec, generation: Option<i64>, now: &Time) -> Condition {
    let (reason, message) = if spec.routing.allow_load_only {
        (
            Reason::LoadOnlyAllowed,
            "while a router has not loaded a model's tokenizer it routes that model's requests \
             on load alone (spec.routing.allowLoadOnly)",
        )
    } else {
        (
            Reason::TokenizerRequired,
            "while a router has not loaded a model's tokenizer it answers that model's requests \
             with 503 tokenizer_not_ready and /readyz?model=NAME fails; set \
             spec.routing.allowLoadOnly to route on load alone instead",
        )
    };
    condition::condition(
        TOKENIZER_ROUTING,
        ConditionStatus::True,
        reason,
        message.to_string(),
        generation,
        now,
    )
}

/// Policy conditions: the router's compiler accepts it (its issues, CEL twins included, make
/// Accepted=False), its pool, overflow providers and route targets exist, and its route
/// targets are WorkerSets; then Ready=True with reason [`ENFORCED`].
pub fn policy_conditions(
    spec: &InferencePolicySpec,
    generation: Option<i64>,
    previous: &[Condition],
    inv: &Inventory,
    now: &Time,
) -> Vec<Condition> {
    let compiled = InferencePolicy::new("policy", spec.clone());
    let issues: Vec<SpecIssue> = match kvroute_policy::compile(std::slice::from_ref(&compiled)) {
        Ok(_) => Vec::new(),
        Err(e) => e
            .into_iter()
            .map(|i| SpecIssue::new(i.field, i.message))
            .collect(),
    };
    let mut missing = Vec::new();
    if let Some(pool) = &spec.pool
        && !inv.pools.iter().any(|p| name_of(p) == pool)
    {
        missing.push(format!("pool: InferencePool {pool:?} not found"));
    }
    for p in spec.referenced_providers() {
        if inv.provider(p).is_none() && !missing.iter().any(|m| m.contains(&format!("{p:?}"))) {
            missing.push(format!("overflow: InferenceProvider {p:?} not found"));
        }
    }
    let mut seen = BTreeSet::new();
    let mut provider_targets = Vec::new();
    for t in spec.referenced_targets() {
        if !seen.insert(t) || inv.worker_set(t).is_some() {
            continue;
        }
        if inv.provider(t).is_some() {
            provider_targets.push(format!("{t:?}"));
        } else {
            missing.push(format!(
                "route: no InferenceWorkerSet or InferenceProvider named {t:?}"
            ));
        }
    }
    for m in spec
        .rules
        .iter()
        .filter_map(|r| r.actions.route.as_ref()?.model.as_deref())
    {
        let served = inv.worker_sets.iter().any(|w| w.spec.model.served() == m)
            || inv
                .pools
                .iter()
                .any(|p| p.spec.model_aliases.iter().any(|a| a.name == m));
        let line = format!("route.model: no InferenceWorkerSet serves model {m:?}");
        if !served && !missing.contains(&line) {
            missing.push(line);
        }
    }
    let readiness = if provider_targets.is_empty() {
        Readiness::Enforced(format!("{} rules enforced by the router", spec.rules.len()))
    } else {
        Readiness::Waiting(
            Reason::UnroutableTarget,
            format!(
                "route targets {} are InferenceProviders; route actions restrict local \
                 InferenceWorkerSets only (reach a provider with overflow)",
                provider_targets.join(", ")
            ),
        )
    };
    ref_conditions(&issues, &missing, readiness, generation, previous, now)
}

/// Provider conditions: its GatewayBackend exists and is Ready (the router relays through
/// it), plus [`OPENAI_CLIENTS`]=False for Anthropic providers (OpenAI requests are not
/// translated to them; they stay local).
pub fn provider_conditions(
    spec: &InferenceProviderSpec,
    generation: Option<i64>,
    previous: &[Condition],
    inv: &Inventory,
    now: &Time,
) -> Vec<Condition> {
    let issues = spec.validate();
    let name = &spec.gateway_backend_ref.name;
    let backend = inv.backends.iter().find(|b| name_of(*b) == name);
    let missing: Vec<String> = match backend {
        None => vec![format!(
            "gatewayBackendRef: GatewayBackend {name:?} not found"
        )],
        Some(_) => Vec::new(),
    };
    let backend_conditions =
        backend.and_then(|b| b.status.as_ref().map(|s| s.conditions.as_slice()));
    let readiness = if is_ready(backend_conditions) {
        let limits = spec.limits.as_ref().map(|l| {
            let mut parts = Vec::new();
            if let Some(n) = l.requests_per_minute {
                parts.push(format!("{n} requests/min"));
            }
            if let Some(n) = l.tokens_per_minute {
                parts.push(format!("{n} tokens/min"));
            }
            if let Some(n) = l.max_concurrency {
                parts.push(format!("{n} in flight"));
            }
            parts
        });
        let limits = match limits {
            Some(parts) if !parts.is_empty() => {
                format!("; limits {} kept by each router replica", parts.join(", "))
            }
            _ => String::new(),
        };
        Readiness::Enforced(format!(
            "the router relays overflow to {} model(s) via GatewayBackend {name:?}{limits}",
            spec.models.len()
        ))
    } else if is_accepted_and_resolved(backend_conditions) {
        Readiness::Waiting(
            Reason::BackendNotReady,
            format!("GatewayBackend {name:?} is not Ready"),
        )
    } else {
        Readiness::Waiting(
            Reason::BackendNotAccepted,
            format!("GatewayBackend {name:?} is not accepted or its Secrets do not resolve"),
        )
    };
    let mut conditions = ref_conditions(&issues, &missing, readiness, generation, previous, now);
    if spec.kind == ProviderKind::Anthropic && issues.is_empty() {
        let c = condition::condition(
            OPENAI_CLIENTS,
            ConditionStatus::False,
            Reason::NotTranslated,
            "OpenAI /v1/chat/completions and /v1/completions requests are not translated to an Anthropic provider: they stay local (503 when no local worker can take them); Anthropic /v1/messages requests overflow",
            generation,
            now,
        );
        conditions.extend(condition::merge_conditions(previous, vec![c]));
    }
    conditions
}

/// GatewayBackend conditions: each referenced Secret exists (in the router's namespace, where
/// the operator mounts it from) and has the named key; then the router relays through it
/// (Ready=True, [`ENFORCED`]). `insecureSkipVerify` adds [`TLS_VERIFIED`]=False.
pub fn backend_conditions(
    spec: &GatewayBackendSpec,
    generation: Option<i64>,
    previous: &[Condition],
    inv: &Inventory,
    now: &Time,
) -> Vec<Condition> {
    let issues = spec.validate();
    let mut missing = Vec::new();
    for (field, r) in spec.secret_refs() {
        match inv.secrets.get(&r.name) {
            None => missing.push(format!("{field}: Secret {:?} not found", r.name)),
            Some(keys) if !keys.contains(&r.key) => missing.push(format!(
                "{field}: Secret {:?} has no key {:?}",
                r.name, r.key
            )),
            Some(_) => {}
        }
    }
    let tls = spec.tls.clone().unwrap_or_default();
    let https = spec.url.starts_with("https://");
    let verification = match (https, tls.insecure_skip_verify, &tls.ca_secret_ref) {
        (false, _, _) => "plain HTTP, no TLS".to_string(),
        (true, true, _) => {
            "TLS without certificate verification (insecureSkipVerify: testing only)".to_string()
        }
        (true, false, Some(ca)) => format!("TLS verified against the CA in Secret {:?}", ca.name),
        (true, false, None) => "TLS verified against the platform roots".to_string(),
    };
    let sni = tls
        .sni
        .as_ref()
        .map(|s| format!(", server name {s:?}"))
        .unwrap_or_default();
    let auth = match &spec.auth {
        None => "no credential".to_string(),
        Some(a) if a.type_ == AuthType::Header => format!(
            "credential in header {:?}",
            a.header_name.as_deref().unwrap_or_default()
        ),
        Some(_) => "bearer credential".to_string(),
    };
    let readiness = Readiness::Enforced(format!(
        "the router relays overflow requests through this backend: {verification}{sni}, {auth}"
    ));
    let mut conditions = ref_conditions(&issues, &missing, readiness, generation, previous, now);
    if tls.insecure_skip_verify && issues.is_empty() {
        let c = condition::condition(
            TLS_VERIFIED,
            ConditionStatus::False,
            Reason::InsecureSkipVerify,
            "certificate verification is off: anyone on the path can impersonate the backend and read its credential",
            generation,
            now,
        );
        conditions.extend(condition::merge_conditions(previous, vec![c]));
    }
    conditions
}

#[cfg(test)]
#[path = "refs_tests.rs"]
mod tests;
