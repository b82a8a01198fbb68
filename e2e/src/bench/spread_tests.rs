//! CI smoke check (issue 16): every load-balancing baseline spreads a workload with nothing
//! to reuse. Unrelated prompts give a cache-aware rule no reason to prefer a worker, so a
//! policy that still piles requests onto one (the old SGLang stand-in ranked workers by
//! their KV-index size, which saturates at the cache's capacity) is broken, not clever.
//! Counts only, no timing. The shape (2,304-token prompts, 32 clients) is the benchmark's
//! own at half the requests: the old stand-in fails it with 158/12/22 requests per worker.

use super::sim::{self, Arrivals, SimConfig, SimPolicy};
use super::workload::{self, WorkloadKind, WorkloadSpec};

/// Every policy of the router that balances load: all of `POLICY_NAMES` but `random`.
const BALANCING: [&str; 8] = [
    "round-robin",
    "least-loaded",
    "max-prefix",
    "llm-d",
    "llm-d-sticky",
    "dynamo-cost",
    "sglang-cache-aware",
    "kvroute",
];

#[test]
fn every_load_balancing_baseline_spreads_the_independent_workload() {
    let spec = WorkloadSpec {
        sessions: 192,
        question_tokens: 2_304,
        output_tokens: 64,
        ..WorkloadSpec::default_for(WorkloadKind::Independent)
    };
    let sessions = workload::generate(&spec, 7);
    let cfg = SimConfig {
        workers: 3,
        profile: "l40s-qwen3-32b-fp8".into(),
        report_delay_s: 0.05,
        scrape_interval_s: 0.25,
        arrivals: Arrivals::Closed { users: 32 },
        seed: 7,
        diagnose: false,
        generic_prior: false,
        overcommit_margin: None,
        rate_pool: None,
        step_share: None,
        working_set_horizon: None,
        decode_steps: None,
        step_budget_tokens: None,
    };
    let mut failures = Vec::new();
    for name in BALANCING {
        let policy = SimPolicy::for_profile(name, 7, &cfg.profile).expect("known policy");
        let r = sim::run(&cfg, &sessions, policy).expect("simulation runs");
        assert_eq!(r.records.len() + r.rejected, sessions.len(), "{name}");
        let mut per_worker = vec![0usize; cfg.workers];
        for rec in &r.records {
            per_worker[rec.worker] += 1;
        }
        let mean = r.records.len() as f64 / cfg.workers as f64;
        let max = per_worker.iter().copied().max().unwrap_or(0) as f64;
        if max > 1.5 * mean {
            failures.push(format!("{name}: {per_worker:?} (mean {mean:.1})"));
        }
    }
    assert!(
        failures.is_empty(),
        "a worker above 1.5x the mean request count: {failures:?}"
    );
}
