//! `kvroute bench`: routing policies compared side by side on identical request streams.
//!
//! ```text
//! workload::generate(seed) --> sessions --+--> sim::run(policy) x 8 policies  (virtual time)
//!                                         +--> live (real processes on loopback, see live.rs)
//! runs --> stats::summarize / sweep --> report: JSON, Markdown table, SVG charts
//! ```
//!
//! `--mode sim` drives the mock worker's engine model and the router core's real decision
//! code in a discrete-event simulation (thousands of requests in seconds, deterministic under
//! a seed). Every figure is in simulated seconds of the L40S profile.
//!
//! `--mode attack` is not a policy comparison: it measures how responsive one real router
//! stays under hostile clients (slow-loris, 10 MB bodies, idle connections; see attack.rs).

pub mod attack;
pub mod calibration;
pub mod floor;
pub mod kinference;
pub mod live;
pub mod profiles;
pub mod report;
pub mod scale;
pub mod sim;
#[cfg(test)]
mod spread_tests;
pub mod stats;
pub mod workload;

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Serialize;

use sim::{Arrivals, SimConfig, SimPolicy};
use stats::{Summary, SweepPoint, peak_goodput, summarize};
use workload::{WorkloadKind, WorkloadSpec};

/// Every policy the benchmark compares, in table order. The four after `least-loaded`
/// follow named upstream releases (bench/README.md, "Baselines and their sources");
/// `greedy-clairvoyant` is sim-only: it knows every engine's true state and picks the
/// fastest first token for each request alone (a heuristic, not a bound).
pub const POLICIES: [&str; 9] = [
    "random",
    "round-robin",
    "least-loaded",
    "llm-d",
    "llm-d-sticky",
    "dynamo-cost",
    "sglang-cache-aware",
    "kvroute",
    "greedy-clairvoyant",
];

