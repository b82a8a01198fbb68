//! `kvroute demo`: the one-command comparison of random routing and kvroute on a shared-prefix
//! chat workload, with every component running as a real local process on loopback.
//!
//! ```text
//! for policy in [random, kvroute]:                     (fresh processes: caches start cold)
//!   N x `kvroute mock-vllm` (L40S profile, sped up) --ZMQ--> N x `kvroute sidecar` --gRPC--+
//!                                                                                        v
//!   replay(workload, concurrency) --HTTP SSE--> `kvroute router --policy P` (gateway) --> worker
//!   measure TTFT / e2e / cached tokens / worker per request
//! report: table (stdout), CDF chart (SVG), figures (--json)
//! ```
//!
//! Times are reported in simulated seconds: the mock workers run their clock `--speedup`
//! times faster than the wall clock, so wall-clock measurements are multiplied back.
//! The pure parts (workload generation, statistics, table, chart, JSON) are functions of their
//! inputs and tested below; [`run`] does the process and socket work.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use crate::local::{DeployConfig, Deployment};

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
    #[arg(long, env = "KVROUTE_DEMO_PREFIXES", default_value_t = 8)]
    pub prefixes: usize,
    /// Approximate length of each shared system prompt, in tokens.
    #[arg(long, env = "KVROUTE_DEMO_PREFIX_TOKENS", default_value_t = 2000)]
    pub prefix_tokens: usize,
    /// Fewest output tokens per request.
    #[arg(long, env = "KVROUTE_DEMO_MIN_OUTPUT_TOKENS", default_value_t = 64)]
    pub min_output_tokens: u32,
    /// Most output tokens per request.
    #[arg(long, env = "KVROUTE_DEMO_MAX_OUTPUT_TOKENS", default_value_t = 128)]
    pub max_output_tokens: u32,
    /// Seed of the workload (the same requests in the same order for every policy).
    #[arg(long, env = "KVROUTE_DEMO_SEED", default_value_t = 7)]
    pub seed: u64,
    /// Mock worker timing profile (built-in name or file).
    #[arg(
        long,
        env = "KVROUTE_DEMO_PROFILE",
        default_value = "l40s-qwen3-32b-fp8"
    )]
    pub profile: String,
    /// Tokenizer directory shared by the workers and the router.
    #[arg(long, env = "KVROUTE_DEMO_TOKENIZER", default_value = DEFAULT_TOKENIZER)]
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

const MODEL: &str = "qwen3-32b";
const NAMESPACE: &str = "demo";

/// The Qwen3 tokenizer in the repository's test data.
const DEFAULT_TOKENIZER: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizers/qwen3");

// ------------------------------------------------------------------------------------------
// Workload (pure)
// ------------------------------------------------------------------------------------------

/// Shape of the replayed workload.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    /// Requests.
    pub requests: usize,
    /// Distinct system prompts.
    pub prefixes: usize,
    /// Words per system prompt (about one token each).
    pub prefix_tokens: usize,
    /// Output tokens, inclusive range.
    pub output_tokens: (u32, u32),
}

/// One request of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoRequest {
    /// Which system prompt it shares.
    pub prefix: usize,
    /// The chat completion body (streaming, usage on).
    pub body: Value,
}

/// Common short English words: almost all are one Qwen3 token with their leading space, so a
/// prompt of N words is about N tokens.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "for", "that", "with", "as", "on", "are", "by", "this",
    "be", "from", "or", "at", "an", "which", "it", "can", "not", "all", "has", "have", "more",
    "one", "their", "other", "its", "when", "new", "will", "also", "each", "been", "would", "use",
    "data", "time", "system", "model", "work", "first", "used", "these", "may", "any", "some",
    "such", "two", "only", "than", "into", "most", "over", "then", "should", "very", "well",
    "state", "part", "high", "same", "order", "group", "policy", "report", "value", "table",
    "price", "water", "light", "power", "level", "small", "large", "early", "later", "above",
    "below", "north", "south", "river", "city", "house", "market", "energy", "signal", "memory",
    "cache", "server", "request", "answer", "question", "review", "account", "service", "network",
    "record", "design", "process", "result", "method", "source", "change", "number", "common",
    "simple", "recent", "public", "local", "human",
];

