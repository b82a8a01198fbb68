//! The worker table: everything the routing core knows about a worker apart from its blocks
//! (which the [`super::KvIndex`] keeps by [`WorkerId`]), with the worker's lifecycle.
//!
//! ```text
//!  snapshot (stream opens) --> live --stream closed--> closed --not listed + grace--> retired
//!         ^                     |  reports: touch, load                          (slot freed,
//!         +---- a new stream ---+--------------------------------------------    id reused)
//! ```
//!
//! A worker exists from its first snapshot. While its stream is open it is routable (the
//! service adds discovery's say); silent for longer than `stale_after_s` it is *stale* (its
//! cache neither trusted warm nor assumed empty). When its stream closes it stops being a
//! candidate at once. When discovery no longer lists it and its stream has been closed for a
//! grace period it is retired: the slot is freed and its id handed to the next new worker, so
//! the table, the index and every per-worker vector stay as large as the live pool however
//! many pods come and go. The core clears every trace of a worker (blocks, predictor state,
//! assignments, placements) before its id is reused.
//!
//! Each worker's blocks are capped ([`BlockCaps`]): a worker cannot hold more blocks than its
//! KV cache has, so the index holds at most its reported capacity times a slack factor, and
//! a fixed default until a capacity is reported.

use std::collections::HashMap;

use serde::Serialize;

use super::gpu::GpuStatus;
use super::outlier::Health;

/// A worker, as the routing core numbers it: a slot in the worker table. Ids of retired
/// workers are reused, so an id is only meaningful while its worker is in the table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct WorkerId(pub u32);

impl WorkerId {
    /// Position in per-worker vectors.
    pub fn index(self) -> usize {
        self.0 as usize
    }
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

/// How many blocks the index keeps per worker, and in all. A worker holds at most
/// `num_gpu_blocks` blocks (its reported KV capacity in tokens over its block size); the cap
/// allows `slack` times that for what the router has not seen evicted yet, never more than
/// `max`, and `unknown` while no capacity has been reported (a stream's first snapshot comes
/// before its first load sample). `total` caps the (block, worker) pairs of all workers
/// together, whatever their number: the index's memory bound.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BlockCaps {
    /// Multiplier on the reported capacity in blocks (at least 1).
    pub slack: f64,
    /// Cap before the worker reported a capacity.
    pub unknown: u64,
    /// Cap however large the reported capacity (a report is the worker's word, not a fact).
    pub max: u64,
    /// (block, worker) pairs of all workers together.
    pub total: u64,
}

impl Default for BlockCaps {
    fn default() -> Self {
        Self {
            slack: 2.0,
            unknown: 256 << 10,
            max: 4 << 20,
            total: 64 << 20,
        }
    }
}

impl BlockCaps {
    /// The cap for a worker whose KV cache holds `capacity_blocks` blocks (0: unknown).
    pub fn cap(&self, capacity_blocks: u64) -> u64 {
        if capacity_blocks == 0 {
            return self.unknown.min(self.max);
        }
        let slack = if self.slack.is_finite() {
            self.slack.max(1.0)
        } else {
            1.0
        };
        // Saturating: a float above u64::MAX converts to u64::MAX.
        ((capacity_blocks as f64 * slack).ceil() as u64).min(self.max)
    }
}

/// One worker's slot.
#[derive(Clone, Debug, Serialize)]
pub struct Worker {
    /// The key it was registered under (e.g. `namespace/pod`).
    pub key: String,
    /// KV block size in tokens (the hash chain's block size for this worker).
    pub block_size: usize,
    /// Epoch of its last snapshot (the sidecar bumps it when vLLM restarts).
    pub epoch: u64,
    /// Its report stream is open.
    pub stream_open: bool,
    /// When its stream closed (seconds, caller's clock); meaningless while open.
    pub closed_at: f64,
    /// Time of its last report of any kind.
    pub last_report: f64,
    /// Its latest load sample (default until the first).
    pub load: LoadSample,
    /// When that sample was applied (`-inf` before the first).
    pub load_at: f64,
    /// KV tokens the router's requests on it freed (ended after their first token) since its
    /// last load report, of those sent before it: still counted in the reported usage (or,
    /// waiting then, among its waiting requests).
    pub freed_since_report: u64,
    /// The router's own requests there (its peers' included) still waiting for their first
    /// token when that sample was applied: the sample's `waiting` may count them too, so
    /// only the waiting requests beyond these are someone else's (see `plan.rs`, queue).
    pub own_waiting_at_report: u32,
    /// Its GPUs as the latest load sample described them (empty: no GPU stats, healthy).
    pub gpus: Vec<GpuStatus>,
    /// Its KV cache size in blocks from the last load sample that gave one (0: never).
    /// Kept when a later sample says "unknown", so that the block cap does not flap.
    pub capacity_blocks: u64,
    /// Stores refused because the worker was at its block cap (since it joined; re-stores
    /// of blocks it already held count too: the index does not look them up to tell).
    pub blocks_dropped: u64,
    /// A store was refused since its last snapshot began: the index may miss some of its
    /// blocks until the next snapshot.
    pub truncated: bool,
    /// Passive health: failures in a row and ejection (see `outlier.rs`).
    pub health: Health,
    /// Workers of one speed class run the same GPU and model (the router uses the
    /// InferenceWorkerSet: one set, one GPU type): only they may share a pooled prefill rate
    /// (`CoreConfig::rate_pool`). Empty for a worker that names none.
    pub speed_class: String,
    /// Its engine's step budget (tokens) when discovery knows it (its WorkerSet's
    /// `--max-num-batched-tokens` or vLLM's default for its GPU); `None`: the predictor's
    /// `PredictorConfig::step_budget_tokens`.
    pub step_budget_tokens: Option<f64>,
}

