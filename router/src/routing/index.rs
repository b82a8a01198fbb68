//! The KV index: which worker holds which kvroute block, and how many leading blocks of a
//! prompt each worker holds.
//!
//! ```text
//! runs[r]: hashes [h0 h1 h2 ... hn]     consecutive blocks stored in one stream
//!          holders (worker, end)         each holder holds hashes[lo..end]: a prefix
//! table:   block hash --> (run, position)  8-byte slots: tag, probe distance, run, position
//! workers[WorkerId] --> key, block size, epoch, last update, block count, stale flag
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
//! Memory: 8-byte table slots at 40-80% load, 8 bytes per block in its run, and 8 bytes per
//! (run, holder): 20-30 bytes per block however many workers hold it.
//!
//! Dropping all of one worker's blocks (`clear`, a replacing snapshot, `remove_worker`) visits
//! every run; those happen on restarts and reconnects, not per request.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::Serialize;

/// A worker, interned by the index. Ids are never reused, so a stale id cannot alias a new
/// worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct WorkerId(pub u32);

impl WorkerId {
    /// Position in per-worker vectors.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What the index knows about one worker besides its blocks.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerState {
    /// The key the worker was registered under (e.g. `namespace/pod`).
    pub key: String,
    /// KV block size in tokens (the hash chain's block size for this worker).
    pub block_size: usize,
    /// Epoch of the last snapshot (the sidecar bumps it when vLLM restarts).
    pub epoch: u64,
    /// Time of the last report of any kind (seconds, caller's clock).
    pub last_update: f64,
    /// Number of blocks the worker holds.
    pub blocks: u64,
    /// Set by `mark_stale` (stream lost); cleared by the next report.
    pub marked_stale: bool,
    /// Removed workers keep their id but hold nothing and are never candidates.
    pub removed: bool,
}

/// Positions in a run fit the slot's 16-bit field.
const MAX_RUN: usize = 1 << 16;

/// Runs with at least this many holders get a by-end summary for lookups.
const SUMMARY_MIN: usize = 16;

