//! `kvroute demo`: the one-command comparison of random routing and kvroute on a shared-prefix
//! workload, with every component running as a real local process on loopback. The demo is a
//! preset of `kvroute bench --mode live`: the same workload generator, load generator, figures
//! and TTFT chart; what is its own is the choice of flags, the side-by-side table it prints and
//! the JSON it writes.
//!
//! ```text
//! DemoArgs --preset--> BenchArgs { mode: live, workload: shared-prefix, policies, no sweep }
//!   --bench::live--> for policy in [random, kvroute]:          (fresh processes: caches cold)
//!                      N x mock-vllm --ZMQ--> N x sidecar --gRPC--> router --policy P
//!                      load generator --HTTP SSE--> router gateway --> worker
//!   --> SuiteResult (one workload) --> table (stdout), TTFT CDF (--chart), figures (--json)
//! ```
//!
//! The defaults are Buoyant's published shared-prefix set-up in miniature (the `kinference`
//! scenario of `kvroute bench --mode sim`, bench/README.md): 3 workers with the
//! `l40s-27b-fp8` profile (~150k KV tokens each), 9 prefixes of 36,864 tokens (about 4 fit on
//! a worker, and random routing sends each worker all 9, so it keeps evicting what the next
//! request needs), a 1,024-token question, 128 output tokens, 8 clients, 96 requests. They
//! measure what `kvroute bench --mode live --workload shared-prefix --policies random,kvroute
//! --workers 3 --profile l40s-27b-fp8 --sessions 96 --concurrency 8 --concurrency-sweep ''
//! --prefixes 9 --prefix-tokens 36864 --question-tokens 1024 --output-tokens 128
//! --max-output-tokens 128 --seed 7` measures.
//! Times are reported in simulated seconds: the mock workers run their clock `--speedup`
//! times faster than the wall clock, so wall-clock measurements are multiplied back.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::bench::live::{self, LiveConfig};
use crate::bench::report;
use crate::bench::{BenchArgs, PolicyResult};

/// Flags of `kvroute demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Mock workers (one simulated L40S each).
    #[arg(long, env = "KVROUTE_DEMO_WORKERS", default_value_t = 3)]
    pub workers: usize,
    /// Simulated clock speed-up of the mock workers.
    #[arg(long, env = "KVROUTE_DEMO_SPEEDUP", default_value_t = 10.0)]
    pub speedup: f64,
    /// Requests per policy.
    #[arg(long, env = "KVROUTE_DEMO_REQUESTS", default_value_t = 96)]
    pub requests: usize,
    /// Requests in flight at once.
    #[arg(long, env = "KVROUTE_DEMO_CONCURRENCY", default_value_t = 8)]
    pub concurrency: usize,
    /// Distinct shared system prompts.
    #[arg(long, env = "KVROUTE_DEMO_PREFIXES", default_value_t = 9)]
    pub prefixes: usize,
    /// Length of each shared system prompt, in tokens.
    #[arg(long, env = "KVROUTE_DEMO_PREFIX_TOKENS", default_value_t = 36_864)]
    pub prefix_tokens: usize,
    /// Tokens of each request's own question after the shared system prompt.
    #[arg(long, env = "KVROUTE_DEMO_QUESTION_TOKENS", default_value_t = 1_024)]
    pub question_tokens: usize,
    /// Fewest output tokens per request.
    #[arg(long, env = "KVROUTE_DEMO_MIN_OUTPUT_TOKENS", default_value_t = 128)]
    pub min_output_tokens: u32,
    /// Most output tokens per request.
    #[arg(long, env = "KVROUTE_DEMO_MAX_OUTPUT_TOKENS", default_value_t = 128)]
    pub max_output_tokens: u32,
    /// Seed of the workload (the same requests in the same order for every policy).
    #[arg(long, env = "KVROUTE_DEMO_SEED", default_value_t = 7)]
    pub seed: u64,
    /// Mock worker timing profile (built-in name or file).
    #[arg(long, env = "KVROUTE_DEMO_PROFILE", default_value = "l40s-27b-fp8")]
    pub profile: String,
    /// Tokenizer directory shared by the workers and the router.
    #[arg(long, env = "KVROUTE_DEMO_TOKENIZER", default_value = live::DEFAULT_TOKENIZER)]
    pub tokenizer: PathBuf,
    /// Policies to compare, in order.
    #[arg(
        long,
        env = "KVROUTE_DEMO_POLICIES",
        value_delimiter = ',',
        default_value = "random,kvroute"
    )]
    pub policies: Vec<String>,
    /// Where the TTFT chart goes.
    #[arg(
        long,
        env = "KVROUTE_DEMO_CHART",
        default_value = "kvroute-demo-ttft.svg"
    )]
    pub chart: PathBuf,
    /// Also write the figures as JSON here.
    #[arg(long, env = "KVROUTE_DEMO_JSON")]
    pub json: Option<PathBuf>,
    /// Keep the processes' logs here (default: a temporary directory, removed at the end).
    #[arg(long, env = "KVROUTE_DEMO_LOG_DIR")]
    pub log_dir: Option<PathBuf>,
    /// No progress bar (for logs and tests).
    #[arg(long, env = "KVROUTE_DEMO_NO_PROGRESS", default_value_t = false)]
    pub no_progress: bool,
}

