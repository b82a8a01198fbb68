//! SGLang router's `cache_aware` policy as released in sglang-router 0.3.2 (PyPI sdist,
//! `src/policies/cache_aware.rs`, defaults from `src/sglang_router/router_args.py` and
//! `src/main.rs`).

use super::super::choose::{ChoiceContext, Decision, Policy, Reason};
use super::sglang_tree::ApproxTree;

/// Settings of [`SglangCacheAware`]; the defaults are sglang-router 0.3.2's launcher
/// defaults (`launch_router` and the Rust CLI agree).
#[derive(Clone, Copy, Debug)]
pub struct SglangCacheAwareConfig {
    /// Match ratio above which the best-matching worker is chosen (`--cache-threshold`, 0.3).
    pub cache_threshold: f32,
    /// Load difference above which the pool may be imbalanced (`--balance-abs-threshold`, 64).
    pub balance_abs_threshold: u32,
    /// Load ratio above which the pool may be imbalanced (`--balance-rel-threshold`, 1.5).
    pub balance_rel_threshold: f32,
    /// Seconds between evictions of the tree (`--eviction-interval-secs`, 60).
    pub eviction_interval_s: f64,
    /// Tree size per worker above which eviction trims it, in tokens. Upstream's
    /// `--max-tree-size` is 2^26 characters; at ~4 characters per token that is 2^24 tokens.
    pub max_tree_size_tokens: usize,
}

impl Default for SglangCacheAwareConfig {
    fn default() -> Self {
        Self {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            eviction_interval_s: 60.0,
            max_tree_size_tokens: 1 << 24,
        }
    }
}

/// SGLang router `cache_aware` (sglang-router 0.3.2), over token ids instead of characters:
///
/// - load = the router's own requests in flight per worker (upstream counts a request from
///   sending it until its response body ends: here the assignments waiting or decoding);
/// - imbalanced when `max - min > balance_abs_threshold` and
///   `max > balance_rel_threshold * min`: the least loaded worker (first in order on a tie,
///   as upstream's `min_by_key`), and the prompt still joins its tree;
/// - otherwise the approximate tree ([`ApproxTree`]) gives the longest prefix any worker was
///   sent and a worker owning it; above `cache_threshold` (matched / prompt tokens) that
///   worker, else the least loaded one (0.3.2 picks by load here; the "smallest tree" of
///   its header comment is older code). The prompt is inserted into the chosen worker's
///   tree at decision time;
/// - every `eviction_interval_s` (of the `now` the calls pass) each worker's tree is
///   trimmed to `max_tree_size_tokens` by least recently used leaves.
///
/// One tree serves every model the router routes (upstream keeps one per model); a match
/// naming a worker that is not a candidate falls back to the first candidate without
/// touching the tree (upstream also drops that worker from its tree: it takes a missing
/// worker for a dead one, which a kvroute router learns from its sidecars instead).
/// Explain calls choose too, so they insert like routed requests. Score: load, minus match
/// ratio, by branch.
pub struct SglangCacheAware {
    cfg: SglangCacheAwareConfig,
    tree: ApproxTree,
    last_eviction: Option<f64>,
}

impl SglangCacheAware {
    /// A policy with an empty tree. Upstream's tie-breaks are deterministic; the seed is
    /// accepted for the common constructor shape and unused.
    pub fn new(cfg: SglangCacheAwareConfig, _seed: u64) -> Self {
        Self {
            cfg,
            tree: ApproxTree::new(),
            last_eviction: None,
        }
    }

    /// The approximate tree (for tests and diagnostics).
    pub fn tree(&self) -> &ApproxTree {
        &self.tree
    }

    fn maybe_evict(&mut self, now: f64) {
        let due = match self.last_eviction {
            None => {
                self.last_eviction = Some(now);
                false
            }
            Some(t) => now - t >= self.cfg.eviction_interval_s,
        };
        if due {
            self.last_eviction = Some(now);
            self.tree.evict_by_size(self.cfg.max_tree_size_tokens);
        }
    }
}

