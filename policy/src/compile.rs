//! From InferencePolicy objects to a [`PolicySet`]: validation (the CRD's CEL twins plus what
//! only the engine checks), interning, ordering; and the evaluation loop over it.

use std::collections::HashMap;
use std::fmt;

use kvroute_crds::InferencePolicy;
use kvroute_crds::policy::{IntRange, PolicyRule};

use crate::facts::{PoolState, RequestFacts};
use crate::verdict::{
    Action, Limits, Matched, ModelSwitch, Overflow, Reject, Route, ServiceClass, Verdict,
};

/// Most distinct label names all rules of a set may name together (a request's labels are a
/// bitmask of this many bits on the stack).
pub const MAX_DISTINCT_LABELS: usize = 512;
const LABEL_WORDS: usize = MAX_DISTINCT_LABELS / 64;

/// Why a policy cannot be compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyIssue {
    /// The policy, `namespace/name`.
    pub policy: String,
    /// JSON path of the offending field (`spec.rules[2].match.labels`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for PolicyIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "policy {}: {}: {}",
            self.policy, self.field, self.message
        )
    }
}

/// A numeric range over one figure, `[lo, hi)`.
#[derive(Clone, Copy, Debug)]
struct Range {
    lo: f64,
    hi: f64,
}

impl Range {
    fn of(r: IntRange, scale: f64) -> Self {
        Self {
            lo: r.at_least.map_or(f64::NEG_INFINITY, |v| v as f64 / scale),
            hi: r.below.map_or(f64::INFINITY, |v| v as f64 / scale),
        }
    }

    fn holds(&self, v: Option<f64>) -> bool {
        v.is_some_and(|v| v >= self.lo && v < self.hi)
    }
}

#[derive(Clone, Copy, Debug)]
enum Figure {
    BestTtftS,
    BestQueue,
    TotalQueue,
    KvMin,
    KvMean,
    GpuMin,
    GpuMean,
    PromptTokens,
    MaxOutputTokens,
}

impl Figure {
    fn value(self, facts: &RequestFacts<'_>, pool: &PoolState) -> Option<f64> {
        match self {
            Figure::BestTtftS => pool.best_ttft_s,
            Figure::BestQueue => pool.best_queue.map(f64::from),
            Figure::TotalQueue => pool.total_queue.map(f64::from),
            Figure::KvMin => pool.kv_usage_min,
            Figure::KvMean => pool.kv_usage_mean,
            Figure::GpuMin => pool.gpu_usage_min,
            Figure::GpuMean => pool.gpu_usage_mean,
            Figure::PromptTokens => Some(facts.prompt_tokens as f64),
            Figure::MaxOutputTokens => facts.max_output_tokens.map(f64::from),
        }
    }
}

/// A header condition: (lowercase name, exact value or any).
type HeaderRule = (Box<str>, Option<Box<str>>);

/// One compiled rule.
#[derive(Debug)]
struct Rule {
    policy: Box<str>,
    name: Box<str>,
    index: usize,
    /// Interned ids; empty = any.
    tenants: Box<[u32]>,
    models: Box<[u32]>,
    classes: Box<[u32]>,
    /// Labels that must all be present.
    labels: [u64; LABEL_WORDS],
    has_labels: bool,
    headers: Box<[HeaderRule]>,
    ranges: Box<[(Figure, Range)]>,
    action: Action,
}

/// Interned names of one kind.
#[derive(Debug, Default)]
struct Names(HashMap<Box<str>, u32>);

impl Names {
    fn intern(&mut self, s: &str) -> u32 {
        let next = u32::try_from(self.0.len()).unwrap_or(u32::MAX);
        *self.0.entry(s.into()).or_insert(next)
    }

    fn get(&self, s: &str) -> Option<u32> {
        self.0.get(s).copied()
    }
}

/// A compiled, evaluable set of policies. Cheap to share behind an `Arc`; replaced as a whole
/// on every change.
#[derive(Debug, Default)]
pub struct PolicySet {
    rules: Vec<Rule>,
    /// Rule indexes per pool (`ns/pool`): the pool's own policies, then its namespace's.
    pools: HashMap<Box<str>, Box<[u32]>>,
    /// Rule indexes of the pool-less policies per namespace.
    namespaces: HashMap<Box<str>, Box<[u32]>>,
    /// Rule indexes for requests without a pool: pool-less policies of every namespace.
    unpooled: Box<[u32]>,
    tenants: Names,
    models: Names,
    classes: Names,
    labels: Names,
    policies: Vec<String>,
}

