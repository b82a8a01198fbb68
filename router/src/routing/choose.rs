//! The choice: what a policy sees ([`ChoiceContext`]), what it returns ([`Decision`]), the
//! [`Policy`] trait, and kvroute's own rule, [`PredictedTtft`].
//!
//! ```text
//! ChoiceContext { prompt, degraded, candidates: [Candidate { cache, load, prediction }] }
//!        |
//!   dyn Policy::choose(ctx, now)
//!        v
//! Decision { chosen, reason, degraded, candidates: [Candidate + score] }  -> /debug/explain
//! ```

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::assign::NewAssignment;
use super::hot::HotPrefixes;
use super::predict::Prediction;
use super::workers::WorkerId;

/// Everything a policy knows about one allowed worker for one request.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Candidate {
    /// The worker.
    pub worker: WorkerId,
    /// Its KV block size (tokens).
    pub block_size: usize,
    /// Full blocks of the prompt at that block size.
    pub prompt_blocks: usize,
    /// Leading prompt blocks the index says it holds.
    pub cached_blocks: usize,
    /// `cached_blocks * block_size`.
    pub cached_tokens: usize,
    /// Leading prompt blocks of the router's own recent placements on it (requests it sent
    /// there whose blocks the reports may not show yet; see `CoreConfig::pending_grace_s`).
    pub pending_blocks: usize,
    /// Cached tokens the prediction assumes: `cached_tokens`, discounted when stale, or the
    /// pending placements' tokens when larger.
    pub expected_cached_tokens: f64,
    /// Its reports stopped or are too old: cache and load figures are not trusted as is.
    pub stale: bool,
    /// One of its GPUs is degraded (throttled by heat, power brake or HW slowdown, a recent
    /// critical XID, uncorrected ECC errors), from its last load report; see `gpu.rs`.
    pub gpu_degraded: bool,
    /// Requests waiting, from its last load report.
    pub waiting: u32,
    /// Requests running, from its last load report.
    pub running: u32,
    /// KV cache usage 0..1, from its last load report.
    pub kv_usage: f32,
    /// Its KV cache size in tokens, from its last load report (0: not reported).
    pub kv_capacity_tokens: u64,
    /// The router's own assignments waiting for their first token (this replica's and, with
    /// the peer exchange, its peer replicas'; docs/replicas.md).
    pub inflight: u32,
    /// Uncached prompt tokens of those.
    pub inflight_prefill_tokens: u64,
    /// The router's own assignments decoding (this replica's and its peers').
    pub decoding: u32,
    /// Prompt tokens of all the router's outstanding assignments on it.
    pub active_tokens: u64,
    /// Uncached prompt tokens of those (the KV they add beyond blocks already held).
    pub active_uncached_tokens: u64,
    /// KV the router's outstanding assignments hold or will hold on it (their KV need plus
    /// expected output).
    pub active_kv_tokens: u64,
    /// Distinct KV blocks the prompts of the router's outstanding assignments on it reference
    /// (shared blocks counted once; from the pending overlay, so 0 when it is off).
    pub active_blocks: u64,
    /// Leading blocks of this prompt that those outstanding assignments already reference.
    pub in_use_blocks: usize,
    /// Blocks it holds in total (its cache footprint in the index).
    pub index_blocks: u64,
    /// Its working set: the distinct blocks this replica's recent placements on it used
    /// since the last use of the least recently used block two or more of them shared (a
    /// shared prefix, an earlier turn). Its LRU cache keeps every shared block only while
    /// it holds at least these (`CoreConfig::working_set_horizon`; 0 when off).
    pub working_set_blocks: u64,
    /// Prefill tokens estimated to be ahead of this request.
    pub queue_tokens: f64,
    /// Seconds of the head prompt's prefill that `queue_tokens` counts as done: the time
    /// since it reached the head, at `prefill_rate` (`CoreConfig::queue_drain`; 0 when off or
    /// nothing waits). The TTFT model learns from the first token with these seconds and
    /// their tokens added back (see `Predictor::observe`), so a rate still far off the
    /// worker's when the request was assigned does not bias the fit.
    pub queue_drain_s: f64,
    /// Learned prefill rate (tokens/s).
    pub prefill_rate: f64,
    /// Prefill rate the prediction used (tokens/s): the mean of the workers whose learned
    /// rates chain within `CoreConfig::rate_pool` of each other, this one's included, or
    /// `prefill_rate` where none does.
    pub pooled_rate: f64,
    /// Learned overhead (seconds).
    pub overhead: f64,
    /// Predicted wait for KV space beyond the prefill of the queue ahead (seconds, included
    /// in `predicted_ttft`). On a worker reporting its KV capacity: the time until the
    /// router's requests there free enough KV for what is waiting and this request, less the
    /// queue's prefill time (KV frees while the queue prefills). On one reporting none and
    /// saturated (KV usage at `CoreConfig::saturated_kv_usage` or above with requests
    /// waiting): the learned wait per queued request times the requests queued there plus
    /// this one. 0 otherwise.
    pub admission_wait: f64,
    /// KV tokens the request would newly take there: its prompt beyond the leading blocks
    /// the router's outstanding requests on it reference (cached but unreferenced blocks
    /// take KV again when reused), plus one block.
    pub kv_need_tokens: u64,
    /// Seconds the prediction counts for the engine step the worker is running: a request is
    /// scheduled when it ends. `StepConfig::share` of what is left of it as the chunks the
    /// router relays show it (`steps.rs`; 0 without them).
    pub step_s: f64,
    /// With `DecodeSteps::Published`, when the worker's running step computes no prefill:
    /// the seconds the published prediction counts for it instead of `step_s` (the
    /// remainder of its shortest recent step; `steps.rs`). None: `step_s` counts there too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published_step_s: Option<f64>,
    /// What the TTFT model predicted (`predicted_ttft` less the stale penalty, admission
    /// wait and step left): its line's seconds and its whole-steps line's, and which it used
    /// (`predict.rs`).
    pub ttft_model: Prediction,
    /// Predicted TTFT (seconds), stale penalty, admission wait and step left included: what
    /// the choice compares (see [`Candidate::published_ttft`] for what is reported).
    pub predicted_ttft: f64,
    /// Which expectation of evictions lowered `expected_cached_tokens` below what the index
    /// and the pending placements say is there (`None`: neither did).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_expected: Option<EvictionRule>,
}

/// Why the router expects part of a cached prefix to be evicted before a request is
/// admitted (docs/DESIGN.md; `CoreConfig::expect_evictions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionRule {
    /// What is queued ahead and the running requests' growth allocate the prefix's free
    /// blocks first, in the order the worker released them.
    FreeQueue,
    /// The router's outstanding requests at their peak plus this one exceed the reported KV
    /// capacity by more than `CoreConfig::overcommit_margin_tokens`: only the prefix in use
    /// there counts.
    Overcommitted,
}

impl Candidate {
    /// Requests on the worker: the larger of its report and the router's own count (each can
    /// lag the other).
    pub fn load(&self) -> f64 {
        f64::from((self.waiting + self.running).max(self.inflight + self.decoding))
    }

    /// Prompt tokens this worker would compute for the request (expected, stale-aware).
    pub fn uncached_tokens(&self, prompt_tokens: usize) -> f64 {
        (prompt_tokens as f64 - self.expected_cached_tokens).max(0.0)
    }

    /// The TTFT the router publishes for this worker (seconds): `predicted_ttft`, with
    /// `published_step_s` for the running step where there is one.
    pub fn published_ttft(&self) -> f64 {
        match self.published_step_s {
            Some(s) => self.predicted_ttft - self.step_s + s,
            None => self.predicted_ttft,
        }
    }
}

/// One request's choice problem.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChoiceContext {
    /// Prompt tokens (0 when degraded).
    pub prompt_tokens: usize,
    /// Tokens were unavailable (no tokenizer, tokenization failed): cache figures are zero and
    /// policies score on load alone.
    pub degraded: bool,
    /// The workers policy allows, in a stable order.
    pub candidates: Vec<Candidate>,
    /// The hash of the deepest prompt block any candidate is expected to hold (the index's
    /// match or the router's own pending placements): which cached prefix this request
    /// would reuse. `None` when no candidate holds any of the prompt, or degraded. kvroute
    /// counts requests per anchor to find hot prefixes (see
    /// `PredictedTtftConfig::hot_prefix_window`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_anchor: Option<u64>,
}