impl Policy for SglangCacheAware {
    fn name(&self) -> &'static str {
        "sglang-cache-aware"
    }

    fn choose(&mut self, ctx: &ChoiceContext, now: f64) -> Option<Decision> {
        self.choose_prompt(ctx, None, now)
    }

    fn choose_prompt(
        &mut self,
        ctx: &ChoiceContext,
        prompt: Option<&[u32]>,
        now: f64,
    ) -> Option<Decision> {
        if ctx.candidates.is_empty() {
            return None;
        }
        self.maybe_evict(now);
        let loads: Vec<u32> = ctx
            .candidates
            .iter()
            .map(|c| c.inflight + c.decoding)
            .collect();
        let min = loads.iter().copied().min().unwrap_or(0);
        let max = loads.iter().copied().max().unwrap_or(0);
        let least = loads
            .iter()
            .enumerate()
            .min_by_key(|(_, l)| **l)
            .map_or(0, |(i, _)| i);
        let load_scores: Vec<f64> = loads.iter().map(|l| f64::from(*l)).collect();
        let tokens = prompt.unwrap_or(&[]);
        let imbalanced = max.saturating_sub(min) > self.cfg.balance_abs_threshold
            && (max as f32) > (min as f32) * self.cfg.balance_rel_threshold;
        if imbalanced {
            self.tree.insert(tokens, ctx.candidates[least].worker);
            return Some(Decision::from_ctx(
                self.name(),
                ctx,
                least,
                Reason::ShortestQueue,
                &load_scores,
            ));
        }
        let (owner, matched) = self.tree.prefix_match(tokens);
        let rate = if tokens.is_empty() {
            0.0
        } else {
            matched as f32 / tokens.len() as f32
        };
        if rate > self.cfg.cache_threshold {
            let scores: Vec<f64> = ctx
                .candidates
                .iter()
                .map(|c| {
                    if Some(c.worker) == owner {
                        -f64::from(rate)
                    } else {
                        0.0
                    }
                })
                .collect();
            let chosen = ctx.candidates.iter().position(|c| Some(c.worker) == owner);
            if let Some(i) = chosen {
                self.tree.insert(tokens, ctx.candidates[i].worker);
                return Some(Decision::from_ctx(
                    self.name(),
                    ctx,
                    i,
                    Reason::CacheMatch,
                    &scores,
                ));
            }
            return Some(Decision::from_ctx(
                self.name(),
                ctx,
                0,
                Reason::CacheMatch,
                &scores,
            ));
        }
        self.tree.insert(tokens, ctx.candidates[least].worker);
        Some(Decision::from_ctx(
            self.name(),
            ctx,
            least,
            Reason::LowMatch,
            &load_scores,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::choose::Candidate;
    use super::super::super::workers::WorkerId;
    use super::*;

    fn ctx(loads: &[u32]) -> ChoiceContext {
        ChoiceContext {
            prompt_tokens: 100,
            degraded: false,
            prefix_anchor: None,
            candidates: loads
                .iter()
                .enumerate()
                .map(|(i, &l)| Candidate {
                    worker: WorkerId(i as u32),
                    inflight: l,
                    ..Candidate::default()
                })
                .collect(),
        }
    }

    fn pick(p: &mut SglangCacheAware, loads: &[u32], prompt: &[u32]) -> (u32, Reason) {
        let d = p
            .choose_prompt(&ctx(loads), Some(prompt), 0.0)
            .expect("decision");
        (d.chosen.0, d.reason)
    }

    #[test]
    fn a_new_prompt_goes_to_the_least_loaded_and_its_prefix_follows() {
        let mut p = SglangCacheAware::new(SglangCacheAwareConfig::default(), 0);
        let a: Vec<u32> = (0..100).collect();
        assert_eq!(pick(&mut p, &[3, 1, 2], &a), (1, Reason::LowMatch));
        // Same prefix, different tail: 90% matched -> the worker it was routed to, even
        // though another is now less loaded.
        let mut b = a[..90].to_vec();
        b.extend(500..510);
        assert_eq!(pick(&mut p, &[3, 5, 0], &b), (1, Reason::CacheMatch));
        // 20% matched (below 0.3): least load again.
        let mut c = a[..20].to_vec();
        c.extend(1000..1080);
        assert_eq!(pick(&mut p, &[3, 5, 0], &c), (2, Reason::LowMatch));
        assert!(p.tree().tenant_size(WorkerId(1)) >= 110);
    }

    #[test]
    fn imbalance_needs_both_thresholds() {
        let mut p = SglangCacheAware::new(SglangCacheAwareConfig::default(), 0);
        let a: Vec<u32> = (0..100).collect();
        pick(&mut p, &[0, 0, 0], &a);
        // diff 64 is not above 64: the match still wins.
        assert_eq!(pick(&mut p, &[64, 0, 1], &a), (0, Reason::CacheMatch));
        // diff 70 > 64 and 70 > 1.5 * 2: shortest queue despite a full match.
        assert_eq!(pick(&mut p, &[70, 2, 3], &a), (1, Reason::ShortestQueue));
        // diff 65 but 195 is not above 1.5 * 130: balanced.
        assert_eq!(pick(&mut p, &[195, 130, 140], &a).1, Reason::CacheMatch);
    }

    #[test]
    fn the_tree_is_trimmed_every_interval() {
        let cfg = SglangCacheAwareConfig {
            max_tree_size_tokens: 150,
            ..SglangCacheAwareConfig::default()
        };
        let mut p = SglangCacheAware::new(cfg, 0);
        for k in 0..4u32 {
            let prompt: Vec<u32> = (k * 1000..k * 1000 + 100).collect();
            p.choose_prompt(&ctx(&[0]), Some(&prompt), f64::from(k))
                .expect("decision");
        }
        assert_eq!(p.tree().tenant_size(WorkerId(0)), 400);
        p.choose_prompt(&ctx(&[0]), Some(&[7; 10]), 61.0)
            .expect("decision");
        assert!(p.tree().tenant_size(WorkerId(0)) <= 150 + 10);
    }
}
