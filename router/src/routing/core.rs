//! [`RoutingCore`]: the index, the predictor and the router's assignments together, turning
//! a request and an allowed worker list into a [`ChoiceContext`] and recording what happens
//! to the requests it routes.
//!
//! ```text
//! reports --> index / loads      request tokens --> PromptHashes (per block size)
//!                  \                    /
//!                   context(allowed) --+--> Policy::choose --> Decision --> assign
//!      first_token --> predictor.observe       finish / abort / expire --> release
//! ```

use std::collections::HashMap;

use kvroute_hash::BlockHash;
use serde::Serialize;

use super::assign::{Assignment, AssignmentId, Assignments, FirstToken};
use super::choose::{Candidate, ChoiceContext, Decision, Policy};
use super::index::{KvIndex, WorkerId};
use super::predict::{Predictor, PredictorConfig};
use super::request::PromptHashes;

/// Settings of the routing core.
#[derive(Clone, Debug, Serialize)]
pub struct CoreConfig {
    /// TTFT model prior and learning settings.
    pub predictor: PredictorConfig,
    /// A worker that has not reported for this long (seconds) is stale.
    pub stale_after_s: f64,
    /// Fraction of a stale worker's indexed leading blocks assumed still cached: its blocks
    /// are probably mostly there, but evictions since its last report are unknown.
    pub stale_cache_trust: f64,
    /// Seconds added to a stale worker's prediction (its queue is unknown too).
    pub stale_penalty_s: f64,
    /// Prefill tokens assumed per reported waiting request before any request was routed
    /// (then the running mean of routed uncached tokens is used).
    pub prior_tokens_per_waiting: f64,
    /// Keys the index's block hasher.
    pub index_seed: u64,
    /// Pending overlay: the blocks of a prompt the router sent to a worker count as cached
    /// there (for kvroute's prediction only) until that request's first token plus this many
    /// seconds, covering the reporting delay. Without it a burst of requests sharing a new
    /// prefix, all routed before the first report lands, is spread over every worker.
    /// 0 disables the overlay.
    pub pending_grace_s: f64,
    /// A worker reporting waiting requests at this KV usage or above is saturated: a new
    /// request waits there for running requests to finish and free KV, which the prefill
    /// model does not cover; the predictor learns that admission wait separately.
    pub saturated_kv_usage: f32,
    /// Output tokens assumed for a request without `max_tokens` before any request finished
    /// (then the running mean of finished requests' output is used).
    pub prior_output_tokens: f64,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            predictor: PredictorConfig::default(),
            stale_after_s: 10.0,
            stale_cache_trust: 0.5,
            stale_penalty_s: 0.1,
            prior_tokens_per_waiting: 1_024.0,
            index_seed: 0x006b_7672_6f75_7465,
            pending_grace_s: 1.0,
            saturated_kv_usage: 0.9,
            prior_output_tokens: 256.0,
        }
    }
}

/// The router's own KV footprint on one worker (see `RoutingCore::kv_releases`).
struct KvReleases {
    unreported_tokens: u64,
    /// (expected end, KV tokens freed), earliest first.
    frees: Vec<(f64, u64)>,
}

/// Seconds until `deficit` KV tokens are free on a worker whose requests free `frees`
/// ((time, tokens), earliest first): 0 when nothing is missing. When the router's own
/// requests cannot free enough (others' traffic holds the rest), the wait is at least until
/// the last of them ends.
fn kv_wait(deficit: f64, frees: &[(f64, u64)], now: f64) -> f64 {
    if deficit.is_nan() || deficit <= 0.0 {
        return 0.0;
    }
    let mut freed = 0.0;
    let mut last = now;
    for &(at, tokens) in frees {
        freed += tokens as f64;
        last = at;
        if freed >= deficit {
            return (at - now).max(0.0);
        }
    }
    (last - now).max(0.0)
}

/// A worker's last load report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LoadSample {
    /// `vllm:num_requests_waiting`.
    pub waiting: u32,
    /// `vllm:num_requests_running`.
    pub running: u32,
    /// `vllm:kv_cache_usage_perc` (0..1).
    pub kv_usage: f32,
    /// KV cache size in tokens (`num_gpu_blocks * block_size` of `vllm:cache_config_info`);
    /// 0 when unknown, which turns the KV admission model off for the worker.
    pub kv_capacity_tokens: u64,
}

/// The request as the core needs it. `tokens: None` means tokenization failed or no
/// tokenizer is configured: the decision is degraded (load only).
#[derive(Clone, Copy, Debug)]
pub struct RouteRequest<'a> {
    /// Prompt token ids, exactly as vLLM will see them.
    pub tokens: Option<&'a [u32]>,
    /// Served model name the workers report (hash seed).
    pub model: &'a str,
    /// LoRA adapter name (hash seed).
    pub lora: Option<&'a str>,
    /// vLLM `cache_salt` (extra key of block 1).
    pub cache_salt: Option<&'a str>,
    /// The request's output limit (`max_tokens` / `max_completion_tokens`), if it set one:
    /// how long it will hold KV on the worker.
    pub max_tokens: Option<u32>,
}

