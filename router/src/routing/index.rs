//! The KV index: which worker holds which kvroute block, and how many leading blocks of a
//! prompt each worker holds.
//!
//! ```text
//! blocks: block hash --> holders (1-2 workers inline in 8 bytes, else a sorted id list or
//!         a bitset, whichever is smaller), in an open-addressing table of 16-byte slots
//! workers[WorkerId]  --> key, block size, epoch, last update, block count, stale flag
//! ```
//!
//! One global map keyed by block hash, not one map per worker: a lookup walks the prompt's
//! chain once and narrows the set of workers still matching, so its cost is proportional to
//! the matched prefix (times the workers matching it), never to the size of the pool. The
//! price is that dropping all of one worker's blocks (`clear`, a replacing snapshot,
//! `remove_worker`) scans the whole map; those happen on restarts and reconnects, not per
//! request, and are skipped for a worker that holds nothing.

use std::collections::HashMap;

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

/// Sentinel in the packed holder word: "no second worker" (high half) or "the low half is a
/// set index" (low half).
const NONE: u32 = u32::MAX;

/// Holders of one block packed in a `u64`: `lo | hi << 32`.
/// - `lo != NONE`: worker `lo`, plus worker `hi` unless `hi == NONE`.
/// - `lo == NONE`: `hi` indexes `KvIndex::sets` (a sorted set of 3 or more workers).
#[derive(Clone, Copy)]
struct Packed(u64);

impl Packed {
    fn one(w: u32) -> Self {
        Packed(u64::from(w) | (u64::from(NONE) << 32))
    }
    fn two(a: u32, b: u32) -> Self {
        let (a, b) = if a < b { (a, b) } else { (b, a) };
        Packed(u64::from(a) | (u64::from(b) << 32))
    }
    fn set(i: u32) -> Self {
        Packed(u64::from(NONE) | (u64::from(i) << 32))
    }
    fn lo(self) -> u32 {
        self.0 as u32
    }
    fn hi(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// Mixes a block key (hash XOR the per-index seed) into a table position: a multiply-fold
/// spreads every input bit, so crafted prompts cannot target slots without knowing the seed.
fn fold(v: u64) -> u64 {
    let m = u128::from(v) * 0x9E37_79B9_7F4A_7C15_u128;
    (m as u64) ^ ((m >> 64) as u64)
}

/// The block map: open addressing with linear probing over `(key, holders)` slots of 16
/// bytes, one cache line for most probes. The capacity is not a power of two (the home slot
/// is a multiply-shift of the keyed [`fold`]), so the table grows by half at 80% load and
/// stays between 53% and 80% full: at most 30 bytes per block held by one or two workers.
/// Removal shifts the following slots back (no tombstones). Key 0 marks an empty slot; a
/// block whose key is 0 lives in `zero`.
#[derive(Default)]
struct BlockTable {
    slots: Vec<(u64, Packed)>,
    len: usize,
    zero: Option<Packed>,
}

const EMPTY: (u64, Packed) = (0, Packed(0));

impl BlockTable {
    fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    fn home(&self, key: u64) -> usize {
        ((u128::from(fold(key)) * self.slots.len() as u128) >> 64) as usize
    }

    /// `Ok(slot)` holding `key`, or `Err(empty slot)` where it would go. Needs a free slot.
    fn find(&self, key: u64) -> Result<usize, usize> {
        let cap = self.slots.len();
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].0;
            if k == key {
                return Ok(i);
            }
            if k == 0 {
                return Err(i);
            }
            i += 1;
            if i == cap {
                i = 0;
            }
        }
    }

    fn get(&self, key: u64) -> Option<Packed> {
        if key == 0 {
            return self.zero;
        }
        if self.slots.is_empty() {
            return None;
        }
        self.find(key).ok().map(|i| self.slots[i].1)
    }

    fn get_mut(&mut self, key: u64) -> Option<&mut Packed> {
        if key == 0 {
            return self.zero.as_mut();
        }
        if self.slots.is_empty() {
            return None;
        }
        match self.find(key) {
            Ok(i) => Some(&mut self.slots[i].1),
            Err(_) => None,
        }
    }

    /// The holders of `key`, inserting `v` first if absent (then `true`).
    fn get_or_insert(&mut self, key: u64, v: Packed) -> (&mut Packed, bool) {
        if key == 0 {
            let new = self.zero.is_none();
            return (self.zero.get_or_insert(v), new);
        }
        if (self.len + 1) * 5 > self.slots.len() * 4 {
            self.grow();
        }
        match self.find(key) {
            Ok(i) => (&mut self.slots[i].1, false),
            Err(i) => {
                self.slots[i] = (key, v);
                self.len += 1;
                (&mut self.slots[i].1, true)
            }
        }
    }

