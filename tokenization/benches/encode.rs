//! Cost of turning a request into token ids, the router's per-request tokenization step.
//!
//! `cargo bench -p kvroute-tokenization --bench encode`
//!
//! Cases: an ~8k-token multi-turn Qwen3 chat (render + encode with a warm segment cache, with
//! no cache, with a new final message each time, and render / encode alone), the same text as
//! a completions prompt, its messages' text as one completions prompt with a new question
//! appended each time (`completion_8k/new_suffix`), and the small reference chat.
//!
//! Cold encoding (a prompt never seen before): `cold/*` start every iteration with empty
//! segment and word caches, on the synthetic chat and on a chat of varied text (this crate's
//! sources: code, prose, many distinct words); `hf_pipeline/*` is the same text through the
//! `tokenizers` crate (what the fast path replaces).
//!
//! Families: `family/<name>/cold_chat_8k` and `family/<name>/cold_varied_8k` are the cold
//! cases for each vendored tokenizer (Qwen3, Llama 3, Gemma 3, DeepSeek-V3, gpt-oss, Mistral
//! Nemo), each with its own template; run only them with
//! `cargo bench -p kvroute-tokenization --bench encode -- family/`.

#![allow(missing_docs)] // criterion_main! generates an undocumented `pub fn main`

use criterion::{Criterion, criterion_group, criterion_main};
use kvroute_tokenization::{ChatRequest, PromptInput, Tokenizer};
use serde_json::{Value, json};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn tokenizer() -> Tokenizer {
    family_tokenizer("qwen3")
}

fn family_tokenizer(family: &str) -> Tokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/tokenizers")
        .join(family);
    match Tokenizer::from_dir(&dir) {
        Ok(t) => t,
        Err(e) => panic!("loading {}: {e}", dir.display()),
    }
}

/// A deterministic multi-turn chat of roughly `target_tokens` tokens.
fn long_chat(t: &Tokenizer, target_tokens: usize) -> ChatRequest {
    let words = [
        "router",
        "prefix",
        "cache",
        "block",
        "worker",
        "latency",
        "token",
        "prefill",
        "decode",
        "queue",
        "the",
        "of",
        "and",
        "to",
        "a",
        "is",
        "for",
        "with",
        "on",
        "GPU",
        "KV",
        "hash",
        "1234",
        "vLLM",
        "Kubernetes",
        "pod",
        "score",
        "load",
        "predict",
        "first",
        "time",
    ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut sentence = |n: usize| -> String {
        let mut s = String::new();
        for i in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let w = words[(x % words.len() as u64) as usize];
            if i > 0 {
                s.push(' ');
            }
            s.push_str(w);
        }
        s.push('.');
        s
    };
    // Roles alternate user/assistant after the system prompt (Gemma's template insists).
    let mut messages: Vec<Value> = vec![json!({"role": "system", "content": sentence(400)})];
    loop {
        let mut turn = messages.clone();
        turn.push(json!({"role": "user", "content": sentence(60)}));
        let req = ChatRequest::new(turn);
        let n = match t.encode_chat(&req, chrono::DateTime::UNIX_EPOCH.fixed_offset()) {
            Ok(e) => e.token_ids.len(),
            Err(e) => panic!("{e}"),
        };
        if n >= target_tokens {
            return req;
        }
        messages.push(json!({"role": "user", "content": sentence(210)}));
        messages.push(json!({"role": "assistant", "content": sentence(250)}));
    }
}

/// A multi-turn chat of roughly `target_tokens` tokens of varied text: this crate's sources,
/// cut into messages.
fn varied_chat(t: &Tokenizer, target_tokens: usize) -> ChatRequest {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut text = String::new();
    for name in [
        "chat.rs",
        "tokenizer.rs",
        "template.rs",
        "pyjson.rs",
        "config.rs",
        "bpe.rs",
    ] {
        match std::fs::read_to_string(src.join(name)) {
            Ok(s) => text.push_str(&s),
            Err(e) => panic!("{name}: {e}"),
        }
    }
    let chars: Vec<char> = text.chars().collect();
    let mut messages: Vec<Value> = Vec::new();
    let mut roles = ["user", "assistant"].iter().cycle();
    for chunk in chars.chunks(1500) {
        let role = roles.next().copied().unwrap_or("user");
        messages.push(json!({"role": role, "content": chunk.iter().collect::<String>()}));
        let req = ChatRequest::new(messages.clone());
        let n = t.encode_chat(&req, chrono::DateTime::UNIX_EPOCH.fixed_offset());
        if n.map(|e| e.token_ids.len()).unwrap_or(0) >= target_tokens && role == "user" {
            return req;
        }
    }
    ChatRequest::new(messages)
}

