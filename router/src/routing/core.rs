//! [`RoutingCore`]: the worker table, the KV index, the predictor and the router's
//! assignments of one router replica, behind one small API: events in (a worker's snapshot,
//! block deltas, load samples, stream closed, retire), decisions out ([`RoutingCore::plan`]
//! builds the choice problem, a [`Policy`] chooses, [`RoutingCore::assign`] records it), then
//! the request's first token and end.
//!
//! ```text
//! snapshot / stored / removed / cleared --> workers + index     load --> workers
//!            (stores past the worker's block cap are refused: Stored.dropped; a load sample
//!             that moves the cap past what the index holds asks for a resync: CapResync)
//! stream_closed --> not a candidate       retire_gone(listed) --> every trace dropped
//!
//! request --plan(allowed, now)--> Plan { context } --Policy::choose--> Decision
//!                                   \--------------- assign(plan, decision, now) --> AssignmentId
//! first_token --> predictor.observe        finish / abort / expire --> release (once)
//! ```
//!
//! Nothing is carried from one call to the next: what `assign` needs of the request (its
//! hash chains, its output limit) travels in the [`Plan`].

use std::collections::HashMap;

use serde::Serialize;

use super::admission::KvReleases;
use super::assign::{Assignment, AssignmentId, Assignments, FirstToken, WorkerInflight};
use super::bound::{BoundConfig, TtftBound};
use super::choose::{Decision, Policy};
use super::gpu::GpuStatus;
use super::index::KvIndex;
use super::outlier::{FailureKind, Outcome, OutlierConfig, OutlierEvent};
use super::overlay::Overlay;
use super::peers::{PeerConfig, PeerShare};
use super::plan::Plan;
use super::predict::{ErrorStats, FirstTokenSample, Predictor, PredictorConfig};
use super::steps::{StepClocks, StepConfig};
use super::workers::{BlockCaps, LoadSample, Worker, WorkerId, WorkerTable};
use super::working_set::WorkingSets;

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
    /// Keys the index's block hasher. Default: drawn once per process, so crafted prompts
    /// cannot aim at the index's slots (it was a constant, written in this source, until
    /// 2026-12-07).
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
    /// How many blocks the index keeps per worker.
    pub block_caps: BlockCaps,
    /// Most blocks the pending overlay holds (the chains of outstanding placements); a
    /// placement that would go past it is not added (a burst may then spread more): bounds
    /// what unreported Pick calls with long prompts can make the core hold.
    pub pending_max_blocks: usize,
    /// Passive health: when failing workers are ejected, and for how long.
    pub outlier: OutlierConfig,
    /// The other router replicas' placements (active-active replicas).
    pub peers: PeerConfig,
    /// The p90 upper bound published with each prediction ([`TtftBound`]).
    pub bound: BoundConfig,
    /// Count the oldest of the router's prompts waiting on a worker as prefilled since it
    /// reached the head, at the worker's learned rate (`RoutingCore::plan`). Off: every
    /// waiting prompt counts in full until its first token, which makes the queue depend on
    /// the order of decisions only, not on the clock (tests that never report first tokens).
    pub queue_drain: bool,
    /// Expect evictions before admission: on a worker with a reported KV capacity, the
    /// prompts queued ahead of a new one allocate their uncached tokens first, from the
    /// blocks free longest (vLLM's LRU free queue). The new prompt's cached prefix counts
    /// only as far as it is in use there or was released after the blocks those
    /// allocations take (`Overlay::kept_leading`). Off: the index's prefix counts as it is.
    /// It moves `Candidate::expected_cached_tokens`, hence the uncached tokens every
    /// assignment records, so the router and the benchmark set it from the policy's
    /// `Policy::expects_evictions` (kvroute's only; the baselines keep their sources' view).
    pub expect_evictions: bool,
    /// With `expect_evictions`: on a worker where the router's outstanding requests at their
    /// peak KV (`Candidate::active_kv_tokens`) plus a new prompt's need exceed the reported
    /// capacity by more than this many tokens, the new prompt's cached prefix counts only as
    /// far as it is in use there: such a worker runs out of free blocks before the new
    /// prompt is admitted, and its requests' growth then takes idle cached blocks however
    /// recently they were released. The peak overstates what is held at any one time; the
    /// margin absorbs that (2,000 tokens, measured in bench/README.md "Overcommitted
    /// workers"). `None`: only the free-queue order above applies.
    pub overcommit_margin_tokens: Option<u64>,
    /// Workers whose learned prefill rates chain within this fraction of each other (sorted,
    /// each at most `1 + rate_pool` times the one below it) are taken to prefill at one speed:
    /// a prediction there uses the group's mean seconds per token, and each worker keeps its
    /// own learned overhead. A worker's prefill speed is its GPU's and model's; identical
    /// workers' fits drift apart on the few samples each gets (the first wave's queues), and
    /// the one that looks fastest then takes the new prompts and the fresh samples that keep
    /// it looking fastest (bench/README.md, "Identical workers, one prefill speed"). Only
    /// workers of one speed class pool ([`RoutingCore::set_speed_class`]: the router gives each
    /// worker its InferenceWorkerSet, one GPU type per set), so an L40S set and an H100 set
    /// never share a rate however close their fits come; within a class the chain guards
    /// against a set spread over unlike nodes. Each worker's fit keeps learning on its own.
    /// 1.0 (within 2x): live, identical workers' fits were 1.6-1.7x apart after a noisy first
    /// wave (bench/README.md, "Identical workers learned 1.7x apart, live"). `None`: every
    /// worker's own rate.
    pub rate_pool: Option<f64>,
    /// The engine step each worker is running, from the chunks the router relays
    /// (`steps.rs`): a share of its remainder is added to predictions (`Candidate::step_s`).
    pub steps: StepConfig,
    /// Working sets (`working_set.rs`): the blocks used by each worker's last this-many
    /// placements by this replica, from which kvroute reads what its LRU cache must hold to
    /// keep the blocks they shared (`Candidate::working_set_blocks`) for its KV-fit charge
    /// (`PredictedTtftConfig::kv_fit`). 0 turns the tracking, and with it the charge, off:
    /// the default, since in the simulated suite it helped the shapes it was made for and
    /// cost others (bench/README.md, "New prefixes where they fit"). 64 there: a worker
    /// serving eight prefixes in turn uses each about every eighth placement.
    pub working_set_horizon: u32,
}