/// The workload: `spec.prefixes` long system prompts, each request one of them plus a short
/// question, in a seeded order.
pub fn generate_workload(spec: &WorkloadSpec, model: &str, seed: u64) -> Vec<DemoRequest> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let word = |rng: &mut ChaCha8Rng| WORDS[rng.random_range(0..WORDS.len())];
    let prefixes: Vec<String> = (0..spec.prefixes.max(1))
        .map(|p| {
            let mut text = format!("You are assistant number {p}. Reference document {p} follows.");
            for i in 0..spec.prefix_tokens {
                text.push(' ');
                text.push_str(word(&mut rng));
                if i % 16 == 15 {
                    text.push('.');
                }
            }
            text
        })
        .collect();
    let (lo, hi) = (
        spec.output_tokens.0.min(spec.output_tokens.1),
        spec.output_tokens.0.max(spec.output_tokens.1),
    );
    (0..spec.requests)
        .map(|i| {
            let prefix = rng.random_range(0..prefixes.len());
            let mut question = format!("Question {i}:");
            for _ in 0..rng.random_range(8..20) {
                question.push(' ');
                question.push_str(word(&mut rng));
            }
            question.push('?');
            let max_tokens = rng.random_range(lo..=hi);
            let body = json!({
                "model": model,
                "messages": [
                    {"role": "system", "content": prefixes[prefix]},
                    {"role": "user", "content": question},
                ],
                "max_tokens": max_tokens,
                "ignore_eos": true,
                "stream": true,
                "stream_options": {"include_usage": true},
            });
            DemoRequest { prefix, body }
        })
        .collect()
}

// ------------------------------------------------------------------------------------------
// Figures (pure)
// ------------------------------------------------------------------------------------------

/// What one request measured (wall-clock seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Time to the first generated token.
    pub ttft_s: f64,
    /// Time to the end of the stream.
    pub e2e_s: f64,
    /// Prompt tokens (worker usage).
    pub prompt_tokens: u64,
    /// Of those, served from the prefix cache.
    pub cached_tokens: u64,
    /// `x-kvroute-worker`.
    pub worker: String,
}

/// The figures of one policy, in simulated seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyFigures {
    /// Policy name.
    pub policy: String,
    /// Requests that completed.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Median TTFT.
    pub ttft_p50_s: f64,
    /// 90th percentile TTFT.
    pub ttft_p90_s: f64,
    /// Median end-to-end latency.
    pub e2e_p50_s: f64,
    /// Cached prompt tokens / prompt tokens.
    pub cache_hit_rate: f64,
    /// Completed requests per worker, in worker order.
    pub requests_per_worker: Vec<usize>,
    /// Every TTFT, sorted (for the chart).
    pub ttfts_s: Vec<f64>,
}

/// Quantiles: the benchmark's (linear interpolation, NaN when empty).
pub use crate::bench::stats::quantile;

/// Summarises a policy's outcomes; `speedup` turns wall seconds into simulated seconds.
pub fn figures(
    policy: &str,
    outcomes: &[Outcome],
    failed: usize,
    workers: &[String],
    speedup: f64,
) -> PolicyFigures {
    let mut ttfts: Vec<f64> = outcomes.iter().map(|o| o.ttft_s * speedup).collect();
    let mut e2es: Vec<f64> = outcomes.iter().map(|o| o.e2e_s * speedup).collect();
    ttfts.sort_by(f64::total_cmp);
    e2es.sort_by(f64::total_cmp);
    let prompt: u64 = outcomes.iter().map(|o| o.prompt_tokens).sum();
    let cached: u64 = outcomes
        .iter()
        .map(|o| o.cached_tokens.min(o.prompt_tokens))
        .sum();
    let requests_per_worker = workers
        .iter()
        .map(|w| outcomes.iter().filter(|o| &o.worker == w).count())
        .collect();
    PolicyFigures {
        policy: policy.to_string(),
        completed: outcomes.len(),
        failed,
        ttft_p50_s: quantile(&ttfts, 0.5),
        ttft_p90_s: quantile(&ttfts, 0.9),
        e2e_p50_s: quantile(&e2es, 0.5),
        cache_hit_rate: if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        },
        requests_per_worker,
        ttfts_s: ttfts,
    }
}