/// Times `f` on a tokenizer whose segment and word caches are empty at every iteration.
fn cold_iter(t: &mut Option<Tokenizer>, iters: u64, mut f: impl FnMut(&Tokenizer)) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let Some(fresh) = t.take().map(|t| t.with_segment_cache_bytes(0)) else {
            break;
        };
        let start = Instant::now();
        f(&fresh);
        total += start.elapsed();
        *t = Some(fresh);
    }
    total
}

fn bench(c: &mut Criterion) {
    let t = tokenizer();
    let now = chrono::DateTime::UNIX_EPOCH.fixed_offset();
    let chat = long_chat(&t, 8192);
    let prompt = match t.render_chat(&chat, now) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    let n_tokens = t.encode_text(&prompt, false).map(|v| v.len()).unwrap_or(0);
    eprintln!(
        "long chat: {} messages, {} chars, {n_tokens} tokens",
        chat.messages.len(),
        prompt.len()
    );

    c.bench_function("chat_8k/render_and_encode", |b| {
        b.iter(|| t.encode_chat(black_box(&chat), now))
    });
    // No segment cache: every piece is encoded (the fast path's word cache is warm).
    let cold = tokenizer().with_segment_cache_bytes(0);
    c.bench_function("chat_8k/render_and_encode_no_cache", |b| {
        b.iter(|| cold.encode_chat(black_box(&chat), now))
    });
    // Realistic multi-turn: history seen before, a new final user message each time.
    let mut turn = 0u64;
    c.bench_function("chat_8k/new_last_turn", |b| {
        b.iter_batched(
            || {
                turn += 1;
                let mut next = chat.clone();
                next.messages.push(json!({"role": "user", "content": format!(
                    "Question {turn}: which worker holds the longest cached prefix for this conversation, \
                     and how long will its prefill take given the current queue of waiting requests?"
                )}));
                next
            },
            |req| t.encode_chat(&req, now),
            criterion::BatchSize::SmallInput,
        )
    });
    c.bench_function("chat_8k/render_only", |b| {
        b.iter(|| t.render_chat(black_box(&chat), now))
    });
    c.bench_function("chat_8k/encode_only", |b| {
        b.iter(|| t.encode_text(black_box(&prompt), false))
    });
    let varied = varied_chat(&t, 8192);
    let varied_prompt = match t.render_chat(&varied, now) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    eprintln!(
        "fast path: {}; varied chat: {} messages, {} chars, {} tokens",
        t.fast_path(),
        varied.messages.len(),
        varied_prompt.len(),
        t.encode_text(&varied_prompt, false)
            .map(|v| v.len())
            .unwrap_or(0)
    );
    let mut fresh = Some(tokenizer());
    c.bench_function("cold/chat_8k/render_and_encode", |b| {
        b.iter_custom(|iters| {
            cold_iter(&mut fresh, iters, |t| {
                black_box(t.encode_chat(&chat, now)).ok();
            })
        })
    });
    c.bench_function("cold/varied_8k/render_and_encode", |b| {
        b.iter_custom(|iters| {
            cold_iter(&mut fresh, iters, |t| {
                black_box(t.encode_chat(&varied, now)).ok();
            })
        })
    });
    c.bench_function("cold/varied_8k/encode_only", |b| {
        b.iter_custom(|iters| {
            cold_iter(&mut fresh, iters, |t| {
                black_box(t.encode_text(&varied_prompt, false)).ok();
            })
        })
    });
    // The prompt of the router's decision bench (router/benches/routing.rs `long_chat`), cold.
    let paragraph = "The router predicts time to first token for every worker from the blocks it caches \
        and the prefill work queued ahead of the request, then picks the fastest one. ";
    let system: String = (0..220)
        .map(|i| format!("Section {i}. {paragraph}"))
        .collect();
    let router_chat = ChatRequest::new(vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": "Summarise the sections above in one sentence."}),
    ]);
    c.bench_function("cold/router_decision_chat/render_and_encode", |b| {
        b.iter_custom(|iters| {
            cold_iter(&mut fresh, iters, |t| {
                black_box(t.encode_chat(&router_chat, now)).ok();
            })
        })
    });
    c.bench_function("hf_pipeline/chat_8k/encode_only", |b| {
        b.iter(|| t.encode_text_uncached(black_box(&prompt), false))
    });
    c.bench_function("hf_pipeline/varied_8k/encode_only", |b| {
        b.iter(|| t.encode_text_uncached(black_box(&varied_prompt), false))
    });
    let completion = PromptInput::Text(prompt.clone());
    c.bench_function("completion_8k/encode", |b| {
        b.iter(|| t.encode_prompt(black_box(&completion), true))
    });
    // A completions prompt: the same ~8k-token text, then a new question each time (what a
    // shared-prefix workload sends as one piece, which the whole-piece cache never matches).
    let plain = chat
        .messages
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n\n");
    let mut asked = 0u64;
    c.bench_function("completion_8k/new_suffix", |b| {
        b.iter_batched(
            || {
                asked += 1;
                PromptInput::Text(format!(
                    "{plain}\nQuestion {asked}: which worker holds the longest cached prefix, \
                     and how long will its prefill take given the queue?"
                ))
            },
            |p| t.encode_prompt(&p, true),
            criterion::BatchSize::SmallInput,
        )
    });
    let small = ChatRequest::new(vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": "What is the capital of France?"}),
    ]);
    c.bench_function("chat_small/render_and_encode", |b| {
        b.iter(|| t.encode_chat(black_box(&small), now))
    });
}