/// `--rate-pool`'s fraction as [`CoreConfig::rate_pool`]: 0 turns it off; a fraction
/// outside 0..=10 or not finite is refused with the reason.
pub fn rate_pool_from(fraction: f64) -> Result<Option<f64>, String> {
    if !fraction.is_finite() || !(0.0..=10.0).contains(&fraction) {
        return Err(format!(
            "--rate-pool {fraction} is outside 0..=10 (a fraction such as 1.0; 0 turns it off)"
        ));
    }
    Ok((fraction > 0.0).then_some(fraction))
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            predictor: PredictorConfig::default(),
            stale_after_s: 10.0,
            stale_cache_trust: 0.5,
            stale_penalty_s: 0.1,
            prior_tokens_per_waiting: 1_024.0,
            index_seed: super::keys::process_seed(),
            pending_grace_s: 1.0,
            saturated_kv_usage: 0.9,
            prior_output_tokens: 256.0,
            block_caps: BlockCaps::default(),
            pending_max_blocks: 1 << 20,
            outlier: OutlierConfig::default(),
            peers: PeerConfig::default(),
            bound: BoundConfig::default(),
            queue_drain: true,
            expect_evictions: true,
            overcommit_margin_tokens: Some(2_000),
            rate_pool: Some(1.0),
            steps: StepConfig::default(),
            working_set_horizon: 0,
        }
    }
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

