//! The pending overlay: the router's own recent placements per worker, a short-lived
//! speculative view of blocks that will be (or just were) computed there, consulted next to
//! the KV index while the worker's reports have not caught up.
//!
//! ```text
//! assign --add--> per_worker[w]: block -> (holders, in_use, until) <--leading / in_use_leading-- plan
//! first token --settle (kept `grace` s more)      end (finish / abort / expire) --> dropped
//!                                                   \--> freed order (last in use -> free)
//! ```
//!
//! The freed order mirrors the worker's queue of free blocks (vLLM's
//! `FreeKVCacheBlockQueue`) for the blocks the router's own requests released: a block joins
//! its tail when the last placement holding it ends (the deepest block of a chain first, as
//! vLLM frees a request's blocks in reverse), leaves it when a placement holds it again or the
//! worker reports it evicted. vLLM allocates from the head, so the blocks released longest ago
//! are evicted first: [`Overlay::kept_leading`] says how much of a prompt's cached prefix
//! survives a given number of allocations.

use std::collections::HashMap;

use kvroute_hash::BlockHash;

use super::assign::AssignmentId;
use super::keys::BlockKeys;
use super::workers::WorkerId;

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
pub(super) struct Overlay {
    per_worker: Vec<HashMap<BlockHash, OverlayEntry, BlockKeys>>,
    /// Chain of each outstanding placement, and whether it is still before its first token.
    by_assignment: HashMap<AssignmentId, (WorkerId, Vec<BlockHash>, bool)>,
    settled: u32,
    /// Latest time seen (for dropping expired entries).
    latest: f64,
    /// Blocks in the chains of `by_assignment` (what the overlay's size follows).
    blocks: usize,
    /// Per worker: distinct blocks with `in_use > 0` (what Dynamo's router calls the
    /// worker's active blocks: shared blocks of outstanding requests counted once).
    in_use_distinct: Vec<u64>,
    /// Per worker: the blocks the router's placements released, in release order.
    freed: Vec<FreedOrder>,
}

/// Most released blocks remembered per worker (the oldest are forgotten first) until it
/// reports its KV capacity, which then bounds them (`Overlay::trim_freed`): bounds what a
/// worker that never reports evictions can make the router hold.
const MAX_FREED_PER_WORKER: usize = 1 << 16;

/// One worker's released blocks in release order (oldest first).
///
/// A block's stamp is its position in `slots`; a Fenwick tree over `slots` counts the
/// entries still there, so the k-th oldest (asked of every candidate where a decision
/// expects evictions) is found in O(log n), and so is taking one out (a placement holds it
/// again, or the worker reports it evicted). When taken-out slots outnumber the live ones,
/// the live ones are moved to the front and stamped again in the same order.
#[derive(Debug, Default)]
struct FreedOrder {
    by_hash: HashMap<BlockHash, u64, BlockKeys>,
    /// The block released at each stamp, `None` once taken out.
    slots: Vec<Option<BlockHash>>,
    /// Fenwick tree over `slots` (entry j - 1 covers slots (j - lowbit(j), j]): live counts.
    tree: Vec<u32>,
    live: usize,
}

impl FreedOrder {
    fn release(&mut self, h: BlockHash) {
        self.take_one(h);
        if self.slots.len() >= 2 * self.live + 64 {
            self.compact();
        }
        let i = self.slots.len();
        self.by_hash.insert(h, i as u64);
        self.slots.push(Some(h));
        // The new entry j = i + 1 covers slots (j - lowbit(j), j]: itself and those before.
        let j = i + 1;
        let covered = self.prefix(i) - self.prefix(j - (j & j.wrapping_neg()));
        self.tree.push(covered + 1);
        self.live += 1;
        self.trim(MAX_FREED_PER_WORKER);
    }

    fn trim(&mut self, max: usize) {
        while self.live > max
            && let Some(i) = self.nth_index(0)
            && let Some(old) = self.slots[i]
        {
            self.take_one(old);
        }
    }

