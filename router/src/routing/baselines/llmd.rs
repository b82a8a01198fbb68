//! llm-d's endpoint picker, two configurations:
//! - the precise prefix-cache profile of llm-d-inference-scheduler v0.8.0
//!   (`deploy/config/epp-precise-prefix-cache-config.yaml`; scorer
//!   `pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache`, block scores from
//!   llm-d-kv-cache's `LongestPrefixScorer`; queue and KV-utilization scorers of the Gateway
//!   API Inference Extension it builds on);
//! - "sticky until saturated" of llm-d-router v0.10.0, the same project renamed
//!   (`prefix-cache-affinity-filter` then `token-load-scorer` and `max-score-picker`;
//!   `pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity`,
//!   `.../scorer/tokenload`, `.../requestcontrol/dataproducer/inflightload`; blog "Sticky
//!   Until Saturated: Token-Aware Routing in llm-d", 2026-08-17).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::super::choose::{
    Candidate, ChoiceContext, Decision, Policy, Reason, argmin_random_ties,
};

/// Scorer weights of [`LlmdDefault`]: the v0.8.0 precise profile's.
#[derive(Clone, Copy, Debug)]
pub struct LlmdDefaultWeights {
    /// `precise-prefix-cache-scorer` weight (2.0).
    pub prefix: f64,
    /// `kv-cache-utilization-scorer` weight (1.0).
    pub kv_utilization: f64,
    /// `queue-scorer` weight (1.0).
    pub queue: f64,
}

impl Default for LlmdDefaultWeights {
    fn default() -> Self {
        Self {
            prefix: 2.0,
            kv_utilization: 1.0,
            queue: 1.0,
        }
    }
}

/// llm-d's precise prefix-cache scheduling profile (llm-d-inference-scheduler v0.8.0): a
/// weighted sum of three scorers in [0, 1], the highest total wins (max-score picker, ties
/// drawn uniformly):
/// - precise prefix cache: each worker's leading cached blocks (KV events); workers with
///   none score 0, the others are min-max normalized among themselves (all equal: 1);
/// - KV-cache utilization: `1 - kv_usage` (the worker's reported usage);
/// - queue: `(max_waiting - waiting) / (max_waiting - min_waiting)` over the candidates, 1
///   for everyone when all are equal (reported waiting requests).
///
/// Score: minus the weighted sum.
pub struct LlmdDefault {
    weights: LlmdDefaultWeights,
    rng: ChaCha8Rng,
}

