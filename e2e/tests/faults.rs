//! The seeded fault suite over real processes on loopback (e2e/src/faults.rs; docs/faults.md):
//! three mock vLLM workers with their sidecars, two router replicas exchanging placements, a
//! fault proxy between the sidecars and each replica, seeded load through both gateways, and
//! one fault per run: a worker killed, vLLM restarted, a ZMQ gap, a sidecar restarted, a router
//! replica killed, the sidecars' traffic blackholed. Build the binary first (`cargo build -p
//! kvroute-cli`).
//!
//! `cargo test -p kvroute-e2e --test faults`: the CI version (short windows, a 12 s
//! blackhole). `cargo test -p kvroute-e2e --test faults -- --ignored --nocapture`: the full
//! suite (a minute of load after each fault, a 30 s blackhole); `KVROUTE_FAULTS_SEED` sets the
//! seed, `KVROUTE_FAULTS_JSON` a file for the reports, `KVROUTE_FAULTS_ONLY` a comma-separated
//! list of fault names to run, `KVROUTE_FAULTS_AFTER_S` and `KVROUTE_FAULTS_BLACKHOLE_S` the
//! after-window's and the blackhole's length in seconds.
//!
//! Each asserts, per fault (the bounds of issue 15): no request lost without a clear client
//! error; in-flight and assignment counts back to 0 after the load stops; every replica's view
//! of every worker's cache equal to the worker's own within 2 s of the fault ending (the CI
//! version allows 10 s on a loaded build machine and prints the figure; the full suite holds
//! 2 s) and after the load stops; the hit rate after recovery within 10% of a fault-free run
//! with the same seed.

use std::path::PathBuf;
use std::time::Duration;

use kvroute_e2e::faults::{self, Fault, FaultReport, SuiteConfig};

fn tokenizer() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/tokenizers/qwen3"
    ))
}

fn seed() -> u64 {
    std::env::var("KVROUTE_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15)
}

/// `KVROUTE_FAULTS_AFTER_S` and `KVROUTE_FAULTS_BLACKHOLE_S` override the after-window and
/// the blackhole's length (seconds).
fn lengths(mut cfg: SuiteConfig) -> SuiteConfig {
    let secs = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_secs)
    };
    if let Some(d) = secs("KVROUTE_FAULTS_AFTER_S") {
        cfg.after = d;
    }
    if let Some(d) = secs("KVROUTE_FAULTS_BLACKHOLE_S") {
        cfg.blackhole = d;
    }
    cfg
}

fn selected() -> Vec<Fault> {
    match std::env::var("KVROUTE_FAULTS_ONLY") {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .filter_map(|n| Fault::parse(n.trim()))
            .filter(|f| *f != Fault::None)
            .collect(),
        _ => Fault::ALL.to_vec(),
    }
}

fn print_table(reports: &[FaultReport]) {
    println!(
        "{:<18} {:>5} {:>5} {:>5} {:>5} {:>5} {:>4} {:>9} {:>8} {:>7} {:>7} {:>5} {:>5}",
        "fault",
        "sent",
        "ok",
        "http",
        "sse",
        "trans",
        "lost",
        "converge",
        "settle",
        "hit",
        "base",
        "gaps",
        "resyn"
    );
    for r in reports {
        let c = &r.counts;
        println!(
            "{:<18} {:>5} {:>5} {:>5} {:>5} {:>5} {:>4} {:>9} {:>8} {:>7.3} {:>7} {:>5} {:>5}",
            r.fault.name(),
            c.sent,
            c.ok,
            c.http_error,
            c.sse_error,
            c.transport,
            c.lost,
            r.cache_converged_s
                .map(|s| format!("{s:.2}s"))
                .unwrap_or_else(|| "never".into()),
            r.settled_s
                .map(|s| format!("{s:.1}s"))
                .unwrap_or_else(|| "never".into()),
            r.hit_rate_after,
            r.baseline_hit_rate
                .map(|h| format!("{h:.3}"))
                .unwrap_or_else(|| "-".into()),
            r.sidecar_gaps,
            r.sidecar_resyncs,
        );
        println!(
            "    during the fault: {}; started in {:.1}s; fault at {:.1}s..{:.1}s",
            r.during, r.deploy_s, r.fault_start_s, r.fault_end_s
        );
        if r.cache_trace.len() > 1 {
            println!("    cache views after the fault: {:?}", r.cache_trace);
        }
        if !r.error_examples.is_empty() {
            println!("    errors: {:?}", r.error_examples);
        }
    }
}

/// Runs the suite and checks the bounds; `converge_allowance` replaces the 2 s bound of (c)
/// where the machine is too loaded to hold it (the figure is printed either way).
async fn suite(cfg: SuiteConfig, converge_allowance: Duration) -> anyhow::Result<()> {
    let reports = faults::run_suite(&cfg, &selected()).await?;
    print_table(&reports);
    if let Ok(path) = std::env::var("KVROUTE_FAULTS_JSON") {
        let doc = serde_json::json!({"config": cfg, "reports": reports});
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    }
    let mut violations = Vec::new();
    for r in &reports {
        for v in r.violations() {
            // The CI allowance for (c)'s timing only; an equality that never came still fails.
            let within_allowance = r
                .cache_converged_s
                .is_some_and(|s| s <= converge_allowance.as_secs_f64());
            if v.contains(": (c) cache views equal only") && within_allowance {
                println!("note (CI allowance): {v}");
                continue;
            }
            violations.push(v);
        }
    }
    anyhow::ensure!(
        violations.is_empty(),
        "fault suite bounds missed:\n{}",
        violations.join("\n")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_are_survived_ci() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = lengths(SuiteConfig::ci(
        seed(),
        tokenizer(),
        dir.path().to_path_buf(),
    ));
    let out = suite(cfg, Duration::from_secs(10)).await;
    if out.is_err() {
        // Keep the logs of a failed run.
        let kept = dir.keep();
        eprintln!("logs kept in {}", kept.display());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the full fault suite takes about 15 minutes: run with --ignored"]
async fn faults_are_survived_full() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = lengths(SuiteConfig::full(
        seed(),
        tokenizer(),
        dir.path().to_path_buf(),
    ));
    let out = suite(cfg, faults::CONVERGE_BOUND).await;
    if out.is_err() {
        let kept = dir.keep();
        eprintln!("logs kept in {}", kept.display());
    }
    out
}