/// Flags of `kvroute bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// `sim` (discrete-event simulation in virtual time), `live` (real processes), `attack`
    /// (one router under slow-loris, body-flood and idle-connection attacks: /healthz latency),
    /// or `scale` (simulated sidecars into 1 and R router replicas: memory, CPU, ingest lag).
    #[arg(long, env = "KVROUTE_BENCH_MODE", default_value = "sim")]
    pub mode: String,
    /// shared-prefix, multi-turn, independent, mixed, hot-prefix, burst, long-short, or all
    /// (the first four).
    #[arg(long, env = "KVROUTE_BENCH_WORKLOAD", default_value = "all")]
    pub workload: String,
    /// Comma-separated policies (default: all, see POLICIES).
    #[arg(long, env = "KVROUTE_BENCH_POLICIES", default_value = "all")]
    pub policies: String,
    /// Workers in the pool.
    #[arg(long, env = "KVROUTE_BENCH_WORKERS", default_value_t = 3)]
    pub workers: usize,
    /// Seed of the workloads, arrivals and tie-breaks. Sim without one: drawn at random and
    /// printed (`--seed` with that number reproduces the run); live and attack: 42.
    #[arg(long, env = "KVROUTE_BENCH_SEED")]
    pub seed: Option<u64>,
    /// Sim: a frozen scenario instead of the workload flags: `kinference` (3 L40S workers,
    /// a 27B FP8 model, Buoyant's published operating point) or `kinference-hetero` (2 L40S
    /// and 1 H100 on the same workloads). See bench/README.md.
    #[arg(long, env = "KVROUTE_BENCH_SCENARIO")]
    pub scenario: Option<String>,
    /// Sim scenarios: run K seeds (`seed..seed+K-1`) and report the spread of every figure.
    #[arg(long, env = "KVROUTE_BENCH_SEEDS", default_value_t = 1)]
    pub seeds: u64,
    /// Closed-loop clients of the headline run.
    #[arg(long, env = "KVROUTE_BENCH_CONCURRENCY", default_value_t = 32)]
    pub concurrency: usize,
    /// Concurrency levels of the goodput sweep.
    #[arg(
        long,
        env = "KVROUTE_BENCH_SWEEP",
        default_value = "4,8,16,24,32,40,48,64"
    )]
    pub concurrency_sweep: String,
    /// Open-loop Poisson arrival rate (sessions per second) for the headline run instead of
    /// the closed loop.
    #[arg(long, env = "KVROUTE_BENCH_RATE")]
    pub rate: Option<f64>,
    /// Open-loop levels of the goodput sweep: comma-separated Poisson rates of new sessions
    /// per simulated second, each run on its own after the closed-loop levels (every cache
    /// cold, the first `--sweep-sessions` sessions, default all). A closed loop slows its
    /// clients down with the router's queues; an open loop does not, so a router that piles
    /// requests on one worker shows it here. Reported as `rate_sweep` and
    /// `peak_goodput_open_rpm`.
    #[arg(long, env = "KVROUTE_BENCH_RATE_SWEEP")]
    pub rate_sweep: Option<String>,
    /// Sessions per level of the goodput sweep (default: 16 per client, at least 64; never
    /// more than the workload has).
    #[arg(long, env = "KVROUTE_BENCH_SWEEP_SESSIONS")]
    pub sweep_sessions: Option<usize>,
    /// Sessions per run (default: the workload's own).
    #[arg(long, env = "KVROUTE_BENCH_SESSIONS")]
    pub sessions: Option<usize>,
    /// Override: number of shared prefixes.
    #[arg(long)]
    pub prefixes: Option<usize>,
    /// Override: tokens per shared prefix.
    #[arg(long)]
    pub prefix_tokens: Option<usize>,
    /// Override: tokens of each question after the prefix.
    #[arg(long)]
    pub question_tokens: Option<usize>,
    /// Override: output tokens per request (the lower bound with `--max-output-tokens`).
    #[arg(long)]
    pub output_tokens: Option<u32>,
    /// Draw each request's output length from `--output-tokens..=--max-output-tokens`.
    #[arg(long)]
    pub max_output_tokens: Option<u32>,
    /// Override: turns per session.
    #[arg(long)]
    pub turns: Option<usize>,
    /// Override: tokens of a conversation's first message (multi-turn, mixed).
    #[arg(long)]
    pub first_turn_tokens: Option<usize>,
    /// Delay between a worker event and the router seeing it (sidecar + network), ms.
    #[arg(long, env = "KVROUTE_BENCH_REPORT_DELAY_MS", default_value_t = 50.0)]
    pub report_delay_ms: f64,
    /// Sidecar load-scrape interval, ms.
    #[arg(long, env = "KVROUTE_BENCH_SCRAPE_MS", default_value_t = 250.0)]
    pub scrape_interval_ms: f64,
    /// Worker profile: a built-in name or a JSON file, or a comma-separated list of them
    /// (worker i runs entry i mod the list's length: a heterogeneous pool).
    #[arg(
        long,
        env = "KVROUTE_BENCH_PROFILE",
        default_value = "l40s-qwen3-32b-fp8"
    )]
    pub profile: String,
    /// Write the figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the Markdown table.
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Write SVG charts (TTFT CDF and goodput per workload) into this directory.
    #[arg(long)]
    pub svg_dir: Option<PathBuf>,
    /// A small, fast run (CI smoke test).
    #[arg(long)]
    pub quick: bool,
    /// Sim: start the router from the generic prior (bench/README.md, "Priors, profiles and
    /// seeds") instead of its default, which equals the built-in L40S profile. The kinference
    /// scenarios always do.
    #[arg(long)]
    pub generic_prior: bool,
    /// Sim: kvroute's overcommit margin (`CoreConfig::overcommit_margin_tokens`), in tokens,
    /// or `off`. Default: the router's own (2,000). For measuring the rule against its
    /// absence (bench/README.md, "Overcommitted workers").
    #[arg(long, value_name = "TOKENS|off", value_parser = parse_overcommit_margin)]
    pub overcommit_margin: Option<OvercommitMargin>,
    /// Sim: kvroute's rate pool (`CoreConfig::rate_pool`): workers whose learned prefill
    /// rates chain within this fraction are predicted at their mean rate; 0 turns it off.
    /// Default: the router's own (1.0). For measuring it against its absence (bench/README.md,
    /// "Identical workers, one prefill speed").
    #[arg(long, value_name = "FRACTION")]
    pub rate_pool: Option<f64>,
    /// Sim: kvroute's engine step budget for its whole-steps TTFT line, one for every worker
    /// (`PredictorConfig::step_budget_tokens`); 0 turns that line off. Default: each
    /// worker's profile's `max_num_batched_tokens`, as the router reads it from a WorkerSet.
    /// For measuring it against its absence and a wrong budget (bench/README.md, "Whole
    /// engine steps").
    #[arg(long, value_name = "TOKENS")]
    pub step_budget_tokens: Option<f64>,
    /// Sim: the share of a worker's running engine step that kvroute's predictions count
    /// (`StepConfig::share`); 0 counts none. Default: the router's own (1). For measuring
    /// other values (bench/README.md, "The running engine step").
    #[arg(long, value_name = "SHARE")]
    pub step_share: Option<f64>,
    /// Sim: kvroute's working-set horizon (`CoreConfig::working_set_horizon`), in placements
    /// per worker, which turns its KV-fit charge on; 0 turns it off. Default: the router's
    /// own (0, off); at most 4096. For measuring the charge against its absence
    /// (bench/README.md, "New prefixes where they fit").
    #[arg(long, value_name = "PLACEMENTS", value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub working_set_horizon: Option<u32>,
    /// Sim: kvroute's decode-only steps (`StepConfig::decode_steps`): `off`, `published`
    /// (the published prediction only) or `on`. Default: the router's own. For measuring
    /// the rule against its absence (bench/README.md, "Decode-only steps").
    #[arg(long, value_name = "off|published|on",
          value_parser = |s: &str| s.parse::<kvroute_router::routing::DecodeSteps>())]
    pub decode_steps: Option<kvroute_router::routing::DecodeSteps>,
    /// Sim: run each headline N times, with seeds seed, seed+1, ... (each its own workload
    /// draw and tie-break stream), and report the pooled requests. One run of a few hundred
    /// requests is chaotic: a different early choice changes which prefixes end up where.
    #[arg(long, env = "KVROUTE_BENCH_REPEATS", default_value_t = 1)]
    pub repeats: u64,
    /// Sim: write every headline request (worker, TTFT, prediction, and the TTFT it would have
    /// had on each worker) to DIR/<workload>-<policy>.jsonl and print each policy's regret
    /// against the per-request best worker. Slower: every request is simulated on every worker.
    /// Live: the headline run's requests as the client saw them (worker and prediction from the
    /// router's routing headers, when it sends them; no per-worker counterfactuals).
    #[arg(long, env = "KVROUTE_BENCH_RECORDS")]
    pub records: Option<PathBuf>,
    /// Live: clock speed-up of the mock workers (figures stay in simulated seconds).
    #[arg(long, env = "KVROUTE_BENCH_SPEEDUP", default_value_t = 10.0)]
    pub speedup: f64,
    /// Live: tokenizer directory for the workers and the router (default: the repository's
    /// Qwen3 tokenizer).
    #[arg(long, env = "KVROUTE_BENCH_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,
    /// Live: keep the processes' logs in this directory.
    #[arg(long, env = "KVROUTE_BENCH_LOG_DIR")]
    pub log_dir: Option<PathBuf>,
    /// Live: already running routers to measure too, `name=URL` (repeatable or comma-separated).
    #[arg(
        long = "external-router",
        env = "KVROUTE_BENCH_EXTERNAL_ROUTERS",
        value_delimiter = ','
    )]
    pub external_routers: Vec<String>,
    /// Live: the workers behind the external routers (their caches are reset between runs).
    #[arg(
        long = "external-worker",
        env = "KVROUTE_BENCH_EXTERNAL_WORKERS",
        value_delimiter = ','
    )]
    pub external_workers: Vec<String>,
    /// Live: send prompts as token ids (`ids`) or as the ids decoded to text (`text`, for
    /// routers that refuse token-id prompts).
    #[arg(long, env = "KVROUTE_BENCH_PROMPT", default_value = "ids")]
    pub prompt_format: String,
    /// Scale: simulated sidecars streaming into each router replica.
    #[arg(long, env = "KVROUTE_BENCH_SIDECARS", default_value_t = 1_000)]
    pub sidecars: usize,
    /// Scale: blocks in each sidecar's snapshot.
    #[arg(long, env = "KVROUTE_BENCH_SNAPSHOT_BLOCKS", default_value_t = 2_000)]
    pub snapshot_blocks: usize,
    /// Scale: KV block events (stored + removed) per second per sidecar.
    #[arg(
        long,
        env = "KVROUTE_BENCH_BLOCK_EVENTS_PER_S",
        default_value_t = 100.0
    )]
    pub block_events_per_s: f64,
    /// Scale: Pick requests per second, all replicas together.
    #[arg(long, env = "KVROUTE_BENCH_PICKS_PER_S", default_value_t = 50.0)]
    pub picks_per_s: f64,
    /// Scale: seconds of steady load per deployment.
    #[arg(long, env = "KVROUTE_BENCH_SCALE_SECONDS", default_value_t = 60.0)]
    pub scale_seconds: f64,
    /// Scale: router replica counts, one deployment each.
    #[arg(long, env = "KVROUTE_BENCH_SCALE_REPLICAS", default_value = "1,3")]
    pub scale_replicas: String,
}

