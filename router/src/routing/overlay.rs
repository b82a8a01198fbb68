//! The pending overlay: the router's own recent placements per worker, a short-lived
//! speculative view of blocks that will be (or just were) computed there, consulted next to
//! the KV index while the worker's reports have not caught up.
//!
//! ```text
//! assign --add--> per_worker[w]: block -> (holders, in_use, until) <--leading / in_use_leading-- plan
//! first token --settle (kept `grace` s more)      end (finish / abort / expire) --> dropped
//! ```

use std::collections::HashMap;

use kvroute_hash::BlockHash;

use super::assign::AssignmentId;
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
    per_worker: Vec<HashMap<BlockHash, OverlayEntry>>,
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
}

impl Overlay {
    pub(super) fn add(&mut self, id: AssignmentId, w: WorkerId, chain: Vec<BlockHash>) {
        let i = w.index();
        if self.per_worker.len() <= i {
            self.per_worker.resize_with(i + 1, HashMap::new);
        }
        if self.in_use_distinct.len() <= i {
            self.in_use_distinct.resize(i + 1, 0);
        }
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
            for h in chain {
                if let Some(e) = m.get_mut(&h)
                    && e.in_use > 0
                {
                    e.in_use -= 1;
                    if e.in_use == 0 {
                        released += 1;
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

    /// Leading blocks of `chain` that outstanding placements on `w` reference.
    pub(super) fn in_use_leading(&self, w: WorkerId, chain: &[BlockHash]) -> usize {
        let Some(m) = self.per_worker.get(w.index()) else {
            return 0;
        };
        chain
            .iter()
            .take_while(|h| m.get(h).is_some_and(|e| e.in_use > 0))
            .count()
    }

    /// Distinct blocks that outstanding placements on `w` reference.
    pub(super) fn in_use_distinct(&self, w: WorkerId) -> u64 {
        self.in_use_distinct.get(w.index()).copied().unwrap_or(0)
    }

    /// Leading blocks of `chain` the router placed on `w` and still counts as there.
    pub(super) fn leading(&self, w: WorkerId, chain: &[BlockHash], now: f64) -> usize {
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

    pub(super) fn drop_worker(&mut self, w: WorkerId) {
        if let Some(m) = self.per_worker.get_mut(w.index()) {
            m.clear();
        }
        if let Some(n) = self.in_use_distinct.get_mut(w.index()) {
            *n = 0;
        }
        self.by_assignment.retain(|_, (aw, _, _)| *aw != w);
        self.blocks = self.by_assignment.values().map(|(_, c, _)| c.len()).sum();
    }
}
