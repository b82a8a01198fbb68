//! Differential tests of kvroute's byte-level BPE fast path against the HuggingFace
//! `tokenizers` pipeline (the truth): generated text full of the cases where a hand-written
//! pre-tokenizer could drift (Unicode classes, contractions, whitespace runs, NFC, special
//! tokens inside text, long words), plus real files of the repository. Every family whose
//! tokenizer takes the fast path (Qwen3, Llama 3.x, gpt-oss, Mistral Nemo, Gemma 3) runs every
//! test.

use kvroute_tokenization::Tokenizer;
use std::path::PathBuf;
use std::sync::OnceLock;

fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata")
        .join(rel)
}

fn load(family: &str) -> Tokenizer {
    match Tokenizer::from_dir(&testdata(&format!("tokenizers/{family}"))) {
        Ok(t) => t.with_segment_cache_bytes(0),
        Err(e) => panic!("{family}: {e}"),
    }
}

/// The tokenizers of every family that takes the fast path, loaded once.
fn fast_families() -> &'static [(&'static str, Tokenizer)] {
    static T: OnceLock<Vec<(&'static str, Tokenizer)>> = OnceLock::new();
    T.get_or_init(|| {
        FAST_FAMILIES
            .iter()
            .map(|&family| (family, load(family)))
            .collect()
    })
}

const FAST_FAMILIES: [&str; 6] = [
    "qwen3",
    "llama3",
    "gpt-oss",
    "mistral-nemo",
    "gemma3",
    "deepseek-v3",
];

/// Fragments the generator strings together.
const FRAGMENTS: &[&str] = &[
    // ASCII words, both cases, and contractions (the regex folds case: 'S, 'LL, and U+017F).
    "hello",
    " world",
    "The",
    " QUICK",
    "x",
    " a",
    "don't",
    "I'M",
    "we'Re",
    "'s",
    "'S",
    "'t",
    "'re",
    "'RE",
    "'ve",
    "'Ve",
    "'m",
    "'ll",
    "'LL",
    "'lL",
    "'d",
    "'D",
    "'\u{17f}",
    "'",
    "''",
    "'x",
    " 'tis",
    "rock'n'roll",
    "O'Neil's",
    // digits and number-like characters
    "0",
    "42",
    "2024-11-30",
    "3.14159",
    " 1,000,000",
    "\u{b2}\u{b3}",
    "\u{663}\u{664}",
    "\u{216b}",
    "\u{2460}",
    "\u{ff11}",
    // punctuation runs, code, and brackets
    ".",
    "...",
    "!?",
    " --",
    "----------",
    " (",
    ")",
    "{}",
    "[]",
    " +=",
    "::",
    "->",
    "=>",
    "\"",
    " \"quoted\"",
    "#",
    "$",
    "%",
    "&&",
    "||",
    "<",
    ">",
    "</",
    "/>",
    "`",
    "```",
    "~",
    "@",
    "^",
    "*",
    "_",
    "__init__",
    "\\",
    "|",
    ";",
    ":",
    ",",
    "?",
    "\u{2014}",
    "\u{2026}",
    "\u{ab}",
    "\u{bb}",
    "\u{201c}",
    "\u{201d}",
    // whitespace, incl. Unicode spaces, CR/LF mixes, tabs and trailing runs
    " ",
    "  ",
    "   ",
    "\t",
    "\t\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r",
    "\r\n\r\n",
    " \n",
    "\n ",
    "  \n  ",
    "\u{a0}",
    "\u{3000}",
    "\u{85}",
    "\u{2028}",
    "\u{2029}",
    "\u{2009}",
    "\u{200b}",
    "\u{feff}",
    "\u{b}",
    "\u{c}",
    "\u{1680}",
    // Unicode letters, marks and scripts
    "\u{e9}",
    "\u{df}",
    "\u{f1}o",
    "\u{3a9}",
    "\u{416}\u{438}\u{437}\u{43d}\u{44c}",
    "\u{627}\u{644}\u{639}\u{631}\u{628}\u{64a}\u{629}",
    "\u{939}\u{93f}\u{902}\u{926}\u{940}",
    "\u{915}\u{94d}\u{937}",
    "\u{e20}\u{e32}\u{e29}\u{e32}",
    "\u{5e9}\u{5dc}\u{5d5}\u{5dd}",
    // combining sequences that NFC changes, and ones it keeps
    "e\u{301}",
    "\u{301}",
    "a\u{308}\u{304}",
    "A\u{30a}",
    "\u{212b}",
    "\u{1100}\u{1161}\u{11a8}",
    "\u{ac00}\u{11a8}",
    "q\u{307}\u{323}",
    "\u{344}",
    "\u{f900}",
    "\u{2126}",
    // CJK, kana, fullwidth, Hangul
    "\u{4e2d}\u{6587}",
    "\u{65e5}\u{672c}\u{8a9e}",
    "\u{30ab}\u{30bf}\u{30ab}\u{30ca}",
    "\u{3072}\u{3089}\u{304c}\u{306a}",
    "\u{ff48}\u{ff41}\u{ff4c}\u{ff46}",
    "\u{d55c}\u{ad6d}\u{c5b4}",
    "\u{3002}",
    "\u{ff0c}",
    "\u{20000}",
    // emoji, ZWJ sequences, flags, variation selectors
    "\u{1f600}",
    "\u{1f44d}\u{1f3fd}",
    "\u{1f468}\u{200d}\u{1f469}\u{200d}\u{1f467}",
    "\u{1f1fa}\u{1f1f8}",
    "\u{2764}\u{fe0f}",
    "\u{fffd}",
    // control characters
    "\u{0}",
    "\u{1b}[0m",
    "\u{7f}",
    // added tokens inside text, and near-misses
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<|im_",
    "|>",
    "<tool_call>",
    "<|vision_pad|>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|python_tag|>",
    // digit runs of every length around Llama 3's three-digit pieces
    "1234",
    "12345678901",
    "\u{663}\u{664}\u{665}\u{666}",
    // letter case inside words, titlecase, modifier letters and marks (the cased split of
    // gpt-oss and Mistral Nemo), slashes after punctuation
    "camelCase",
    "HTTPServer",
    "iPhone",
    "ABC",
    "\u{1c5}",
    "\u{2b0}",
    "\u{2b0}A",
    "a\u{2b0}B",
    "\u{301}a",
    "A\u{301}",
    "A\u{301}B",
    " \u{301}",
    "\u{903}",
    "\u{5d0}\u{5b8}",
    "\u{e01}\u{e31}",
    "://",
    "\n/",
    "/\n",
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "[INST]",
    "[/INST]",
    // SentencePiece words (Gemma 3): `▁` runs, and the one vocab entry that glues a
    // character to a following space (`>▁</`)
    "<b> </b>",
    "> </",
    ">  </",
    "\u{2581}",
    "x\u{2581}\u{2581}y",
    "<start_of_turn>",
    "<end_of_turn>",
    // DeepSeek-V3: digits, CJK runs and punctuation+letters split in three steps
    "\u{4e00}\u{9fa5}",
    "\u{9fa6}",
    "\u{3041}\u{30a1}",
    ".abc",
    "#x",
    "\u{ff01}a",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
];

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn generated(seed: u64, cases: usize) -> Vec<String> {
    let mut x = seed;
    (0..cases)
        .map(|_| {
            let n = 1 + (xorshift(&mut x) % 24) as usize;
            let mut s = String::new();
            for _ in 0..n {
                let f = FRAGMENTS[(xorshift(&mut x) % FRAGMENTS.len() as u64) as usize];
                // Now and then repeat a fragment to make long runs and long words.
                let reps = if xorshift(&mut x).is_multiple_of(16) {
                    1 + (xorshift(&mut x) % 40) as usize
                } else {
                    1
                };
                for _ in 0..reps {
                    s.push_str(f);
                }
            }
            s
        })
        .collect()
}

fn assert_same(family: &str, t: &Tokenizer, text: &str) {
    let truth = match t.encode_text_uncached(text, false) {
        Ok(ids) => ids,
        Err(e) => panic!("{family}: tokenizers failed on {text:?}: {e}"),
    };
    let ours = match t.encode_text(text, false) {
        Ok(ids) => ids,
        Err(e) => panic!("{family}: fast path failed on {text:?}: {e}"),
    };
    if ours != truth {
        let at = ours.iter().zip(&truth).take_while(|(a, b)| a == b).count();
        let shown: String = text.chars().take(300).collect();
        panic!(
            "{family}: ids differ from index {at} ({} vs {} ids) for {shown:?}",
            ours.len(),
            truth.len()
        );
    }
}

#[test]
fn fast_families_take_the_fast_path_and_the_tiny_tokenizer_does_not() {
    for (family, t) in fast_families() {
        assert!(t.fast_path(), "{family}");
    }
    let tiny = match Tokenizer::from_dir(&testdata("vllm-capture/tokenizer")) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    };
    // GPT-2 style ByteLevel(use_regex) pre-tokenizer: not the shape we implement.
    assert!(!tiny.fast_path());
}

