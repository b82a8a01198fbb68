//! Planning one request: [`RoutingCore::plan`] hashes the prompt once per block size among
//! the allowed workers, looks it up in the index, and estimates every candidate's TTFT from
//! three parts kept apart here: what it caches (index plus the pending overlay), its queue,
//! and KV admission.
//!
//! ```text
//! RouteRequest --PromptHashes (per block size)--> index.match_prefix --> cached blocks
//!                                    pending overlay --> placed blocks, blocks in use,
//!                                      released blocks in release order (evicted first)
//!          load sample + own assignments --> queue      kv_releases --> admission wait
//!                       estimate(worker) --> Candidate --> Plan { context, chains }
//! ```

use kvroute_hash::BlockHash;

use super::admission::{KvReleases, kv_wait};
use super::choose::{Candidate, ChoiceContext, EvictionRule};
use super::core::{RouteRequest, RoutingCore};
use super::outlier::EjectedWorker;
use super::predict::{pooled_rates_by_class, whole_steps_tokens};
use super::request::PromptHashes;
use super::steps::DecodeSteps;
use super::workers::{Worker, WorkerId};

/// The choice problem of one request plus what [`RoutingCore::assign`] needs of it. Built by
/// [`RoutingCore::plan`]; nothing about the request stays in the core until it is assigned.
#[derive(Clone, Debug)]
pub struct Plan {
    /// What the policy chooses from.
    pub context: ChoiceContext,
    /// The prompt's hash chain per block size among the candidates.
    chains: Vec<(usize, Vec<BlockHash>)>,
    /// The request's output limit, if it set one.
    pub(super) max_tokens: Option<u32>,
    /// Allowed live workers left out because they are ejected (passive health), or kept
    /// (`kept`) because every allowed live worker was.
    pub ejected: Vec<EjectedWorker>,
}

impl Plan {
    /// The prompt's hash chain for `block_size`, if a candidate has that block size.
    pub fn chain(&self, block_size: usize) -> Option<&[BlockHash]> {
        self.chains
            .iter()
            .find(|(bs, _)| *bs == block_size)
            .map(|(_, c)| c.as_slice())
    }
}

/// What the prompt looks like on one worker, before load is considered.
struct CacheView<'a> {
    /// The prompt's chain at the worker's block size (`None`: degraded).
    chain: Option<&'a [BlockHash]>,
    /// Leading blocks the index says the worker holds.
    cached_blocks: usize,
}