    fn grow(&mut self) {
        let cap = (self.slots.len() * 3 / 2).max(16);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; cap]);
        for (k, v) in old {
            if k != 0
                && let Err(i) = self.find(k)
            {
                self.slots[i] = (k, v);
            }
        }
    }

    fn remove(&mut self, key: u64) {
        if key == 0 {
            self.zero = None;
        } else if !self.slots.is_empty()
            && let Ok(i) = self.find(key)
        {
            self.remove_at(i);
        }
    }

    /// Empties slot `hole`, moving back each following slot that may live there.
    fn remove_at(&mut self, mut hole: usize) {
        let cap = self.slots.len();
        let mut j = hole;
        loop {
            j = if j + 1 == cap { 0 } else { j + 1 };
            let k = self.slots[j].0;
            if k == 0 {
                break;
            }
            let home = self.home(k);
            // the entry at j may move to the hole iff the hole lies between its home and j
            if (j + cap - home) % cap >= (j + cap - hole) % cap {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
    }

    /// Keeps the entries for which `f` returns true, visiting each once: the scan starts after
    /// an empty slot, and a removal only pulls back entries not yet visited.
    fn retain(&mut self, mut f: impl FnMut(&mut Packed) -> bool) {
        if let Some(p) = &mut self.zero
            && !f(p)
        {
            self.zero = None;
        }
        let cap = self.slots.len();
        let Some(start) = self.slots.iter().position(|s| s.0 == 0) else {
            return;
        };
        let mut step = 1;
        while step <= cap {
            let i = (start + step) % cap;
            if self.slots[i].0 != 0 && !f(&mut self.slots[i].1) {
                self.remove_at(i);
                continue;
            }
            step += 1;
        }
    }

    fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<(u64, Packed)>()
    }
}

/// Per-worker resident block sets for many workers, with leading-prefix lookup.
pub struct KvIndex {
    /// Mixed into every key so that bucket positions depend on a per-process seed.
    seed: u64,
    blocks: BlockTable,
    sets: Vec<HolderSet>,
    free_sets: Vec<u32>,
    workers: Vec<WorkerState>,
    by_key: HashMap<String, WorkerId>,
    pairs: u64,
}

impl Default for KvIndex {
    fn default() -> Self {
        Self::new(0)
    }
}