/// Index, predictor, loads and assignments of one router replica. Pure: time comes in as
/// `now` (seconds on any monotonic clock the caller keeps consistently).
pub struct RoutingCore {
    cfg: CoreConfig,
    /// Resident blocks per worker. Apply sidecar reports here directly.
    pub index: KvIndex,
    /// TTFT models.
    pub predictor: Predictor,
    /// Outstanding assignments.
    pub assignments: Assignments,
    loads: Vec<LoadSample>,
    /// When each worker's last load report was applied (caller's clock).
    load_at: Vec<f64>,
    /// KV tokens the router's requests on each worker freed (ended after their first token)
    /// since its last load report: still counted in the reported usage.
    freed_since_report: Vec<u64>,
    /// Running mean of finished requests' output tokens.
    mean_output: f64,
    finished: u64,
    /// Running mean of routed requests' `kv_need_tokens`.
    mean_kv_need: f64,
    routed: u64,
    mean_uncached: f64,
    matches: Vec<(WorkerId, usize)>,
    dense: Vec<u32>,
    /// The router's own placements the index may not show yet.
    pending: Overlay,
    /// Hash chains (per block size) of the last `context` call, for `assign`.
    last_chains: Vec<(usize, Vec<BlockHash>)>,
    last_prompt_tokens: usize,
    last_max_tokens: Option<u32>,
    /// Assignments sent to a saturated worker: (requests queued there including it,
    /// prefill-model prediction), for learning the admission wait at their first token.
    admitted_saturated: HashMap<AssignmentId, (f64, f64)>,
}

/// One block the router placed on a worker itself.
#[derive(Clone, Copy, Debug)]
struct OverlayEntry {
    /// Placed requests still waiting for their first token that hold it.
    holders: u32,
    /// Placed requests not finished yet (waiting or decoding): the block is referenced on
    /// the worker, so a new request sharing it needs no KV for it.
    in_use: u32,
    /// Valid until then once no holder is left (seconds).
    until: f64,
}

/// The router's own recent placements per worker: a short-lived speculative view of blocks
/// that will be (or just were) computed there, consulted next to the index.
#[derive(Debug, Default)]
struct Overlay {
    per_worker: Vec<HashMap<BlockHash, OverlayEntry>>,
    /// Chain of each outstanding placement, and whether it is still before its first token.
    by_assignment: HashMap<AssignmentId, (WorkerId, Vec<BlockHash>, bool)>,
    settled: u32,
    /// Latest time seen (for dropping expired entries).
    latest: f64,
}

impl Overlay {
    fn add(&mut self, id: AssignmentId, w: WorkerId, chain: Vec<BlockHash>) {
        let i = w.index();
        if self.per_worker.len() <= i {
            self.per_worker.resize_with(i + 1, HashMap::new);
        }
        let m = &mut self.per_worker[i];
        for &h in &chain {
            m.entry(h)
                .and_modify(|e| {
                    e.holders += 1;
                    e.in_use += 1;
                })
                .or_insert(OverlayEntry {
                    holders: 1,
                    in_use: 1,
                    until: f64::NEG_INFINITY,
                });
        }
        self.by_assignment.insert(id, (w, chain, true));
    }

    /// The assignment got its first token: its blocks stay `grace` seconds more as
    /// placements, and in use until it ends.
    fn settle(&mut self, id: AssignmentId, now: f64, grace: f64) {
        let Some((w, chain, waiting)) = self.by_assignment.get_mut(&id) else {
            return;
        };
        if !*waiting {
            return;
        }
        *waiting = false;
        if now.is_finite() {
            self.latest = self.latest.max(now);
        }
        if let Some(m) = self.per_worker.get_mut(w.index()) {
            for h in chain.iter() {
                if let Some(e) = m.get_mut(h) {
                    e.holders = e.holders.saturating_sub(1);
                    e.until = e.until.max(now + grace);
                }
            }
        }
    }

    /// The assignment ended (finished, aborted, expired).
    fn end(&mut self, id: AssignmentId, now: f64) {
        self.settle(id, f64::NEG_INFINITY, 0.0);
        let Some((w, chain, _)) = self.by_assignment.remove(&id) else {
            return;
        };
        if let Some(m) = self.per_worker.get_mut(w.index()) {
            for h in chain {
                if let Some(e) = m.get_mut(&h) {
                    e.in_use = e.in_use.saturating_sub(1);
                }
            }
        }
        if now.is_finite() {
            self.latest = self.latest.max(now);
        }
        self.settled += 1;
        if self.settled >= 256 {
            self.settled = 0;
            let now = self.latest;
            for m in &mut self.per_worker {
                m.retain(|_, e| e.holders > 0 || e.in_use > 0 || e.until > now);
            }
        }
    }

    /// Leading blocks of `chain` that outstanding placements on `w` reference.
    fn in_use_leading(&self, w: WorkerId, chain: &[BlockHash]) -> usize {
        let Some(m) = self.per_worker.get(w.index()) else {
            return 0;
        };
        chain
            .iter()
            .take_while(|h| m.get(h).is_some_and(|e| e.in_use > 0))
            .count()
    }

    /// Leading blocks of `chain` the router placed on `w` and still counts as there.
    fn leading(&self, w: WorkerId, chain: &[BlockHash], now: f64) -> usize {
        let Some(m) = self.per_worker.get(w.index()) else {
            return 0;
        };
        if m.is_empty() {
            return 0;
        }
        chain
            .iter()
            .take_while(|h| {
                m.get(h)
                    .is_some_and(|e| e.holders > 0 || e.in_use > 0 || e.until > now)
            })
            .count()
    }

    fn drop_worker(&mut self, w: WorkerId) {
        if let Some(m) = self.per_worker.get_mut(w.index()) {
            m.clear();
        }
        self.by_assignment.retain(|_, (aw, _, _)| *aw != w);
    }
}

