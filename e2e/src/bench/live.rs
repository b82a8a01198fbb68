//! `kvroute bench --mode live`: the same workloads and figures as the simulation, measured on
//! real processes on loopback with a built-in OpenAI streaming load generator.
//!
//! ```text
//! for workload, for policy (greedy-clairvoyant skipped: it exists only in virtual time):
//!   fresh deployment: N x `kvroute mock-vllm --speedup K` --ZMQ--> N x `kvroute sidecar`
//!                     --gRPC--> `kvroute router --policy P` (gateway)
//!   headline run, then each sweep level, closed loop then open loop (`--rate-sweep`)
//!   (worker caches reset in between):
//!     load generator --POST /v1/completions (token ids, stream, include_usage)--> gateway
//!     per request: TTFT, e2e at the client (wall clock x K = simulated seconds),
//!                  cached tokens (usage.prompt_tokens_details), worker (x-kvroute-worker)
//! external routers (peers): the same load against their URL, caches reset on the workers
//! stats::summarize / sweep --> report (same JSON / Markdown / SVG as sim)
//! ```
//!
//! Live-only flags: `--speedup` (worker clock speed-up, default 10), `--tokenizer`,
//! `--log-dir` (keep the processes' logs), `--external-router name=URL` (already running
//! routers to measure too) with `--external-worker URL` (the workers behind them, reset between
//! runs), `--prompt-format ids|text` (text: the ids decoded with the tokenizer, for routers that
//! accept no token ids); each also reads its `KVROUTE_BENCH_*` environment variable.
//! `--policies none` measures only the external routers. `kvroute demo` (demo.rs) is a preset
//! of this mode that shows its progress on a bar ([`run_live_with`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::sim::{Arrivals, RequestRecord, RunResult};
use super::stats::{SweepPoint, peak_goodput, summarize};
use super::workload::{self, Session};
use super::{BenchArgs, PolicyResult, SuiteConfig, SuiteResult, WorkloadResult, parse_list};
use crate::local::{DeployConfig, Deployment};
use crate::procs;
use kvroute_tokenization::Tokenizer;

/// Served model name of the mock workers (requests name it).
pub const MODEL: &str = "qwen3-32b";
const NAMESPACE: &str = "bench";
/// The Qwen3 tokenizer in the repository's test data.
pub const DEFAULT_TOKENIZER: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizers/qwen3");

/// Live settings beyond `BenchArgs` (from the environment, see the module doc).
#[derive(Clone, Debug)]
pub struct LiveConfig {
    /// Clock speed-up of the mock workers.
    pub speedup: f64,
    /// Tokenizer directory for the workers and the router.
    pub tokenizer: PathBuf,
    /// Where the processes' logs are kept (when absent, a temporary directory).
    pub log_dir: Option<PathBuf>,
    /// (name, gateway URL) of routers started by someone else.
    pub external_routers: Vec<(String, String)>,
    /// Base URLs of the workers behind the external routers.
    pub external_workers: Vec<String>,
    /// Send prompts as text (decoded ids) instead of token ids.
    pub text_prompts: bool,
}

impl LiveConfig {
    /// Reads the `KVROUTE_BENCH_*` variables of the module doc.
    pub fn from_args(args: &super::BenchArgs) -> anyhow::Result<Self> {
        if !(args.speedup.is_finite() && args.speedup > 0.0) {
            bail!("--speedup {} must be a positive number", args.speedup);
        }
        let external_routers = parse_named_urls(&args.external_routers.join(","))?;
        let external_workers = args
            .external_workers
            .iter()
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect();
        let text_prompts = match args.prompt_format.trim() {
            "ids" => false,
            "text" => true,
            other => bail!("--prompt-format {other:?}: expected ids or text"),
        };
        Ok(Self {
            text_prompts,
            speedup: args.speedup,
            tokenizer: args
                .tokenizer
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_TOKENIZER)),
            log_dir: args.log_dir.clone(),
            external_routers,
            external_workers,
        })
    }
}