impl LlmdDefault {
    /// Seeded.
    pub fn new(weights: LlmdDefaultWeights, seed: u64) -> Self {
        Self {
            weights,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

/// The precise prefix-cache scorer's normalization of leading cached blocks.
fn prefix_scores(candidates: &[Candidate]) -> Vec<f64> {
    let hits = candidates.iter().filter(|c| c.cached_blocks > 0);
    let lo = hits.clone().map(|c| c.cached_blocks).min().unwrap_or(0);
    let hi = hits.map(|c| c.cached_blocks).max().unwrap_or(0);
    candidates
        .iter()
        .map(|c| {
            if c.cached_blocks == 0 {
                0.0
            } else if hi == lo {
                1.0
            } else {
                (c.cached_blocks - lo) as f64 / (hi - lo) as f64
            }
        })
        .collect()
}

impl Policy for LlmdDefault {
    fn name(&self) -> &'static str {
        "llm-d"
    }

    fn choose(&mut self, ctx: &ChoiceContext, _now: f64) -> Option<Decision> {
        let qmin = ctx.candidates.iter().map(|c| c.waiting).min()?;
        let qmax = ctx.candidates.iter().map(|c| c.waiting).max()?;
        let w = self.weights;
        let prefix = prefix_scores(&ctx.candidates);
        let scores: Vec<f64> = ctx
            .candidates
            .iter()
            .zip(prefix)
            .map(|(c, prefix)| {
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
            Reason::LlmdScore,
            &scores,
        ))
    }
}

/// Settings of [`LlmdSticky`]; the defaults are llm-d-router v0.10.0's.
#[derive(Clone, Copy, Debug)]
pub struct LlmdStickyConfig {
    /// `affinityThreshold` (0.80): a worker is warm when it caches at least this fraction
    /// of the prompt's blocks.
    pub affinity_threshold: f64,
    /// `maxTTFTPenaltyMs` (18,000 ms) in seconds: stickiness breaks when the best warm
    /// worker's estimated TTFT exceeds the best other's by more than this.
    pub max_ttft_penalty_s: f64,
    /// `peakPrefillThroughput` (15,928 tokens/s, calibrated upstream for Qwen3-32B on 2x
    /// H100): the estimated TTFT is in-flight uncached tokens over this. llm-d asks operators
    /// to calibrate it per (model, accelerator) as `max-num-batched-tokens / T(one chunk)`;
    /// the benchmark sets it from the simulated profile that way.
    pub peak_prefill_throughput: f64,
    /// `queueThresholdTokens` of the token-load scorer (4,194,304): load at which a
    /// worker's score reaches 0.
    pub queue_threshold_tokens: f64,
}

impl Default for LlmdStickyConfig {
    fn default() -> Self {
        Self {
            affinity_threshold: 0.80,
            max_ttft_penalty_s: 18.0,
            peak_prefill_throughput: 15_928.0,
            queue_threshold_tokens: 4_194_304.0,
        }
    }
}

/// llm-d "sticky until saturated" (llm-d-router v0.10.0 defaults, exploration off):
/// 1. prefix-cache affinity filter: keep the warm workers, those caching at least
///    `affinity_threshold` of the prompt's full blocks; none warm: keep all;
/// 2. saturation release: each worker's TTFT is estimated as its in-flight uncached prompt
///    tokens (requests sent there without a first token yet:
///    [`Candidate::inflight_prefill_tokens`], llm-d's in-flight load producer with streaming)
///    over `peak_prefill_throughput`; when the best warm estimate exceeds the best cold one
///    by more than `max_ttft_penalty_s`, keep all;
/// 3. token-load scorer: `1 - min(1, (in-flight tokens + this prompt's uncached tokens there)
///    / queue_threshold_tokens)`, highest wins (max-score picker, ties drawn uniformly).
///
/// Score: the token load (in-flight plus this request's uncached tokens; filtered-out
/// workers score infinity).
pub struct LlmdSticky {
    cfg: LlmdStickyConfig,
    rng: ChaCha8Rng,
}

impl LlmdSticky {
    /// Seeded.
    pub fn new(cfg: LlmdStickyConfig, seed: u64) -> Self {
        Self {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

impl Policy for LlmdSticky {
    fn name(&self) -> &'static str {
        "llm-d-sticky"
    }

    fn choose(&mut self, ctx: &ChoiceContext, _now: f64) -> Option<Decision> {
        if ctx.candidates.is_empty() {
            return None;
        }
        let cfg = self.cfg;
        let warm: Vec<bool> = ctx
            .candidates
            .iter()
            .map(|c| {
                c.prompt_blocks > 0
                    && c.cached_blocks as f64 / c.prompt_blocks as f64 >= cfg.affinity_threshold
            })
            .collect();
        let ttft = |c: &Candidate| c.inflight_prefill_tokens as f64 / cfg.peak_prefill_throughput;
        let best = |want: bool| {
            ctx.candidates
                .iter()
                .zip(&warm)
                .filter(|(_, w)| **w == want)
                .map(|(c, _)| ttft(c))
                .fold(f64::INFINITY, f64::min)
        };
        let any_warm = warm.iter().any(|w| *w);
        let any_cold = warm.iter().any(|w| !*w);
        let sticky = any_warm
            && !(cfg.max_ttft_penalty_s > 0.0
                && any_cold
                && best(true) - best(false) > cfg.max_ttft_penalty_s);
        let scores: Vec<f64> = ctx
            .candidates
            .iter()
            .zip(&warm)
            .map(|(c, w)| {
                if sticky && !*w {
                    return f64::INFINITY;
                }
                let uncached = ctx
                    .prompt_tokens
                    .saturating_sub(c.cached_blocks * c.block_size);
                (c.inflight_prefill_tokens as f64 + uncached as f64).min(cfg.queue_threshold_tokens)
            })
            .collect();
        let i = argmin_random_ties(&mut self.rng, &scores)?;
        let reason = if sticky {
            Reason::StickyWarm
        } else {
            Reason::StickyReleased
        };
        Some(Decision::from_ctx(self.name(), ctx, i, reason, &scores))
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::workers::WorkerId;
    use super::*;

    use crate::routing::test_support::{c, ctx};

    #[test]
    fn precise_prefix_scores_are_min_max_normalized_among_hits() {
        let mut a = c(0);
        a.cached_blocks = 10;
        let mut b = c(1);
        b.cached_blocks = 40;
        let z = c(2);
        assert_eq!(
            prefix_scores(&[a.clone(), b, z.clone()]),
            vec![0.0, 1.0, 0.0]
        );
        // One worker with a hit scores 1 however small the hit.
        assert_eq!(prefix_scores(&[a, z]), vec![1.0, 0.0]);
    }

    #[test]
    fn llm_d_default_weighs_prefix_twice_kv_and_queue_once() {
        // warm: prefix 1, KV 0.5, longest queue 0 -> 2.5; cold idle: 0 + 1 + 1 = 2.
        let mut warm = c(0);
        warm.cached_blocks = 4;
        warm.kv_usage = 0.5;
        warm.waiting = 3;
        let cold = c(1);
        let mut p = LlmdDefault::new(LlmdDefaultWeights::default(), 0);
        let d = p
            .choose(&ctx(vec![warm.clone(), cold.clone()]), 0.0)
            .expect("decision");
        assert_eq!((d.chosen, d.reason), (WorkerId(0), Reason::LlmdScore));
        warm.kv_usage = 1.0; // 2.0 vs 2.0: a tie, drawn
        warm.waiting = 4;
        let picks: std::collections::HashSet<u32> = (0..20)
            .map(|s| {
                LlmdDefault::new(LlmdDefaultWeights::default(), s)
                    .choose(&ctx(vec![warm.clone(), cold.clone()]), 0.0)
                    .expect("decision")
                    .chosen
                    .0
            })
            .collect();
        assert_eq!(picks.len(), 2);
    }

    #[test]
    fn sticky_until_saturated() {
        let cfg = LlmdStickyConfig {
            peak_prefill_throughput: 4_000.0,
            ..LlmdStickyConfig::default()
        };
        let mut warm = c(0);
        warm.cached_blocks = 60; // 94% >= 80%
        warm.inflight_prefill_tokens = 20_000;
        let mut cool = c(1);
        cool.cached_blocks = 40; // 62%: not warm
        let idle = c(2);
        let mut p = LlmdSticky::new(cfg, 0);
        let pick = |p: &mut LlmdSticky, cs: Vec<Candidate>| {
            let d = p.choose(&ctx(cs), 0.0).expect("decision");
            (d.chosen.0, d.reason)
        };
        // 5 s of queued prefill on the warm worker is within the 18 s penalty: it stays.
        assert_eq!(
            pick(&mut p, vec![warm.clone(), cool.clone(), idle.clone()]),
            (0, Reason::StickyWarm)
        );
        // 20 s behind an idle worker: released, least token load among all wins (cool:
        // 1,024 - 640 uncached).
        warm.inflight_prefill_tokens = 80_000;
        assert_eq!(
            pick(&mut p, vec![warm.clone(), cool.clone(), idle.clone()]),
            (1, Reason::StickyReleased)
        );
        // No warm worker: token load over all.
        assert_eq!(pick(&mut p, vec![cool, idle]).1, Reason::StickyReleased);
    }
}
