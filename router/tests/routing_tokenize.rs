//! `kvroute tokenize` golden test: the Qwen3 ids vLLM's `/tokenize` returns (reference
//! shared/reference/vllm-interfaces.md, copied into testdata) and their kvroute hashes.

use kvroute_router::tokenize_cmd::{HashSeeds, TokenizeInput, tokenize};
use kvroute_tokenization::Tokenizer;

const QWEN3_IDS: [u32; 26] = [
    151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 3838, 374,
    279, 6722, 315, 9625, 30, 151645, 198, 151644, 77091, 198,
];

fn qwen3() -> Tokenizer {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizers/qwen3");
    Tokenizer::from_dir(std::path::Path::new(dir)).expect("qwen3 tokenizer loads")
}

fn body(extra: serde_json::Value) -> serde_json::Value {
    let mut b = serde_json::json!({
        "model": "Qwen/Qwen3-32B",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}
        ]
    });
    if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    b
}

#[test]
fn chat_ids_match_vllm_and_hashes_match_the_shared_chain() {
    let tok = qwen3();
    let out = tokenize(
        &tok,
        &TokenizeInput::Chat(body(serde_json::json!({}))),
        &HashSeeds::default(),
        16,
    )
    .expect("tokenizes");
    assert_eq!(out.token_ids, QWEN3_IDS);
    assert_eq!(out.num_tokens, 26);
    assert_eq!(out.model, "Qwen/Qwen3-32B", "model comes from the body");
    let root = kvroute_hash::root_hash("Qwen/Qwen3-32B", None);
    assert_eq!(
        out.block_hashes,
        kvroute_hash::chain(root, &QWEN3_IDS, 16, &[])
    );
    assert_eq!(out.block_hashes.len(), 1);
    let json = serde_json::to_value(&out).expect("serializes");
    assert_eq!(json["block_size"], 16);
    assert_eq!(json["token_ids"].as_array().map(Vec::len), Some(26));
}

#[test]
fn seeds_change_the_hashes_not_the_ids() {
    let tok = qwen3();
    let input = TokenizeInput::Chat(body(serde_json::json!({"cache_salt": "tenant-a"})));
    let salted = tokenize(&tok, &input, &HashSeeds::default(), 16).expect("tokenizes");
    assert_eq!(salted.cache_salt.as_deref(), Some("tenant-a"));
    let plain = tokenize(
        &tok,
        &TokenizeInput::Chat(body(serde_json::json!({}))),
        &HashSeeds::default(),
        16,
    )
    .expect("tokenizes");
    assert_eq!(salted.token_ids, plain.token_ids);
    assert_ne!(salted.block_hashes, plain.block_hashes);
    let seeds = HashSeeds {
        model: Some("other".into()),
        lora: Some("adapter".into()),
        ..HashSeeds::default()
    };
    let other = tokenize(
        &tok,
        &TokenizeInput::Chat(body(serde_json::json!({}))),
        &seeds,
        8,
    )
    .expect("tokenizes");
    assert_eq!(other.block_hashes.len(), 3);
    assert_eq!(
        other.block_hashes,
        kvroute_hash::chain(
            kvroute_hash::root_hash("other", Some("adapter")),
            &QWEN3_IDS,
            8,
            &[]
        )
    );
}

#[test]
fn thinking_off_appends_the_empty_think_block() {
    let tok = qwen3();
    let input = TokenizeInput::Chat(body(
        serde_json::json!({"chat_template_kwargs": {"enable_thinking": false}}),
    ));
    let out = tokenize(&tok, &input, &HashSeeds::default(), 16).expect("tokenizes");
    assert_eq!(out.num_tokens, 30);
    assert_eq!(&out.token_ids[26..], &[151667, 271, 151668, 271]);
}

#[test]
fn prompts_and_bad_input() {
    let tok = qwen3();
    let input = TokenizeInput::Prompt {
        text: "hello world".into(),
        add_special_tokens: true,
    };
    let seeds = HashSeeds {
        fallback_model: "qwen3".into(),
        ..HashSeeds::default()
    };
    let out = tokenize(&tok, &input, &seeds, 16).expect("tokenizes");
    assert_eq!(out.model, "qwen3");
    assert!(
        out.num_tokens > 0 && out.block_hashes.is_empty(),
        "shorter than one block"
    );
    assert!(
        tokenize(&tok, &input, &seeds, 0).is_err(),
        "block size 0 is an error, not a panic"
    );
    let bad = TokenizeInput::Chat(serde_json::json!({"messages": "not a list"}));
    assert!(tokenize(&tok, &bad, &seeds, 16).is_err());
}
