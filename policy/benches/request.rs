//! The issue-13 budget: the classifiers plus policy evaluation for one request, an ~8k-token
//! chat prompt (~32 KB of English-like text in 8 messages, one e-mail address and one phone
//! number in it) against 100 rules where only the last matches. Per request, as the router's
//! decision path does it (`router/src/state/labels.rs`): the texts borrowed out of the body,
//! classified, the labels gathered, the set evaluated. Plain harness; prints p50/p90/p99.
//!
//! `cargo bench -p kvroute-policy --bench request`

use std::hint::black_box;
use std::time::Instant;

use kvroute_classify::{Classifier, ClassifierConfig, ClassifyInput, RequestTexts};
use kvroute_crds::InferencePolicy;
use kvroute_policy::{PolicySet, PoolState, RequestFacts, compile};

/// ~4 KB of plain prose per message, 8 messages: ~32 KB, ~8k tokens at 4 bytes a token.
fn body() -> serde_json::Value {
    let sentence = "The router should send every request to the worker that already holds its \
                    prefix in cache, unless that worker is far busier than the others today. ";
    let messages: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            let mut text = String::new();
            while text.len() < 4_000 {
                text.push_str(sentence);
            }
            if i == 3 {
                text.push_str("Write to jane.roe@example.org about it. ");
            }
            if i == 6 {
                text.push_str("Or call +44 20 7946 0958 after lunch. ");
            }
            serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": text})
        })
        .collect();
    serde_json::json!({"model": "qwen", "messages": messages, "max_tokens": 512})
}

fn policy_with_100_rules() -> InferencePolicy {
    let mut yaml = String::from("pool: chat\nrules:\n");
    for i in 0..99 {
        yaml.push_str(&format!(
            "- name: r{i}\n  match:\n    tenants: [tenant-{i}, acme]\n    models: [model-{i}, qwen]\n    labels: [pii, label-{i}]\n    headers: [{{name: x-team, value: team-{i}}}]\n  actions: {{route: {{localOnly: true}}}}\n"
        ));
    }
    yaml.push_str(
        "- name: last\n  match:\n    tenants: [acme]\n    models: [qwen]\n    labels: [pii:email, pii:phone]\n    headers: [{name: x-team, value: red}]\n  actions: {route: {localOnly: true}}\n",
    );
    let spec = serde_saphyr::from_str(&yaml).expect("bench policy parses");
    let mut p = InferencePolicy::new("bench", spec);
    p.metadata.namespace = Some("ml".into());
    p
}

fn one_request(
    classifier: &Classifier,
    set: &PolicySet,
    body: &serde_json::Map<String, serde_json::Value>,
    headers: &[(&str, &str)],
    pool: &PoolState,
) -> bool {
    let texts = RequestTexts::of_body(body);
    let out = classifier.classify(&ClassifyInput {
        texts: &texts.texts,
        prompt_tokens: texts.estimated_tokens(),
        max_tokens: Some(512),
        messages: texts.messages,
    });
    let labels: Vec<&str> = out.labels.iter_names().collect();
    let facts = RequestFacts {
        pool: Some("ml/chat"),
        tenant: Some("acme"),
        model: "qwen",
        backend_model: None,
        labels: &labels,
        headers: &headers,
        service_class: None,
        prompt_tokens: 8192,
        max_output_tokens: Some(512),
    };
    set.evaluate(&facts, pool).rule() == Some("last")
}

fn main() {
    let body = body();
    let body = body.as_object().expect("object");
    let bytes: usize = RequestTexts::of_body(body)
        .texts
        .iter()
        .map(|t| t.len())
        .sum();
    let classifier = Classifier::new(ClassifierConfig::default());
    let set = compile(&[policy_with_100_rules()]).expect("bench policy compiles");
    let headers: &[(&str, &str)] = &[("content-type", "application/json"), ("x-team", "red")];
    let pool = PoolState {
        best_ttft_s: Some(0.4),
        best_queue: Some(2),
        total_queue: Some(9),
        kv_usage_min: Some(0.3),
        kv_usage_mean: Some(0.6),
        gpu_usage_min: Some(0.5),
        gpu_usage_mean: Some(0.7),
    };
    assert!(
        one_request(&classifier, &set, body, headers, &pool),
        "the last rule must match (pii:email and pii:phone found)"
    );
    for _ in 0..200 {
        black_box(one_request(
            &classifier,
            &set,
            black_box(body),
            headers,
            &pool,
        ));
    }
    let mut per_call: Vec<f64> = (0..5_000)
        .map(|_| {
            let t = Instant::now();
            black_box(one_request(
                &classifier,
                &set,
                black_box(body),
                headers,
                &pool,
            ));
            t.elapsed().as_secs_f64()
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    let q = |p: f64| per_call[((per_call.len() - 1) as f64 * p) as usize] * 1e6;
    println!(
        "classify + evaluate, {bytes} bytes of text in 8 messages, 100 rules, match on the last: \
         p50 {:.1} µs, p90 {:.1} µs, p99 {:.1} µs ({} requests)",
        q(0.5),
        q(0.9),
        q(0.99),
        per_call.len()
    );
}