/// Parses `name=URL,name=URL`.
pub fn parse_named_urls(s: &str) -> anyhow::Result<Vec<(String, String)>> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            let (name, url) = x
                .split_once('=')
                .with_context(|| format!("{x:?} is not name=URL"))?;
            let (name, url) = (name.trim(), url.trim().trim_end_matches('/'));
            if name.is_empty() || !(url.starts_with("http://") || url.starts_with("https://")) {
                bail!("{x:?} is not name=http://host:port");
            }
            Ok((name.to_string(), url.to_string()))
        })
        .collect()
}

// ------------------------------------------------------------------------------------------
// Requests (pure)
// ------------------------------------------------------------------------------------------

/// The `/v1/completions` body of one turn: token-id prompt, streamed, usage included, the
/// generated ids returned (they extend the session's history), EOS ignored.
pub fn request_body(model: &str, prompt: Value, max_tokens: u32, salt: Option<&str>) -> Value {
    let mut v = json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
        "return_token_ids": true,
    });
    if let Some(s) = salt {
        v["cache_salt"] = json!(s);
    }
    v
}

/// Index of the worker a `x-kvroute-worker` value names: the exact id, else the pod name
/// (`worker-<i>`) at its end.
pub fn worker_index(header: &str, ids: &[String]) -> Option<usize> {
    if let Some(i) = ids.iter().position(|w| w == header) {
        return Some(i);
    }
    let tail = header.rsplit('/').next().unwrap_or(header);
    tail.strip_prefix("worker-")
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&i| i < ids.len())
}