impl RoutingCore {
    /// Builds the choice problem for `req` over the `allowed` workers. Workers not in the
    /// table and workers whose stream is closed are skipped.
    pub fn plan(&self, req: &RouteRequest<'_>, allowed: &[WorkerId], now: f64) -> Plan {
        let mut prompt = req
            .tokens
            .map(|t| PromptHashes::new(t, req.model, req.lora, req.cache_salt));
        let prompt_tokens = req.tokens.map_or(0, <[u32]>::len);
        let releases = self.kv_releases(allowed, now);
        let mut live: Vec<(WorkerId, &Worker)> = allowed
            .iter()
            .filter_map(|&w| self.workers.get(w).map(|s| (w, s)))
            .filter(|(_, s)| s.stream_open)
            .collect();
        // Passive health: ejected workers are no candidates, unless all of them are.
        let kept = live.iter().all(|(_, s)| s.health.is_ejected(now));
        let ejected: Vec<EjectedWorker> = live
            .iter()
            .filter(|(_, s)| s.health.is_ejected(now))
            .filter_map(|&(w, s)| {
                Some(EjectedWorker {
                    worker: w,
                    reason: s.health.reason?,
                    remaining_s: s.health.ejected_until - now,
                    ejections: s.health.ejections,
                    kept,
                })
            })
            .collect();
        if !kept {
            live.retain(|(_, s)| !s.health.is_ejected(now));
        }

        // One lookup per distinct block size: leading blocks held per worker.
        let mut cached = vec![0u32; self.workers.id_bound()];
        if let Some(p) = prompt.as_mut() {
            let mut sizes: Vec<usize> = Vec::new();
            let mut matches = Vec::new();
            for &(_, s) in &live {
                if sizes.contains(&s.block_size) {
                    continue;
                }
                sizes.push(s.block_size);
                self.index.match_prefix(p.chain(s.block_size), &mut matches);
                for &(mw, blocks) in &matches {
                    // Workers of another block size cannot match this chain; guard anyway.
                    if self
                        .workers
                        .get(mw)
                        .is_some_and(|m| m.block_size == s.block_size)
                        && let Some(c) = cached.get_mut(mw.index())
                    {
                        *c = u32::try_from(blocks).unwrap_or(u32::MAX);
                    }
                }
            }
        }
        let chains: Vec<(usize, Vec<BlockHash>)> = prompt
            .as_ref()
            .map(|p| p.chains().map(|(bs, c)| (bs, c.to_vec())).collect())
            .unwrap_or_default();
        let chain_of = |bs: usize| {
            chains
                .iter()
                .find(|(b, _)| *b == bs)
                .map(|(_, c)| c.as_slice())
        };
        // Pooled prefill rates, within each speed class: nothing to pool with the rule off or
        // a single candidate.
        let pooled = if self.cfg.rate_pool.is_some() && live.len() > 1 {
            let rates: Vec<f64> = live
                .iter()
                .map(|&(w, _)| self.predictor.params(w).0)
                .collect();
            let classes: Vec<&str> = live
                .iter()
                .map(|&(_, slot)| slot.speed_class.as_str())
                .collect();
            pooled_rates_by_class(&rates, &classes, self.cfg.rate_pool)
        } else {
            vec![None; live.len()]
        };
        let candidates: Vec<Candidate> = live
            .iter()
            .zip(pooled)
            .map(|(&(w, slot), pooled_rate)| {
                let view = CacheView {
                    chain: chain_of(slot.block_size),
                    cached_blocks: cached.get(w.index()).copied().unwrap_or(0) as usize,
                };
                self.estimate(w, slot, prompt_tokens, &view, &releases, pooled_rate, now)
            })
            .collect();
        let prefix_anchor = prefix_anchor(&candidates, chain_of);
        Plan {
            context: ChoiceContext {
                prompt_tokens,
                degraded: req.tokens.is_none(),
                candidates,
                prefix_anchor,
            },
            chains,
            max_tokens: req.max_tokens,
            ejected,
        }
    }

