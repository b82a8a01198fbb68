//! InferencePolicy enforcement in the router: the compiled set in force, its hot reload
//! (an invalid set is refused, counted, logged and shown in `/debug/policies`; the last good
//! set stays), and what the one decision path ([`RouterState::decide`]) does with a verdict.
//!
//! ```text
//! discovery (static file | Kubernetes reflector) --set_policies--> kvroute_policy::compile
//!     ok: swap Arc<PolicySet>       err: keep the old set, count, log, remember the issues
//! decide: RequestFacts + PoolState (from the plan's candidates) --evaluate--> Verdict
//!     reject -> PickError::Rejected      route/prefer/weights/localOnly -> candidates kept
//!     service class + TTFT target, sheddable, every candidate predicted late -> PickError::Shed
//!     limits / overflow -> left on the Verdict for the limiter and the provider relay
//! ```
//!
//! Metric labels here are rule and policy names, which operators declare (never a client's
//! string).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kvroute_crds::InferencePolicy;
use kvroute_policy::{PolicyIssue, PolicySet, Route, Verdict};
use parking_lot::{Mutex, RwLock};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use serde::Serialize;

use super::RouterState;
use crate::routing::{Candidate, WorkerId};

/// Header naming the request's service class.
pub const SERVICE_CLASS_HEADER: &str = "x-kvroute-service-class";
/// Header giving the request's TTFT target, milliseconds.
pub const TTFT_TARGET_HEADER: &str = "x-kvroute-ttft-target-ms";
/// Header whose value seeds the request's weighted draws (alias splits, weighted targets).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// A preferred target is used while its best predicted TTFT is within this many seconds of
/// the best overall, or within [`PREFER_SLACK_FRACTION`] of it, whichever is larger.
pub const PREFER_SLACK_S: f64 = 0.05;
/// See [`PREFER_SLACK_S`].
pub const PREFER_SLACK_FRACTION: f64 = 0.25;

/// Policy metrics (`kvroute_router_policy_*`, `kvroute_router_slo_shed_total`).
#[derive(Clone, Debug)]
pub struct PolicyMetrics {
    /// Policy set reloads by result (`applied`, `refused`).
    pub reloads: IntCounterVec,
    /// Requests by the rule that matched (`policy`, `rule`; `-`/`-` for the default).
    pub verdicts: IntCounterVec,
    /// Requests refused early because every local candidate would miss their TTFT target,
    /// by rule.
    pub slo_shed: IntCounterVec,
    /// Requests refused by a reject rule, by rule.
    pub rejected: IntCounterVec,
    /// Service-class or TTFT-target headers that were not valid (ignored).
    pub bad_headers: IntCounter,
    /// Rules in force.
    pub rules: IntGauge,
    /// Routed requests by classifier label (a fixed set: `pii`, `pii:<kind>`, `size:<class>`;
    /// labels a client adds are never a metric label).
    pub labels: IntCounterVec,
    /// Requests whose rule named an alternative model, by rule and outcome (see
    /// [`ModelSwitchRecord::outcome`]).
    pub model_switches: IntCounterVec,
}

