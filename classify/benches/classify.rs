//! Classifier latency on an ~8k-token prompt (~32 KB of English-like text in 8 messages):
//! clean text, the same text with PII in every message, and a code-heavy variant full of
//! digits. Prints p50/p90/p99 per classify call and the scan rate.
//!
//! `cargo bench -p kvroute-classify --bench classify`

use std::hint::black_box;
use std::time::{Duration, Instant};

use kvroute_classify::{Classifier, ClassifyInput};

const WORDS: &[&str] = &[
    "the",
    "model",
    "should",
    "answer",
    "a",
    "question",
    "about",
    "routing",
    "requests",
    "to",
    "workers",
    "that",
    "already",
    "hold",
    "their",
    "prefix",
    "in",
    "cache",
    "and",
    "we",
    "want",
    "The",
    "summary",
    "of",
    "this",
    "document",
    "explains",
    "how",
    "Kubernetes",
    "schedules",
    "pods",
    "across",
    "nodes",
    "with",
    "GPUs",
    "while",
    "keeping",
    "latency",
    "low",
    "for",
    "every",
    "tenant",
    "Please",
    "write",
    "clear",
    "concise",
    "sentences",
    "is",
    "on",
];

/// Deterministic English-like text of about `bytes` bytes.
fn prose(bytes: usize, seed: u64) -> String {
    let mut s = String::with_capacity(bytes + 16);
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut n = 0;
    while s.len() < bytes {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s.push_str(WORDS[(x >> 33) as usize % WORDS.len()]);
        n += 1;
        s.push_str(if n % 14 == 0 { ". " } else { " " });
    }
    s
}

fn code(bytes: usize) -> String {
    let mut s = String::from("```rust\n");
    let mut k = 0u64;
    while s.len() < bytes {
        s.push_str(&format!(
            "    let v{k} = buf[{}] as u64 * {} + 0x{:x}; // step {k} of 2048, v1.{}.{}\n",
            k % 97,
            k * 31 % 1000,
            k * 2654435761 % 65536,
            k % 10,
            k % 7
        ));
        k += 1;
    }
    s.push_str("```\n");
    s
}

fn measure(name: &str, c: &Classifier, texts: &[&str], iters: usize) {
    let input = ClassifyInput {
        texts,
        prompt_tokens: 8192,
        max_tokens: Some(512),
        messages: texts.len(),
    };
    let bytes: usize = texts.iter().map(|t| t.len()).sum();
    for _ in 0..iters / 10 {
        black_box(c.classify(black_box(&input)));
    }
    let mut times: Vec<Duration> = Vec::with_capacity(iters);
    let mut labels = None;
    for _ in 0..iters {
        let t = Instant::now();
        let out = black_box(c.classify(black_box(&input)));
        times.push(t.elapsed());
        labels = Some(out.labels);
    }
    times.sort();
    let q = |p: f64| times[((times.len() as f64 * p) as usize).min(times.len() - 1)];
    let p50 = q(0.5);
    println!(
        "{name:<10} {:>6} B  p50 {:>7.2} us  p90 {:>7.2} us  p99 {:>7.2} us  {:>6.2} GB/s at p50  labels {}",
        bytes,
        p50.as_secs_f64() * 1e6,
        q(0.9).as_secs_f64() * 1e6,
        q(0.99).as_secs_f64() * 1e6,
        bytes as f64 / p50.as_secs_f64() / 1e9,
        labels.unwrap_or_default(),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that is not ours means another target.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && a != "classify")
    {
        return;
    }
    let c = Classifier::default();
    let clean: Vec<String> = (0..8).map(|k| prose(4096, k)).collect();
    let pii: Vec<String> = clean
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let (a, b) = t.split_at(t.len() / 2);
            let extra = [
                " write to jane.doe@example.com ",
                " call +44 20 7946 0958 ",
                " IBAN NL91 ABNA 0417 1643 00 ",
                " card 4111 1111 1111 1111 ",
                " SSN 123-45-6789 ",
                " on 2024-06-15 at 14:30, order 1234567890 ",
            ][k % 6];
            format!("{a}{extra}{b}")
        })
        .collect();
    let code_texts: Vec<String> = (0..8).map(|_| code(4096)).collect();
    let iters = 20_000;
    for (name, set) in [("clean", &clean), ("pii", &pii), ("code", &code_texts)] {
        let refs: Vec<&str> = set.iter().map(String::as_str).collect();
        measure(name, &c, &refs, iters);
    }
}