/// Why a worker was chosen; `as_str` is the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Only one candidate.
    OnlyCandidate,
    /// Lowest predicted TTFT, alone within the tie margin.
    LowestPredictedTtft,
    /// Several within the tie margin; a seeded draw weighted toward less load picked it.
    TieBreak,
    /// No tokens: chosen on load alone.
    DegradedLoadOnly,
    /// Uniform random draw.
    Random,
    /// Next in rotation.
    RoundRobin,
    /// Fewest requests.
    LeastLoaded,
    /// Highest llm-d weighted score (prefix, KV usage, queue).
    MaxPrefix,
    /// Lowest Dynamo cost.
    DynamoCost,
    /// SGLang: balanced, match ratio above threshold: highest match.
    CacheMatch,
    /// SGLang: balanced, match ratio below threshold: smallest cache.
    SmallestCache,
    /// SGLang: load imbalanced: shortest queue.
    ShortestQueue,
    /// SGLang 0.3.2: load balanced, match ratio at or below its threshold: least load.
    LowMatch,
    /// llm-d default profile: highest weighted score (prefix, KV utilization, queue).
    LlmdScore,
    /// llm-d sticky-until-saturated: among the cache-warm workers, least token load.
    StickyWarm,
    /// llm-d sticky-until-saturated: no warm worker, or the warm ones saturated: least
    /// token load among all.
    StickyReleased,
    /// kvroute: the prompt's cached prefix is hot (more traffic than its holders' share of
    /// the pool): the worker not holding it that was predicted to answer soonest computes a
    /// copy.
    HotPrefixCopy,
}

impl Reason {
    /// Stable label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::OnlyCandidate => "only_candidate",
            Reason::LowestPredictedTtft => "lowest_predicted_ttft",
            Reason::TieBreak => "tie_break",
            Reason::DegradedLoadOnly => "degraded_load_only",
            Reason::Random => "random",
            Reason::RoundRobin => "round_robin",
            Reason::LeastLoaded => "least_loaded",
            Reason::MaxPrefix => "max_prefix",
            Reason::DynamoCost => "dynamo_cost",
            Reason::CacheMatch => "cache_match",
            Reason::SmallestCache => "smallest_cache",
            Reason::ShortestQueue => "shortest_queue",
            Reason::LowMatch => "low_match",
            Reason::LlmdScore => "llm_d_score",
            Reason::StickyWarm => "sticky_warm",
            Reason::StickyReleased => "sticky_released",
            Reason::HotPrefixCopy => "hot_prefix_copy",
        }
    }
}

/// A candidate as the decision record shows it: its figures and the policy's score for it
/// (lower is better for every policy; see each policy for its meaning).
#[derive(Clone, Debug, Serialize)]
pub struct CandidateReport {
    /// The candidate's figures.
    #[serde(flatten)]
    pub candidate: Candidate,
    /// The policy's score (lower wins).
    pub score: f64,
}

/// The outcome of one choice, serializable for `/debug/explain`.
#[derive(Clone, Debug, Serialize)]
pub struct Decision {
    /// Policy name.
    pub policy: &'static str,
    /// The chosen worker.
    pub chosen: WorkerId,
    /// Why.
    pub reason: Reason,
    /// Tokens were unavailable.
    pub degraded: bool,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Every candidate, in context order.
    pub candidates: Vec<CandidateReport>,
}

impl Decision {
    /// Builds the record from a context, the chosen position and per-candidate scores.
    pub fn from_ctx(
        policy: &'static str,
        ctx: &ChoiceContext,
        chosen: usize,
        reason: Reason,
        scores: &[f64],
    ) -> Self {
        let candidates = ctx
            .candidates
            .iter()
            .enumerate()
            .map(|(i, c)| CandidateReport {
                candidate: c.clone(),
                score: scores.get(i).copied().unwrap_or(f64::NAN),
            })
            .collect();
        let chosen = ctx
            .candidates
            .get(chosen)
            .map_or(WorkerId(u32::MAX), |c| c.worker);
        let reason =
            if ctx.degraded && matches!(reason, Reason::LowestPredictedTtft | Reason::TieBreak) {
                Reason::DegradedLoadOnly
            } else if ctx.candidates.len() == 1 {
                Reason::OnlyCandidate
            } else {
                reason
            };
        Self {
            policy,
            chosen,
            reason,
            degraded: ctx.degraded,
            prompt_tokens: ctx.prompt_tokens,
            candidates,
        }
    }

    /// The chosen candidate's figures.
    pub fn chosen_candidate(&self) -> Option<&Candidate> {
        self.candidates
            .iter()
            .map(|r| &r.candidate)
            .find(|c| c.worker == self.chosen)
    }

    /// Predicted TTFT of the chosen worker as published (seconds;
    /// [`Candidate::published_ttft`]).
    pub fn predicted_ttft(&self) -> f64 {
        self.chosen_candidate()
            .map_or(f64::NAN, Candidate::published_ttft)
    }

    /// The assignment to record once the request is sent.
    pub fn new_assignment(&self) -> NewAssignment {
        let c = self.chosen_candidate();
        NewAssignment {
            worker: self.chosen,
            prompt_tokens: self.prompt_tokens as u64,
            uncached_tokens: c
                .map_or(self.prompt_tokens as f64, |c| {
                    c.uncached_tokens(self.prompt_tokens)
                })
                .round() as u64,
            undrained_queue_tokens: c
                .map_or(0.0, |c| c.queue_tokens + c.queue_drain_s * c.prefill_rate),
            queue_drain_s: c.map_or(0.0, |c| c.queue_drain_s),
            step_s: c.map_or(0.0, |c| c.step_s),
            ttft_model: c.map_or(Prediction::line(f64::NAN), |c| c.ttft_model),
            predicted_ttft: c.map_or(f64::NAN, |c| c.predicted_ttft),
            published_ttft: self.predicted_ttft(),
            ttft_bound: f64::NAN,
            output_tokens: 0,
            kv_need_tokens: c.map_or(self.prompt_tokens as u64, |c| c.kv_need_tokens),
        }
    }
}

/// A routing policy. Object-safe; state (rotation, RNG) lives in the policy value, so one
/// value per router replica (seeded differently) keeps replicas from herding.
pub trait Policy: Send {
    /// Name as accepted by [`super::policies::policy_by_name`].
    fn name(&self) -> &'static str;
    /// Picks a candidate; `None` only when there are no candidates.
    fn choose(&mut self, ctx: &ChoiceContext, now: f64) -> Option<Decision>;

    /// Picks a candidate for a request whose prompt tokens are `prompt` (`None`: degraded).
    /// Every front door calls this one. Policies that keep their own record of what they
    /// routed (SGLang's approximate tree, [`super::baselines::SglangCacheAware`]) override
    /// it; the default ignores the tokens.
    fn choose_prompt(
        &mut self,
        ctx: &ChoiceContext,
        _prompt: Option<&[u32]>,
        now: f64,
    ) -> Option<Decision> {
        self.choose(ctx, now)
    }

    /// Whether the router should expect, for this policy, the prompts queued ahead of a
    /// request to evict cached prefixes before it is admitted
    /// (`CoreConfig::expect_evictions`). It changes the uncached tokens every assignment
    /// records, from which the baselines take their token loads, so only a policy whose own
    /// model this is says yes: kvroute. The baselines keep the view of the cache their
    /// sources have.
    fn expects_evictions(&self) -> bool {
        false
    }
}