    /// One candidate's figures and predicted TTFT; `pooled_rate` is the prefill rate the
    /// prediction uses instead of the worker's own (see [`pooled_rates`]), if any.
    #[allow(clippy::too_many_arguments)]
    fn estimate(
        &self,
        w: WorkerId,
        slot: &Worker,
        prompt_tokens: usize,
        view: &CacheView<'_>,
        releases: &[Option<KvReleases>],
        pooled_rate: Option<f64>,
        now: f64,
    ) -> Candidate {
        let block_size = slot.block_size;
        let stale = slot.is_stale(now, self.cfg.stale_after_s);
        let load = slot.load;
        let own = self.assignments.inflight(w);
        // The other replicas' outstanding placements count like the replica's own.
        let peer = self.peers.load(w, now);

        // Cache: the index's leading blocks, discounted when stale, or the router's own
        // placements there, trusted as they are (it sent them).
        let cached_blocks = view.cached_blocks;
        // The overlays' leading blocks (own and peers'), and those of them in use, by binary
        // search in each.
        let ((own_leading, own_in_use), (peer_leading, peer_in_use)) =
            view.chain.map_or(((0, 0), (0, 0)), |c| {
                (
                    self.pending.leading_and_in_use(w, c, now),
                    self.peers.leading_and_in_use(w, c, now),
                )
            });
        let pending_blocks = if view.chain.is_some() && self.cfg.pending_grace_s > 0.0 {
            own_leading.max(peer_leading)
        } else {
            0
        };
        let prompt_blocks = prompt_tokens.checked_div(block_size).unwrap_or(0);
        let cached_tokens = cached_blocks * block_size;
        let indexed_tokens = if stale {
            cached_tokens as f64 * self.cfg.stale_cache_trust
        } else {
            cached_tokens as f64
        };
        let mut expected_cached_tokens = indexed_tokens.max((pending_blocks * block_size) as f64);
        let mut eviction_expected = None;

        // Queue: the router's own work without a first token yet, less what the worker has
        // prefilled of the oldest of it (the prompt it works on now): what it had done when
        // it reached the head (the step that finished the one before computed a first chunk
        // of it too) plus the learned rate times the time since. A first token shows only when
        // a whole prompt is done, so without this a long prompt counts in full until its last
        // chunk. Plus the other replicas' such work, plus the reported waiting requests
        // beyond the router's own (and its peers') that were waiting when the report was
        // applied, at the mean prompt's uncached tokens each: traffic the router did not
        // send. The report is older than the router's own count: counting all its waiting
        // requests at the mean size took a short cached prompt that had just got its first
        // token as a first turn's worth of queue, and the fit learned from such samples that
        // a 2,000-token queue drains in tens of milliseconds (bench/README.md, "The report's
        // waiting requests").
        let (prefill_rate, overhead) = self.predictor.params(w);
        // (No prompt waiting: the head's tokens are 0.)
        let drained = if self.cfg.queue_drain {
            own.head_computed(now, prefill_rate)
                .min(own.head_prefill_tokens as f64)
        } else {
            0.0
        };
        // The part of it the elapsed time drained, in seconds at the rate used.
        let queue_drain_s = if prefill_rate > 0.0 {
            ((drained - own.head_done) / prefill_rate).max(0.0)
        } else {
            0.0
        };
        let unknown_waiting = load.waiting.saturating_sub(slot.own_waiting_at_report);
        let queue_tokens =
            (own.waiting_prefill_tokens as f64 - drained + peer.waiting_prefill_tokens).max(0.0)
                + f64::from(unknown_waiting) * self.mean_uncached;
        let peer_waiting = peer.waiting.round() as u32;

        // KV admission.
        let in_use_blocks = own_in_use.max(peer_in_use);
        let kv_need_tokens =
            (prompt_tokens.saturating_sub(in_use_blocks * block_size) + block_size) as u64;
        // The queue's prefill, at the rate the prediction uses: KV frees while it runs.
        let queue_s = queue_tokens.max(0.0) / pooled_rate.unwrap_or(prefill_rate).max(1.0);
        let admission_wait = self.admission_wait(
            w,
            slot,
            stale,
            own.waiting + peer_waiting,
            kv_need_tokens,
            releases,
            queue_s,
            now,
        );

        // Evictions before admission: until it is admitted, what is queued ahead allocates
        // its uncached tokens and the running requests their output, from the free blocks
        // the worker has held free longest: first those the router does not know of, then
        // those its own requests released, oldest first.
        if self.cfg.expect_evictions
            && !stale
            && load.kv_capacity_tokens > 0
            && block_size > 0
            && let Some(c) = view.chain
        {
            let free = load.kv_capacity_tokens as f64 - kv_used_tokens(slot);
            let free_blocks = (free / block_size as f64).floor() as usize;
            let unknown_free = free_blocks.saturating_sub(self.pending.freed_len(w));
            let until_admitted = queue_s + admission_wait;
            let decoding = f64::from(
                load.running
                    .max(own.decoding + peer.decoding.round() as u32),
            );
            let growth = decoding * until_admitted / self.predictor.itl(w).max(1e-3);
            let allocated = ((queue_tokens.max(0.0) + growth) / block_size as f64).ceil() as usize;
            let evict = allocated.saturating_sub(unknown_free);
            if evict > 0 {
                let kept = self.pending.kept_leading(w, c, evict).max(in_use_blocks);
                let kept_tokens = (kept * block_size) as f64;
                if kept_tokens < expected_cached_tokens {
                    expected_cached_tokens = kept_tokens;
                    eviction_expected = Some(EvictionRule::FreeQueue);
                }
            }
            // Overcommitted: what the router's outstanding requests will hold at their peak
            // (prompt plus output) and this request's need exceed the capacity by more than
            // the margin. Expected: before this request is admitted, the worker's own
            // requests take the blocks nobody uses, whatever their age, so only the prefix in
            // use there counts (bench/README.md, "Overcommitted workers", measures it).
            let committed =
                own.active_kv_tokens as f64 + peer.active_kv_tokens + kv_need_tokens as f64;
            if let Some(margin) = self.cfg.overcommit_margin_tokens
                && committed - load.kv_capacity_tokens as f64 > margin as f64
            {
                let in_use_tokens = (in_use_blocks * block_size) as f64;
                if in_use_tokens < expected_cached_tokens {
                    expected_cached_tokens = in_use_tokens;
                    eviction_expected = Some(EvictionRule::Overcommitted);
                }
            }
        }
        let uncached = (prompt_tokens as f64 - expected_cached_tokens).max(0.0);
        // No prompt awaits its first token there (the router's, its peers', or reported),
        // or only the router's own, all sent after the running step began (at or after the
        // last step's chunks; the engine takes a step's prompts when it begins, and by the
        // time the router sees a step's chunks the next one has begun): the running step
        // computes no prefill chunk.
        // Only where the rule is on; the cheap tests first (this runs per candidate).
        let decode_only = self.cfg.steps.decode_steps != DecodeSteps::Off
            && peer_waiting == 0
            && unknown_waiting == 0
            && (own.waiting == 0
                || self
                    .assignments
                    .oldest_waiting_assigned_at(w)
                    .zip(self.steps.last_end(w))
                    .is_some_and(|(sent, began)| sent >= began));
        let step_left = if stale {
            0.0
        } else if decode_only && self.cfg.steps.decode_steps == DecodeSteps::On {
            self.steps.left_decode(w, now)
        } else {
            self.steps.left(w, now)
        };
        // `DecodeSteps::Published`: the same, in the published prediction alone.
        let published_step_left =
            (!stale && decode_only && self.cfg.steps.decode_steps == DecodeSteps::Published)
                .then(|| self.steps.left_decode(w, now));
        let budget = self.step_budget(Some(w)).unwrap_or(0.0);
        let steps_tokens = whole_steps_tokens(queue_tokens, uncached, step_left > 0.0, budget);
        let ttft_model =
            self.predictor
                .predict_candidate(w, queue_tokens, uncached, pooled_rate, steps_tokens);
        let mut predicted_ttft = ttft_model.seconds;
        if stale {
            predicted_ttft += self.cfg.stale_penalty_s;
        }
        let share = |left: f64| {
            if self.cfg.steps.share > 0.0 {
                self.cfg.steps.share * left
            } else {
                0.0
            }
        };
        let step_s = share(step_left);
        let published_step_s = published_step_left.map(share);
        predicted_ttft += step_s;

        predicted_ttft += admission_wait;
        Candidate {
            worker: w,
            block_size,
            prompt_blocks,
            cached_blocks,
            cached_tokens,
            pending_blocks,
            expected_cached_tokens,
            stale,
            gpu_degraded: slot.gpu_degraded(),
            waiting: load.waiting,
            running: load.running,
            kv_usage: load.kv_usage,
            kv_capacity_tokens: load.kv_capacity_tokens,
            inflight: own.waiting + peer_waiting,
            inflight_prefill_tokens: own.waiting_prefill_tokens
                + peer.waiting_prefill_tokens.round() as u64,
            decoding: own.decoding + peer.decoding.round() as u32,
            active_tokens: own.active_tokens + peer.active_tokens.round() as u64,
            active_uncached_tokens: own.active_uncached_tokens
                + peer.active_uncached_tokens.round() as u64,
            active_kv_tokens: own.active_kv_tokens + peer.active_kv_tokens.round() as u64,
            active_blocks: self.pending.in_use_distinct(w),
            in_use_blocks,
            index_blocks: self.index.blocks_of(w),
            working_set_blocks: self.working_sets.footprint(w),
            queue_tokens,
            queue_drain_s,
            prefill_rate,
            pooled_rate: pooled_rate.unwrap_or(prefill_rate),
            overhead,
            admission_wait,
            kv_need_tokens,
            step_s,
            published_step_s,
            ttft_model,
            predicted_ttft,
            eviction_expected,
        }
    }