    /// Takes `blocks` out (those it holds).
    fn take(&mut self, blocks: impl IntoIterator<Item = BlockHash>) {
        for h in blocks {
            self.take_one(h);
        }
    }

    fn take_one(&mut self, h: BlockHash) {
        let Some(stamp) = self.by_hash.remove(&h) else {
            return;
        };
        let i = stamp as usize;
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = None;
        }
        let mut j = i + 1;
        while let Some(t) = self.tree.get_mut(j - 1) {
            *t -= 1;
            j += j & j.wrapping_neg();
        }
        self.live -= 1;
    }

    /// Live entries among the first `n` slots.
    fn prefix(&self, mut n: usize) -> u32 {
        let mut sum = 0;
        while n > 0 {
            sum += self.tree[n - 1];
            n &= n - 1;
        }
        sum
    }

    /// The slot (the stamp) of the `k`-th oldest live entry (from 0).
    fn nth_index(&self, k: usize) -> Option<usize> {
        if k >= self.live {
            return None;
        }
        let n = self.tree.len();
        let (mut pos, mut rest) = (0, k as u32 + 1);
        let mut step = 1usize << (usize::BITS - 1 - n.leading_zeros());
        while step > 0 {
            if pos + step <= n && self.tree[pos + step - 1] < rest {
                pos += step;
                rest -= self.tree[pos - 1];
            }
            step >>= 1;
        }
        Some(pos)
    }

    /// Moves the live entries to the front, in order, and stamps them again.
    fn compact(&mut self) {
        let live: Vec<BlockHash> = self.slots.drain(..).flatten().collect();
        for (i, &h) in live.iter().enumerate() {
            self.by_hash.insert(h, i as u64);
        }
        self.slots = live.into_iter().map(Some).collect();
        let n = self.slots.len();
        self.tree = vec![1; n];
        for j in 1..=n {
            let up = j + (j & j.wrapping_neg());
            if up <= n {
                self.tree[up - 1] += self.tree[j - 1];
            }
        }
        self.live = n;
    }
}

impl Overlay {
    pub(super) fn add(&mut self, id: AssignmentId, w: WorkerId, chain: Vec<BlockHash>) {
        let i = w.index();
        if self.per_worker.len() <= i {
            self.per_worker.resize_with(i + 1, HashMap::default);
        }
        if self.in_use_distinct.len() <= i {
            self.in_use_distinct.resize(i + 1, 0);
        }
        if self.freed.len() <= i {
            self.freed.resize_with(i + 1, FreedOrder::default);
        }
        self.freed[i].take(chain.iter().copied());
        let m = &mut self.per_worker[i];
        let mut newly_in_use = 0u64;
        for &h in &chain {
            m.entry(h)
                .and_modify(|e| {
                    e.holders += 1;
                    if e.in_use == 0 {
                        newly_in_use += 1;
                    }
                    e.in_use += 1;
                })
                .or_insert_with(|| {
                    newly_in_use += 1;
                    OverlayEntry {
                        holders: 1,
                        in_use: 1,
                        until: f64::NEG_INFINITY,
                    }
                });
        }
        self.in_use_distinct[i] += newly_in_use;
        self.blocks += chain.len();
        if let Some((_, old, _)) = self.by_assignment.insert(id, (w, chain, true)) {
            self.blocks -= old.len();
        }
    }

    /// The chain of an outstanding placement.
    pub(super) fn chain(&self, id: AssignmentId) -> Option<&[BlockHash]> {
        self.by_assignment.get(&id).map(|(_, c, _)| c.as_slice())
    }

    /// Blocks in the chains of the placements it holds.
    pub(super) fn blocks(&self) -> usize {
        self.blocks
    }