/// `{"policies": {"random": {...}, "kvroute": {...}}, ...}`.
pub fn figures_json(all: &[PolicyFigures], speedup: f64, requests: usize) -> Value {
    let mut policies = serde_json::Map::new();
    for f in all {
        policies.insert(
            f.policy.clone(),
            json!({
                "ttft_p50_s": finite(f.ttft_p50_s),
                "ttft_p90_s": finite(f.ttft_p90_s),
                "e2e_p50_s": finite(f.e2e_p50_s),
                "cache_hit_rate": f.cache_hit_rate,
                "requests_per_worker": f.requests_per_worker,
                "completed": f.completed,
                "failed": f.failed,
            }),
        );
    }
    json!({"policies": policies, "requests_per_policy": requests, "speedup": speedup, "time_unit": "simulated seconds"})
}

fn finite(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

/// The side-by-side table printed at the end.
pub fn render_table(all: &[PolicyFigures], speedup: f64) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<22}", "");
    for f in all {
        let _ = write!(out, "{:>16}", f.policy);
    }
    out.push('\n');
    let mut row = |label: &str, cell: &dyn Fn(&PolicyFigures) -> String| {
        let _ = write!(out, "{label:<22}");
        for f in all {
            let _ = write!(out, "{:>16}", cell(f));
        }
        out.push('\n');
    };
    row("TTFT p50 (s)", &|f| format!("{:.3}", f.ttft_p50_s));
    row("TTFT p90 (s)", &|f| format!("{:.3}", f.ttft_p90_s));
    row("e2e p50 (s)", &|f| format!("{:.2}", f.e2e_p50_s));
    row("cache hit rate", &|f| {
        format!("{:.1}%", f.cache_hit_rate * 100.0)
    });
    row("requests per worker", &|f| {
        f.requests_per_worker
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("/")
    });
    row("completed / failed", &|f| {
        format!("{} / {}", f.completed, f.failed)
    });
    let _ = writeln!(out, "times in simulated seconds (wall clock x {speedup})");
    out
}

const COLORS: &[&str] = &["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"];

fn nice_ceiling(x: f64) -> f64 {
    if !(x.is_finite() && x > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|v| *v >= x)
        .unwrap_or(10.0 * mag)
}