impl PolicyMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let vec = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
        };
        let m = Self {
            reloads: vec(
                "kvroute_router_policy_reloads_total",
                "InferencePolicy set reloads by result (applied, refused: the last good set stays).",
                &["result"],
            )?,
            verdicts: vec(
                "kvroute_router_policy_verdicts_total",
                "Requests by the policy rule that matched (- for none).",
                &["policy", "rule"],
            )?,
            slo_shed: vec(
                "kvroute_router_slo_shed_total",
                "Sheddable requests refused with 429 because every local candidate was predicted to miss their TTFT target, by rule.",
                &["rule"],
            )?,
            rejected: vec(
                "kvroute_router_policy_rejected_total",
                "Requests refused by a reject rule, by rule.",
                &["rule"],
            )?,
            bad_headers: IntCounter::new(
                "kvroute_router_policy_bad_headers_total",
                "Invalid x-kvroute-service-class or x-kvroute-ttft-target-ms headers (ignored).",
            )?,
            rules: IntGauge::new("kvroute_router_policy_rules", "Policy rules in force.")?,
            labels: vec(
                "kvroute_router_request_labels_total",
                "Routed requests by classifier label (pii, pii:<kind>, size:<class>).",
                &["label"],
            )?,
            model_switches: vec(
                "kvroute_router_policy_model_switches_total",
                "Requests whose rule named an alternative model, by rule and outcome (switched, kept-cached, unavailable).",
                &["rule", "outcome"],
            )?,
        };
        registry.register(Box::new(m.model_switches.clone()))?;
        registry.register(Box::new(m.reloads.clone()))?;
        registry.register(Box::new(m.verdicts.clone()))?;
        registry.register(Box::new(m.slo_shed.clone()))?;
        registry.register(Box::new(m.rejected.clone()))?;
        registry.register(Box::new(m.bad_headers.clone()))?;
        registry.register(Box::new(m.rules.clone()))?;
        registry.register(Box::new(m.labels.clone()))?;
        for l in super::labels::classifier_label_names() {
            m.labels.with_label_values(&[l]);
        }
        for r in ["applied", "refused"] {
            m.reloads.with_label_values(&[r]);
        }
        Ok(m)
    }
}

/// What `/debug/policies` shows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoliciesReport {
    /// Successful loads so far (0: none loaded, no policy in force).
    pub generation: u64,
    /// Policies in force (`namespace/name`).
    pub policies: Vec<String>,
    /// Rules in force.
    pub rules: usize,
    /// Refused loads so far.
    pub refused: u64,
    /// The issues of the last refused load, if the latest load was refused.
    pub last_refused: Option<Vec<String>>,
}

/// The set in force and its bookkeeping (a field of the state).
pub(super) struct PolicyStore {
    set: RwLock<Arc<PolicySet>>,
    report: Mutex<PoliciesReport>,
    seq: AtomicU64,
    /// A watch feeds the set (Kubernetes): readiness waits for its first list.
    awaited: AtomicBool,
}

impl Default for PolicyStore {
    fn default() -> Self {
        Self {
            set: RwLock::new(Arc::new(PolicySet::empty())),
            report: Mutex::new(PoliciesReport::default()),
            seq: AtomicU64::new(0),
            awaited: AtomicBool::new(false),
        }
    }
}

impl RouterState {
    /// Compiles `policies` and puts them in force. An invalid set is refused as a whole:
    /// counted, logged with every issue (each naming its policy), shown in
    /// `/debug/policies`, and the last good set stays in force. Returns the rule count.
    pub fn set_policies(&self, policies: &[InferencePolicy]) -> Result<usize, Vec<PolicyIssue>> {
        let m = &self.0.metrics.policy;
        match kvroute_policy::compile(policies) {
            Ok(set) => {
                let rules = set.rule_count();
                let names = set.policies().to_vec();
                *self.0.policy.set.write() = Arc::new(set);
                let mut r = self.0.policy.report.lock();
                r.generation += 1;
                r.policies = names;
                r.rules = rules;
                r.last_refused = None;
                drop(r);
                m.reloads.with_label_values(&["applied"]).inc();
                m.rules.set(i64::try_from(rules).unwrap_or(i64::MAX));
                tracing::info!(policies = policies.len(), rules, "policy set applied");
                Ok(rules)
            }
            Err(issues) => {
                let text: Vec<String> = issues.iter().map(ToString::to_string).collect();
                m.reloads.with_label_values(&["refused"]).inc();
                tracing::warn!(
                    issues = %text.join("; "),
                    "policy set refused; the last good set stays in force"
                );
                let mut r = self.0.policy.report.lock();
                r.refused += 1;
                r.last_refused = Some(text);
                Err(issues)
            }
        }
    }

