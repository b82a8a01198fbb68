//! `InferencePolicy`: ordered routing rules, evaluated top to bottom, the first rule whose
//! `match` fits a request applying its actions. The router compiles them with
//! `kvroute_policy::compile` and evaluates them on every request (gateway, Pick API, explain);
//! the operator reports Ready=True (reason `Enforced`) only for a policy that compiles and whose
//! references resolve, else Ready=False with the reason.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::validation::SpecIssue;

/// Most targets a route action may list (as many as a pool may have).
pub const MAX_ROUTE_TARGETS: u32 = 64;
/// Most weighted targets a route action may list (bounded lower than the target lists so
/// that its subset rule stays cheap; docs/crds.md).
pub const MAX_ROUTE_WEIGHTS: u32 = 16;
/// Most service classes a rule may match on.
pub const MAX_MATCH_SERVICE_CLASSES: u32 = 32;

/// Desired state of an InferencePolicy.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kvroute.dev",
    version = "v1alpha1",
    kind = "InferencePolicy",
    plural = "inferencepolicies",
    namespaced,
    status = "InferencePolicyStatus",
    shortname = "ipolicy",
    category = "kvroute",
    derive = "PartialEq",
    doc = "Ordered routing rules (first match wins): route or prefer (weighted) targets, local only, reject, overflow to a provider, limits per tenant, service class. Enforced by the router on every request; Ready=True (reason Enforced) once it compiles and its references resolve.",
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.pool"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePolicySpec {
    /// InferencePool the rules apply to; all pools of the namespace when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pool: Option<String>,
    /// Rules in evaluation order.
    #[schemars(length(min = 1, max = 256))]
    pub rules: Vec<PolicyRule>,
}

/// One rule: a match and the actions taken when it matches.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    /// Rule name, used in metrics and `kvroute explain`.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Conditions on the request; an empty match matches everything.
    #[serde(default, rename = "match")]
    pub match_: RuleMatch,
    /// What to do with a matching request.
    pub actions: RuleActions,
}

/// Request conditions; every listed condition must hold (a list matches when any entry does).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleMatch {
    /// Tenants (from the tenant header or API key) the rule applies to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
    /// Requested model names (or aliases).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Request labels that must all be present (e.g. `pii`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// Headers that must be present, optionally with an exact value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatch>,
    /// Service classes (header `x-kvroute-service-class`) the rule applies to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_MATCH_SERVICE_CLASSES), inner(length(min = 1, max = 63)))]
    pub service_classes: Vec<String>,
    /// Conditions on the state of the pool's local candidates at decision time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_state: Option<PoolStateMatch>,
    /// Prompt tokens of the request (0 when the router could not tokenize it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<IntRange>,
    /// The request's output limit (`max_tokens`); a request without one matches no range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<IntRange>,
}

/// Pool-state conditions, each a range over one figure of the request's local candidates
/// (every listed range must hold; a figure that is unknown, e.g. GPU usage without GPU
/// statistics, matches no range).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolStateMatch {
    /// Best (lowest) predicted TTFT over the candidates, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_ttft_ms: Option<IntRange>,
    /// Waiting requests at the candidate with the best predicted TTFT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_queue: Option<IntRange>,
    /// Waiting requests over all candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_queue: Option<IntRange>,
    /// Lowest KV cache usage over the candidates, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_kv_usage_percent: Option<IntRange>,
    /// Mean KV cache usage over the candidates, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_kv_usage_percent: Option<IntRange>,
    /// Lowest GPU utilisation over the candidates (each worker's mean over its GPUs), percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_gpu_usage_percent: Option<IntRange>,
    /// Mean GPU utilisation over the candidates, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_gpu_usage_percent: Option<IntRange>,
}

/// A half-open range `[atLeast, below)`; an unset bound is open.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.atLeast) || !has(self.below) || self.atLeast < self.below", "message": "atLeast must be lower than below"}
]))]
pub struct IntRange {
    /// The figure is at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub at_least: Option<i64>,
    /// The figure is below this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub below: Option<i64>,
}

/// A header condition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderMatch {
    /// Header name (case-insensitive).
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Exact value; any value when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// Actions of a rule. `reject` stands alone; the others combine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.route) || has(self.reject) || has(self.overflow) || has(self.limits) || has(self.serviceClass)", "message": "a rule needs at least one action"},
    {"rule": "!has(self.reject) || !(has(self.route) || has(self.overflow) || has(self.limits) || has(self.serviceClass))", "message": "reject cannot be combined with other actions"}
]))]
pub struct RuleActions {
    /// Restrict or prefer targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteAction>,
    /// Refuse the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reject: Option<RejectAction>,
    /// Send to a provider when local workers are too slow or too busy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overflow: Option<OverflowAction>,
    /// Per-tenant request and token rates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsAction>,
    /// Service class and TTFT target of the request (SLO-aware shedding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_class: Option<ServiceClassAction>,
}