impl KvIndex {
    /// An empty index; `seed` (e.g. drawn at start-up) keys the block-map hasher.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            blocks: BlockTable::default(),
            sets: Vec::new(),
            free_sets: Vec::new(),
            workers: Vec::new(),
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
                .unwrap_or(NONE - 1)
                .min(NONE - 1),
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
        let wid = w.0;
        let mut added = 0;
        for &h in blocks {
            let key = h ^ self.seed;
            let new = match self.blocks.get_or_insert(key, Packed::one(wid)) {
                (_, true) => true,
                (p, false) => insert_holder(p, wid, &mut self.sets, &mut self.free_sets),
            };
            added += usize::from(new);
        }
        self.pairs += added as u64;
        let st = &mut self.workers[w.index()];
        st.blocks += added as u64;
        self.touch(w, now);
        added
    }

    /// Removes blocks from the worker; unknown ones are ignored. Returns how many it held.
    pub fn apply_removed(&mut self, w: WorkerId, blocks: &[u64], now: f64) -> usize {
        if self.worker(w).is_none() {
            return 0;
        }
        let mut removed = 0;
        for &h in blocks {
            let key = h ^ self.seed;
            let Some(p) = self.blocks.get_mut(key) else {
                continue;
            };
            let (was, empty) = remove_holder(p, w.0, &mut self.sets, &mut self.free_sets);
            if empty {
                self.blocks.remove(key);
            }
            removed += usize::from(was);
        }
        self.pairs -= removed as u64;
        self.workers[w.index()].blocks -= removed as u64;
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
        let st = &mut self.workers[w.index()];
        if st.blocks == 0 {
            return;
        }
        let dropped = st.blocks;
        st.blocks = 0;
        let sets = &mut self.sets;
        let free = &mut self.free_sets;
        self.blocks.retain(|p| !remove_holder(p, w.0, sets, free).1);
        self.pairs -= dropped;
    }

    /// For the chain `hashes` (block 1 first), writes `(worker, n)` for every worker holding
    /// the first `n >= 1` blocks (leading blocks only: a gap ends a worker's match). `out` is
    /// cleared first; order is unspecified. Cost: one map probe per block until no worker
    /// matches any more.
    pub fn match_prefix(&self, hashes: &[u64], out: &mut Vec<(WorkerId, usize)>) {
        out.clear();
        let Some((&first, rest)) = hashes.split_first() else {
            return;
        };
        let Some(p) = self.blocks.get(first ^ self.seed) else {
            return;
        };
        let words = self.workers.len() / 32 + 1;
        let (len, fp) = summary(p, &self.sets);
        let mut live = Live {
            bits: vec![0; words],
            next: vec![0; words],
            len,
            fp,
        };
        for_each_holder(p, &self.sets, |w| set_bit(&mut live.bits, w));
        // Blocks matched so far by every worker still live.
        let mut depth = 1;
        let mut prev = p;
        for &h in rest {
            let Some(p) = self.blocks.get(h ^ self.seed) else {
                break;
            };
            // The same holder word as the previous block (same inline workers or the same
            // set slot, read at one moment) is the same set: nothing to compare.
            if p.0 == prev.0 {
                depth += 1;
                continue;
            }
            prev = p;
            // Along a chain the holder set rarely changes from one block to the next; an
            // equal (size, fingerprint) pair means the same set, so the step costs O(1).
            // Otherwise the live set narrows by whole bitset words, and only the workers
            // that drop out cost anything more: O(prompt + workers), not their product.
            let (len, fp) = summary(p, &self.sets);
            if len != live.len || fp != live.fp {
                live.narrow(p, &self.sets, depth, out);
                if live.len == 0 {
                    break;
                }
            }
            depth += 1;
        }
        for_each_bit(&live.bits, |w| out.push((WorkerId(w), depth)));
    }

    /// Leading blocks of `hashes` that one worker holds.
    pub fn matched_blocks(&self, w: WorkerId, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|&&h| {
                self.blocks
                    .get(h ^ self.seed)
                    .is_some_and(|p| holds(p, w.0, &self.sets))
            })
            .count()
    }

    /// Number of distinct blocks held by anyone.
    pub fn distinct_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Number of (block, worker) pairs.
    pub fn pairs(&self) -> u64 {
        self.pairs
    }

    /// Heap bytes of the block structures (block table slots + holder sets), computed from
    /// their capacities.
    pub fn memory_bytes(&self) -> usize {
        let sets: usize = self.sets.iter().map(|s| s.data.capacity() * 4).sum();
        self.blocks.heap_bytes()
            + self.sets.capacity() * std::mem::size_of::<HolderSet>()
            + sets
            + self.free_sets.capacity() * 4
    }
}

/// Holders of a block held by three or more workers, with the XOR of their [`member_fp`]s
/// (kept in step, so that lookups compare sets in O(1)). Small sets are sorted ids; once ids
/// would take more room than a bitset over the ids seen, the set becomes a bitset (so a block
/// held by most of 1,000 workers costs 128 bytes, and lookups narrow by whole words).
#[derive(Default)]
struct HolderSet {
    fp: u64,
    len: u32,
    bits: bool,
    /// Sorted worker ids, or (when `bits`) a bitset in 32-bit words.
    data: Vec<u32>,
}

impl HolderSet {
    fn from_three(a: u32, b: u32, c: u32) -> Self {
        let mut data = vec![a, b, c];
        data.sort_unstable();
        HolderSet {
            fp: member_fp(a) ^ member_fp(b) ^ member_fp(c),
            len: 3,
            bits: false,
            data,
        }
    }

    fn contains(&self, w: u32) -> bool {
        if self.bits {
            test_bit(&self.data, w)
        } else {
            self.data.binary_search(&w).is_ok()
        }
    }

    fn for_each(&self, mut f: impl FnMut(u32)) {
        if self.bits {
            for_each_bit(&self.data, f);
        } else {
            self.data.iter().for_each(|&w| f(w));
        }
    }