/// Settings of kvroute's own rule.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PredictedTtftConfig {
    /// Predictions within this many seconds of the best are near-ties.
    pub tie_margin_s: f64,
    /// ... or within this fraction of the best.
    pub tie_margin_rel: f64,
    /// Cache affinity: a candidate holding fewer of the prompt's leading tokens than the
    /// best-cached candidate is charged this many times the time to recompute the
    /// difference at its rate, on top of its prediction. Recomputing a prefix another worker
    /// already holds duplicates it and evicts other prefixes, so later requests pay for it
    /// again; the charge keeps prefixes on one worker unless another is clearly faster.
    /// 0 disables it.
    pub cache_affinity: f64,
    /// A worker reporting waiting requests at this KV usage or above is saturated: new
    /// requests wait there for decodes to free KV, so its cache does not anchor the
    /// affinity charge (others are not charged for not holding what it holds), unless the
    /// router's outstanding requests there use the prompt's leading blocks
    /// (`Candidate::in_use_blocks`): those stay cached while they run.
    pub saturated_kv_usage: f32,
    /// KV balance: each KV token the router's outstanding requests hold on a candidate
    /// (`Candidate::active_kv_tokens`) beyond the least-occupied candidate is charged as this
    /// fraction of a prefill token. Off by default: the core predicts the wait for KV space
    /// itself when workers report their KV capacity, and in the simulated pool this charge
    /// then cost more than it saved (shared-prefix median 0.146 s without it vs 0.247 s at
    /// 0.5, six seeds; independent prompts' p90 was its one gain, 2.53 vs 2.71 s). Useful for
    /// workers that do not report a capacity. 0 disables it.
    pub kv_balance: f64,
    /// KV-block balance: the distinct KV blocks the router's outstanding requests would
    /// reference on a candidate once this request is there (`Candidate::active_blocks` plus
    /// the prompt's blocks not in use there yet: Dynamo's decode-load term) beyond the least
    /// such candidate are charged as this many times their prefill time, on candidates where
    /// those blocks exceed `block_balance_kv_share` of the reported KV capacity. Blocks shared
    /// by outstanding requests count once, so prefixes may still gather on one worker while
    /// distinct conversations spread. A worker whose outstanding requests fill its KV evicts
    /// the prefixes it released, and its next requests wait for decodes to free blocks;
    /// the charge moves work to where the blocks are before that. Measured in bench/README.md
    /// ("KV-block balance near a full cache"). 0 disables it.
    pub block_balance: f64,
    /// The share of a candidate's reported KV capacity its outstanding distinct blocks (with
    /// this request's) must exceed before `block_balance` charges it; a candidate that
    /// reports no capacity is not charged. 0 charges every candidate, whatever its capacity
    /// (Dynamo charges decode blocks everywhere): ungated at weight 1, in the simulated pool
    /// (seeds 42-45), multi-turn's p90 went from 2.383 s to 2.173 s but shared-prefix's median
    /// from 0.144 s to 0.480 s, as prefixes were recomputed wherever suffixes piled up.
    /// The blocks are the prompts' only (outputs are not hashed) and this replica's
    /// placements only (`Candidate::active_blocks`): with several replicas each sees its own
    /// share of a worker's blocks, so the gate opens later than the cache fills. A candidate
    /// already holding more of the prompt than a hot prefix's copy may take
    /// (`hot_prefix_max_kv_share` of its capacity) is not charged: moving the request would
    /// recompute that prefix elsewhere, and on the live hot-prefix shape (8,192-token
    /// prefixes, 26,000 KV tokens) the charge without this cost 4-10% of the throughput.
    /// Nor is one already holding at least as many tokens of the prompt as the blocks it
    /// would be charged for: under an open loop of bursts near capacity the charge split
    /// bursts of a 16,384-token prefix (below a copy's 18,750 on 150,000 KV tokens) off
    /// their holder and recomputed the prefix (bench/README.md, "Waiting for KV while the
    /// queue prefills"). Where the outstanding requests on a candidate already use the
    /// prompt's leading blocks (`Candidate::in_use_blocks`), it is charged at most for the
    /// blocks this request adds there: the shared prefix stays in use whether this request
    /// goes or not, so charging the whole imbalance moved a burst's later requests off
    /// its holder to recompute the prefix (bench/README.md, "Why kvroute splits bursts").
    pub block_balance_kv_share: f64,
    /// Seconds added to the score of a candidate with a degraded GPU while at least one
    /// candidate is healthy: it loses ties and close calls, yet still takes work when the
    /// healthy workers are predicted this much slower (a throttled GPU is slow, not down; a
    /// dead one fails its readiness probe and leaves the pool). Not added when every
    /// candidate is degraded. 0 disables it.
    pub gpu_degraded_penalty_s: f64,
    /// Token load among near-ties: only near-ties whose outstanding prompt tokens
    /// (`Candidate::active_tokens`, this replica's and its peers') are within this fraction of
    /// the request's prompt of the least are drawn from. A prompt no worker caches is a
    /// near-tie everywhere, so this places new prefixes where the least prompt work is
    /// outstanding, and prefixes spread over workers in proportion to their traffic, as
    /// llm-d's token-load scorer spreads them. Weighting the draw by requests alone let a worker
    /// take a fourth 39k-token prefix while another held one, and its cache then thrashed:
    /// on the kinference scenario (seeds 939238175-179, kvroute alone, concurrency 8) the
    /// shared-prefix TTFT p90 was 0.29, 2.05, 3.48, 4.21 and 5.45 s without this and 0.24,
    /// 0.24, 0.35, 0.29 and 0.36 s at 0.5 (0 gave the same); independent prompts' p90 went
    /// from 9.05, 9.64, 9.26, 7.20, 10.00 to 7.08, 7.64, 7.04, 9.13, 9.13 s; multi-turn's
    /// stayed at 1.84-1.85 s (bench/README.md, "Token load among near-ties"). Some slack
    /// keeps a draw among workers that are equal, so replicas do not all pick the same one.
    /// Negative disables it.
    pub tie_token_slack: f64,
    /// Hot prefixes: the requests over which kvroute counts how often each cached prefix is
    /// reused (`ChoiceContext::prefix_anchor`, decayed per request; `hot.rs`). When a
    /// prefix's share of those requests times the number of candidates exceeds the number
    /// of candidates holding it (60% of the traffic on one holder of three: 1.8 > 1), its
    /// holders carry more than their share of the pool: this request goes to the worker not
    /// holding it that is predicted to answer soonest (its recomputation of the prefix
    /// included), which then holds a copy, and later requests spread over the holders by
    /// their predictions. This is the one place kvroute knowingly takes a slower first token:
    /// the holder may still answer this request sooner (its queue is short), but every
    /// request of the prefix adds prefill chunks and a decode to the holder's batches, and
    /// one recomputation spreads them. The share is of all requests this policy routes, so in
    /// a router serving several pools a prefix hot within one of them looks less hot (no
    /// copy is made, as without this rule). A burst of one new prefix shorter than about a
    /// third of a window stays together. 0 disables it.
    pub hot_prefix_window: u32,
    /// A hot prefix's copy may take at most this share of the copy worker's reported KV
    /// cache (`Candidate::kv_capacity_tokens`; a worker reporting none gets no copy). A copy
    /// evicts other prefixes: on the live shape in bench/README.md ("Where the cache and the
    /// queue disagree"), workers of 26,000 KV tokens and 8,192-token prefixes, copies (31%
    /// of a worker's KV) made the other prefixes thrash, and throughput fell (182.1 req/min
    /// median over 3 seeds against 195.9 without copies); in the simulated shape, 16,384-token
    /// copies are 11% of 150,000 and pay. This bound was set after those two runs, between
    /// them; no other shape has been measured.
    pub hot_prefix_max_kv_share: f64,
    /// KV fit: on a candidate reporting its KV capacity, the blocks this request adds
    /// wherever it goes (its prompt beyond the most any candidate holds) that do not fit
    /// there beside the candidate's working set (`Candidate::working_set_blocks`) are
    /// charged, beyond the least any candidate would evict, as this many times their
    /// prefill time. Each such block evicts one its later requests reuse, and one of them
    /// recomputes it. A prompt no worker holds is a near-tie everywhere but for the queues,
    /// and the worker whose requests all hit its cache has the shortest queue, so without
    /// this it takes new prefixes until they no longer fit (GuideLLM shared-prefix, 8
    /// streams: 13 cold placements on one worker of 1,625 blocks, against 128-block
    /// prefixes; bench/README.md, "Re-run on dabed5ea7", the decision-log table).
    /// Recomputing a prefix another worker holds is the affinity charge's to price, not
    /// this one's. Working sets are tracked only with `CoreConfig::working_set_horizon`
    /// above 0, which is off by default (bench/README.md, "New prefixes where they fit");
    /// without them this charges nothing. 0 disables it.
    pub kv_fit: f64,
}

impl Default for PredictedTtftConfig {
    fn default() -> Self {
        Self {
            tie_margin_s: 0.02,
            tie_margin_rel: 0.05,
            cache_affinity: 1.0,
            saturated_kv_usage: 0.9,
            kv_balance: 0.0,
            block_balance: 2.0,
            block_balance_kv_share: 0.9,
            gpu_degraded_penalty_s: 1.0,
            tie_token_slack: 0.5,
            hot_prefix_window: 64,
            hot_prefix_max_kv_share: 0.125,
            kv_fit: 1.0,
        }
    }
}