/// A request's service class: its name (overrides the header's), a TTFT target and whether
/// it may be shed when every local candidate is predicted to miss the target.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceClassAction {
    /// Class name (e.g. `interactive`, `batch`); the header's class when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,
    /// TTFT target, milliseconds (header `x-kvroute-ttft-target-ms` overrides it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub ttft_target_ms: Option<i64>,
    /// Refuse the request early (429 + Retry-After) when every local candidate's predicted
    /// TTFT misses the target, instead of queueing it into a miss.
    #[serde(default)]
    pub sheddable: bool,
}

/// Target restrictions; names are WorkerSet or Provider names of the pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "size(self.allowedTargets) == 0 || self.preferredTargets.all(t, t in self.allowedTargets)", "message": "preferredTargets must be a subset of allowedTargets"},
    {"rule": "size(self.allowedTargets) == 0 || !has(self.weights) || self.weights.all(w, w.target in self.allowedTargets)", "message": "weights must name allowedTargets"},
    {"rule": "!has(self.model) || (size(self.allowedTargets) == 0 && (!has(self.weights) || size(self.weights) == 0))", "message": "model cannot be combined with allowedTargets or weights (they name WorkerSets of one model)"}
]))]
pub struct RouteAction {
    /// Only these targets may serve the request (all when empty). Bounded like a pool's
    /// targets, so that the subset rule stays cheap for the API server (docs/crds.md).
    #[serde(default)]
    #[schemars(length(max = MAX_ROUTE_TARGETS), inner(length(min = 1, max = 253)))]
    pub allowed_targets: Vec<String>,
    /// Tried first when their predicted TTFT is competitive.
    #[serde(default)]
    #[schemars(length(max = MAX_ROUTE_TARGETS), inner(length(min = 1, max = 253)))]
    pub preferred_targets: Vec<String>,
    /// Never leave the cluster (no providers), e.g. for `pii`.
    #[serde(default)]
    pub local_only: bool,
    /// Split the request between targets by weight (one target drawn per request, then
    /// restricted to it while it has candidates).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ROUTE_WEIGHTS))]
    pub weights: Vec<TargetWeight>,
    /// Serve the request with this model instead of the requested one (a model the pool
    /// serves, e.g. a smaller one for `size:small` requests), unless `keepWhenCached` keeps
    /// it: the router plans over the WorkerSets of both models, each with its own tokenizer
    /// and cache view. The worker's response names the model that served it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub model: Option<String>,
    /// With `model`: stay on the requested model when one of its workers already caches a
    /// prefix of the prompt and is predicted to answer before every worker of the
    /// alternative. Default true; false switches whenever the alternative has a ready worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_when_cached: Option<bool>,
}

/// One weighted target of a route action.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetWeight {
    /// WorkerSet name.
    #[schemars(length(min = 1, max = 253))]
    pub target: String,
    /// Relative weight (0 takes no traffic).
    #[schemars(range(min = 0, max = 10000))]
    pub weight: i32,
}

/// Reject with an HTTP status and message.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RejectAction {
    /// HTTP status (400-599).
    #[serde(default = "default_reject_status")]
    #[schemars(range(min = 400, max = 599))]
    pub status: i32,
    /// Message returned in the OpenAI-style error body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
}

/// Overflow to a provider when a threshold is crossed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.ttftThresholdMs) || has(self.queueThreshold)", "message": "overflow needs ttftThresholdMs or queueThreshold"}
]))]
pub struct OverflowAction {
    /// InferenceProvider name.
    #[schemars(length(min = 1, max = 253))]
    pub provider: String,
    /// Overflow when the best local predicted TTFT exceeds this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub ttft_threshold_ms: Option<i64>,
    /// Overflow when the best local worker has more waiting requests than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub queue_threshold: Option<i32>,
}

/// Per-tenant limits (token buckets refilled per minute).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.requestsPerMinute) || has(self.tokensPerMinute) || has(self.maxConcurrency)", "message": "limits needs requestsPerMinute, tokensPerMinute or maxConcurrency"}
]))]
pub struct LimitsAction {
    /// Requests per minute per tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub requests_per_minute: Option<i64>,
    /// Prompt + completion tokens per minute per tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub tokens_per_minute: Option<i64>,
    /// Requests in flight at once per tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrency: Option<i64>,
}

