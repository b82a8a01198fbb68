//! Baseline policies the benchmark compares kvroute against, behind the same [`Policy`]
//! trait. Each follows the published description cited on it (facts and default numbers
//! only; no code taken). All draw their ties from a seeded RNG.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::choose::{
    ChoiceContext, Decision, Policy, PredictedTtft, PredictedTtftConfig, Reason, argmin_random_ties,
};

/// Names accepted by [`policy_by_name`].
pub const POLICY_NAMES: [&str; 7] = [
    "kvroute",
    "random",
    "round-robin",
    "least-loaded",
    "max-prefix",
    "dynamo-cost",
    "sglang-cache-aware",
];

/// An unknown policy name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "unknown routing policy {0:?} (known: kvroute, random, round-robin, least-loaded, max-prefix, dynamo-cost, sglang-cache-aware)"
)]
pub struct UnknownPolicy(pub String);

/// Builds a policy with default settings by name, its RNG seeded with `seed`.
pub fn policy_by_name(name: &str, seed: u64) -> Result<Box<dyn Policy>, UnknownPolicy> {
    Ok(match name {
        "kvroute" => Box::new(PredictedTtft::new(PredictedTtftConfig::default(), seed)),
        "random" => Box::new(RandomPolicy::new(seed)),
        "round-robin" => Box::new(RoundRobin::new(seed)),
        "least-loaded" => Box::new(LeastLoaded::new(seed)),
        "max-prefix" => Box::new(MaxPrefix::new(MaxPrefixWeights::default(), seed)),
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

/// llm-d inference-scheduler with the precise prefix-cache scorer (llm-d guides
/// `precise-prefix-cache-aware`, llm-d-kv-cache-manager indexer): a weighted sum of scorers
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

/// Settings of [`DynamoCost`].
#[derive(Clone, Copy, Debug)]
pub struct DynamoCostConfig {
    /// `--kv-overlap-score-weight` (default 1).
    pub overlap_score_weight: f64,
    /// `--router-temperature` (default 0: deterministic lowest cost). Above 0, a softmax
    /// over the negated, range-normalized costs.
    pub temperature: f64,
}

impl Default for DynamoCostConfig {
    fn default() -> Self {
        Self {
            overlap_score_weight: 1.0,
            temperature: 0.0,
        }
    }
}

/// NVIDIA Dynamo's KV router cost (ai-dynamo/dynamo `lib/llm/src/kv_router` scheduler, docs
/// "KV Cache Routing" and "Router Design"): for each worker
/// `cost = overlap_score_weight * potential_prefill_blocks + potential_decode_blocks`, where
/// prefill blocks = (the request's uncached tokens + prefill tokens already in flight on the
/// worker) / block size, and decode blocks = (tokens of the worker's active requests + the
/// request's tokens) / block size, both tracked by the router itself. Lowest cost wins at
/// temperature 0 (ties drawn uniformly). Score: the cost.
pub struct DynamoCost {
    cfg: DynamoCostConfig,
    rng: ChaCha8Rng,
}

impl DynamoCost {
    /// Seeded.
    pub fn new(cfg: DynamoCostConfig, seed: u64) -> Self {
        Self {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

impl Policy for DynamoCost {
    fn name(&self) -> &'static str {
        "dynamo-cost"
    }
    fn choose(&mut self, ctx: &ChoiceContext, _now: f64) -> Option<Decision> {
        let scores: Vec<f64> = ctx
            .candidates
            .iter()
            .map(|c| {
                let bs = c.block_size.max(1) as f64;
                let uncached = (ctx.prompt_tokens.saturating_sub(c.cached_tokens)) as f64;
                let prefill = (uncached + c.inflight_prefill_tokens as f64) / bs;
                let decode = (c.active_tokens as f64 + ctx.prompt_tokens as f64) / bs;
                self.cfg.overlap_score_weight * prefill + decode
            })
            .collect();
        let i = if self.cfg.temperature > 0.0 {
            softmax_draw(&mut self.rng, &scores, self.cfg.temperature)?
        } else {
            argmin_random_ties(&mut self.rng, &scores)?
        };
        Some(Decision::from_ctx(
            self.name(),
            ctx,
            i,
            Reason::DynamoCost,
            &scores,
        ))
    }
}

fn softmax_draw(rng: &mut ChaCha8Rng, costs: &[f64], temperature: f64) -> Option<usize> {
    let lo = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if costs.is_empty() || !lo.is_finite() || !hi.is_finite() {
        return argmin_random_ties(rng, costs);
    }
    let range = if hi > lo { hi - lo } else { 1.0 };
    let items: Vec<(usize, f64)> = costs
        .iter()
        .enumerate()
        .map(|(i, c)| (i, (-(c - lo) / range / temperature).exp()))
        .collect();
    Some(super::choose::weighted_draw(rng, &items))
}

/// Settings of [`SglangCacheAware`].
#[derive(Clone, Copy, Debug)]
pub struct SglangCacheAwareConfig {
    /// Load difference above which the pool counts as imbalanced (`balance_abs_threshold`).
    pub balance_abs_threshold: f64,
    /// Load ratio above which the pool counts as imbalanced (`balance_rel_threshold`).
    pub balance_rel_threshold: f64,
    /// Match ratio above which the best-matching worker is chosen (`cache_threshold`).
    pub cache_threshold: f64,
}

impl Default for SglangCacheAwareConfig {
    fn default() -> Self {
        Self {
            balance_abs_threshold: 32.0,
            balance_rel_threshold: 1.0001,
            cache_threshold: 0.3,
        }
    }
}

/// SGLang router `cache_aware` policy (sgl-project/sglang `sgl-router`, policies
/// `cache_aware`): the pool is imbalanced when `max_load - min_load > balance_abs_threshold`
/// AND `max_load > balance_rel_threshold * min_load`, loads being the router's own
/// outstanding requests per worker; then the shortest queue wins. Otherwise the best match
/// ratio (cached prompt tokens / prompt tokens; SGLang's tree holds what it routed, here the
/// KV-event index stands in) wins if it exceeds `cache_threshold`, else the worker with the
/// smallest cache (fewest blocks in the index), which has the most room. Ties drawn
/// uniformly. Score: load, minus match ratio, or cache size, by branch.
pub struct SglangCacheAware {
    cfg: SglangCacheAwareConfig,
    rng: ChaCha8Rng,
}

impl SglangCacheAware {
    /// Seeded.
    pub fn new(cfg: SglangCacheAwareConfig, seed: u64) -> Self {
        Self {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

impl Policy for SglangCacheAware {
    fn name(&self) -> &'static str {
        "sglang-cache-aware"
    }
    fn choose(&mut self, ctx: &ChoiceContext, _now: f64) -> Option<Decision> {
        let loads: Vec<f64> = ctx
            .candidates
            .iter()
            .map(|c| f64::from(c.inflight + c.decoding))
            .collect();
        let min = loads.iter().copied().fold(f64::INFINITY, f64::min);
        let max = loads.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !min.is_finite() {
            return None;
        }
        let imbalanced = max - min > self.cfg.balance_abs_threshold
            && max > self.cfg.balance_rel_threshold * min;
        let (scores, reason) = if imbalanced {
            (loads, Reason::ShortestQueue)
        } else {
            let ratio = |tokens: usize| {
                if ctx.prompt_tokens == 0 {
                    0.0
                } else {
                    tokens as f64 / ctx.prompt_tokens as f64
                }
            };
            let best = ctx
                .candidates
                .iter()
                .map(|c| ratio(c.cached_tokens))
                .fold(0.0, f64::max);
            if best > self.cfg.cache_threshold {
                (
                    ctx.candidates
                        .iter()
                        .map(|c| -ratio(c.cached_tokens))
                        .collect(),
                    Reason::CacheMatch,
                )
            } else {
                (
                    ctx.candidates
                        .iter()
                        .map(|c| c.index_blocks as f64)
                        .collect(),
                    Reason::SmallestCache,
                )
            }
        };
        let i = argmin_random_ties(&mut self.rng, &scores)?;
        Some(Decision::from_ctx(self.name(), ctx, i, reason, &scores))
    }
}

#[cfg(test)]
mod tests {
    use super::super::choose::Candidate;
    use super::super::workers::WorkerId;
    use super::*;

    fn c(w: u32) -> Candidate {
        Candidate {
            worker: WorkerId(w),
            block_size: 16,
            prompt_blocks: 64,
            ..Candidate::default()
        }
    }

    fn ctx(candidates: Vec<Candidate>) -> ChoiceContext {
        ChoiceContext {
            prompt_tokens: 1024,
            degraded: false,
            candidates,
        }
    }

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

    #[test]
    fn dynamo_cost_trades_overlap_against_active_blocks() {
        // prompt 1024 tokens = 64 blocks.
        let mut warm = c(0);
        warm.cached_tokens = 1024;
        warm.active_tokens = 16 * 50; // 50 active blocks: cost 0 + 50 + 64 = 114
        let cold = c(1); // cost 64 + 0 + 64 = 128
        assert_eq!(
            pick(
                &mut DynamoCost::new(DynamoCostConfig::default(), 0),
                &ctx(vec![warm.clone(), cold.clone()])
            )
            .0,
            0
        );
        warm.active_tokens = 16 * 80; // 144 > 128
        assert_eq!(
            pick(
                &mut DynamoCost::new(DynamoCostConfig::default(), 0),
                &ctx(vec![warm.clone(), cold.clone()])
            )
            .0,
            1
        );
        // overlap weight 0: pure decode-load balancing
        let cfg = DynamoCostConfig {
            overlap_score_weight: 0.0,
            temperature: 0.0,
        };
        warm.active_tokens = 16;
        assert_eq!(
            pick(&mut DynamoCost::new(cfg, 0), &ctx(vec![warm, cold])),
            (1, Reason::DynamoCost)
        );
    }

    #[test]
    fn dynamo_temperature_spreads_choices() {
        let mut warm = c(0);
        warm.cached_tokens = 512;
        let ctx = ctx(vec![warm, c(1)]);
        let mut p = DynamoCost::new(
            DynamoCostConfig {
                overlap_score_weight: 1.0,
                temperature: 1.0,
            },
            3,
        );
        let zeros = (0..400).filter(|_| pick(&mut p, &ctx).0 == 0).count();
        assert!(zeros > 200 && zeros < 400, "{zeros}");
    }

    #[test]
    fn sglang_branches() {
        let cfg = SglangCacheAwareConfig::default();
        // balanced, good match -> best match
        let mut warm = c(0);
        warm.cached_tokens = 512; // 0.5 > 0.3
        warm.index_blocks = 1000;
        let mut cold = c(1);
        cold.index_blocks = 10;
        assert_eq!(
            pick(
                &mut SglangCacheAware::new(cfg, 0),
                &ctx(vec![warm.clone(), cold.clone()])
            ),
            (0, Reason::CacheMatch)
        );
        // balanced, weak match -> smallest cache
        warm.cached_tokens = 256; // 0.25
        assert_eq!(
            pick(
                &mut SglangCacheAware::new(cfg, 0),
                &ctx(vec![warm.clone(), cold.clone()])
            ),
            (1, Reason::SmallestCache)
        );
        // imbalanced (40 vs 2: diff 38 > 32, 40 > 1.0001*2) -> shortest queue even against a full match
        warm.cached_tokens = 1024;
        warm.inflight = 40;
        cold.decoding = 2;
        assert_eq!(
            pick(
                &mut SglangCacheAware::new(cfg, 0),
                &ctx(vec![warm.clone(), cold.clone()])
            ),
            (1, Reason::ShortestQueue)
        );
        // diff 30 is within the absolute threshold: still cache-driven
        warm.inflight = 32;
        assert_eq!(
            pick(&mut SglangCacheAware::new(cfg, 0), &ctx(vec![warm, cold])),
            (0, Reason::CacheMatch)
        );
    }
}
