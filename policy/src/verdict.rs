//! The outcome of an evaluation: the matched rule and its compiled actions. Hook points for
//! the parts that act on them elsewhere: [`Verdict::limits`] (the per-tenant limiter),
//! [`Verdict::overflow`] with [`Overflow::triggered`] (the provider relay), and
//! [`Verdict::local_only`] (which forbids overflow).

use crate::facts::PoolState;

/// Compiled actions of one rule. At most one of `reject` and the rest is set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Action {
    /// Restrict, prefer or split targets.
    pub route: Option<Route>,
    /// Refuse the request.
    pub reject: Option<Reject>,
    /// Send to a provider past a threshold.
    pub overflow: Option<Overflow>,
    /// Per-tenant limits.
    pub limits: Option<Limits>,
    /// Service class and TTFT target.
    pub service_class: Option<ServiceClass>,
}

/// Target restrictions (WorkerSet names).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Route {
    /// Only these may serve the request (any when empty).
    pub allowed: Box<[Box<str>]>,
    /// Tried first when competitive.
    pub preferred: Box<[Box<str>]>,
    /// Never leave the cluster.
    pub local_only: bool,
    /// Weighted split between targets.
    pub weights: Box<[(Box<str>, u32)]>,
    /// Serve with this model instead of the requested one (see [`ModelSwitch`]).
    pub switch: Option<ModelSwitch>,
}

/// A route action's alternative model: the router plans over the WorkerSets of the
/// requested model and of `model`, and serves with `model` unless `keep_when_cached` and a
/// worker of the requested model that caches a prefix of the prompt is predicted to answer
/// first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSwitch {
    /// The alternative model (a model name the pool serves).
    pub model: Box<str>,
    /// Stay on the requested model when a worker of it caches a prefix of the prompt and is
    /// predicted to answer first.
    pub keep_when_cached: bool,
}

impl Route {
    /// The weighted target `seed` draws; `None` without weights (or all zero).
    pub fn weighted_target(&self, seed: u64) -> Option<&str> {
        crate::weighted_choice(seed, self.weights.iter().map(|w| w.1))
            .and_then(|i| self.weights.get(i))
            .map(|w| &*w.0)
    }

    /// Whether WorkerSet `set` is allowed.
    pub fn allows(&self, set: &str) -> bool {
        self.allowed.is_empty() || self.allowed.iter().any(|a| &**a == set)
    }

    /// Whether WorkerSet `set` is preferred.
    pub fn prefers(&self, set: &str) -> bool {
        self.preferred.iter().any(|a| &**a == set)
    }
}

/// Refuse with an HTTP status and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reject {
    /// HTTP status (400-599).
    pub status: u16,
    /// Message for the client (operator-written).
    pub message: Box<str>,
}

/// Overflow to a provider (acted on by the provider relay).
#[derive(Clone, Debug, PartialEq)]
pub struct Overflow {
    /// InferenceProvider name.
    pub provider: Box<str>,
    /// Overflow when the best local predicted TTFT exceeds this, seconds.
    pub ttft_threshold_s: Option<f64>,
    /// Overflow when the best local worker has more waiting requests than this.
    pub queue_threshold: Option<u32>,
}

impl Overflow {
    /// Whether `pool` crosses a threshold: the best predicted TTFT above the TTFT threshold,
    /// or the best worker's queue above the queue threshold, or no local candidate at all.
    pub fn triggered(&self, pool: &PoolState) -> bool {
        if pool.best_ttft_s.is_none() && pool.total_queue.is_none() {
            return true;
        }
        let ttft = self
            .ttft_threshold_s
            .zip(pool.best_ttft_s)
            .is_some_and(|(limit, t)| t > limit);
        let queue = self
            .queue_threshold
            .zip(pool.best_queue)
            .is_some_and(|(limit, q)| q > limit);
        ttft || queue
    }
}

/// Per-tenant limits (enforced by the limiter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Requests per minute.
    pub requests_per_minute: Option<u64>,
    /// Prompt + max output tokens per minute.
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once.
    pub max_concurrency: Option<u64>,
}

/// Service class set by a rule.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceClass {
    /// Class name (the header's when `None`).
    pub name: Option<Box<str>>,
    /// TTFT target, seconds (a header target overrides it).
    pub ttft_target_s: Option<f64>,
    /// May be shed when every local candidate is predicted to miss the target.
    pub sheddable: bool,
}

/// The matched rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Matched<'p> {
    /// Policy, `namespace/name`.
    pub policy: &'p str,
    /// Rule name.
    pub rule: &'p str,
    /// Position of the rule in its policy.
    pub index: usize,
    /// Its actions.
    pub action: &'p Action,
}

/// The outcome of [`crate::PolicySet::evaluate`]: the first matching rule, or none (default:
/// no action). Borrows the set.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Verdict<'p> {
    /// The rule that matched; `None`: the default.
    pub matched: Option<Matched<'p>>,
}

impl<'p> Verdict<'p> {
    /// The matched rule's actions.
    pub fn action(&self) -> Option<&'p Action> {
        self.matched.map(|m| m.action)
    }

    /// Policy name, if a rule matched.
    pub fn policy(&self) -> Option<&'p str> {
        self.matched.map(|m| m.policy)
    }

    /// Rule name, if a rule matched.
    pub fn rule(&self) -> Option<&'p str> {
        self.matched.map(|m| m.rule)
    }

    /// The rejection, if the rule rejects.
    pub fn reject(&self) -> Option<&'p Reject> {
        self.action().and_then(|a| a.reject.as_ref())
    }

    /// The route action, if any.
    pub fn route(&self) -> Option<&'p Route> {
        self.action().and_then(|a| a.route.as_ref())
    }

    /// True when the request must stay on local workers.
    pub fn local_only(&self) -> bool {
        self.route().is_some_and(|r| r.local_only)
    }

    /// Hook for the provider relay: the overflow action, never for a local-only request.
    pub fn overflow(&self) -> Option<&'p Overflow> {
        if self.local_only() {
            return None;
        }
        self.action().and_then(|a| a.overflow.as_ref())
    }

    /// Hook for the limiter: the rule's per-tenant limits.
    pub fn limits(&self) -> Option<&'p Limits> {
        self.action().and_then(|a| a.limits.as_ref())
    }

    /// The rule's service class, if it sets one.
    pub fn service_class(&self) -> Option<&'p ServiceClass> {
        self.action().and_then(|a| a.service_class.as_ref())
    }
}
