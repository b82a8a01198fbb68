//! `InferencePolicy`: ordered routing rules, meant to be evaluated top to bottom, the first rule
//! whose `match` fits a request applying its actions. The router does not enforce them yet: the
//! operator validates a policy and resolves what it names (conditions Accepted, ResolvedRefs)
//! and reports Ready=False with reason `NotEnforced`.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::validation::SpecIssue;

/// Most targets a route action may list (as many as a pool may have).
pub const MAX_ROUTE_TARGETS: u32 = 64;

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
    doc = "Ordered routing rules (first match wins): route, reject, overflow to a provider, rate and token limits per tenant. Validated by the operator but not yet enforced by the router (Ready=False, reason NotEnforced).",
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
    {"rule": "has(self.route) || has(self.reject) || has(self.overflow) || has(self.limits)", "message": "a rule needs at least one action"},
    {"rule": "!has(self.reject) || !(has(self.route) || has(self.overflow) || has(self.limits))", "message": "reject cannot be combined with other actions"}
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
}

/// Target restrictions; names are WorkerSet or Provider names of the pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "size(self.allowedTargets) == 0 || self.preferredTargets.all(t, t in self.allowedTargets)", "message": "preferredTargets must be a subset of allowedTargets"}
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
    {"rule": "has(self.requestsPerMinute) || has(self.tokensPerMinute)", "message": "limits needs requestsPerMinute or tokensPerMinute"}
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
}

/// Observed state of an InferencePolicy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePolicyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` (the spec is valid), `ResolvedRefs` (what it names exists) and `Ready`
    /// (False with reason `NotEnforced` while the router does not act on this kind).
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
            let others = a.route.is_some() || a.overflow.is_some() || a.limits.is_some();
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
            {
                issues.push(SpecIssue::new(
                    at("actions.limits"),
                    "limits needs requestsPerMinute or tokensPerMinute",
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
            .flat_map(|r| r.allowed_targets.iter().chain(&r.preferred_targets))
            .map(String::as_str)
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
