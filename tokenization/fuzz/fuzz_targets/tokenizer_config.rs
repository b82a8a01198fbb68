//! Arbitrary bytes as tokenizer_config.json / special_tokens_map.json / generation_config.json
//! next to the capture's tiny tokenizer.json, then a render: any outcome but a panic is fine.
//! tokenizer.json is parsed once; each input goes through `Tokenizer::with_config_files`,
//! the same configuration path `Tokenizer::from_files` takes (3-4 ms of JSON parsing per
//! input before, which held the target at about 250 executions a second).
#![no_main]

use kvroute_tokenization::{ChatRequest, Tokenizer, TokenizerFiles};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn base() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/vllm-capture/tokenizer/tokenizer.json");
        let tokenizer_json = std::fs::read(p).expect("tiny tokenizer.json");
        Tokenizer::from_files(TokenizerFiles { tokenizer_json, ..TokenizerFiles::default() })
            .expect("tiny tokenizer")
    })
}

fuzz_target!(|data: &[u8]| {
    let (which, rest) = match data.split_first() {
        Some((w, r)) => (*w % 3, r.to_vec()),
        None => return,
    };
    let mut files = TokenizerFiles::default();
    match which {
        0 => files.tokenizer_config_json = Some(rest),
        1 => files.special_tokens_map_json = Some(rest),
        _ => files.generation_config_json = Some(rest),
    }
    if let Ok(t) = base().with_config_files(&files) {
        let req = ChatRequest::new(vec![serde_json::json!({"role": "user", "content": "hi"})]);
        let _ = t.encode_chat(&req, chrono::DateTime::UNIX_EPOCH.fixed_offset());
        let _ = t.decode(&[1, 2, 3], true);
    }
});
