//! The ingest session (`kvroute_router::ingest::Session`) over a real `RouterState`, fed
//! arbitrary sequences of protobuf-decoded `WorkerReport`s on two concurrent streams, and
//! checked after every report against the naive protocol model of `router/tests/ingest_random.rs`
//! (included by path, so the test and the fuzzer share one model): the answer (acks, snapshot
//! requests, the status code that ends a stream), and per worker the connection, sync state,
//! epoch and block count of the `/debug/workers` view, which must serialize.
//!
//! Input: repeated `[header, len, len bytes of protobuf]` (see `model::feed`: bit 0 of
//! `header` picks the stream slot, bit 7 closes that stream after the report; a chunk that
//! does not decode is skipped, as tonic would refuse it). Streams still open at the end are
//! closed and checked once more.
//! `cargo +nightly fuzz run ingest_session`; seeds in `seeds/ingest_session/`.
#![no_main]

#[path = "../../tests/ingest_random.rs"]
#[allow(dead_code)]
mod model;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut h = model::Harness::new(2);
    model::feed(&mut h, data);
    h.close_all();
});
