//! Part 7 benchmark: what the sidecar does per block on one core.
//!
//! decode (vLLM msgpack) -> re-hash (kvroute chain) + resident-set update -> encode the
//! resulting Delta (protobuf, as sent to the router).
//!
//! Workload: vLLM-shaped batches (msgspec layout, map16 BlockStored, uint64 hashes, uint16
//! token ids, block size 16) where each request stores a 32-block chain and a later step
//! evicts it again (one BlockRemoved per hash, as vLLM sends them), so the resident set stays
//! at its working size. Throughput is in block events (each stored or removed block is one).
//! Also prints bytes per block on the wire.
//!
//! `cargo bench -p kvroute-sidecar --bench pipeline`

#![allow(missing_docs)] // criterion_main! generates an undocumented `pub fn main`

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvroute_proto::v1::{WorkerReport, worker_report};
use kvroute_sidecar::push::to_delta;
use kvroute_sidecar::state::{ApplyStats, Ops, ResidentSet, StateConfig};
use kvroute_vllm_wire::decode_batch;
use prost::Message as _;
use rmpv::Value;

const BLOCK_SIZE: u32 = 16;
const CHAIN: u32 = 32;
const REQUESTS: u32 = 64;

fn s(x: &str) -> Value {
    Value::from(x)
}

fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("encode");
    out
}

fn vllm_hash(req: u32, block: u32) -> u64 {
    0x9e37_79b9_7f4a_7c15u64.wrapping_mul(u64::from(req) << 16 | u64::from(block)) | 1 << 63
}

/// Payloads: per request one BlockStored batch of CHAIN blocks, then one batch removing them.
fn workload() -> (Vec<Vec<u8>>, u64) {
    let mut payloads = Vec::new();
    let mut block_events = 0;
    for req in 0..REQUESTS {
        let hashes: Vec<Value> = (0..CHAIN).map(|b| Value::from(vllm_hash(req, b))).collect();
        let tokens: Vec<Value> = (0..CHAIN * BLOCK_SIZE)
            .map(|t| Value::from(1000 + (req * 7919 + t) % 150_000))
            .collect();
        let stored = Value::Map(vec![
            (s("type"), s("BlockStored")),
            (s("block_hashes"), Value::Array(hashes)),
            (s("parent_block_hash"), Value::Nil),
            (s("token_ids"), Value::Array(tokens)),
            (s("block_size"), Value::from(BLOCK_SIZE)),
            (s("lora_id"), Value::Nil),
            (s("medium"), s("GPU")),
            (s("lora_name"), Value::Nil),
            (
                s("extra_keys"),
                Value::Array((0..CHAIN).map(|_| Value::Nil).collect()),
            ),
            (s("group_idx"), Value::from(0)),
            (s("kv_cache_spec_kind"), s("full_attention")),
        ]);
        payloads.push(encode(&Value::Array(vec![
            Value::F64(1.0),
            Value::Array(vec![stored]),
            Value::from(0),
        ])));
        let removed: Vec<Value> = (0..CHAIN)
            .rev()
            .map(|b| {
                Value::Map(vec![
                    (s("type"), s("BlockRemoved")),
                    (
                        s("block_hashes"),
                        Value::Array(vec![Value::from(vllm_hash(req, b))]),
                    ),
                    (s("medium"), s("GPU")),
                    (s("group_idx"), Value::from(0)),
                ])
            })
            .collect();
        payloads.push(encode(&Value::Array(vec![
            Value::F64(1.0),
            Value::Array(removed),
            Value::from(0),
        ])));
        block_events += 2 * u64::from(CHAIN);
    }
    (payloads, block_events)
}

fn state() -> ResidentSet {
    ResidentSet::new(StateConfig {
        model: "Qwen/Qwen3-8B".into(),
        default_lora: None,
        block_size: None,
        max_blocks: 1 << 24,
    })
}

/// Full pipeline over the workload; returns bytes put on the wire and blocks reported.
fn pipeline(set: &mut ResidentSet, payloads: &[Vec<u8>], seq: &mut u64) -> (usize, usize) {
    let (mut bytes, mut blocks) = (0, 0);
    let mut stats = ApplyStats::default();
    for p in payloads {
        let batch = decode_batch(p).expect("decode");
        let mut ops = Ops::default();
        for ev in &batch.events {
            set.apply(ev, &mut ops, &mut stats);
        }
        blocks += ops.blocks();
        let report = WorkerReport {
            seq: *seq,
            body: Some(worker_report::Body::Delta(to_delta(&[ops]))),
        };
        *seq += 1;
        bytes += report.encode_to_vec().len();
    }
    (bytes, blocks)
}

fn bench(c: &mut Criterion) {
    let (payloads, block_events) = workload();
    let stored_only: Vec<Vec<u8>> = payloads.iter().step_by(2).cloned().collect();

    // Bytes per block on the wire, one report per vLLM batch (the worst case: no batching
    // across steps), and with a push batch of a whole workload's worth of ops.
    let mut set = state();
    let mut seq = 0;
    let (bytes, blocks) = pipeline(&mut set, &payloads, &mut seq);
    let input: usize = payloads.iter().map(Vec::len).sum();
    println!(
        "wire: {blocks} block ops in {bytes} bytes = {:.2} bytes/block (one report per vLLM batch); \
         vLLM msgpack input {:.1} bytes/block event",
        bytes as f64 / blocks as f64,
        input as f64 / block_events as f64
    );

    let mut g = c.benchmark_group("sidecar");
    g.throughput(Throughput::Elements(block_events));
    g.bench_function("decode_rehash_encode_mixed", |b| {
        let mut set = state();
        let mut seq = 0;
        b.iter(|| black_box(pipeline(&mut set, black_box(&payloads), &mut seq)));
    });
    g.bench_function("decode_only_mixed", |b| {
        b.iter(|| {
            for p in &payloads {
                black_box(decode_batch(black_box(p)).expect("decode"));
            }
        });
    });
    g.throughput(Throughput::Elements(u64::from(REQUESTS * CHAIN)));
    g.bench_function("decode_rehash_encode_stored_only", |b| {
        b.iter(|| {
            // Fresh set each time: every block is new and must be hashed.
            let mut set = state();
            let mut seq = 0;
            black_box(pipeline(&mut set, black_box(&stored_only), &mut seq))
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