/// Everything one benchmark run produced.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteResult {
    /// The settings the run used.
    pub config: SuiteConfig,
    /// workload -> policy -> figures, in run order.
    pub workloads: Vec<WorkloadResult>,
}

#[derive(Clone, Debug, Serialize)]
/// The settings of a run, as the JSON report records them.
pub struct SuiteConfig {
    /// `sim` or `live`.
    pub mode: String,
    /// Workers behind the router.
    pub workers: usize,
    /// Seed of the workload draw and the policies' tie-breaks.
    pub seed: u64,
    /// Concurrency of the headline run.
    pub concurrency: usize,
    /// Concurrency levels of the goodput sweep.
    pub sweep: Vec<usize>,
    /// Open-loop levels of the goodput sweep (new sessions per second).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rate_sweep: Vec<f64>,
    /// Open-loop session rate (per second) of the headline run, instead of the closed loop.
    pub rate: Option<f64>,
    /// Delay between a worker event and the router seeing it, ms.
    pub report_delay_ms: f64,
    /// Sidecar load-scrape interval, ms.
    pub scrape_interval_ms: f64,
    /// The worker profile's name or path.
    pub profile: String,
    /// Whether this was the small CI run.
    pub quick: bool,
    /// Headline runs pooled per policy (seeds `seed..seed + repeats`).
    pub repeats: u64,
    /// `--overcommit-margin`, when given (absent: the router's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overcommit_margin: Option<OvercommitMargin>,
    /// `--rate-pool`, when given (absent: the router's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_pool: Option<f64>,
    /// `--step-share`, when given (absent: the router's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_share: Option<f64>,
    /// `--working-set-horizon`, when given (absent: the router's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_horizon: Option<u32>,
    /// `--decode-steps`, when given (absent: the router's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_steps: Option<kvroute_router::routing::DecodeSteps>,
    /// `--step-budget-tokens`, when given (absent: the router's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_budget_tokens: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
/// One workload's figures, for every policy.
pub struct WorkloadResult {
    /// The workload as run (after overrides).
    pub spec: WorkloadSpec,
    /// One entry per policy, in run order.
    pub policies: Vec<PolicyResult>,
}

#[derive(Clone, Debug, Serialize)]
/// One policy's figures on one workload.
pub struct PolicyResult {
    /// The policy's name.
    pub policy: String,
    /// Figures of the headline run.
    pub summary: Summary,
    /// Peak goodput (requests/min) under the batch SLO, over the sweep.
    pub peak_goodput_rpm: f64,
    /// Peak goodput (requests/min) under the interactive SLO, over the sweep.
    pub peak_goodput_interactive_rpm: f64,
    /// Every level of the concurrency sweep.
    pub sweep: Vec<SweepPoint>,
    /// Every open-loop level (`--rate-sweep`).
    pub rate_sweep: Vec<SweepPoint>,
    /// Peak goodput (requests/min) under the batch SLO over the open-loop levels; `None`
    /// without `--rate-sweep`.
    pub peak_goodput_open_rpm: Option<f64>,
    /// TTFTs of the headline run (for the CDF chart).
    #[serde(skip)]
    pub ttfts: Vec<f64>,
    /// Sim: the headline run's distance to its per-request TTFT floors (`floor.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<floor::FloorSummary>,
    /// kvroute's headline run's prediction truth (`calibration.rs`): median error after
    /// warm-up and the adaptive p90 bound's coverage. None for every other policy (the
    /// router predicts for their choices too, but the figures are kvroute's claim).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<calibration::PredictionQuality>,
}

/// The seed of runs that were given none and draw none (live, attack, tests).
pub const DEFAULT_SEED: u64 = 42;

impl BenchArgs {
    /// `--seed`, or [`DEFAULT_SEED`].
    pub fn seed(&self) -> u64 {
        self.seed.unwrap_or(DEFAULT_SEED)
    }
}

/// `--overcommit-margin`: a margin in tokens, or none (`off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OvercommitMargin(pub Option<u64>);

fn parse_overcommit_margin(s: &str) -> Result<OvercommitMargin, String> {
    if s == "off" {
        return Ok(OvercommitMargin(None));
    }
    s.parse::<u64>()
        .map(|t| OvercommitMargin(Some(t)))
        .map_err(|_| format!("{s:?} is neither a token count nor \"off\""))
}

/// `kvroute bench`.
pub async fn run(mut args: BenchArgs) -> anyhow::Result<()> {
    if args.overcommit_margin.is_some() && args.mode != "sim" {
        bail!("--overcommit-margin needs --mode sim (a live router takes the default)");
    }
    if let Some(f) = args.rate_pool {
        if args.mode != "sim" {
            bail!("--rate-pool needs --mode sim (a live router takes its own --rate-pool)");
        }
        kvroute_router::routing::rate_pool_from(f).map_err(anyhow::Error::msg)?;
    }
    if let Some(t) = args.step_budget_tokens {
        if args.mode != "sim" {
            bail!(
                "--step-budget-tokens needs --mode sim (a live router takes its own --step-budget-tokens)"
            );
        }
        kvroute_router::routing::PredictorConfig::check_step_budget(t)
            .map_err(anyhow::Error::msg)?;
    }
    if let Some(c) = args.step_share {
        if args.mode != "sim" {
            bail!("--step-share needs --mode sim (a live router takes the default)");
        }
        kvroute_router::routing::StepConfig::check_share(c).map_err(anyhow::Error::msg)?;
    }
    if args.working_set_horizon.is_some() && args.mode != "sim" {
        bail!("--working-set-horizon needs --mode sim (a live router takes the default)");
    }
    if args.decode_steps.is_some() && args.mode != "sim" {
        bail!("--decode-steps needs --mode sim (a live router takes the default)");
    }
    if args.mode == "sim" && args.seed.is_none() {
        // Headline figures come from a seed nobody chose (none used while tuning).
        let seed = rand::random::<u32>() as u64;
        eprintln!("seed {seed} (drawn at random; --seed {seed} reproduces this run)");
        args.seed = Some(seed);
    }
    if let Some(name) = args.scenario.clone() {
        if args.mode != "sim" {
            bail!("--scenario needs --mode sim");
        }
        return tokio::task::spawn_blocking(move || kinference::run(&name, &args))
            .await
            .context("the simulation thread failed")?;
    }
    match args.mode.as_str() {
        "sim" => {
            let result = tokio::task::spawn_blocking(move || {
                let r = run_sim(&args);
                r.map(|r| (r, args))
            })
            .await
            .context("the simulation thread failed")??;
            let (result, args) = result;
            write_outputs(&result, &args)
        }
        "live" => {
            let cfg = live::LiveConfig::from_args(&args)?;
            let result = live::run_live(&args, &cfg).await?;
            write_outputs(&result, &args)
        }
        "attack" => attack::run(&args).await,
        "scale" => scale::run(&args).await,
        other => bail!("unknown --mode {other:?}: expected sim, live, attack or scale"),
    }
}

fn parse_list(s: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .with_context(|| format!("bad number {x:?} in {s:?}"))
        })
        .collect()
}