impl Worker {
    /// True when its stream is closed or it has not reported for more than `max_age`.
    pub fn is_stale(&self, now: f64, max_age: f64) -> bool {
        !self.stream_open || now - self.last_report > max_age
    }

    /// True when one of its GPUs is degraded (throttled from outside, XID, ECC).
    pub fn gpu_degraded(&self) -> bool {
        self.gpus.iter().any(GpuStatus::degraded)
    }

    /// KV cache size in tokens from its latest load sample (0: unknown).
    pub fn kv_capacity_tokens(&self) -> u64 {
        self.load.kv_capacity_tokens
    }
}

/// Every worker the core knows, by [`WorkerId`], with free slots reused.
#[derive(Debug, Default)]
pub struct WorkerTable {
    slots: Vec<Option<Worker>>,
    free: Vec<u32>,
    by_key: HashMap<String, WorkerId>,
}

impl WorkerTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A worker's stream (re)opened with a snapshot at `epoch`: registers a new worker (in
    /// the lowest free slot) or updates the known one. Returns its id and whether it is new.
    pub fn open(&mut self, key: &str, block_size: usize, epoch: u64, now: f64) -> (WorkerId, bool) {
        if let Some(&w) = self.by_key.get(key)
            && let Some(Some(slot)) = self.slots.get_mut(w.index())
        {
            if block_size > 0 {
                slot.block_size = block_size;
            }
            slot.epoch = epoch;
            slot.stream_open = true;
            slot.touch(now);
            return (w, false);
        }
        let slot = Worker {
            key: key.to_owned(),
            block_size,
            epoch,
            stream_open: true,
            closed_at: f64::NEG_INFINITY,
            last_report: if now.is_finite() {
                now
            } else {
                f64::NEG_INFINITY
            },
            load: LoadSample::default(),
            load_at: f64::NEG_INFINITY,
            freed_since_report: 0,
            own_waiting_at_report: 0,
            gpus: Vec::new(),
            capacity_blocks: 0,
            blocks_dropped: 0,
            truncated: false,
            health: Health::new(),
            speed_class: String::new(),
            step_budget_tokens: None,
        };
        // The lowest free id first, so that a steady pool keeps small, dense ids.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
        let w = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(slot);
                WorkerId(i)
            }
            None => {
                let i = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(Some(slot));
                WorkerId(i)
            }
        };
        self.by_key.insert(key.to_owned(), w);
        (w, true)
    }

    /// A worker, if `w` is in the table.
    pub fn get(&self, w: WorkerId) -> Option<&Worker> {
        self.slots.get(w.index()).and_then(Option::as_ref)
    }

    /// A worker, mutable.
    pub fn get_mut(&mut self, w: WorkerId) -> Option<&mut Worker> {
        self.slots.get_mut(w.index()).and_then(Option::as_mut)
    }

    /// The id of the worker registered under `key`.
    pub fn id(&self, key: &str) -> Option<WorkerId> {
        self.by_key.get(key).copied()
    }

    /// Every worker in the table, by id.
    pub fn iter(&self) -> impl Iterator<Item = (WorkerId, &Worker)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (WorkerId(i as u32), s)))
    }

    /// Workers in the table.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// True when no worker is in the table.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// One past the largest id in use or free (the length per-worker vectors need).
    pub fn id_bound(&self) -> usize {
        self.slots.len()
    }

    /// Records a report of any kind at `now`.
    pub fn touch(&mut self, w: WorkerId, now: f64) {
        if let Some(slot) = self.get_mut(w) {
            slot.touch(now);
        }
    }

    /// The worker's stream closed at `now`: it stops being a candidate.
    pub fn close(&mut self, w: WorkerId, now: f64) {
        if let Some(slot) = self.get_mut(w) {
            slot.stream_open = false;
            slot.closed_at = now;
        }
    }

    /// Workers whose stream has been closed for at least `grace` seconds at `now` and that
    /// `listed` (discovery) does not name.
    pub fn gone(&self, now: f64, grace: f64, listed: impl Fn(&str) -> bool) -> Vec<WorkerId> {
        self.iter()
            .filter(|(_, s)| !s.stream_open && now - s.closed_at >= grace && !listed(&s.key))
            .map(|(w, _)| w)
            .collect()
    }

    /// Removes a worker; its id goes back to the free list. The caller clears every other
    /// trace of it first.
    pub fn remove(&mut self, w: WorkerId) -> Option<Worker> {
        let slot = self.slots.get_mut(w.index())?.take()?;
        self.by_key.remove(&slot.key);
        self.free.push(w.0);
        // Trailing free slots are given back, so the table shrinks after a scale-down.
        while matches!(self.slots.last(), Some(None)) {
            let last = self.slots.len() as u32 - 1;
            self.slots.pop();
            self.free.retain(|&f| f != last);
        }
        Some(slot)
    }
}

