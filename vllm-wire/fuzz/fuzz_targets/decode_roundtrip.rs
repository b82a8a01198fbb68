//! Arbitrary bytes -> decode: never a panic, only a typed error. Whatever decodes encodes to
//! bytes that decode to the same batch, and those bytes encode again unchanged (the encoder is
//! a function of the decoded value). The same bytes cut into frames exercise the frame split
//! and the replay request parser.
//!
//! `cargo +nightly fuzz run decode_roundtrip seeds/decode_roundtrip` (seeds: vLLM's captured
//! payloads and 0.33's synthetic ones).
#![no_main]

use kvroute_vllm_wire::{decode_batch, parse_replay_request, split_frames};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let frames: Vec<&[u8]> = data.chunks(9).collect();
    let _ = parse_replay_request(&frames);
    if let Ok(f) = split_frames(&frames) {
        let _ = decode_batch(f.payload);
    }

    let Ok(batch) = decode_batch(data) else {
        return;
    };
    let bytes = batch.encode();
    let back = match decode_batch(&bytes) {
        Ok(b) => b,
        Err(e) => panic!("re-encoded batch does not decode: {e}\n{batch:?}"),
    };
    // Compared bit for bit: a NaN timestamp must survive too.
    assert_eq!(back.ts.to_bits(), batch.ts.to_bits());
    assert_eq!(back.dp_rank, batch.dp_rank);
    assert_eq!(back.events, batch.events);
    assert_eq!(back.encode(), bytes);
});