/// `--rate-sweep`: positive, finite rates of new sessions per second (none without the flag).
pub fn parse_rates(s: Option<&str>) -> anyhow::Result<Vec<f64>> {
    let Some(s) = s else {
        return Ok(Vec::new());
    };
    let rates = s
        .split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| match x.trim().parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
            _ => bail!("--rate-sweep: {x:?} is not a positive number of sessions per second"),
        })
        .collect::<anyhow::Result<Vec<f64>>>()?;
    if rates.is_empty() {
        bail!("--rate-sweep: no rate in {s:?}");
    }
    Ok(rates)
}

/// The workloads and policies the flags select.
pub fn selection(args: &BenchArgs) -> anyhow::Result<(Vec<WorkloadSpec>, Vec<String>)> {
    let kinds: Vec<WorkloadKind> = if args.workload == "all" {
        WorkloadKind::ALL.to_vec()
    } else {
        args.workload
            .split(',')
            .map(|w| {
                WorkloadKind::parse(w.trim()).with_context(|| {
                    format!(
                        "unknown workload {w:?}: expected one of {}, or all",
                        WorkloadKind::names()
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    let specs = kinds
        .into_iter()
        .map(|k| {
            let mut s = WorkloadSpec::default_for(k);
            if args.quick {
                s = s.quick();
            }
            if let Some(v) = args.sessions {
                s.sessions = v;
            }
            if let Some(v) = args.prefixes {
                s.prefixes = v;
            }
            if let Some(v) = args.prefix_tokens {
                s.prefix_tokens = v;
            }
            if let Some(v) = args.question_tokens {
                s.question_tokens = v;
            }
            if let Some(v) = args.output_tokens {
                s.output_tokens = v;
            }
            if let Some(v) = args.max_output_tokens {
                s.max_output_tokens = Some(v);
            }
            if let Some(v) = args.turns {
                s.turns = v;
            }
            if let Some(v) = args.first_turn_tokens {
                s.first_turn_tokens = v;
            }
            s
        })
        .collect();
    let policies: Vec<String> = if args.policies == "all" {
        POLICIES.iter().map(|p| p.to_string()).collect()
    } else {
        let list: Vec<String> = args
            .policies
            .split(',')
            .map(|p| p.trim().to_string())
            .collect();
        for p in &list {
            if !POLICIES.contains(&p.as_str()) {
                bail!(
                    "unknown policy {p:?}: expected one of {}",
                    POLICIES.join(", ")
                );
            }
        }
        list
    };
    Ok((specs, policies))
}

/// Runs the simulated suite (blocking; CPU-bound).
pub fn run_sim(args: &BenchArgs) -> anyhow::Result<SuiteResult> {
    let (specs, policies) = selection(args)?;
    let rate_sweep = parse_rates(args.rate_sweep.as_deref())?;
    let mut sweep = parse_list(&args.concurrency_sweep)?;
    if args.quick {
        sweep.retain(|&c| c <= 8);
        if sweep.is_empty() {
            sweep = vec![2, 4];
        }
    }
    if args.workers == 0 {
        bail!("--workers must be at least 1");
    }
    let base = SimConfig {
        workers: args.workers,
        profile: args.profile.clone(),
        report_delay_s: args.report_delay_ms / 1e3,
        scrape_interval_s: (args.scrape_interval_ms / 1e3).max(1e-3),
        arrivals: match args.rate {
            Some(r) => Arrivals::Poisson { rate_per_s: r },
            None => Arrivals::Closed {
                users: args.concurrency.max(1),
            },
        },
        seed: args.seed(),
        diagnose: false,
        generic_prior: args.generic_prior,
        overcommit_margin: args.overcommit_margin,
        rate_pool: args.rate_pool,
        step_share: args.step_share,
        working_set_horizon: args.working_set_horizon,
        decode_steps: args.decode_steps,
        step_budget_tokens: args.step_budget_tokens,
    };
    if let Some(dir) = &args.records {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    let mut workloads = Vec::new();
    for spec in specs {
        let sessions = workload::generate(&spec, args.seed());
        let more: Vec<(u64, Vec<workload::Session>)> = (1..args.repeats)
            .map(|i| {
                let seed = args.seed().wrapping_add(i);
                (seed, workload::generate(&spec, seed))
            })
            .collect();
        let mut results = Vec::new();
        for name in &policies {
            let headline_cfg = SimConfig {
                diagnose: args.records.is_some(),
                ..base.clone()
            };
            let mut headline = sim::run(
                &headline_cfg,
                &sessions,
                SimPolicy::for_profile(name, args.seed(), &args.profile)?,
            )?;
            // Each repeat is a fresh router whose clock starts at 0: its predictions are
            // tallied on their own before its records join the headline's.
            let mut truth = calibration::PredictionTally::default();
            truth.add_run(&headline.records);
            for (seed, s) in &more {
                let cfg = SimConfig {
                    seed: *seed,
                    ..headline_cfg.clone()
                };
                let r = sim::run(&cfg, s, SimPolicy::for_profile(name, *seed, &args.profile)?)?;
                truth.add_run(&r.records);
                headline.records.extend(r.records);
                headline.rejected += r.rejected;
                headline.makespan += r.makespan;
            }
            let prediction = (name == "kvroute").then(|| truth.quality()).flatten();
            if let Some(dir) = &args.records {
                write_records(dir, spec.kind.name(), name, &headline)?;
            }
            let summary = summarize(&headline, args.workers);
            // One sweep level: the first `n` sessions (never more than the workload has), every
            // cache cold.
            let level = |arrivals: Arrivals, n: usize| -> anyhow::Result<sim::RunResult> {
                let cfg = SimConfig {
                    arrivals,
                    ..base.clone()
                };
                let policy = SimPolicy::for_profile(name, args.seed(), &args.profile)?;
                sim::run(&cfg, &sessions[..n.min(sessions.len())], policy)
            };
            let mut points = Vec::new();
            for &c in &sweep {
                // Enough sessions that warm-up (every cache starts empty) does not dominate the
                // level: 16 per user.
                let n = args.sweep_sessions.unwrap_or((c * 16).max(64));
                let r = level(Arrivals::Closed { users: c }, n)?;
                points.push(SweepPoint::of(c, &r));
            }
            let mut open = Vec::new();
            for &rate in &rate_sweep {
                let n = args.sweep_sessions.unwrap_or(sessions.len());
                let r = level(Arrivals::Poisson { rate_per_s: rate }, n)?;
                open.push(SweepPoint::open(rate, &r));
            }
            let peak_open = stats::peak_goodput_open(&open);
            eprintln!(
                "{:<14} {:<19} ttft p50 {:>7.3}s p90 {:>7.3}s  hit {:>5.1}%  goodput {:>6.1} rpm{}",
                spec.kind.name(),
                name,
                summary.ttft_p50_s,
                summary.ttft_p90_s,
                summary.cache_hit_rate * 100.0,
                peak_goodput(&points, false),
                stats::open_loop_note(peak_open),
            );
            results.push(PolicyResult {
                policy: name.clone(),
                rate_sweep: open,
                peak_goodput_open_rpm: peak_open,
                peak_goodput_rpm: peak_goodput(&points, false),
                peak_goodput_interactive_rpm: peak_goodput(&points, true),
                ttfts: headline.records.iter().map(|r| r.ttft).collect(),
                floor: Some(floor::summarize(&headline)),
                prediction,
                summary,
                sweep: points,
            });
        }
        workloads.push(WorkloadResult {
            spec,
            policies: results,
        });
    }
    Ok(SuiteResult {
        config: SuiteConfig {
            mode: "sim".into(),
            workers: args.workers,
            seed: args.seed(),
            concurrency: args.concurrency,
            sweep,
            rate_sweep,
            rate: args.rate,
            report_delay_ms: args.report_delay_ms,
            scrape_interval_ms: args.scrape_interval_ms,
            profile: args.profile.clone(),
            quick: args.quick,
            repeats: args.repeats,
            overcommit_margin: args.overcommit_margin,
            rate_pool: args.rate_pool,
            step_share: args.step_share,
            working_set_horizon: args.working_set_horizon,
            decode_steps: args.decode_steps,
            step_budget_tokens: args.step_budget_tokens,
        },
        workloads,
    })
}

/// Writes a headline run's requests as JSON lines and prints the policy's regret: how much
/// later each first token came than on the worker that would have been fastest for it.
fn write_records(
    dir: &std::path::Path,
    workload: &str,
    policy: &str,
    run: &sim::RunResult,
) -> anyhow::Result<()> {
    let path = dir.join(format!("{workload}-{policy}.jsonl"));
    let mut out = String::new();
    let (mut regret, mut best_picked, mut n) = (Vec::new(), 0usize, 0usize);
    for r in &run.records {
        out.push_str(&serde_json::to_string(r)?);
        out.push('\n');
        let best = r.true_ttfts.iter().copied().fold(f64::INFINITY, f64::min);
        if let Some(&mine) = r.true_ttfts.get(r.worker)
            && best.is_finite()
            && mine.is_finite()
        {
            n += 1;
            regret.push(mine - best);
            if mine <= best + 1e-9 {
                best_picked += 1;
            }
        }
    }
    std::fs::write(&path, out).with_context(|| format!("write {}", path.display()))?;
    if n > 0 {
        regret.sort_by(f64::total_cmp);
        let mean = regret.iter().sum::<f64>() / n as f64;
        eprintln!(
            "{workload:<14} {policy:<19} regret vs per-request best worker: mean {mean:.3}s p50 {:.3}s p90 {:.3}s; best picked {:.1}% ({})",
            stats::quantile(&regret, 0.5),
            stats::quantile(&regret, 0.9),
            best_picked as f64 * 100.0 / n as f64,
            path.display()
        );
    }
    Ok(())
}

/// Prints the Markdown table and writes the JSON, Markdown and SVG files the flags ask for.
pub fn write_outputs(result: &SuiteResult, args: &BenchArgs) -> anyhow::Result<()> {
    let table = report::markdown(result);
    println!("{table}");
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report::json(result))?;
        std::fs::write(path, json + "\n").with_context(|| format!("write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, &table).with_context(|| format!("write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(dir) = &args.svg_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        for (name, svg) in report::charts(result) {
            let path = dir.join(name);
            std::fs::write(&path, svg).with_context(|| format!("write {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    #[test]
    fn every_workload_is_named_in_the_help_and_the_error() {
        let cmd = BenchArgs::augment_args(clap::Command::new("bench"));
        let help = cmd
            .get_arguments()
            .find(|a| a.get_id() == "workload")
            .and_then(|a| a.get_help())
            .map(ToString::to_string)
            .expect("--workload has help");
        let names = WorkloadKind::names();
        for kind in WorkloadKind::ALL.into_iter().chain(WorkloadKind::DISAGREE) {
            assert!(
                help.contains(kind.name()),
                "--workload help lacks {}",
                kind.name()
            );
            assert!(names.contains(kind.name()));
        }
        let mut args = BenchArgs::augment_args(clap::Command::new("bench"))
            .try_get_matches_from(["bench", "--workload", "hot-prefix,nope"])
            .and_then(|m| BenchArgs::from_arg_matches(&m))
            .expect("flags parse");
        let err = selection(&args).expect_err("unknown workload").to_string();
        assert!(err.contains("\"nope\"") && err.contains(&names), "{err}");
        args.workload = "long-short".into();
        assert_eq!(
            selection(&args).expect("known").0[0].kind,
            WorkloadKind::LongShort
        );
    }

    #[test]
    fn the_overcommit_margin_takes_tokens_or_off_and_only_in_simulation() {
        let parse = |v: &str| {
            BenchArgs::augment_args(clap::Command::new("bench"))
                .try_get_matches_from(["bench", "--overcommit-margin", v])
                .and_then(|m| BenchArgs::from_arg_matches(&m))
                .map(|a| a.overcommit_margin)
        };
        assert_eq!(parse("off").expect("off"), Some(OvercommitMargin(None)));
        assert_eq!(
            parse("2000").expect("tokens"),
            Some(OvercommitMargin(Some(2_000)))
        );
        let err = parse("lots").expect_err("not a number").to_string();
        assert!(err.contains("neither a token count"), "{err}");
        let mut args = BenchArgs::augment_args(clap::Command::new("bench"))
            .try_get_matches_from(["bench", "--mode", "live", "--overcommit-margin", "0"])
            .and_then(|m| BenchArgs::from_arg_matches(&m))
            .expect("flags parse");
        args.seed = Some(1);
        let err = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(run(args))
            .expect_err("live refuses it")
            .to_string();
        assert!(err.contains("needs --mode sim"), "{err}");
    }

    /// `kvroute bench FLAGS` parsed, with a fixed seed.
    fn parsed(flags: &[&str]) -> BenchArgs {
        let mut a = BenchArgs::augment_args(clap::Command::new("bench"))
            .try_get_matches_from(std::iter::once("bench").chain(flags.iter().copied()))
            .and_then(|m| BenchArgs::from_arg_matches(&m))
            .expect("flags parse");
        a.seed = Some(1);
        a
    }

    /// The error `kvroute bench FLAGS` stops with before running anything.
    fn refused(flags: &[&str]) -> String {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(run(parsed(flags)))
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn the_rate_pool_takes_a_fraction_and_only_in_simulation() {
        assert_eq!(parsed(&["--rate-pool", "0"]).rate_pool, Some(0.0));
        let err = refused(&["--mode", "live", "--rate-pool", "0.25"]);
        assert!(err.contains("needs --mode sim"), "{err}");
        let err = refused(&["--rate-pool", "11"]);
        assert!(err.contains("outside 0..=10"), "{err}");
    }

    #[test]
    fn the_step_budget_takes_tokens_and_only_in_simulation() {
        assert_eq!(
            parsed(&["--step-budget-tokens", "0"]).step_budget_tokens,
            Some(0.0)
        );
        let err = refused(&["--mode", "live", "--step-budget-tokens", "8192"]);
        assert!(err.contains("needs --mode sim"), "{err}");
        let err = refused(&["--step-budget-tokens", "4"]);
        assert!(err.contains("expected 0 (off)"), "{err}");
    }

    #[test]
    fn the_step_share_takes_a_share_and_only_in_simulation() {
        assert_eq!(parsed(&["--step-share", "0.5"]).step_share, Some(0.5));
        assert_eq!(parsed(&["--step-share", "0"]).step_share, Some(0.0));
        assert_eq!(parsed(&[]).step_share, None);
        let err = refused(&["--mode", "live", "--step-share", "0.5"]);
        assert!(err.contains("needs --mode sim"), "{err}");
        for bad in ["1.5", "-1", "NaN"] {
            let err = refused(&[&format!("--step-share={bad}")]);
            assert!(err.contains("between 0 and 1"), "{bad}: {err}");
        }
    }

    #[test]
    fn decode_steps_take_off_published_or_on_and_only_in_simulation() {
        use kvroute_router::routing::DecodeSteps;
        assert_eq!(
            parsed(&["--decode-steps", "on"]).decode_steps,
            Some(DecodeSteps::On)
        );
        assert_eq!(
            parsed(&["--decode-steps", "published"]).decode_steps,
            Some(DecodeSteps::Published)
        );
        assert_eq!(
            parsed(&["--decode-steps", "off"]).decode_steps,
            Some(DecodeSteps::Off)
        );
        assert_eq!(parsed(&[]).decode_steps, None);
        let err = refused(&["--mode", "live", "--decode-steps", "on"]);
        assert!(err.contains("needs --mode sim"), "{err}");
        let err = BenchArgs::augment_args(clap::Command::new("bench"))
            .try_get_matches_from(["bench", "--decode-steps=maybe"])
            .expect_err("not off, published or on")
            .to_string();
        assert!(err.contains("--decode-steps"), "{err}");
    }

    #[test]
    fn the_working_set_horizon_takes_placements_and_only_in_simulation() {
        assert_eq!(
            parsed(&["--working-set-horizon", "0"]).working_set_horizon,
            Some(0)
        );
        assert_eq!(parsed(&[]).working_set_horizon, None);
        let err = refused(&["--mode", "live", "--working-set-horizon", "16"]);
        assert!(err.contains("needs --mode sim"), "{err}");
        for bad in ["-1", "0.5", "x", "4097"] {
            let err = BenchArgs::augment_args(clap::Command::new("bench"))
                .try_get_matches_from(["bench", &format!("--working-set-horizon={bad}")])
                .expect_err("not a count of placements")
                .to_string();
            assert!(err.contains("--working-set-horizon"), "{bad}: {err}");
        }
    }
}