/// Generated token ids in a streamed completion chunk (`choices[].token_ids`).
fn chunk_token_ids(chunk: &Value, out: &mut Vec<u32>) {
    let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
        return;
    };
    for c in choices {
        if let Some(ids) = c.get("token_ids").and_then(Value::as_array) {
            out.extend(
                ids.iter()
                    .filter_map(Value::as_u64)
                    .filter_map(|i| u32::try_from(i).ok()),
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// Load generator
// ------------------------------------------------------------------------------------------

/// One measured request, in wall-clock seconds since the run's start.
struct Measured {
    start: f64,
    ttft: f64,
    end: f64,
    prompt_tokens: usize,
    cached_tokens: usize,
    worker: Option<usize>,
    predicted_ms: Option<f64>,
    /// The router's published p90 bound on it (`x-kvroute-ttft-p90-bound-ms`).
    bound_ms: Option<f64>,
    generated: Vec<u32>,
    /// The prompt's first token id (tells the shared-prefix workload's prefixes apart).
    first_token: Option<u32>,
}

async fn send_turn(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    t0: Instant,
    worker_ids: &[String],
) -> anyhow::Result<Measured> {
    use kvroute_router::gateway::openai::{StreamItem, inspect_chunk_json};
    use kvroute_router::gateway::sse::SseParser;
    use kvroute_router::gateway::{PREDICTED_TTFT_HEADER, TTFT_BOUND_HEADER, WORKER_HEADER};
    let start = t0.elapsed().as_secs_f64();
    let resp = client.post(url).json(body).send().await.context("send")?;
    let status = resp.status();
    let header = |h: &str| {
        resp.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let worker = header(WORKER_HEADER).and_then(|w| worker_index(&w, worker_ids));
    let predicted_ms = header(PREDICTED_TTFT_HEADER).and_then(|p| p.parse::<f64>().ok());
    let bound_ms = header(TTFT_BOUND_HEADER).and_then(|p| p.parse::<f64>().ok());
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        bail!(
            "status {status}: {}",
            text.chars().take(300).collect::<String>()
        );
    }
    let mut stream = resp.bytes_stream();
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    let mut ttft = None;
    let mut usage = None;
    let mut generated = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("stream broke off")?;
        parser.push(&chunk, &mut events)?;
        for e in events.drain(..) {
            // The load generator reads the generated token ids, so it parses in full.
            if let (
                StreamItem::Chunk {
                    content, usage: u, ..
                },
                Some(json),
            ) = inspect_chunk_json(&e.data)
            {
                if content && ttft.is_none() {
                    ttft = Some(t0.elapsed().as_secs_f64());
                }
                chunk_token_ids(&json, &mut generated);
                if u.is_some() {
                    usage = u;
                }
            }
        }
    }
    let end = t0.elapsed().as_secs_f64();
    let usage = usage.context("no usage in the stream")?;
    Ok(Measured {
        start,
        ttft: ttft.unwrap_or(end) - start,
        end,
        prompt_tokens: usize::try_from(usage.prompt_tokens).unwrap_or(usize::MAX),
        cached_tokens: usize::try_from(usage.cached_tokens).unwrap_or(usize::MAX),
        worker,
        predicted_ms,
        bound_ms,
        generated,
        first_token: None,
    })
}

/// Where a run's results go.
#[derive(Default)]
struct Sink {
    measured: Vec<Measured>,
    errors: Vec<String>,
}

/// What every client task of one run shares.
#[derive(Clone)]
struct LoadGen {
    client: reqwest::Client,
    url: String,
    /// The run's start: every time in `Measured` counts from it.
    t0: Instant,
    worker_ids: Arc<Vec<String>>,
    sink: Arc<Mutex<Sink>>,
    /// Send prompts as text decoded with this tokenizer instead of token ids.
    text: Option<Arc<Tokenizer>>,
    /// Advanced once per request answered or failed.
    progress: ProgressBar,
}

impl LoadGen {
    /// Sends a session's turns one after another, growing its history.
    async fn run_session(&self, session: &Session) {
        let mut history: Vec<u32> = Vec::new();
        for turn in &session.turns {
            let mut prompt = std::mem::take(&mut history);
            prompt.extend_from_slice(&turn.new_tokens);
            let prompt_value = match &self.text {
                Some(t) => match t.decode(&prompt, true) {
                    Ok(s) => json!(s),
                    Err(e) => {
                        self.sink
                            .lock()
                            .await
                            .errors
                            .push(format!("decode the prompt: {e}"));
                        return;
                    }
                },
                None => json!(prompt),
            };
            let body = request_body(
                MODEL,
                prompt_value,
                turn.max_tokens,
                session.cache_salt.as_deref(),
            );
            let sent = send_turn(&self.client, &self.url, &body, self.t0, &self.worker_ids).await;
            self.progress.inc(1);
            match sent {
                Ok(mut m) => {
                    m.first_token = prompt.first().copied();
                    prompt.append(&mut m.generated);
                    history = prompt;
                    self.sink.lock().await.measured.push(m);
                }
                Err(e) => {
                    // The rest of the session depends on this turn's reply: skip it.
                    self.sink.lock().await.errors.push(format!("{e:#}"));
                    return;
                }
            }
        }
    }
}

/// Replays `sessions` against the target and returns the run in simulated seconds
/// (wall clock x the plan's speed-up) plus the failures.
async fn replay(
    target: &Target<'_>,
    plan: &RunPlan<'_>,
    sessions: Arc<Vec<Session>>,
    arrivals: Arrivals,
) -> (RunResult, Vec<String>) {
    let parallel = match arrivals {
        Arrivals::Closed { users } => users.max(1),
        Arrivals::Poisson { .. } => sessions.len().max(1),
    };
    let load = LoadGen {
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(parallel.min(256))
            .build()
            .unwrap_or_default(),
        url: format!("{}/v1/completions", target.gateway),
        t0: Instant::now(),
        worker_ids: target.worker_ids.clone(),
        sink: Arc::new(Mutex::new(Sink::default())),
        text: plan.text.clone(),
        progress: plan.progress.clone(),
    };
    let mut tasks = tokio::task::JoinSet::new();
    match arrivals {
        Arrivals::Closed { users } => {
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..users.max(1) {
                let (load, next, sessions) = (load.clone(), next.clone(), sessions.clone());
                tasks.spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(s) = sessions.get(i) else { break };
                        load.run_session(s).await;
                    }
                });
            }
        }
        Arrivals::Poisson { rate_per_s } => {
            // Arrival times in simulated seconds, paced in wall time (/ speedup).
            let mut rng = ChaCha8Rng::seed_from_u64(plan.seed ^ 0x6172_7269_7661_6c73);
            let wall_rate = (rate_per_s * plan.speedup).max(1e-9);
            let mut at = 0.0f64;
            for i in 0..sessions.len() {
                let u: f64 = rng.random_range(f64::EPSILON..1.0);
                at += -u.ln() / wall_rate;
                let (load, sessions) = (load.clone(), sessions.clone());
                tasks.spawn(async move {
                    let start = load.t0 + Duration::from_secs_f64(at);
                    tokio::time::sleep_until(start.into()).await;
                    if let Some(s) = sessions.get(i) {
                        load.run_session(s).await;
                    }
                });
            }
        }
    }
    let mut errors = Vec::new();
    while let Some(res) = tasks.join_next().await {
        if let Err(e) = res {
            errors.push(format!("client task failed: {e}"));
        }
    }
    let sink = std::mem::take(&mut *load.sink.lock().await);
    errors.extend(sink.errors);
    (to_run_result(sink.measured, plan.speedup), errors)
}

