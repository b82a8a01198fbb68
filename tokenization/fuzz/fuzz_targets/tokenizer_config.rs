//! Arbitrary bytes as tokenizer_config.json / special_tokens_map.json / generation_config.json
//! next to the capture's tiny tokenizer.json, then a render: any outcome but a panic is fine.
#![no_main]

use kvroute_tokenization::{ChatRequest, Tokenizer, TokenizerFiles};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn tokenizer_json() -> &'static [u8] {
    static T: OnceLock<Vec<u8>> = OnceLock::new();
    T.get_or_init(|| {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/vllm-capture/tokenizer/tokenizer.json");
        std::fs::read(p).expect("tiny tokenizer.json")
    })
}

fuzz_target!(|data: &[u8]| {
    let (which, rest) = match data.split_first() {
        Some((w, r)) => (*w % 3, r.to_vec()),
        None => return,
    };
    let mut files = TokenizerFiles { tokenizer_json: tokenizer_json().to_vec(), ..TokenizerFiles::default() };
    match which {
        0 => files.tokenizer_config_json = Some(rest),
        1 => files.special_tokens_map_json = Some(rest),
        _ => files.generation_config_json = Some(rest),
    }
    if let Ok(t) = Tokenizer::from_files(files) {
        let req = ChatRequest::new(vec![serde_json::json!({"role": "user", "content": "hi"})]);
        let _ = t.encode_chat(&req, chrono::DateTime::UNIX_EPOCH.fixed_offset());
        let _ = t.decode(&[1, 2, 3], true);
    }
});