/// The live benchmark run the demo is: one shared-prefix workload, the demo's policies, the
/// headline run only (no concurrency sweep), and no file outputs of the benchmark's own.
pub fn preset(args: &DemoArgs) -> BenchArgs {
    BenchArgs {
        mode: "live".into(),
        workload: "shared-prefix".into(),
        policies: args.policies.join(","),
        workers: args.workers,
        seed: Some(args.seed),
        generic_prior: false,
        overcommit_margin: None,
        rate_pool: None,
        step_share: None,
        working_set_horizon: None,
        decode_steps: None,
        step_budget_tokens: None,
        scenario: None,
        seeds: 1,
        concurrency: args.concurrency,
        concurrency_sweep: String::new(),
        rate_sweep: None,
        sweep_sessions: None,
        rate: None,
        sessions: Some(args.requests),
        prefixes: Some(args.prefixes),
        prefix_tokens: Some(args.prefix_tokens),
        question_tokens: Some(args.question_tokens),
        output_tokens: Some(args.min_output_tokens),
        max_output_tokens: Some(args.max_output_tokens),
        turns: None,
        first_turn_tokens: None,
        // Sim-only knobs (the live run has real sidecars and a real scrape loop).
        report_delay_ms: 50.0,
        scrape_interval_ms: 250.0,
        profile: args.profile.clone(),
        json: None,
        markdown: None,
        svg_dir: None,
        quick: false,
        repeats: 1,
        records: None,
        speedup: args.speedup,
        tokenizer: Some(args.tokenizer.clone()),
        log_dir: args.log_dir.clone(),
        external_routers: Vec::new(),
        external_workers: Vec::new(),
        prompt_format: "ids".into(),
        // Scale-only knobs.
        sidecars: 1_000,
        snapshot_blocks: 2_000,
        block_events_per_s: 100.0,
        picks_per_s: 50.0,
        scale_seconds: 60.0,
        scale_replicas: "1,3".into(),
    }
}

/// `{"policies": {"random": {...}, "kvroute": {...}}, ...}`.
pub fn figures_json(all: &[PolicyResult], speedup: f64, requests: usize) -> Value {
    let mut policies = serde_json::Map::new();
    for p in all {
        let s = &p.summary;
        policies.insert(
            p.policy.clone(),
            json!({
                "ttft_p50_s": report::num(s.ttft_p50_s),
                "ttft_p90_s": report::num(s.ttft_p90_s),
                "e2e_p50_s": report::num(s.e2e_p50_s),
                "cache_hit_rate": report::num(s.cache_hit_rate),
                "requests_per_worker": s.requests_per_worker,
                "completed": s.requests,
                "failed": s.rejected,
            }),
        );
    }
    json!({"policies": policies, "requests_per_policy": requests, "speedup": speedup, "time_unit": "simulated seconds"})
}