/// Wall-clock measurements -> a run in simulated seconds, in arrival order.
fn to_run_result(mut m: Vec<Measured>, speedup: f64) -> RunResult {
    m.sort_by(|a, b| a.start.total_cmp(&b.start));
    let first = m.first().map_or(0.0, |x| x.start);
    let last = m.iter().map(|x| x.end).fold(first, f64::max);
    let records = m
        .iter()
        .map(|x| RequestRecord {
            // Unknown worker (external routers): an index no worker has.
            worker: x.worker.unwrap_or(usize::MAX),
            arrival: (x.start - first) * speedup,
            ttft: x.ttft * speedup,
            e2e: (x.end - x.start) * speedup,
            prompt_tokens: x.prompt_tokens,
            cached_tokens: x.cached_tokens,
            // The router predicts in wall-clock time, like every other figure it sees.
            predicted_ttft: x.predicted_ms.map_or(f64::NAN, |p| p / 1e3 * speedup),
            published_bound: x.bound_ms.map_or(f64::NAN, |p| p / 1e3 * speedup),
            floor_ttft: f64::NAN,
            true_ttfts: Vec::new(),
            predicted_ttfts: Vec::new(),
            scores: Vec::new(),
            candidates: None,
            reason: None,
            first_token: x.first_token,
        })
        .collect();
    RunResult {
        records,
        rejected: 0,
        makespan: (last - first) * speedup,
    }
}

// ------------------------------------------------------------------------------------------
// Processes
// ------------------------------------------------------------------------------------------

/// Empties every worker's prefix cache (`POST /reset_prefix_cache`), retrying while blocks
/// are still in use (a request finishing), so that each run starts cold.
async fn reset_caches(worker_urls: &[String]) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    for w in worker_urls {
        let url = format!("{w}/reset_prefix_cache");
        procs::wait_for(
            &format!("{url} to succeed"),
            Duration::from_secs(30),
            || {
                let (client, url) = (client.clone(), url.clone());
                async move {
                    let resp = client.post(&url).send().await?.error_for_status()?;
                    let v: Value = resp.json().await.unwrap_or(Value::Null);
                    // vLLM answers 200 with no body; the mock says whether it succeeded.
                    Ok((v.get("success").and_then(Value::as_bool) != Some(false)).then_some(()))
                }
            },
        )
        .await?;
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Suite
// ------------------------------------------------------------------------------------------

/// What one policy (or external router) gets measured on: a gateway and its workers.
struct Target<'a> {
    name: &'a str,
    gateway: &'a str,
    /// The router's admin server when it is kvroute's own (its bound counter is read).
    admin: Option<&'a str>,
    worker_urls: &'a [String],
    worker_ids: Arc<Vec<String>>,
}

struct RunPlan<'a> {
    sessions: &'a Arc<Vec<Session>>,
    headline: Arrivals,
    sweep: &'a [usize],
    /// Open-loop levels (`--rate-sweep`), new sessions per simulated second.
    rate_sweep: &'a [f64],
    /// `--sweep-sessions`: sessions per open-loop level (default all).
    sweep_sessions: Option<usize>,
    speedup: f64,
    seed: u64,
    workers: usize,
    text: Option<Arc<Tokenizer>>,
    progress: &'a ProgressBar,
    /// `--records`: the headline run's requests go to `<dir>/<workload>-<policy>.jsonl`.
    records: Option<(&'a std::path::Path, &'a str)>,
}