impl RoutingCore {
    /// An empty core.
    pub fn new(cfg: CoreConfig) -> Self {
        Self {
            index: KvIndex::new(cfg.index_seed),
            predictor: Predictor::new(cfg.predictor.clone()),
            assignments: Assignments::new(),
            loads: Vec::new(),
            load_at: Vec::new(),
            freed_since_report: Vec::new(),
            mean_output: cfg.prior_output_tokens,
            finished: 0,
            mean_kv_need: cfg.prior_tokens_per_waiting,
            routed: 0,
            mean_uncached: cfg.prior_tokens_per_waiting,
            matches: Vec::new(),
            dense: Vec::new(),
            pending: Overlay::default(),
            last_chains: Vec::new(),
            last_prompt_tokens: 0,
            last_max_tokens: None,
            admitted_saturated: HashMap::new(),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// Registers (or revives) a worker; see [`KvIndex::upsert_worker`].
    pub fn upsert_worker(&mut self, key: &str, block_size: usize) -> WorkerId {
        self.index.upsert_worker(key, block_size)
    }

    /// Retires a worker: drops its blocks and releases its outstanding assignments.
    pub fn remove_worker(&mut self, w: WorkerId) -> Vec<(AssignmentId, Assignment)> {
        self.index.remove_worker(w);
        if let Some(l) = self.loads.get_mut(w.index()) {
            *l = LoadSample::default();
        }
        self.pending.drop_worker(w);
        let gone = self.assignments.release_worker(w);
        for (id, _) in &gone {
            self.admitted_saturated.remove(id);
        }
        gone
    }

    /// Records a load report (it also counts as a sign of life).
    pub fn set_load(&mut self, w: WorkerId, sample: LoadSample, now: f64) {
        if self.index.worker(w).is_none() {
            return;
        }
        let i = w.index();
        if self.loads.len() <= i {
            self.loads.resize(i + 1, LoadSample::default());
        }
        self.loads[i] = sample;
        if self.load_at.len() <= i {
            self.load_at.resize(i + 1, f64::NEG_INFINITY);
        }
        self.load_at[i] = now;
        if let Some(f) = self.freed_since_report.get_mut(i) {
            *f = 0;
        }
        self.index.touch(w, now);
    }

    /// The last load report of a worker.
    pub fn load(&self, w: WorkerId) -> LoadSample {
        self.loads.get(w.index()).copied().unwrap_or_default()
    }

    /// Builds the choice problem for `req` over the `allowed` workers (unknown and removed
    /// ids are skipped). Hashes the prompt once per distinct block size among them.
    pub fn context(
        &mut self,
        req: &RouteRequest<'_>,
        allowed: &[WorkerId],
        now: f64,
    ) -> ChoiceContext {
        let n = self.index.worker_count();
        if self.dense.len() < n {
            self.dense.resize(n, 0);
        }
        let mut prompt = req
            .tokens
            .map(|t| PromptHashes::new(t, req.model, req.lora, req.cache_salt));
        let prompt_tokens = req.tokens.map_or(0, <[u32]>::len);
        let mut candidates = Vec::with_capacity(allowed.len());
        let releases = self.kv_releases(allowed, now);
        let mut done_sizes: Vec<usize> = Vec::new();
        let mut touched: Vec<usize> = Vec::new();
        for &w in allowed {
            let Some(st) = self.index.worker(w) else {
                continue;
            };
            if st.removed {
                continue;
            }
            let block_size = st.block_size;
            if let Some(p) = prompt.as_mut()
                && !done_sizes.contains(&block_size)
            {
                done_sizes.push(block_size);
                self.index
                    .match_prefix(p.chain(block_size), &mut self.matches);
                for &(mw, blocks) in &self.matches {
                    // Workers of another block size cannot match this chain; guard anyway.
                    if self
                        .index
                        .worker(mw)
                        .is_some_and(|s| s.block_size == block_size)
                    {
                        self.dense[mw.index()] = u32::try_from(blocks).unwrap_or(u32::MAX);
                        touched.push(mw.index());
                    }
                }
            }
            let cached_blocks = self.dense[w.index()] as usize;
            let pending_blocks = match prompt.as_mut() {
                Some(p) if self.cfg.pending_grace_s > 0.0 => {
                    self.pending.leading(w, p.chain(block_size), now)
                }
                _ => 0,
            };
            let prompt_blocks = prompt_tokens.checked_div(block_size).unwrap_or(0);
            let stale = self.index.is_stale(w, now, self.cfg.stale_after_s);
            let load = self.load(w);
            let own = self.assignments.inflight(w);
            let cached_tokens = cached_blocks * block_size;
            let indexed_tokens = if stale {
                cached_tokens as f64 * self.cfg.stale_cache_trust
            } else {
                cached_tokens as f64
            };
            // The router's own placements are trusted as they are: it sent them there.
            let expected_cached_tokens = indexed_tokens.max((pending_blocks * block_size) as f64);
            let queue_tokens = (own.waiting_prefill_tokens as f64)
                .max(f64::from(load.waiting) * self.mean_uncached);
            let uncached = (prompt_tokens as f64 - expected_cached_tokens).max(0.0);
            let (prefill_rate, overhead) = self.predictor.params(w);
            let mut predicted_ttft = self.predictor.predict(w, queue_tokens, uncached);
            if stale {
                predicted_ttft += self.cfg.stale_penalty_s;
            }
            let in_use_blocks = match prompt.as_mut() {
                Some(p) => self.pending.in_use_leading(w, p.chain(block_size)),
                None => 0,
            };
            let kv_need_tokens =
                (prompt_tokens.saturating_sub(in_use_blocks * block_size) + block_size) as u64;
            let admission_wait = if !stale && load.kv_capacity_tokens > 0 {
                // KV in use when reported, what the router sent since, what the requests
                // waiting there then take when admitted, and this request: the excess over
                // the capacity must be freed by requests finishing first.
                let r = releases.get(w.index()).and_then(Option::as_ref);
                let unreported = r.map_or(0, |r| r.unreported_tokens) as f64;
                let freed = self.freed_since_report.get(w.index()).copied().unwrap_or(0);
                let used = (f64::from(load.kv_usage.clamp(0.0, 1.0))
                    * load.kv_capacity_tokens as f64
                    - freed as f64)
                    .max(0.0);
                let ahead = f64::from(load.waiting) * self.mean_kv_need;
                let deficit = used + unreported + ahead + kv_need_tokens as f64
                    - load.kv_capacity_tokens as f64;
                kv_wait(deficit, r.map_or(&[][..], |r| &r.frees), now)
            } else {
                match self.saturated_queue(stale, load, own.waiting) {
                    Some(queued) => self.predictor.admission_wait(w, queued),
                    None => 0.0,
                }
            };
            predicted_ttft += admission_wait;
            candidates.push(Candidate {
                worker: w,
                block_size,
                prompt_blocks,
                cached_blocks,
                cached_tokens,
                pending_blocks,
                expected_cached_tokens,
                stale,
                waiting: load.waiting,
                running: load.running,
                kv_usage: load.kv_usage,
                inflight: own.waiting,
                inflight_prefill_tokens: own.waiting_prefill_tokens,
                decoding: own.decoding,
                active_tokens: own.active_tokens,
                active_uncached_tokens: own.active_uncached_tokens,
                active_kv_tokens: own.active_kv_tokens,
                index_blocks: st.blocks,
                queue_tokens,
                prefill_rate,
                overhead,
                admission_wait,
                kv_need_tokens,
                predicted_ttft,
            });
        }
        for i in touched {
            self.dense[i] = 0;
        }
        self.last_chains.clear();
        self.last_prompt_tokens = prompt_tokens;
        self.last_max_tokens = req.max_tokens;
        if let Some(p) = &prompt {
            self.last_chains
                .extend(p.chains().map(|(bs, c)| (bs, c.to_vec())));
        }
        ChoiceContext {
            prompt_tokens,
            degraded: req.tokens.is_none(),
            candidates,
        }
    }

    /// Requests queued on a saturated worker counting a new one (the larger of its reported
    /// waiting and the router's own not-yet-started assignments, plus one), or `None` when it
    /// is not saturated (stale workers never count: their load is unknown).
    fn saturated_queue(&self, stale: bool, load: LoadSample, own_waiting: u32) -> Option<f64> {
        (!stale && load.waiting > 0 && load.kv_usage >= self.cfg.saturated_kv_usage)
            .then(|| f64::from(load.waiting.max(own_waiting)) + 1.0)
    }

    /// Builds the context and lets `policy` choose.
    pub fn decide(
        &mut self,
        policy: &mut dyn Policy,
        req: &RouteRequest<'_>,
        allowed: &[WorkerId],
        now: f64,
    ) -> Option<Decision> {
        let ctx = self.context(req, allowed, now);
        policy.choose(&ctx, now)
    }

    /// Records that the request of `decision` was sent to its chosen worker.
    pub fn assign(&mut self, decision: &Decision, now: f64) -> AssignmentId {
        let mut a = decision.new_assignment();
        a.output_tokens = match self.last_max_tokens {
            Some(m) if decision.prompt_tokens == self.last_prompt_tokens => u64::from(m)
                .min(self.mean_output.ceil().max(1.0) as u64 * 4)
                .max(1),
            _ => self.mean_output.round().max(1.0) as u64,
        };
        if !decision.degraded {
            self.routed += 1;
            let n = self.routed.min(1_000) as f64;
            self.mean_uncached += (a.uncached_tokens as f64 - self.mean_uncached) / n;
            self.mean_kv_need += (a.kv_need_tokens as f64 - self.mean_kv_need) / n;
        }
        let id = self.assignments.assign(a, now);
        if let Some(c) = decision.chosen_candidate()
            && c.predicted_ttft.is_finite()
            && c.admission_wait > 0.0
        {
            // Waiting for KV is not prefill: keep it out of the prefill model's samples.
            let queued = f64::from(c.waiting.max(c.inflight)) + 1.0;
            self.admitted_saturated
                .insert(id, (queued, c.predicted_ttft - c.admission_wait));
        } else if let Some(c) = decision.chosen_candidate()
            && c.predicted_ttft.is_finite()
            && let Some(queued) = self.saturated_queue(
                c.stale,
                LoadSample {
                    waiting: c.waiting,
                    running: c.running,
                    kv_usage: c.kv_usage,
                    kv_capacity_tokens: 0,
                },
                c.inflight,
            )
        {
            self.admitted_saturated
                .insert(id, (queued, c.predicted_ttft - c.admission_wait));
        }
        if !decision.degraded
            && self.cfg.pending_grace_s > 0.0
            && decision.prompt_tokens == self.last_prompt_tokens
            && let Some(c) = decision.chosen_candidate()
            && let Some((_, chain)) = self.last_chains.iter().find(|(bs, _)| *bs == c.block_size)
        {
            self.pending.add(id, decision.chosen, chain.clone());
        }
        id
    }

    /// First token of an assignment: moves it to decoding and teaches the TTFT model.
    /// `observed_ttft` defaults to `now - assigned_at`.
    pub fn first_token(
        &mut self,
        id: AssignmentId,
        now: f64,
        observed_ttft: Option<f64>,
    ) -> Option<FirstToken> {
        let ft = self.assignments.first_token(id, now, observed_ttft)?;
        self.pending.settle(id, now, self.cfg.pending_grace_s);
        let a = &ft.assignment;
        if let Some((queued, base)) = self.admitted_saturated.remove(&id) {
            self.predictor.observe_admission(
                a.worker,
                queued,
                base,
                a.predicted_ttft,
                ft.observed_ttft,
            );
        } else if a.predicted_ttft.is_finite() {
            self.predictor.observe(
                a.worker,
                a.queue_tokens,
                a.uncached_tokens as f64,
                a.predicted_ttft,
                ft.observed_ttft,
            );
        }
        Some(ft)
    }

    /// Releases a completed assignment (once).
    pub fn finish(&mut self, id: AssignmentId) -> Option<Assignment> {
        self.pending.end(id, f64::NEG_INFINITY);
        self.admitted_saturated.remove(&id);
        let a = self.assignments.finish(id)?;
        self.note_freed(&a);
        Some(a)
    }

    /// An ended assignment that had started (first token seen) gave its KV back.
    fn note_freed(&mut self, a: &Assignment) {
        if a.first_token_at.is_none() {
            return;
        }
        let i = a.worker.index();
        if self.freed_since_report.len() <= i {
            self.freed_since_report.resize(i + 1, 0);
        }
        self.freed_since_report[i] += a.kv_need_tokens + a.output_tokens;
    }

    /// Releases a completed assignment (once) that ended at `now` after `output_tokens`
    /// output tokens: also learns the worker's decode speed and the mean output length the
    /// KV admission model uses.
    pub fn finish_observed(
        &mut self,
        id: AssignmentId,
        now: f64,
        output_tokens: u64,
    ) -> Option<Assignment> {
        let a = self.finish(id)?;
        if let Some(ft) = a.first_token_at {
            self.predictor
                .observe_decode(a.worker, now - ft, output_tokens);
        }
        if output_tokens > 0 {
            self.finished += 1;
            let n = self.finished.min(1_000) as f64;
            self.mean_output += (output_tokens as f64 - self.mean_output) / n;
        }
        Some(a)
    }

    /// Per allowed worker with a known KV capacity: KV tokens the router's own assignments
    /// made since its last load report (not in the reported usage yet), and when its decoding
    /// assignments are expected to finish and free their KV, in time order.
    /// Indexed by worker; empty when no allowed worker reports a capacity. One pass over the
    /// outstanding assignments, whatever the pool size.
    fn kv_releases(&self, allowed: &[WorkerId], now: f64) -> Vec<Option<KvReleases>> {
        let mut out: Vec<Option<KvReleases>> = Vec::new();
        for &w in allowed {
            if self.load(w).kv_capacity_tokens == 0 {
                continue;
            }
            if out.is_empty() {
                out.resize_with(self.index.worker_count(), || None);
            }
            if let Some(slot) = out.get_mut(w.index()) {
                *slot = Some(KvReleases {
                    unreported_tokens: 0,
                    frees: Vec::new(),
                });
            }
        }
        if out.is_empty() {
            return out;
        }
        for (_, a) in self.assignments.iter() {
            let Some(Some(r)) = out.get_mut(a.worker.index()) else {
                continue;
            };
            let reported_at = self
                .load_at
                .get(a.worker.index())
                .copied()
                .unwrap_or(f64::NEG_INFINITY);
            if a.assigned_at > reported_at && a.first_token_at.is_none() {
                r.unreported_tokens += a.kv_need_tokens;
            }
            let start = a.first_token_at.unwrap_or(now);
            let itl = self.predictor.itl(a.worker);
            let end = (start + a.output_tokens as f64 * itl).max(now);
            r.frees.push((end, a.kv_need_tokens + a.output_tokens));
        }
        for r in out.iter_mut().flatten() {
            r.frees.sort_by(|x, y| x.0.total_cmp(&y.0));
        }
        out
    }

    /// Releases an aborted assignment (once).
    pub fn abort(&mut self, id: AssignmentId) -> Option<Assignment> {
        self.pending.end(id, f64::NEG_INFINITY);
        self.admitted_saturated.remove(&id);
        let a = self.assignments.abort(id)?;
        self.note_freed(&a);
        Some(a)
    }

    /// Releases assignments older than `ttl` seconds.
    pub fn expire(&mut self, now: f64, ttl: f64) -> Vec<(AssignmentId, Assignment)> {
        let gone = self.assignments.expire(now, ttl);
        for (id, _) in &gone {
            self.pending.end(*id, now);
            self.admitted_saturated.remove(id);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::super::choose::{PredictedTtft, PredictedTtftConfig, Reason};
    use super::*;

    fn req(tokens: &[u32]) -> RouteRequest<'_> {
        RouteRequest {
            tokens: Some(tokens),
            model: "m",
            lora: None,
            cache_salt: None,
            max_tokens: None,
        }
    }

    fn chain(tokens: &[u32], bs: usize) -> Vec<u64> {
        PromptHashes::new(tokens, "m", None, None)
            .chain(bs)
            .to_vec()
    }

    /// Two workers, the prompt (4,096 tokens) fully cached on `warm`.
    fn setup() -> (RoutingCore, WorkerId, WorkerId, Vec<u32>) {
        let mut core = RoutingCore::new(CoreConfig::default());
        let warm = core.upsert_worker("warm", 16);
        let cold = core.upsert_worker("cold", 16);
        let tokens: Vec<u32> = (0..4_096).collect();
        core.index.apply_stored(warm, &chain(&tokens, 16), 0.0);
        core.set_load(warm, LoadSample::default(), 0.0);
        core.set_load(cold, LoadSample::default(), 0.0);
        (core, warm, cold, tokens)
    }

    #[test]
    fn prefers_the_warm_worker_when_both_are_idle() {
        let (mut core, warm, cold, tokens) = setup();
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let d = core
            .decide(&mut p, &req(&tokens), &[warm, cold], 1.0)
            .expect("decision");
        assert_eq!(d.chosen, warm);
        assert_eq!(d.reason, Reason::LowestPredictedTtft);
        let c = d.chosen_candidate().expect("chosen");
        assert_eq!(
            (c.cached_blocks, c.cached_tokens, c.prompt_blocks),
            (256, 4_096, 256)
        );
        assert!(
            d.candidates
                .iter()
                .any(|r| r.candidate.worker == cold && r.candidate.cached_blocks == 0)
        );
    }

    #[test]
    fn prefers_an_idle_cold_worker_over_a_warm_one_with_a_long_queue() {
        let (mut core, warm, cold, tokens) = setup();
        // 8 waiting requests on the warm one (~8k tokens of prefill ahead) vs 4k to recompute.
        core.set_load(
            warm,
            LoadSample {
                waiting: 8,
                running: 4,
                kv_usage: 0.5,
                ..LoadSample::default()
            },
            1.0,
        );
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let d = core
            .decide(&mut p, &req(&tokens), &[warm, cold], 1.0)
            .expect("decision");
        assert_eq!(
            d.chosen,
            cold,
            "{}",
            serde_json::to_string(&d).unwrap_or_default()
        );
    }

    #[test]
    fn own_assignments_count_as_queue_before_reports_catch_up() {
        let (mut core, warm, cold, tokens) = setup();
        let other: Vec<u32> = (10_000..18_000).collect();
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        // Send three cold 8k prompts to `warm` (the router decides where, here by hand).
        let mut ctx = core.context(&req(&other), &[warm], 1.0);
        ctx.candidates.truncate(1);
        let d = p.choose(&ctx, 1.0).expect("decision");
        for _ in 0..3 {
            core.assign(&d, 1.0);
        }
        assert_eq!(
            core.assignments.inflight(warm).waiting_prefill_tokens,
            24_000
        );
        let d = core
            .decide(&mut p, &req(&tokens), &[warm, cold], 1.1)
            .expect("decision");
        assert_eq!(d.chosen, cold);
    }

    #[test]
    fn stale_workers_are_neither_warm_nor_empty() {
        let (mut core, warm, cold, tokens) = setup();
        core.index.mark_stale(warm);
        let ctx = core.context(&req(&tokens), &[warm, cold], 1.0);
        let w = &ctx.candidates[0];
        let c = &ctx.candidates[1];
        assert!(w.stale && !c.stale);
        assert_eq!(w.cached_tokens, 4_096, "the index still reports its blocks");
        assert!((w.expected_cached_tokens - 2_048.0).abs() < 1e-9);
        // Between a fresh warm prediction and a cold one.
        let fresh = core.predictor.predict(warm, 0.0, 0.0);
        assert!(w.predicted_ttft > fresh + 0.1 - 1e-9 && w.predicted_ttft < c.predicted_ttft);
        // Silence past stale_after_s makes a worker stale too.
        let ctx = core.context(&req(&tokens), &[cold], 20.0);
        assert!(ctx.candidates[0].stale);
    }

    #[test]
    fn degraded_without_tokens() {
        let (mut core, warm, cold, _) = setup();
        core.set_load(
            warm,
            LoadSample {
                waiting: 3,
                running: 0,
                kv_usage: 0.1,
                ..LoadSample::default()
            },
            1.0,
        );
        let r = RouteRequest {
            tokens: None,
            model: "m",
            lora: None,
            cache_salt: None,
            max_tokens: None,
        };
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let d = core
            .decide(&mut p, &r, &[warm, cold], 1.0)
            .expect("decision");
        assert!(d.degraded);
        assert_eq!(d.reason, Reason::DegradedLoadOnly);
        assert_eq!(d.chosen, cold);
        assert!(d.candidates.iter().all(|c| c.candidate.cached_blocks == 0));
    }

    #[test]
    fn mixed_block_sizes_and_unknown_or_removed_workers() {
        let (mut core, warm, cold, tokens) = setup();
        let big = core.upsert_worker("big", 32);
        core.index
            .apply_stored(big, &chain(&tokens[..1024], 32), 0.0);
        let gone = core.upsert_worker("gone", 16);
        core.remove_worker(gone);
        let ctx = core.context(&req(&tokens), &[warm, big, WorkerId(77), gone, cold], 1.0);
        let got: Vec<(u32, usize, usize)> = ctx
            .candidates
            .iter()
            .map(|c| (c.worker.0, c.cached_blocks, c.prompt_blocks))
            .collect();
        assert_eq!(
            got,
            vec![(warm.0, 256, 256), (big.0, 32, 128), (cold.0, 0, 256)]
        );
        // Scratch state is reset between calls.
        let ctx = core.context(&req(&tokens[..16]), &[cold, big], 1.0);
        assert!(ctx.candidates.iter().all(|c| c.cached_blocks == 0));
    }

    #[test]
    fn first_token_teaches_the_model_and_release_is_once() {
        let (mut core, warm, cold, tokens) = setup();
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let d = core
            .decide(&mut p, &req(&tokens), &[cold], 0.0)
            .expect("decision");
        let id = core.assign(&d, 0.0);
        let ft = core.first_token(id, 2.0, None).expect("first token");
        assert!((ft.observed_ttft - 2.0).abs() < 1e-12);
        assert_eq!(core.predictor.error().count, 1);
        assert!(
            core.predictor.params(cold).0 < 4_800.0,
            "slower than predicted -> lower rate"
        );
        assert!(core.first_token(id, 2.5, None).is_none());
        assert!(core.finish(id).is_some());
        assert!(core.abort(id).is_none());
        assert!(core.expire(1e9, 1.0).is_empty());
        let id2 = core.assign(&d, 3.0);
        assert_eq!(core.remove_worker(cold).len(), 1);
        assert!(core.finish(id2).is_none());
        let _ = warm;
    }

    #[test]
    fn own_placements_count_as_cached_until_first_token_plus_grace() {
        let mut core = RoutingCore::new(CoreConfig::default());
        let a = core.upsert_worker("a", 16);
        let b = core.upsert_worker("b", 16);
        let tokens: Vec<u32> = (0..4_096).collect();
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        // Nothing reported anywhere; send the prompt to `b` (the only one allowed).
        let d = core
            .decide(&mut p, &req(&tokens), &[b], 0.0)
            .expect("decision");
        let id = core.assign(&d, 0.0);
        let ctx = core.context(&req(&tokens), &[a, b], 0.1);
        let (ca, cb) = (&ctx.candidates[0], &ctx.candidates[1]);
        assert_eq!((ca.pending_blocks, cb.pending_blocks), (0, 256));
        assert_eq!(cb.cached_blocks, 0, "the index itself is untouched");
        assert!((cb.expected_cached_tokens - 4_096.0).abs() < 1e-9);
        // A longer prompt sharing the prefix matches the placed blocks only.
        let longer: Vec<u32> = (0..4_096).chain(90_000..90_512).collect();
        let ctx = core.context(&req(&longer), &[b], 0.1);
        assert_eq!(ctx.candidates[0].pending_blocks, 256);
        // Still there after the first token: within the grace period, and then while the
        // request decodes (its blocks are referenced); gone once it ended and grace passed.
        core.first_token(id, 2.0, None);
        let ctx = core.context(&req(&tokens), &[b], 2.9);
        assert_eq!(ctx.candidates[0].pending_blocks, 256);
        let ctx = core.context(&req(&tokens), &[b], 3.1);
        assert_eq!(ctx.candidates[0].pending_blocks, 256);
        assert_eq!(ctx.candidates[0].kv_need_tokens, 16, "only one new block");
        core.finish(id);
        let ctx = core.context(&req(&tokens), &[b], 3.1);
        assert_eq!(ctx.candidates[0].pending_blocks, 0);
        assert_eq!(ctx.candidates[0].kv_need_tokens, 4_096 + 16);
        // An aborted placement is forgotten at once.
        let d = core
            .decide(&mut p, &req(&tokens), &[a], 4.0)
            .expect("decision");
        let id = core.assign(&d, 4.0);
        assert_eq!(
            core.context(&req(&tokens), &[a], 4.0).candidates[0].pending_blocks,
            256
        );
        core.abort(id);
        assert_eq!(
            core.context(&req(&tokens), &[a], 4.0).candidates[0].pending_blocks,
            0
        );
    }

    #[test]
    fn a_saturated_worker_learns_an_admission_wait_shown_in_the_prediction() {
        let (mut core, warm, cold, tokens) = setup();
        let full = LoadSample {
            waiting: 2,
            running: 20,
            kv_usage: 0.97,
            ..LoadSample::default()
        };
        core.set_load(warm, full, 0.0);
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let rls_before = core.predictor.params(warm);
        // Requests sent to the full worker wait ~1.5 s for KV beyond the prefill model.
        for i in 0..40 {
            let now = f64::from(i) * 10.0;
            core.set_load(warm, full, now);
            let mut ctx = core.context(&req(&tokens), &[warm], now);
            ctx.candidates.truncate(1);
            let d = p.choose(&ctx, now).expect("decision");
            let c = d.chosen_candidate().expect("chosen");
            let base = c.predicted_ttft - c.admission_wait;
            let id = core.assign(&d, now);
            core.first_token(id, now + base + 1.5, None);
            core.finish(id);
        }
        assert_eq!(
            core.predictor.params(warm),
            rls_before,
            "prefill model untouched"
        );
        core.set_load(warm, full, 500.0);
        core.set_load(cold, LoadSample::default(), 500.0);
        let ctx = core.context(&req(&tokens), &[warm, cold], 500.0);
        let (w, c) = (&ctx.candidates[0], &ctx.candidates[1]);
        // Queue of 2 reported + this request: 3 x ~0.5 s.
        assert!(
            (w.admission_wait - 1.5).abs() < 0.05,
            "{}",
            w.admission_wait
        );
        assert_eq!(c.admission_wait, 0.0);
        let base = core.predictor.predict(warm, w.queue_tokens, 0.0);
        assert!((w.predicted_ttft - base - w.admission_wait).abs() < 1e-9);
        // The cold worker (4k tokens to recompute, ~0.9 s) now beats waiting for KV.
        let d = core
            .decide(&mut p, &req(&tokens), &[warm, cold], 500.0)
            .expect("decision");
        assert_eq!(d.chosen, cold);
        // Once the worker reports free KV the wait is gone and its cache wins again.
        core.set_load(warm, LoadSample::default(), 501.0);
        core.set_load(cold, LoadSample::default(), 501.0);
        let d = core
            .decide(&mut p, &req(&tokens), &[warm, cold], 501.0)
            .expect("decision");
        assert_eq!(d.chosen, warm);
        assert_eq!(d.chosen_candidate().map(|c| c.admission_wait), Some(0.0));
    }

    #[test]
    fn kv_wait_is_the_time_until_enough_requests_finished() {
        let frees = [(1.0, 1_000), (2.0, 500), (4.0, 3_000)];
        assert_eq!(kv_wait(-5.0, &frees, 0.5), 0.0);
        assert_eq!(kv_wait(f64::NAN, &frees, 0.5), 0.0);
        assert!((kv_wait(800.0, &frees, 0.5) - 0.5).abs() < 1e-12);
        assert!((kv_wait(1_200.0, &frees, 0.5) - 1.5).abs() < 1e-12);
        // More than the router's own requests free: at least until the last of them ends.
        assert!((kv_wait(9_000.0, &frees, 0.5) - 3.5).abs() < 1e-12);
        assert_eq!(kv_wait(10.0, &[], 0.5), 0.0);
    }

    #[test]
    fn a_full_worker_predicts_a_wait_until_its_requests_free_enough_kv() {
        let mut core = RoutingCore::new(CoreConfig::default());
        let full = core.upsert_worker("full", 16);
        let roomy = core.upsert_worker("roomy", 16);
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        // Fill `full` with four requests of 2,000 prompt tokens and 100 output tokens.
        let mut ids = Vec::new();
        for i in 0..4u32 {
            let t: Vec<u32> = (i * 10_000..i * 10_000 + 2_000).collect();
            let r = RouteRequest {
                max_tokens: Some(100),
                ..req(&t)
            };
            let d = core.decide(&mut p, &r, &[full], 0.0).expect("decision");
            let id = core.assign(&d, 0.0);
            core.first_token(id, 0.5 + f64::from(i), None);
            ids.push(id);
        }
        let capacity = 10_000;
        let report = |usage: f32| LoadSample {
            waiting: 0,
            running: 4,
            kv_usage: usage,
            kv_capacity_tokens: capacity,
        };
        core.set_load(full, report(0.85), 5.0);
        core.set_load(
            roomy,
            LoadSample {
                kv_capacity_tokens: capacity,
                ..LoadSample::default()
            },
            5.0,
        );
        // 8,500 in use + 3,016 needed > 10,000: the first request to finish (first token at
        // 0.5, 100 tokens at the 0.07 s prior) frees 2,116 tokens at 7.5 s.
        let prompt: Vec<u32> = (900_000..903_000).collect();
        let ctx = core.context(&req(&prompt), &[full, roomy], 5.0);
        let (f, r) = (&ctx.candidates[0], &ctx.candidates[1]);
        assert_eq!(f.kv_need_tokens, 3_016);
        assert!(
            (f.admission_wait - 2.5).abs() < 1e-9,
            "{}",
            f.admission_wait
        );
        assert_eq!(r.admission_wait, 0.0);
        let d = p.choose(&ctx, 5.0).expect("decision");
        assert_eq!(d.chosen, roomy);
        // With room to spare there is no wait.
        core.set_load(full, report(0.5), 5.0);
        let ctx = core.context(&req(&prompt), &[full], 5.0);
        assert_eq!(ctx.candidates[0].admission_wait, 0.0);
        // A request that ended since the report gave its KV back, though the report still
        // counts it: 8,500 - 2,116 + 3,016 fits.
        core.set_load(full, report(0.85), 5.0);
        assert!(core.context(&req(&prompt), &[full], 5.0).candidates[0].admission_wait > 0.0);
        core.finish(ids[1]);
        let ctx = core.context(&req(&prompt), &[full], 5.1);
        assert_eq!(ctx.candidates[0].admission_wait, 0.0);
        // The next report includes the release itself.
        core.set_load(full, report(0.85), 5.2);
        assert!(core.context(&req(&prompt), &[full], 5.2).candidates[0].admission_wait > 0.0);
        // Finishing teaches the decode speed: 100 tokens in 3 s.
        core.finish_observed(ids[0], 3.5, 100);
        let itl = core.predictor.itl(full);
        assert!(
            itl < 0.07 && itl > 3.0 / 99.0,
            "moves toward 3 s / 99: {itl}"
        );
        // Unknown capacity: the model is off.
        core.set_load(
            full,
            LoadSample {
                kv_capacity_tokens: 0,
                ..report(0.99)
            },
            6.0,
        );
        let ctx = core.context(&req(&prompt), &[full], 6.0);
        assert_eq!(ctx.candidates[0].admission_wait, 0.0);
    }

    #[test]
    fn a_burst_with_a_new_prefix_stays_on_one_worker_before_reports() {
        let mut core = RoutingCore::new(CoreConfig::default());
        let ws: Vec<WorkerId> = (0..3)
            .map(|i| core.upsert_worker(&format!("w{i}"), 16))
            .collect();
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 7);
        let mut chosen = std::collections::HashSet::new();
        for q in 0..3u32 {
            let tokens: Vec<u32> = (0..2_048)
                .chain(50_000 + q * 256..50_256 + q * 256)
                .collect();
            let d = core
                .decide(&mut p, &req(&tokens), &ws, 0.01 * f64::from(q))
                .expect("decision");
            core.assign(&d, 0.01 * f64::from(q));
            chosen.insert(d.chosen);
        }
        assert_eq!(chosen.len(), 1, "the burst was spread: {chosen:?}");
        // Without the overlay the same burst spreads (each looks like an idle cold worker).
        let mut core = RoutingCore::new(CoreConfig {
            pending_grace_s: 0.0,
            ..CoreConfig::default()
        });
        let ws: Vec<WorkerId> = (0..3)
            .map(|i| core.upsert_worker(&format!("w{i}"), 16))
            .collect();
        let mut chosen = std::collections::HashSet::new();
        for q in 0..3u32 {
            let tokens: Vec<u32> = (0..2_048)
                .chain(50_000 + q * 256..50_256 + q * 256)
                .collect();
            let d = core
                .decide(&mut p, &req(&tokens), &ws, 0.0)
                .expect("decision");
            assert_eq!(
                core.context(&req(&tokens), &ws, 0.0)
                    .candidates
                    .iter()
                    .map(|c| c.pending_blocks)
                    .sum::<usize>(),
                0
            );
            core.assign(&d, 0.0);
            chosen.insert(d.chosen);
        }
        assert!(chosen.len() > 1, "{chosen:?}");
    }
}
