//! `cargo run --release` (in bench/dynamo-compare): feeds one synthetic KV event stream and
//! one query set to kvroute's `KvIndex` and to three of NVIDIA Dynamo's indexers
//! (dynamo-kv-router 1.6.1): the single-threaded `RadixTree`, and the two FlashIndexer
//! backends, `PositionalIndexer` and `ConcurrentRadixTreeCompressed`, each driven by
//! `ThreadPoolIndexer`. Prints ingest events/s, lookups/s and memory per scenario, and writes
//! them to bench/results/dynamo-compare.{md,json} (only when every scenario ran).
//!
//! ```text
//! workload: W workers x C conversations x L blocks (a P-block system prefix shared by all)
//!   stores: BlockStored batches of 16 (parent = previous block), then removals leaf-first
//!   queries: 512- and 2,048-block chains that workers hold to various depths
//! contenders, 1 and 2 threads each:
//!   kvroute   KvIndex behind a parking_lot::Mutex, as the router holds it (inside its
//!             routing core): every lookup and every event takes the lock
//!   dynamo    RadixTree (1 thread only: Rc nodes, not Send)
//!             ThreadPoolIndexer<PositionalIndexer (jump 32)>, N event threads
//!             ThreadPoolIndexer<ConcurrentRadixTreeCompressed>, N event threads
//! ```
//!
//! Every index sees the same blocks: kvroute keys by the chained hash (what vLLM's event and
//! kvroute's sidecar carry), Dynamo's indexes by the per-block token hash with the chained
//! hash alongside, exactly as their APIs take them. The chained hash is Dynamo's own
//! (`dynamo_tokens::compute_next_sequence_hash`), because `PositionalIndexer` recomputes it
//! from the query's token hashes to verify a match. Events are converted to each index's
//! input type before the ingest clock starts; each query is prepared once in both forms.
//!
//! Ingest, N threads: kvroute applies a worker's events on one of N threads (a sidecar stream
//! per worker), taking the lock per event; Dynamo's `ThreadPoolIndexer` gets every event from
//! the caller (`enqueue_event`, sticky per worker to one of its N threads) and the clock
//! stops when `flush_and_wait` returns. Lookups, N threads: N threads each run the same
//! query concurrently; kvroute through the lock, the FlashIndexer backends the way Dynamo's
//! indexer service reads them (`backend().find_matches(&hashes, false)`, inline on the
//! caller's thread, no lock); the RadixTree through `find_matches`, which takes its sequence
//! by value (a clone per lookup). Wall-clock timing, best of `DC_REPS` (default 7), the
//! contenders measured alternately so that load from other processes hits all alike.
//! Before timing, every contender's answer (matching workers and their matched blocks) is
//! checked against kvroute's: the program stops if any differs.
// the counting global allocator
#![allow(unsafe_code)]
// a benchmark reads the clock (the repository's clippy.toml forbids that for routing/ only)
#![allow(clippy::disallowed_methods)]

#[path = "../../../router/src/routing/index.rs"]
#[allow(dead_code)]
mod index;

/// The worker ids the index keys its blocks by.
#[path = "../../../router/src/routing/workers.rs"]
#[allow(dead_code)]
mod workers;

/// What the worker table keeps of a worker's GPUs (a field type of `workers`).
#[path = "../../../router/src/routing/gpu.rs"]
#[allow(dead_code)]
mod gpu;

/// Passive health (a field type of `workers`).
#[path = "../../../router/src/routing/outlier.rs"]
#[allow(dead_code)]
mod outlier;

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use dynamo_kv_router::indexer::positional::SearchMode;
use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, OverlapScores, RouterEvent,
};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, PositionalIndexer, RadixTree};
use parking_lot::Mutex;

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