/// Cold render + encode of an ~8k-token chat (synthetic and varied text) for every family.
fn bench_families(c: &mut Criterion) {
    let now = chrono::DateTime::UNIX_EPOCH.fixed_offset();
    for family in [
        "qwen3",
        "llama3",
        "gemma3",
        "deepseek-v3",
        "gpt-oss",
        "mistral-nemo",
    ] {
        let t = family_tokenizer(family);
        let chat = long_chat(&t, 8192);
        let varied = varied_chat(&t, 8192);
        let count = |req: &ChatRequest| {
            t.encode_chat(req, now)
                .map(|e| e.token_ids.len())
                .unwrap_or(0)
        };
        eprintln!(
            "{family}: fast path {}, chat {} tokens, varied {} tokens",
            t.fast_path(),
            count(&chat),
            count(&varied)
        );
        let mut fresh = Some(t);
        let mut g = c.benchmark_group(format!("family/{family}"));
        g.sample_size(10);
        g.bench_function("cold_chat_8k", |b| {
            b.iter_custom(|iters| {
                cold_iter(&mut fresh, iters, |t| {
                    black_box(t.encode_chat(&chat, now)).ok();
                })
            })
        });
        g.bench_function("cold_varied_8k", |b| {
            b.iter_custom(|iters| {
                cold_iter(&mut fresh, iters, |t| {
                    black_box(t.encode_chat(&varied, now)).ok();
                })
            })
        });
        g.finish();
    }
}

/// Loading the Qwen3 directory (what a router pays at startup), and the `tokenizers` crate's
/// share of it; the rest is the fast path's vocab/merges tables and the templates.
fn bench_load(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/tokenizers/qwen3");
    let json = match std::fs::read(dir.join("tokenizer.json")) {
        Ok(j) => j,
        Err(e) => panic!("{e}"),
    };
    let mut g = c.benchmark_group("load");
    g.sample_size(10);
    g.bench_function("qwen3_dir", |b| b.iter(tokenizer));
    g.bench_function("tokenizers_from_bytes", |b| {
        b.iter(|| tokenizers::Tokenizer::from_bytes(black_box(&json)).is_ok())
    });
    g.finish();
}

criterion_group!(benches, bench, bench_load, bench_families);
criterion_main!(benches);