/// The router's `(covered, missed)` bound counts; None when its metrics cannot be read.
async fn router_bound_counts(admin: &str) -> Option<(u64, u64)> {
    let text = reqwest::Client::new()
        .get(format!("{admin}/metrics"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    super::calibration::router_bound_counts(&text)
}

async fn measure(target: &Target<'_>, plan: &RunPlan<'_>) -> anyhow::Result<PolicyResult> {
    reset_caches(target.worker_urls).await?;
    plan.progress
        .set_message(format!("{}: replaying", target.name));
    let (headline, errors) = replay(target, plan, plan.sessions.clone(), plan.headline).await;
    if let Some((dir, workload)) = plan.records {
        super::write_records(dir, workload, target.name, &headline)?;
    }
    // Read before the sweeps add their requests.
    let router_bound = match target.admin {
        Some(admin) => router_bound_counts(admin).await,
        None => None,
    };
    let mut failed = errors.len();
    for e in errors.iter().take(3) {
        plan.progress.suspend(|| eprintln!("{}: {e}", target.name));
    }
    let mut points = Vec::new();
    for &c in plan.sweep {
        reset_caches(target.worker_urls).await?;
        let n = (c * 6).max(24).min(plan.sessions.len());
        let subset = Arc::new(plan.sessions[..n].to_vec());
        let (r, errors) = replay(target, plan, subset, Arrivals::Closed { users: c }).await;
        failed += errors.len();
        points.push(SweepPoint::of(c, &r));
    }
    let mut open = Vec::new();
    for &rate in plan.rate_sweep {
        reset_caches(target.worker_urls).await?;
        let n = plan
            .sweep_sessions
            .unwrap_or(plan.sessions.len())
            .min(plan.sessions.len());
        let subset = Arc::new(plan.sessions[..n].to_vec());
        let arrivals = Arrivals::Poisson { rate_per_s: rate };
        let (r, errors) = replay(target, plan, subset, arrivals).await;
        failed += errors.len();
        open.push(SweepPoint::open(rate, &r));
    }
    let mut summary = summarize(&headline, plan.workers);
    summary.rejected = failed;
    Ok(PolicyResult {
        policy: target.name.to_string(),
        peak_goodput_open_rpm: super::stats::peak_goodput_open(&open),
        rate_sweep: open,
        peak_goodput_rpm: peak_goodput(&points, false),
        peak_goodput_interactive_rpm: peak_goodput(&points, true),
        ttfts: headline.records.iter().map(|r| r.ttft).collect(),
        floor: None,
        prediction: (target.name == "kvroute")
            .then(|| super::calibration::evaluate_predicted(&[&headline.records]))
            .flatten()
            .map(|mut q| {
                if let Some((covered, missed)) = router_bound {
                    q.router_bounded = covered + missed;
                    if q.router_bounded > 0 {
                        q.router_bound_coverage = covered as f64 / q.router_bounded as f64;
                    }
                }
                q
            }),
        summary,
        sweep: points,
    })
}

/// Runs the live suite: every selected workload x policy (greedy-clairvoyant skipped) on fresh local
/// deployments, plus the external routers of `live`.
pub async fn run_live(args: &BenchArgs, live: &LiveConfig) -> anyhow::Result<SuiteResult> {
    run_live_with(args, live, &ProgressBar::hidden()).await
}

/// [`run_live`], reporting on `progress`: one step per request (the caller sets its length),
/// the current stage as its message, and log lines printed above it.
pub async fn run_live_with(
    args: &BenchArgs,
    live: &LiveConfig,
    progress: &ProgressBar,
) -> anyhow::Result<SuiteResult> {
    let only_external = args.policies == "none";
    let mut selection_args = args.clone();
    if only_external {
        selection_args.policies = "all".into();
    }
    let (specs, policies) = super::selection(&selection_args)?;
    let policies: Vec<String> = if only_external {
        Vec::new()
    } else {
        policies
            .into_iter()
            .filter(|p| p != "greedy-clairvoyant")
            .collect()
    };
    if policies.is_empty() && live.external_routers.is_empty() {
        bail!(
            "nothing to measure: no live policy (greedy-clairvoyant is sim-only) and no external router"
        );
    }
    if !live.external_routers.is_empty() && live.external_workers.is_empty() {
        bail!("KVROUTE_BENCH_EXTERNAL_WORKERS must list the workers behind the external routers");
    }
    if args.workers == 0 {
        bail!("--workers must be at least 1");
    }
    if !(live.speedup.is_finite() && live.speedup > 0.0) {
        bail!("the speed-up must be a positive number");
    }
    if !policies.is_empty() && !live.tokenizer.join("tokenizer.json").is_file() {
        bail!(
            "no tokenizer.json in {} (set KVROUTE_BENCH_TOKENIZER)",
            live.tokenizer.display()
        );
    }
    let rate_sweep = super::parse_rates(args.rate_sweep.as_deref())?;
    let mut sweep = parse_list(&args.concurrency_sweep)?;
    if args.quick {
        sweep.retain(|&c| c <= 8);
        if sweep.is_empty() {
            sweep = vec![2, 4];
        }
    }
    let headline = match args.rate {
        Some(r) if r.is_finite() && r > 0.0 => Arrivals::Poisson { rate_per_s: r },
        Some(r) => bail!("--rate {r} must be a positive number"),
        None => Arrivals::Closed {
            users: args.concurrency.max(1),
        },
    };
    let (log_dir, remove_logs) = match &live.log_dir {
        Some(d) => (d.clone(), false),
        None => {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let d = std::env::temp_dir().join(format!(
                "kvroute-bench-{}-{}",
                std::process::id(),
                stamp.as_millis()
            ));
            (d, true)
        }
    };
    let text = if live.text_prompts {
        let t = Tokenizer::from_dir(&live.tokenizer)
            .with_context(|| format!("load the tokenizer in {}", live.tokenizer.display()))?;
        Some(Arc::new(t))
    } else {
        None
    };
    if let Some(dir) = &args.records {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let mut workloads = Vec::new();
    for spec in specs {
        let sessions = Arc::new(workload::generate(&spec, args.seed()));
        let plan = RunPlan {
            sessions: &sessions,
            headline,
            sweep: &sweep,
            rate_sweep: &rate_sweep,
            sweep_sessions: args.sweep_sessions,
            speedup: live.speedup,
            seed: args.seed(),
            workers: args.workers,
            text: text.clone(),
            progress,
            records: args.records.as_deref().map(|dir| (dir, spec.kind.name())),
        };
        let mut results = Vec::new();
        for policy in &policies {
            let cfg = DeployConfig {
                name: NAMESPACE,
                model: MODEL,
                workers: args.workers,
                speedup: live.speedup,
                profile: &args.profile,
                tokenizer: &live.tokenizer,
                log_dir: &log_dir.join(spec.kind.name()),
            };
            progress.set_message(format!(
                "{policy}: starting {} workers, sidecars, router",
                args.workers
            ));
            let d = Deployment::start(&cfg, policy).await.with_context(|| {
                format!(
                    "start the deployment for policy {policy} (logs in {})",
                    log_dir.display()
                )
            })?;
            let target = Target {
                name: policy,
                gateway: &d.gateway,
                admin: Some(&d.router_admin),
                worker_urls: &d.worker_urls,
                worker_ids: Arc::new(d.worker_ids.clone()),
            };
            let r = measure(&target, &plan).await;
            d.stop().await;
            let r = r?;
            progress.suspend(|| log_line(spec.kind.name(), &r));
            results.push(r);
        }
        for (name, url) in &live.external_routers {
            let target = Target {
                name,
                gateway: url,
                admin: None,
                worker_urls: &live.external_workers,
                worker_ids: Arc::new(Vec::new()),
            };
            let r = measure(&target, &plan).await?;
            progress.suspend(|| log_line(spec.kind.name(), &r));
            results.push(r);
        }
        workloads.push(WorkloadResult {
            spec,
            policies: results,
        });
    }
    if remove_logs {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    Ok(SuiteResult {
        config: SuiteConfig {
            mode: "live".into(),
            workers: args.workers,
            seed: args.seed(),
            concurrency: args.concurrency,
            sweep,
            rate_sweep,
            rate: args.rate,
            report_delay_ms: f64::NAN,
            scrape_interval_ms: 100.0,
            profile: format!("{} (mock-vllm, speedup x{})", args.profile, live.speedup),
            quick: args.quick,
            repeats: 1,
            overcommit_margin: None,
            rate_pool: None,
            step_share: None,
            working_set_horizon: None,
            decode_steps: None,
            step_budget_tokens: None,
        },
        workloads,
    })
}

fn log_line(workload: &str, r: &PolicyResult) {
    // Goodput comes from the sweep: without one (`kvroute demo`) there is none to show.
    let goodput = if r.sweep.is_empty() {
        String::new()
    } else {
        format!("  goodput {:>6.1} rpm", r.peak_goodput_rpm)
    };
    let open = super::stats::open_loop_note(r.peak_goodput_open_rpm);
    eprintln!(
        "{:<14} {:<19} ttft p50 {:>7.3}s p90 {:>7.3}s  hit {:>5.1}%{goodput}{open}  failed {}",
        workload,
        r.policy,
        r.summary.ttft_p50_s,
        r.summary.ttft_p90_s,
        r.summary.cache_hit_rate * 100.0,
        r.summary.rejected
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_stream_token_ids_with_usage() {
        let b = request_body("m", json!([1, 2, 3]), 8, Some("t"));
        assert_eq!(b["prompt"], json!([1, 2, 3]));
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["cache_salt"], "t");
        assert!(
            request_body("m", json!("hi"), 1, None)
                .get("cache_salt")
                .is_none()
        );
    }

    #[test]
    fn worker_headers_map_to_indices() {
        let ids = vec!["bench/worker-0".to_string(), "bench/worker-1".to_string()];
        assert_eq!(worker_index("bench/worker-1", &ids), Some(1));
        assert_eq!(worker_index("other/worker-0", &ids), Some(0));
        assert_eq!(worker_index("worker-7", &ids), None);
        assert_eq!(worker_index("garbage", &ids), None);
        assert_eq!(worker_index("", &[]), None);
    }

    #[test]
    fn named_urls_parse_and_reject_garbage() {
        let v = parse_named_urls("sglang=http://127.0.0.1:1/, vllm=http://h:2").expect("ok");
        assert_eq!(v[0], ("sglang".into(), "http://127.0.0.1:1".into()));
        assert_eq!(v[1].0, "vllm");
        assert!(parse_named_urls("nourl").is_err());
        assert!(parse_named_urls("x=ftp://a").is_err());
        assert!(parse_named_urls("=http://a").is_err());
    }

    #[test]
    fn chunk_token_ids_ignore_bad_values() {
        let mut out = Vec::new();
        chunk_token_ids(
            &json!({"choices": [{"token_ids": [5, -1, "x", 4294967296u64, 7]}]}),
            &mut out,
        );
        chunk_token_ids(&json!({"choices": "nope"}), &mut out);
        assert_eq!(out, vec![5, 7]);
    }

    #[test]
    fn wall_clock_becomes_simulated_time() {
        let m = |start: f64, ttft: f64, end: f64| Measured {
            start,
            ttft,
            end,
            prompt_tokens: 10,
            cached_tokens: 5,
            worker: Some(0),
            predicted_ms: Some(250.0),
            bound_ms: Some(400.0),
            generated: Vec::new(),
            first_token: Some(start as u32),
        };
        let r = to_run_result(vec![m(2.0, 0.1, 3.0), m(1.0, 0.2, 1.5)], 10.0);
        assert_eq!(r.records.len(), 2);
        assert!((r.records[0].ttft - 2.0).abs() < 1e-9);
        assert!((r.records[1].arrival - 10.0).abs() < 1e-9);
        assert!((r.makespan - 20.0).abs() < 1e-9);
        // The router's prediction is wall time too: 250 ms at x10 is 2.5 simulated s.
        assert!((r.records[0].predicted_ttft - 2.5).abs() < 1e-9);
        assert!((r.records[0].published_bound - 4.0).abs() < 1e-9);
        // Records keep the prompt's first token (which prefix, in shared-prefix workloads).
        assert_eq!(r.records[0].first_token, Some(1));
    }
}
