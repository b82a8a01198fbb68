//! Worker churn benchmark: resident memory of a router whose workers come and go. Each cycle
//! a new worker appears, streams a 2,000-block snapshot, takes one request, its stream
//! closes and discovery drops it (see `kvroute_router::churn`). Prints the process's
//! resident set after 1k, 10k and 100k cycles: with retirement it stays flat.
//!
//! `cargo bench -p kvroute-router --bench churn`

use std::time::{Duration, Instant};

use kvroute_router::churn::Churn;
use kvroute_router::metrics::RouterMetrics;
use kvroute_router::state::{RouterConfig, RouterState};

/// Resident set size in bytes (Linux `/proc/self/statm`), if readable.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument that is not ours means another
    // bench target was asked for.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && a != "churn")
    {
        return;
    }
    let metrics = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let cfg = RouterConfig {
        retire_after: Duration::ZERO,
        ..RouterConfig::default()
    };
    let state = RouterState::new(cfg, metrics).expect("state");
    let mut churn = Churn::new(state, 3, 2_000);
    let start = Instant::now();
    let base = rss_bytes().unwrap_or(0);
    println!("churn: 3 live workers, each cycle one worker with a 2,000-block snapshot");
    println!("{:>8}  {:>12}  {:>10}", "cycles", "RSS (MiB)", "seconds");
    println!(
        "{:>8}  {:>12.1}  {:>10.1}",
        0,
        base as f64 / (1 << 20) as f64,
        0.0
    );
    let mut done = 0u64;
    for target in [1_000u64, 10_000, 100_000] {
        while done < target {
            churn.cycle(done);
            done += 1;
        }
        let rss = rss_bytes().unwrap_or(0);
        println!(
            "{:>8}  {:>12.1}  {:>10.1}",
            done,
            rss as f64 / (1 << 20) as f64,
            start.elapsed().as_secs_f64()
        );
    }
    let report = churn.state().workers_report(Instant::now());
    println!(
        "after {done} cycles: {} workers in /debug/workers, {} index pairs, {} B index",
        report.workers.len(),
        report.index_pairs,
        report.index_memory_bytes
    );
}