/// A chain: block i's content is `mix(i)` for i < shared, else private to `private_seed`;
/// chained hashes as Dynamo computes them (block 0's is its token hash).
fn chain(shared_prefix: usize, private_seed: u64, len: usize) -> Vec<Block> {
    let mut parent = None;
    (0..len)
        .map(|i| {
            let local = if i < shared_prefix {
                mix(i as u64)
            } else {
                mix(private_seed.wrapping_mul(1 << 20) + i as u64)
            };
            let chained = match parent {
                None => local,
                Some(p) => dynamo_tokens::compute_next_sequence_hash(p, local),
            };
            parent = Some(chained);
            Block { local, chained }
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

impl Event {
    fn worker(&self) -> u32 {
        match self {
            Event::Store { worker, .. } | Event::Remove { worker, .. } => *worker,
        }
    }
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
    let queries = vec![Query::new(&query), Query::new(&query[..query_len / 4])];
    Workload {
        workers,
        events,
        block_events,
        queries,
    }
}

/// Runs `f(thread index)` on `threads` threads released together; returns the wall seconds
/// from the first one's start to the last one's end (each thread reads the clock itself: on
/// a loaded machine the caller may not run again until they are done). One thread runs on
/// the caller's.
fn timed_on_threads(threads: usize, f: impl Fn(usize) + Sync) -> f64 {
    if threads == 1 {
        let t = Instant::now();
        f(0);
        return t.elapsed().as_secs_f64();
    }
    let start = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (start, f) = (&start, &f);
                s.spawn(move || {
                    start.wait();
                    let t0 = Instant::now();
                    f(i);
                    (t0, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a timed thread panicked"))
            .collect()
    });
    let first = spans.iter().map(|s| s.0).min().expect("threads >= 2");
    let last = spans.iter().map(|s| s.1).max().expect("threads >= 2");
    (last - first).as_secs_f64()
}

/// Waits for a future on this thread (the thread-pool indexer's flush answers on a oneshot
/// from its event threads; nothing else needs a runtime).
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// A query's answer: (worker, matched leading blocks) for every worker matching >= 1 block.
type Answer = Vec<(u64, usize)>;

fn dynamo_answer(s: &OverlapScores) -> Answer {
    let mut a: Answer = s
        .scores
        .iter()
        .map(|(w, n)| (w.worker_id, *n as usize))
        .collect();
    a.sort_unstable();
    a
}

/// One index configuration under test.
trait Contender {
    fn name(&self) -> String;
    fn threads(&self) -> usize;
    /// Heap bytes held after applying every event (converted one at a time; untimed).
    fn memory(&mut self, wl: &Workload) -> f64;
    /// Builds a fresh index from the workload; returns the seconds the ingest took.
    fn build(&mut self, wl: &Workload) -> f64;
    /// Seconds for `n` lookups of `q` on each of [`Contender::threads`] threads at once.
    fn lookups(&self, q: &Query, n: usize) -> f64;
    fn answer(&self, q: &Query) -> Answer;
}

/// kvroute's index behind the lock the router keeps its routing core behind.
struct Kvroute {
    threads: usize,
    ids: Vec<workers::WorkerId>,
    ix: Option<Mutex<index::KvIndex>>,
}

impl Kvroute {
    fn new(workers: u32, threads: usize) -> Self {
        Self {
            threads,
            ids: (0..workers).map(workers::WorkerId).collect(),
            ix: None,
        }
    }
    fn built(&self) -> &Mutex<index::KvIndex> {
        self.ix.as_ref().expect("built before lookups")
    }
}

/// (worker, store?, chained block hashes): a sidecar delta, decoded.
type KvDelta = (workers::WorkerId, bool, Vec<u64>);

fn apply_kvroute(ix: &Mutex<index::KvIndex>, (w, store, blocks): &KvDelta) {
    let mut g = ix.lock();
    if *store {
        g.apply_stored(*w, blocks);
    } else {
        g.apply_removed(*w, blocks);
    }
}

impl Contender for Kvroute {
    fn name(&self) -> String {
        "kvroute KvIndex (Mutex, as the router)".into()
    }
    fn threads(&self) -> usize {
        self.threads
    }
    fn memory(&mut self, wl: &Workload) -> f64 {
        self.ix = None;
        let before = LIVE.load(Ordering::Relaxed);
        let ix = Mutex::new(index::KvIndex::new(1));
        for e in &wl.events {
            apply_kvroute(&ix, &self.delta(e));
        }
        let bytes = (LIVE.load(Ordering::Relaxed) - before) as f64;
        drop(ix);
        bytes
    }
    fn build(&mut self, wl: &Workload) -> f64 {
        self.ix = None;
        // a worker's events stay in order on one thread (one sidecar stream per worker)
        let mut lanes: Vec<Vec<KvDelta>> = (0..self.threads).map(|_| Vec::new()).collect();
        for e in &wl.events {
            lanes[e.worker() as usize % self.threads].push(self.delta(e));
        }
        let ix = Mutex::new(index::KvIndex::new(1));
        let secs = timed_on_threads(self.threads, |i| {
            for d in &lanes[i] {
                apply_kvroute(&ix, d);
            }
        });
        self.ix = Some(ix);
        secs
    }
    fn lookups(&self, q: &Query, n: usize) -> f64 {
        let ix = self.built();
        timed_on_threads(self.threads, |_| {
            let mut out = Vec::new();
            for _ in 0..n {
                ix.lock().match_prefix(black_box(&q.chained), &mut out);
                black_box(out.len());
            }
        })
    }
    fn answer(&self, q: &Query) -> Answer {
        let mut out = Vec::new();
        self.built().lock().match_prefix(&q.chained, &mut out);
        let mut a: Answer = out.iter().map(|(w, n)| (u64::from(w.0), *n)).collect();
        a.sort_unstable();
        a
    }
}

impl Kvroute {
    fn delta(&self, e: &Event) -> KvDelta {
        match e {
            Event::Store { worker, blocks, .. } => (
                self.ids[*worker as usize],
                true,
                blocks.iter().map(|b| b.chained).collect(),
            ),
            Event::Remove { worker, blocks } => (self.ids[*worker as usize], false, blocks.clone()),
        }
    }
}

/// Converts one event to Dynamo's input type.
fn native(e: &Event, id: u64) -> RouterEvent {
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
            event_id: id,
            data,
            dp_rank: 0,
        },
    )
}

fn native_all(wl: &Workload) -> Vec<RouterEvent> {
    wl.events
        .iter()
        .enumerate()
        .map(|(i, e)| native(e, i as u64 + 1))
        .collect()
}

/// Dynamo's single-threaded radix tree (what bench/dynamo-compare measured first).
struct Radix {
    tree: Option<RadixTree>,
}

impl Contender for Radix {
    fn name(&self) -> String {
        "dynamo RadixTree".into()
    }
    fn threads(&self) -> usize {
        1
    }
    fn memory(&mut self, wl: &Workload) -> f64 {
        self.tree = None;
        let before = LIVE.load(Ordering::Relaxed);
        let mut tree = RadixTree::new();
        for (i, e) in wl.events.iter().enumerate() {
            let _ = tree.apply_event(native(e, i as u64 + 1));
        }
        let bytes = (LIVE.load(Ordering::Relaxed) - before) as f64;
        drop(tree);
        bytes
    }
    fn build(&mut self, wl: &Workload) -> f64 {
        self.tree = None;
        let pending = native_all(wl);
        let mut tree = RadixTree::new();
        let t = Instant::now();
        // `apply_event` takes each event by value
        for ev in pending {
            let _ = tree.apply_event(ev);
        }
        let secs = t.elapsed().as_secs_f64();
        self.tree = Some(tree);
        secs
    }
    fn lookups(&self, q: &Query, n: usize) -> f64 {
        let tree = self.tree.as_ref().expect("built before lookups");
        let t = Instant::now();
        for _ in 0..n {
            // `find_matches` takes the sequence by value: one copy per lookup is its API's cost
            black_box(
                tree.find_matches(black_box(&q.local).clone(), false)
                    .scores
                    .len(),
            );
        }
        t.elapsed().as_secs_f64()
    }
    fn answer(&self, q: &Query) -> Answer {
        let tree = self.tree.as_ref().expect("built before lookups");
        dynamo_answer(&tree.find_matches(q.local.clone(), false))
    }
}

/// A FlashIndexer backend driven by Dynamo's `ThreadPoolIndexer` with `threads` event threads.
struct Flash<T: SyncIndexer> {
    label: &'static str,
    threads: usize,
    make: fn() -> T,
    pool: Option<ThreadPoolIndexer<T>>,
}

/// The block size handed to `ThreadPoolIndexer` (used only to hash raw tokens, which this
/// bench never passes; 16 is vLLM's default).
const BLOCK_SIZE: u32 = 16;

/// Events enqueued between flushes in the memory pass, so that the event queues stay short
/// (their peak size is not the index's).
const MEMORY_CHUNK: usize = 1_024;

impl<T: SyncIndexer> Contender for Flash<T> {
    fn name(&self) -> String {
        format!("dynamo {} (ThreadPoolIndexer)", self.label)
    }
    fn threads(&self) -> usize {
        self.threads
    }
    fn memory(&mut self, wl: &Workload) -> f64 {
        self.pool = None;
        let before = LIVE.load(Ordering::Relaxed);
        let pool = ThreadPoolIndexer::new((self.make)(), self.threads, BLOCK_SIZE);
        for (c, chunk) in wl.events.chunks(MEMORY_CHUNK).enumerate() {
            for (i, e) in chunk.iter().enumerate() {
                let id = (c * MEMORY_CHUNK + i) as u64 + 1;
                pool.enqueue_event(native(e, id))
                    .expect("event threads are up");
            }
            block_on(pool.flush_and_wait()).expect("event threads are up");
        }
        let bytes = (LIVE.load(Ordering::Relaxed) - before) as f64;
        drop(pool);
        bytes
    }
    fn build(&mut self, wl: &Workload) -> f64 {
        self.pool = None;
        let pending = native_all(wl);
        let pool = ThreadPoolIndexer::new((self.make)(), self.threads, BLOCK_SIZE);
        let t = Instant::now();
        for ev in pending {
            pool.enqueue_event(ev).expect("event threads are up");
        }
        block_on(pool.flush_and_wait()).expect("event threads are up");
        let secs = t.elapsed().as_secs_f64();
        self.pool = Some(pool);
        secs
    }
    fn lookups(&self, q: &Query, n: usize) -> f64 {
        let backend = self.pool.as_ref().expect("built before lookups").backend();
        timed_on_threads(self.threads, |_| {
            for _ in 0..n {
                black_box(
                    backend
                        .find_matches(black_box(&q.local), false)
                        .scores
                        .len(),
                );
            }
        })
    }
    fn answer(&self, q: &Query) -> Answer {
        let backend = self.pool.as_ref().expect("built before lookups").backend();
        dynamo_answer(&backend.find_matches(&q.local, false))
    }
}

/// One contender's figures in one scenario.
struct Figures {
    name: String,
    threads: usize,
    /// Block events (stored + removed blocks) per second.
    events_per_s: f64,
    /// Per query (full, quarter): lookups per second, all threads together.
    lookups_per_s: Vec<f64>,
    bytes: f64,
    /// RadixTree, Positional or ConcurrentRadixTreeCompressed: a Dynamo index.
    dynamo: bool,
}

fn reps() -> usize {
    std::env::var("DC_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(7)
}

/// Target wall time of one timed batch of lookups.
const BATCH_S: f64 = 0.02;

fn measure(contenders: &mut [Box<dyn Contender>], wl: &Workload) -> Vec<Figures> {
    let reps = reps();
    let k = contenders.len();
    let bytes: Vec<f64> = contenders.iter_mut().map(|c| c.memory(wl)).collect();
    let mut ingest = vec![f64::INFINITY; k];
    for _ in 0..reps {
        for (i, c) in contenders.iter_mut().enumerate() {
            ingest[i] = ingest[i].min(c.build(wl));
        }
    }
    // the correctness cross-check: every index gives kvroute's answer to every query
    for (qi, q) in wl.queries.iter().enumerate() {
        let want = contenders[0].answer(q);
        assert!(!want.is_empty(), "query {qi} matches some worker");
        for c in contenders.iter() {
            let got = c.answer(q);
            assert!(
                got == want,
                "{} ({} threads) disagrees with kvroute on query {qi}: {} vs {} workers, \
                 first difference {:?}",
                c.name(),
                c.threads(),
                got.len(),
                want.len(),
                got.iter().zip(&want).find(|(a, b)| a != b)
            );
        }
    }
    let mut lookups = vec![Vec::new(); k];
    for q in &wl.queries {
        // batch size per contender: about BATCH_S of wall time
        let n: Vec<usize> = contenders
            .iter()
            .map(|c| {
                let per = c.lookups(q, 20) / 20.0;
                ((BATCH_S / per.max(1e-9)) as usize).clamp(20, 200_000)
            })
            .collect();
        let mut best = vec![f64::INFINITY; k];
        for _ in 0..reps {
            for (i, c) in contenders.iter().enumerate() {
                let per = c.lookups(q, n[i]) / (n[i] * c.threads()) as f64;
                best[i] = best[i].min(per);
            }
        }
        for i in 0..k {
            lookups[i].push(1.0 / best[i]);
        }
    }
    contenders
        .iter()
        .enumerate()
        .map(|(i, c)| Figures {
            name: c.name(),
            threads: c.threads(),
            events_per_s: wl.block_events as f64 / ingest[i],
            lookups_per_s: std::mem::take(&mut lookups[i]),
            bytes: bytes[i],
            dynamo: i > 1,
        })
        .collect()
}

/// kvroute against the best Dynamo index at the same thread count (the RadixTree counts at
/// 1 thread): per metric, the best of them for that metric.
struct Ratios {
    threads: usize,
    /// kvroute lookups/s over the best Dynamo lookups/s, per query; with that index's name.
    lookups: Vec<(f64, String)>,
    /// kvroute events/s over the best Dynamo events/s.
    ingest: (f64, String),
    /// kvroute heap over the smallest Dynamo heap (< 1: kvroute smaller).
    memory: (f64, String),
}

fn best_of<'a>(
    rows: &[&'a Figures],
    key: impl Fn(&Figures) -> f64,
    higher_wins: bool,
) -> &'a Figures {
    let mut best = rows[0];
    for r in rows {
        let better = if higher_wins {
            key(r) > key(best)
        } else {
            key(r) < key(best)
        };
        if better {
            best = r;
        }
    }
    best
}

fn short(f: &Figures) -> String {
    let base = f
        .name
        .trim_start_matches("dynamo ")
        .trim_end_matches(" (ThreadPoolIndexer)");
    format!("{base} x{}", f.threads)
}

fn ratios(figs: &[Figures], threads: usize) -> Ratios {
    let ours = figs
        .iter()
        .find(|f| !f.dynamo && f.threads == threads)
        .expect("kvroute ran at this thread count");
    let theirs: Vec<&Figures> = figs
        .iter()
        .filter(|f| f.dynamo && f.threads == threads)
        .collect();
    let lookups = (0..ours.lookups_per_s.len())
        .map(|q| {
            let b = best_of(&theirs, |f| f.lookups_per_s[q], true);
            (ours.lookups_per_s[q] / b.lookups_per_s[q], short(b))
        })
        .collect();
    let bi = best_of(&theirs, |f| f.events_per_s, true);
    let bm = best_of(&theirs, |f| f.bytes, false);
    Ratios {
        threads,
        lookups,
        ingest: (ours.events_per_s / bi.events_per_s, short(bi)),
        memory: (ours.bytes / bm.bytes, short(bm)),
    }
}

struct Scenario {
    label: &'static str,
    workers: u32,
    convs: u32,
    len: usize,
    prefix: usize,
    query_len: usize,
    spread: bool,
}

const fn sc(
    label: &'static str,
    workers: u32,
    convs: u32,
    prefix: usize,
    query_len: usize,
    spread: bool,
) -> Scenario {
    Scenario {
        label,
        workers,
        convs,
        len: 256,
        prefix,
        query_len,
        spread,
    }
}

const SCENARIOS: [Scenario; 8] = [
    sc(
        "8 workers, 64 convs x 256 blocks, 2k-block query, spread depths",
        8,
        64,
        64,
        2_048,
        true,
    ),
    sc(
        "8 workers, 64 convs x 256 blocks, 2k-block query, 2 warm",
        8,
        64,
        64,
        2_048,
        false,
    ),
    sc(
        "1000 workers, 4 convs x 256 blocks, 512-block query, spread depths",
        1_000,
        4,
        64,
        512,
        true,
    ),
    sc(
        "1000 workers, 4 convs x 256 blocks, 512-block query, 2 warm",
        1_000,
        4,
        64,
        512,
        false,
    ),
    sc(
        "1000 workers, 4 convs x 256 blocks, 2k-block query, spread depths",
        1_000,
        4,
        64,
        2_048,
        true,
    ),
    sc(
        "1000 workers, 4 convs x 256 blocks, 2k-block query, 2 warm",
        1_000,
        4,
        64,
        2_048,
        false,
    ),
    // no system prompt: a worker's conversations share nothing
    sc(
        "1000 workers, 4 convs x 256 blocks, no shared prefix, 2k-block query, spread depths",
        1_000,
        4,
        0,
        2_048,
        true,
    ),
    sc(
        "8 workers, 64 convs x 256 blocks, no shared prefix, 2k-block query, 2 warm",
        8,
        64,
        0,
        2_048,
        false,
    ),
];

fn contenders(workers: u32) -> Vec<Box<dyn Contender>> {
    fn positional() -> PositionalIndexer {
        // jump 32 and strided search: the crate's default mode and the jump its tests use
        PositionalIndexer::new_with_mode(32, SearchMode::Strided)
    }
    let mut v: Vec<Box<dyn Contender>> = vec![
        Box::new(Kvroute::new(workers, 1)),
        Box::new(Kvroute::new(workers, 2)),
        Box::new(Radix { tree: None }),
    ];
    for threads in [1, 2] {
        v.push(Box::new(Flash {
            label: "PositionalIndexer",
            threads,
            make: positional,
            pool: None,
        }));
        v.push(Box::new(Flash {
            label: "ConcurrentRadixTreeCompressed",
            threads,
            make: ConcurrentRadixTreeCompressed::new,
            pool: None,
        }));
    }
    v
}

/// Today's date (UTC) from the system clock, as YYYY-MM-DD.
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // civil-from-days (proleptic Gregorian)
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    format!("{cores} cores, 1-minute load average {load} at the end of the run")
}

fn ns(lookups_per_s: f64) -> String {
    let ns = 1e9 / lookups_per_s;
    if ns >= 100.0 {
        format!("{ns:.0}")
    } else {
        format!("{ns:.1}")
    }
}

fn ratio_cell((r, who): &(f64, String)) -> String {
    format!("{r:.2}x ({who})")
}

fn markdown(results: &[(&Scenario, u64, Vec<Figures>, Vec<Ratios>)], reps: usize) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# kvroute's KV index against dynamo-kv-router 1.6.1's indexers\n\n\
         Written by `cd bench/dynamo-compare && cargo run --release` on {} ({}; best of {reps} \
         per figure). Do not edit by hand.\n\n\
         Per scenario: ns per lookup (wall time over lookups, all threads together: at 2 \
         threads, two threads run the same query at once), ingest in million block events \
         per second (stored plus removed blocks, all events applied and flushed), heap \
         after ingest. kvroute's index sits behind a `parking_lot::Mutex` as in the router, \
         and every lookup and every event takes it (the router takes it once per sidecar \
         delta, which carries one or more of vLLM's event batches: per event is the most \
         locking it can do); Dynamo's FlashIndexer backends run in its \
         `ThreadPoolIndexer` with 1 or 2 event threads and are read inline on the caller's \
         threads. Every index's answers (matching workers and matched blocks) were checked \
         equal to kvroute's before timing.\n\n\
         Ratios compare kvroute with the best Dynamo index *for that figure* at the same \
         thread count (the single-threaded RadixTree counts at 1 thread): lookups and \
         ingest above 1x mean kvroute is faster; memory below 1x means kvroute holds less.\n\n\
         The load average above says how busy the machine was. With 2 cores, the 2-thread \
         figures are noisy (two timed threads, Dynamo's caller thread and the system share \
         them), and a second thread cannot show the scaling a larger machine would.\n",
        today(),
        machine()
    );
    md.push_str(&summary(results));
    for (s, block_events, figs, rs) in results {
        let _ = writeln!(
            md,
            "## {}\n\n{block_events} block events, {} workers; queries of {} and {} blocks.\n",
            s.label,
            s.workers,
            s.query_len,
            s.query_len / 4
        );
        let _ = writeln!(
            md,
            "| index | threads | ns/lookup, {}-block query | ns/lookup, {}-block query | ingest, M block events/s | heap, MiB |\n|---|---:|---:|---:|---:|---:|",
            s.query_len,
            s.query_len / 4
        );
        for f in figs {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.2} | {:.1} |",
                f.name,
                f.threads,
                ns(f.lookups_per_s[0]),
                ns(f.lookups_per_s[1]),
                f.events_per_s / 1e6,
                f.bytes / f64::from(1 << 20)
            );
        }
        let _ = writeln!(
            md,
            "\n| kvroute / best Dynamo | lookups, {}-block query | lookups, {}-block query | ingest | memory |\n|---|---|---|---|---|",
            s.query_len,
            s.query_len / 4
        );
        for r in rs {
            let _ = writeln!(
                md,
                "| {} thread{} | {} | {} | {} | {} |",
                r.threads,
                if r.threads == 1 { "" } else { "s" },
                ratio_cell(&r.lookups[0]),
                ratio_cell(&r.lookups[1]),
                ratio_cell(&r.ingest),
                ratio_cell(&r.memory)
            );
        }
        md.push('\n');
    }
    md
}

