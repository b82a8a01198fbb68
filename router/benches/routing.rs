//! Routing-core benchmarks: `cargo bench -p kvroute-router --bench routing`.
//!
//! - ingest: block store/remove events applied to the index (events/s);
//! - lookup: leading-prefix match of 512- and 2,048-block prompts over 8 and 1,000 workers
//!   in an index holding ~2 M (block, worker) pairs;
//! - decision: an ~8k-token chat prompt, tokenize + hash + lookup + predict + choose;
//! - memory per (block, worker), printed (counted by a wrapping global allocator and
//!   estimated by the index).

#![allow(missing_docs)] // criterion_main! generates an undocumented `pub fn main`
#![allow(unsafe_code)] // the counting global allocator below

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvroute_router::routing::{
    AssignmentId, CoreConfig, DecodeSteps, KvIndex, LoadSample, Policy, PromptHashes, RouteRequest,
    RoutingCore, StepConfig, WorkerId, policy_by_name,
};

/// Counts live heap bytes so the memory figure is measured, not estimated.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// splitmix64: deterministic synthetic hashes.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A synthetic chain of `n` blocks identified by `seed`.
fn chain(seed: u64, n: usize) -> Vec<u64> {
    (0..n as u64)
        .map(|i| mix(seed.wrapping_mul(1_000_003).wrapping_add(i)))
        .collect()
}

/// An index over `workers` workers where worker i holds the first `(i * 37) % (len + 1)`
/// blocks of the query chain, plus `filler` private blocks each.
fn populated(workers: usize, query: &[u64], filler: usize) -> (KvIndex, Vec<WorkerId>) {
    let mut ix = KvIndex::new(99);
    let ids: Vec<WorkerId> = (0..workers).map(|i| WorkerId(i as u32)).collect();
    for (i, &w) in ids.iter().enumerate() {
        let depth = (i * 37) % (query.len() + 1);
        ix.apply_stored(w, &query[..depth]);
        for c in chain(1_000 + i as u64, filler).chunks(64) {
            ix.apply_stored(w, c);
        }
    }
    (ix, ids)
}

fn bench_ingest(c: &mut Criterion) {
    let mut g = c.benchmark_group("ingest");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    // vLLM-like events: BlockStored batches of 16 blocks, later BlockRemoved one by one.
    for &workers in &[8usize, 1000] {
        let chains: Vec<Vec<u64>> = (0..workers as u64).map(|w| chain(w % 64, 4_096)).collect();
        let events = chains.len() as u64 * 4_096 * 2;
        g.throughput(Throughput::Elements(events));
        g.bench_with_input(
            BenchmarkId::new("store_remove", workers),
            &chains,
            |b, chains| {
                let mut ix = KvIndex::new(1);
                let ids: Vec<WorkerId> = (0..workers).map(|i| WorkerId(i as u32)).collect();
                b.iter(|| {
                    for (w, ch) in ids.iter().zip(chains) {
                        for batch in ch.chunks(16) {
                            ix.apply_stored(*w, batch);
                        }
                    }
                    for (w, ch) in ids.iter().zip(chains) {
                        for h in ch.iter().rev() {
                            ix.apply_removed(*w, std::slice::from_ref(h));
                        }
                    }
                    black_box(ix.pairs())
                });
            },
        );
    }
    g.finish();
}

fn bench_lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup");
    g.sample_size(30)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for &workers in &[8usize, 1000] {
        // ~2 M (block, worker) pairs in all.
        let filler = 2_000_000 / workers;
        for &blocks in &[512usize, 2048] {
            let query = chain(7, blocks);
            let (ix, _) = populated(workers, &query, filler);
            let mut out = Vec::new();
            g.throughput(Throughput::Elements(1));
            g.bench_function(
                BenchmarkId::new(format!("{blocks}_blocks"), format!("{workers}_workers")),
                |b| {
                    b.iter(|| {
                        ix.match_prefix(black_box(&query), &mut out);
                        black_box(out.len())
                    })
                },
            );
        }
    }
    g.finish();
}

/// Memory per (block, worker): measured by the counting allocator and estimated.
fn report_memory() {
    let scenarios: [(&str, usize, usize, usize); 3] = [
        // (label, workers, private blocks per worker, shared blocks held by all)
        ("8 workers, 250k private blocks each", 8, 250_000, 0),
        ("1000 workers, 2k private + 512 shared", 1000, 2_000, 512),
        ("64 workers, 16k shared by all", 64, 0, 16_384),
    ];
    for (label, workers, private, shared) in scenarios {
        let before = LIVE.load(Ordering::Relaxed);
        let mut ix = KvIndex::new(5);
        let shared_chain = chain(3, shared);
        for i in 0..workers {
            let w = WorkerId(i as u32);
            ix.apply_stored(w, &shared_chain);
            ix.apply_stored(w, &chain(10_000 + i as u64, private));
        }
        let measured = (LIVE.load(Ordering::Relaxed) - before) as f64;
        let pairs = ix.pairs() as f64;
        println!(
            "memory: {label}: {} pairs, {} distinct blocks: measured {:.1} B/pair, index estimate {:.1} B/pair",
            ix.pairs(),
            ix.distinct_blocks(),
            measured / pairs,
            ix.memory_bytes() as f64 / pairs,
        );
        drop(ix);
    }
}