/// Compiles `policies` (any order). Every problem of every policy is reported, each naming
/// its policy; one bad policy fails the whole set (the caller keeps its last good set).
pub fn compile(policies: &[InferencePolicy]) -> Result<PolicySet, Vec<PolicyIssue>> {
    let mut issues = Vec::new();
    let mut set = PolicySet::default();
    // (namespace, pool, name, policy) in evaluation order.
    let mut ordered: Vec<(&str, Option<&str>, &str, &InferencePolicy)> = policies
        .iter()
        .map(|p| {
            (
                p.metadata.namespace.as_deref().unwrap_or("default"),
                p.spec.pool.as_deref(),
                p.metadata.name.as_deref().unwrap_or_default(),
                p,
            )
        })
        .collect();
    ordered.sort_by(|a, b| (a.0, a.2).cmp(&(b.0, b.2)));
    let mut pooled: HashMap<String, Vec<u32>> = HashMap::new();
    let mut spaced: HashMap<&str, Vec<u32>> = HashMap::new();
    let mut unpooled = Vec::new();
    for (i, (ns, pool, name, p)) in ordered.iter().enumerate() {
        let key = format!("{ns}/{name}");
        let issue = |field: String, message: String| PolicyIssue {
            policy: key.clone(),
            field,
            message,
        };
        if name.is_empty() {
            issues.push(issue(
                "metadata.name".into(),
                "a policy needs a name".into(),
            ));
            continue;
        }
        if ordered[..i].iter().any(|o| o.0 == *ns && o.2 == *name) {
            issues.push(issue(
                "metadata.name".into(),
                "defined more than once".into(),
            ));
            continue;
        }
        let before = issues.len();
        for si in p.spec.validate() {
            issues.push(issue(si.field, si.message));
        }
        let mut ids = Vec::new();
        for (ri, rule) in p.spec.rules.iter().enumerate() {
            match compile_rule(&mut set, &key, ri, rule) {
                Ok(r) => {
                    ids.push(u32::try_from(set.rules.len()).unwrap_or(u32::MAX));
                    set.rules.push(r);
                }
                Err(mut e) => {
                    for x in &mut e {
                        x.policy.clone_from(&key);
                    }
                    issues.append(&mut e);
                }
            }
        }
        if issues.len() > before {
            continue;
        }
        set.policies.push(key.clone());
        match pool {
            Some(pool) => pooled
                .entry(format!("{ns}/{pool}"))
                .or_default()
                .extend(ids),
            None => {
                unpooled.extend(ids.iter().copied());
                spaced.entry(ns).or_default().extend(ids);
            }
        }
    }
    if !issues.is_empty() {
        return Err(issues);
    }
    for (pool, mut ids) in pooled {
        let ns = pool.split('/').next().unwrap_or_default();
        ids.extend(spaced.get(ns).into_iter().flatten());
        set.pools.insert(pool.into(), ids.into());
    }
    set.namespaces = spaced
        .into_iter()
        .map(|(ns, ids)| (ns.into(), ids.into()))
        .collect();
    set.unpooled = unpooled.into();
    Ok(set)
}

