//! How many simulated L40S workers one core can run at `--speedup 10`.
//!
//! One worker under load: 64 closed-loop users, prompts of a 512-token prefix shared by 8
//! groups plus 512 unique tokens, 128 output tokens, KV events encoded to msgpack as the
//! publisher would. Simulating S seconds takes C seconds of CPU; at speedup 10 a worker needs
//! S/10 wall seconds, so one core runs (S / 10) / C workers (engine + event encoding only; the
//! HTTP and ZMQ I/O of a live worker come on top).
//!
//! `cargo bench -p kvroute-mock-vllm --bench workers_per_core`

#![allow(missing_docs)] // criterion_main! generates an undocumented `pub fn main`

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use kvroute_mock_vllm::engine::{Engine, EngineConfig, EngineEvent, EngineRequest, Profile};
use kvroute_vllm_wire::{self as wire, KvEvent};

const USERS: u64 = 64;
const SIM_SECONDS: f64 = 60.0;

fn request(id: u64) -> EngineRequest {
    let group = (id % 8) as u32;
    let mut prompt: Vec<u32> = (0..512).map(|i| group * 100_000 + i).collect();
    prompt.extend((0..512).map(|i| 1_000_000 + (id as u32).wrapping_mul(1000) + i));
    EngineRequest {
        id,
        prompt,
        max_tokens: 128,
        ignore_eos: true,
        ..EngineRequest::default()
    }
}

/// Simulates one loaded worker for `SIM_SECONDS`; returns (steps, generated tokens).
fn simulate() -> (u64, u64) {
    let profile = Profile::builtin("l40s-qwen3-32b-fp8").expect("a built-in profile");
    let cfg = EngineConfig::from_profile(&profile);
    let mut engine = Engine::new(profile, cfg);
    let mut next_id = 0;
    for _ in 0..USERS {
        engine
            .submit(request(next_id), 0.0)
            .expect("the bench prompt fits the profile");
        next_id += 1;
    }
    let (mut now, mut steps, mut tokens) = (0.0, 0u64, 0u64);
    while now < SIM_SECONDS {
        let Some(out) = engine.step(now) else { break };
        now = out.end();
        steps += 1;
        let mut kv: Vec<KvEvent> = Vec::new();
        let mut finished = 0;
        for ev in out.events {
            match ev {
                EngineEvent::Token { .. } => tokens += 1,
                EngineEvent::Finished { .. } => finished += 1,
                EngineEvent::Kv(k) => kv.push(k),
                EngineEvent::FirstToken { .. } => {}
            }
        }
        if !kv.is_empty() {
            black_box(wire::encode_batch(now, &kv, Some(0)));
        }
        for _ in 0..finished {
            engine
                .submit(request(next_id), now)
                .expect("the bench prompt fits the profile");
            next_id += 1;
        }
    }
    (steps, tokens)
}

fn bench(c: &mut Criterion) {
    let started = Instant::now();
    let (steps, tokens) = simulate();
    let cpu = started.elapsed().as_secs_f64();
    let workers = SIM_SECONDS / 10.0 / cpu;
    println!(
        "one loaded L40S worker, {SIM_SECONDS} simulated s: {steps} steps, {tokens} tokens, \
         {cpu:.3} s CPU -> {workers:.0} workers per core at speedup 10"
    );
    let mut group = c.benchmark_group("mock_vllm");
    group.sample_size(10);
    group.bench_function("l40s_worker_64_users_60_sim_seconds", |b| {
        b.iter(|| black_box(simulate()))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