    /// Marks the policy set as fed by a watch (Kubernetes): the replica is not ready until
    /// the first list has been compiled (applied or refused), so that it never serves a
    /// request before its policies are in force.
    pub fn await_policies(&self) {
        self.0.policy.awaited.store(true, Ordering::Release);
    }

    /// Why readiness waits for policies, if it does: awaited and nothing loaded yet.
    pub(super) fn policies_pending(&self) -> bool {
        if !self.0.policy.awaited.load(Ordering::Acquire) {
            return false;
        }
        let r = self.0.policy.report.lock();
        r.generation == 0 && r.refused == 0
    }

    /// The policy set in force and the reload history (`/debug/policies`).
    pub fn policies_report(&self) -> PoliciesReport {
        self.0.policy.report.lock().clone()
    }

    /// The compiled set in force.
    pub(super) fn policy_set(&self) -> Arc<PolicySet> {
        self.0.policy.set.read().clone()
    }

    /// The next seed of the router's own sequence (requests without a request id): seeded
    /// by `--seed`, so a replica's draws are reproducible.
    pub(super) fn next_seed(&self) -> u64 {
        let n = self.0.policy.seq.fetch_add(1, Ordering::Relaxed);
        kvroute_policy::mix(self.0.config.seed ^ kvroute_policy::mix(n))
    }
}

/// `http::HeaderMap` as the policy engine reads headers.
pub(super) struct Headers<'a>(pub Option<&'a http::HeaderMap>);

impl kvroute_policy::HeaderSource for Headers<'_> {
    fn header(&self, name: &str) -> Option<&str> {
        self.0?.get(name)?.to_str().ok()
    }
}

/// The request's class and TTFT target from its headers. Invalid values are ignored and
/// counted (a class is a lowercase name of at most 63 characters; a target a positive
/// integer of milliseconds).
pub(super) fn class_headers<'a>(
    headers: Option<&'a http::HeaderMap>,
    bad: &IntCounter,
) -> (Option<&'a str>, Option<u64>) {
    let Some(h) = headers else {
        return (None, None);
    };
    let class = h.get(SERVICE_CLASS_HEADER).and_then(|v| {
        let ok = v.to_str().ok().filter(|s| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
        if ok.is_none() {
            bad.inc();
        }
        ok
    });
    let target = h.get(TTFT_TARGET_HEADER).and_then(|v| {
        let ok = v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0);
        if ok.is_none() {
            bad.inc();
        }
        ok
    });
    (class, target)
}

/// The seed of a request's weighted draws: its `x-request-id`, when it has one.
pub(super) fn request_seed(headers: Option<&http::HeaderMap>) -> Option<u64> {
    headers?
        .get(REQUEST_ID_HEADER)?
        .to_str()
        .ok()
        .map(kvroute_policy::seed_of)
}

/// The matched rule and what it did, as the decision record shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VerdictRecord {
    /// Policy of the matched rule (`namespace/name`); `None`: no rule matched (default).
    pub policy: Option<String>,
    /// The matched rule.
    pub rule: Option<String>,
    /// Its actions: `route`, `local_only`, `reject`, `overflow`, `limits`, `service_class`.
    pub actions: Vec<&'static str>,
    /// WorkerSets the candidates were restricted to (empty: not restricted).
    pub targets: Vec<String>,
    /// The weighted target drawn, if the rule splits.
    pub weighted_target: Option<String>,
    /// The service class in effect (rule, else header).
    pub service_class: Option<String>,
    /// The TTFT target in effect, milliseconds (header, else rule).
    pub ttft_target_ms: Option<u64>,
    /// Whether the request may be shed.
    pub sheddable: bool,
    /// Limits for the limiter (requests/min, tokens/min, concurrency).
    pub limits: Option<[Option<u64>; 3]>,
    /// Overflow provider named by the rule (acted on by the provider relay).
    pub overflow_provider: Option<String>,
    /// The rule's alternative model and what became of it, if it names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_switch: Option<ModelSwitchRecord>,
}