fn compile_rule(
    set: &mut PolicySet,
    policy: &str,
    index: usize,
    rule: &PolicyRule,
) -> Result<Rule, Vec<PolicyIssue>> {
    let mut issues = Vec::new();
    let at = |f: &str| format!("spec.rules[{index}].{f}");
    let mut bad = |field: String, message: String| {
        issues.push(PolicyIssue {
            policy: String::new(),
            field,
            message,
        });
    };
    let m = &rule.match_;
    let ids = |names: &mut Names, list: &[String]| -> Box<[u32]> {
        let mut v: Vec<u32> = list.iter().map(|s| names.intern(s)).collect();
        v.sort_unstable();
        v.dedup();
        v.into()
    };
    let tenants = ids(&mut set.tenants, &m.tenants);
    let models = ids(&mut set.models, &m.models);
    let classes = ids(&mut set.classes, &m.service_classes);
    // A class an action names is a declared class too (a metric label may take it).
    if let Some(name) = rule
        .actions
        .service_class
        .as_ref()
        .and_then(|c| c.name.as_deref())
    {
        set.classes.intern(name);
    }
    let mut labels = [0u64; LABEL_WORDS];
    for l in &m.labels {
        if l.is_empty()
            || l.chars()
                .any(|c| c.is_ascii_uppercase() || c.is_whitespace())
        {
            bad(
                at("match.labels"),
                format!("label {l:?} must be lowercase, without spaces"),
            );
            continue;
        }
        let id = set.labels.intern(l) as usize;
        if id >= MAX_DISTINCT_LABELS {
            bad(
                at("match.labels"),
                format!("more than {MAX_DISTINCT_LABELS} distinct labels across all policies"),
            );
            continue;
        }
        labels[id / 64] |= 1 << (id % 64);
    }
    let mut headers = Vec::new();
    for h in &m.headers {
        let valid = !h.name.is_empty()
            && h.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !valid {
            bad(
                at("match.headers"),
                format!("{:?} is not a valid header name", h.name),
            );
        }
        headers.push((
            h.name.to_ascii_lowercase().into_boxed_str(),
            h.value.as_deref().map(Box::from),
        ));
    }
    let mut ranges = Vec::new();
    if let Some(ps) = &m.pool_state {
        let figs = [
            (ps.best_ttft_ms, Figure::BestTtftS, 1000.0),
            (ps.best_queue, Figure::BestQueue, 1.0),
            (ps.total_queue, Figure::TotalQueue, 1.0),
            (ps.min_kv_usage_percent, Figure::KvMin, 100.0),
            (ps.mean_kv_usage_percent, Figure::KvMean, 100.0),
            (ps.min_gpu_usage_percent, Figure::GpuMin, 100.0),
            (ps.mean_gpu_usage_percent, Figure::GpuMean, 100.0),
        ];
        for (r, f, scale) in figs {
            if let Some(r) = r {
                ranges.push((f, Range::of(r, scale)));
            }
        }
    }
    if let Some(r) = m.prompt_tokens {
        ranges.push((Figure::PromptTokens, Range::of(r, 1.0)));
    }
    if let Some(r) = m.max_output_tokens {
        ranges.push((Figure::MaxOutputTokens, Range::of(r, 1.0)));
    }
    let a = &rule.actions;
    let positive = |v: Option<i64>, field: &str, bad: &mut dyn FnMut(String, String)| {
        v.and_then(|v| match u64::try_from(v) {
            Ok(v) if v > 0 => Some(v),
            _ => {
                bad(at(field), format!("must be positive, got {v}"));
                None
            }
        })
    };
    let route = a.route.as_ref().map(|r| Route {
        allowed: r
            .allowed_targets
            .iter()
            .map(|s| s.as_str().into())
            .collect(),
        preferred: r
            .preferred_targets
            .iter()
            .map(|s| s.as_str().into())
            .collect(),
        local_only: r.local_only,
        weights: r
            .weights
            .iter()
            .map(|w| (w.target.as_str().into(), w.weight.max(0).unsigned_abs()))
            .collect(),
        switch: r.model.as_deref().map(|m| ModelSwitch {
            model: m.into(),
            keep_when_cached: r.keep_when_cached.unwrap_or(true),
        }),
    });
    let reject = a.reject.as_ref().map(|r| Reject {
        status: u16::try_from(r.status)
            .ok()
            .filter(|s| (400..=599).contains(s))
            .unwrap_or(403),
        message: r
            .message
            .clone()
            .unwrap_or_else(|| "the request is refused by policy".into())
            .into(),
    });
    let overflow = a.overflow.as_ref().map(|o| Overflow {
        provider: o.provider.as_str().into(),
        ttft_threshold_s: positive(
            o.ttft_threshold_ms,
            "actions.overflow.ttftThresholdMs",
            &mut bad,
        )
        .map(|ms| ms as f64 / 1000.0),
        queue_threshold: o
            .queue_threshold
            .map(|q| u32::try_from(q.max(0)).unwrap_or(u32::MAX)),
    });
    let limits = a.limits.as_ref().map(|l| Limits {
        requests_per_minute: positive(
            l.requests_per_minute,
            "actions.limits.requestsPerMinute",
            &mut bad,
        ),
        tokens_per_minute: positive(
            l.tokens_per_minute,
            "actions.limits.tokensPerMinute",
            &mut bad,
        ),
        max_concurrency: positive(l.max_concurrency, "actions.limits.maxConcurrency", &mut bad),
    });
    let service_class = a.service_class.as_ref().map(|c| ServiceClass {
        name: c.name.as_deref().map(Box::from),
        ttft_target_s: positive(
            c.ttft_target_ms,
            "actions.serviceClass.ttftTargetMs",
            &mut bad,
        )
        .map(|ms| ms as f64 / 1000.0),
        sheddable: c.sheddable,
    });
    if !issues.is_empty() {
        return Err(issues);
    }
    Ok(Rule {
        policy: policy.into(),
        name: rule.name.as_str().into(),
        index,
        tenants,
        models,
        classes,
        has_labels: labels.iter().any(|w| *w != 0),
        labels,
        headers: headers.into(),
        ranges: ranges.into(),
        action: Action {
            route,
            reject,
            overflow,
            limits,
            service_class,
        },
    })
}