/// The ratios of every scenario in one table, and every figure where kvroute is behind.
fn summary(results: &[(&Scenario, u64, Vec<Figures>, Vec<Ratios>)]) -> String {
    let mut md = String::from(
        "## Summary: kvroute / best Dynamo index at the same thread count\n\n\
         | scenario | threads | lookups, full query | lookups, quarter query | ingest | memory |\n\
         |---|---:|---|---|---|---|\n",
    );
    let mut behind = Vec::new();
    for (s, _, _, rs) in results {
        for r in rs {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                s.label,
                r.threads,
                ratio_cell(&r.lookups[0]),
                ratio_cell(&r.lookups[1]),
                ratio_cell(&r.ingest),
                ratio_cell(&r.memory)
            );
            let q = [s.query_len, s.query_len / 4];
            for (i, l) in r.lookups.iter().enumerate() {
                if l.0 < 1.0 {
                    behind.push(format!(
                        "{}, {} thread(s), {}-block lookups: {}",
                        s.label,
                        r.threads,
                        q[i],
                        ratio_cell(l)
                    ));
                }
            }
            if r.ingest.0 < 1.0 {
                behind.push(format!(
                    "{}, {} thread(s), ingest: {}",
                    s.label,
                    r.threads,
                    ratio_cell(&r.ingest)
                ));
            }
            if r.memory.0 > 1.0 {
                behind.push(format!("{}, memory: {}", s.label, ratio_cell(&r.memory)));
            }
        }
    }
    md.push_str("\nWhere kvroute is behind the best Dynamo index (lookups or ingest below 1x, memory above 1x): ");
    if behind.is_empty() {
        md.push_str("nowhere in this run.\n\n");
    } else {
        md.push('\n');
        for b in behind {
            let _ = writeln!(md, "- {b}");
        }
        md.push('\n');
    }
    md
}

