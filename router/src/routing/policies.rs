//! Baseline policies the benchmark compares kvroute against, behind the same [`Policy`]
//! trait. Each follows the published description cited on it (facts and default numbers
//! only; no code taken). All draw their ties from a seeded RNG.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::baselines::{
    DynamoCost, DynamoCostConfig, LlmdDefault, LlmdDefaultWeights, LlmdSticky, LlmdStickyConfig,
    SglangCacheAware, SglangCacheAwareConfig,
};
use super::choose::{
    ChoiceContext, Decision, Policy, PredictedTtft, PredictedTtftConfig, Reason, argmin_random_ties,
};

/// Names accepted by [`policy_by_name`].
pub const POLICY_NAMES: [&str; 9] = [
    "kvroute",
    "random",
    "round-robin",
    "least-loaded",
    "max-prefix",
    "llm-d",
    "llm-d-sticky",
    "dynamo-cost",
    "sglang-cache-aware",
];

/// An unknown policy name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "unknown routing policy {0:?} (known: kvroute, random, round-robin, least-loaded, max-prefix, llm-d, llm-d-sticky, dynamo-cost, sglang-cache-aware)"
)]
pub struct UnknownPolicy(pub String);

/// What a deployment measured of its workers, for the baselines that take a calibration
/// (llm-d's `peakPrefillThroughput`). `None` keeps the upstream default.
#[derive(Clone, Copy, Debug, Default)]
pub struct Calibration {
    /// Peak prefill throughput of one worker, tokens/s: `max-num-batched-tokens` over the
    /// time to first token of one such chunk on an idle worker (llm-d's recipe).
    pub peak_prefill_tokens_per_s: Option<f64>,
}

/// Builds a policy with default settings by name, its RNG seeded with `seed`.
pub fn policy_by_name(name: &str, seed: u64) -> Result<Box<dyn Policy>, UnknownPolicy> {
    policy_by_name_calibrated(name, seed, Calibration::default())
}

/// [`policy_by_name`] with a deployment's calibration applied where a baseline takes one.
pub fn policy_by_name_calibrated(
    name: &str,
    seed: u64,
    calibration: Calibration,
) -> Result<Box<dyn Policy>, UnknownPolicy> {
    Ok(match name {
        "kvroute" => Box::new(PredictedTtft::new(PredictedTtftConfig::default(), seed)),
        "random" => Box::new(RandomPolicy::new(seed)),
        "round-robin" => Box::new(RoundRobin::new(seed)),
        "least-loaded" => Box::new(LeastLoaded::new(seed)),
        "max-prefix" => Box::new(MaxPrefix::new(MaxPrefixWeights::default(), seed)),
        "llm-d" => Box::new(LlmdDefault::new(LlmdDefaultWeights::default(), seed)),
        "llm-d-sticky" => {
            let mut cfg = LlmdStickyConfig::default();
            if let Some(r) = calibration.peak_prefill_tokens_per_s
                && r > 0.0
            {
                cfg.peak_prefill_throughput = r;
            }
            Box::new(LlmdSticky::new(cfg, seed))
        }
        "dynamo-cost" => Box::new(DynamoCost::new(DynamoCostConfig::default(), seed)),
        "sglang-cache-aware" => Box::new(SglangCacheAware::new(
            SglangCacheAwareConfig::default(),
            seed,
        )),
        other => return Err(UnknownPolicy(other.to_owned())),
    })
}

/// Uniform random choice. Score: 0 for everyone.
pub struct RandomPolicy {
    rng: ChaCha8Rng,
}

impl RandomPolicy {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

impl Policy for RandomPolicy {
    fn name(&self) -> &'static str {
        "random"
    }
    fn choose(&mut self, ctx: &ChoiceContext, _now: f64) -> Option<Decision> {
        if ctx.candidates.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..ctx.candidates.len());
        Some(Decision::from_ctx(
            self.name(),
            ctx,
            i,
            Reason::Random,
            &vec![0.0; ctx.candidates.len()],
        ))
    }
}