#[test]
fn generated_text_matches_tokenizers() {
    let cases = generated(0x5eed_1234_abcd_0001, 6000);
    for (family, t) in fast_families() {
        for text in &cases {
            assert_same(family, t, text);
        }
        // Once more with every word in the word cache.
        for text in &cases {
            assert_same(family, t, text);
        }
    }
}

#[test]
fn single_fragments_and_pairs_match_tokenizers() {
    for (family, t) in fast_families() {
        for a in FRAGMENTS {
            assert_same(family, t, a);
            for b in FRAGMENTS {
                assert_same(family, t, &format!("{a}{b}"));
            }
        }
    }
}

#[test]
fn every_ascii_triple_matches_tokenizers() {
    // All 3-byte strings over a class-covering ASCII alphabet: exercises each alternative of
    // the split regex at every boundary, including text ending in whitespace.
    let alphabet = [
        "a", "S", "s", "'", " ", "\t", "\n", "\r", "1", ".", "l", "e", "/", "\u{301}", "\u{2b0}",
    ];
    for (family, t) in fast_families() {
        for a in alphabet {
            for b in alphabet {
                for c in alphabet {
                    for d in ["", " ", "x", "\n", "1"] {
                        assert_same(family, t, &format!("{a}{b}{c}{d}"));
                    }
                }
            }
        }
    }
}

