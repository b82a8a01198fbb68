//! Fuzzes the OpenAI request decoder: no input may panic, and whatever decodes must still
//! decode (same model, same stream flag) after the gateway rewrote it for the worker.
#![no_main]

include!("gateway_wire.rs");

use libfuzzer_sys::fuzz_target;
use openai::{Endpoint, decode_request, upstream_body};

fuzz_target!(|data: &[u8]| {
    for endpoint in [Endpoint::ChatCompletions, Endpoint::Completions] {
        if let Ok(req) = decode_request(endpoint, data) {
            let forwarded = upstream_body(&req.body, "served", req.stream);
            let again = decode_request(endpoint, &forwarded).expect("forwarded body decodes");
            assert_eq!(again.model, "served");
            assert_eq!(again.stream, req.stream);
            assert!(!req.stream || again.wants_usage);
        }
    }
});
