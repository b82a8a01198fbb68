//! `cargo run --release` (in bench/dynamo-compare): feeds one synthetic KV event stream and
//! one query set to kvroute's `KvIndex` and to `dynamo_kv_router::RadixTree`, and prints
//! events/s, lookups/s, memory and the ratios.
//!
//! ```text
//! workload: W workers x C conversations x L blocks (a P-block system prefix shared by all)
//!   stores: BlockStored batches of 16 (parent = previous block), then removals leaf-first
//!   queries: 512- and 2,048-block chains that workers hold to various depths
//! ```
//!
//! Both indexes see the same blocks: kvroute keys by the chained hash (what vLLM's event and
//! kvroute's sidecar carry), Dynamo's tree by the per-block token hash under the chained
//! parent, exactly as their APIs take them. Events are converted to each index's input type
//! before the ingest clock starts; each query is prepared once in both forms;
//! Dynamo's `find_matches` takes its sequence by value, so it gets a clone per lookup.
//! Single thread, wall-clock timing, best of 7, the two indexes measured alternately.
#![allow(unsafe_code)] // the counting global allocator

#[path = "../../../router/src/routing/index.rs"]
#[allow(dead_code)]
mod index;

/// The worker ids the index keys its blocks by.
#[path = "../../../router/src/routing/workers.rs"]
#[allow(dead_code)]
mod workers;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: caller's contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: caller's contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: caller's contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// One block: its token-content hash and its chained hash.
#[derive(Clone, Copy)]
struct Block {
    local: u64,
    chained: u64,
}

/// A chain: block i's content is `mix(content_seed + i)` for i < shared, else private.
fn chain(shared_prefix: usize, private_seed: u64, len: usize) -> Vec<Block> {
    let mut parent = 0x1234_5678u64;
    (0..len)
        .map(|i| {
            let local = if i < shared_prefix {
                mix(i as u64)
            } else {
                mix(private_seed.wrapping_mul(1 << 20) + i as u64)
            };
            parent = mix(parent ^ local);
            Block {
                local,
                chained: parent,
            }
        })
        .collect()
}

/// One worker's store batch or removal.
enum Event {
    Store {
        worker: u32,
        parent: Option<u64>,
        blocks: Vec<Block>,
    },
    Remove {
        worker: u32,
        blocks: Vec<u64>,
    },
}

struct Workload {
    workers: u32,
    events: Vec<Event>,
    block_events: u64,
    queries: Vec<Query>,
}

/// A prompt's chain in the form each index takes, prepared once (the router hashes a prompt
/// once per request): kvroute's chained hashes, Dynamo's per-block token hashes.
struct Query {
    chained: Vec<u64>,
    local: Vec<LocalBlockHash>,
}

impl Query {
    fn new(blocks: &[Block]) -> Self {
        Query {
            chained: blocks.iter().map(|b| b.chained).collect(),
            local: blocks.iter().map(|b| LocalBlockHash(b.local)).collect(),
        }
    }
}

/// `spread`: worker w holds the query to depth `(w * 37) % (query_len + 1)` (every worker a
/// different depth: the radix tree's best case); otherwise two workers hold all of it and
/// the rest only the shared system prefix (a typical multi-turn pool).
fn workload(
    workers: u32,
    convs: u32,
    len: usize,
    prefix: usize,
    query_len: usize,
    spread: bool,
) -> Workload {
    let mut events = Vec::new();
    let mut block_events = 0;
    let query = chain(prefix, u64::MAX / 3, query_len);
    for w in 0..workers {
        let mut chains: Vec<Vec<Block>> = (0..convs)
            .map(|c| chain(prefix, u64::from(w) * 1_000 + u64::from(c), len))
            .collect();
        // Worker w also holds the query chain to depth (w * 37) % (query_len + 1).
        let depth = if spread {
            (w as usize * 37) % (query_len + 1)
        } else if w % 500 == 7 {
            query_len
        } else {
            prefix
        };
        chains.push(query[..depth].to_vec());
        for ch in &chains {
            let mut parent = None;
            for batch in ch.chunks(16) {
                events.push(Event::Store {
                    worker: w,
                    parent,
                    blocks: batch.to_vec(),
                });
                block_events += batch.len() as u64;
                parent = batch.last().map(|b| b.chained);
            }
        }
        {
            // Evict the private tail of the first conversation, leaf first.
            if let Some(ch) = chains.first() {
                for b in ch[prefix.min(ch.len())..].iter().rev() {
                    events.push(Event::Remove {
                        worker: w,
                        blocks: vec![b.chained],
                    });
                    block_events += 1;
                }
            }
        }
    }
    let queries = vec![Query::new(&query), Query::new(&query[..query_len / 4])];
    Workload {
        workers,
        events,
        block_events,
        queries,
    }
}