/// The worker table, index, predictor, loads and assignments of one router replica. Pure:
/// time comes in as `now` (seconds on any monotonic clock the caller keeps consistently).
pub struct RoutingCore {
    pub(super) cfg: CoreConfig,
    pub(super) workers: WorkerTable,
    /// Resident blocks per worker id.
    pub(super) index: KvIndex,
    pub(super) predictor: Predictor,
    pub(super) assignments: Assignments,
    /// Running mean of finished requests' output tokens.
    pub(super) mean_output: f64,
    finished: u64,
    /// Running mean of routed requests' `kv_need_tokens`.
    pub(super) mean_kv_need: f64,
    routed: u64,
    pub(super) mean_uncached: f64,
    /// The router's own placements the index may not show yet.
    pub(super) pending: Overlay,
    /// Blocks each worker's recent placements reused.
    pub(super) working_sets: WorkingSets,
    /// Assignments sent to a saturated worker: (requests queued there including it,
    /// prefill-model prediction), for learning the admission wait at their first token.
    admitted_saturated: HashMap<AssignmentId, (f64, f64)>,
    /// The other replicas' outstanding placements.
    pub(super) peers: PeerShare,
    /// The p90 bound on predictions, calibrated on this router's first tokens.
    bound: TtftBound,
    /// Where each worker is in its engine step.
    pub(super) steps: StepClocks,
}

/// What a store did: blocks new to the worker, and blocks refused at a cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// Blocks the worker did not hold before.
    pub added: usize,
    /// Blocks not stored because the worker, or the whole index, was at its cap (some may
    /// have been held).
    pub dropped: usize,
    /// The index as a whole was full ([`BlockCaps::total`]), not (only) the worker.
    pub index_full: bool,
}

/// Why a load sample asks for a fresh snapshot of the worker: its block cap moved so that
/// the index no longer matches what the cap allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapResync {
    /// The cap rose and stores had been refused at the old one: the refused blocks can be had.
    Raised {
        /// The new cap.
        cap: u64,
    },
    /// The cap fell below what the index holds for the worker: a snapshot, capped, replaces it.
    Lowered {
        /// The new cap.
        cap: u64,
    },
}

impl std::fmt::Display for CapResync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Raised { cap } => write!(
                f,
                "block cap raised to {cap} after blocks were refused: send a snapshot"
            ),
            Self::Lowered { cap } => write!(
                f,
                "block cap lowered to {cap}, below the blocks held: send a snapshot"
            ),
        }
    }
}

/// A worker the core retired, with the assignments it still had (released now, once).
#[derive(Debug)]
pub struct Retired {
    /// Its id (free again).
    pub worker: WorkerId,
    /// Its key.
    pub key: String,
    /// Its outstanding assignments, released by the retirement.
    pub released: Vec<(AssignmentId, Assignment)>,
}

/// Index figures for `/debug/workers` and metrics.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct IndexStats {
    /// Distinct blocks held by anyone.
    pub distinct_blocks: usize,
    /// (block, worker) pairs.
    pub pairs: u64,
    /// Estimated heap bytes of the index.
    pub memory_bytes: usize,
}