/// kvroute: the lowest predicted TTFT wins. Candidates whose prediction is within
/// `max(tie_margin_s, tie_margin_rel * best)` of the best are near-ties, and one of them is
/// drawn with weight `1 / (1 + load)` from a seeded RNG: replicas with different seeds
/// spread near-equal work instead of all piling onto the same worker, and less loaded
/// workers are favoured. Stale workers are handled where predictions are made
/// ([`super::RoutingCore`]): their cached blocks count at a discount and a penalty is added.
/// Degraded contexts (no tokens) carry predictions from queue and overhead alone, so the
/// same rule then scores load only, and the decision says so.
pub struct PredictedTtft {
    cfg: PredictedTtftConfig,
    rng: ChaCha8Rng,
    /// Decayed request counts per prefix anchor (`None`: the rule is off).
    hot: Option<HotPrefixes>,
}

impl PredictedTtft {
    /// A policy drawing its tie-breaks from `seed`.
    pub fn new(cfg: PredictedTtftConfig, seed: u64) -> Self {
        Self {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(seed),
            hot: (cfg.hot_prefix_window > 0).then(|| HotPrefixes::new(cfg.hot_prefix_window)),
        }
    }
}

impl PredictedTtft {
    /// Seconds charged to `c` for holding fewer leading tokens than the best-cached
    /// candidate (`best_cached` expected cached tokens): `cache_affinity` times the time to
    /// recompute the difference at `c`'s rate. `best_cached` is taken over the candidates
    /// that are not saturated, or whose outstanding requests use the prompt's leading blocks
    /// (see `saturated_kv_usage`).
    pub fn affinity_penalty(&self, c: &Candidate, best_cached: f64) -> f64 {
        let missing = (best_cached - c.expected_cached_tokens).max(0.0);
        if self.cfg.cache_affinity <= 0.0 || missing <= 0.0 || c.prefill_rate <= 0.0 {
            return 0.0;
        }
        self.cfg.cache_affinity * missing / c.prefill_rate
    }
}

impl PredictedTtft {
    /// Seconds charged to `c` for the KV the router's outstanding requests hold on it beyond
    /// the least-occupied candidate's (`least_active`): `kv_balance` times their prefill time.
    pub fn kv_balance_penalty(&self, c: &Candidate, least_active: u64) -> f64 {
        let extra = c.active_kv_tokens.saturating_sub(least_active) as f64;
        if self.cfg.kv_balance <= 0.0 || extra <= 0.0 || c.prefill_rate <= 0.0 {
            return 0.0;
        }
        self.cfg.kv_balance * extra / c.prefill_rate
    }
}

impl PredictedTtft {
    /// The most tokens of a prefix a copy may take on `c` (`hot_prefix_max_kv_share` of its
    /// reported KV); `None` when it reports no capacity, where no copy fits.
    fn copy_max_tokens(&self, c: &Candidate) -> Option<f64> {
        (c.kv_capacity_tokens > 0)
            .then_some(self.cfg.hot_prefix_max_kv_share * c.kv_capacity_tokens as f64)
    }

    /// The prompt's blocks that no outstanding request on `c` references yet: what this
    /// request adds to the distinct blocks in use there.
    fn new_blocks(c: &Candidate) -> u64 {
        c.prompt_blocks.saturating_sub(c.in_use_blocks) as u64
    }

    /// Distinct KV blocks outstanding requests would reference on `c` with this request
    /// there (see `block_balance`).
    fn blocks_after(c: &Candidate) -> u64 {
        c.active_blocks + Self::new_blocks(c)
    }

    /// Seconds charged to `c` for the distinct blocks it would hold beyond the least
    /// (`least_blocks`): `block_balance` times their prefill time at `c`'s rate, when they
    /// exceed `block_balance_kv_share` of its KV capacity; where the router's outstanding
    /// requests on `c` already use the prompt's leading blocks, at most the blocks this
    /// request adds there.
    pub fn block_balance_penalty(&self, c: &Candidate, least_blocks: u64) -> f64 {
        let block_size = c.block_size.max(1) as f64;
        let after = Self::blocks_after(c);
        let extra = after.saturating_sub(least_blocks) as f64 * block_size;
        if self.cfg.block_balance <= 0.0 || extra <= 0.0 || c.prefill_rate <= 0.0 {
            return 0.0;
        }
        // Holding more of the prompt than a copy may take (against a reported capacity), or
        // at least as much as the blocks charged: moving the request recomputes that prefix
        // elsewhere, which takes more KV and prefill there than the imbalance it relieves.
        if self
            .copy_max_tokens(c)
            .is_some_and(|max| c.expected_cached_tokens > max)
            || c.expected_cached_tokens >= extra
        {
            return 0.0;
        }
        let share = self.cfg.block_balance_kv_share;
        if share > 0.0
            && (c.kv_capacity_tokens == 0
                || after as f64 * block_size <= share * c.kv_capacity_tokens as f64)
        {
            return 0.0;
        }
        // A prefix the outstanding requests there already use stays whether this request
        // goes or not: only the blocks it adds are charged.
        let extra = if c.in_use_blocks > 0 {
            extra.min(Self::new_blocks(c) as f64 * block_size)
        } else {
            extra
        };
        self.cfg.block_balance * extra / c.prefill_rate
    }
}

impl PredictedTtft {
    /// Blocks the request would add on `c`: its prompt beyond what `c` holds.
    fn added_blocks(c: &Candidate) -> u64 {
        (c.prompt_blocks as u64).saturating_sub(c.cached_blocks.max(c.pending_blocks) as u64)
    }

    /// Blocks of its working set this request would evict on `c`: those it adds there
    /// beyond what fits beside the working set in `c`'s reported KV, counting at most
    /// `new_blocks`, the blocks it adds wherever it goes (the least any candidate adds:
    /// recomputing a prefix another candidate holds is the affinity charge's to price). 0
    /// on a candidate reporting no capacity.
    fn evicted_blocks(c: &Candidate, new_blocks: u64) -> u64 {
        let block_size = c.block_size.max(1) as u64;
        let capacity = c.kv_capacity_tokens / block_size;
        if capacity == 0 {
            return 0;
        }
        let added = Self::added_blocks(c);
        (c.working_set_blocks + added)
            .saturating_sub(capacity)
            .min(added)
            .min(new_blocks)
    }

    /// Seconds charged to `c` for the blocks of its working set it would evict beyond the
    /// least any candidate would: `kv_fit` times their prefill time at `c`'s rate. `fit` is
    /// (the blocks the request adds wherever it goes, the least any candidate would evict),
    /// `None` when nothing can be charged (the charge off, or no working set tracked).
    /// Where every candidate would evict as much, nobody is charged: the request costs a
    /// recomputation wherever it goes.
    pub fn kv_fit_penalty(&self, c: &Candidate, fit: Option<(u64, u64)>) -> f64 {
        let Some((new_blocks, least_evicted)) = fit else {
            return 0.0;
        };
        let extra = Self::evicted_blocks(c, new_blocks).saturating_sub(least_evicted);
        if extra == 0 || c.prefill_rate <= 0.0 {
            return 0.0;
        }
        self.cfg.kv_fit * (extra * c.block_size.max(1) as u64) as f64 / c.prefill_rate
    }

    /// What `kv_fit_penalty` needs of the whole context, or `None` when it charges nobody:
    /// the charge is off, or no candidate has a working set (working sets off), so the
    /// decision path does no more work than without the rule.
    fn kv_fit_context(&self, ctx: &ChoiceContext) -> Option<(u64, u64)> {
        if self.cfg.kv_fit <= 0.0 || ctx.candidates.iter().all(|c| c.working_set_blocks == 0) {
            return None;
        }
        let new_blocks = ctx.candidates.iter().map(Self::added_blocks).min()?;
        let least_evicted = ctx
            .candidates
            .iter()
            .map(|c| Self::evicted_blocks(c, new_blocks))
            .min()?;
        Some((new_blocks, least_evicted))
    }
}