    /// Adds `w`; returns whether it was new.
    fn insert(&mut self, w: u32) -> bool {
        if self.bits {
            let word = (w / 32) as usize;
            if word >= self.data.len() {
                self.data.resize(word + 1, 0);
            }
            let mask = 1u32 << (w % 32);
            if self.data[word] & mask != 0 {
                return false;
            }
            self.data[word] |= mask;
        } else {
            let Err(pos) = self.data.binary_search(&w) else {
                return false;
            };
            self.data.insert(pos, w);
            let max = self.data.last().copied().unwrap_or(0);
            if self.data.len() > words_for(max) {
                let mut bits = vec![0u32; words_for(max)];
                for &m in &self.data {
                    bits[(m / 32) as usize] |= 1 << (m % 32);
                }
                self.data = bits;
                self.bits = true;
            }
        }
        self.len += 1;
        self.fp ^= member_fp(w);
        true
    }

    /// Removes `w`; returns whether it was there.
    fn remove(&mut self, w: u32) -> bool {
        if self.bits {
            let mask = 1u32 << (w % 32);
            match self.data.get_mut((w / 32) as usize) {
                Some(word) if *word & mask != 0 => *word &= !mask,
                _ => return false,
            }
            self.len -= 1;
            if (self.len as usize) * 2 < self.data.len() {
                let mut ids = Vec::with_capacity(self.len as usize);
                for_each_bit(&self.data, |m| ids.push(m));
                self.data = ids;
                self.bits = false;
            }
        } else {
            let Ok(pos) = self.data.binary_search(&w) else {
                return false;
            };
            self.data.remove(pos);
            self.len -= 1;
        }
        self.fp ^= member_fp(w);
        true
    }

    /// The two members of a two-member set.
    fn pair(&self) -> Option<(u32, u32)> {
        if self.len != 2 {
            return None;
        }
        let mut it = [NONE; 2];
        let mut n = 0;
        self.for_each(|m| {
            if n < 2 {
                it[n] = m;
            }
            n += 1;
        });
        Some((it[0], it[1]))
    }
}

/// 32-bit words of a bitset holding ids up to `max`.
fn words_for(max: u32) -> usize {
    (max / 32) as usize + 1
}

fn test_bit(words: &[u32], w: u32) -> bool {
    words
        .get((w / 32) as usize)
        .is_some_and(|x| x & (1 << (w % 32)) != 0)
}

fn set_bit(words: &mut [u32], w: u32) {
    if let Some(x) = words.get_mut((w / 32) as usize) {
        *x |= 1 << (w % 32);
    }
}

fn for_each_bit(words: &[u32], mut f: impl FnMut(u32)) {
    for (i, &word) in words.iter().enumerate() {
        let mut x = word;
        while x != 0 {
            f(i as u32 * 32 + x.trailing_zeros());
            x &= x - 1;
        }
    }
}

/// A worker's contribution to a set fingerprint.
fn member_fp(w: u32) -> u64 {
    fold(u64::from(w) ^ 0xA076_1D64_78BD_642F)
}

/// (number of holders, fingerprint) of a block.
fn summary(p: Packed, sets: &[HolderSet]) -> (usize, u64) {
    if p.lo() == NONE {
        sets.get(p.hi() as usize)
            .map_or((0, 0), |s| (s.len as usize, s.fp))
    } else if p.hi() == NONE {
        (1, member_fp(p.lo()))
    } else {
        (2, member_fp(p.lo()) ^ member_fp(p.hi()))
    }
}

/// The workers still matching a chain, as a bitset over worker ids, with their count and
/// fingerprint; `next` is scratch of the same width.
struct Live {
    bits: Vec<u32>,
    next: Vec<u32>,
    len: usize,
    fp: u64,
}

impl Live {
    /// Keeps the live workers that also hold block `p`; the others are written to `out`
    /// with `depth` as their match. Cost: O(bitset words + holders of `p` if a list + dropped).
    fn narrow(
        &mut self,
        p: Packed,
        sets: &[HolderSet],
        depth: usize,
        out: &mut Vec<(WorkerId, usize)>,
    ) {
        let next = &mut self.next;
        let set = (p.lo() == NONE)
            .then(|| sets.get(p.hi() as usize))
            .flatten();
        let mut len = 0;
        let mut drop_word = |i: usize, was: u32, now: u32| {
            len += now.count_ones() as usize;
            let mut gone = was & !now;
            while gone != 0 {
                let w = i as u32 * 32 + gone.trailing_zeros();
                out.push((WorkerId(w), depth));
                self.fp ^= member_fp(w);
                gone &= gone - 1;
            }
        };
        match set {
            Some(s) if s.bits => {
                // one pass: intersect word by word, emitting the workers that drop out
                let held = s.data.iter().copied().chain(std::iter::repeat(0));
                for (i, ((n, &was), h)) in next.iter_mut().zip(&self.bits).zip(held).enumerate() {
                    *n = was & h;
                    if was != 0 {
                        drop_word(i, was, *n);
                    }
                }
            }
            set => {
                next.fill(0);
                let mut keep = |w: u32| {
                    if test_bit(&self.bits, w) {
                        set_bit(next, w);
                    }
                };
                match set {
                    Some(s) => s.data.iter().for_each(|&w| keep(w)),
                    None if p.lo() == NONE => {}
                    None => {
                        keep(p.lo());
                        if p.hi() != NONE {
                            keep(p.hi());
                        }
                    }
                }
                for (i, (&was, &now)) in self.bits.iter().zip(next.iter()).enumerate() {
                    if was != 0 {
                        drop_word(i, was, now);
                    }
                }
            }
        }
        self.len = len;
        std::mem::swap(&mut self.bits, &mut self.next);
    }
}

