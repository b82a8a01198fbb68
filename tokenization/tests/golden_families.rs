//! Golden prompts and ids per model family (Qwen3, Llama 3.x, Gemma 3, DeepSeek-V3, gpt-oss,
//! Mistral Nemo): `goldens/families.json`, written by `goldens/gen.py` from transformers'
//! `apply_chat_template` (what vLLM renders with), compared case by case with kvroute's
//! `Tokenizer::encode_chat`. A case whose template raised in Python must fail here too.
//!
//! DeepSeek-V3 declares `LlamaTokenizerFast`; transformers 5 rebuilds that class's pipeline
//! (Metaspace instead of the file's byte-level split) and so its ids differ from what the
//! file's own pipeline gives. kvroute uses the file as written: for such cases the ids are
//! compared with `tokenizer_json_ids` (the file's pipeline on the same prompt), and the
//! prompt, which is what the template decides, must still match exactly. (transformers 5.24.0
//! keeps the file's pipeline for DeepSeek-V3 and gives exactly `tokenizer_json_ids`.)

use chrono::{DateTime, FixedOffset};
use kvroute_tokenization::{ChatRequest, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn goldens() -> Value {
    let path = root().join("goldens/families.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn now(doc: &Value) -> DateTime<FixedOffset> {
    let s = doc["now"].as_str().unwrap_or_default();
    DateTime::parse_from_rfc3339(s).unwrap_or_else(|e| panic!("now {s:?}: {e}"))
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("ids: {e}"))
}

/// Checks every case of one family; returns how many were compared.
fn check_family(family: &str) -> usize {
    let doc = goldens();
    let now = now(&doc);
    let cases = doc["families"][family]["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("no cases for {family}"))
        .clone();
    let dir = root().join("../testdata/tokenizers").join(family);
    let t = Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{family}: {e}"));
    let mut checked = 0;
    for case in &cases {
        let name = case["name"].as_str().unwrap_or_default();
        let req: ChatRequest = serde_json::from_value(case["request"].clone())
            .unwrap_or_else(|e| panic!("{family}/{name}: request: {e}"));
        let got = t.encode_chat(&req, now);
        if let Some(err) = case.get("error") {
            assert!(
                got.is_err(),
                "{family}/{name}: transformers raised {err}, kvroute rendered {:?}",
                got.map(|e| e.prompt)
            );
            checked += 1;
            continue;
        }
        let enc = got.unwrap_or_else(|e| panic!("{family}/{name}: {e}"));
        assert_eq!(
            enc.prompt,
            case["prompt"].as_str().unwrap_or_default(),
            "{family}/{name}: prompt"
        );
        let expected = match case.get("tokenizer_json_ids") {
            Some(file_ids) => ids(file_ids),
            None => ids(&case["ids"]),
        };
        assert_eq!(enc.token_ids, expected, "{family}/{name}: ids");
        // Cold and uncached encoding agree with the cached path.
        assert_eq!(
            t.encode_text_uncached(&enc.prompt, false)
                .unwrap_or_else(|e| panic!("{e}")),
            expected,
            "{family}/{name}: uncached ids"
        );
        checked += 1;
    }
    checked
}

#[test]
fn qwen3_matches_transformers() {
    assert_eq!(check_family("qwen3"), 9);
}

#[test]
fn llama3_matches_transformers() {
    assert_eq!(check_family("llama3"), 9);
}

#[test]
fn gemma3_matches_transformers() {
    assert_eq!(check_family("gemma3"), 9);
}

#[test]
fn deepseek_v3_matches_transformers_prompts() {
    assert_eq!(check_family("deepseek-v3"), 9);
}

#[test]
fn gpt_oss_matches_transformers() {
    assert_eq!(check_family("gpt-oss"), 9);
}

#[test]
fn mistral_nemo_matches_transformers() {
    assert_eq!(check_family("mistral-nemo"), 9);
}

/// Only the DeepSeek-V3 cases differ between transformers and the file's pipeline: a golden
/// file regenerated with a transformers that changes this shows up here.
#[test]
fn only_deepseek_ids_come_from_a_rebuilt_pipeline() {
    let doc = goldens();
    let families = doc["families"].as_object().cloned().unwrap_or_default();
    assert_eq!(families.len(), 6);
    for (family, v) in families {
        let rebuilt = v["cases"]
            .as_array()
            .map(|c| {
                c.iter()
                    .filter(|c| c.get("tokenizer_json_ids").is_some())
                    .count()
            })
            .unwrap_or(0);
        if family == "deepseek-v3" {
            assert_eq!(rebuilt, 9, "{family}");
        } else {
            assert_eq!(rebuilt, 0, "{family}");
        }
    }
}
