//! Working sets: per worker, the KV blocks its recent requests reused, so that kvroute can
//! tell whether a new prefix still fits in a worker's cache beside what that worker serves
//! (`CoreConfig::working_set_horizon`, `PredictedTtftConfig::kv_fit`).
//!
//! ```text
//! assign --touch(chain)--> per worker: block -> (last placement, reused?) --reused--> plan
//! ```
//!
//! A block counts once a second placement on the same worker used it (a shared prefix, an
//! earlier turn of a conversation), and stops counting when the worker's last `horizon`
//! placements have not used it. A prompt's own new suffix is used once and never counts: it
//! is what the worker's cache may evict without a later request paying for it. Time is
//! counted in placements on that worker, not seconds, so a slow worker's prefixes do not
//! expire between its requests. A replica counts its own placements only.

use std::collections::{HashMap, VecDeque};

use kvroute_hash::BlockHash;

use super::workers::WorkerId;

/// Blocks remembered per worker at least, whatever its capacity.
const MIN_TRACKED_BLOCKS: usize = 1 << 14;

/// One worker's recently used blocks.
#[derive(Debug, Default)]
struct WorkerBlocks {
    /// Placements on the worker so far (the clock of `horizon`).
    tick: u64,
    /// Block -> (tick of its last use, used by two placements or more).
    blocks: HashMap<BlockHash, (u64, bool)>,
    /// Uses in tick order; an entry whose tick is older than its block's last use is stale.
    order: VecDeque<(u64, BlockHash)>,
    /// Per tick from `first_tick` on: the blocks whose last use it is, and how many of those
    /// are reused.
    at: VecDeque<(u32, u32)>,
    /// The tick of `at[0]`.
    first_tick: u64,
}

impl WorkerBlocks {
    /// The bucket of `tick` (which must be `first_tick` or later).
    fn bucket(&mut self, tick: u64) -> &mut (u32, u32) {
        let i = usize::try_from(tick - self.first_tick).unwrap_or(usize::MAX);
        if self.at.len() <= i {
            self.at.resize(i + 1, (0, 0));
        }
        &mut self.at[i]
    }

    /// Takes a block last used at `tick` out of its bucket.
    fn unbucket(&mut self, tick: u64, reused: bool) {
        if tick >= self.first_tick {
            let b = self.bucket(tick);
            b.0 = b.0.saturating_sub(1);
            b.1 = b.1.saturating_sub(u32::from(reused));
        }
    }

    /// Forgets the oldest use of all, whether or not it is still within the horizon.
    fn pop_oldest(&mut self) -> bool {
        let Some((tick, hash)) = self.order.pop_front() else {
            return false;
        };
        if let Some(&(last, reused)) = self.blocks.get(&hash)
            && last == tick
        {
            self.blocks.remove(&hash);
            self.unbucket(tick, reused);
        }
        true
    }

    /// Rebuilds `order` from `blocks` when stale entries make up most of it.
    fn compact(&mut self) {
        if self.order.len() <= 2 * self.blocks.len() + 1_024 {
            return;
        }
        let mut live: Vec<(u64, BlockHash)> = self
            .blocks
            .iter()
            .map(|(&hash, &(tick, _))| (tick, hash))
            .collect();
        live.sort_unstable_by_key(|&(tick, _)| tick);
        self.order = live.into();
    }

    /// Distinct blocks used at or after the last use of the least recently used reused
    /// block (0 when none is reused).
    fn footprint(&self) -> u64 {
        let Some(first) = self.at.iter().position(|&(_, reused)| reused > 0) else {
            return 0;
        };
        self.at
            .iter()
            .skip(first)
            .map(|&(all, _)| u64::from(all))
            .sum()
    }
}

/// Per worker, the blocks its last `horizon` placements used, and which of them were reused.
#[derive(Debug)]
pub(super) struct WorkingSets {
    horizon: u64,
    per_worker: Vec<WorkerBlocks>,
}

impl WorkingSets {
    /// Sets over the last `horizon` placements of each worker (0: off; nothing is kept). Its
    /// per-placement counts take 8 bytes per placement of the horizon per worker, and each
    /// plan reads them (`--working-set-horizon` allows at most 4096).
    pub(super) fn new(horizon: u32) -> Self {
        Self {
            horizon: u64::from(horizon),
            per_worker: Vec::new(),
        }
    }

    /// A placement on `w` uses `chain` (the prompt's block hashes). `capacity_blocks` (0:
    /// unknown) bounds what is remembered for `w`: twice its capacity, or
    /// `MIN_TRACKED_BLOCKS` if more; the oldest uses are forgotten first.
    pub(super) fn touch(&mut self, w: WorkerId, chain: &[BlockHash], capacity_blocks: u64) {
        if self.horizon == 0 {
            return;
        }
        let i = w.index();
        if self.per_worker.len() <= i {
            self.per_worker.resize_with(i + 1, WorkerBlocks::default);
        }
        let set = &mut self.per_worker[i];
        set.tick += 1;
        let tick = set.tick;
        while set
            .order
            .front()
            .is_some_and(|&(t, _)| t + self.horizon <= tick)
        {
            set.pop_oldest();
        }
        // Buckets older than the horizon are empty now.
        let oldest = (tick + 1).saturating_sub(self.horizon);
        while set.first_tick < oldest {
            set.at.pop_front();
            set.first_tick += 1;
        }
        for &hash in chain {
            let before = set.blocks.get(&hash).copied();
            if let Some((last, reused)) = before {
                set.unbucket(last, reused);
            }
            let reused = before.is_some();
            set.blocks.insert(hash, (tick, reused));
            let b = set.bucket(tick);
            b.0 += 1;
            b.1 += u32::from(reused);
            set.order.push_back((tick, hash));
        }
        set.compact();
        let bound = usize::try_from(capacity_blocks.saturating_mul(2))
            .unwrap_or(usize::MAX)
            .max(MIN_TRACKED_BLOCKS);
        while set.blocks.len() > bound && set.pop_oldest() {}
    }