    /// Seconds a request needing `kv_need_tokens` of KV waits on `w` for KV space beyond
    /// `queue_s`, the prefill of the queue ahead of it. With a reported capacity: KV in use
    /// when reported, what the router sent since, what the requests waiting there then take
    /// when admitted, and this request; the excess over the capacity must be freed by
    /// requests finishing first, and they finish while the queue ahead prefills, so only the
    /// time past the queue's counts (the request starts at the later of the two). Summing
    /// the two counted the queue's time twice: on the burst shape under an open loop at 5.5
    /// sessions/s the median error over every candidate's counterfactual first token was
    /// 38.1% summed and 13.8% this way (bench/README.md, "Waiting for KV while the queue
    /// prefills"). Without a capacity: a learned wait per queued request on a saturated
    /// worker, learned as the time beyond the prefill model's prediction, so it adds.
    #[allow(clippy::too_many_arguments)]
    fn admission_wait(
        &self,
        w: WorkerId,
        slot: &Worker,
        stale: bool,
        own_waiting: u32,
        kv_need_tokens: u64,
        releases: &[Option<KvReleases>],
        queue_s: f64,
        now: f64,
    ) -> f64 {
        let load = slot.load;
        if !stale && load.kv_capacity_tokens > 0 {
            let r = releases.get(w.index()).and_then(Option::as_ref);
            let unreported = r.map_or(0, |r| r.unreported_tokens) as f64;
            let used = kv_used_tokens(slot);
            let ahead = f64::from(load.waiting) * self.mean_kv_need;
            let deficit =
                used + unreported + ahead + kv_need_tokens as f64 - load.kv_capacity_tokens as f64;
            (kv_wait(deficit, r.map_or(&[][..], |r| &r.frees), now) - queue_s).max(0.0)
        } else {
            match self.saturated_queue(stale, load, own_waiting) {
                Some(queued) => self.predictor.admission_wait(w, queued),
                None => 0.0,
            }
        }
    }
}

/// KV tokens in use on a worker: its reported usage less what the router's requests freed
/// since that report.
fn kv_used_tokens(slot: &Worker) -> f64 {
    let load = slot.load;
    (f64::from(load.kv_usage.clamp(0.0, 1.0)) * load.kv_capacity_tokens as f64
        - slot.freed_since_report as f64)
        .max(0.0)
}

/// The hash of the deepest prompt block a candidate is expected to hold: the last of the
/// leading blocks of the candidate with the most expected cached tokens (index or pending
/// placements), at its block size. `None` when no candidate holds a block.
fn prefix_anchor<'a>(
    candidates: &[Candidate],
    chain_of: impl Fn(usize) -> Option<&'a [BlockHash]>,
) -> Option<u64> {
    let best = candidates
        .iter()
        .filter(|c| c.expected_cached_tokens >= 1.0)
        .max_by(|a, b| {
            a.expected_cached_tokens
                .total_cmp(&b.expected_cached_tokens)
        })?;
    let blocks = (best.expected_cached_tokens / best.block_size.max(1) as f64).floor() as usize;
    let chain = chain_of(best.block_size)?;
    chain.get(blocks.min(chain.len()).checked_sub(1)?).copied()
}