impl Worker {
    fn touch(&mut self, now: f64) {
        if now.is_finite() && now > self.last_report {
            self.last_report = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_caps_follow_the_capacity_within_bounds() {
        let caps = BlockCaps {
            slack: 1.5,
            unknown: 1_000,
            max: 10_000,
            total: 1 << 20,
        };
        assert_eq!(caps.cap(0), 1_000, "unknown capacity");
        assert_eq!(caps.cap(3), 5, "rounded up");
        assert_eq!(caps.cap(4_000), 6_000);
        assert_eq!(
            caps.cap(u64::MAX),
            10_000,
            "a claimed capacity cannot lift the max"
        );
        let odd = BlockCaps {
            slack: f64::NAN,
            unknown: 50_000,
            ..caps
        };
        assert_eq!(odd.cap(7), 7, "a bad slack counts as 1");
        assert_eq!(odd.cap(0), 10_000, "the unknown cap is within the max too");
    }

    #[test]
    fn ids_are_reused_lowest_first_and_keys_stay_unique() {
        let mut t = WorkerTable::new();
        let (a, new_a) = t.open("a", 16, 1, 0.0);
        let (b, _) = t.open("b", 16, 1, 0.0);
        let (c, _) = t.open("c", 16, 1, 0.0);
        assert!(new_a);
        assert_eq!((a, b, c), (WorkerId(0), WorkerId(1), WorkerId(2)));
        assert_eq!(t.open("b", 32, 2, 1.0), (b, false));
        assert_eq!(t.get(b).map(|s| (s.block_size, s.epoch)), Some((32, 2)));
        t.remove(a);
        t.remove(b);
        assert_eq!(t.id("a"), None);
        assert_eq!(t.open("d", 16, 1, 2.0).0, WorkerId(0));
        assert_eq!(t.open("e", 16, 1, 2.0).0, WorkerId(1));
        assert_eq!(t.len(), 3);
        t.remove(c);
        assert_eq!(t.id_bound(), 2, "a trailing free slot is given back");
    }

    #[test]
    fn staleness_by_age_and_stream() {
        let mut t = WorkerTable::new();
        let (a, _) = t.open("a", 16, 1, 10.0);
        let s = |t: &WorkerTable, now| t.get(a).map(|s| s.is_stale(now, 5.0));
        assert_eq!(s(&t, 14.0), Some(false));
        assert_eq!(s(&t, 15.5), Some(true));
        t.touch(a, 15.0);
        assert_eq!(s(&t, 15.5), Some(false));
        t.close(a, 16.0);
        assert_eq!(s(&t, 16.0), Some(true));
        t.open("a", 16, 1, 17.0);
        assert_eq!(s(&t, 17.0), Some(false));
    }

    #[test]
    fn gone_means_closed_for_the_grace_period_and_not_listed() {
        let mut t = WorkerTable::new();
        let (a, _) = t.open("a", 16, 1, 0.0);
        let (b, _) = t.open("b", 16, 1, 0.0);
        t.open("c", 16, 1, 0.0);
        t.close(a, 10.0);
        t.close(b, 10.0);
        let listed = |k: &str| k == "b";
        assert!(
            t.gone(39.0, 30.0, listed).is_empty(),
            "within the grace period"
        );
        assert_eq!(
            t.gone(40.0, 30.0, listed),
            vec![a],
            "b is listed, c is open"
        );
    }
}
