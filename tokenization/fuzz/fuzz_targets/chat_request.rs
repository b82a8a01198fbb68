//! Arbitrary bytes as an OpenAI chat body (or completions prompt) through the Qwen3 tokenizer:
//! any outcome but a panic is fine.
#![no_main]

use kvroute_tokenization::{ChatRequest, PromptInput, Tokenizer};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizers/qwen3");
        Tokenizer::from_dir(&dir).expect("qwen3 tokenizer")
    })
}

fuzz_target!(|data: &[u8]| {
    let now = chrono::DateTime::UNIX_EPOCH.fixed_offset();
    if let Ok(mut req) = serde_json::from_slice::<ChatRequest>(data) {
        // Request templates are only honoured for trusted clients; keep the fuzzer on the
        // tokenizer's own template so it explores message handling, not Jinja loops.
        req.chat_template = None;
        let _ = tokenizer().encode_chat(&req, now);
    }
    if let Ok(prompt) = serde_json::from_slice::<PromptInput>(data) {
        let _ = tokenizer().encode_prompt(&prompt, true);
    }
});
