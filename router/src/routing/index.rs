//! The KV index: which worker holds which kvroute block, and how many leading blocks of a
//! prompt each worker holds. (Why one file of ~1,100 lines: the table's slot encoding, the
//! runs and their holder lists, and the lookup share invariants that `check_invariants`
//! verifies together; split, each part would have to expose the others' internals.)
//!
//! ```text
//! runs[r]: hashes [h0 h1 h2 ... hn]     consecutive blocks stored in one stream
//!          holders (worker, end)         each holder holds hashes[lo..end]: a prefix
//! table:   block hash --> (run, position)  8-byte slots: tag, probe distance, run, position
//! blocks[WorkerId] --> block count   (everything else about a worker: routing::workers)
//! ```
//!
//! Blocks are stored in runs: a worker's newly stored blocks are appended to the run of the
//! block it stored just before, as long as it holds that run up to that block. (Events carry
//! no parent hash, so that block is the best guess of the chain's previous one. Within one
//! store call the blocks are one chain, and a run that goes on past the previous block is cut
//! there so that the chain continues in one run; across calls the new block then starts a
//! new run.) Every holder of a run holds a prefix of it (its `end`), so one holder list serves
//! the whole run, however long.
//! A lookup probes the table once per run it enters, then compares the prompt's hashes with the
//! run's contiguous hashes (no probe, no set operation per block), and narrows the workers
//! still matching only where it leaves a run. Holder sets that stop being prefixes (a worker
//! stores past a gap, or removes a block from the middle) split the run in two, relabelling
//! the smaller half.
//!
//! Runs are a layout, not a claim about the chain: the lookup verifies every hash, so a run
//! that happens to join two unrelated chains costs an extra probe, never a wrong answer.
//!
//! Narrowing at a run boundary: runs held by many workers keep (built on first lookup, dropped
//! on change) their holders sorted by `end` with prefix fingerprints, so when the workers still
//! matching are exactly the ones holding the next run's entry point (the common case along one
//! chain) the step costs a binary search plus the workers that drop out; otherwise one pass
//! over both sets. Cost: O(prompt + runs entered + matching workers), never the pool.
//!
//! Memory: 8-byte table slots at 40-80% load (20-80% while the table is under 8 MiB), 8 bytes
//! per block in its run, and 8 bytes per (run, holder): 20-30 bytes per block however many
//! workers hold it (up to about 50 in an index of under a million blocks).
//!
//! Dropping all of one worker's blocks (`clear`, a replacing snapshot, `remove_worker`) visits
//! only the runs that worker holds (each worker's set of runs is kept beside the holder
//! lists), so a worker that clears over and over costs the router its own blocks, not the
//! whole index.

use std::collections::HashSet;
use std::sync::OnceLock;

use super::workers::WorkerId;

/// Positions in a run fit the slot's 16-bit field.
const MAX_RUN: usize = 1 << 16;

/// Runs with at least this many holders get a by-end summary for lookups.
const SUMMARY_MIN: usize = 16;

/// Mixes a block key (hash XOR the per-index seed) into a table position: a multiply-fold
/// spreads every input bit, so crafted prompts cannot target slots without knowing the seed.
pub(super) fn fold(v: u64) -> u64 {
    let m = u128::from(v) * 0x9E37_79B9_7F4A_7C15_u128;
    (m as u64) ^ ((m >> 64) as u64)
}

/// A worker's contribution to a set fingerprint.
fn member_fp(w: u32) -> u64 {
    fold(u64::from(w) ^ 0xA076_1D64_78BD_642F)
}

/// Longest probe distance; an insert that would go further grows the table instead.
const MAX_DIST: u64 = 200;
const DIST_SHIFT: u32 = 48;
const TAG_SHIFT: u32 = 56;
/// Run and position bits of a slot.
const LOC_MASK: u64 = (1 << DIST_SHIFT) - 1;

/// A table slot: `pos | run << 16 | dist << 48 | tag << 56`, 0 when empty (run 0 is never
/// issued). `tag` is 8 bits of the folded key and `dist` the distance from the home slot, so
/// most non-matching slots are passed over without reading the run.
fn slot(f: u64, dist: u64, run: u32, pos: usize) -> u64 {
    ((f & 0xFF) << TAG_SHIFT) | (dist << DIST_SHIFT) | (u64::from(run) << 16) | pos as u64
}
fn slot_run(s: u64) -> usize {
    ((s >> 16) & 0xFFFF_FFFF) as usize
}
fn slot_pos(s: u64) -> usize {
    (s & 0xFFFF) as usize
}
fn slot_dist(s: u64) -> u64 {
    (s >> DIST_SHIFT) & 0xFF
}

/// Where a key is, or where it would be inserted (slot, distance from home).
enum Probe {
    Found(usize),
    Vacant(usize, u64),
}

/// Block hash -> (run, position): Robin Hood open addressing over 8-byte slots. The full key
/// lives only in the run (read to confirm a tag match), which halves the table. At 80% load
/// the table grows ([`Table::grown`]): 20-80% full under 1 Mi slots, 40-80% up to 4 Mi and
/// 53-80% beyond (10-15 bytes per block); removal shifts the following slots back (no
/// tombstones).
#[derive(Default)]
struct Table {
    slots: Vec<u64>,
    len: usize,
}

