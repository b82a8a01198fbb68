//! kvroute-vllm-wire: vLLM's KV-event wire format, read and written in one place. vLLM
//! publishes one `KVEventBatch` per scheduler step over ZMQ; the sidecar decodes it, the
//! mock vLLM encodes it, and the benchmark passes the decoded events around without bytes.
//! All of them use the one event type defined here, so the encoder and the decoder cannot
//! drift apart (a round-trip test and a fuzz target hold them together).
//!
//! ```text
//!  mock vLLM engine --KvEvent--> encode_batch --payload--+              (kvroute-mock-vllm)
//!                                live_message / replay_reply / replay_end
//!                                                        |  ZMQ [topic, seq, payload]
//!                                                        v
//!  sidecar SUB/DEALER --frames--> split_frames --payload--> decode_batch --EventBatch-->
//!        KvEvent::skip_reason --> ResidentSet::apply                        (kvroute-sidecar)
//!  bench sim: engine --KvEvent--> ResidentSet::apply   (no bytes)           (kvroute-e2e)
//! ```
//!
//! Pure code with no dependency beyond `thiserror`: [`event`] (the types), [`decode`]
//! (tolerant msgpack reader: every form vLLM 0.24-0.33 sends, unknown keys and event types
//! skipped, typed errors, never a panic), [`encode`] (msgspec's bytes, as vLLM 0.33 writes
//! them), [`frames`] (ZMQ frames, sequence numbers, replay). Facts about the format:
//! `reference/vllm-interfaces.md`; real captures in `testdata/vllm-capture` back the tests.

#![warn(missing_docs)]

pub mod decode;
pub mod encode;
pub mod event;
pub mod frames;
mod msgpack;

pub use decode::{DecodeError, decode_batch};
pub use encode::{encode_batch, encode_event};
pub use event::{
    BlockRemoved, BlockStored, EventBatch, FULL_ATTENTION, KvEvent, MEDIUM_GPU, RawExtraKey,
    SkipReason,
};
pub use frames::{
    END_MARKER_SEQ, Frames, ReplayRequestError, decode_seq, encode_seq, live_message,
    parse_replay_request, replay_end, replay_reply, replay_request, split_frames,
};