impl RoutingCore {
    /// An empty core.
    pub fn new(cfg: CoreConfig) -> Self {
        Self {
            workers: WorkerTable::new(),
            index: KvIndex::new(cfg.index_seed),
            predictor: Predictor::new(cfg.predictor.clone()),
            assignments: Assignments::new(),
            mean_output: cfg.prior_output_tokens,
            finished: 0,
            mean_kv_need: cfg.prior_tokens_per_waiting,
            routed: 0,
            mean_uncached: cfg.prior_tokens_per_waiting,
            pending: Overlay::default(),
            working_sets: WorkingSets::new(cfg.working_set_horizon),
            admitted_saturated: HashMap::new(),
            peers: PeerShare::new(cfg.peers),
            bound: TtftBound::new(cfg.bound),
            steps: StepClocks::default(),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    // ------------------------------------------------------------------ events in

    /// A worker's stream (re)opened with a snapshot: registers the worker (or updates the
    /// known one: block size, epoch) and replaces everything known about its blocks with
    /// `blocks`, up to its cap (see [`RoutingCore::stored`]). Later chunks of the same
    /// snapshot arrive as [`RoutingCore::stored`].
    pub fn snapshot(
        &mut self,
        key: &str,
        block_size: usize,
        epoch: u64,
        blocks: &[u64],
        now: f64,
    ) -> WorkerId {
        let (w, _) = self.workers.open(key, block_size, epoch, now);
        self.index.clear(w);
        if let Some(slot) = self.workers.get_mut(w) {
            slot.truncated = false;
        }
        self.stored(w, blocks, now);
        w
    }

    /// Sets the speed class of `w` (its InferenceWorkerSet): a prefill rate is pooled only
    /// among workers of one class (`CoreConfig::rate_pool`). Unknown ids are ignored.
    pub fn set_speed_class(&mut self, w: WorkerId, class: &str) {
        if let Some(slot) = self.workers.get_mut(w)
            && slot.speed_class != class
        {
            slot.speed_class = class.to_owned();
        }
    }

    /// Sets the step budget of `w`'s engine (tokens; `None`: the predictor's default), which
    /// its whole-steps TTFT line counts in (`predict.rs`). Unknown ids and budgets that are
    /// not a positive finite number are ignored (the latter as `None`).
    pub fn set_step_budget(&mut self, w: WorkerId, tokens: Option<f64>) {
        if let Some(slot) = self.workers.get_mut(w) {
            slot.step_budget_tokens = tokens.filter(|t| t.is_finite() && *t >= 1.0);
        }
    }

    /// The step budget `w`'s whole-steps TTFT line counts in: its own, else (also for no or
    /// an unknown worker) the predictor's; `None` when the configured one is 0 (the line off
    /// everywhere).
    pub fn step_budget(&self, w: Option<WorkerId>) -> Option<f64> {
        let default = self.predictor.config().step_budget_tokens;
        (default > 0.0).then(|| {
            w.and_then(|w| self.workers.get(w))
                .and_then(|s| s.step_budget_tokens)
                .unwrap_or(default)
        })
    }

    /// The most blocks the index keeps for `w` (0 for an unknown id).
    pub fn block_cap(&self, w: WorkerId) -> u64 {
        self.workers
            .get(w)
            .map_or(0, |s| self.cfg.block_caps.cap(s.capacity_blocks))
    }

    /// Blocks became resident on `w`. Once the index holds [`RoutingCore::block_cap`] blocks
    /// of `w`, or [`BlockCaps::total`] in all, the rest are refused: counted in
    /// [`Stored::dropped`] and on the worker, which is marked truncated until its next
    /// snapshot. Memory never grows past the caps, and the index never claims a block the
    /// worker did not announce: a refused block only costs a missed hit. Unknown ids store
    /// nothing.
    pub fn stored(&mut self, w: WorkerId, blocks: &[u64], now: f64) -> Stored {
        if self.workers.get(w).is_none() {
            return Stored::default();
        }
        self.workers.touch(w, now);
        let cap = self.block_cap(w);
        let total = self.cfg.block_caps.total;
        let mut out = Stored::default();
        let mut rest = blocks;
        // Each pass stores as many blocks as there is room for (re-stores of held blocks
        // take none), so the passes together cost O(blocks).
        while !rest.is_empty() {
            let mine = cap.saturating_sub(self.index.blocks_of(w));
            let all = total.saturating_sub(self.index.pairs());
            let room = usize::try_from(mine.min(all)).unwrap_or(usize::MAX);
            if room == 0 {
                out.dropped = rest.len();
                out.index_full = all == 0;
                break;
            }
            let (now_in, later) = rest.split_at(room.min(rest.len()));
            out.added += self.index.apply_stored(w, now_in);
            rest = later;
        }
        if out.dropped > 0
            && let Some(slot) = self.workers.get_mut(w)
        {
            slot.blocks_dropped += out.dropped as u64;
            slot.truncated = true;
        }
        out
    }

    /// Blocks were evicted from `w`; returns how many it held.
    pub fn removed(&mut self, w: WorkerId, blocks: &[u64], now: f64) -> usize {
        if self.workers.get(w).is_none() {
            return 0;
        }
        self.workers.touch(w, now);
        self.pending.evicted(w, blocks);
        self.index.apply_removed(w, blocks)
    }

    /// `w` dropped every block (vLLM reset its prefix cache).
    pub fn cleared(&mut self, w: WorkerId, now: f64) {
        if self.workers.get(w).is_none() {
            return;
        }
        self.workers.touch(w, now);
        self.pending.cleared(w);
        self.index.clear(w);
    }

    /// Records a load report (it also counts as a sign of life). A reported KV capacity sets
    /// the worker's block cap; when the new cap lets in blocks that were refused, or is below
    /// what the index holds, the caller should ask the worker for a snapshot.
    pub fn load(&mut self, w: WorkerId, sample: LoadSample, now: f64) -> Option<CapResync> {
        let held = self.index.blocks_of(w);
        let caps = self.cfg.block_caps;
        let own_waiting =
            self.assignments.inflight(w).waiting + self.peers.load(w, now).waiting.round() as u32;
        let slot = self.workers.get_mut(w)?;
        let before = caps.cap(slot.capacity_blocks);
        slot.load = sample;
        slot.load_at = now;
        slot.freed_since_report = 0;
        slot.own_waiting_at_report = own_waiting;
        if sample.kv_capacity_tokens > 0 && slot.block_size > 0 {
            slot.capacity_blocks = sample.kv_capacity_tokens.div_ceil(slot.block_size as u64);
            self.pending.trim_freed(w, slot.capacity_blocks);
        }
        let cap = caps.cap(slot.capacity_blocks);
        let truncated = slot.truncated;
        self.workers.touch(w, now);
        if cap > before && truncated {
            Some(CapResync::Raised { cap })
        } else if cap < before && held > cap {
            Some(CapResync::Lowered { cap })
        } else {
            None
        }
    }

    /// `w`'s GPUs as its latest load sample described them (sent even when the sidecar's
    /// scrape of vLLM failed: they come from NVML). An empty list clears them.
    pub fn gpus(&mut self, w: WorkerId, gpus: Vec<GpuStatus>) {
        if let Some(slot) = self.workers.get_mut(w) {
            slot.gpus = gpus;
        }
    }

    /// `w`'s report stream closed: it is no candidate until a new stream snapshots it. Its
    /// blocks are kept (a reconnect within the grace period finds them).
    pub fn stream_closed(&mut self, w: WorkerId, now: f64) {
        self.workers.close(w, now);
    }

    /// Retires a worker: drops its blocks, its predictor state, its placements and load, and
    /// releases its outstanding assignments (exactly once: they are gone from the core
    /// afterwards). Its id is free for the next new worker.
    pub fn retire(&mut self, w: WorkerId) -> Option<Retired> {
        self.workers.get(w)?;
        self.index.clear(w);
        self.predictor.forget(w);
        self.steps.forget(w);
        self.pending.drop_worker(w);
        self.working_sets.drop_worker(w);
        self.peers.drop_worker(w);
        let released = self.assignments.release_worker(w);
        for (id, _) in &released {
            self.admitted_saturated.remove(id);
        }
        let slot = self.workers.remove(w)?;
        Some(Retired {
            worker: w,
            key: slot.key,
            released,
        })
    }

    /// Retires every worker whose stream has been closed for `grace` seconds at `now` and
    /// that `listed` (discovery) does not name.
    pub fn retire_gone(
        &mut self,
        now: f64,
        grace: f64,
        listed: impl Fn(&str) -> bool,
    ) -> Vec<Retired> {
        let gone = self.workers.gone(now, grace, listed);
        gone.into_iter().filter_map(|w| self.retire(w)).collect()
    }

    /// What became of a request on `w` (from the data path: a completion, or a failure the
    /// worker caused). Enough failures in a row eject it (see `outlier.rs`), unless that
    /// would eject more than `max_ejection_percent` of the workers with an open stream.
    pub fn outcome(&mut self, w: WorkerId, outcome: Outcome, now: f64) -> OutlierEvent {
        let cfg = self.cfg.outlier;
        let Some(slot) = self.workers.get_mut(w) else {
            return OutlierEvent::None;
        };
        let Some(reason) = slot.health.record(outcome, &cfg, now) else {
            return OutlierEvent::None;
        };
        if !self.may_eject(now) {
            return OutlierEvent::Refused(reason);
        }
        match self.workers.get_mut(w) {
            Some(slot) => OutlierEvent::Ejected(slot.health.eject(reason, &cfg, now)),
            None => OutlierEvent::None,
        }
    }

    /// True when one more ejection keeps the ejected workers within `max_ejection_percent`
    /// of the workers whose stream is open.
    fn may_eject(&self, now: f64) -> bool {
        let (mut open, mut ejected) = (0usize, 0usize);
        for (_, s) in self.workers.iter().filter(|(_, s)| s.stream_open) {
            open += 1;
            if s.health.is_ejected(now) {
                ejected += 1;
            }
        }
        let pct = self.cfg.outlier.max_ejection_percent;
        let pct = if pct.is_finite() {
            pct.clamp(0.0, 100.0)
        } else {
            0.0
        };
        (ejected + 1) as f64 <= open as f64 * pct / 100.0
    }

    /// Workers ejected at `now` (open streams or not).
    pub fn ejected_workers(&self, now: f64) -> usize {
        self.workers
            .iter()
            .filter(|(_, s)| s.health.is_ejected(now))
            .count()
    }

    /// A failure of `kind` on the worker of an outstanding assignment (looked up before it
    /// is released).
    pub fn assignment_failed(
        &mut self,
        id: AssignmentId,
        kind: FailureKind,
        now: f64,
    ) -> Option<(WorkerId, OutlierEvent)> {
        let w = self.assignments.get(id)?.worker;
        Some((w, self.outcome(w, Outcome::Failure(kind), now)))
    }

    /// The worker of an outstanding assignment completed it: its failure run ends.
    pub fn assignment_succeeded(&mut self, id: AssignmentId, now: f64) {
        if let Some(w) = self.assignments.get(id).map(|a| a.worker) {
            self.outcome(w, Outcome::Success, now);
        }
    }

    /// The other replicas' placements (read).
    pub fn peers(&self) -> &PeerShare {
        &self.peers
    }

    /// The other replicas' placements: the peer exchange applies what peers report here.
    pub fn peers_mut(&mut self) -> &mut PeerShare {
        &mut self.peers
    }

    /// The hash chain the pending overlay holds for an outstanding assignment (what a peer
    /// needs to count its blocks as placed).
    pub fn placement_chain(&self, id: AssignmentId) -> Option<&[kvroute_hash::BlockHash]> {
        self.pending.chain(id)
    }

    /// Outstanding assignments (for the peer exchange's full list).
    pub fn assignments(&self) -> impl Iterator<Item = (AssignmentId, &Assignment)> {
        self.assignments.iter()
    }

    // ------------------------------------------------------------------ queries

    /// A worker's slot, if `w` is in the table.
    pub fn worker(&self, w: WorkerId) -> Option<&Worker> {
        self.workers.get(w)
    }

    /// The id of the worker registered under `key`.
    pub fn worker_id(&self, key: &str) -> Option<WorkerId> {
        self.workers.id(key)
    }

    /// Every worker in the table.
    pub fn workers(&self) -> impl Iterator<Item = (WorkerId, &Worker)> {
        self.workers.iter()
    }

    /// True when `w` is stale at `now` (stream closed, or silent for `stale_after_s`);
    /// unknown ids are stale.
    pub fn is_stale(&self, w: WorkerId, now: f64) -> bool {
        self.workers
            .get(w)
            .is_none_or(|s| s.is_stale(now, self.cfg.stale_after_s))
    }

    /// Blocks the index holds for `w`.
    pub fn blocks_of(&self, w: WorkerId) -> u64 {
        self.index.blocks_of(w)
    }

    /// Leading blocks of `hashes` that `w` holds.
    pub fn matched_blocks(&self, w: WorkerId, hashes: &[u64]) -> usize {
        self.index.matched_blocks(w, hashes)
    }

    /// Index size figures.
    pub fn index_stats(&self) -> IndexStats {
        IndexStats {
            distinct_blocks: self.index.distinct_blocks(),
            pairs: self.index.pairs(),
            memory_bytes: self.index.memory_bytes(),
        }
    }

    /// The router's outstanding assignments on `w`.
    pub fn inflight(&self, w: WorkerId) -> WorkerInflight {
        self.assignments.inflight(w)
    }

    /// Outstanding assignments on every worker.
    pub fn outstanding(&self) -> usize {
        self.assignments.len()
    }

    /// An outstanding assignment.
    pub fn assignment(&self, id: AssignmentId) -> Option<&Assignment> {
        self.assignments.get(id)
    }

    /// Pool-wide TTFT prediction error.
    pub fn prediction_error(&self) -> &ErrorStats {
        self.predictor.error()
    }

    /// (prefill tokens/s, overhead seconds) learned for `w`.
    pub fn predictor_params(&self, w: WorkerId) -> (f64, f64) {
        self.predictor.params(w)
    }

    // ------------------------------------------------------------------ decisions

    /// Plans the request and lets `policy` choose; `None` when no allowed worker is a
    /// candidate. Pass both to [`RoutingCore::assign`] once the request is sent.
    pub fn decide(
        &self,
        policy: &mut dyn Policy,
        req: &RouteRequest<'_>,
        allowed: &[WorkerId],
        now: f64,
    ) -> Option<(Plan, Decision)> {
        let plan = self.plan(req, allowed, now);
        let decision = policy.choose_prompt(&plan.context, req.tokens, now)?;
        Some((plan, decision))
    }

    /// Records that the request of `plan` was sent to `decision`'s chosen worker.
    pub fn assign(&mut self, plan: &Plan, decision: &Decision, now: f64) -> AssignmentId {
        let mut a = decision.new_assignment();
        a.ttft_bound = self.bound.bound(a.published_ttft);
        a.output_tokens = match plan.max_tokens {
            Some(m) => u64::from(m)
                .min(self.mean_output.ceil().max(1.0) as u64 * 4)
                .max(1),
            None => self.mean_output.round().max(1.0) as u64,
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
            && let Some(c) = decision.chosen_candidate()
            && let Some(chain) = plan.chain(c.block_size)
            && self.pending.blocks() + chain.len() <= self.cfg.pending_max_blocks
        {
            self.pending.add(id, decision.chosen, chain.to_vec());
        }
        if self.cfg.working_set_horizon > 0
            && !decision.degraded
            && let Some(c) = decision.chosen_candidate()
            && let Some(chain) = plan.chain(c.block_size)
        {
            let capacity = self
                .workers
                .get(decision.chosen)
                .map_or(0, |s| s.capacity_blocks);
            self.working_sets.touch(decision.chosen, chain, capacity);
        }
        id
    }

    /// Requests queued on a saturated worker counting a new one (the larger of its reported
    /// waiting and the router's own not-yet-started assignments, plus one), or `None` when it
    /// is not saturated (stale workers never count: their load is unknown).
    pub(super) fn saturated_queue(
        &self,
        stale: bool,
        load: LoadSample,
        own_waiting: u32,
    ) -> Option<f64> {
        (!stale && load.waiting > 0 && load.kv_usage >= self.cfg.saturated_kv_usage)
            .then(|| f64::from(load.waiting.max(own_waiting)) + 1.0)
    }

    /// A chunk of a streaming response from `w` arrived at `now` (any request's, the first
    /// token's included): the end of an engine step there (`steps.rs`). A data path that
    /// keeps its own clocks outside the core (so that a token never waits for a decision)
    /// passes them with [`RoutingCore::set_step_clocks`] instead.
    pub fn step_observed(&mut self, w: WorkerId, now: f64) {
        self.steps.observe(&self.cfg.steps, w, now);
    }

    /// Replaces the step clocks with `clocks` (kept by the data path; see
    /// [`RoutingCore::step_observed`]).
    pub fn set_step_clocks(&mut self, clocks: &StepClocks) {
        self.steps.copy_from(clocks);
    }

    /// First token of an assignment: moves it to decoding and teaches the TTFT model.
    /// `observed_ttft` defaults to `now - assigned_at`.
    pub fn first_token(
        &mut self,
        id: AssignmentId,
        now: f64,
        observed_ttft: Option<f64>,
    ) -> Option<FirstToken> {
        self.first_token_served(id, now, observed_ttft, None)
    }

    /// [`RoutingCore::first_token`] with `served_ttft`: the time since the gateway received
    /// the request (its parsing, tokenizing, decision and sending included). The TTFT model
    /// learns from the engine's part (`observed_ttft`), which is what differs between
    /// workers; the published p90 bound from the served time, as a client times its first
    /// token (the longer of the two; without one, the observed).
    pub fn first_token_served(
        &mut self,
        id: AssignmentId,
        now: f64,
        observed_ttft: Option<f64>,
        served_ttft: Option<f64>,
    ) -> Option<FirstToken> {
        let rate = self
            .assignments
            .get(id)
            .map_or(0.0, |a| self.predictor.params(a.worker).0);
        let mut ft = self.assignments.first_token(id, now, observed_ttft, rate)?;
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
                FirstTokenSample {
                    queue_tokens: a.undrained_queue_tokens,
                    uncached_tokens: a.uncached_tokens as f64,
                    drain_s: a.queue_drain_s,
                    step_s: a.step_s,
                    predicted: a.predicted_ttft,
                    model: a.ttft_model,
                    observed: ft.observed_ttft,
                },
            );
        }
        let served = served_ttft
            .filter(|s| s.is_finite())
            .map_or(ft.observed_ttft, |s| s.max(ft.observed_ttft));
        ft.bound = self.bound.observe(a.published_ttft, a.ttft_bound, served);
        Some(ft)
    }

    /// The p90 upper bound this router would publish now for a prediction of `predicted`
    /// seconds (NaN: none yet, or no prediction).
    pub fn ttft_bound(&self, predicted: f64) -> f64 {
        self.bound.bound(predicted)
    }

    /// Releases a completed assignment (once).
    pub fn finish(&mut self, id: AssignmentId) -> Option<Assignment> {
        self.pending.end(id, f64::NEG_INFINITY);
        self.admitted_saturated.remove(&id);
        let a = self.assignments.finish(id)?;
        self.note_freed(&a);
        Some(a)
    }

    /// An ended assignment that had started (first token seen) gave its KV back. Only one
    /// sent before the worker's last load report counts: that report holds its KV (or its
    /// place among the waiting requests); one sent after it was never in the report, and
    /// taking its KV off the reported usage again made the worker look emptier than it is.
    fn note_freed(&mut self, a: &Assignment) {
        if a.first_token_at.is_none() {
            return;
        }
        if let Some(slot) = self.workers.get_mut(a.worker)
            && a.assigned_at <= slot.load_at
        {
            slot.freed_since_report += a.kv_need_tokens + a.output_tokens;
        }
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

    /// Per allowed worker with a known KV capacity: KV tokens the router's outstanding
    /// assignments sent since its last load report need (not in the reported usage yet;
    /// their prompts' KV, not the output decoded so far), and when its decoding
    /// assignments are expected to finish and free their KV, in time order.
    /// Indexed by worker; empty when no allowed worker reports a capacity. One pass over the
    /// outstanding assignments, whatever the pool size.
    pub(super) fn kv_releases(&self, allowed: &[WorkerId], now: f64) -> Vec<Option<KvReleases>> {
        let mut out: Vec<Option<KvReleases>> = Vec::new();
        for &w in allowed {
            if self
                .workers
                .get(w)
                .is_none_or(|s| s.kv_capacity_tokens() == 0)
            {
                continue;
            }
            if out.is_empty() {
                out.resize_with(self.workers.id_bound(), || None);
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
                .workers
                .get(a.worker)
                .map_or(f64::NEG_INFINITY, |s| s.load_at);
            // Sent since the report: its KV is not in the reported usage, whether or not its
            // first token came (after it the request holds its KV while it decodes).
            if a.assigned_at > reported_at {
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
#[path = "core_tests.rs"]
mod tests;