impl PolicySet {
    /// An empty set: every request gets the default verdict.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Names (`namespace/name`) of the compiled policies, in evaluation order of their
    /// namespace.
    pub fn policies(&self) -> &[String] {
        &self.policies
    }

    /// The declared service class named `name`: one that some rule matches on
    /// (`match.serviceClasses`) or sets (`actions.serviceClass.name`). `None` for any other
    /// name, so a class label taken from this set has at most as many values as the policies
    /// declare, whatever the clients send.
    pub fn declared_class(&self, name: &str) -> Option<&str> {
        self.classes.0.get_key_value(name).map(|(k, _)| &**k)
    }

    /// Number of compiled rules.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// The first rule that `facts` and `pool` satisfy, in the order the crate docs give.
    /// Allocates nothing.
    pub fn evaluate<'p>(&'p self, facts: &RequestFacts<'_>, pool: &PoolState) -> Verdict<'p> {
        let scope: &[u32] = match facts.pool {
            None => &self.unpooled,
            Some(p) => match self.pools.get(p) {
                Some(ids) => ids,
                None => {
                    let ns = p.split('/').next().unwrap_or_default();
                    self.namespaces.get(ns).map_or(&[][..], |ids| &ids[..])
                }
            },
        };
        if scope.is_empty() {
            return Verdict::default();
        }
        let tenant = facts.tenant.and_then(|t| self.tenants.get(t));
        let model = self.models.get(facts.model);
        let backend = facts.backend_model.and_then(|m| self.models.get(m));
        let class = facts.service_class.and_then(|c| self.classes.get(c));
        let mut labels = [0u64; LABEL_WORDS];
        for l in facts.labels {
            if let Some(id) = self.labels.get(l) {
                let id = id as usize;
                labels[id / 64] |= 1 << (id % 64);
            }
        }
        let within = |set: &[u32], id: Option<u32>| {
            set.is_empty() || id.is_some_and(|id| set.binary_search(&id).is_ok())
        };
        for &i in scope {
            let Some(r) = self.rules.get(i as usize) else {
                continue;
            };
            let matches = within(&r.tenants, tenant)
                && (within(&r.models, model)
                    || (!r.models.is_empty() && within(&r.models, backend)))
                && within(&r.classes, class)
                && (!r.has_labels
                    || r.labels
                        .iter()
                        .zip(&labels)
                        .all(|(need, have)| need & have == *need))
                && r.headers.iter().all(|(name, value)| {
                    match (facts.headers.header(name), value) {
                        (None, _) => false,
                        (Some(_), None) => true,
                        (Some(v), Some(want)) => v == &**want,
                    }
                })
                && r.ranges
                    .iter()
                    .all(|(f, range)| range.holds(f.value(facts, pool)));
            if matches {
                return Verdict {
                    matched: Some(Matched {
                        policy: &r.policy,
                        rule: &r.name,
                        index: r.index,
                        action: &r.action,
                    }),
                };
            }
        }
        Verdict::default()
    }
}