/// A route action's alternative model at decision time: both models' best predicted TTFT
/// and whether the request moved.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ModelSwitchRecord {
    /// The model the request asked for (after alias resolution).
    pub requested: String,
    /// The rule's alternative model.
    pub alternative: String,
    /// `switched` (served by the alternative), `kept-cached` (a worker of the requested
    /// model caches a prefix of the prompt and was predicted to answer first), or
    /// `unavailable` (the alternative had no ready worker in the request's pool, or no
    /// tokenizer yet; see `detail`).
    pub outcome: &'static str,
    /// Why the alternative was unavailable, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Best predicted TTFT over the requested model's candidates, seconds.
    pub requested_best_ttft_s: Option<f64>,
    /// Best predicted TTFT over the requested model's candidates that cache a prefix of the
    /// prompt (stored blocks, or blocks a request in flight there is about to store).
    pub requested_cached_best_ttft_s: Option<f64>,
    /// Best predicted TTFT over the alternative's candidates, seconds.
    pub alternative_best_ttft_s: Option<f64>,
}

impl VerdictRecord {
    /// The record of `v`, before candidates are restricted.
    pub(super) fn of(v: &Verdict<'_>) -> Self {
        let mut actions = Vec::new();
        if let Some(a) = v.action() {
            if a.route.is_some() {
                actions.push("route");
            }
            if v.local_only() {
                actions.push("local_only");
            }
            if a.reject.is_some() {
                actions.push("reject");
            }
            if a.overflow.is_some() {
                actions.push("overflow");
            }
            if a.limits.is_some() {
                actions.push("limits");
            }
            if a.service_class.is_some() {
                actions.push("service_class");
            }
        }
        Self {
            policy: v.policy().map(str::to_string),
            rule: v.rule().map(str::to_string),
            actions,
            limits: v.limits().map(|l| {
                [
                    l.requests_per_minute,
                    l.tokens_per_minute,
                    l.max_concurrency,
                ]
            }),
            overflow_provider: v.overflow().map(|o| o.provider.to_string()),
            ..Self::default()
        }
    }
}

/// Restricts `candidates` by a route action: allowed targets, then a weighted target (while
/// it has candidates), then preferred targets (while competitive; see [`PREFER_SLACK_S`]).
/// `set_of` names a candidate's WorkerSet. Returns the weighted target drawn and whether
/// anything was left; the kept sets go into `record.targets`.
pub(super) fn restrict(
    route: &Route,
    candidates: &mut Vec<Candidate>,
    set_of: &dyn Fn(WorkerId) -> Option<String>,
    seed: u64,
    record: &mut VerdictRecord,
) -> bool {
    let set = |c: &Candidate| set_of(c.worker).unwrap_or_default();
    if !route.allowed.is_empty() {
        candidates.retain(|c| route.allows(&set(c)));
    }
    if let Some(target) = route.weighted_target(seed) {
        record.weighted_target = Some(target.to_string());
        if candidates.iter().any(|c| set(c) == target) {
            candidates.retain(|c| set(c) == target);
        }
    }
    if !route.preferred.is_empty() {
        let best = |it: &mut dyn Iterator<Item = &Candidate>| {
            it.map(|c| c.predicted_ttft)
                .filter(|t| t.is_finite())
                .fold(f64::INFINITY, f64::min)
        };
        let all = best(&mut candidates.iter());
        let preferred = best(&mut candidates.iter().filter(|c| route.prefers(&set(c))));
        let any_preferred = candidates.iter().any(|c| route.prefers(&set(c)));
        let slack = PREFER_SLACK_S.max(PREFER_SLACK_FRACTION * all);
        let competitive = !all.is_finite() || preferred <= all + slack;
        if any_preferred && competitive {
            candidates.retain(|c| route.prefers(&set(c)));
        }
    }
    if !route.allowed.is_empty() || record.weighted_target.is_some() || !route.preferred.is_empty()
    {
        let mut kept: Vec<String> = candidates.iter().map(set).collect();
        kept.sort();
        kept.dedup();
        record.targets = kept;
    }
    !candidates.is_empty()
}