/// Mixes a block key (hash XOR the per-index seed) into a table position: a multiply-fold
/// spreads every input bit, so crafted prompts cannot target slots without knowing the seed.
fn fold(v: u64) -> u64 {
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
/// the capacity doubles up to 1 Mi slots and grows by half beyond (then 53%-80% full: 10-15
/// bytes per block); removal shifts the following slots back (no tombstones).
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
    workers: Vec<WorkerState>,
    /// Per worker: (run, position, place in the run's holders) of the block it stored last;
    /// where its next new block is appended if it still holds the run's last block, and
    /// where its next block is looked for first. A hint only: checked before use.
    cursors: Vec<(u32, u32, u32)>,
    by_key: HashMap<String, WorkerId>,
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
            workers: Vec::new(),
            cursors: Vec::new(),
            by_key: HashMap::new(),
            pairs: 0,
        }
    }

    /// Interns `key`, returning its id (the same id for the same key; a removed worker is
    /// revived with its old id and no blocks). `block_size` is updated when non-zero.
    pub fn upsert_worker(&mut self, key: &str, block_size: usize) -> WorkerId {
        if let Some(&w) = self.by_key.get(key) {
            let st = &mut self.workers[w.index()];
            st.removed = false;
            if block_size > 0 {
                st.block_size = block_size;
            }
            return w;
        }
        let id = WorkerId(
            u32::try_from(self.workers.len())
                .unwrap_or(u32::MAX - 1)
                .min(u32::MAX - 1),
        );
        self.workers.push(WorkerState {
            key: key.to_owned(),
            block_size,
            epoch: 0,
            last_update: f64::NEG_INFINITY,
            blocks: 0,
            marked_stale: false,
            removed: false,
        });
        self.cursors.push((0, 0, 0));
        self.by_key.insert(key.to_owned(), id);
        id
    }

    /// Looks a worker up by key.
    pub fn worker_id(&self, key: &str) -> Option<WorkerId> {
        self.by_key.get(key).copied()
    }

    /// A worker's state, if the id was issued by this index.
    pub fn worker(&self, w: WorkerId) -> Option<&WorkerState> {
        self.workers.get(w.index())
    }

    /// Every worker ever registered (removed ones included, flagged).
    pub fn workers(&self) -> impl Iterator<Item = (WorkerId, &WorkerState)> {
        self.workers
            .iter()
            .enumerate()
            .map(|(i, s)| (WorkerId(i as u32), s))
    }

    /// Number of ids issued.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Records a report of any kind (KV event or load sample) at `now`; clears `mark_stale`.
    pub fn touch(&mut self, w: WorkerId, now: f64) {
        if let Some(st) = self.workers.get_mut(w.index()) {
            if now.is_finite() && now > st.last_update {
                st.last_update = now;
            }
            st.marked_stale = false;
        }
    }

    /// Marks a worker's state as not trustworthy (its report stream broke) until it reports
    /// again. Its blocks are kept: they are probably still mostly there.
    pub fn mark_stale(&mut self, w: WorkerId) {
        if let Some(st) = self.workers.get_mut(w.index()) {
            st.marked_stale = true;
        }
    }

    /// Time of the worker's last report.
    pub fn last_update(&self, w: WorkerId) -> Option<f64> {
        self.worker(w).map(|s| s.last_update)
    }

    /// True when the worker was marked stale or has not reported for more than `max_age`.
    pub fn is_stale(&self, w: WorkerId, now: f64, max_age: f64) -> bool {
        match self.worker(w) {
            Some(s) => s.marked_stale || now - s.last_update > max_age,
            None => true,
        }
    }

    /// Sets the worker's block size (from its reports).
    pub fn set_block_size(&mut self, w: WorkerId, block_size: usize) {
        if let Some(st) = self.workers.get_mut(w.index()) {
            st.block_size = block_size;
        }
    }

    /// Replaces everything the worker holds with `blocks`, at `epoch`.
    pub fn apply_snapshot(&mut self, w: WorkerId, epoch: u64, blocks: &[u64], now: f64) {
        if self.worker(w).is_none() {
            return;
        }
        self.drop_all_blocks(w);
        self.workers[w.index()].epoch = epoch;
        self.apply_stored(w, blocks, now);
    }

    /// Adds blocks to the worker; blocks it already holds are left as they are (stores are
    /// idempotent). Returns how many were new.
    pub fn apply_stored(&mut self, w: WorkerId, blocks: &[u64], now: f64) -> usize {
        if self.worker(w).is_none_or(|s| s.removed) {
            return 0;
        }
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
        self.workers[w.index()].blocks += added as u64;
        self.touch(w, now);
        added
    }

    /// Removes blocks from the worker; unknown ones are ignored. Returns how many it held.
    pub fn apply_removed(&mut self, w: WorkerId, blocks: &[u64], now: f64) -> usize {
        if self.worker(w).is_none() {
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
        let st = &mut self.workers[w.index()];
        st.blocks = st.blocks.saturating_sub(removed as u64);
        self.touch(w, now);
        removed
    }

    /// Drops every block of the worker (vLLM reset its prefix cache or restarted).
    pub fn clear(&mut self, w: WorkerId, now: f64) {
        if self.worker(w).is_none() {
            return;
        }
        self.drop_all_blocks(w);
        self.touch(w, now);
    }

    /// Drops the worker's blocks and retires it; its id stays reserved.
    pub fn remove_worker(&mut self, w: WorkerId) {
        if self.worker(w).is_none() {
            return;
        }
        self.drop_all_blocks(w);
        self.workers[w.index()].removed = true;
    }

    fn drop_all_blocks(&mut self, w: WorkerId) {
        self.cursors[w.index()] = (0, 0, 0);
        let st = &mut self.workers[w.index()];
        if st.blocks == 0 {
            return;
        }
        let dropped = st.blocks;
        st.blocks = 0;
        for r in 1..self.runs.len() {
            let run = &mut self.runs[r];
            if let Ok(i) = run.holders.binary_search_by_key(&w.0, |h| h.0) {
                let end = run.holders.remove(i).1 as usize;
                run.changed();
                if end == run.len() {
                    self.truncate(r);
                }
            }
        }
        self.pairs = self.pairs.saturating_sub(dropped);
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
            // doubling while small (fewer rehashes), by half past 32 MiB (less slack)
            let cap = self.table.slots.len();
            let cap = if cap < 1 << 22 {
                (cap * 2).max(16)
            } else {
                cap * 3 / 2
            };
            self.table.rebuild(cap, &self.runs, self.seed);
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
            let words = self.workers.len() / 64 + 1;
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
    }
}