impl Policy for PredictedTtft {
    fn name(&self) -> &'static str {
        "kvroute"
    }

    fn expects_evictions(&self) -> bool {
        true
    }

    fn choose(&mut self, ctx: &ChoiceContext, _now: f64) -> Option<Decision> {
        let saturated = |c: &Candidate| c.waiting > 0 && c.kv_usage >= self.cfg.saturated_kv_usage;
        // A saturated worker still anchors the charge (and counts as a holder) for a prefix
        // its outstanding requests use: those blocks stay while they run, so a request there
        // needs only its own.
        let anchors = |c: &Candidate| !saturated(c) || c.in_use_blocks > 0;
        let best_cached = ctx
            .candidates
            .iter()
            .filter(|c| anchors(c))
            .map(|c| c.expected_cached_tokens)
            .fold(0.0, f64::max);
        let holds = |c: &Candidate| c.expected_cached_tokens + c.block_size as f64 >= best_cached;
        // Hot prefix: more traffic than its holders' share of the pool (see
        // `hot_prefix_window`): a worker not holding it takes a copy.
        let share = match self.hot.as_mut() {
            Some(h) if !ctx.degraded => h.observe(ctx.prefix_anchor),
            _ => 0.0,
        };
        let holders = ctx
            .candidates
            .iter()
            .filter(|c| anchors(c) && holds(c))
            .count();
        let hot = best_cached > 0.0 && share * ctx.candidates.len() as f64 > holders as f64;
        let least_active = ctx
            .candidates
            .iter()
            .map(|c| c.active_kv_tokens)
            .min()
            .unwrap_or(0);
        let least_blocks = ctx
            .candidates
            .iter()
            .map(Self::blocks_after)
            .min()
            .unwrap_or(0);
        let fit = self.kv_fit_context(ctx);
        let any_healthy_gpu = ctx.candidates.iter().any(|c| !c.gpu_degraded);
        let scores: Vec<f64> = ctx
            .candidates
            .iter()
            .map(|c| {
                if c.predicted_ttft.is_finite() {
                    let mut score = c.predicted_ttft
                        + self.affinity_penalty(c, best_cached)
                        + self.kv_balance_penalty(c, least_active)
                        + self.block_balance_penalty(c, least_blocks)
                        + self.kv_fit_penalty(c, fit);
                    if c.gpu_degraded && any_healthy_gpu {
                        score += self.cfg.gpu_degraded_penalty_s;
                    }
                    score
                } else {
                    f64::MAX
                }
            })
            .collect();
        // A hot prefix's copy: among the workers not holding it, the soonest predicted
        // (near-ties drawn as below, so that replicas do not all copy to the same one).
        let copy_scores: Option<Vec<f64>> = hot
            .then(|| {
                ctx.candidates
                    .iter()
                    .map(|c| {
                        let fits = self
                            .copy_max_tokens(c)
                            .is_some_and(|max| best_cached <= max);
                        if fits && !saturated(c) && !holds(c) && c.predicted_ttft.is_finite() {
                            c.predicted_ttft
                        } else {
                            f64::MAX
                        }
                    })
                    .collect::<Vec<f64>>()
            })
            .filter(|s| s.iter().any(|&x| x < f64::MAX));
        let copy = copy_scores.is_some();
        let scores = copy_scores.unwrap_or(scores);
        let best = scores.iter().copied().fold(f64::INFINITY, f64::min);
        if !best.is_finite() {
            return None;
        }
        let margin = self.cfg.tie_margin_s.max(self.cfg.tie_margin_rel * best);
        let mut near: Vec<(usize, f64)> = scores
            .iter()
            .enumerate()
            .filter(|(_, s)| **s <= best + margin)
            .map(|(i, _)| (i, 1.0 / (1.0 + ctx.candidates[i].load())))
            .collect();
        if self.cfg.tie_token_slack >= 0.0 {
            let least = near
                .iter()
                .map(|&(i, _)| ctx.candidates[i].active_tokens)
                .min()
                .unwrap_or(0);
            let slack = (self.cfg.tie_token_slack * ctx.prompt_tokens as f64) as u64;
            near.retain(|&(i, _)| ctx.candidates[i].active_tokens <= least.saturating_add(slack));
        }
        let (pick, reason) = if near.len() == 1 {
            (near[0].0, Reason::LowestPredictedTtft)
        } else {
            (weighted_draw(&mut self.rng, &near), Reason::TieBreak)
        };
        let reason = if copy { Reason::HotPrefixCopy } else { reason };
        Some(Decision::from_ctx(self.name(), ctx, pick, reason, &scores))
    }
}

/// Draws an index from `(index, weight)` pairs proportionally to weight (uniformly when the
/// weights are not usable). `items` must not be empty.
pub(crate) fn weighted_draw(rng: &mut ChaCha8Rng, items: &[(usize, f64)]) -> usize {
    let total: f64 = items.iter().map(|(_, w)| w.max(0.0)).sum();
    if !(total.is_finite() && total > 0.0) {
        return items[rng.random_range(0..items.len())].0;
    }
    let mut x = rng.random::<f64>() * total;
    for &(i, w) in items {
        x -= w.max(0.0);
        if x < 0.0 {
            return i;
        }
    }
    items[items.len() - 1].0
}