impl Table {
    fn home(&self, f: u64) -> usize {
        ((u128::from(f) * self.slots.len() as u128) >> 64) as usize
    }

    fn needs_grow(&self) -> bool {
        (self.len + 1) * 5 > self.slots.len() * 4
    }

    /// The capacity to grow to: 4x while under 1 Mi slots (8 MiB), 2x up to 4 Mi slots
    /// (32 MiB), then by half. Every rebuild re-inserts every block at a random slot, which
    /// is most of what filling an empty index costs; growing 4x while the table is small
    /// halves the number of rebuilds, at most 6 MiB of slack; past that, less slack wins.
    fn grown(&self) -> usize {
        let cap = self.slots.len();
        if cap < 1 << 20 {
            (cap * 4).max(16)
        } else if cap < 1 << 22 {
            cap * 2
        } else {
            cap * 3 / 2
        }
    }

    /// Finds the slot whose entry satisfies `is_it` among those with `f`'s tag.
    fn probe(&self, f: u64, mut is_it: impl FnMut(u64) -> bool) -> Probe {
        let cap = self.slots.len();
        if cap == 0 {
            return Probe::Vacant(0, 0);
        }
        let tag = (f & 0xFF) << TAG_SHIFT;
        let mut j = self.home(f);
        let mut d = 0;
        loop {
            let s = self.slots[j];
            if s == 0 || slot_dist(s) < d || d > MAX_DIST {
                return Probe::Vacant(j, d);
            }
            if slot_dist(s) == d && s & (0xFF << TAG_SHIFT) == tag && is_it(s) {
                return Probe::Found(j);
            }
            d += 1;
            j += 1;
            if j == cap {
                j = 0;
            }
        }
    }

    /// The slot holding (run, pos) for a key folding to `f`.
    fn find_loc(&self, f: u64, run: usize, pos: usize) -> Option<usize> {
        let loc = ((run as u64) << 16) | pos as u64;
        match self.probe(f, |s| s & LOC_MASK == loc) {
            Probe::Found(j) => Some(j),
            Probe::Vacant(..) => None,
        }
    }

    /// Inserts `s` (distance 0) at the vacancy `(j, d)` found by [`Table::probe`]. False when
    /// a displaced entry would land too far from home: the table is then inconsistent and
    /// must be rebuilt.
    #[must_use]
    fn insert_at(&mut self, mut j: usize, d: u64, s: u64) -> bool {
        let cap = self.slots.len();
        let mut cur = s | (d << DIST_SHIFT);
        loop {
            let here = self.slots[j];
            if here == 0 {
                self.slots[j] = cur;
                self.len += 1;
                return true;
            }
            if slot_dist(here) < slot_dist(cur) {
                self.slots[j] = cur;
                cur = here;
            }
            if slot_dist(cur) >= MAX_DIST {
                return false;
            }
            cur += 1 << DIST_SHIFT;
            j += 1;
            if j == cap {
                j = 0;
            }
        }
    }

    /// Empties slot `j`, shifting the following displaced entries back one step.
    fn remove_at(&mut self, mut j: usize) {
        let cap = self.slots.len();
        loop {
            let n = if j + 1 == cap { 0 } else { j + 1 };
            let s = self.slots[n];
            if s == 0 || slot_dist(s) == 0 {
                self.slots[j] = 0;
                break;
            }
            self.slots[j] = s - (1 << DIST_SHIFT);
            j = n;
        }
        self.len -= 1;
    }

    /// Points slot `j` at a new (run, pos), keeping its tag and distance.
    fn relabel(&mut self, j: usize, run: u32, pos: usize) {
        let s = self.slots[j];
        self.slots[j] = (s & !LOC_MASK) | (u64::from(run) << 16) | pos as u64;
    }

    /// Re-inserts every block of `runs` into a table of at least `cap` slots.
    fn rebuild(&mut self, mut cap: usize, runs: &[Run], seed: u64) {
        'grow: loop {
            self.slots = vec![0; cap.max(16)];
            self.len = 0;
            let mut folded = [0u64; 16];
            for (r, run) in runs.iter().enumerate().skip(1) {
                let lo = run.lo as usize;
                for (c, chunk) in run.hashes[lo.min(run.len())..].chunks(16).enumerate() {
                    // fold and load the chunk's home slots first: overlapping cache misses
                    let mut acc = 0;
                    for (f, &h) in folded.iter_mut().zip(chunk) {
                        *f = fold(h ^ seed);
                        acc ^= self.slots[self.home(*f)];
                    }
                    std::hint::black_box(acc);
                    for (i, &f) in folded[..chunk.len()].iter().enumerate() {
                        let pos = lo + c * 16 + i;
                        if !self.insert_at(self.home(f), 0, slot(f, 0, r as u32, pos)) {
                            cap = cap * 3 / 2;
                            continue 'grow;
                        }
                    }
                }
            }
            return;
        }
    }

    fn heap_bytes(&self) -> usize {
        self.slots.capacity() * 8
    }
}