/// An ~8k-token chat body: a long system prompt and a question.
fn long_chat() -> serde_json::Value {
    let paragraph = "The router predicts time to first token for every worker from the blocks it caches \
        and the prefill work queued ahead of the request, then picks the fastest one. ";
    let system: String = (0..220)
        .map(|i| format!("Section {i}. {paragraph}"))
        .collect();
    serde_json::json!({
        "model": "qwen3",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Summarise the sections above in one sentence."}
        ]
    })
}

/// The decision benches' request: the prompt's tokens for the served model `qwen3`.
fn qwen3_request(tokens: &[u32]) -> RouteRequest<'_> {
    RouteRequest {
        tokens: Some(tokens),
        model: "qwen3",
        lora: None,
        cache_salt: None,
        max_tokens: None,
    }
}

/// Adds `workers` workers to `core`: worker i holds the prompt's `hashes` to depth
/// `(i * 37) % (len + 1)` plus 2,000 blocks of its own, and reports `waiting(i)` waiting,
/// `i % 7` running, 30% KV use of 26,000 tokens (reported, so the KV admission model is part
/// of the timed decision).
fn fill_pool(
    core: &mut RoutingCore,
    workers: usize,
    hashes: &[u64],
    waiting: impl Fn(usize) -> u32,
) -> Vec<WorkerId> {
    let ids: Vec<WorkerId> = (0..workers)
        .map(|i| core.snapshot(&format!("w{i}"), 16, 1, &[], 0.0))
        .collect();
    for (i, &w) in ids.iter().enumerate() {
        let depth = (i * 37) % (hashes.len() + 1);
        core.stored(w, &hashes[..depth], 0.0);
        core.stored(w, &chain(50 + i as u64, 2_000), 0.0);
    }
    report_load(core, &ids, waiting, 0.3, 0.0);
    ids
}

/// Every worker of `ids` reports `waiting(i)` waiting, `i % 7` running and `kv_usage` of
/// 26,000 tokens at `now`.
fn report_load(
    core: &mut RoutingCore,
    ids: &[WorkerId],
    waiting: impl Fn(usize) -> u32,
    kv_usage: f32,
    now: f64,
) {
    for (i, &w) in ids.iter().enumerate() {
        core.load(
            w,
            LoadSample {
                waiting: waiting(i),
                running: (i % 7) as u32,
                kv_usage,
                kv_capacity_tokens: 26_000,
            },
            now,
        );
    }
}

/// Sends `req` to each worker of `ids` at `sent`, as `policy` decides it alone there.
fn place_on_each(
    core: &mut RoutingCore,
    policy: &mut dyn Policy,
    req: &RouteRequest<'_>,
    ids: &[WorkerId],
    sent: f64,
) -> Vec<AssignmentId> {
    ids.iter()
        .filter_map(|&w| {
            let (plan, d) = core.decide(policy, req, &[w], sent)?;
            Some(core.assign(&plan, &d, sent))
        })
        .collect()
}

