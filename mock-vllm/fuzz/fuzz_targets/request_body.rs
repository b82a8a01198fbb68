//! Any HTTP body: parsing, parameter validation, prompt encoding and the max_model_len checks
//! must answer with a typed error, never panic.
#![no_main]

use kvroute_mock_vllm::openai::{self, RequestParams};
use kvroute_mock_vllm::text::TextModel;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = openai::parse_body(data) else { return };
    let Ok(params) = RequestParams::from_value(&v) else { return };
    let text = TextModel::Bytes;
    let ids = if v.get("messages").is_some() {
        text.encode_chat(&v).map(|(_, ids)| ids)
    } else if let Some(p) = v.get("prompt") {
        text.encode_prompt(p, true)
    } else {
        return;
    };
    if let Ok(ids) = ids {
        let _ = params.effective_max_tokens(ids.len(), 1024);
        let _ = text.decode(&ids);
    }
});
