//! Whatever vLLM's decoder (kvroute-vllm-wire) accepts is applied to a resident set: no input
//! may panic the sidecar's re-hashing and bookkeeping. The wire format's own round trips are
//! fuzzed in vllm-wire/fuzz.
//!
//! `cargo +nightly fuzz run apply_events ../../vllm-wire/fuzz/seeds/decode_roundtrip`
//!
//! The pure state module is compiled in directly (`#[path]`) rather than through the
//! `kvroute-sidecar` crate, so the fuzz build does not pull tonic, axum, zeromq and reqwest
//! onto a nightly toolchain; it depends only on `kvroute-hash` and `kvroute-vllm-wire`.
#![no_main]

#[path = "../../src/state.rs"]
#[allow(dead_code)]
mod state;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = kvroute_vllm_wire::decode_batch(data) else {
        return;
    };
    let mut set = state::ResidentSet::new(state::StateConfig {
        model: "m".into(),
        default_lora: None,
        block_size: None,
        max_blocks: 1 << 16,
    });
    let mut ops = state::Ops::default();
    let mut stats = state::ApplyStats::default();
    for event in &batch.events {
        set.apply(event, &mut ops, &mut stats);
    }
});
