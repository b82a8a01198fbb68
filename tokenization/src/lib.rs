//! vLLM-parity tokenization for kvroute: the exact token ids vLLM 0.33 computes for an OpenAI
//! chat or completions request, so the router can hash the same KV blocks the worker will
//! cache, and the mock worker can answer `/tokenize` like vLLM.
//!
//! ```text
//!  tokenizer dir ──Tokenizer::from_dir──► Tokenizer (HF tokenizer.json + compiled templates)
//!                                             │
//!  chat body ──serde──► ChatRequest ──────────┤ chat.rs: vLLM's message rebuild
//!                                             │   (parts joined "\n", tool args parsed,
//!                                             │    developer→system, kwargs merge, tools
//!                                             │    shaped like pydantic's model_dump)
//!                                             │ template.rs: minijinja like transformers
//!                                             │   (trim/lstrip blocks, pycompat, tojson =
//!                                             │    json.dumps, raise_exception, strftime_now(now))
//!                                             ▼
//!                                   prompt String ──segments.rs: split at added tokens,
//!                                                   cached pieces──┐
//!        bpe.rs + pretokenize.rs (Qwen2, Llama 3, gpt-oss,       ▼
//!        Mistral Nemo, DeepSeek-V3): NFC, the split regex by hand,
//!        byte-level BPE, word cache; Gemma 3: SentencePiece-style
//!        BPE with byte fallback, word cache ─────────────────────► Vec<u32>
//!        (any other tokenizer: the `tokenizers` pipeline, pipeline.rs)
//!
//!  completions body ──► PromptInput::{Text ─encode(add_special_tokens)─►, TokenIds ─check─►} Vec<u32>
//! ```
//!
//! Pure library: no network, no clock (`now` is an argument), no panics on input. The
//! [`Tokenizer`] is `Send + Sync`; load it once and share it behind an `Arc`.
//!
//! vLLM's defaults per endpoint: chat and `/tokenize` with `messages` encode with
//! `add_special_tokens = false` (the template writes BOS if the model wants one);
//! `/v1/completions` and `/tokenize` with `prompt` use `add_special_tokens = true`.
//!
//! Encoding a prompt never seen before costs well under a millisecond for 8k tokens with our
//! own BPE (`bpe.rs`; Gemma 3 about 2 ms), about 25x less than the `tokenizers` pipeline, whose
//! per-piece strings, offsets and alignments dominate; it is used only for tokenizer.json
//! files of exactly the shape it implements, and held to the same ids by differential tests
//! (`tests/fast_path.rs`) and a fuzz target (`fuzz/fuzz_targets/fast_path.rs`).
//!
//! How parity was checked: the reference's Qwen3 ids, vLLM's own `/tokenize` answers in the
//! real capture (`tests/golden.rs`), transformers' `apply_chat_template` ids for six families
//! (Qwen3, Llama 3.2, Gemma 3, DeepSeek-V3, gpt-oss, Mistral Nemo: system prompts, tools, tool
//! calls, multi-turn, generation prompt on and off; `goldens/gen.py`, `tests/golden_families.rs`),
//! and a differential run against transformers 5.20.2 (the
//! version range vLLM 0.33 pins) over 3,000 random conversations with the Qwen3, Llama 3.1 and
//! Gemma 3 templates (tools, tool calls, reasoning, thinking flags, multi-part content,
//! continue_final_message): identical prompts and ids (`examples/render_jsonl.rs`).
//!
//! Known differences to vLLM:
//! - media content parts are dropped (vLLM inserts the model's placeholder tokens);
//! - the tokenizer.json pipeline is used as written. transformers 5 rebuilds the normaliser and
//!   pre-tokeniser for tokenizer classes with their own constructor (`LlamaTokenizerFast`,
//!   ...): identical for Qwen2Tokenizer (Qwen3) and PreTrainedTokenizerFast (Llama 3.x), but not
//!   for a byte-level tokenizer.json declared as `LlamaTokenizerFast` (DeepSeek-V3), where ids
//!   differ: transformers 5.20.2 swaps in a Metaspace pre-tokeniser and byte fallback, which
//!   mangles that vocabulary (`Hello world` -> `H`, `ellow`, `orld`). transformers 5.24.0
//!   detects the mismatch and keeps the file's pipeline, as kvroute does: with it all six
//!   families' golden ids, DeepSeek-V3's included, equal kvroute's;
//! - gpt-oss: vLLM's chat endpoint renders `gpt_oss` models with `openai-harmony` rather than
//!   the Jinja template; kvroute renders the model's `chat_template.jinja` exactly as
//!   transformers does, and that harmony's output equals it was not checked here;
//! - templates needing Python Jinja2 features minijinja lacks fail with
//!   [`TokenizeError::Render`];
//! - a request's own `chat_template` runs without a time or size budget: honour it only for
//!   trusted clients (vLLM requires `--trust-request-chat-template`).

mod bpe;
mod chat;
mod config;
mod error;
mod pipeline;
mod pretokenize;
mod prompt;
mod pyjson;
mod segments;
mod template;
mod tokenizer;

pub use chat::ChatRequest;
pub use config::{SpecialTokens, TokenizerFiles};
pub use error::TokenizeError;
pub use prompt::PromptInput;
pub use segments::SegmentCacheStats;
pub use template::ContentFormat;
pub use tokenizer::{ChatEncoding, DEFAULT_SEGMENT_CACHE_BYTES, Tokenizer};

/// The server's local time, for [`Tokenizer::render_chat`]'s `now` (what Python's
/// `datetime.now()` returns in vLLM). Call it at the edge, never in pure code.
pub fn local_now() -> chrono::DateTime<chrono::FixedOffset> {
    chrono::Local::now().fixed_offset()
}

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn tokenizer_is_send_and_sync() {
        assert_send_sync::<crate::Tokenizer>();
    }
}