fn bench_decision(c: &mut Criterion) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizers/qwen3");
    let tok = match kvroute_tokenization::Tokenizer::from_dir(std::path::Path::new(dir)) {
        Ok(t) => t,
        Err(e) => {
            println!("decision: skipped, tokenizer not loadable: {e}");
            return;
        }
    };
    let body = long_chat();
    let req: kvroute_tokenization::ChatRequest = match serde_json::from_value(body) {
        Ok(r) => r,
        Err(e) => {
            println!("decision: skipped: {e}");
            return;
        }
    };
    let now = kvroute_tokenization::local_now();
    let Ok(enc) = tok.encode_chat(&req, now) else {
        println!("decision: skipped, chat encoding failed");
        return;
    };
    println!("decision: prompt of {} tokens", enc.token_ids.len());
    let mut g = c.benchmark_group("decision");
    g.sample_size(30)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_secs(1));
    for &workers in &[8usize, 1000] {
        let mut core = RoutingCore::new(CoreConfig::default());
        let hashes = PromptHashes::new(&enc.token_ids, "qwen3", None, None)
            .chain(16)
            .to_vec();
        let ids = fill_pool(&mut core, workers, &hashes, |i| (i % 5) as u32);
        let mut policy = policy_by_name("kvroute", 1).expect("known policy");
        g.bench_function(
            BenchmarkId::new("chat_8k_tokenize_hash_lookup_predict", workers),
            |b| {
                b.iter(|| {
                    let enc = tok.encode_chat(black_box(&req), now).expect("encodes");
                    let r = qwen3_request(&enc.token_ids);
                    let d = core.decide(policy.as_mut(), &r, &ids, 1.0);
                    black_box(d.map(|(_, d)| d.chosen))
                })
            },
        );
        // A prompt never seen before: every iteration starts from a tokenizer whose segment
        // and word caches are empty (resetting them is not timed).
        let mut cold = kvroute_tokenization::Tokenizer::from_dir(std::path::Path::new(dir)).ok();
        g.bench_function(
            BenchmarkId::new("chat_8k_cold_tokenize_hash_lookup_predict", workers),
            |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let Some(t) = cold.take().map(|t| t.with_segment_cache_bytes(0)) else {
                            break;
                        };
                        let start = std::time::Instant::now();
                        let enc = t.encode_chat(black_box(&req), now).expect("encodes");
                        let r = qwen3_request(&enc.token_ids);
                        black_box(
                            core.decide(policy.as_mut(), &r, &ids, 1.0)
                                .map(|(_, d)| d.chosen),
                        );
                        total += start.elapsed();
                        cold = Some(t);
                    }
                    total
                })
            },
        );
        g.bench_function(BenchmarkId::new("hash_lookup_predict_only", workers), |b| {
            b.iter(|| {
                let r = qwen3_request(black_box(&enc.token_ids));
                let d = core.decide(policy.as_mut(), &r, &ids, 1.0);
                black_box(d.map(|(_, d)| d.chosen))
            })
        });
        // A busy pool: every worker runs engine steps (the router saw their chunks) and has
        // two of the router's prompts awaiting a first token, one sent before the running
        // step began (0.15, before the chunks at 0.2) and one after (0.21), so with the rule
        // on the decode-only test looks up the oldest's send time on every candidate. Once
        // with the rule off, once with the default.
        for decode_steps in [DecodeSteps::Off, DecodeSteps::Published] {
            let mut busy = RoutingCore::new(CoreConfig {
                steps: StepConfig {
                    decode_steps,
                    ..StepConfig::default()
                },
                ..CoreConfig::default()
            });
            let bids = fill_pool(&mut busy, workers, &hashes, |_| 0);
            for &w in &bids {
                busy.step_observed(w, 0.1);
            }
            let mut pin = policy_by_name("kvroute", 1).expect("known policy");
            let r = qwen3_request(&enc.token_ids);
            for (sent, chunks) in [(0.15, Some(0.2)), (0.21, None)] {
                place_on_each(&mut busy, pin.as_mut(), &r, &bids, sent);
                for &w in chunks.iter().flat_map(|_| &bids) {
                    busy.step_observed(w, chunks.unwrap_or(0.0));
                }
            }
            let label = match decode_steps {
                DecodeSteps::Off => "off",
                DecodeSteps::Published => "published",
                DecodeSteps::On => "on",
            };
            let name = format!("hash_lookup_predict_busy_decode_steps_{label}");
            g.bench_function(BenchmarkId::new(name, workers), |b| {
                b.iter(|| {
                    let r = qwen3_request(black_box(&enc.token_ids));
                    let d = busy.decide(policy.as_mut(), &r, &bids, 0.25);
                    black_box(d.map(|(_, d)| d.chosen))
                })
            });
        }
        // A KV-bound busy pool: each worker released the blocks of three earlier prompts of
        // the router's (its free queue then holds ~1,550 blocks in release order), has two
        // of the chat's prompts awaiting a first token and reports 95% of its KV in use, so
        // the eviction expectation (`CoreConfig::expect_evictions`, on by default) counts,
        // on every candidate, how much of the prompt survives the allocations queued there.
        let mut full = RoutingCore::new(CoreConfig::default());
        let fids = fill_pool(&mut full, workers, &hashes, |_| 2);
        let mut pin = policy_by_name("kvroute", 1).expect("known policy");
        for k in 0..3u32 {
            let mut earlier = enc.token_ids.clone();
            earlier[0] = 100 + k;
            let r = qwen3_request(&earlier);
            for a in place_on_each(&mut full, pin.as_mut(), &r, &fids, 0.05) {
                full.first_token(a, 0.1, None);
                full.finish(a);
            }
        }
        let r = qwen3_request(&enc.token_ids);
        for sent in [0.15, 0.21] {
            place_on_each(&mut full, pin.as_mut(), &r, &fids, sent);
        }
        report_load(&mut full, &fids, |_| 2, 0.95, 0.22);
        g.bench_function(
            BenchmarkId::new("hash_lookup_predict_busy_kv_full", workers),
            |b| {
                b.iter(|| {
                    let r = qwen3_request(black_box(&enc.token_ids));
                    let d = full.decide(policy.as_mut(), &r, &fids, 0.25);
                    black_box(d.map(|(_, d)| d.chosen))
                })
            },
        );
    }
    g.finish();
}

fn all(c: &mut Criterion) {
    report_memory();
    bench_ingest(c);
    bench_lookup(c);
    bench_decision(c);
}

criterion_group!(benches, all);
criterion_main!(benches);
