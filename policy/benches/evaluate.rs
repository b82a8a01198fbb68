//! Evaluation cost with 100 rules where only the last one matches: every rule's matchers run
//! (tenant, model, labels, a header, a service class, pool-state ranges) before the match.
//! A plain harness: prints p50/p90/p99 of one evaluation, from batches of 1,000 calls.
//!
//! `cargo bench -p kvroute-policy --bench evaluate`

use std::hint::black_box;
use std::time::Instant;

use kvroute_crds::InferencePolicy;
use kvroute_policy::{PoolState, RequestFacts, compile};

fn policy_with_100_rules() -> InferencePolicy {
    let mut yaml = String::from("pool: chat\nrules:\n");
    for i in 0..99 {
        // Near misses: the same shape as the request, one condition off.
        yaml.push_str(&format!(
            "- name: r{i}\n  match:\n    tenants: [tenant-{i}, acme]\n    models: [model-{i}, qwen]\n    labels: [pii, label-{i}]\n    headers: [{{name: x-team, value: team-{i}}}]\n    serviceClasses: [batch]\n    poolState: {{bestTtftMs: {{atLeast: 100}}, meanKvUsagePercent: {{below: 95}}}}\n  actions: {{route: {{localOnly: true}}}}\n"
        ));
    }
    yaml.push_str(
        "- name: last\n  match:\n    tenants: [acme]\n    models: [qwen]\n    labels: [pii, size:large]\n    headers: [{name: x-team, value: red}]\n    serviceClasses: [batch]\n    poolState: {bestTtftMs: {atLeast: 100}, meanKvUsagePercent: {below: 95}}\n  actions: {reject: {status: 403, message: no}}\n",
    );
    let spec = serde_saphyr::from_str(&yaml).expect("bench policy parses");
    let mut p = InferencePolicy::new("bench", spec);
    p.metadata.namespace = Some("ml".into());
    p
}

fn main() {
    let set = compile(&[policy_with_100_rules()]).expect("bench policy compiles");
    let headers: &[(&str, &str)] = &[
        ("content-type", "application/json"),
        ("x-team", "red"),
        ("x-kvroute-service-class", "batch"),
    ];
    let labels: &[&str] = &["pii", "pii:email", "size:large"];
    let facts = RequestFacts {
        pool: Some("ml/chat"),
        tenant: Some("acme"),
        model: "qwen",
        backend_model: None,
        labels,
        headers: &headers,
        service_class: Some("batch"),
        prompt_tokens: 8192,
        max_output_tokens: Some(512),
    };
    let pool = PoolState {
        best_ttft_s: Some(0.4),
        best_queue: Some(2),
        total_queue: Some(9),
        kv_usage_min: Some(0.3),
        kv_usage_mean: Some(0.6),
        gpu_usage_min: Some(0.5),
        gpu_usage_mean: Some(0.7),
    };
    assert_eq!(set.evaluate(&facts, &pool).rule(), Some("last"));
    const BATCH: u32 = 1_000;
    for _ in 0..200 {
        black_box(set.evaluate(black_box(&facts), black_box(&pool)));
    }
    let mut per_call: Vec<f64> = (0..2_000)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..BATCH {
                black_box(set.evaluate(black_box(&facts), black_box(&pool)));
            }
            t.elapsed().as_secs_f64() / f64::from(BATCH)
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    let q = |p: f64| per_call[((per_call.len() - 1) as f64 * p) as usize] * 1e9;
    println!(
        "evaluate, 100 rules, match on the last: p50 {:.0} ns, p90 {:.0} ns, p99 {:.0} ns ({} batches of {BATCH})",
        q(0.5),
        q(0.9),
        q(0.99),
        per_call.len()
    );
}