fn json_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn json(results: &[(&Scenario, u64, Vec<Figures>, Vec<Ratios>)], reps: usize) -> String {
    let mut j = String::new();
    let _ = write!(
        j,
        "{{\n  \"command\": \"cd bench/dynamo-compare && cargo run --release\",\n  \"date\": {},\n  \"machine\": {},\n  \"reps\": {reps},\n  \"scenarios\": [",
        json_str(&today()),
        json_str(&machine())
    );
    for (si, (s, block_events, figs, rs)) in results.iter().enumerate() {
        let _ = write!(
            j,
            "{}\n    {{\"label\": {}, \"workers\": {}, \"block_events\": {block_events}, \"query_blocks\": [{}, {}], \"indexes\": [",
            if si == 0 { "" } else { "," },
            json_str(s.label),
            s.workers,
            s.query_len,
            s.query_len / 4
        );
        for (fi, f) in figs.iter().enumerate() {
            let _ = write!(
                j,
                "{}\n      {{\"name\": {}, \"threads\": {}, \"ns_per_lookup\": [{:.1}, {:.1}], \"ingest_block_events_per_s\": {:.0}, \"heap_bytes\": {:.0}}}",
                if fi == 0 { "" } else { "," },
                json_str(&f.name),
                f.threads,
                1e9 / f.lookups_per_s[0],
                1e9 / f.lookups_per_s[1],
                f.events_per_s,
                f.bytes
            );
        }
        j.push_str("\n    ], \"kvroute_over_best_dynamo\": [");
        for (ri, r) in rs.iter().enumerate() {
            let _ = write!(
                j,
                "{}\n      {{\"threads\": {}, \"lookups\": [{:.3}, {:.3}], \"lookups_best_dynamo\": [{}, {}], \"ingest\": {:.3}, \"ingest_best_dynamo\": {}, \"memory\": {:.3}, \"memory_best_dynamo\": {}}}",
                if ri == 0 { "" } else { "," },
                r.threads,
                r.lookups[0].0,
                r.lookups[1].0,
                json_str(&r.lookups[0].1),
                json_str(&r.lookups[1].1),
                r.ingest.0,
                json_str(&r.ingest.1),
                r.memory.0,
                json_str(&r.memory.1)
            );
        }
        j.push_str("\n    ]}");
    }
    j.push_str("\n  ]\n}\n");
    j
}