/// The TTFT distributions as an SVG chart: one empirical CDF (step line) per policy.
pub fn render_svg(all: &[PolicyFigures], speedup: f64) -> String {
    let (w, h) = (720.0, 440.0);
    let (left, right, top, bottom) = (70.0, 30.0, 50.0, 60.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let max_x = nice_ceiling(
        all.iter()
            .filter_map(|f| f.ttfts_s.last().copied())
            .fold(0.0, f64::max),
    );
    let x = |v: f64| left + pw * (v / max_x).clamp(0.0, 1.0);
    let y = |p: f64| top + ph * (1.0 - p.clamp(0.0, 1.0));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">Time to first token, CDF per routing policy</text>"#,
        w / 2.0
    );
    for i in 0..=5 {
        let v = max_x * f64::from(i) / 5.0;
        let p = f64::from(i) / 5.0;
        let _ = writeln!(
            s,
            r##"<line x1="{x0:.1}" y1="{t}" x2="{x0:.1}" y2="{b}" stroke="#ddd"/><text x="{x0:.1}" y="{ly}" text-anchor="middle">{v}</text>"##,
            x0 = x(v),
            t = top,
            b = top + ph,
            ly = top + ph + 18.0,
            v = trim_float(v)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{l}" y1="{y0:.1}" x2="{r}" y2="{y0:.1}" stroke="#ddd"/><text x="{lx}" y="{ty:.1}" text-anchor="end">{p}</text>"##,
            l = left,
            r = left + pw,
            y0 = y(p),
            lx = left - 8.0,
            ty = y(p) + 4.0,
            p = trim_float(p)
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">TTFT (simulated seconds = wall clock x {})</text>"#,
        left + pw / 2.0,
        h - 18.0,
        trim_float(speedup)
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">fraction of requests</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    for (i, f) in all.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let n = f.ttfts_s.len();
        if n > 0 {
            let mut pts = format!("{:.1},{:.1}", x(0.0), y(0.0));
            for (k, v) in f.ttfts_s.iter().enumerate() {
                let _ = write!(
                    pts,
                    " {:.1},{:.1} {:.1},{:.1}",
                    x(*v),
                    y(k as f64 / n as f64),
                    x(*v),
                    y((k + 1) as f64 / n as f64)
                );
            }
            let _ = write!(pts, " {:.1},{:.1}", x(max_x), y(1.0));
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>"#
            );
        }
        let ly = top + 16.0 + 20.0 * i as f64;
        let lx = left + pw - 190.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{} (p50 {:.3} s, p90 {:.3} s)</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            xml_escape(&f.policy),
            f.ttft_p50_s,
            f.ttft_p90_s
        );
    }
    s.push_str("</svg>\n");
    s
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

// ------------------------------------------------------------------------------------------
// Processes and sockets
// ------------------------------------------------------------------------------------------

/// Sends one streaming request and measures it.
async fn send_one(client: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<Outcome> {
    use kvroute_router::gateway::openai::{StreamItem, inspect_chunk};
    use kvroute_router::gateway::sse::SseParser;
    let start = Instant::now();
    let resp = client.post(url).json(body).send().await.context("send")?;
    let status = resp.status();
    let worker = resp
        .headers()
        .get(kvroute_router::gateway::WORKER_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        bail!("status {status}: {text}");
    }
    let mut stream = resp.bytes_stream();
    let mut parser = SseParser::default();
    let mut events = Vec::new();
    let mut ttft = None;
    let mut usage = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("stream broke off")?;
        parser.push(&chunk, &mut events)?;
        for e in events.drain(..) {
            if let StreamItem::Chunk {
                content, usage: u, ..
            } = inspect_chunk(&e.data)
            {
                if content && ttft.is_none() {
                    ttft = Some(start.elapsed());
                }
                if u.is_some() {
                    usage = u;
                }
            }
        }
    }
    let e2e = start.elapsed();
    let usage = usage.context("no usage in the stream")?;
    Ok(Outcome {
        ttft_s: ttft.unwrap_or(e2e).as_secs_f64(),
        e2e_s: e2e.as_secs_f64(),
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: usage.cached_tokens,
        worker,
    })
}

/// Replays the workload with `concurrency` requests in flight.
async fn replay(
    gateway: &str,
    workload: Arc<Vec<DemoRequest>>,
    concurrency: usize,
    progress: &indicatif::ProgressBar,
) -> (Vec<Outcome>, Vec<String>) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap_or_default();
    let url = format!("{gateway}/v1/chat/completions");
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, url, next, workload, progress) = (
            client.clone(),
            url.clone(),
            next.clone(),
            workload.clone(),
            progress.clone(),
        );
        tasks.spawn(async move {
            let mut ok = Vec::new();
            let mut errors = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(req) = workload.get(i) else { break };
                match send_one(&client, &url, &req.body).await {
                    Ok(o) => ok.push(o),
                    Err(e) => errors.push(format!("request {i}: {e:#}")),
                }
                progress.inc(1);
            }
            (ok, errors)
        });
    }
    let mut outcomes = Vec::new();
    let mut errors = Vec::new();
    while let Some(res) = tasks.join_next().await {
        match res {
            Ok((o, e)) => {
                outcomes.extend(o);
                errors.extend(e);
            }
            Err(e) => errors.push(format!("client task failed: {e}")),
        }
    }
    (outcomes, errors)
}

