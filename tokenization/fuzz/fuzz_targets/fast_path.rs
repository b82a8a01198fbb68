//! Differential fuzzing of kvroute's byte-level BPE fast path: for any text, the ids must be
//! exactly those of the HuggingFace `tokenizers` pipeline (the truth).
//!
//! Input: a first byte picking the mode (its low bit) and the tokenizer family (Qwen3,
//! Llama 3, gpt-oss, Mistral Nemo, Gemma 3, DeepSeek-V3), then either UTF-8 text (lossy) or bytes
//! that each pick a fragment (added tokens, contractions, Unicode classes, letter case, marks,
//! whitespace mixes), so the fuzzer reaches the interesting boundaries quickly. When
//! `mode / 12` is odd, the tokenizer keeps its default segment cache, so a long text goes
//! through the chunk cache: it is encoded twice (the second time from cached chunks), then its
//! first half (the same first chunks, a different end); chunks from earlier inputs stay cached.
#![no_main]

use kvroute_tokenization::Tokenizer;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const FAMILIES: [&str; 6] = [
    "qwen3",
    "llama3",
    "gpt-oss",
    "mistral-nemo",
    "gemma3",
    "deepseek-v3",
];

fn tokenizer(family: usize) -> &'static Tokenizer {
    static T: [OnceLock<Tokenizer>; 6] = [const { OnceLock::new() }; 6];
    let name = FAMILIES[family % FAMILIES.len()];
    T[family % FAMILIES.len()].get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/tokenizers")
            .join(name);
        let t = Tokenizer::from_dir(&dir)
            .expect("tokenizer")
            .with_segment_cache_bytes(0);
        assert!(t.fast_path(), "{name}");
        t
    })
}

/// The same tokenizers with their default segment cache (chunked caching of long pieces).
fn cached(family: usize) -> &'static Tokenizer {
    static T: [OnceLock<Tokenizer>; 6] = [const { OnceLock::new() }; 6];
    let name = FAMILIES[family % FAMILIES.len()];
    T[family % FAMILIES.len()].get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/tokenizers")
            .join(name);
        Tokenizer::from_dir(&dir).expect("tokenizer")
    })
}

const FAMILY_COUNT: u8 = 6;

const FRAGMENTS: &[&str] = &[
    "a", "Z", "hello", " world", "'", "'s", "'S", "'ll", "'LL", "'re", "'Ve", "'d", "'m", "'t",
    "'\u{17f}", "0", "12", "\u{b2}", "\u{663}", "\u{2166}", ".", "...", "!", " (", ")", "-", "_",
    "\"", "#", "\\", "`", " ", "  ", "\t", "\n", "\r", "\r\n", " \n", "\u{a0}", "\u{3000}",
    "\u{85}", "\u{2028}", "\u{200b}", "\u{feff}", "\u{b}", "e\u{301}", "\u{301}", "\u{308}",
    "\u{1100}", "\u{1161}", "\u{11a8}", "\u{ac00}", "\u{212b}", "\u{f900}", "\u{4e2d}",
    "\u{6587}", "\u{30ab}", "\u{3099}", "\u{ff41}", "\u{d55c}", "\u{1f600}", "\u{1f3fd}",
    "\u{200d}", "\u{fe0f}", "\u{627}", "\u{64b}", "\u{939}", "\u{94d}", "\u{e20}", "\u{0}",
    "\u{7f}", "\u{fffd}", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
    "<|im_", "|>", "<tool_call>", "camelCase", "HTTPServer", "\u{1c5}", "\u{2b0}", "A\u{301}",
    " \u{301}", "\u{5b8}", "/", "://", "123", "4567", "<|eot_id|>", "<|start|>", "<|end|>",
    "[INST]", "> </", "<start_of_turn>", "\u{2581}", "\u{4e2d}\u{9fa6}", ".abc", "\u{ff01}",
];

fuzz_target!(
    // The six tokenizers load before the first input: loading one lazily inside an input took
    // over libFuzzer's 10 s unit timeout on a loaded machine during `cargo fuzz cmin`, and the
    // timeout's signal handler then deadlocked in malloc (seen 2026-12-02).
    init: {
        for family in 0..FAMILIES.len() {
            tokenizer(family);
            cached(family);
        }
    },
    |data: &[u8]| {
        let Some((&mode, rest)) = data.split_first() else {
            return;
        };
        let text = if mode % 2 == 0 {
            String::from_utf8_lossy(rest).into_owned()
        } else {
            rest.iter()
                .map(|&b| FRAGMENTS[usize::from(b) % FRAGMENTS.len()])
                .collect()
        };
        let family = usize::from(mode / 2);
        if (mode / (2 * FAMILY_COUNT)) % 2 == 1 {
            let t = cached(family);
            let truth = t.encode_text_uncached(&text, false).expect("tokenizers");
            for pass in 0..2 {
                let ours = t.encode_text(&text, false).expect("fast path");
                assert_eq!(ours, truth, "ids differ (pass {pass}) for {text:?}");
            }
            let mut half = text.len() / 2;
            while !text.is_char_boundary(half) {
                half -= 1;
            }
            let head = &text[..half];
            let truth = t.encode_text_uncached(head, false).expect("tokenizers");
            let ours = t.encode_text(head, false).expect("fast path");
            assert_eq!(ours, truth, "ids differ for the first half of {text:?}");
            return;
        }
        let t = tokenizer(family);
        let truth = t.encode_text_uncached(&text, false).expect("tokenizers");
        let ours = t.encode_text(&text, false).expect("fast path");
        assert_eq!(ours, truth, "ids differ for {text:?}");
    }
);