fn main() {
    // `cargo run --release -- <text>` runs only the scenarios whose label contains it (and
    // writes no result files)
    let only = std::env::args().nth(1).unwrap_or_default();
    let reps = reps();
    let mut results = Vec::new();
    for s in &SCENARIOS {
        if !s.label.contains(&only) {
            continue;
        }
        let wl = workload(s.workers, s.convs, s.len, s.prefix, s.query_len, s.spread);
        println!(
            "== {}: {} block events, {} workers",
            s.label, wl.block_events, wl.workers
        );
        let mut cs = contenders(s.workers);
        let figs = measure(&mut cs, &wl);
        drop(cs);
        for f in &figs {
            println!(
                "  {:52} x{} | lookup {:>9} / {:>9} ns | ingest {:>6.2} M block events/s | heap {:>7.1} MiB",
                f.name,
                f.threads,
                ns(f.lookups_per_s[0]),
                ns(f.lookups_per_s[1]),
                f.events_per_s / 1e6,
                f.bytes / f64::from(1 << 20)
            );
        }
        let rs = vec![ratios(&figs, 1), ratios(&figs, 2)];
        for r in &rs {
            println!(
                "  kvroute/best dynamo, {} thread(s): lookups {} / {}, ingest {}, memory {}",
                r.threads,
                ratio_cell(&r.lookups[0]),
                ratio_cell(&r.lookups[1]),
                ratio_cell(&r.ingest),
                ratio_cell(&r.memory)
            );
        }
        results.push((s, wl.block_events, figs, rs));
    }
    if only.is_empty() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../results");
        let md = format!("{dir}/dynamo-compare.md");
        let js = format!("{dir}/dynamo-compare.json");
        std::fs::write(&md, markdown(&results, reps)).expect("bench/results is writable");
        std::fs::write(&js, json(&results, reps)).expect("bench/results is writable");
        println!("wrote {md} and {js}");
    }
}