trait Indexer {
    /// Converts and applies one event (the memory pass).
    fn apply(&mut self, e: &Event);
    /// Converts `events` to the index's own input type, kept for [`Indexer::ingest`]
    /// (untimed: the router or Dynamo's event plane decodes events before indexing them).
    fn prepare(&mut self, events: &[Event]);
    /// Applies the prepared events (timed).
    fn ingest(&mut self);
    /// Returns the number of matching workers.
    fn lookup(&mut self, q: &Query) -> usize;
    fn max_depth(&mut self, q: &Query) -> usize;
}

struct Kvroute {
    ix: index::KvIndex,
    ids: Vec<workers::WorkerId>,
    out: Vec<(workers::WorkerId, usize)>,
    scratch: Vec<u64>,
    /// (worker, store?, block hashes)
    pending: Vec<(workers::WorkerId, bool, Vec<u64>)>,
}

impl Kvroute {
    fn new(workers: u32) -> Self {
        let ix = index::KvIndex::new(1);
        let ids = (0..workers)
            .map(workers::WorkerId)
            .collect();
        Self {
            ix,
            ids,
            out: Vec::new(),
            scratch: Vec::new(),
            pending: Vec::new(),
        }
    }
}

impl Indexer for Kvroute {
    fn prepare(&mut self, events: &[Event]) {
        self.pending = events
            .iter()
            .map(|e| match e {
                Event::Store { worker, blocks, .. } => (
                    self.ids[*worker as usize],
                    true,
                    blocks.iter().map(|b| b.chained).collect(),
                ),
                Event::Remove { worker, blocks } => {
                    (self.ids[*worker as usize], false, blocks.clone())
                }
            })
            .collect();
    }
    fn ingest(&mut self) {
        for (w, store, blocks) in &self.pending {
            if *store {
                self.ix.apply_stored(*w, blocks);
            } else {
                self.ix.apply_removed(*w, blocks);
            }
        }
    }
    fn apply(&mut self, e: &Event) {
        match e {
            Event::Store { worker, blocks, .. } => {
                self.scratch.clear();
                self.scratch.extend(blocks.iter().map(|b| b.chained));
                self.ix
                    .apply_stored(self.ids[*worker as usize], &self.scratch);
            }
            Event::Remove { worker, blocks } => {
                self.ix
                    .apply_removed(self.ids[*worker as usize], blocks);
            }
        }
    }
    fn lookup(&mut self, q: &Query) -> usize {
        self.ix.match_prefix(&q.chained, &mut self.out);
        self.out.len()
    }
    fn max_depth(&mut self, q: &Query) -> usize {
        self.lookup(q);
        self.out.iter().map(|(_, n)| *n).max().unwrap_or(0)
    }
}

struct Dynamo {
    tree: RadixTree,
    next_id: u64,
    pending: Vec<RouterEvent>,
}