/// A stretch of blocks with one holder list. The run's blocks are `hashes[lo..]`; each
/// holder `(worker, end)` holds `hashes[lo..end]`, with `lo < end`; the longest holder ends at
/// `hashes.len()`, so every block of the run is held.
#[derive(Default)]
struct Run {
    hashes: Vec<u64>,
    lo: u32,
    /// Sorted by worker.
    holders: Vec<(u32, u32)>,
    /// Holders by end, for lookups; built on demand for runs with many holders, reset on
    /// every change.
    summary: OnceLock<Box<Summary>>,
    /// The largest and second largest holder ends (`lo` when missing), when known: a worker
    /// evicting its private tail of a run many workers share (leaf first, one block at a
    /// time) then truncates the run without scanning the holders each time.
    top: Option<(u32, u32)>,
}

/// A run's holders sorted by `end`, longest first, with the XOR of the first `i` holders'
/// [`member_fp`]s at `fp[i]`: the holders of position `p` are a prefix (those with
/// `end > p`), compared with a set of workers in O(1).
struct Summary {
    by_end: Vec<(u32, u32)>,
    fp: Vec<u64>,
}

impl Summary {
    fn new(holders: &[(u32, u32)]) -> Self {
        let mut by_end: Vec<(u32, u32)> = holders.iter().map(|&(w, e)| (e, w)).collect();
        by_end.sort_unstable_by(|a, b| b.cmp(a));
        let mut fp = Vec::with_capacity(by_end.len() + 1);
        let mut x = 0;
        fp.push(0);
        for &(_, w) in &by_end {
            x ^= member_fp(w);
            fp.push(x);
        }
        Summary { by_end, fp }
    }

    /// Holders with `end > p`.
    fn count_past(&self, p: u32) -> usize {
        self.by_end.partition_point(|&(e, _)| e > p)
    }
}

impl Run {
    /// A run starting at position 0 whose holders end where `holders` says.
    fn fresh(hashes: Vec<u64>, holders: Vec<(u32, u32)>) -> Self {
        Run {
            hashes,
            lo: 0,
            holders,
            summary: OnceLock::new(),
            top: None,
        }
    }

    fn len(&self) -> usize {
        self.hashes.len()
    }

    /// `w`'s end (`lo` when it holds nothing here) and its place in `holders`.
    fn end_of(&self, w: u32) -> (usize, Result<usize, usize>) {
        let at = self.holders.binary_search_by_key(&w, |h| h.0);
        let end = match at {
            Ok(i) => self.holders[i].1 as usize,
            Err(_) => self.lo as usize,
        };
        (end, at)
    }

    /// [`Run::end_of`], trying position `hint` in `holders` first.
    fn end_of_hinted(&self, w: u32, hint: u32) -> (usize, Result<usize, usize>) {
        match self.holders.get(hint as usize) {
            Some(&(hw, e)) if hw == w => (e as usize, Ok(hint as usize)),
            _ => self.end_of(w),
        }
    }

    fn summary(&self) -> Option<&Summary> {
        (self.holders.len() >= SUMMARY_MIN).then(|| {
            &**self
                .summary
                .get_or_init(|| Box::new(Summary::new(&self.holders)))
        })
    }

    fn changed(&mut self) {
        if self.summary.get().is_some() {
            self.summary = OnceLock::new();
        }
        self.top = None;
    }

    /// The largest and second largest holder ends.
    fn top_two(&mut self) -> (u32, u32) {
        if let Some(t) = self.top {
            return t;
        }
        let (mut a, mut b) = (self.lo, self.lo);
        for &(_, e) in &self.holders {
            if e > a {
                b = a;
                a = e;
            } else if e > b {
                b = e;
            }
        }
        self.top = Some((a, b));
        (a, b)
    }

    fn heap_bytes(&self) -> usize {
        self.hashes.capacity() * 8
            + self.holders.capacity() * 8
            + self
                .summary
                .get()
                .map_or(0, |s| 32 + s.by_end.capacity() * 8 + s.fp.capacity() * 8)
    }
}

/// Length of the common prefix of two hash slices.
fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut i = 0;
    // 16 hashes at a time, OR-ing their differences (vectorizes; no call per chunk).
    for (x, y) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        if x.iter().zip(y).fold(0, |d, (p, q)| d | (p ^ q)) != 0 {
            break;
        }
        i += 16;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// Per-worker resident block sets for many workers, with leading-prefix lookup.
pub struct KvIndex {
    /// Mixed into every key so that slot positions depend on a per-process seed.
    seed: u64,
    table: Table,
    /// Run 0 is a permanent empty placeholder (so that no slot is all zero).
    runs: Vec<Run>,
    free_runs: Vec<u32>,
    /// Blocks each worker holds, by [`WorkerId`] (grown on a worker's first report; ids are
    /// handed out and reused by the worker table, which clears a worker before reusing it).
    blocks: Vec<u64>,
    /// Per worker: (run, position, place in the run's holders) of the block it stored last;
    /// where its next new block is appended if it still holds the run's last block, and
    /// where its next block is looked for first. A hint only: checked before use.
    cursors: Vec<(u32, u32, u32)>,
    /// Per worker: the runs it is a holder of (what `drop_all_blocks` visits).
    held_runs: Vec<HashSet<u32>>,
    pairs: u64,
}

impl Default for KvIndex {
    fn default() -> Self {
        Self::new(0)
    }
}

/// The workers still matching during a lookup: either the first `count` holders (by end)
/// of run `run`'s summary, or an explicit list; with their number and fingerprint.
struct Live {
    implicit: Option<(usize, usize)>,
    list: Vec<u32>,
    n: usize,
    fp: u64,
}