/// The side-by-side table printed at the end: one column per policy.
pub fn render_table(all: &[PolicyResult], speedup: f64) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<22}", "");
    for p in all {
        let _ = write!(out, "{:>16}", p.policy);
    }
    out.push('\n');
    let mut row = |label: &str, cell: &dyn Fn(&PolicyResult) -> String| {
        let _ = write!(out, "{label:<22}");
        for p in all {
            let _ = write!(out, "{:>16}", cell(p));
        }
        out.push('\n');
    };
    row("TTFT p50 (s)", &|p| format!("{:.3}", p.summary.ttft_p50_s));
    row("TTFT p90 (s)", &|p| format!("{:.3}", p.summary.ttft_p90_s));
    row("e2e p50 (s)", &|p| format!("{:.2}", p.summary.e2e_p50_s));
    row("cache hit rate", &|p| {
        format!("{:.1}%", p.summary.cache_hit_rate * 100.0)
    });
    row("requests per worker", &|p| {
        p.summary
            .requests_per_worker
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("/")
    });
    row("completed / failed", &|p| {
        format!("{} / {}", p.summary.requests, p.summary.rejected)
    });
    let _ = writeln!(out, "times in simulated seconds (wall clock x {speedup})");
    out
}

/// Runs the demo.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let bench = preset(&args);
    let DemoArgs {
        workers,
        speedup,
        requests,
        concurrency,
        prefixes,
        prefix_tokens,
        question_tokens,
        min_output_tokens: _,
        max_output_tokens: _,
        seed: _,
        profile,
        tokenizer: _,
        policies,
        chart,
        json: json_path,
        log_dir: _,
        no_progress,
    } = args;
    if workers == 0 || requests == 0 || !(speedup.is_finite() && speedup > 0.0) {
        bail!("--workers and --requests must be positive and --speedup a positive number");
    }
    let live = LiveConfig::from_args(&bench)?;
    println!(
        "kvroute demo: {workers} mock workers (profile {profile}, clock x{speedup}), {requests} requests per \
         policy sharing {prefixes} system prompts of {prefix_tokens} tokens (+ a {question_tokens}-token question), \
         {concurrency} in flight"
    );
    let progress = if no_progress {
        indicatif::ProgressBar::hidden()
    } else {
        let pb = indicatif::ProgressBar::new((requests * policies.len()) as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb.enable_steady_tick(Duration::from_millis(200));
        pb
    };
    let result = live::run_live_with(&bench, &live, &progress).await;
    progress.finish_and_clear();
    let result = result?;
    let Some(workload) = result.workloads.first() else {
        bail!("the benchmark measured no workload");
    };
    let all = &workload.policies;
    println!("\n{}", render_table(all, speedup));
    std::fs::write(&chart, report::ttft_cdf_chart(workload))
        .with_context(|| format!("write {}", chart.display()))?;
    println!("TTFT chart: {}", chart.display());
    if let Some(path) = json_path {
        let text = serde_json::to_string_pretty(&figures_json(all, speedup, requests))?;
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
        println!("figures: {}", path.display());
    }
    let failed: usize = all.iter().map(|p| p.summary.rejected).sum();
    if failed > 0 {
        bail!("{failed} requests failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::selection;
    use crate::bench::stats::Summary;
    use crate::bench::workload::WorkloadKind;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DemoArgs,
    }

    #[test]
    fn preset_is_one_shared_prefix_workload_with_the_demo_flags() {
        // The defaults: the kinference scenario's shared-prefix workload in miniature.
        let defaults = Cli::parse_from(["demo"]).args;
        let s = &selection(&preset(&defaults)).expect("valid preset").0[0];
        assert_eq!(
            (
                s.prefixes,
                s.prefix_tokens,
                s.question_tokens,
                s.output_tokens
            ),
            (9, 36_864, 1_024, 128)
        );
        assert_eq!(defaults.profile, "l40s-27b-fp8");
        let demo = Cli::parse_from([
            "demo",
            "--requests",
            "12",
            "--prefixes",
            "3",
            "--prefix-tokens",
            "100",
            "--question-tokens",
            "7",
            "--min-output-tokens",
            "5",
            "--max-output-tokens",
            "9",
            "--policies",
            "kvroute,random",
        ])
        .args;
        let bench = preset(&demo);
        assert_eq!(bench.mode, "live");
        let (specs, policies) = selection(&bench).expect("valid preset");
        assert_eq!(policies, ["kvroute", "random"]);
        assert_eq!(specs.len(), 1);
        let s = &specs[0];
        assert_eq!(s.kind, WorkloadKind::SharedPrefix);
        assert_eq!(
            (s.sessions, s.prefixes, s.prefix_tokens, s.question_tokens),
            (12, 3, 100, 7)
        );
        assert_eq!((s.output_tokens, s.max_output_tokens), (5, Some(9)));
        assert!(bench.concurrency_sweep.is_empty(), "headline run only");
        let live = LiveConfig::from_args(&bench).expect("live config");
        assert_eq!(live.tokenizer, demo.tokenizer);
        assert!(!live.text_prompts && live.external_routers.is_empty());
    }

    /// A policy's figures as the benchmark reports them (built by hand: the demo only
    /// presents them).
    fn policy(name: &str, ttft_p50_s: f64, per_worker: Vec<usize>, failed: usize) -> PolicyResult {
        PolicyResult {
            policy: name.into(),
            summary: Summary {
                requests: per_worker.iter().sum(),
                rejected: failed,
                ttft_p50_s,
                ttft_p90_s: ttft_p50_s * 2.0,
                ttft_p99_s: ttft_p50_s * 3.0,
                e2e_p50_s: 0.8,
                cache_hit_rate: 0.5,
                throughput_rpm: 60.0,
                requests_per_worker: per_worker,
                prediction_error_rel: f64::NAN,
            },
            peak_goodput_rpm: 0.0,
            peak_goodput_interactive_rpm: 0.0,
            sweep: Vec::new(),
            rate_sweep: Vec::new(),
            peak_goodput_open_rpm: None,
            ttfts: Vec::new(),
            floor: None,
            prediction: None,
        }
    }

    #[test]
    fn table_and_json_show_each_policy_side_by_side() {
        let k = policy("kvroute", 0.2, vec![1, 2, 0], 1);
        let r = policy("random", f64::NAN, vec![0, 0, 0], 0);
        let all = [r, k];
        let v = figures_json(&all, 10.0, 4);
        let kv = &v["policies"]["kvroute"];
        assert_eq!(kv["requests_per_worker"], json!([1, 2, 0]));
        assert_eq!(
            (kv["completed"].as_u64(), kv["failed"].as_u64()),
            (Some(3), Some(1))
        );
        assert!((kv["ttft_p50_s"].as_f64().expect("p50") - 0.2).abs() < 1e-9);
        assert!((kv["e2e_p50_s"].as_f64().expect("e2e") - 0.8).abs() < 1e-9);
        assert!((kv["cache_hit_rate"].as_f64().expect("hit") - 0.5).abs() < 1e-12);
        assert_eq!(v["policies"]["random"]["ttft_p50_s"], Value::Null);
        assert_eq!(v["requests_per_policy"], 4);
        let table = render_table(&all, 10.0);
        let header = table.lines().next().expect("header");
        assert!(header.find("random") < header.find("kvroute"), "{table}");
        assert!(
            table.contains("1/2/0") && table.contains("50.0%"),
            "{table}"
        );
        assert!(table.contains("3 / 1") && table.contains("x 10"), "{table}");
    }
}
