//! Fuzzes the vLLM KV-event decoder (frames + msgpack payload) and applies whatever decodes to
//! a resident set: no input may panic.
//!
//! The pure modules are compiled in directly (`#[path]`) rather than through the
//! `kvroute-sidecar` crate, so the fuzz build does not pull tonic, axum, zeromq and reqwest
//! onto a nightly toolchain; they have no other dependencies than `thiserror` and
//! `kvroute-hash`.
#![no_main]

#[path = "../../src/wire.rs"]
#[allow(dead_code)]
mod wire;
#[path = "../../src/state.rs"]
#[allow(dead_code)]
mod state;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte picks the split of the input into [seq frame, payload] frames.
    let (frames, payload) = match data.split_first() {
        Some((&cut, rest)) => {
            let cut = usize::from(cut).min(rest.len());
            (vec![&rest[..cut], &rest[cut..]], rest)
        }
        None => (vec![], data),
    };
    let _ = wire::split_frames(&frames);
    if let Ok(batch) = wire::decode_batch(payload) {
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
    }
});