/// Index of the lowest score; exact ties broken by a uniform draw.
pub(crate) fn argmin_random_ties(rng: &mut ChaCha8Rng, scores: &[f64]) -> Option<usize> {
    let best = scores
        .iter()
        .copied()
        .filter(|s| !s.is_nan())
        .fold(f64::INFINITY, f64::min);
    let ties: Vec<(usize, f64)> = scores
        .iter()
        .enumerate()
        .filter(|(_, s)| **s == best)
        .map(|(i, _)| (i, 1.0))
        .collect();
    if ties.is_empty() {
        return if scores.is_empty() { None } else { Some(0) };
    }
    Some(weighted_draw(rng, &ties))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(w: u32, ttft: f64, load: u32) -> Candidate {
        Candidate {
            worker: WorkerId(w),
            predicted_ttft: ttft,
            waiting: load,
            ..Candidate::default()
        }
    }

    #[test]
    fn lowest_prediction_wins_outside_the_margin() {
        let ctx = ChoiceContext {
            prompt_tokens: 100,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![cand(0, 1.0, 0), cand(1, 0.3, 5), cand(2, 0.6, 0)],
        };
        let d = PredictedTtft::new(PredictedTtftConfig::default(), 1)
            .choose(&ctx, 0.0)
            .expect("decision");
        assert_eq!(d.chosen, WorkerId(1));
        assert_eq!(d.reason, Reason::LowestPredictedTtft);
        assert_eq!(d.candidates.len(), 3);
        assert!((d.predicted_ttft() - 0.3).abs() < 1e-12);
        let json = serde_json::to_value(&d).expect("serializes");
        assert_eq!(json["reason"], "lowest_predicted_ttft");
        assert_eq!(json["candidates"][1]["worker"], 1);
    }

    #[test]
    fn tie_break_is_seeded_and_spreads_across_replicas() {
        let ctx = ChoiceContext {
            prompt_tokens: 100,
            degraded: false,
            prefix_anchor: None,
            candidates: (0..4)
                .map(|w| cand(w, 0.5 + f64::from(w) * 0.001, 0))
                .collect(),
        };
        let run = |seed: u64| -> Vec<u32> {
            let mut p = PredictedTtft::new(PredictedTtftConfig::default(), seed);
            (0..200)
                .map(|_| p.choose(&ctx, 0.0).map_or(99, |d| d.chosen.0))
                .collect()
        };
        assert_eq!(run(5), run(5), "same seed, same draws");
        assert_ne!(run(5), run(6), "different replicas draw differently");
        let firsts: std::collections::HashSet<u32> = (0..16).map(|s| run(s)[0]).collect();
        assert!(
            firsts.len() >= 3,
            "replicas' first picks spread: {firsts:?}"
        );
        let mut counts = [0; 4];
        run(9).into_iter().for_each(|w| counts[w as usize] += 1);
        assert!(counts.iter().all(|&c| c > 20), "{counts:?}");
    }

    #[test]
    fn tie_break_favours_less_load() {
        let ctx = ChoiceContext {
            prompt_tokens: 100,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![cand(0, 0.5, 0), cand(1, 0.5, 9)],
        };
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 3);
        let idle = (0..1000)
            .filter(|_| p.choose(&ctx, 0.0).is_some_and(|d| d.chosen == WorkerId(0)))
            .count();
        // weights 1 : 1/10 -> ~91%
        assert!(idle > 850 && idle < 960, "{idle}");
    }

    #[test]
    fn near_ties_go_to_the_least_outstanding_prompt_tokens() {
        // A 40k-token prompt nobody caches: a near-tie on all three workers. Worker 0 has
        // fewer requests but more outstanding prompt tokens (two long prefixes' requests).
        let with = |w: u32, waiting: u32, active: u64| Candidate {
            active_tokens: active,
            ..cand(w, 6.9, waiting)
        };
        let ctx = ChoiceContext {
            prompt_tokens: 40_000,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![with(0, 1, 80_000), with(1, 3, 30_000), with(2, 3, 45_000)],
        };
        // How often each worker is picked in 300 choices.
        let tally = |cfg: PredictedTtftConfig| {
            let mut p = PredictedTtft::new(cfg, 7);
            let mut picked = [0usize; 3];
            for _ in 0..300 {
                let d = p.choose(&ctx, 0.0).expect("decision");
                picked[d.chosen.0 as usize] += 1;
            }
            picked
        };
        let picked = tally(PredictedTtftConfig::default());
        // Within half a prompt (20k tokens) of the least (30k): workers 1 and 2, drawn.
        assert_eq!(picked[0], 0, "{picked:?}");
        assert!(picked[1] > 100 && picked[2] > 100, "{picked:?}");
        // Disabled: the draw weighs requests only, and worker 0 (fewest) is favoured.
        let off = PredictedTtftConfig {
            tie_token_slack: -1.0,
            ..PredictedTtftConfig::default()
        };
        let picked = tally(off);
        assert!(picked[0] > picked[1] && picked[0] > picked[2], "{picked:?}");
        // Outside the margin the prediction decides, whatever the token load.
        let ctx = ChoiceContext {
            prompt_tokens: 40_000,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![
                Candidate {
                    predicted_ttft: 0.2,
                    ..with(0, 1, 80_000)
                },
                with(1, 3, 30_000),
            ],
        };
        let d = PredictedTtft::new(PredictedTtftConfig::default(), 7)
            .choose(&ctx, 0.0)
            .expect("decision");
        assert_eq!(d.chosen, WorkerId(0));
    }

    #[test]
    fn degraded_and_single_candidate_reasons() {
        let mut ctx = ChoiceContext {
            prompt_tokens: 0,
            degraded: true,
            prefix_anchor: None,
            candidates: vec![cand(0, 0.2, 0), cand(1, 0.9, 0)],
        };
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 0);
        let d = p.choose(&ctx, 0.0).expect("decision");
        assert!(d.degraded);
        assert_eq!(d.reason, Reason::DegradedLoadOnly);
        ctx.degraded = false;
        ctx.candidates.truncate(1);
        assert_eq!(
            p.choose(&ctx, 0.0).map(|d| d.reason),
            Some(Reason::OnlyCandidate)
        );
        ctx.candidates.clear();
        assert!(p.choose(&ctx, 0.0).is_none());
    }

    #[test]
    fn cache_affinity_charges_recomputing_what_another_worker_holds() {
        let warm = Candidate {
            worker: WorkerId(0),
            expected_cached_tokens: 2_048.0,
            prefill_rate: 4_800.0,
            predicted_ttft: 0.5,
            ..Candidate::default()
        };
        let cold = Candidate {
            worker: WorkerId(1),
            expected_cached_tokens: 0.0,
            prefill_rate: 4_800.0,
            predicted_ttft: 0.45,
            ..Candidate::default()
        };
        let ctx = ChoiceContext {
            prompt_tokens: 2_304,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![warm.clone(), cold.clone()],
        };
        // Cold predicts slightly faster, but would recompute 2,048 tokens warm holds.
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let d = p.choose(&ctx, 0.0).expect("decision");
        assert_eq!(d.chosen, WorkerId(0));
        assert_eq!(d.reason, Reason::LowestPredictedTtft);
        let charged = d.candidates[1].score - 0.45;
        assert!((charged - 2_048.0 / 4_800.0).abs() < 1e-9, "{charged}");
        assert!((d.candidates[0].score - 0.5).abs() < 1e-12);
        // Disabled: the raw prediction wins.
        let cfg = PredictedTtftConfig {
            cache_affinity: 0.0,
            ..PredictedTtftConfig::default()
        };
        let d = PredictedTtft::new(cfg, 1)
            .choose(&ctx, 0.0)
            .expect("decision");
        assert_eq!(d.chosen, WorkerId(1));
        // A much faster cold worker still wins despite the charge.
        let mut fast = cold;
        fast.predicted_ttft = 0.0;
        let ctx = ChoiceContext {
            prompt_tokens: 2_304,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![
                Candidate {
                    predicted_ttft: 3.0,
                    ..warm.clone()
                },
                fast.clone(),
            ],
        };
        let d = p.choose(&ctx, 0.0).expect("decision");
        assert_eq!(d.chosen, WorkerId(1));
        // A saturated warm worker (KV full, requests waiting) anchors no charge.
        let ctx = ChoiceContext {
            prompt_tokens: 2_304,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![
                Candidate {
                    waiting: 2,
                    kv_usage: 0.97,
                    ..warm
                },
                Candidate {
                    predicted_ttft: 0.45,
                    ..fast
                },
            ],
        };
        let d = p.choose(&ctx, 0.0).expect("decision");
        assert_eq!(d.chosen, WorkerId(1));
        assert!((d.candidates[1].score - 0.45).abs() < 1e-12);
        // ... unless its outstanding requests use the prompt's leading blocks (a burst's
        // holder): those stay while they run, so the cold worker is charged again.
        let mut in_use = ctx;
        in_use.candidates[0].in_use_blocks = 128;
        in_use.candidates[0].predicted_ttft = 0.5;
        let d = p.choose(&in_use, 0.0).expect("decision");
        assert_eq!(d.chosen, WorkerId(0));
        let charged = d.candidates[1].score - 0.45;
        assert!((charged - 2_048.0 / 4_800.0).abs() < 1e-9, "{charged}");
    }

    #[test]
    fn kv_balance_charges_outstanding_kv_beyond_the_least() {
        let busy = Candidate {
            worker: WorkerId(0),
            prefill_rate: 4_000.0,
            predicted_ttft: 0.30,
            active_tokens: 20_000,
            active_kv_tokens: 8_000,
            ..Candidate::default()
        };
        let idle = Candidate {
            worker: WorkerId(1),
            prefill_rate: 4_000.0,
            predicted_ttft: 0.50,
            active_tokens: 2_000,
            active_kv_tokens: 2_000,
            ..Candidate::default()
        };
        let ctx = ChoiceContext {
            prompt_tokens: 2_304,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![busy, idle],
        };
        let on = PredictedTtftConfig {
            kv_balance: 0.5,
            ..PredictedTtftConfig::default()
        };
        let mut p = PredictedTtft::new(on, 1);
        let d = p.choose(&ctx, 0.0).expect("decision");
        // busy: 0.30 + 0.5 * 6,000 / 4,000 = 1.05 > idle 0.50.
        assert_eq!(d.chosen, WorkerId(1));
        assert!((d.candidates[0].score - 1.05).abs() < 1e-9);
        assert!((d.candidates[1].score - 0.50).abs() < 1e-12);
        let cfg = PredictedTtftConfig {
            kv_balance: 0.0,
            ..PredictedTtftConfig::default()
        };
        let d = PredictedTtft::new(cfg, 1)
            .choose(&ctx, 0.0)
            .expect("decision");
        assert_eq!(d.chosen, WorkerId(0));
    }

    /// busy: 140 distinct active blocks, none of them the 64-block prompt's: 204 after
    /// (3,264 tokens), predicted 0.30 s; idle: nothing active, 64 after, predicted 0.50 s.
    /// Both report `capacity` KV tokens.
    fn busy_and_idle(capacity: u64) -> ChoiceContext {
        let busy = Candidate {
            worker: WorkerId(0),
            block_size: 16,
            prompt_blocks: 64,
            active_blocks: 140,
            in_use_blocks: 0,
            prefill_rate: 4_000.0,
            kv_capacity_tokens: capacity,
            predicted_ttft: 0.30,
            ..Candidate::default()
        };
        let idle = Candidate {
            worker: WorkerId(1),
            active_blocks: 0,
            in_use_blocks: 0,
            predicted_ttft: 0.50,
            ..busy.clone()
        };
        ChoiceContext {
            prompt_tokens: 1_024,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![busy, idle],
        }
    }

    fn block_balance_cfg(weight: f64, kv_share: f64) -> PredictedTtftConfig {
        PredictedTtftConfig {
            block_balance: weight,
            block_balance_kv_share: kv_share,
            cache_affinity: 0.0,
            ..PredictedTtftConfig::default()
        }
    }

    fn decide(cfg: PredictedTtftConfig, ctx: &ChoiceContext) -> Decision {
        PredictedTtft::new(cfg, 1)
            .choose(ctx, 0.0)
            .expect("decision")
    }

    /// A new 128-block prompt (2,048 tokens) no worker holds: `full` answers sooner
    /// (0.40 s against 0.45 s) but its working set is 1,550 of its 1,625 blocks; `roomy`'s
    /// is 1,000.
    fn full_and_roomy() -> ChoiceContext {
        let full = Candidate {
            worker: WorkerId(0),
            block_size: 16,
            prompt_blocks: 128,
            prefill_rate: 4_000.0,
            kv_capacity_tokens: 26_000,
            working_set_blocks: 1_550,
            predicted_ttft: 0.40,
            ..Candidate::default()
        };
        let roomy = Candidate {
            worker: WorkerId(1),
            working_set_blocks: 1_000,
            predicted_ttft: 0.45,
            ..full.clone()
        };
        ChoiceContext {
            prompt_tokens: 2_048,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![full, roomy],
        }
    }

    #[test]
    fn kv_fit_charges_the_blocks_a_new_prompt_would_evict_from_a_working_set() {
        let ctx = full_and_roomy();
        let d = decide(PredictedTtftConfig::default(), &ctx);
        // full: 1,550 + 128 - 1,625 = 53 blocks evicted, 848 tokens at 4,000/s: 0.40 + 0.212.
        assert_eq!(d.chosen, WorkerId(1));
        assert!((d.candidates[0].score - 0.612).abs() < 1e-9);
        assert!(
            (d.candidates[1].score - 0.45).abs() < 1e-9,
            "it fits: no charge"
        );
        // Off: the sooner answer wins.
        let off = PredictedTtftConfig {
            kv_fit: 0.0,
            ..PredictedTtftConfig::default()
        };
        assert_eq!(decide(off, &ctx).chosen, WorkerId(0));
        // At most the blocks the request adds: a working set already past the capacity
        // charges the whole 128 blocks, never more (2,048 tokens: 0.512 s).
        let mut over = ctx.clone();
        over.candidates[0].working_set_blocks = 5_000;
        let d = decide(PredictedTtftConfig::default(), &over);
        assert!((d.candidates[0].score - 0.912).abs() < 1e-9);
        // Where every candidate would evict as much, nobody is charged: the prompt costs a
        // recomputation wherever it goes, and the sooner answer wins.
        let mut both = ctx.clone();
        both.candidates[1].working_set_blocks = 5_000;
        let d = decide(PredictedTtftConfig::default(), &both);
        assert_eq!(d.chosen, WorkerId(0));
        assert!((d.candidates[0].score - 0.40).abs() < 1e-9);
        // No reported capacity, no charge.
        let mut unknown = ctx.clone();
        unknown.candidates[0].kv_capacity_tokens = 0;
        assert_eq!(
            decide(PredictedTtftConfig::default(), &unknown).chosen,
            WorkerId(0)
        );
    }

    #[test]
    fn kv_fit_charges_a_holder_only_for_the_suffix_it_adds() {
        // full holds the prompt's first 120 blocks (cached or just placed there): only 8
        // blocks are added, 1,550 + 8 fits, and nothing is charged.
        let mut ctx = full_and_roomy();
        ctx.candidates[0].cached_blocks = 120;
        let d = decide(PredictedTtftConfig::default(), &ctx);
        assert!((d.candidates[0].score - 0.40).abs() < 1e-9);
        ctx.candidates[0].cached_blocks = 0;
        ctx.candidates[0].pending_blocks = 120;
        let d = decide(PredictedTtftConfig::default(), &ctx);
        assert!((d.candidates[0].score - 0.40).abs() < 1e-9);
        // With its working set at the capacity, the 8 added blocks are charged (128 tokens,
        // 0.032 s), far less than recomputing the prefix elsewhere.
        ctx.candidates[0].working_set_blocks = 1_625;
        let d = decide(PredictedTtftConfig::default(), &ctx);
        assert!((d.candidates[0].score - 0.432).abs() < 1e-9);
        // A worker not holding the prefix is charged for at most the 8 blocks the request adds
        // wherever it goes: recomputing the held prefix is the affinity charge's to price.
        let mut ctx = full_and_roomy();
        ctx.candidates[1].cached_blocks = 120;
        ctx.candidates[1].expected_cached_tokens = 1_920.0;
        ctx.candidates[0].working_set_blocks = 5_000;
        let d = decide(PredictedTtftConfig::default(), &ctx);
        // 0.40 + affinity (1,920 tokens at 4,000/s: 0.48) + 8 blocks (0.032).
        assert!((d.candidates[0].score - 0.912).abs() < 1e-9);
        assert_eq!(d.chosen, WorkerId(1));
    }

    #[test]
    fn block_balance_charges_distinct_blocks_beyond_the_least() {
        // Ungated (share 0): charged whatever the capacity, even none reported.
        let ctx = busy_and_idle(0);
        let d = decide(block_balance_cfg(0.5, 0.0), &ctx);
        // busy: 0.30 + 0.5 * (204 - 64) * 16 / 4,000 = 0.58 > idle 0.50.
        assert_eq!(d.chosen, WorkerId(1));
        assert!((d.candidates[0].score - 0.58).abs() < 1e-9);
        let d = decide(block_balance_cfg(0.0, 0.0), &ctx);
        assert_eq!(d.chosen, WorkerId(0));
        // Nor does a cached prefix smaller than the charged blocks exempt a candidate that
        // reports no capacity to measure it against: busy holding 960 tokens of the prompt
        // is still charged.
        let mut ctx = busy_and_idle(0);
        ctx.candidates[0].expected_cached_tokens = 960.0;
        let d = decide(block_balance_cfg(0.5, 0.0), &ctx);
        assert_eq!(d.chosen, WorkerId(1));
        assert!((d.candidates[0].score - 0.58).abs() < 1e-9);
        // Holding as much of the prompt as the charged blocks ((204 - 64) x 16 = 2,240
        // tokens) exempts it: moving would recompute more than the imbalance it relieves.
        ctx.candidates[0].expected_cached_tokens = 2_240.0;
        let d = decide(block_balance_cfg(0.5, 0.0), &ctx);
        assert_eq!(d.chosen, WorkerId(0));
        assert!((d.candidates[0].score - 0.30).abs() < 1e-9);
        ctx.candidates[0].expected_cached_tokens = 2_224.0;
        let d = decide(block_balance_cfg(0.5, 0.0), &ctx);
        assert_eq!(d.chosen, WorkerId(1));
    }

    #[test]
    fn block_balance_charges_a_prefix_in_use_only_for_the_blocks_a_request_adds() {
        // A burst's prefix: 1,024 of the prompt's 1,088 blocks (16,384 of 17,408 tokens) are
        // cached on the holder and in use by the burst's earlier requests there. With them,
        // 8,000 distinct blocks are active on the holder, 5,000 on the other worker; both
        // report 140,000 KV tokens, so a copy (17,500) could take the prefix.
        let holder = Candidate {
            worker: WorkerId(0),
            block_size: 16,
            prompt_blocks: 1_088,
            active_blocks: 8_000,
            in_use_blocks: 1_024,
            expected_cached_tokens: 16_384.0,
            prefill_rate: 4_800.0,
            kv_capacity_tokens: 140_000,
            predicted_ttft: 1.0,
            ..Candidate::default()
        };
        let other = Candidate {
            worker: WorkerId(1),
            active_blocks: 5_000,
            in_use_blocks: 0,
            expected_cached_tokens: 0.0,
            predicted_ttft: 3.6,
            ..holder.clone()
        };
        let mut ctx = ChoiceContext {
            prompt_tokens: 17_408,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![holder, other],
        };
        let cfg = block_balance_cfg(2.0, 0.9);
        // The holder: 8,064 blocks after (129,024 tokens, over 90%), 1,976 beyond the
        // other's 6,088, more than the 16,384 cached tokens; but leaving would free none of
        // the prefix the burst holds there, so only the 64 blocks this request adds are
        // charged: 2 x 1,024 / 4,800 = 0.427 s.
        let d = decide(cfg, &ctx);
        assert_eq!(d.chosen, WorkerId(0));
        let charged = 2.0 * 1_024.0 / 4_800.0;
        assert!((d.candidates[0].score - (1.0 + charged)).abs() < 1e-9);
        // The same prefix cached but in use by no outstanding request there (a conversation's
        // history, its earlier turn done): the request's blocks are all new there (9,088
        // after, 3,000 beyond), and the whole imbalance is charged: 2 x 48,000 / 4,800.
        ctx.candidates[0].in_use_blocks = 0;
        let d = decide(cfg, &ctx);
        assert_eq!(d.chosen, WorkerId(1));
        assert!((d.candidates[0].score - (1.0 + 20.0)).abs() < 1e-9);
    }

    #[test]
    fn block_balance_charges_only_a_candidate_near_a_full_cache() {
        let cfg = block_balance_cfg(2.0, 0.9);
        // 3,264 tokens fill 91% of 3,600: busy is charged 2 x (204 - 64) x 16 / 4,000 = 1.12.
        let d = decide(cfg, &busy_and_idle(3_600));
        assert_eq!(d.chosen, WorkerId(1));
        assert!((d.candidates[0].score - (0.30 + 1.12)).abs() < 1e-9);
        // 82% of 4,000: below the share, no charge.
        let d = decide(cfg, &busy_and_idle(4_000));
        assert_eq!(d.chosen, WorkerId(0));
        assert!((d.candidates[0].score - 0.30).abs() < 1e-9);
        // No reported capacity: no charge either.
        let d = decide(cfg, &busy_and_idle(0));
        assert_eq!(d.chosen, WorkerId(0));
        // busy holds 960 tokens of the prompt, more than a copy may take (12.5% of 3,600 =
        // 450): moving would recompute them elsewhere, so it is not charged.
        let mut ctx = busy_and_idle(3_600);
        ctx.candidates[0].expected_cached_tokens = 960.0;
        let d = decide(cfg, &ctx);
        assert_eq!(d.chosen, WorkerId(0));
        assert!((d.candidates[0].score - 0.30).abs() < 1e-9);
    }

    #[test]
    fn a_degraded_gpu_loses_the_tie_and_explain_shows_it() {
        let ctx = |a_degraded: bool, b_degraded: bool| ChoiceContext {
            prompt_tokens: 100,
            degraded: false,
            prefix_anchor: None,
            candidates: vec![
                Candidate {
                    gpu_degraded: a_degraded,
                    ..cand(0, 0.2, 0)
                },
                Candidate {
                    gpu_degraded: b_degraded,
                    ..cand(1, 0.2, 0)
                },
            ],
        };
        // Equal predictions tie and both get picked across seeds; a degraded GPU never does.
        let picks = |c: &ChoiceContext| -> Vec<WorkerId> {
            (0..20)
                .map(|seed| {
                    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), seed);
                    p.choose(c, 0.0).expect("decision").chosen
                })
                .collect()
        };
        let healthy = picks(&ctx(false, false));
        assert!(healthy.contains(&WorkerId(0)) && healthy.contains(&WorkerId(1)));
        assert!(picks(&ctx(true, false)).iter().all(|w| *w == WorkerId(1)));
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let d = p.choose(&ctx(true, false), 0.0).expect("decision");
        assert_eq!(d.reason, Reason::LowestPredictedTtft);
        assert!(
            (d.candidates[0].score - 1.2).abs() < 1e-12,
            "0.2 + 1 s penalty"
        );
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["candidates"][0]["gpu_degraded"], true);
        assert_eq!(json["candidates"][1]["gpu_degraded"], false);
        // Every candidate degraded: no penalty, the tie stays a tie.
        let d = p.choose(&ctx(true, true), 0.0).expect("decision");
        assert_eq!(d.reason, Reason::TieBreak);
        assert!((d.candidates[0].score - 0.2).abs() < 1e-12);
        // Clearly faster despite the penalty: the degraded worker still takes the request.
        let c = ChoiceContext {
            candidates: vec![
                Candidate {
                    gpu_degraded: true,
                    ..cand(0, 0.2, 0)
                },
                cand(1, 2.0, 0),
            ],
            ..ctx(false, false)
        };
        assert_eq!(p.choose(&c, 0.0).expect("decision").chosen, WorkerId(0));
    }

    /// Worker 0 holds the prompt's 2,048-token prefix and answers in 0.3 s; workers 1 and 2
    /// would recompute it (1.0 and 0.9 s).
    fn hot_ctx(anchor: u64) -> ChoiceContext {
        let holder = Candidate {
            block_size: 16,
            expected_cached_tokens: 2048.0,
            prefill_rate: 4000.0,
            kv_capacity_tokens: 100_000,
            ..cand(0, 0.3, 0)
        };
        let cold = |w, ttft| Candidate {
            block_size: 16,
            prefill_rate: 4000.0,
            kv_capacity_tokens: 100_000,
            ..cand(w, ttft, 0)
        };
        ChoiceContext {
            prompt_tokens: 2176,
            degraded: false,
            prefix_anchor: Some(anchor),
            candidates: vec![holder, cold(1, 1.0), cold(2, 0.9)],
        }
    }

    /// The first decision of `p` over `ctx` within `n` that makes a copy.
    fn first_copy(p: &mut PredictedTtft, ctx: &ChoiceContext, n: usize) -> Option<Decision> {
        (0..n)
            .map(|_| p.choose(ctx, 0.0).expect("decision"))
            .find(|d| d.reason == Reason::HotPrefixCopy)
    }

    /// `n` decisions of `p` over `ctx`, every one sent to the holder, worker 0.
    fn stays_with_holder(p: &mut PredictedTtft, ctx: &ChoiceContext, n: usize) {
        for i in 0..n {
            let d = p.choose(ctx, 0.0).expect("decision");
            assert_eq!(d.chosen, WorkerId(0), "request {i}");
        }
    }

    #[test]
    fn a_hot_prefix_gets_a_copy_on_the_soonest_other_worker() {
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let ctx = hot_ctx(7);
        // The first requests stay with the holder: a new router, like one that has routed
        // a window of other traffic, lets about a third of a window (21 requests) of one
        // prefix through before calling it hot.
        stays_with_holder(&mut p, &ctx, 20);
        // Every request for one prefix: its share soon exceeds one holder's third.
        let d = first_copy(&mut p, &ctx, 40).expect("a copy within 40 more requests");
        assert_eq!(d.chosen, WorkerId(2), "the sooner of the two others");
        assert_eq!(
            serde_json::to_value(&d).expect("serializes")["reason"],
            "hot_prefix_copy"
        );
        // Once the copy is placed (the pending overlay shows it), two holders of three carry
        // a prefix with all the traffic: a third copy, once its share passes two thirds.
        let mut two = hot_ctx(7);
        two.candidates[2].expected_cached_tokens = 2048.0;
        let d = first_copy(&mut p, &two, 60).expect("a third copy");
        assert_eq!(d.chosen, WorkerId(1));
        // Every worker holds it: no copy left to make; the soonest holder wins.
        let mut all = two.clone();
        all.candidates[1].expected_cached_tokens = 2048.0;
        let d = p.choose(&all, 0.0).expect("decision");
        assert_eq!(d.chosen, WorkerId(0));
        assert_ne!(d.reason, Reason::HotPrefixCopy);
    }

    #[test]
    fn prefixes_at_their_share_or_below_are_never_copied() {
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        // Eight prefixes in turn: 1/8 of the traffic each, one holder of three each.
        for i in 0..400u64 {
            stays_with_holder(&mut p, &hot_ctx(i % 8), 1);
        }
        // One prefix with 60% of the traffic and two holders of three (1.8 < 2): no copy.
        let mut two = hot_ctx(1);
        two.candidates[2].expected_cached_tokens = 2048.0;
        for i in 0..400u64 {
            let mut c = if i % 5 < 3 {
                two.clone()
            } else {
                hot_ctx(100 + i)
            };
            c.candidates[0].predicted_ttft = 0.3;
            let d = p.choose(&c, 0.0).expect("decision");
            assert_ne!(d.reason, Reason::HotPrefixCopy, "request {i}");
        }
        // Off: one prefix with all the traffic stays with its holder.
        let mut off = PredictedTtft::new(
            PredictedTtftConfig {
                hot_prefix_window: 0,
                ..PredictedTtftConfig::default()
            },
            1,
        );
        stays_with_holder(&mut off, &hot_ctx(7), 200);
    }

    #[test]
    fn a_copy_must_fit_in_an_eighth_of_the_workers_kv() {
        // Worker 2 holds 12,000 KV tokens: a 2,048-token copy would be 17% of it; worker 1
        // does not report its size. No copy anywhere; the holder keeps the prefix.
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let mut ctx = hot_ctx(7);
        ctx.candidates[1].kv_capacity_tokens = 0;
        ctx.candidates[2].kv_capacity_tokens = 12_000;
        stays_with_holder(&mut p, &ctx, 200);
        // At 16,384 KV tokens the copy is exactly an eighth: allowed.
        ctx.candidates[2].kv_capacity_tokens = 16_384;
        let d = p.choose(&ctx, 0.0).expect("decision");
        assert_eq!((d.chosen, d.reason), (WorkerId(2), Reason::HotPrefixCopy));
    }

    #[test]
    fn a_saturated_worker_gets_no_copy() {
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let mut ctx = hot_ctx(7);
        // Worker 2 is full and has requests waiting: the copy goes to worker 1.
        ctx.candidates[2].kv_usage = 0.95;
        ctx.candidates[2].waiting = 3;
        let d = first_copy(&mut p, &ctx, 60).expect("a copy");
        assert_eq!(d.chosen, WorkerId(1));
    }
}