impl Dynamo {
    fn native(&mut self, e: &Event) -> RouterEvent {
        self.next_id += 1;
        let (worker, data) = match e {
            Event::Store {
                worker,
                parent,
                blocks,
            } => (
                *worker,
                KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: parent.map(ExternalSequenceBlockHash),
                    start_position: None,
                    blocks: blocks
                        .iter()
                        .map(|b| KvCacheStoredBlockData {
                            block_hash: ExternalSequenceBlockHash(b.chained),
                            tokens_hash: LocalBlockHash(b.local),
                            mm_extra_info: None,
                        })
                        .collect(),
                }),
            ),
            Event::Remove { worker, blocks } => (
                *worker,
                KvCacheEventData::Removed(KvCacheRemoveData {
                    block_hashes: blocks
                        .iter()
                        .map(|&h| ExternalSequenceBlockHash(h))
                        .collect(),
                }),
            ),
        };
        RouterEvent::new(
            u64::from(worker),
            KvCacheEvent {
                event_id: self.next_id,
                data,
                dp_rank: 0,
            },
        )
    }
}

impl Indexer for Dynamo {
    fn apply(&mut self, e: &Event) {
        let ev = self.native(e);
        let _ = self.tree.apply_event(ev);
    }
    fn prepare(&mut self, events: &[Event]) {
        let pending = events.iter().map(|e| self.native(e)).collect();
        self.pending = pending;
    }
    fn ingest(&mut self) {
        // `apply_event` takes each event by value
        for ev in std::mem::take(&mut self.pending) {
            let _ = self.tree.apply_event(ev);
        }
    }
    fn lookup(&mut self, q: &Query) -> usize {
        // `find_matches` takes the sequence by value: one copy per lookup is its API's cost
        self.tree.find_matches(q.local.clone(), false).scores.len()
    }
    fn max_depth(&mut self, q: &Query) -> usize {
        self.tree
            .find_matches(q.local.clone(), false)
            .scores
            .values()
            .copied()
            .max()
            .unwrap_or(0) as usize
    }
}

struct Figures {
    events_per_s: f64,
    lookups_per_s: Vec<f64>,
    bytes: f64,
    matches: Vec<(usize, usize)>,
}

/// Repetitions of each ingest and lookup timing; the best is kept.
const REPS: usize = 7;

/// Measures both indexes, alternating between them at every repetition so that load from
/// other processes on the machine hits both alike; best of [`REPS`] for each figure.
fn measure_both(makers: [&dyn Fn() -> Box<dyn Indexer>; 2], wl: &Workload) -> [Figures; 2] {
    let mut best_ingest = [f64::INFINITY; 2];
    let mut bytes = [0.0; 2];
    // memory: heap held after applying every event (converted one at a time)
    for side in 0..2 {
        let before = LIVE.load(Ordering::Relaxed);
        let mut ix = makers[side]();
        for e in &wl.events {
            ix.apply(e);
        }
        bytes[side] = (LIVE.load(Ordering::Relaxed) - before) as f64;
    }
    let mut built: [Option<Box<dyn Indexer>>; 2] = [None, None];
    for _ in 0..REPS {
        for side in 0..2 {
            drop(built[side].take());
            let mut ix = makers[side]();
            ix.prepare(&wl.events);
            let t = Instant::now();
            ix.ingest();
            best_ingest[side] = best_ingest[side].min(t.elapsed().as_secs_f64());
            built[side] = Some(ix);
        }
    }
    let [Some(mut a), Some(mut b)] = built else {
        unreachable!("both sides were built")
    };
    let sides: [&mut Box<dyn Indexer>; 2] = [&mut a, &mut b];
    let mut lookups_per_s = [vec![], vec![]];
    let mut matches = [vec![], vec![]];
    for q in &wl.queries {
        let mut best = [f64::INFINITY; 2];
        for _ in 0..REPS {
            for side in 0..2 {
                let ix = &mut *sides[side];
                let n = 1_000;
                let t = Instant::now();
                for _ in 0..n {
                    black_box(ix.lookup(black_box(q)));
                }
                best[side] = best[side].min(t.elapsed().as_secs_f64() / f64::from(n));
            }
        }
        for side in 0..2 {
            let ix = &mut *sides[side];
            matches[side].push((ix.lookup(q), ix.max_depth(q)));
            lookups_per_s[side].push(1.0 / best[side]);
        }
    }
    let [la, lb] = lookups_per_s;
    let [ma, mb] = matches;
    [
        Figures {
            events_per_s: wl.block_events as f64 / best_ingest[0],
            lookups_per_s: la,
            bytes: bytes[0],
            matches: ma,
        },
        Figures {
            events_per_s: wl.block_events as f64 / best_ingest[1],
            lookups_per_s: lb,
            bytes: bytes[1],
            matches: mb,
        },
    ]
}