/// Observed state of an InferencePolicy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePolicyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` (the spec is valid), `ResolvedRefs` (what it names exists) and `Ready`
    /// (True with reason `Enforced` when the router's compiler accepts it and its references
    /// resolve; False with the reason otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

fn default_reject_status() -> i32 {
    403
}

impl InferencePolicySpec {
    /// The CEL rules of this type, evaluated locally (see [`crate::validation`]).
    pub fn validate(&self) -> Vec<SpecIssue> {
        let mut issues = Vec::new();
        if self.rules.is_empty() {
            issues.push(SpecIssue::new(
                "spec.rules",
                "a policy needs at least one rule",
            ));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            let at = |f: &str| format!("spec.rules[{i}].{f}");
            if self.rules[..i].iter().any(|r| r.name == rule.name) {
                issues.push(SpecIssue::new(
                    at("name"),
                    format!("duplicate rule name {:?}", rule.name),
                ));
            }
            let a = &rule.actions;
            let others = a.route.is_some()
                || a.overflow.is_some()
                || a.limits.is_some()
                || a.service_class.is_some();
            if !others && a.reject.is_none() {
                issues.push(SpecIssue::new(
                    at("actions"),
                    "a rule needs at least one action",
                ));
            }
            if others && a.reject.is_some() {
                issues.push(SpecIssue::new(
                    at("actions"),
                    "reject cannot be combined with other actions",
                ));
            }
            if let Some(route) = &a.route
                && !route.allowed_targets.is_empty()
                && let Some(t) = route
                    .preferred_targets
                    .iter()
                    .find(|t| !route.allowed_targets.contains(t))
            {
                issues.push(SpecIssue::new(
                    at("actions.route.preferredTargets"),
                    format!("preferred target {t:?} is not in allowedTargets"),
                ));
            }
            if let Some(route) = &a.route
                && !route.allowed_targets.is_empty()
                && let Some(w) = route
                    .weights
                    .iter()
                    .find(|w| !route.allowed_targets.contains(&w.target))
            {
                issues.push(SpecIssue::new(
                    at("actions.route.weights"),
                    format!("weighted target {:?} is not in allowedTargets", w.target),
                ));
            }
            if let Some(route) = &a.route
                && route.model.is_some()
                && (!route.allowed_targets.is_empty() || !route.weights.is_empty())
            {
                issues.push(SpecIssue::new(
                    at("actions.route.model"),
                    "model cannot be combined with allowedTargets or weights (they name WorkerSets of one model)",
                ));
            }
            if let Some(route) = &a.route
                && !route.weights.is_empty()
                && route.weights.iter().all(|w| w.weight <= 0)
            {
                issues.push(SpecIssue::new(
                    at("actions.route.weights"),
                    "at least one weight must be positive",
                ));
            }
            let m = &rule.match_;
            let request_ranges = [
                ("promptTokens", m.prompt_tokens),
                ("maxOutputTokens", m.max_output_tokens),
            ];
            for (name, r) in request_ranges
                .iter()
                .filter_map(|(n, r)| r.map(|r| (*n, r)))
            {
                if let (Some(lo), Some(hi)) = (r.at_least, r.below)
                    && lo >= hi
                {
                    issues.push(SpecIssue::new(
                        at(&format!("match.{name}")),
                        "atLeast must be lower than below",
                    ));
                }
            }
            if let Some(ps) = &rule.match_.pool_state {
                for (name, r) in ps.ranges() {
                    if let (Some(lo), Some(hi)) = (r.at_least, r.below)
                        && lo >= hi
                    {
                        issues.push(SpecIssue::new(
                            at(&format!("match.poolState.{name}")),
                            "atLeast must be lower than below",
                        ));
                    }
                }
            }
            if let Some(o) = &a.overflow
                && o.ttft_threshold_ms.is_none()
                && o.queue_threshold.is_none()
            {
                issues.push(SpecIssue::new(
                    at("actions.overflow"),
                    "overflow needs ttftThresholdMs or queueThreshold",
                ));
            }
            if let Some(l) = &a.limits
                && l.requests_per_minute.is_none()
                && l.tokens_per_minute.is_none()
                && l.max_concurrency.is_none()
            {
                issues.push(SpecIssue::new(
                    at("actions.limits"),
                    "limits needs requestsPerMinute, tokensPerMinute or maxConcurrency",
                ));
            }
            if let Some(r) = &a.reject
                && !(400..=599).contains(&r.status)
            {
                issues.push(SpecIssue::new(
                    at("actions.reject.status"),
                    "status must be 400-599",
                ));
            }
        }
        issues
    }