#[cfg(test)]
impl KvIndex {
    /// Checks every structural invariant; panics with the first broken one.
    fn check_invariants(&self) {
        let mut blocks = 0;
        let mut pairs = 0u64;
        let mut per_worker = vec![0u64; self.workers.len()];
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
        for (w, st) in self.workers.iter().enumerate() {
            assert_eq!(st.blocks, per_worker[w], "worker {w}: block count");
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
mod tests {
    use super::*;

    fn matches(ix: &KvIndex, hashes: &[u64]) -> Vec<(WorkerId, usize)> {
        let mut out = Vec::new();
        ix.match_prefix(hashes, &mut out);
        out.sort();
        out
    }

    #[test]
    fn stores_are_idempotent_and_counted() {
        let mut ix = KvIndex::new(7);
        let a = ix.upsert_worker("a", 16);
        assert_eq!(ix.apply_stored(a, &[1, 2, 3], 1.0), 3);
        assert_eq!(ix.apply_stored(a, &[1, 2, 3, 4], 2.0), 1);
        assert_eq!(ix.worker(a).map(|s| s.blocks), Some(4));
        assert_eq!(ix.pairs(), 4);
        assert_eq!(ix.last_update(a), Some(2.0));
        assert_eq!(ix.upsert_worker("a", 0), a);
    }

    #[test]
    fn leading_blocks_per_worker_stop_at_gaps() {
        let mut ix = KvIndex::new(1);
        let a = ix.upsert_worker("a", 16);
        let b = ix.upsert_worker("b", 16);
        let c = ix.upsert_worker("c", 16);
        ix.apply_stored(a, &[10, 11, 12, 13], 0.0);
        ix.apply_stored(b, &[10, 11], 0.0);
        ix.apply_stored(c, &[10, 12, 13], 0.0); // gap at 11
        assert_eq!(
            matches(&ix, &[10, 11, 12, 13, 14]),
            vec![(a, 4), (b, 2), (c, 1)]
        );
        assert_eq!(matches(&ix, &[11, 12]), vec![(a, 2), (b, 1)]);
        assert!(matches(&ix, &[99, 10]).is_empty());
        assert!(matches(&ix, &[]).is_empty());
        assert_eq!(ix.matched_blocks(c, &[10, 11, 12]), 1);
    }

    #[test]
    fn many_holders_use_sets_and_shrink_back() {
        let mut ix = KvIndex::new(3);
        let ws: Vec<WorkerId> = (0..5)
            .map(|i| ix.upsert_worker(&format!("w{i}"), 16))
            .collect();
        for &w in &ws {
            ix.apply_stored(w, &[1, 2], 0.0);
        }
        assert_eq!(
            matches(&ix, &[1, 2]),
            ws.iter().map(|&w| (w, 2)).collect::<Vec<_>>()
        );
        for &w in &ws[..4] {
            assert_eq!(ix.apply_removed(w, &[2], 1.0), 1);
        }
        assert_eq!(ix.apply_removed(ws[0], &[2], 1.0), 0);
        let got = matches(&ix, &[1, 2]);
        assert_eq!(
            got,
            vec![(ws[0], 1), (ws[1], 1), (ws[2], 1), (ws[3], 1), (ws[4], 2)]
        );
        // a set slot freed by shrinking is reused
        for &w in &ws {
            ix.apply_stored(w, &[3], 0.0);
        }
        assert_eq!(ix.pairs(), 5 + 1 + 5);
    }

    #[test]
    fn clear_snapshot_and_remove_worker() {
        let mut ix = KvIndex::new(0);
        let a = ix.upsert_worker("a", 16);
        let b = ix.upsert_worker("b", 16);
        let c = ix.upsert_worker("c", 16);
        ix.apply_stored(a, &[1, 2, 3], 0.0);
        ix.apply_stored(b, &[1, 2], 0.0);
        ix.apply_stored(c, &[1], 0.0);
        ix.clear(a, 1.0);
        assert_eq!(matches(&ix, &[1, 2, 3]), vec![(b, 2), (c, 1)]);
        assert_eq!(ix.distinct_blocks(), 2);
        ix.apply_snapshot(b, 5, &[7, 8], 2.0);
        assert_eq!(ix.worker(b).map(|s| (s.epoch, s.blocks)), Some((5, 2)));
        assert_eq!(matches(&ix, &[1, 2]), vec![(c, 1)]);
        assert_eq!(matches(&ix, &[7, 8]), vec![(b, 2)]);
        ix.remove_worker(b);
        assert!(matches(&ix, &[7]).is_empty());
        assert_eq!(
            ix.apply_stored(b, &[7], 3.0),
            0,
            "removed workers take no blocks"
        );
        assert_eq!(ix.pairs(), 1);
        assert_eq!(
            ix.upsert_worker("b", 16),
            b,
            "a returning worker keeps its id"
        );
        assert_eq!(ix.apply_stored(b, &[7], 3.0), 1);
    }

    #[test]
    fn staleness_by_age_and_mark() {
        let mut ix = KvIndex::new(0);
        let a = ix.upsert_worker("a", 16);
        assert!(ix.is_stale(a, 0.0, 5.0), "never reported");
        ix.touch(a, 10.0);
        assert!(!ix.is_stale(a, 14.0, 5.0));
        assert!(ix.is_stale(a, 15.5, 5.0));
        ix.mark_stale(a);
        assert!(ix.is_stale(a, 10.0, 5.0));
        ix.apply_stored(a, &[1], 11.0);
        assert!(!ix.is_stale(a, 11.0, 5.0));
        assert!(ix.is_stale(WorkerId(99), 0.0, 5.0));
    }

    #[test]
    fn unknown_workers_are_ignored() {
        let mut ix = KvIndex::new(0);
        assert_eq!(ix.apply_stored(WorkerId(3), &[1], 0.0), 0);
        assert_eq!(ix.apply_removed(WorkerId(3), &[1], 0.0), 0);
        ix.clear(WorkerId(3), 0.0);
        ix.apply_snapshot(WorkerId(3), 1, &[1], 0.0);
        ix.remove_worker(WorkerId(3));
        assert_eq!(ix.distinct_blocks(), 0);
    }

    /// Random stores, removals, clears and snapshots over `active` workers (of `total`
    /// registered), checking every lookup and count against per-worker hash sets.
    fn random_against_naive(seed: u64, total: usize, active: &[usize], steps: u64) {
        use std::collections::HashSet;
        let mut state = seed;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let mut ix = KvIndex::new(seed ^ 11);
        let all: Vec<WorkerId> = (0..total)
            .map(|i| ix.upsert_worker(&format!("w{i}"), 16))
            .collect();
        let ws: Vec<WorkerId> = active.iter().map(|&i| all[i]).collect();
        let mut naive: Vec<HashSet<u64>> = vec![HashSet::new(); ws.len()];
        let chain: Vec<u64> = (100..140).collect();
        for step in 0..steps {
            let w = next(ws.len() as u64) as usize;
            match next(10) {
                0..=4 => {
                    // store a prefix of the chain, sometimes starting mid-chain (a gap)
                    let from = if next(4) == 0 { next(20) as usize } else { 0 };
                    let to = from + next(20) as usize;
                    ix.apply_stored(ws[w], &chain[from..to], 0.0);
                    naive[w].extend(&chain[from..to]);
                }
                5..=7 => {
                    let h = chain[next(40) as usize];
                    ix.apply_removed(ws[w], &[h], 0.0);
                    naive[w].remove(&h);
                }
                8 => {
                    if next(8) == 0 {
                        ix.clear(ws[w], 0.0);
                        naive[w].clear();
                    }
                }
                _ => {
                    let blocks: Vec<u64> = (0..next(5)).map(|_| chain[next(40) as usize]).collect();
                    ix.apply_snapshot(ws[w], step, &blocks, 0.0);
                    naive[w] = blocks.into_iter().collect();
                }
            }
            let start = next(3) as usize;
            let query = &chain[start..];
            let depth = |set: &HashSet<u64>| query.iter().take_while(|h| set.contains(h)).count();
            let mut want: Vec<(WorkerId, usize)> = ws
                .iter()
                .zip(&naive)
                .map(|(&w, set)| (w, depth(set)))
                .filter(|&(_, n)| n > 0)
                .collect();
            want.sort();
            ix.check_invariants();
            assert_eq!(matches(&ix, query), want, "step {step}");
            let probe = next(ws.len() as u64) as usize;
            assert_eq!(ix.matched_blocks(ws[probe], query), depth(&naive[probe]));
            let pairs: usize = naive.iter().map(HashSet::len).sum();
            assert_eq!(ix.pairs(), pairs as u64);
        }
    }

    #[test]
    fn random_operations_match_a_naive_model() {
        // few workers: every set of 3+ is a bitset
        random_against_naive(0x5eed, 7, &[0, 1, 2, 3, 4, 5, 6], 3_000);
    }

    #[test]
    fn random_operations_match_a_naive_model_with_sparse_ids() {
        // high, sparse ids: sets start as sorted lists and switch to bitsets past 8 members
        let active: Vec<usize> = (0..24).map(|i| i * 11 + 3).collect();
        random_against_naive(0xfeed, 300, &active, 3_000);
    }

    #[test]
    fn random_operations_match_a_naive_model_many_workers() {
        // wide bitsets (several words) narrowing word by word
        let active: Vec<usize> = (0..90).collect();
        random_against_naive(0xbeef, 90, &active, 2_000);
    }

    /// A chain of `n` block hashes, distinct per `seed` (sharing nothing with other seeds).
    fn ch(seed: u64, n: usize) -> Vec<u64> {
        (0..n as u64)
            .map(|i| fold(seed * 1_000_003 + i + 1))
            .collect()
    }

    #[test]
    fn a_chain_stored_in_batches_is_one_run() {
        let mut ix = KvIndex::new(5);
        let a = ix.upsert_worker("a", 16);
        let c = ch(1, 200);
        for b in c.chunks(16) {
            ix.apply_stored(a, b, 0.0);
        }
        assert_eq!(ix.run_count(), 1);
        assert_eq!(matches(&ix, &c), vec![(a, 200)]);
        ix.check_invariants();
    }

    #[test]
    fn a_run_splits_where_a_holder_set_diverges() {
        let mut ix = KvIndex::new(5);
        let a = ix.upsert_worker("a", 16);
        let b = ix.upsert_worker("b", 16);
        let c = ch(1, 100);
        ix.apply_stored(a, &c, 0.0);
        // b holds blocks 40..60 only: not a prefix of the run, which splits around them
        ix.apply_stored(b, &c[40..60], 0.0);
        ix.check_invariants();
        assert_eq!(
            ix.run_count(),
            2,
            "cut at 40; b's blocks are a prefix of the tail"
        );
        assert_eq!(matches(&ix, &c), vec![(a, 100)]);
        assert_eq!(matches(&ix, &c[40..]), vec![(a, 60), (b, 20)]);
        assert_eq!(ix.matched_blocks(b, &c[40..]), 20);
        // b fills the gap from the start: its holding of the first run becomes a prefix
        ix.apply_stored(b, &c[..40], 0.0);
        ix.check_invariants();
        assert_eq!(matches(&ix, &c), vec![(a, 100), (b, 60)]);
    }

    #[test]
    fn removal_from_the_middle_of_a_run() {
        let mut ix = KvIndex::new(5);
        let a = ix.upsert_worker("a", 16);
        let b = ix.upsert_worker("b", 16);
        let c = ch(2, 64);
        ix.apply_stored(a, &c, 0.0);
        ix.apply_stored(b, &c, 0.0);
        assert_eq!(ix.apply_removed(a, &[c[20]], 1.0), 1);
        ix.check_invariants();
        assert_eq!(matches(&ix, &c), vec![(a, 20), (b, 64)]);
        assert_eq!(matches(&ix, &c[21..]), vec![(a, 43), (b, 43)]);
        assert_eq!(ix.distinct_blocks(), 64, "b still holds the block");
        assert_eq!(ix.apply_removed(b, &[c[20]], 1.0), 1);
        ix.check_invariants();
        assert_eq!(ix.distinct_blocks(), 63);
        assert_eq!(matches(&ix, &c), vec![(a, 20), (b, 20)]);
        assert_eq!(ix.apply_removed(b, &[c[20]], 1.0), 0, "already gone");
    }

    #[test]
    fn evicting_a_runs_tail_drops_its_blocks() {
        let mut ix = KvIndex::new(5);
        let a = ix.upsert_worker("a", 16);
        let b = ix.upsert_worker("b", 16);
        let c = ch(3, 50);
        ix.apply_stored(a, &c, 0.0);
        ix.apply_stored(b, &c[..10], 0.0);
        for h in c[10..].iter().rev() {
            assert_eq!(ix.apply_removed(a, &[*h], 1.0), 1);
            ix.check_invariants();
        }
        assert_eq!(ix.distinct_blocks(), 10);
        assert_eq!(matches(&ix, &c), vec![(a, 10), (b, 10)]);
        // the worker's next blocks extend the run again
        ix.apply_stored(a, &c[10..20], 2.0);
        ix.check_invariants();
        assert_eq!(matches(&ix, &c), vec![(a, 20), (b, 10)]);
        for &h in c.iter().rev() {
            ix.apply_removed(a, &[h], 3.0);
            ix.apply_removed(b, &[h], 3.0);
        }
        ix.check_invariants();
        assert_eq!(
            (ix.distinct_blocks(), ix.pairs(), ix.run_count()),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_chain_shared_by_many_workers_at_different_depths() {
        let mut ix = KvIndex::new(5);
        let c = ch(4, 300);
        let ws: Vec<WorkerId> = (0..120)
            .map(|i| ix.upsert_worker(&format!("w{i}"), 16))
            .collect();
        for (i, &w) in ws.iter().enumerate() {
            let depth = (i * 37) % 301;
            for b in c[..depth].chunks(16) {
                ix.apply_stored(w, b, 0.0);
            }
            // unrelated blocks after the chain, as a busy worker stores them
            ix.apply_stored(w, &ch(1_000 + i as u64, 20), 0.0);
        }
        ix.check_invariants();
        let want: Vec<(WorkerId, usize)> = ws
            .iter()
            .enumerate()
            .map(|(i, &w)| (w, (i * 37) % 301))
            .filter(|&(_, d)| d > 0)
            .collect();
        // twice: the second lookup uses the by-end summaries built by the first
        assert_eq!(matches(&ix, &c), want);
        assert_eq!(matches(&ix, &c), want);
        for (i, &w) in ws.iter().enumerate() {
            assert_eq!(ix.matched_blocks(w, &c), (i * 37) % 301);
        }
        // a shorter query and one starting mid-chain
        let short: Vec<(WorkerId, usize)> = want.iter().map(|&(w, d)| (w, d.min(100))).collect();
        assert_eq!(matches(&ix, &c[..100]), short);
        let mid: Vec<(WorkerId, usize)> = want
            .iter()
            .filter(|&&(_, d)| d > 150)
            .map(|&(w, d)| (w, d - 150))
            .collect();
        assert_eq!(matches(&ix, &c[150..]), mid);
    }

    #[test]
    fn snapshots_and_clear_replace_runs() {
        let mut ix = KvIndex::new(5);
        let ws: Vec<WorkerId> = (0..20)
            .map(|i| ix.upsert_worker(&format!("w{i}"), 16))
            .collect();
        let c = ch(5, 80);
        for &w in &ws {
            ix.apply_stored(w, &c, 0.0);
        }
        // a snapshot in no particular order, sharing half the chain
        let mut snap: Vec<u64> = c[..40].iter().rev().copied().collect();
        snap.extend(ch(6, 10));
        ix.apply_snapshot(ws[3], 2, &snap, 1.0);
        ix.check_invariants();
        let got = matches(&ix, &c);
        assert_eq!(got.len(), 20);
        assert!(
            got.iter()
                .all(|&(w, d)| d == if w == ws[3] { 40 } else { 80 })
        );
        assert_eq!(matches(&ix, &ch(6, 10)), vec![(ws[3], 10)]);
        for (i, &w) in ws[..19].iter().enumerate() {
            if i != 3 {
                ix.clear(w, 2.0);
                ix.check_invariants();
            }
        }
        assert_eq!(matches(&ix, &c), vec![(ws[3], 40), (ws[19], 80)]);
        ix.remove_worker(ws[19]);
        ix.check_invariants();
        assert_eq!(matches(&ix, &c), vec![(ws[3], 40)]);
        assert_eq!(ix.pairs(), 50);
    }

    /// vLLM-like traffic against per-worker hash sets: conversations on a few shared system
    /// prompts, stored in batches that follow their chains (interleaved between requests),
    /// evicted leaf first or at random, plus clears, shuffled snapshots and worker removal.
    /// After every step the lookups of several prompts agree with the model and the layout's
    /// invariants hold.
    fn chains_against_naive(seed: u64, workers: usize, steps: usize) {
        use std::collections::HashSet;
        let mut state = seed;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n.max(1)
        };
        // prompts: a system prefix (one of 3) followed by a private part
        let prefixes: Vec<Vec<u64>> = (0..3).map(|p| ch(900 + p, 8 + 8 * p as usize)).collect();
        let prompts: Vec<Vec<u64>> = (0..24u64)
            .map(|i| {
                let mut v = prefixes[(i % 3) as usize].clone();
                // chained hashes: the private part depends on the prefix it follows
                v.extend(ch(2_000 + i, 10 + (i as usize * 7) % 40));
                v
            })
            .collect();
        let mut ix = KvIndex::new(seed);
        let ws: Vec<WorkerId> = (0..workers)
            .map(|i| ix.upsert_worker(&format!("w{i}"), 16))
            .collect();
        let mut naive: Vec<HashSet<u64>> = vec![HashSet::new(); workers];
        let mut removed = vec![false; workers];
        let mut out = Vec::new();
        for step in 0..steps {
            let w = next(workers as u64) as usize;
            let p = &prompts[next(prompts.len() as u64) as usize];
            match next(20) {
                0..=9 => {
                    // a request's blocks, in batches from some depth, following the chain
                    let from = next(p.len() as u64 / 2) as usize;
                    let to = from + next((p.len() - from) as u64 + 1) as usize;
                    for b in p[from..to].chunks(1 + next(16) as usize) {
                        ix.apply_stored(ws[w], b, 0.0);
                        if !removed[w] {
                            naive[w].extend(b);
                        }
                    }
                }
                10..=13 => {
                    // leaf-first eviction of a chain's tail
                    let n = next(12) as usize;
                    for &h in p.iter().rev().take(n) {
                        ix.apply_removed(ws[w], &[h], 0.0);
                        naive[w].remove(&h);
                    }
                }
                14..=15 => {
                    let h = p[next(p.len() as u64) as usize];
                    ix.apply_removed(ws[w], &[h], 0.0);
                    naive[w].remove(&h);
                }
                16 => {
                    ix.clear(ws[w], 0.0);
                    naive[w].clear();
                }
                17 | 18 => {
                    let mut blocks: Vec<u64> = naive[w].iter().copied().collect();
                    blocks.sort_unstable();
                    blocks.truncate(next(blocks.len() as u64 + 1) as usize);
                    blocks.extend(p.iter().take(next(p.len() as u64) as usize));
                    ix.apply_snapshot(ws[w], step as u64, &blocks, 0.0);
                    naive[w] = if removed[w] {
                        HashSet::new()
                    } else {
                        blocks.into_iter().collect()
                    };
                }
                _ => {
                    if removed[w] {
                        ix.upsert_worker(&format!("w{w}"), 16);
                        removed[w] = false;
                    } else if next(4) == 0 {
                        ix.remove_worker(ws[w]);
                        naive[w].clear();
                        removed[w] = true;
                    }
                }
            }
            ix.check_invariants();
            for _ in 0..3 {
                let q = &prompts[next(prompts.len() as u64) as usize];
                let q = &q[next(3) as usize..];
                let depth = |set: &HashSet<u64>| q.iter().take_while(|h| set.contains(h)).count();
                let mut want: Vec<(WorkerId, usize)> = ws
                    .iter()
                    .zip(&naive)
                    .map(|(&w, set)| (w, depth(set)))
                    .filter(|&(_, n)| n > 0)
                    .collect();
                want.sort();
                ix.match_prefix(q, &mut out);
                out.sort();
                assert_eq!(out, want, "step {step}");
                let probe = next(workers as u64) as usize;
                assert_eq!(ix.matched_blocks(ws[probe], q), depth(&naive[probe]));
            }
        }
    }

    #[test]
    fn chained_traffic_matches_a_naive_model() {
        chains_against_naive(0xc0ffee, 5, 3_000);
    }

    #[test]
    fn chained_traffic_matches_a_naive_model_many_workers() {
        // enough holders per run for the by-end summaries and the bitset narrowing
        chains_against_naive(0xdecade, 60, 1_500);
    }

    #[test]
    fn memory_estimate_grows_with_blocks() {
        let mut ix = KvIndex::new(0);
        let a = ix.upsert_worker("a", 16);
        let blocks: Vec<u64> = (0..10_000).collect();
        ix.apply_stored(a, &blocks, 0.0);
        let per_pair = ix.memory_bytes() as f64 / ix.pairs() as f64;
        assert!(per_pair > 16.0 && per_pair < 64.0, "{per_pair}");
    }
}