    /// The assignment got its first token: its blocks stay `grace` seconds more as
    /// placements, and in use until it ends.
    pub(super) fn settle(&mut self, id: AssignmentId, now: f64, grace: f64) {
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
    pub(super) fn end(&mut self, id: AssignmentId, now: f64) {
        self.settle(id, f64::NEG_INFINITY, 0.0);
        let Some((w, chain, _)) = self.by_assignment.remove(&id) else {
            return;
        };
        self.blocks -= chain.len();
        if let Some(m) = self.per_worker.get_mut(w.index()) {
            let mut released = 0u64;
            // Deepest first: vLLM appends a finished request's blocks to the free queue in
            // reverse, so its leading blocks are evicted last.
            for &h in chain.iter().rev() {
                if let Some(e) = m.get_mut(&h)
                    && e.in_use > 0
                {
                    e.in_use -= 1;
                    if e.in_use == 0 {
                        released += 1;
                        if let Some(f) = self.freed.get_mut(w.index()) {
                            f.release(h);
                        }
                    }
                }
            }
            if let Some(n) = self.in_use_distinct.get_mut(w.index()) {
                *n = n.saturating_sub(released);
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

    /// Leading blocks of `chain` that outstanding placements on `w` reference (they are a
    /// prefix of those counted as there, whatever the time).
    #[cfg(test)]
    pub(super) fn in_use_leading(&self, w: WorkerId, chain: &[BlockHash]) -> usize {
        self.leading_and_in_use(w, chain, f64::INFINITY).1
    }

    /// Leading blocks of `chain` expected to stay on `w` (in use, or released too recently to
    /// go) once `evict` of the released blocks the overlay remembers there, the oldest
    /// first, are reallocated; with `evict` 0 the whole chain is kept. Blocks it does not
    /// remember count as older than all of them (released before the router saw them, or by
    /// traffic it did not place), so any eviction takes them. The blocks in use are a prefix
    /// (see [`Overlay::leading_and_in_use`]) found by binary search; the walk starts after
    /// them, so it costs O(log n) plus the released blocks kept.
    pub(super) fn kept_leading(&self, w: WorkerId, chain: &[BlockHash], evict: usize) -> usize {
        let Some(k) = evict.checked_sub(1) else {
            return chain.len();
        };
        let freed = self.freed.get(w.index());
        // Released blocks at or below this stamp are gone.
        let frontier = freed
            .and_then(|f| f.nth_index(k))
            .map_or(u64::MAX, |i| i as u64);
        let m = self.per_worker.get(w.index());
        let start = m.map_or(0, |m| in_use_prefix(m, chain));
        start
            + chain[start..]
                .iter()
                .take_while(|h| {
                    m.and_then(|m| m.get(h)).is_some_and(|e| e.in_use > 0)
                        || freed
                            .and_then(|f| f.by_hash.get(h))
                            .is_some_and(|&s| s > frontier)
                })
                .count()
    }

    /// Released blocks the overlay remembers on `w` (see [`Overlay::kept_leading`]).
    pub(super) fn freed_len(&self, w: WorkerId) -> usize {
        self.freed.get(w.index()).map_or(0, |f| f.live)
    }

    /// `w` reported these blocks evicted: they are out of its free queue.
    pub(super) fn evicted(&mut self, w: WorkerId, blocks: &[BlockHash]) {
        if let Some(f) = self.freed.get_mut(w.index()) {
            f.take(blocks.iter().copied());
        }
    }

    /// `w` holds at most `capacity_blocks` blocks: released blocks past that many are gone
    /// (the oldest first).
    pub(super) fn trim_freed(&mut self, w: WorkerId, capacity_blocks: u64) {
        if let Some(f) = self.freed.get_mut(w.index()) {
            f.trim(usize::try_from(capacity_blocks).unwrap_or(usize::MAX));
        }
    }

    /// `w` dropped every block.
    pub(super) fn cleared(&mut self, w: WorkerId) {
        if let Some(f) = self.freed.get_mut(w.index()) {
            *f = FreedOrder::default();
        }
    }

    /// Distinct blocks that outstanding placements on `w` reference.
    pub(super) fn in_use_distinct(&self, w: WorkerId) -> u64 {
        self.in_use_distinct.get(w.index()).copied().unwrap_or(0)
    }

    /// Leading blocks of `chain` the router placed on `w` and still counts as there.
    pub(super) fn leading(&self, w: WorkerId, chain: &[BlockHash], now: f64) -> usize {
        self.leading_and_in_use(w, chain, now).0
    }

    /// [`Overlay::leading`] and how many of those blocks are in use, by binary search, O(log n)
    /// lookups each: a decision asks both of every candidate, and on a pool whose workers
    /// all have the same long prompt pending a walk of the chain per candidate was most of
    /// the decision (bench/README.md, "The pending overlay's binary search").
    ///
    /// Both are prefixes of `chain`: a chain is a prompt's block hashes from its first block,
    /// each chained to its parent, and every placement adds, settles and ends its whole
    /// chain, so a block a placement counts (or holds in use) at depth i comes with the
    /// i blocks before it. A "chain" that is not one (from a faulty peer) gets some count
    /// up to its length, never a panic. A unit test checks both against a walk of the chain.
    pub(super) fn leading_and_in_use(
        &self,
        w: WorkerId,
        chain: &[BlockHash],
        now: f64,
    ) -> (usize, usize) {
        let Some(m) = self.per_worker.get(w.index()) else {
            return (0, 0);
        };
        if m.is_empty() {
            return (0, 0);
        }
        let leading = chain.partition_point(|h| {
            m.get(h)
                .is_some_and(|e| e.in_use > 0 || e.holders > 0 || e.until > now)
        });
        (leading, in_use_prefix(m, &chain[..leading]))
    }

    pub(super) fn drop_worker(&mut self, w: WorkerId) {
        if let Some(m) = self.per_worker.get_mut(w.index()) {
            m.clear();
        }
        if let Some(n) = self.in_use_distinct.get_mut(w.index()) {
            *n = 0;
        }
        self.cleared(w);
        self.by_assignment.retain(|_, (aw, _, _)| *aw != w);
        self.blocks = self.by_assignment.values().map(|(_, c, _)| c.len()).sum();
    }
}

/// Leading blocks of `chain` that outstanding placements in `m` reference, by binary search
/// (a prefix: see [`Overlay::leading_and_in_use`]).
fn in_use_prefix(m: &HashMap<BlockHash, OverlayEntry, BlockKeys>, chain: &[BlockHash]) -> usize {
    chain.partition_point(|h| m.get(h).is_some_and(|e| e.in_use > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> AssignmentId {
        AssignmentId(n)
    }

    #[test]
    fn released_blocks_go_oldest_first_and_deepest_first() {
        let w = WorkerId(0);
        let mut o = Overlay::default();
        o.add(id(1), w, vec![1, 2, 3]);
        o.add(id(2), w, vec![4, 5]);
        assert_eq!(o.freed_len(w), 0);
        // In use: nothing can go.
        assert_eq!(o.kept_leading(w, &[1, 2, 3], 100), 3);
        o.end(id(1), 1.0); // frees 3, 2, 1
        o.end(id(2), 2.0); // then 5, 4
        assert_eq!(o.freed_len(w), 5);
        let a = [1, 2, 3];
        let b = [4, 5];
        let kept: Vec<usize> = (0..6).map(|e| o.kept_leading(w, &a, e)).collect();
        assert_eq!(kept, [3, 2, 1, 0, 0, 0]);
        let kept: Vec<usize> = (0..6).map(|e| o.kept_leading(w, &b, e)).collect();
        assert_eq!(kept, [2, 2, 2, 2, 1, 0]);
        // Blocks the overlay never saw are older than all it remembers.
        assert_eq!(o.kept_leading(w, &[9, 1], 0), 2);
        assert_eq!(o.kept_leading(w, &[9, 1], 1), 0);
        // Held again: out of the free queue, kept whatever is evicted; released again: the
        // newest.
        o.add(id(3), w, vec![1, 7]);
        assert_eq!(o.freed_len(w), 4);
        assert_eq!(o.kept_leading(w, &a, 10), 1);
        o.end(id(3), 3.0);
        assert_eq!(o.kept_leading(w, &a, 3), 1, "3, 2 and 5 went; 1 is newer");
        // Reported evicted: forgotten; cleared: all forgotten.
        o.evicted(w, &[4, 5]);
        assert_eq!(o.freed_len(w), 4);
        assert_eq!(o.kept_leading(w, &b, 1), 0);
        o.trim_freed(w, 2);
        assert_eq!(o.freed_len(w), 2);
        assert_eq!(o.kept_leading(w, &a, 0), 3);
        assert_eq!(
            o.kept_leading(w, &a, 1),
            1,
            "3 and 2 trimmed, 7 goes first, 1 stays"
        );
        assert_eq!(o.kept_leading(w, &[1, 7], 1), 1);
        o.cleared(w);
        assert_eq!(o.freed_len(w), 0);
        assert_eq!(o.kept_leading(WorkerId(7), &a, 1), 0, "unknown worker");
        assert_eq!(o.kept_leading(WorkerId(7), &a, 0), 3);
    }

    #[test]
    fn one_walk_gives_the_leading_blocks_and_those_in_use() {
        let w = WorkerId(0);
        let mut o = Overlay::default();
        o.add(id(1), w, vec![1, 2, 3, 4]);
        o.settle(id(1), 1.0, 5.0); // counted as there until 6.0
        o.end(id(1), 2.0); // no longer in use
        o.add(id(2), w, vec![1, 2]); // 1 and 2 in use again
        let chain = [1, 2, 3, 4, 9];
        for (now, want) in [(3.0, (4, 2)), (7.0, (2, 2))] {
            assert_eq!(o.leading_and_in_use(w, &chain, now), want, "at {now}");
            assert_eq!(o.leading(w, &chain, now), want.0);
            assert_eq!(o.in_use_leading(w, &chain), want.1);
        }
        // In use all along the chain; an unknown worker.
        assert_eq!(o.leading_and_in_use(w, &[1, 2], 7.0), (2, 2));
        assert_eq!(o.leading_and_in_use(WorkerId(5), &chain, 3.0), (0, 0));
    }

    #[test]
    fn a_block_shared_by_two_placements_is_released_with_the_last() {
        let w = WorkerId(1);
        let mut o = Overlay::default();
        o.add(id(1), w, vec![1, 2]);
        o.add(id(2), w, vec![1, 3]);
        o.end(id(1), 1.0);
        assert_eq!(o.freed_len(w), 1, "only 2: 1 is still held");
        o.end(id(2), 2.0);
        assert_eq!(o.freed_len(w), 3);
        // Release order 2, 3, 1: one allocation takes 2.
        assert_eq!(o.kept_leading(w, &[1, 3], 1), 2);
        assert_eq!(o.kept_leading(w, &[1, 2], 1), 1);
    }

    /// The walk of the chain the binary search replaced, kept as its reference.
    fn walked(o: &Overlay, w: WorkerId, chain: &[BlockHash], now: f64) -> (usize, usize) {
        let Some(m) = o.per_worker.get(w.index()) else {
            return (0, 0);
        };
        let mut in_use = None;
        for (i, h) in chain.iter().enumerate() {
            let Some(e) = m.get(h) else {
                return (i, in_use.unwrap_or(i));
            };
            if e.in_use == 0 {
                if e.holders == 0 && e.until <= now {
                    return (i, in_use.unwrap_or(i));
                }
                in_use.get_or_insert(i);
            }
        }
        (chain.len(), in_use.unwrap_or(chain.len()))
    }

    /// [`Overlay::kept_leading`] as a walk from the chain's first block, with the frontier
    /// found by sorting the stamps `by_hash` holds (not `order`), kept as its reference.
    fn kept_walked(o: &Overlay, w: WorkerId, chain: &[BlockHash], evict: usize) -> usize {
        let Some(k) = evict.checked_sub(1) else {
            return chain.len();
        };
        let f = o.freed.get(w.index());
        let mut stamps: Vec<u64> = f
            .map(|f| f.by_hash.values().copied().collect())
            .unwrap_or_default();
        stamps.sort_unstable();
        let frontier = stamps.get(k).copied().unwrap_or(u64::MAX);
        let m = o.per_worker.get(w.index());
        chain
            .iter()
            .take_while(|h| {
                m.and_then(|m| m.get(h)).is_some_and(|e| e.in_use > 0)
                    || f.and_then(|f| f.by_hash.get(h))
                        .is_some_and(|&s| s > frontier)
            })
            .count()
    }

    /// The slots hold exactly `by_hash`'s entries, and the tree finds them oldest first.
    fn check_freed(o: &Overlay) {
        for f in &o.freed {
            assert_eq!(f.live, f.by_hash.len());
            assert_eq!(f.slots.iter().flatten().count(), f.live);
            assert!(
                f.by_hash
                    .iter()
                    .all(|(h, &s)| f.slots[s as usize] == Some(*h))
            );
            let mut stamps: Vec<u64> = f.by_hash.values().copied().collect();
            stamps.sort_unstable();
            let nth: Vec<u64> = (0..=f.live)
                .filter_map(|k| f.nth_index(k))
                .map(|i| i as u64)
                .collect();
            assert_eq!(nth, stamps);
        }
    }

    struct XorShift(u64);

    impl XorShift {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }

        /// A prompt: a path of 1-8 blocks in a tree with 2 branches per block, each
        /// block's hash derived from its parent's, as chained block hashes are.
        fn prompt(&mut self) -> Vec<BlockHash> {
            let len = 1 + self.below(8);
            let mut h = 0x51_7cc1_b727_220au64;
            (0..len)
                .map(|_| {
                    h = (h ^ (1 + self.below(2))).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    h ^= h >> 29;
                    h
                })
                .collect()
        }
    }

    #[test]
    fn the_binary_searches_agree_with_walks_of_chained_prompts() {
        let mut r = XorShift(0x2545_f491_4f6c_dd1d);
        let mut o = Overlay::default();
        let mut open: Vec<AssignmentId> = Vec::new();
        let (mut t, mut next, mut checked, mut partial, mut released_kept) = (0.0, 0u64, 0, 0, 0);
        for _ in 0..20_000 {
            t += r.below(100) as f64 / 1_000.0;
            match r.below(20) {
                0..=5 => {
                    next += 1;
                    o.add(id(next), WorkerId(r.below(4) as u32), r.prompt());
                    open.push(id(next));
                }
                6..=9 if !open.is_empty() => {
                    let a = open[r.below(open.len() as u64) as usize];
                    o.settle(a, t, r.below(5) as f64);
                }
                10..=18 if !open.is_empty() => {
                    let a = open.swap_remove(r.below(open.len() as u64) as usize);
                    o.end(a, t);
                }
                19 => match r.below(50) {
                    0 => o.drop_worker(WorkerId(r.below(4) as u32)),
                    1..=20 => o.evicted(WorkerId(r.below(4) as u32), &r.prompt()),
                    21..=25 => o.trim_freed(WorkerId(r.below(4) as u32), 5 + r.below(60)),
                    _ => {}
                },
                _ => {}
            }
            check_freed(&o);
            for _ in 0..3 {
                let (w, chain) = (WorkerId(r.below(5) as u32), r.prompt());
                let now = t + r.below(400) as f64 / 100.0 - 1.0;
                let want = walked(&o, w, &chain, now);
                assert_eq!(
                    o.leading_and_in_use(w, &chain, now),
                    want,
                    "{chain:?} at {now}"
                );
                checked += 1;
                partial += usize::from(want.0 > 0 && want.1 < want.0);
                let evict = r.below(40) as usize;
                let kept = kept_walked(&o, w, &chain, evict);
                assert_eq!(o.kept_leading(w, &chain, evict), kept, "{chain:?} {evict}");
                released_kept += usize::from(evict > 0 && kept > want.1);
            }
        }
        // The draw reaches every kind of prefix (not a test that passes on empty overlays):
        // in use, placed and no longer in use, and released but kept.
        assert!(
            checked == 60_000 && partial > 1_000 && released_kept > 1_000,
            "{partial} and {released_kept} of {checked}"
        );
    }
}