impl KvIndex {
    /// An empty index; `seed` (e.g. drawn at start-up) keys the block-map hasher.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            table: Table::default(),
            runs: vec![Run::default()],
            free_runs: Vec::new(),
            blocks: Vec::new(),
            cursors: Vec::new(),
            held_runs: Vec::new(),
            pairs: 0,
        }
    }

    /// Makes room for worker `w` in the per-worker vectors.
    fn ensure(&mut self, w: WorkerId) {
        let i = w.index();
        if self.blocks.len() <= i {
            self.blocks.resize(i + 1, 0);
            self.cursors.resize(i + 1, (0, 0, 0));
            self.held_runs.resize_with(i + 1, HashSet::new);
        }
    }

    /// Blocks worker `w` holds (0 for an id never seen).
    pub fn blocks_of(&self, w: WorkerId) -> u64 {
        self.blocks.get(w.index()).copied().unwrap_or(0)
    }

    /// One past the largest worker id seen (the length of per-worker vectors).
    pub fn worker_count(&self) -> usize {
        self.blocks.len()
    }

    /// Replaces everything the worker holds with `blocks`.
    pub fn apply_snapshot(&mut self, w: WorkerId, blocks: &[u64]) {
        self.ensure(w);
        self.drop_all_blocks(w);
        self.apply_stored(w, blocks);
    }

    /// Adds blocks to the worker; blocks it already holds are left as they are (stores are
    /// idempotent). Returns how many were new.
    pub fn apply_stored(&mut self, w: WorkerId, blocks: &[u64]) -> usize {
        self.ensure(w);
        let mut added = 0;
        let mut same_call = false;
        for batch in blocks.chunks(16) {
            self.touch_slots(batch);
            for &h in batch {
                added += usize::from(self.store_one(w.index(), h, same_call));
                same_call = true;
            }
        }
        self.pairs += added as u64;
        self.blocks[w.index()] += added as u64;
        added
    }

    /// Removes blocks from the worker; unknown ones are ignored. Returns how many it held.
    pub fn apply_removed(&mut self, w: WorkerId, blocks: &[u64]) -> usize {
        if w.index() >= self.blocks.len() {
            return 0;
        }
        let mut removed = 0;
        for batch in blocks.chunks(16) {
            self.touch_slots(batch);
            for &h in batch {
                removed += usize::from(self.remove_one(w.0, h));
            }
        }
        self.pairs = self.pairs.saturating_sub(removed as u64);
        let held = &mut self.blocks[w.index()];
        *held = held.saturating_sub(removed as u64);
        removed
    }

    /// Drops every block of the worker (vLLM reset its prefix cache or restarted). Returns
    /// how many runs it visited: the worker's own, whatever the size of the index.
    pub fn clear(&mut self, w: WorkerId) -> usize {
        if w.index() < self.blocks.len() {
            self.drop_all_blocks(w)
        } else {
            0
        }
    }

    fn drop_all_blocks(&mut self, w: WorkerId) -> usize {
        self.cursors[w.index()] = (0, 0, 0);
        let runs = std::mem::take(&mut self.held_runs[w.index()]);
        let visited = runs.len();
        let held = &mut self.blocks[w.index()];
        if *held == 0 {
            return 0;
        }
        let dropped = *held;
        *held = 0;
        for r in runs {
            let r = r as usize;
            let Some(run) = self.runs.get_mut(r) else {
                continue;
            };
            if let Ok(i) = run.holders.binary_search_by_key(&w.0, |h| h.0) {
                let end = run.holders.remove(i).1 as usize;
                run.changed();
                if end == run.len() {
                    self.truncate(r);
                }
            }
        }
        self.pairs = self.pairs.saturating_sub(dropped);
        visited
    }

    /// Reads the home slots of `batch` up front: independent loads whose cache misses
    /// overlap, instead of one miss after the other in the probes that follow.
    fn touch_slots(&self, batch: &[u64]) {
        if self.table.slots.is_empty() || batch.len() < 2 {
            return;
        }
        let mut acc = 0;
        for &h in batch {
            acc ^= self.table.slots[self.table.home(fold(h ^ self.seed))];
        }
        std::hint::black_box(acc);
    }

    /// The slot of block `h`, if indexed.
    /// The run holding block `h` and its position there.
    fn run_of(&self, h: u64) -> Option<(usize, usize)> {
        let s = self.table.slots[self.locate(h)?];
        Some((slot_run(s), slot_pos(s)))
    }

    fn locate(&self, h: u64) -> Option<usize> {
        let runs = &self.runs;
        let f = fold(h ^ self.seed);
        match self
            .table
            .probe(f, |s| runs[slot_run(s)].hashes[slot_pos(s)] == h)
        {
            Probe::Found(j) => Some(j),
            Probe::Vacant(..) => None,
        }
    }

    /// Adds block `h` to worker `w`; true when it was new to the worker.
    fn store_one(&mut self, w: usize, h: u64, same_call: bool) -> bool {
        // the block after the previous one in its run: no probe needed
        let (cr, cp, _) = self.cursors[w];
        if let Some(run) = self.runs.get(cr as usize) {
            let next = cp as usize + 1;
            if next >= run.lo as usize && run.hashes.get(next) == Some(&h) {
                return self.store_existing(w, cr as usize, next);
            }
        }
        if self.table.needs_grow() {
            self.table
                .rebuild(self.table.grown(), &self.runs, self.seed);
        }
        let f = fold(h ^ self.seed);
        let runs = &self.runs;
        match self
            .table
            .probe(f, |s| runs[slot_run(s)].hashes[slot_pos(s)] == h)
        {
            Probe::Found(j) => {
                let s = self.table.slots[j];
                self.store_existing(w, slot_run(s), slot_pos(s))
            }
            Probe::Vacant(j, d) => {
                let Some((r, pos)) = self.place_new(w, h, same_call) else {
                    return false;
                };
                if !self.table.insert_at(j, d, slot(f, 0, r, pos)) {
                    let cap = self.table.slots.len() * 3 / 2;
                    self.table.rebuild(cap, &self.runs, self.seed);
                }
                true
            }
        }
    }

    /// Puts a block no one holds into a run held by `w`: appended to the run of `w`'s
    /// previous block when `w` holds that run up to that block and no further. If the run
    /// goes on past that block (another worker's chain, or unrelated blocks), the new block
    /// follows within one store call (a chain being extended: the run is cut after the
    /// previous block); across calls it starts a new run.
    fn place_new(&mut self, w: usize, h: u64, same_call: bool) -> Option<(u32, usize)> {
        let wid = w as u32;
        let (cr, cp, hint) = self.cursors[w];
        let (mut r, mut p) = (cr as usize, cp as usize);
        // `w`'s place in the run's holders, when it holds the run exactly up to `p`
        let held = match self.runs.get(r) {
            Some(run) if r != 0 && p >= run.lo as usize && p < run.len() => {
                match run.end_of_hinted(wid, hint) {
                    (end, Ok(i)) if end == p + 1 && (p + 1 == run.len() || same_call) => Some(i),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(i) = held {
            if p + 1 < self.runs[r].len() {
                // the prefix part keeps every holder, in order: `i` stays `w`'s place
                let ((pr, pd), _) = self.split(r, p + 1);
                (r, p) = (pr as usize, p - pd);
            }
            let run = &mut self.runs[r];
            if p + 1 == run.len()
                && run.len() < MAX_RUN
                && run.holders.get(i).is_some_and(|x| x.0 == wid)
            {
                if run.hashes.len() == run.hashes.capacity() {
                    // double while short (few reallocations), then grow by half (long runs
                    // keep little slack)
                    let n = run.hashes.len();
                    let more = if n < 1024 { n.max(4) } else { n / 2 };
                    run.hashes.reserve_exact(more.min(MAX_RUN - n));
                }
                run.hashes.push(h);
                run.holders[i].1 += 1;
                run.changed();
                let pos = run.len() - 1;
                self.cursors[w] = (r as u32, pos as u32, i as u32);
                return Some((r as u32, pos));
            }
        }
        let r = self.new_run(Run::fresh(vec![h], vec![(wid, 1)]))?;
        self.cursors[w] = (r, 0, 0);
        self.held_runs[w].insert(r);
        Some((r, 0))
    }

    fn new_run(&mut self, run: Run) -> Option<u32> {
        if let Some(r) = self.free_runs.pop() {
            self.runs[r as usize] = run;
            return Some(r);
        }
        let r = u32::try_from(self.runs.len()).ok()?;
        self.runs.push(run);
        Some(r)
    }

    /// `w` stores the block at (run `r`, `pos`), which others hold.
    fn store_existing(&mut self, w: usize, r: usize, pos: usize) -> bool {
        let wid = w as u32;
        let hint = self.cursors[w].2;
        let (end, at) = self.runs[r].end_of_hinted(wid, hint);
        if end > pos {
            self.cursors[w] = (r as u32, pos as u32, at.unwrap_or(0) as u32);
            return false;
        }
        let (r, pos, at) = if end == pos {
            (r, pos, at)
        } else {
            // a gap before `pos`: `w`'s holding would not be a prefix; cut the run at `pos`
            let (_, (sr, sd)) = self.split(r, pos);
            let (r, pos) = (sr as usize, pos - sd);
            let at = self.runs[r].end_of(wid).1;
            (r, pos, at)
        };
        let run = &mut self.runs[r];
        let i = match at {
            Ok(i) => {
                run.holders[i].1 += 1;
                i
            }
            Err(i) => {
                run.holders.insert(i, (wid, pos as u32 + 1));
                self.held_runs[w].insert(r as u32);
                i
            }
        };
        run.changed();
        self.cursors[w] = (r as u32, pos as u32, i as u32);
        true
    }

    /// Removes block `h` from worker `w`; true when `w` held it.
    fn remove_one(&mut self, w: u32, h: u64) -> bool {
        let Some(j) = self.locate(h) else {
            return false;
        };
        let s = self.table.slots[j];
        let (mut r, mut pos) = (slot_run(s), slot_pos(s));
        let (end, _) = self.runs[r].end_of(w);
        if end <= pos {
            return false;
        }
        if end > pos + 1 {
            // `w` keeps blocks after `pos`: cut the run after it
            let ((pr, pd), _) = self.split(r, pos + 1);
            r = pr as usize;
            pos -= pd;
        }
        let run = &mut self.runs[r];
        let tail = pos + 1 == run.len();
        let top = if tail { run.top_two() } else { (0, 0) };
        let mut still = false;
        if let (_, Ok(i)) = run.end_of(w) {
            if pos == run.lo as usize {
                run.holders.remove(i);
                if let Some(set) = self.held_runs.get_mut(w as usize) {
                    set.remove(&(r as u32));
                }
            } else {
                run.holders[i].1 = pos as u32;
                still = true;
            }
        }
        run.changed();
        if tail && top.1 as usize != pos + 1 {
            // `w` alone held the last block: the run now ends at the longer of its new
            // end and the runner-up, which stays the runner-up
            let keep = if still {
                pos.max(top.1 as usize)
            } else {
                top.1 as usize
            };
            if still {
                run.top = Some((keep as u32, top.1));
            }
            self.truncate_to(r, keep, Some(j));
        }
        true
    }

    /// Drops the run's blocks past its longest holder (freeing the run when none is left).
    fn truncate(&mut self, r: usize) {
        let keep = self.runs[r].top_two().0 as usize;
        self.truncate_to(r, keep, None);
    }

    /// Drops the run's blocks from `keep` on; `keep` must be the longest holder's end.
    /// `last`: the slot of the run's last block, when the caller knows it.
    fn truncate_to(&mut self, r: usize, keep: usize, mut last: Option<usize>) {
        let run = &mut self.runs[r];
        for pos in (keep..run.hashes.len()).rev() {
            // the first removal is the last block; later ones may have been shifted
            let j = last.take().or_else(|| {
                let f = fold(run.hashes[pos] ^ self.seed);
                self.table.find_loc(f, r, pos)
            });
            if let Some(j) = j {
                self.table.remove_at(j);
            }
        }
        run.hashes.truncate(keep);
        if run.holders.is_empty() {
            // cursors still naming `r` are checked before use
            *run = Run::default();
            self.free_runs.push(r as u32);
        } else if run.hashes.capacity() > 2 * run.hashes.len() + 8 {
            run.hashes.shrink_to_fit();
        }
    }

    /// Cuts run `r` before position `at` (`lo < at < len`) into two runs with the same
    /// holders (each holder's prefix cut accordingly), moving the shorter part to a new run.
    /// Returns `(run, shift)` for each part: a block of the prefix at old position `p` is
    /// now at `(prefix.0, p - prefix.1)`, likewise for the suffix.
    fn split(&mut self, r: usize, at: usize) -> ((u32, usize), (u32, usize)) {
        let nr = self.new_run(Run::default());
        let Some(nr) = nr else {
            // out of run ids (4 billion runs): leave the run whole; the caller's update is
            // then approximate
            return ((r as u32, 0), (r as u32, 0));
        };
        let run = &mut self.runs[r];
        let lo = run.lo as usize;
        let len = run.len();
        let cut = at as u32;
        let pre: Vec<(u32, u32)> = run.holders.iter().map(|&(w, e)| (w, e.min(cut))).collect();
        let suf: Vec<(u32, u32)> = run.holders.iter().copied().filter(|h| h.1 > cut).collect();
        run.changed();
        if at - lo <= len - at {
            // the prefix moves; the suffix stays, behind a dead stretch
            let hashes = run.hashes[lo..at].to_vec();
            run.lo = cut;
            // every holder holds the moved prefix; those that end by the cut leave `r`
            for &(w, e) in &run.holders {
                if let Some(set) = self.held_runs.get_mut(w as usize) {
                    set.insert(nr);
                    if e <= cut {
                        set.remove(&(r as u32));
                    }
                }
            }
            run.holders = suf;
            let shift = lo as u32;
            let moved = Run::fresh(
                hashes,
                pre.into_iter().map(|(w, e)| (w, e - shift)).collect(),
            );
            self.runs[nr as usize] = moved;
            self.relabel(r, lo..at, nr, lo);
            let mut suf_shift = 0;
            let run = &mut self.runs[r];
            if at > run.len() - at {
                // more dead than live: compact
                run.hashes.drain(..at);
                run.lo = 0;
                for h in &mut run.holders {
                    h.1 -= cut;
                }
                let n = run.len();
                self.relabel(r, at..at + n, r as u32, at);
                suf_shift = at;
                let run = &mut self.runs[r];
                run.hashes.shrink_to_fit();
            }
            ((nr, lo), (r as u32, suf_shift))
        } else {
            let hashes = run.hashes[at..].to_vec();
            run.hashes.truncate(at);
            // the holders that go on past the cut hold the moved suffix too
            for &(w, _) in &suf {
                if let Some(set) = self.held_runs.get_mut(w as usize) {
                    set.insert(nr);
                }
            }
            run.holders = pre;
            let moved = Run::fresh(hashes, suf.into_iter().map(|(w, e)| (w, e - cut)).collect());
            self.runs[nr as usize] = moved;
            self.relabel(r, at..len, nr, at);
            ((r as u32, 0), (nr, at))
        }
    }

    /// Points the slots of run `from`'s old positions `old` at run `to`, position
    /// `old - shift` (whose hashes must already be there).
    fn relabel(&mut self, from: usize, old: std::ops::Range<usize>, to: u32, shift: usize) {
        for p in old {
            let h = self.runs[to as usize].hashes[p - shift];
            let f = fold(h ^ self.seed);
            if let Some(j) = self.table.find_loc(f, from, p) {
                self.table.relabel(j, to, p - shift);
            }
        }
    }

    /// For the chain `hashes` (block 1 first), writes `(worker, n)` for every worker holding
    /// the first `n >= 1` blocks (leading blocks only: a gap ends a worker's match). `out` is
    /// cleared first; order is unspecified. Cost: one table probe per run entered, one
    /// comparison per matched block, and the narrowing of the matching workers where the
    /// chain leaves a run.
    pub fn match_prefix(&self, hashes: &[u64], out: &mut Vec<(WorkerId, usize)>) {
        out.clear();
        let mut live = Live {
            implicit: None,
            list: Vec::new(),
            n: 0,
            fp: 0,
        };
        let mut bits: Vec<u64> = Vec::new();
        let mut depth = 0;
        while depth < hashes.len() {
            let Some((r, pos)) = self.run_of(hashes[depth]) else {
                break;
            };
            let run = &self.runs[r];
            let m = 1 + common_prefix(&run.hashes[pos + 1..], &hashes[depth + 1..]);
            let (p, reach) = (pos as u32, (pos + m) as u32);
            if depth == 0 {
                self.enter_first(r, p, reach, out, &mut live);
            } else {
                self.narrow(r, p, reach, depth, out, &mut live, &mut bits);
            }
            if live.n == 0 {
                return;
            }
            depth += m;
        }
        match live.implicit {
            Some((r, count)) => {
                if let Some(sm) = self.runs[r].summary() {
                    out.extend(
                        sm.by_end[..count]
                            .iter()
                            .map(|&(_, w)| (WorkerId(w), depth)),
                    );
                }
            }
            None => out.extend(live.list.iter().map(|&w| (WorkerId(w), depth))),
        }
    }

    /// The workers of the first run entered at `p` and matched to `reach`.
    fn enter_first(
        &self,
        r: usize,
        p: u32,
        reach: u32,
        out: &mut Vec<(WorkerId, usize)>,
        live: &mut Live,
    ) {
        let run = &self.runs[r];
        if let Some(sm) = run.summary() {
            let full = sm.by_end.partition_point(|&(e, _)| e >= reach);
            let past = sm.count_past(p);
            out.extend(
                sm.by_end[full..past]
                    .iter()
                    .map(|&(e, w)| (WorkerId(w), (e - p) as usize)),
            );
            *live = Live {
                implicit: Some((r, full)),
                list: Vec::new(),
                n: full,
                fp: sm.fp[full],
            };
            return;
        }
        for &(w, e) in &run.holders {
            if e >= reach {
                live.list.push(w);
                live.fp ^= member_fp(w);
            } else if e > p {
                out.push((WorkerId(w), (e - p) as usize));
            }
        }
        live.n = live.list.len();
    }

    /// Narrows the live workers (all matched to `depth`) to the holders of run `r` from `p`
    /// to `reach`; the others are written to `out` with what they matched.
    #[allow(clippy::too_many_arguments)]
    fn narrow(
        &self,
        r: usize,
        p: u32,
        reach: u32,
        depth: usize,
        out: &mut Vec<(WorkerId, usize)>,
        live: &mut Live,
        bits: &mut Vec<u64>,
    ) {
        let run = &self.runs[r];
        let sm = run.summary();
        if let Some(sm) = sm {
            let past = sm.count_past(p);
            if past == live.n && sm.fp[past] == live.fp {
                // the live workers are exactly this run's holders at `p`
                let full = sm.by_end.partition_point(|&(e, _)| e >= reach);
                for &(e, w) in &sm.by_end[full..past] {
                    out.push((WorkerId(w), depth + (e - p) as usize));
                }
                *live = Live {
                    implicit: Some((r, full)),
                    list: std::mem::take(&mut live.list),
                    n: full,
                    fp: sm.fp[full],
                };
                return;
            }
        }
        if let Some((lr, count)) = live.implicit.take() {
            live.list.clear();
            if let Some(lsm) = self.runs[lr].summary() {
                live.list
                    .extend(lsm.by_end[..count].iter().map(|&(_, w)| w));
            }
        }
        let holders = &run.holders;
        let mut fp = 0;
        if live.list.len() * 8 <= holders.len() || live.list.len() <= 4 {
            // few live workers: look each up
            let mut k = 0;
            for i in 0..live.list.len() {
                let w = live.list[i];
                let e = holders
                    .binary_search_by_key(&w, |h| h.0)
                    .map_or(0, |x| holders[x].1);
                if e >= reach {
                    live.list[k] = w;
                    k += 1;
                    fp ^= member_fp(w);
                } else if e > p {
                    out.push((WorkerId(w), depth + (e - p) as usize));
                } else {
                    out.push((WorkerId(w), depth));
                }
            }
            live.list.truncate(k);
        } else {
            // one pass over each: mark the live workers, walk the holders
            let words = self.blocks.len() / 64 + 1;
            bits.clear();
            bits.resize(words, 0);
            for &w in &live.list {
                if let Some(b) = bits.get_mut((w / 64) as usize) {
                    *b |= 1 << (w % 64);
                }
            }
            live.list.clear();
            for &(w, e) in holders {
                let (word, mask) = ((w / 64) as usize, 1u64 << (w % 64));
                if bits.get(word).is_some_and(|b| b & mask != 0) {
                    bits[word] &= !mask;
                    if e >= reach {
                        live.list.push(w);
                        fp ^= member_fp(w);
                    } else if e > p {
                        out.push((WorkerId(w), depth + (e - p) as usize));
                    } else {
                        out.push((WorkerId(w), depth));
                    }
                }
            }
            for (i, &word) in bits.iter().enumerate() {
                let mut x = word;
                while x != 0 {
                    out.push((WorkerId(i as u32 * 64 + x.trailing_zeros()), depth));
                    x &= x - 1;
                }
            }
        }
        live.n = live.list.len();
        live.fp = fp;
    }

    /// Leading blocks of `hashes` that one worker holds.
    pub fn matched_blocks(&self, w: WorkerId, hashes: &[u64]) -> usize {
        let mut depth = 0;
        while depth < hashes.len() {
            let Some((r, pos)) = self.run_of(hashes[depth]) else {
                break;
            };
            let run = &self.runs[r];
            let (end, _) = run.end_of(w.0);
            if end <= pos {
                break;
            }
            let m = 1 + common_prefix(&run.hashes[pos + 1..end], &hashes[depth + 1..]);
            depth += m;
            // the chain goes on to the run's next block, which the worker does not hold
            if pos + m == end
                && run
                    .hashes
                    .get(end)
                    .is_some_and(|&h| hashes.get(depth) == Some(&h))
            {
                break;
            }
        }
        depth
    }

    /// Number of distinct blocks held by anyone.
    pub fn distinct_blocks(&self) -> usize {
        self.table.len
    }

    /// Number of (block, worker) pairs.
    pub fn pairs(&self) -> u64 {
        self.pairs
    }

    /// Heap bytes of the block structures (table slots, runs, holder lists), computed from
    /// their capacities.
    pub fn memory_bytes(&self) -> usize {
        self.table.heap_bytes()
            + self.runs.capacity() * std::mem::size_of::<Run>()
            + self.runs.iter().map(Run::heap_bytes).sum::<usize>()
            + self.free_runs.capacity() * 4
            + self.cursors.capacity() * 12
            + self
                .held_runs
                .iter()
                .map(|r| r.capacity() * 5 + std::mem::size_of::<HashSet<u32>>())
                .sum::<usize>()
    }
}

#[cfg(test)]
impl KvIndex {
    /// Checks every structural invariant; panics with the first broken one.
    fn check_invariants(&self) {
        let mut blocks = 0;
        let mut pairs = 0u64;
        let mut per_worker = vec![0u64; self.blocks.len()];
        for (r, run) in self.runs.iter().enumerate().skip(1) {
            if run.holders.is_empty() {
                assert!(run.hashes.is_empty(), "run {r}: blocks without holders");
                assert!(
                    self.free_runs.contains(&(r as u32)),
                    "run {r}: empty, not free"
                );
                continue;
            }
            let lo = run.lo as usize;
            assert!(lo < run.len() && run.len() <= MAX_RUN, "run {r}: bounds");
            assert!(
                run.holders.windows(2).all(|p| p[0].0 < p[1].0),
                "run {r}: holders unsorted"
            );
            let max = run.holders.iter().map(|h| h.1 as usize).max();
            assert_eq!(max, Some(run.len()), "run {r}: longest holder != length");
            for &(w, e) in &run.holders {
                assert!(e as usize > lo, "run {r}: empty holder {w}");
                pairs += u64::from(e) - lo as u64;
                per_worker[w as usize] += u64::from(e) - lo as u64;
            }
            for (pos, &h) in run.hashes.iter().enumerate().skip(lo) {
                let j = self
                    .locate(h)
                    .unwrap_or_else(|| panic!("run {r}: {h} not in table"));
                let s = self.table.slots[j];
                assert_eq!(
                    (slot_run(s), slot_pos(s)),
                    (r, pos),
                    "block {h}: wrong slot"
                );
                blocks += 1;
            }
        }
        assert_eq!(self.table.len, blocks, "table length");
        let occupied = self.table.slots.iter().filter(|&&s| s != 0).count();
        assert_eq!(occupied, blocks, "occupied slots");
        let cap = self.table.slots.len();
        for (j, &s) in self.table.slots.iter().enumerate() {
            if s != 0 {
                let h = self.runs[slot_run(s)].hashes[slot_pos(s)];
                let home = self.table.home(fold(h ^ self.seed));
                assert_eq!(
                    (home + slot_dist(s) as usize) % cap,
                    j,
                    "slot {j}: distance"
                );
            }
        }
        assert_eq!(self.pairs, pairs, "pair count");
        for (w, &held) in self.blocks.iter().enumerate() {
            assert_eq!(held, per_worker[w], "worker {w}: block count");
        }
        for (w, runs) in self.held_runs.iter().enumerate() {
            let actual: HashSet<u32> = (1..self.runs.len())
                .filter(|&r| {
                    self.runs[r]
                        .holders
                        .binary_search_by_key(&(w as u32), |h| h.0)
                        .is_ok()
                })
                .map(|r| r as u32)
                .collect();
            assert_eq!(*runs, actual, "worker {w}: runs held");
        }
    }

    /// Live runs.
    fn run_count(&self) -> usize {
        self.runs
            .iter()
            .skip(1)
            .filter(|r| !r.holders.is_empty())
            .count()
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