    /// Provider names referenced by overflow actions.
    pub fn referenced_providers(&self) -> impl Iterator<Item = &str> {
        self.rules
            .iter()
            .filter_map(|r| r.actions.overflow.as_ref())
            .map(|o| o.provider.as_str())
    }

    /// Target names referenced by route actions (WorkerSets or Providers).
    pub fn referenced_targets(&self) -> impl Iterator<Item = &str> {
        self.rules
            .iter()
            .filter_map(|r| r.actions.route.as_ref())
            .flat_map(|r| {
                r.allowed_targets
                    .iter()
                    .chain(&r.preferred_targets)
                    .chain(r.weights.iter().map(|w| &w.target))
            })
            .map(String::as_str)
    }
}

impl PoolStateMatch {
    /// The ranges that are set, each with its field name.
    pub fn ranges(&self) -> impl Iterator<Item = (&'static str, IntRange)> + '_ {
        [
            ("bestTtftMs", self.best_ttft_ms),
            ("bestQueue", self.best_queue),
            ("totalQueue", self.total_queue),
            ("minKvUsagePercent", self.min_kv_usage_percent),
            ("meanKvUsagePercent", self.mean_kv_usage_percent),
            ("minGpuUsagePercent", self.min_gpu_usage_percent),
            ("meanGpuUsagePercent", self.mean_gpu_usage_percent),
        ]
        .into_iter()
        .filter_map(|(n, r)| r.map(|r| (n, r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> InferencePolicySpec {
        serde_saphyr::from_str(yaml).expect("spec parses")
    }

    const GOOD: &str = r#"
pool: chat
rules:
- name: pii-stays-local
  match: {labels: [pii]}
  actions: {route: {localOnly: true}}
- name: blocked
  match: {tenants: [evil]}
  actions: {reject: {status: 403, message: go away}}
- name: burst
  actions:
    overflow: {provider: openai, ttftThresholdMs: 2000}
    limits: {tokensPerMinute: 100000}
"#;

    #[test]
    fn new_fields_parse_and_validate() {
        let s = spec(
            r#"
rules:
- name: slo
  match:
    serviceClasses: [batch]
    poolState: {bestTtftMs: {atLeast: 500}, meanKvUsagePercent: {below: 90}}
  actions:
    serviceClass: {name: batch, ttftTargetMs: 800, sheddable: true}
    limits: {maxConcurrency: 4}
- name: canary
  actions:
    route: {allowedTargets: [a, b], weights: [{target: a, weight: 9}, {target: b, weight: 1}]}
- name: bad
  match: {poolState: {totalQueue: {atLeast: 5, below: 5}}}
  actions:
    route: {allowedTargets: [a], weights: [{target: c, weight: 0}]}
"#,
        );
        let fields: Vec<String> = s.validate().into_iter().map(|i| i.field).collect();
        assert_eq!(
            fields,
            vec![
                "spec.rules[2].actions.route.weights",
                "spec.rules[2].actions.route.weights",
                "spec.rules[2].match.poolState.totalQueue",
            ]
        );
        assert_eq!(
            s.rules[0]
                .actions
                .service_class
                .as_ref()
                .map(|c| c.sheddable),
            Some(true)
        );
        assert!(s.referenced_targets().any(|t| t == "c"));
    }

    #[test]
    fn good_policy_parses_and_validates() {
        let s = spec(GOOD);
        assert!(s.validate().is_empty(), "{:?}", s.validate());
        assert_eq!(s.rules[0].match_.labels, vec!["pii"]);
        assert_eq!(s.referenced_providers().collect::<Vec<_>>(), vec!["openai"]);
    }

    #[test]
    fn cel_twins_reject_combined_no_action_thresholds_and_subset() {
        let s = spec(
            r#"
rules:
- name: a
  actions: {reject: {}, route: {}}
- name: b
  actions: {}
- name: c
  actions: {overflow: {provider: p}}
- name: d
  actions: {route: {allowedTargets: [x], preferredTargets: [y]}}
- name: e
  actions: {limits: {}}
- name: e
  actions: {reject: {status: 200}}
"#,
        );
        let fields: Vec<String> = s.validate().into_iter().map(|i| i.field).collect();
        assert_eq!(
            fields,
            vec![
                "spec.rules[0].actions",
                "spec.rules[1].actions",
                "spec.rules[2].actions.overflow",
                "spec.rules[3].actions.route.preferredTargets",
                "spec.rules[4].actions.limits",
                "spec.rules[5].name",
                "spec.rules[5].actions.reject.status",
            ]
        );
    }
}