/// Rotation over the candidates in context order; the seed sets the starting offset so
/// replicas do not rotate in lockstep. Score: 0 for the chosen one, 1 otherwise.
pub struct RoundRobin {
    next: u64,
}

impl RoundRobin {
    /// Starting offset drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            next: ChaCha8Rng::seed_from_u64(seed).random::<u32>().into(),
        }
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }
    fn choose(&mut self, ctx: &ChoiceContext, _now: f64) -> Option<Decision> {
        let n = ctx.candidates.len() as u64;
        if n == 0 {
            return None;
        }
        let i = (self.next % n) as usize;
        self.next = self.next.wrapping_add(1);
        let scores: Vec<f64> = (0..ctx.candidates.len())
            .map(|j| if j == i { 0.0 } else { 1.0 })
            .collect();
        Some(Decision::from_ctx(
            self.name(),
            ctx,
            i,
            Reason::RoundRobin,
            &scores,
        ))
    }
}

/// Fewest requests on the worker ([`super::choose::Candidate::load`]: the larger of its
/// reported waiting + running and the router's own outstanding count); ties drawn uniformly.
/// Score: the load.
pub struct LeastLoaded {
    rng: ChaCha8Rng,
}

impl LeastLoaded {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least-loaded"
    }
    fn choose(&mut self, ctx: &ChoiceContext, _now: f64) -> Option<Decision> {
        let scores: Vec<f64> = ctx.candidates.iter().map(|c| c.load()).collect();
        let i = argmin_random_ties(&mut self.rng, &scores)?;
        Some(Decision::from_ctx(
            self.name(),
            ctx,
            i,
            Reason::LeastLoaded,
            &scores,
        ))
    }
}

/// Scorer weights of [`MaxPrefix`].
#[derive(Clone, Copy, Debug)]
pub struct MaxPrefixWeights {
    /// Prefix-cache scorer weight.
    pub prefix: f64,
    /// KV-cache-utilization scorer weight.
    pub kv_utilization: f64,
    /// Queue scorer weight.
    pub queue: f64,
}

impl Default for MaxPrefixWeights {
    /// llm-d's "precise prefix cache aware" guide profile: precise-prefix-cache-scorer 3,
    /// kv-cache-utilization-scorer 2, queue-scorer 2.
    fn default() -> Self {
        Self {
            prefix: 3.0,
            kv_utilization: 2.0,
            queue: 2.0,
        }
    }
}

/// An older reading of llm-d's precise prefix-cache profile, kept for `--policy max-prefix`
/// (the benchmark compares [`LlmdDefault`], which follows a named release): the llm-d guide
/// weights 3/2/2 and a plain hit ratio instead of the scorer's min-max normalization. A
/// weighted sum of scorers
/// in [0, 1], highest total wins, ties drawn uniformly (max-score picker):
/// - prefix: leading cached blocks / prompt blocks (from the KV-event index);
/// - KV-cache utilization: `1 - kv_usage`;
/// - queue: `(max_waiting - waiting) / (max_waiting - min_waiting)` over the candidates
///   (1 for everyone when all are equal), waiting from the workers' metrics.
///
/// Score: minus the weighted sum.
pub struct MaxPrefix {
    weights: MaxPrefixWeights,
    rng: ChaCha8Rng,
}