    /// `w`'s working set: the distinct blocks its recent placements used from the last use
    /// of the least recently used block that two or more of them shared on. An LRU cache
    /// keeps every shared block only while it holds at least these.
    pub(super) fn footprint(&self, w: WorkerId) -> u64 {
        self.per_worker
            .get(w.index())
            .map_or(0, WorkerBlocks::footprint)
    }

    /// Forgets `w` (retired: its id may go to a new worker).
    pub(super) fn drop_worker(&mut self, w: WorkerId) {
        if let Some(set) = self.per_worker.get_mut(w.index()) {
            *set = WorkerBlocks::default();
        }
    }

    /// Entries held for `w` (blocks and uses): what its memory follows.
    #[cfg(test)]
    pub(super) fn held(&self, w: WorkerId) -> (usize, usize) {
        self.per_worker
            .get(w.index())
            .map_or((0, 0), |s| (s.blocks.len(), s.order.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(prefix: u64, len: u64) -> Vec<BlockHash> {
        (0..len).map(|i| prefix * 1_000_000 + i).collect()
    }

    #[test]
    fn the_working_set_starts_at_the_least_recently_used_shared_block() {
        let w = WorkerId(0);
        let mut s = WorkingSets::new(8);
        let first = chain(1, 10);
        s.touch(w, &first, 0);
        assert_eq!(s.footprint(w), 0, "a prompt used once is not a working set");
        // Same 10-block prefix, a new 2-block suffix: the prefix is shared, and the suffix
        // was used after it.
        let mut second = first.clone();
        second.extend(chain(2, 2));
        s.touch(w, &second, 0);
        assert_eq!(s.footprint(w), 12);
        // A one-off prompt after it: the cache must hold it too for the prefix to survive.
        s.touch(w, &chain(3, 5), 0);
        assert_eq!(s.footprint(w), 17);
        // The prefix used again: the one-off prompt is now older than every shared block.
        s.touch(w, &first, 0);
        assert_eq!(s.footprint(w), 10);
        assert_eq!(s.footprint(WorkerId(1)), 0, "other workers are apart");
    }

    #[test]
    fn blocks_unused_for_a_horizon_of_placements_stop_counting() {
        let w = WorkerId(0);
        let mut s = WorkingSets::new(4);
        let p = chain(1, 10);
        s.touch(w, &p, 0);
        s.touch(w, &p, 0);
        assert_eq!(s.footprint(w), 10);
        s.touch(w, &chain(10, 3), 0);
        s.touch(w, &chain(11, 3), 0);
        s.touch(w, &chain(12, 3), 0);
        assert_eq!(
            s.footprint(w),
            19,
            "last used at tick 2, now tick 5: within 4"
        );
        s.touch(w, &chain(13, 3), 0);
        assert_eq!(
            s.footprint(w),
            0,
            "tick 6: the prefix's last use is 4 placements old"
        );
        assert!(s.held(w).0 <= 4 * 3, "expired blocks are forgotten");
        // A prefix used every other placement stays counted, with what came after it.
        let q = chain(2, 5);
        for k in 0..20 {
            s.touch(w, &q, 0);
            s.touch(w, &chain(100 + k, 1), 0);
        }
        assert_eq!(s.footprint(w), 6);
    }

    #[test]
    fn memory_stays_bounded_by_the_capacity_and_stale_uses_are_compacted() {
        let w = WorkerId(0);
        let mut s = WorkingSets::new(1_000);
        // One hot prompt used over and over leaves stale uses behind; they are compacted.
        let hot = chain(1, 500);
        for _ in 0..100 {
            s.touch(w, &hot, 0);
        }
        let (blocks, uses) = s.held(w);
        assert_eq!(blocks, 500);
        assert!(uses <= 2 * 500 + 1_024 + 500, "uses {uses}");
        assert_eq!(s.footprint(w), 500);
        // Many distinct prompts on a worker of 10,000 blocks: at most 20,000 remembered.
        for k in 0..100 {
            s.touch(w, &chain(10 + k, 400), 10_000);
        }
        let (blocks, _) = s.held(w);
        assert!(blocks <= 20_000, "blocks {blocks}");
        // The bound never goes below the floor, whatever the capacity says.
        let v = WorkerId(1);
        for k in 0..10 {
            s.touch(v, &chain(500 + k, 1_000), 10);
        }
        assert_eq!(s.held(v).0, MIN_TRACKED_BLOCKS.min(10_000));
    }

    #[test]
    fn off_keeps_nothing_and_a_dropped_worker_starts_empty() {
        let w = WorkerId(2);
        let mut off = WorkingSets::new(0);
        off.touch(w, &chain(1, 10), 0);
        off.touch(w, &chain(1, 10), 0);
        assert_eq!(off.footprint(w), 0);
        assert_eq!(off.held(w), (0, 0));
        let mut s = WorkingSets::new(8);
        s.touch(w, &chain(1, 10), 0);
        s.touch(w, &chain(1, 10), 0);
        assert_eq!(s.footprint(w), 10);
        s.drop_worker(w);
        assert_eq!(s.footprint(w), 0);
        assert_eq!(s.held(w), (0, 0));
    }
}
