//! NVIDIA Dynamo's KV router worker selection as released in the `dynamo-kv-router` crate
//! 1.6.1 (`src/scheduling/selector/reference.rs`: `DefaultWorkerSelector`, its cost and
//! softmax sampling; defaults from `src/scheduling/config.rs`; active blocks from
//! `src/sequences/`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::choose::{ChoiceContext, Decision, Policy, Reason, argmin_random_ties};

/// Settings of [`DynamoCost`]; the defaults are `KvRouterConfig::default()` of 1.6.1.
#[derive(Clone, Copy, Debug)]
pub struct DynamoCostConfig {
    /// `overlap_score_credit` (1.0): blocks of prefill credited per block the worker caches.
    pub overlap_score_credit: f64,
    /// `prefill_load_scale` (1.0): weight of the prefill term (older releases:
    /// `overlap_score_weight`).
    pub prefill_load_scale: f64,
    /// `decode_active_request_weight` (0.0): blocks charged per active request.
    pub decode_active_request_weight: f64,
    /// `router_temperature` (0.0: the lowest cost, ties drawn uniformly). Above 0, a softmax
    /// over the costs normalized by their range.
    pub temperature: f64,
}

impl Default for DynamoCostConfig {
    fn default() -> Self {
        Self {
            overlap_score_credit: 1.0,
            prefill_load_scale: 1.0,
            decode_active_request_weight: 0.0,
            temperature: 0.0,
        }
    }
}

/// Dynamo's default worker selector (dynamo-kv-router 1.6.1, aggregated serving, prefill
/// tokens tracked, no decay, no host or disk tiers). For each worker, in blocks of its block
/// size:
///
/// `cost = prefill_load_scale * max(0, (active_prefill_tokens + prompt_tokens) / block_size
///         - overlap_score_credit * cached_blocks) + active_blocks + new_blocks
///         + decode_active_request_weight * active_requests`
///
/// - `active_prefill_tokens`: uncached prompt tokens of the router's requests there that
///   have no first token yet ([`super::super::Candidate::inflight_prefill_tokens`]);
/// - `cached_blocks`: the prompt's leading blocks the worker holds (KV events);
/// - `active_blocks`: distinct blocks the prompts of the router's outstanding requests
///   there reference, shared blocks counted once ([`super::super::Candidate::active_blocks`],
///   Dynamo's `ActiveSequences` with `router_track_active_blocks`);
/// - `new_blocks`: the prompt's full blocks beyond those already active there (its overlap
///   with the active set, [`super::super::Candidate::in_use_blocks`]).
///
/// Score: the cost.
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

    /// The cost of each candidate, in context order.
    pub fn costs(&self, ctx: &ChoiceContext) -> Vec<f64> {
        let cfg = self.cfg;
        ctx.candidates
            .iter()
            .map(|c| {
                let bs = c.block_size.max(1) as f64;
                let raw_prefill =
                    (c.inflight_prefill_tokens as f64 + ctx.prompt_tokens as f64) / bs;
                let prefill =
                    (raw_prefill - cfg.overlap_score_credit * c.cached_blocks as f64).max(0.0);
                let new_blocks = c.prompt_blocks.saturating_sub(c.in_use_blocks) as f64;
                let decode = c.active_blocks as f64 + new_blocks;
                let requests = f64::from(c.inflight + c.decoding);
                cfg.prefill_load_scale * prefill
                    + decode
                    + cfg.decode_active_request_weight * requests
            })
            .collect()
    }
}

impl Policy for DynamoCost {
    fn name(&self) -> &'static str {
        "dynamo-cost"
    }

    fn choose(&mut self, ctx: &ChoiceContext, _now: f64) -> Option<Decision> {
        let scores = self.costs(ctx);
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

/// Dynamo's softmax sampling: probability proportional to
/// `exp(-(cost - min) / ((max - min) * temperature))`, uniform when all costs are equal.
fn softmax_draw(rng: &mut ChaCha8Rng, costs: &[f64], temperature: f64) -> Option<usize> {
    if costs.is_empty() {
        return None;
    }
    let lo = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() || !hi.is_finite() {
        return argmin_random_ties(rng, costs);
    }
    let weights: Vec<f64> = if hi > lo {
        costs
            .iter()
            .map(|c| (-(c - lo) / ((hi - lo) * temperature)).exp())
            .collect()
    } else {
        vec![1.0; costs.len()]
    };
    let total: f64 = weights.iter().sum();
    let mut x = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        x -= w;
        if x <= 0.0 {
            return Some(i);
        }
    }
    Some(costs.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::super::super::workers::WorkerId;
    use super::*;

    use crate::routing::test_support::{c, ctx};

    #[test]
    fn shared_active_blocks_are_not_charged_twice() {
        // warm holds the 64-block prompt and 10 requests sharing it are active there: 64
        // distinct active blocks, the prompt adds none. cost = (0 + 64 - 64) + 64 + 0 = 64.
        let mut warm = c(0);
        warm.cached_blocks = 64;
        warm.active_blocks = 64;
        warm.in_use_blocks = 64;
        warm.active_tokens = 10 * 1024;
        // cold and idle: 64 prefill + 0 active + 64 new = 128.
        let cold = c(1);
        let p = DynamoCost::new(DynamoCostConfig::default(), 0);
        let costs = p.costs(&ctx(vec![warm.clone(), cold.clone()]));
        assert_eq!(costs, vec![64.0, 128.0]);
        // Queued prefill counts in tokens: 2,048 waiting on warm = 128 blocks.
        warm.inflight_prefill_tokens = 2048;
        let costs = p.costs(&ctx(vec![warm, cold]));
        assert_eq!(costs, vec![192.0, 128.0]);
    }

    #[test]
    fn lowest_cost_wins_and_temperature_spreads() {
        let mut warm = c(0);
        warm.cached_blocks = 32;
        let ctx = ctx(vec![warm, c(1)]);
        let mut p = DynamoCost::new(DynamoCostConfig::default(), 1);
        let d = p.choose(&ctx, 0.0).expect("decision");
        assert_eq!((d.chosen, d.reason), (WorkerId(0), Reason::DynamoCost));
        let mut hot = DynamoCost::new(
            DynamoCostConfig {
                temperature: 1.0,
                ..DynamoCostConfig::default()
            },
            3,
        );
        let zeros = (0..400)
            .filter(|_| {
                hot.choose(&ctx, 0.0)
                    .is_some_and(|d| d.chosen == WorkerId(0))
            })
            .count();
        // weights 1 : e^-1 -> ~73% on the cheaper worker.
        assert!(zeros > 250 && zeros < 340, "{zeros}");
    }
}