#[test]
fn repository_files_match_tokenizers() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let files = [
        root.join("src/bpe.rs"),
        root.join("src/chat.rs"),
        root.join("src/pyjson.rs"),
        root.join("../testdata/tokenizers/qwen3/tokenizer_config.json"),
        root.join("../testdata/vllm-capture/requests.jsonl"),
        root.join("../testdata/vllm-capture/README.md"),
    ];
    for path in files {
        let text = match std::fs::read_to_string(&path) {
            Ok(s) => s,
            Err(e) => panic!("{}: {e}", path.display()),
        };
        // Whole file, and in chunks that start and end mid-line.
        let chars: Vec<char> = text.chars().collect();
        for (family, t) in fast_families() {
            assert_same(family, t, &text);
            for chunk in chars.chunks(997) {
                assert_same(family, t, &chunk.iter().collect::<String>());
            }
        }
    }
}

/// Long pieces are cached in chunks (byte-level families): texts that share a long beginning
/// and then differ, ending at every few hundred bytes (so some end right at, before and after
/// a chunk's cut), encoded with the cache warm from the ones before, give the pipeline's ids;
/// and the shared chunks are found again, not re-encoded.
#[test]
fn long_texts_sharing_a_beginning_match_tokenizers_through_the_chunk_cache() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let text = match std::fs::read_to_string(root.join("src/chat.rs")) {
        Ok(s) => s,
        Err(e) => panic!("src/chat.rs: {e}"),
    };
    // Source text (code, prose, indentation), then generated text (every fragment above:
    // whitespace runs, digits, contractions, other scripts), about 9,000 bytes each.
    let generated_text = generated(0x5eed_1234_abcd_0002, 400).concat();
    for base in [
        text.chars().take(9_000).collect::<String>(),
        generated_text.chars().take(9_000).collect::<String>(),
        // Dense whitespace runs: a cut inside one would change the split.
        (0..250)
            .map(|i| {
                format!(
                    "alpha{}beta{}gamma\n{}delta epsilon {i} ",
                    " ".repeat(1 + i % 3),
                    " ".repeat(2 + i % 4),
                    " ".repeat(i % 5)
                )
            })
            .collect::<String>(),
    ] {
        shares_chunks_and_matches(&base);
    }
}

fn shares_chunks_and_matches(base: &str) {
    let bounds: Vec<usize> = (1000..base.len())
        .step_by(401)
        .filter(|&n| base.is_char_boundary(n))
        .collect();
    for family in FAST_FAMILIES {
        // The default segment cache (the shared `fast_families` have none).
        let t = match Tokenizer::from_dir(&testdata(&format!("tokenizers/{family}"))) {
            Ok(t) => t,
            Err(e) => panic!("{family}: {e}"),
        };
        assert_same(family, &t, base);
        for &n in &bounds {
            let prefix = base.get(..n).unwrap_or_default();
            assert_same(family, &t, prefix);
            assert_same(
                family,
                &t,
                &format!("{prefix} and then a new question {n}?"),
            );
        }
        let before = t.segment_cache_stats();
        assert_same(family, &t, &format!("{base} and one more question"));
        let after = t.segment_cache_stats();
        if family != "gemma3" {
            // 9,000 characters are several chunks, all but the last found again.
            assert!(
                after.hits - before.hits >= 3,
                "{family}: {} chunks found again",
                after.hits - before.hits
            );
        }
    }
}