fn for_each_holder(p: Packed, sets: &[HolderSet], mut f: impl FnMut(u32)) {
    if p.lo() == NONE {
        if let Some(s) = sets.get(p.hi() as usize) {
            s.for_each(f);
        }
    } else {
        f(p.lo());
        if p.hi() != NONE {
            f(p.hi());
        }
    }
}

fn holds(p: Packed, w: u32, sets: &[HolderSet]) -> bool {
    if p.lo() == NONE {
        sets.get(p.hi() as usize).is_some_and(|s| s.contains(w))
    } else {
        p.lo() == w || p.hi() == w
    }
}

/// Adds `w`; returns whether it was new.
fn insert_holder(p: &mut Packed, w: u32, sets: &mut Vec<HolderSet>, free: &mut Vec<u32>) -> bool {
    let (lo, hi) = (p.lo(), p.hi());
    if lo != NONE {
        if lo == w || hi == w {
            return false;
        }
        if hi == NONE {
            *p = Packed::two(lo, w);
            return true;
        }
        let set = HolderSet::from_three(lo, hi, w);
        let i = match free.pop() {
            Some(i) => {
                sets[i as usize] = set;
                i
            }
            None => {
                sets.push(set);
                (sets.len() - 1) as u32
            }
        };
        *p = Packed::set(i);
        return true;
    }
    sets.get_mut(hi as usize).is_some_and(|s| s.insert(w))
}

/// Removes `w`; returns (whether it was there, whether the block has no holder left).
fn remove_holder(
    p: &mut Packed,
    w: u32,
    sets: &mut [HolderSet],
    free: &mut Vec<u32>,
) -> (bool, bool) {
    let (lo, hi) = (p.lo(), p.hi());
    if lo != NONE {
        if lo == w {
            if hi == NONE {
                return (true, true);
            }
            *p = Packed::one(hi);
            return (true, false);
        }
        if hi == w {
            *p = Packed::one(lo);
            return (true, false);
        }
        return (false, false);
    }
    let Some(s) = sets.get_mut(hi as usize) else {
        return (false, false);
    };
    if !s.remove(w) {
        return (false, false);
    }
    if let Some((a, b)) = s.pair() {
        *p = Packed::two(a, b);
        *s = HolderSet::default();
        free.push(hi);
    }
    (true, false)
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

    #[test]
    fn block_table_matches_a_hash_map() {
        use std::collections::HashMap;
        let mut state = 0x7ab1e_u64;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let mut t = BlockTable::default();
        let mut m: HashMap<u64, u64> = HashMap::new();
        for step in 0..20_000u64 {
            // few distinct keys (0 included) so that clusters form, wrap and shrink
            let key = next(300);
            match next(8) {
                0..=3 => {
                    let (p, new) = t.get_or_insert(key, Packed(step));
                    assert_eq!(new, !m.contains_key(&key));
                    if !new {
                        p.0 = step;
                    }
                    m.insert(key, step);
                }
                4..=6 => {
                    t.remove(key);
                    m.remove(&key);
                }
                _ => {
                    let cut = next(300);
                    t.retain(|p| p.0 % 300 < cut);
                    m.retain(|_, v| *v % 300 < cut);
                }
            }
            assert_eq!(t.len(), m.len(), "step {step}");
            let probe = next(300);
            assert_eq!(t.get(probe).map(|p| p.0), m.get(&probe).copied());
        }
        for (k, v) in &m {
            assert_eq!(t.get(*k).map(|p| p.0), Some(*v));
        }
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