/// Runs the workload once per policy, each on a fresh deployment (cold caches).
async fn compare(
    cfg: &DeployConfig<'_>,
    policies: &[String],
    workload: Arc<Vec<DemoRequest>>,
    concurrency: usize,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<PolicyFigures>> {
    let mut all = Vec::new();
    for policy in policies {
        progress.set_message(format!(
            "{policy}: starting {} workers, sidecars, router",
            cfg.workers
        ));
        let deployment = Deployment::start(cfg, policy).await.with_context(|| {
            format!(
                "start the deployment for policy {policy} (logs in {})",
                cfg.log_dir.join(policy).display()
            )
        })?;
        progress.set_message(format!("{policy}: replaying"));
        let (outcomes, errors) =
            replay(&deployment.gateway, workload.clone(), concurrency, progress).await;
        let worker_ids = deployment.worker_ids.clone();
        deployment.stop().await;
        for e in errors.iter().take(3) {
            progress.println(format!("{policy}: {e}"));
        }
        all.push(figures(
            policy,
            &outcomes,
            errors.len(),
            &worker_ids,
            cfg.speedup,
        ));
    }
    Ok(all)
}

/// Runs the demo.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let DemoArgs {
        workers,
        speedup,
        requests,
        concurrency,
        prefixes,
        prefix_tokens,
        min_output_tokens,
        max_output_tokens,
        seed,
        profile,
        tokenizer,
        policies,
        chart,
        json: json_path,
        log_dir,
        no_progress,
    } = args;
    if workers == 0 || requests == 0 || !(speedup.is_finite() && speedup > 0.0) {
        bail!("--workers and --requests must be positive and --speedup a positive number");
    }
    if !tokenizer.join("tokenizer.json").is_file() {
        bail!(
            "no tokenizer.json in {} (pass --tokenizer DIR)",
            tokenizer.display()
        );
    }
    let (log_dir, remove_logs) = match log_dir {
        Some(d) => (d, false),
        None => {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            let d = std::env::temp_dir().join(format!(
                "kvroute-demo-{}-{}",
                std::process::id(),
                stamp.as_millis()
            ));
            (d, true)
        }
    };
    let spec = WorkloadSpec {
        requests,
        prefixes,
        prefix_tokens,
        output_tokens: (min_output_tokens, max_output_tokens),
    };
    let workload = Arc::new(generate_workload(&spec, MODEL, seed));
    println!(
        "kvroute demo: {workers} mock workers (profile {profile}, clock x{speedup}), {requests} chat requests per \
         policy sharing {prefixes} system prompts of ~{prefix_tokens} tokens, {concurrency} in flight"
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
    let cfg = DeployConfig {
        name: NAMESPACE,
        model: MODEL,
        workers,
        speedup,
        profile: &profile,
        tokenizer: &tokenizer,
        log_dir: &log_dir,
    };
    let result = compare(&cfg, &policies, workload, concurrency, &progress).await;
    progress.finish_and_clear();
    if remove_logs && result.is_ok() {
        let _ = std::fs::remove_dir_all(&log_dir);
    }
    let all = result?;
    println!("\n{}", render_table(&all, speedup));
    std::fs::write(&chart, render_svg(&all, speedup))
        .with_context(|| format!("write {}", chart.display()))?;
    println!("TTFT chart: {}", chart.display());
    if let Some(path) = json_path {
        let text = serde_json::to_string_pretty(&figures_json(&all, speedup, requests))?;
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
        println!("figures: {}", path.display());
    }
    let failed: usize = all.iter().map(|f| f.failed).sum();
    if failed > 0 {
        bail!("{failed} requests failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> WorkloadSpec {
        WorkloadSpec {
            requests: 20,
            prefixes: 3,
            prefix_tokens: 50,
            output_tokens: (4, 8),
        }
    }

    #[test]
    fn workload_is_seeded_and_shares_prefixes() {
        let a = generate_workload(&spec(), "m", 1);
        assert_eq!(a, generate_workload(&spec(), "m", 1));
        assert_ne!(a, generate_workload(&spec(), "m", 2));
        assert_eq!(a.len(), 20);
        for r in &a {
            let sys = r.body["messages"][0]["content"].as_str().expect("system");
            assert!(sys.starts_with(&format!("You are assistant number {}.", r.prefix)));
            assert!(sys.split(' ').count() > 50);
            let max = r.body["max_tokens"].as_u64().expect("max_tokens");
            assert!((4..=8).contains(&max));
            assert_eq!(r.body["stream"], true);
        }
        let same: Vec<_> = a.iter().filter(|r| r.prefix == a[0].prefix).collect();
        assert!(same.len() > 1);
        assert!(
            same.iter()
                .all(|r| r.body["messages"][0] == a[0].body["messages"][0])
        );
        assert!(a.iter().any(|r| r.prefix != a[0].prefix));
    }

    #[test]
    fn quantiles() {
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(quantile(&[3.0], 0.9), 3.0);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.5);
        assert!((quantile(&[0.0, 10.0], 0.9) - 9.0).abs() < 1e-12);
    }

    fn outcome(ttft: f64, worker: &str, cached: u64) -> Outcome {
        Outcome {
            ttft_s: ttft,
            e2e_s: ttft * 4.0,
            prompt_tokens: 100,
            cached_tokens: cached,
            worker: worker.into(),
        }
    }

    #[test]
    fn figures_scale_to_simulated_time_and_count_workers() {
        let o = vec![
            outcome(0.01, "a", 0),
            outcome(0.03, "b", 100),
            outcome(0.02, "b", 50),
        ];
        let f = figures(
            "kvroute",
            &o,
            1,
            &["a".into(), "b".into(), "c".into()],
            10.0,
        );
        assert!((f.ttft_p50_s - 0.2).abs() < 1e-9);
        assert!((f.e2e_p50_s - 0.8).abs() < 1e-9);
        assert!((f.cache_hit_rate - 0.5).abs() < 1e-12);
        assert_eq!(f.requests_per_worker, vec![1, 2, 0]);
        assert_eq!((f.completed, f.failed), (3, 1));
        let v = figures_json(std::slice::from_ref(&f), 10.0, 4);
        assert_eq!(
            v["policies"]["kvroute"]["requests_per_worker"],
            json!([1, 2, 0])
        );
        assert!(v["policies"]["kvroute"]["ttft_p90_s"].as_f64().is_some());
        let table = render_table(std::slice::from_ref(&f), 10.0);
        assert!(table.contains("1/2/0") && table.contains("50.0%") && table.contains("x 10"));
        let empty = figures("random", &[], 0, &["a".into()], 10.0);
        assert_eq!(
            figures_json(&[empty], 10.0, 0)["policies"]["random"]["ttft_p50_s"],
            Value::Null
        );
    }

    #[test]
    fn svg_has_one_curve_per_policy() {
        let a = figures(
            "random",
            &[outcome(0.05, "a", 0), outcome(0.09, "a", 0)],
            0,
            &["a".into()],
            10.0,
        );
        let b = figures("kvroute", &[outcome(0.01, "a", 90)], 0, &["a".into()], 10.0);
        let svg = render_svg(&[a, b], 10.0);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("random (p50") && svg.contains("kvroute (p50"));
        assert!(svg.contains("simulated seconds"));
        assert_eq!(nice_ceiling(0.83), 1.0);
        assert_eq!(nice_ceiling(3.2), 5.0);
    }
}