impl MaxPrefix {
    /// Seeded.
    pub fn new(weights: MaxPrefixWeights, seed: u64) -> Self {
        Self {
            weights,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

impl Policy for MaxPrefix {
    fn name(&self) -> &'static str {
        "max-prefix"
    }
    fn choose(&mut self, ctx: &ChoiceContext, _now: f64) -> Option<Decision> {
        let qmin = ctx.candidates.iter().map(|c| c.waiting).min()?;
        let qmax = ctx.candidates.iter().map(|c| c.waiting).max()?;
        let w = self.weights;
        let scores: Vec<f64> = ctx
            .candidates
            .iter()
            .map(|c| {
                let prefix = if c.prompt_blocks == 0 {
                    0.0
                } else {
                    c.cached_blocks as f64 / c.prompt_blocks as f64
                };
                let kv = 1.0 - f64::from(c.kv_usage).clamp(0.0, 1.0);
                let queue = if qmax == qmin {
                    1.0
                } else {
                    f64::from(qmax - c.waiting) / f64::from(qmax - qmin)
                };
                -(w.prefix * prefix + w.kv_utilization * kv + w.queue * queue)
            })
            .collect();
        let i = argmin_random_ties(&mut self.rng, &scores)?;
        Some(Decision::from_ctx(
            self.name(),
            ctx,
            i,
            Reason::MaxPrefix,
            &scores,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::routing::test_support::{c, ctx};

    fn pick(p: &mut dyn Policy, ctx: &ChoiceContext) -> (u32, Reason) {
        let d = p.choose(ctx, 0.0).expect("decision");
        (d.chosen.0, d.reason)
    }

    #[test]
    fn names_round_trip_and_unknown_is_an_error() {
        for name in POLICY_NAMES {
            let p = policy_by_name(name, 1).expect("known");
            assert_eq!(p.name(), name);
        }
        assert_eq!(
            policy_by_name("nope", 1).err(),
            Some(UnknownPolicy("nope".into()))
        );
    }

    #[test]
    fn only_kvroute_expects_evictions() {
        // The expectation moves the uncached tokens assignments record, from which the
        // baselines take their loads: a baseline saying yes would no longer follow its source.
        for name in POLICY_NAMES {
            let p = policy_by_name(name, 1).expect("known");
            assert_eq!(p.expects_evictions(), name == "kvroute", "{name}");
        }
    }

    #[test]
    fn every_policy_returns_none_without_candidates() {
        for name in POLICY_NAMES {
            let mut p = policy_by_name(name, 1).expect("known");
            assert!(p.choose(&ctx(vec![]), 0.0).is_none(), "{name}");
        }
    }

    #[test]
    fn round_robin_rotates() {
        let ctx = ctx(vec![c(0), c(1), c(2)]);
        let mut p = RoundRobin::new(4);
        let seq: Vec<u32> = (0..6).map(|_| pick(&mut p, &ctx).0).collect();
        assert_eq!(
            seq[0..3]
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len(),
            3
        );
        assert_eq!(seq[0..3], seq[3..6]);
    }

    #[test]
    fn random_is_seeded() {
        let ctx = ctx(vec![c(0), c(1), c(2), c(3)]);
        let draw = |s| {
            let mut p = RandomPolicy::new(s);
            (0..50).map(|_| pick(&mut p, &ctx).0).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn least_loaded_counts_reports_and_own_assignments() {
        let mut a = c(0);
        a.waiting = 1;
        a.running = 2;
        let mut b = c(1);
        b.inflight = 5; // reports lag; the router knows it sent 5
        let d = c(2);
        let mut e = c(3);
        e.running = 1;
        let ctx = ctx(vec![a, b, d, e]);
        assert_eq!(
            pick(&mut LeastLoaded::new(0), &ctx),
            (2, Reason::LeastLoaded)
        );
    }

    #[test]
    fn max_prefix_weighs_prefix_kv_and_queue() {
        // warm: 100% prefix but full KV and longest queue: 3*1 + 2*0 + 2*0 = 3
        let mut warm = c(0);
        warm.cached_blocks = 64;
        warm.kv_usage = 1.0;
        warm.waiting = 10;
        // cold idle: 0 + 2*1 + 2*1 = 4 -> wins
        let cold = c(1);
        assert_eq!(
            pick(
                &mut MaxPrefix::new(MaxPrefixWeights::default(), 0),
                &ctx(vec![warm.clone(), cold.clone()])
            )
            .0,
            1
        );
        // half-full KV, short queue: 3 + 1 + 2*(1 - 2/10)=5.6 > 4 -> warm wins
        warm.kv_usage = 0.5;
        warm.waiting = 2;
        let mut busy = cold;
        busy.waiting = 10;
        busy.kv_usage = 0.0;
        assert_eq!(
            pick(
                &mut MaxPrefix::new(MaxPrefixWeights::default(), 0),
                &ctx(vec![warm, busy])
            ),
            (0, Reason::MaxPrefix)
        );
    }
}
