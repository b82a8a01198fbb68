//! Fuzzes the Anthropic Messages decoder and the translations back: no input may panic, a
//! decoded request must translate into a chat body the OpenAI decoder accepts, and any JSON
//! (as a worker answer) must translate into an Anthropic message.
#![no_main]

include!("gateway_wire.rs");

use libfuzzer_sys::fuzz_target;
use openai::{Endpoint, upstream_body};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = anthropic::decode_request(data) {
        let forwarded = upstream_body(&req.chat, "served", req.stream);
        openai::decode_request(Endpoint::ChatCompletions, &forwarded).expect("translated body is a valid chat request");
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let msg = anthropic::message_from_chat(&v, "m");
        assert_eq!(msg["type"], "message");
        let mut t = anthropic::StreamTranslator::new("m");
        let mut events = t.on_chunk(&v);
        events.extend(t.finish());
        assert_eq!(events.last().and_then(|e| e.event.as_deref()), Some("message_stop"));
        let _ = error::anthropic_from_upstream(500, data);
    }
});