fn main() {
    let scenarios = [
        (
            "8 workers, 64 convs x 256 blocks, 2k-block query, spread depths",
            8u32,
            64u32,
            256usize,
            64usize,
            2_048usize,
            true,
        ),
        (
            "8 workers, 64 convs x 256 blocks, 2k-block query, 2 warm",
            8,
            64,
            256,
            64,
            2_048,
            false,
        ),
        (
            "1000 workers, 4 convs x 256 blocks, 512-block query, spread depths",
            1_000,
            4,
            256,
            64,
            512,
            true,
        ),
        (
            "1000 workers, 4 convs x 256 blocks, 512-block query, 2 warm",
            1_000,
            4,
            256,
            64,
            512,
            false,
        ),
        (
            "1000 workers, 4 convs x 256 blocks, 2k-block query, spread depths",
            1_000,
            4,
            256,
            64,
            2_048,
            true,
        ),
        (
            "1000 workers, 4 convs x 256 blocks, 2k-block query, 2 warm",
            1_000,
            4,
            256,
            64,
            2_048,
            false,
        ),
        (
            // no system prompt: a worker's conversations share nothing, so (without parent
            // hashes) kvroute cannot tell where one chain ends and the next begins
            "1000 workers, 4 convs x 256 blocks, no shared prefix, 2k-block query, spread depths",
            1_000,
            4,
            256,
            0,
            2_048,
            true,
        ),
        (
            "8 workers, 64 convs x 256 blocks, no shared prefix, 2k-block query, 2 warm",
            8,
            64,
            256,
            0,
            2_048,
            false,
        ),
    ];
    // `cargo run --release -- <text>` runs only the scenarios whose label contains it
    let only = std::env::args().nth(1).unwrap_or_default();
    for (label, workers, convs, len, prefix, qlen, spread) in scenarios {
        if !label.contains(&only) {
            continue;
        }
        let wl = workload(workers, convs, len, prefix, qlen, spread);
        println!(
            "== {label}: {} block events, {} workers",
            wl.block_events, wl.workers
        );
        let [ours, theirs] = measure_both(
            [&|| Box::new(Kvroute::new(workers)), &|| {
                Box::new(Dynamo {
                    tree: RadixTree::new(),
                    next_id: 0,
                    pending: Vec::new(),
                })
            }],
            &wl,
        );
        assert_eq!(
            ours.matches, theirs.matches,
            "both indexes must agree on (matching workers, deepest match)"
        );
        for (name, f) in [("kvroute KvIndex", &ours), ("dynamo RadixTree", &theirs)] {
            println!(
                "  {name:18} ingest {:>7.2} M block events/s | lookup full {:>9.0}/s, quarter {:>9.0}/s | heap {:.1} MiB | matches {:?}",
                f.events_per_s / 1e6,
                f.lookups_per_s[0],
                f.lookups_per_s[1],
                f.bytes / (1 << 20) as f64,
                f.matches
            );
        }
        println!(
            "  ratio kvroute/dynamo: ingest {:.2}x, lookup full {:.2}x, quarter {:.2}x, memory {:.2}x",
            ours.events_per_s / theirs.events_per_s,
            ours.lookups_per_s[0] / theirs.lookups_per_s[0],
            ours.lookups_per_s[1] / theirs.lookups_per_s[1],
            ours.bytes / theirs.bytes
        );
    }
}
