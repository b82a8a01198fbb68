//! The seeded fault suite: a local deployment on loopback (mock vLLM workers, a sidecar each,
//! two router replicas exchanging placements, a [`FaultProxy`] between every sidecar and each
//! replica), steady seeded load through the gateways, and one fault injected in the middle.
//! docs/faults.md has the table of faults and what the suite measured.
//!
//! ```text
//! load (seeded: shared-prefix token-id prompts, half streaming, a deadline each)
//!   --round-robin--> router-0, router-1 (--peers) --> worker-i (mock vLLM)
//!                        ^ gRPC via FaultProxy <-- sidecar-i <-- ZMQ -- worker-i
//! timeline: [warm-up][fault held][after: hit-rate window][load stops][settle checks]
//! ```
//!
//! Per fault, [`run_fault`] records, and [`FaultReport::violations`] checks against the
//! issue's bounds:
//! - (a) every request either succeeds or gets a clear error (an HTTP error status, an SSE
//!   error event, or a transport error the client sees: a refused connection or a body cut
//!   off mid-message); a stream that ends cleanly without `[DONE]`, a success body that does
//!   not parse, or a request past its deadline is **lost**, and none may be;
//! - (b) after the load stops, every replica's assignments (`/debug/workers` in-flight, own and
//!   peers' placements) and every worker's running and waiting requests return to 0;
//! - (c) every replica's view of every worker's cache (its block count in `/debug/workers` and,
//!   through `/debug/explain`, the cached leading blocks of each shared prefix) equals the
//!   worker's own (`/mock/cache`) within 2 s of the fault ending, under load; after the load
//!   stops the views must also agree;
//! - (d) the hit rate (cached over prompt tokens, from the workers' `usage`) of the requests
//!   sent in the window after the fault ended is within 10% (relative) of the same window of a
//!   fault-free run with the same seed.
//!
//! The request stream is a pure function of the seed and the request's index (prompt, output
//! length, streaming or not, send time), so the fault-free run sends the same requests at the
//! same offsets.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt as _;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::{Value, json};

use crate::fault_proxy::{FaultProxy, ProxyMode};
use crate::local::{DeployConfig, Deployment, Topology};
use crate::procs;

/// Served model name of the suite's workers.
pub const MODEL: &str = "faults";
/// Tokens per KV block (the L40S profile's, as `local.rs` configures the sidecars).
const BLOCK: usize = 16;
/// Shared prefixes in the workload.
const PREFIXES: usize = 6;
/// Tokens of each shared prefix (a multiple of the block size).
const PREFIX_TOKENS: usize = 256;
/// Tokens of each request's own suffix.
const SUFFIX_TOKENS: usize = 24;
/// The bound of (c): a replica's view equals the worker's own this long after the fault ends.
pub const CONVERGE_BOUND: Duration = Duration::from_secs(2);
/// The bound of (d): relative distance of the after-fault hit rate from the fault-free one.
pub const HIT_RATE_BOUND: f64 = 0.10;

/// One fault of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// No fault: the run every other is compared with.
    None,
    /// A worker (mock vLLM process) killed with SIGKILL while it streams, started again on its
    /// ports after the hold.
    WorkerKilled,
    /// vLLM restarted in place (SIGHUP to the mock): its engine restarts, running requests are
    /// aborted, the cache empties and the event sequence starts again at 0.
    VllmRestarted,
    /// Dropped ZMQ frames: every worker leaves its next KV event batches off the PUB socket
    /// (`POST /mock/drop-events`), so each sidecar sees a sequence gap.
    ZmqGap,
    /// A sidecar killed with SIGKILL and started again after the hold.
    SidecarRestarted,
    /// Router replica 1 killed with SIGKILL while it streams, started again after the hold.
    RouterKilled,
    /// Every sidecar's traffic to every replica held (the fault proxies stall) for the
    /// blackhole duration.
    Blackhole,
}

impl Fault {
    /// Every fault the suite injects (not [`Fault::None`]).
    pub const ALL: [Fault; 6] = [
        Fault::WorkerKilled,
        Fault::VllmRestarted,
        Fault::ZmqGap,
        Fault::SidecarRestarted,
        Fault::RouterKilled,
        Fault::Blackhole,
    ];

    /// The fault's name (kebab case, as in docs/faults.md).
    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::WorkerKilled => "worker-killed",
            Fault::VllmRestarted => "vllm-restarted",
            Fault::ZmqGap => "zmq-gap",
            Fault::SidecarRestarted => "sidecar-restarted",
            Fault::RouterKilled => "router-killed",
            Fault::Blackhole => "blackhole",
        }
    }

    /// Parses [`Fault::name`].
    pub fn parse(s: &str) -> Option<Fault> {
        std::iter::once(Fault::None)
            .chain(Fault::ALL)
            .find(|f| f.name() == s)
    }
}

/// The suite's settings.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteConfig {
    /// Seed of the request stream.
    pub seed: u64,
    /// Mock workers (each with a sidecar).
    pub workers: usize,
    /// Router replicas (with `--peers`).
    pub routers: usize,
    /// Requests per second, all gateways together.
    pub rate: f64,
    /// Load before the fault.
    pub warmup: Duration,
    /// How long a killed process stays down, and how long a ZMQ gap is given to happen.
    pub hold: Duration,
    /// How long the sidecar-to-router blackhole lasts.
    pub blackhole: Duration,
    /// Load after the fault ended: the hit-rate window.
    pub after: Duration,
    /// A request not finished within this is lost.
    pub request_deadline: Duration,
    /// The workers' clock speed-up.
    pub speedup: f64,
    /// Tokenizer directory (workers and routers).
    #[serde(skip)]
    pub tokenizer: PathBuf,
    /// Where the processes' logs go (`<log_dir>/<fault>/`).
    #[serde(skip)]
    pub log_dir: PathBuf,
}

impl SuiteConfig {
    /// The full suite's settings: a minute of load after each fault, a 30 s blackhole.
    pub fn full(seed: u64, tokenizer: PathBuf, log_dir: PathBuf) -> Self {
        Self {
            seed,
            workers: 3,
            routers: 2,
            rate: 8.0,
            warmup: Duration::from_secs(15),
            hold: Duration::from_secs(5),
            blackhole: Duration::from_secs(30),
            after: Duration::from_secs(60),
            request_deadline: Duration::from_secs(30),
            speedup: 20.0,
            tokenizer,
            log_dir,
        }
    }

    /// The CI version: the same shape, shorter windows (8 s after the fault), and a 12 s blackhole (past the
    /// router's 10 s staleness threshold, not the issue's 30 s).
    pub fn ci(seed: u64, tokenizer: PathBuf, log_dir: PathBuf) -> Self {
        Self {
            rate: 10.0,
            warmup: Duration::from_secs(3),
            hold: Duration::from_secs(2),
            blackhole: Duration::from_secs(12),
            after: Duration::from_secs(8),
            ..Self::full(seed, tokenizer, log_dir)
        }
    }
}

/// How one request ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Complete: a parsed body, or a stream that ended with `[DONE]` and no error event.
    Ok,
    /// An HTTP error status.
    HttpError(u16),
    /// A stream that carried an error event.
    SseError,
    /// The client saw the connection fail (refused, reset, or a body cut off mid-message).
    Transport(String),
    /// No clear error: a stream that ended cleanly without `[DONE]`, a success body that does
    /// not parse, or no end within the deadline.
    Lost(String),
}

/// One request's record.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRecord {
    /// Index in the seeded stream.
    pub index: u64,
    /// When it was sent, seconds after the load began.
    pub sent_s: f64,
    /// Streaming or not.
    pub stream: bool,
    /// The replica it went to.
    pub router: usize,
    /// How it ended.
    pub outcome: Outcome,
    /// `usage.prompt_tokens` (0 when not reported).
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens` (0 when not reported).
    pub cached_tokens: u64,
}

/// Request counts by outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counts {
    /// Requests sent.
    pub sent: u64,
    /// Succeeded.
    pub ok: u64,
    /// HTTP error status.
    pub http_error: u64,
    /// SSE error event.
    pub sse_error: u64,
    /// Transport error seen by the client.
    pub transport: u64,
    /// Lost without a clear error.
    pub lost: u64,
}

/// What one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct FaultReport {
    /// The fault.
    pub fault: Fault,
    /// Requests by outcome.
    pub counts: Counts,
    /// Up to 5 lost requests, described.
    pub lost_examples: Vec<String>,
    /// Up to 5 distinct error messages seen (transport errors, HTTP statuses).
    pub error_examples: Vec<String>,
    /// When the fault was injected and when it ended, seconds after the load began.
    pub fault_start_s: f64,
    /// See `fault_start_s`.
    pub fault_end_s: f64,
    /// Seconds from the fault's end until every replica's cache view first equalled every
    /// worker's own (under load); `None`: not within the after window.
    pub cache_converged_s: Option<f64>,
    /// The last disagreement seen (before convergence, or the one left), if any.
    pub cache_mismatch: Option<String>,
    /// Each comparison after the fault ended until convergence: (seconds after the fault
    /// ended, the disagreement or "equal"); at most 40.
    pub cache_trace: Vec<(f64, String)>,
    /// The views agreed after the load stopped (within the settle deadline).
    pub cache_agree_settled: bool,
    /// Seconds after the load stopped until in-flight, assignment and placement counts were
    /// all 0; `None`: not within the settle deadline.
    pub settled_s: Option<f64>,
    /// What was left when they did not settle.
    pub unsettled: Option<String>,
    /// Hit rate (cached / prompt tokens) of the requests sent in the after window.
    pub hit_rate_after: f64,
    /// Requests with usage in that window.
    pub after_requests: u64,
    /// Sequence gaps, replays and resyncs the sidecars counted (their `/metrics`, summed; a
    /// restarted sidecar's count starts again).
    pub sidecar_gaps: f64,
    /// See `sidecar_gaps`.
    pub sidecar_replays: f64,
    /// See `sidecar_gaps`.
    pub sidecar_resyncs: f64,
    /// The fault-free run's hit rate over the same window (set by [`run_suite`]).
    pub baseline_hit_rate: Option<f64>,
    /// What the live replicas reported of the workers just before the fault ended (stale,
    /// unroutable, ejected, without a sidecar stream; summed over replicas).
    pub during: String,
    /// Seconds the deployment took to start (not part of the measurement).
    pub deploy_s: f64,
}

impl FaultReport {
    /// The issue's bounds this run misses, one line each (empty: all met).
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let f = self.fault.name();
        if self.counts.lost > 0 {
            v.push(format!(
                "{f}: (a) {} requests lost without a clear error: {:?}",
                self.counts.lost, self.lost_examples
            ));
        }
        if self.settled_s.is_none() {
            v.push(format!(
                "{f}: (b) in-flight/assignment counts did not return to 0: {}",
                self.unsettled.as_deref().unwrap_or("?")
            ));
        }
        match self.cache_converged_s {
            Some(s) if s <= CONVERGE_BOUND.as_secs_f64() => {}
            Some(s) => v.push(format!(
                "{f}: (c) cache views equal only {s:.2} s after the fault ended (bound {:?}); last mismatch: {}",
                CONVERGE_BOUND,
                self.cache_mismatch.as_deref().unwrap_or("-")
            )),
            None => v.push(format!(
                "{f}: (c) cache views never equal under load after the fault; last mismatch: {}",
                self.cache_mismatch.as_deref().unwrap_or("-")
            )),
        }
        // One restart, one resync: the start-time change and the sequence going back are the
        // same event (the sidecar must not drop its state twice).
        if self.fault == Fault::VllmRestarted && self.sidecar_resyncs != 1.0 {
            v.push(format!(
                "{f}: the sidecars counted {} resyncs for one vLLM restart",
                self.sidecar_resyncs
            ));
        }
        if !self.cache_agree_settled {
            v.push(format!(
                "{f}: (c) cache views still differ after the load stopped: {}",
                self.cache_mismatch.as_deref().unwrap_or("-")
            ));
        }
        if let Some(base) = self.baseline_hit_rate {
            let d = (self.hit_rate_after - base).abs();
            if d > HIT_RATE_BOUND * base {
                v.push(format!(
                    "{f}: (d) hit rate after recovery {:.3} vs {:.3} fault-free (more than {:.0}% apart)",
                    self.hit_rate_after,
                    base,
                    HIT_RATE_BOUND * 100.0
                ));
            }
        }
        if self.after_requests == 0 {
            v.push(format!("{f}: no request with usage in the after window"));
        }
        v
    }
}

/// The seeded request `i`: (prefix index, prompt token ids, max_tokens, stream).
pub fn request(seed: u64, i: u64) -> (usize, Vec<u32>, u32, bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let p = rng.random_range(0..PREFIXES);
    let mut prompt = prefix(seed, p);
    prompt.extend((0..SUFFIX_TOKENS).map(|_| rng.random_range(1_000..30_000u32)));
    let max_tokens = rng.random_range(24..64u32);
    let stream = rng.random_bool(0.5);
    (p, prompt, max_tokens, stream)
}

/// Shared prefix `p` of the seeded workload.
fn prefix(seed: u64, p: usize) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(0xC0FF_EE00 + p as u64));
    (0..PREFIX_TOKENS)
        .map(|_| rng.random_range(1_000..30_000u32))
        .collect()
}

/// The prompts the cache views are compared on: each shared prefix plus one token (so the
/// prefix's blocks are all full blocks of the prompt, for the router and for vLLM alike).
pub fn probes(seed: u64) -> Vec<Vec<u32>> {
    (0..PREFIXES)
        .map(|p| {
            let mut v = prefix(seed, p);
            v.push(7);
            v
        })
        .collect()
}

/// Sends one request and classifies how it ended.
pub async fn send(
    client: &reqwest::Client,
    gateway: &str,
    prompt: &[u32],
    max_tokens: u32,
    stream: bool,
    deadline: Duration,
) -> (Outcome, u64, u64) {
    let body = json!({
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true,
        "stream": stream, "stream_options": {"include_usage": true},
    });
    let fut = async {
        let resp = match client
            .post(format!("{gateway}/v1/completions"))
            .json(&body)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => return (Outcome::Transport(error_chain(&e)), 0, 0),
        };
        let status = resp.status().as_u16();
        if status != 200 {
            // A status is a clear error whatever the body says.
            let _ = resp.bytes().await;
            return (Outcome::HttpError(status), 0, 0);
        }
        if !stream {
            return match resp.bytes().await {
                Err(e) => (Outcome::Transport(error_chain(&e)), 0, 0),
                Ok(b) => match serde_json::from_slice::<Value>(&b) {
                    Ok(v) if v.get("choices").is_some() => {
                        let (p, c) = usage(&v);
                        (Outcome::Ok, p, c)
                    }
                    Ok(v) if v.get("error").is_some() => (Outcome::SseError, 0, 0),
                    _ => (
                        Outcome::Lost(format!(
                            "200 with a body that is not a completion: {}",
                            String::from_utf8_lossy(&b[..b.len().min(200)])
                        )),
                        0,
                        0,
                    ),
                },
            };
        }
        let mut body = resp.bytes_stream();
        let mut buf = Vec::new();
        let (mut done, mut error, mut usage_seen) = (false, false, (0, 0));
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(c) => buf.extend_from_slice(&c),
                Err(e) => {
                    if error {
                        return (Outcome::SseError, 0, 0);
                    }
                    return (Outcome::Transport(error_chain(&e)), 0, 0);
                }
            }
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(data) = line.trim().strip_prefix("data:") else {
                    if line.trim().starts_with("event: error") {
                        error = true;
                    }
                    continue;
                };
                let data = data.trim();
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                if let Ok(v) = serde_json::from_str::<Value>(data) {
                    if v.get("error").is_some() {
                        error = true;
                    }
                    if v.get("usage").is_some_and(|u| !u.is_null()) {
                        usage_seen = usage(&v);
                    }
                }
            }
        }
        if error {
            (Outcome::SseError, 0, 0)
        } else if done {
            (Outcome::Ok, usage_seen.0, usage_seen.1)
        } else {
            (
                Outcome::Lost("the stream ended cleanly without [DONE] or an error event".into()),
                0,
                0,
            )
        }
    };
    match tokio::time::timeout(deadline, fut).await {
        Ok(r) => r,
        Err(_) => (
            Outcome::Lost(format!("no end within the {deadline:?} deadline")),
            0,
            0,
        ),
    }
}

fn usage(v: &Value) -> (u64, u64) {
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap_or(0),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    )
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Polls each replica's `/readyz?model=` every 100 ms until `stop`, as a Kubernetes Service
/// follows its endpoints' readiness: the load sends only to replicas that answered ready last.
pub fn watch_readiness(admins: Vec<String>, stop: Arc<AtomicBool>) -> Arc<Vec<AtomicBool>> {
    let ready: Arc<Vec<AtomicBool>> =
        Arc::new(admins.iter().map(|_| AtomicBool::new(true)).collect());
    let flags = ready.clone();
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap_or_default();
        while !stop.load(Ordering::Relaxed) {
            for (r, admin) in admins.iter().enumerate() {
                let ok = client
                    .get(format!("{admin}/readyz?model={MODEL}"))
                    .send()
                    .await
                    .is_ok_and(|resp| resp.status().is_success());
                flags[r].store(ok, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    ready
}

/// One request of a load plan: when to send it (after the load began) and what: (prompt
/// token ids, max_tokens, stream).
pub type Planned = (Duration, Vec<u32>, u32, bool);

/// Open-loop load: request `i` at `i / rate` after `t0` ([`request`]), until `stop`
/// ([`start_load_with`]).
fn start_load(
    cfg: &SuiteConfig,
    gateways: Vec<String>,
    ready: Arc<Vec<AtomicBool>>,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<RequestRecord>> {
    let (seed, rate) = (cfg.seed, cfg.rate);
    let plan = move |i: u64| {
        let (_, prompt, max_tokens, stream) = request(seed, i);
        (
            Duration::from_secs_f64(i as f64 / rate),
            prompt,
            max_tokens,
            stream,
        )
    };
    start_load_with(plan, cfg.request_deadline, gateways, ready, t0, stop)
}

/// Open-loop load: request `i` as `plan(i)` says (send offsets must not decrease), until
/// `stop`, to replica `i mod n` or, when that one is not ready, the next ready one; a request
/// not done within `deadline` is lost; every record comes back when the task ends.
pub fn start_load_with(
    plan: impl Fn(u64) -> Planned + Send + 'static,
    deadline: Duration,
    gateways: Vec<String>,
    ready: Arc<Vec<AtomicBool>>,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<RequestRecord>> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap_or_default();
        let mut tasks = Vec::new();
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let (offset, prompt, max_tokens, stream) = plan(i);
            let at = t0 + offset;
            tokio::time::sleep_until(at.into()).await;
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let n = gateways.len();
            let first = (i as usize) % n;
            let r = (0..n)
                .map(|k| (first + k) % n)
                .find(|r| ready.get(*r).is_some_and(|f| f.load(Ordering::Relaxed)))
                .unwrap_or(first);
            let gw = gateways[r].clone();
            let client = client.clone();
            let sent_s = offset.as_secs_f64();
            tasks.push(tokio::spawn(async move {
                let (outcome, prompt_tokens, cached_tokens) =
                    send(&client, &gw, &prompt, max_tokens, stream, deadline).await;
                RequestRecord {
                    index: i,
                    sent_s,
                    stream,
                    router: r,
                    outcome,
                    prompt_tokens,
                    cached_tokens,
                }
            }));
            i += 1;
        }
        let mut out = Vec::new();
        for t in tasks {
            if let Ok(r) = t.await {
                out.push(r);
            }
        }
        out
    })
}

/// GETs `url` and parses its JSON body (an error status is an error).
pub async fn get_json(client: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    Ok(client
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

async fn post_json(client: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<Value> {
    Ok(client
        .post(url)
        .json(body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// The live replicas' admin URLs (`down_router` left out).
pub fn live_admins(d: &Deployment, down_router: Option<usize>) -> Vec<String> {
    d.router_admins
        .iter()
        .enumerate()
        .filter(|(r, _)| Some(*r) != down_router)
        .map(|(_, a)| a.clone())
        .collect()
}

/// Compares every live replica's view of worker `i`'s cache with the worker's own: `None`
/// when they agree, else the difference. The worker is read before and after the replicas
/// (`/mock/cache` without the hash list); when it changed in between the comparison is
/// undecided and reported as a difference.
async fn worker_mismatch(
    client: &reqwest::Client,
    d: &Deployment,
    i: usize,
    admins: &[String],
    probes: &[Vec<u32>],
) -> anyhow::Result<Option<String>> {
    let ask = json!({ "prompts": probes, "hashes": false });
    let url = format!("{}/mock/cache", d.worker_urls[i]);
    let id = d.worker_ids[i].as_str();
    let own = post_json(client, &url, &ask).await?;
    let mut counts = Vec::new();
    for admin in admins {
        let workers = get_json(client, &format!("{admin}/debug/workers")).await?;
        let row = workers["workers"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["id"] == id))
            .cloned();
        counts.push((admin, row));
    }
    let again = post_json(client, &url, &ask).await?;
    if again != own {
        return Ok(Some(format!("worker-{i} changed while being compared")));
    }
    let want = own["cached_blocks"].as_u64().unwrap_or(0);
    for (admin, row) in &counts {
        let Some(row) = row else {
            return Ok(Some(format!("{admin}: {id} not in /debug/workers")));
        };
        let have = row["index_blocks"].as_u64().unwrap_or(0);
        if have != want {
            return Ok(Some(format!(
                "{admin}: {id} holds {have} blocks in the index, the worker {want} (router's row: {row})"
            )));
        }
    }
    // The shared prefixes' cached leading blocks, as each replica's explain counts them (they
    // change only when a prefix is first cached, evicted or lost).
    for admin in admins {
        for (k, p) in probes.iter().enumerate() {
            let body = json!({"model": MODEL, "prompt": p});
            let e = post_json(client, &format!("{admin}/debug/explain"), &body).await?;
            let cand = e["candidates"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["worker"] == id));
            let Some(cand) = cand else {
                // Ejected or not routable: explain has no figures for it; the block count
                // above still compared.
                continue;
            };
            let want = own["prefix_tokens"][k].as_u64().unwrap_or(0) / BLOCK as u64;
            let have = cand["cached_blocks"].as_u64().unwrap_or(0);
            if have != want {
                let now = post_json(client, &url, &ask).await?;
                if now["prefix_tokens"] != own["prefix_tokens"] {
                    return Ok(Some(format!("worker-{i} changed while being compared")));
                }
                return Ok(Some(format!(
                    "{admin}: {id} holds {have} leading blocks of prefix {k} by explain, the worker {want}"
                )));
            }
        }
    }
    Ok(None)
}

/// [`worker_mismatch`] for every worker: `None` when every view agrees.
pub async fn cache_mismatch(
    client: &reqwest::Client,
    d: &Deployment,
    admins: &[String],
    probes: &[Vec<u32>],
) -> anyhow::Result<Option<String>> {
    for i in 0..d.worker_urls.len() {
        if let Some(m) = worker_mismatch(client, d, i, admins, probes).await? {
            return Ok(Some(m));
        }
    }
    Ok(None)
}

/// `None` when every replica and worker is idle, else what is not.
pub async fn unsettled(
    client: &reqwest::Client,
    d: &Deployment,
    admins: &[String],
) -> anyhow::Result<Option<String>> {
    for admin in admins {
        let w = get_json(client, &format!("{admin}/debug/workers")).await?;
        if w["in_flight"].as_u64() != Some(0) {
            return Ok(Some(format!("{admin}: in_flight {}", w["in_flight"])));
        }
        for row in w["workers"].as_array().cloned().unwrap_or_default() {
            for key in ["in_flight", "waiting_first_token"] {
                if row[key].as_u64() != Some(0) {
                    return Ok(Some(format!("{admin}: {} {key} {}", row["id"], row[key])));
                }
            }
        }
        let text = client
            .get(format!("{admin}/metrics"))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        for line in text.lines() {
            let counted = line.starts_with("kvroute_router_in_flight{")
                || line.starts_with("kvroute_router_peer_placements ");
            if counted
                && line
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v != 0.0)
            {
                return Ok(Some(format!("{admin}: {line}")));
            }
        }
    }
    for (i, url) in d.worker_urls.iter().enumerate() {
        let l = get_json(client, &format!("{url}/get_load")).await?;
        if l["load"].as_u64() != Some(0) {
            return Ok(Some(format!("worker-{i}: load {}", l["load"])));
        }
    }
    Ok(None)
}

/// Sum of a sidecar counter over every sidecar's `/metrics` (unreachable ones count 0).
pub async fn sidecar_sum(client: &reqwest::Client, d: &Deployment, name: &str) -> f64 {
    let mut sum = 0.0;
    for url in &d.sidecar_admin_urls {
        let Ok(resp) = client.get(format!("{url}/metrics")).send().await else {
            continue;
        };
        let text = resp.text().await.unwrap_or_default();
        sum += text
            .lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    sum
}

/// The worker (index) with the most of the routers' in-flight assignments now (polls up to
/// 5 s for one with any, so that the fault hits a running stream); worker 0 if none.
async fn busiest_worker(client: &reqwest::Client, d: &Deployment) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut counts = vec![0u64; d.worker_ids.len()];
        for admin in &d.router_admins {
            let Ok(w) = get_json(client, &format!("{admin}/debug/workers")).await else {
                continue;
            };
            for row in w["workers"].as_array().cloned().unwrap_or_default() {
                if let Some(i) = d.worker_ids.iter().position(|id| row["id"] == id.as_str()) {
                    counts[i] += row["in_flight"].as_u64().unwrap_or(0);
                }
            }
        }
        let best = (0..counts.len()).max_by_key(|i| counts[*i]).unwrap_or(0);
        if counts[best] > 0 || Instant::now() >= deadline {
            return best;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to 5 s) until router replica `r` has an assignment in flight.
async fn router_busy(client: &reqwest::Client, admin: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(w) = get_json(client, &format!("{admin}/debug/workers")).await
            && w["in_flight"].as_u64().unwrap_or(0) > 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the live replicas say of the workers now, summed over replicas: workers stale, not
/// routable, ejected, without a sidecar stream.
async fn observe(client: &reqwest::Client, admins: &[String]) -> String {
    let (mut stale, mut unroutable, mut ejected, mut disconnected) = (0, 0, 0, 0);
    for admin in admins {
        let Ok(w) = get_json(client, &format!("{admin}/debug/workers")).await else {
            continue;
        };
        for row in w["workers"].as_array().cloned().unwrap_or_default() {
            stale += usize::from(row["stale"] == true);
            unroutable += usize::from(row["routable"] != true);
            ejected += usize::from(!row["ejection"].is_null());
            disconnected += usize::from(row["sidecar_connected"] != true);
        }
    }
    format!(
        "stale {stale}, unroutable {unroutable}, ejected {ejected}, no sidecar stream {disconnected}"
    )
}

/// Injects `fault` and ends it (a killed process is running again when this returns); returns
/// what the replicas reported just before the fault ended ([`observe`]). A worker or sidecar
/// fault hits worker `target`, or the busiest worker when `None`.
pub async fn inject(
    cfg: &SuiteConfig,
    d: &mut Deployment,
    client: &reqwest::Client,
    fault: Fault,
    target: Option<usize>,
) -> anyhow::Result<String> {
    let last_router = d.router_admins.len() - 1;
    let admins = if fault == Fault::RouterKilled {
        live_admins(d, Some(last_router))
    } else {
        live_admins(d, None)
    };
    let seen;
    match fault {
        Fault::None => {
            tokio::time::sleep(cfg.hold).await;
            seen = observe(client, &admins).await;
        }
        Fault::WorkerKilled => {
            let w = match target {
                Some(w) => w,
                None => busiest_worker(client, d).await,
            };
            d.kill_worker(w).await;
            tokio::time::sleep(cfg.hold).await;
            seen = observe(client, &admins).await;
            d.start_worker(w).await?;
        }
        Fault::VllmRestarted => {
            let w = match target {
                Some(w) => w,
                None => busiest_worker(client, d).await,
            };
            d.signal_worker(w, "HUP")?;
            let url = format!("{}/server_info", d.worker_urls[w]);
            procs::wait_for("the engine restarted", Duration::from_secs(30), || {
                let (client, url) = (client.clone(), url.clone());
                async move {
                    let v = get_json(&client, &url).await?;
                    Ok((v["engine_restarts"].as_u64().unwrap_or(0) > 0).then_some(()))
                }
            })
            .await?;
            tokio::time::sleep(cfg.hold).await;
            seen = observe(client, &admins).await;
        }
        Fault::ZmqGap => {
            for url in &d.worker_urls {
                let resp = client
                    .post(format!("{url}/mock/drop-events"))
                    .json(&json!({"count": 3}))
                    .send()
                    .await?;
                anyhow::ensure!(resp.status().is_success(), "drop-events: {}", resp.status());
            }
            tokio::time::sleep(cfg.hold).await;
            seen = observe(client, &admins).await;
        }
        Fault::SidecarRestarted => {
            let w = match target {
                Some(w) => w,
                None => busiest_worker(client, d).await,
            };
            d.kill_sidecar(w).await;
            tokio::time::sleep(cfg.hold).await;
            seen = observe(client, &admins).await;
            d.start_sidecar(w).await?;
        }
        Fault::RouterKilled => {
            let r = last_router;
            router_busy(client, &d.router_admins[r]).await;
            d.kill_router(r).await;
            tokio::time::sleep(cfg.hold).await;
            seen = observe(client, &admins).await;
            d.start_router(r).await?;
            let admin = d.router_admins[r].clone();
            d.wait_routable(&admin, d.worker_ids.len()).await?;
        }
        Fault::Blackhole => {
            set_proxies(d.proxies(), ProxyMode::Stall);
            tokio::time::sleep(cfg.blackhole).await;
            seen = observe(client, &admins).await;
            set_proxies(d.proxies(), ProxyMode::Pass);
        }
    }
    Ok(seen)
}

fn set_proxies(proxies: &[FaultProxy], mode: ProxyMode) {
    for p in proxies {
        p.set(mode);
    }
}

/// How long the settle checks may take after the load stops (a lost peer's placements decay
/// over the routers' 10 s `--peer-decay-s`).
const SETTLE_DEADLINE: Duration = Duration::from_secs(40);

/// Runs one fault on a fresh deployment and measures it (the hit-rate comparison is
/// [`run_suite`]'s).
pub async fn run_fault(cfg: &SuiteConfig, fault: Fault) -> anyhow::Result<FaultReport> {
    Ok(run(cfg, fault).await?.0)
}

/// [`run_fault`], also returning the request records and the load's length in seconds.
async fn run(
    cfg: &SuiteConfig,
    fault: Fault,
) -> anyhow::Result<(FaultReport, Vec<RequestRecord>, f64)> {
    let log_dir = cfg.log_dir.join(fault.name());
    let dc = DeployConfig {
        name: "faults",
        model: MODEL,
        workers: cfg.workers,
        speedup: cfg.speedup,
        profile: "l40s-qwen3-32b-fp8",
        tokenizer: &cfg.tokenizer,
        log_dir: &log_dir,
    };
    let topology = Topology {
        routers: cfg.routers,
        peers: true,
        fault_proxies: true,
    };
    let router_args: Vec<String> = vec!["--seed".into(), cfg.seed.to_string()];
    let started = Instant::now();
    let mut d = Deployment::start_topology(&dc, "kvroute", "", &router_args, topology)
        .await
        .with_context(|| format!("start the deployment for {}", fault.name()))?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let deploy_s = started.elapsed().as_secs_f64();
    let probes = probes(cfg.seed);
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let ready = watch_readiness(d.router_admins.clone(), stop.clone());
    let load = start_load(cfg, d.gateways.clone(), ready, t0, stop.clone());

    tokio::time::sleep_until((t0 + cfg.warmup).into()).await;
    let fault_start_s = t0.elapsed().as_secs_f64();
    let during = inject(cfg, &mut d, &client, fault, None).await?;
    let fault_end = Instant::now();
    let fault_end_s = t0.elapsed().as_secs_f64();

    // (c) under load: for each worker, the first moment every replica's view of it agrees
    // with its own; converged when every worker has been seen so.
    let admins = live_admins(&d, None);
    let mut first_equal: Vec<Option<f64>> = vec![None; d.worker_urls.len()];
    let mut mismatch = None;
    let mut trace = Vec::new();
    while fault_end.elapsed() < cfg.after && first_equal.iter().any(Option::is_none) {
        for (i, first) in first_equal.iter_mut().enumerate() {
            if first.is_some() {
                continue;
            }
            let seen = worker_mismatch(&client, &d, i, &admins, &probes).await;
            let at = fault_end.elapsed().as_secs_f64();
            let m = match seen {
                Ok(None) => {
                    *first = Some(at);
                    trace.push((at, format!("worker-{i} equal")));
                    continue;
                }
                Ok(Some(m)) => m,
                Err(e) => format!("{e:#}"),
            };
            if trace.len() < 40 {
                trace.push((at, m.chars().take(300).collect()));
            }
            mismatch = Some(m);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let converged = first_equal
        .iter()
        .try_fold(0.0f64, |acc, t| t.map(|t| acc.max(t)));
    tokio::time::sleep_until((fault_end + cfg.after).into()).await;
    stop.store(true, Ordering::Relaxed);
    let records = load.await.context("the load task")?;
    let load_end = Instant::now();
    let load_len = load_end.duration_since(t0).as_secs_f64();

    // (b) once the load stopped.
    let (settled_s, left) = wait_settled(&client, &d, &admins).await;
    // (c) with the load stopped.
    let (agree, left_mismatch) = wait_views_agree(&client, &d, &admins, &probes).await;
    if left_mismatch.is_some() {
        mismatch = left_mismatch;
    }
    let sidecar_gaps = sidecar_sum(&client, &d, "kvroute_sidecar_seq_gaps_total").await;
    let sidecar_replays = sidecar_sum(&client, &d, "kvroute_sidecar_replays_total").await;
    let sidecar_resyncs = sidecar_sum(&client, &d, "kvroute_sidecar_resyncs_total").await;
    // Killed at once (dropping kills every process group): nothing is measured any more.
    drop(d);

    let (counts, lost_examples, error_examples) = tally(&records);
    let (hit_rate_after, after_requests) =
        hit_rate(&records, fault_end_s, fault_end_s + cfg.after.as_secs_f64());
    let report = FaultReport {
        fault,
        counts,
        lost_examples,
        error_examples,
        fault_start_s,
        fault_end_s,
        cache_converged_s: converged,
        cache_mismatch: mismatch,
        cache_trace: trace,
        cache_agree_settled: agree,
        settled_s,
        unsettled: if settled_s.is_none() { left } else { None },
        hit_rate_after,
        after_requests,
        sidecar_gaps,
        sidecar_replays,
        sidecar_resyncs,
        baseline_hit_rate: None,
        during,
        deploy_s,
    };
    Ok((report, records, load_len))
}

/// Polls, from when the load stopped, until every replica's and worker's in-flight, assignment
/// and placement counts are 0 ([`unsettled`]) or [`SETTLE_DEADLINE`] passes: (seconds it
/// took, or `None`; what was left last).
pub async fn wait_settled(
    client: &reqwest::Client,
    d: &Deployment,
    admins: &[String],
) -> (Option<f64>, Option<String>) {
    let load_end = Instant::now();
    let mut left = None;
    while load_end.elapsed() < SETTLE_DEADLINE {
        match unsettled(client, d, admins).await {
            Ok(None) => return (Some(load_end.elapsed().as_secs_f64()), left),
            Ok(Some(m)) => left = Some(m),
            Err(e) => left = Some(format!("{e:#}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (None, left)
}

/// Polls (up to 20 s, load stopped) until every replica's view of every worker's cache equals
/// the worker's own ([`cache_mismatch`]): (agreed, the last disagreement seen).
pub async fn wait_views_agree(
    client: &reqwest::Client,
    d: &Deployment,
    admins: &[String],
    probes: &[Vec<u32>],
) -> (bool, Option<String>) {
    let idle = Instant::now();
    let mut mismatch = None;
    while idle.elapsed() < Duration::from_secs(20) {
        match cache_mismatch(client, d, admins, probes).await {
            Ok(None) => return (true, mismatch),
            Ok(Some(m)) => mismatch = Some(m),
            Err(e) => mismatch = Some(format!("{e:#}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (false, mismatch)
}

/// Counts the records by outcome: (counts, up to 5 lost requests described, up to 5 distinct
/// error messages).
pub fn tally(records: &[RequestRecord]) -> (Counts, Vec<String>, Vec<String>) {
    let mut counts = Counts::default();
    let mut lost_examples = Vec::new();
    let mut error_examples: Vec<String> = Vec::new();
    for r in records {
        counts.sent += 1;
        let err = match &r.outcome {
            Outcome::Ok => {
                counts.ok += 1;
                None
            }
            Outcome::HttpError(s) => {
                counts.http_error += 1;
                Some(format!("HTTP {s}"))
            }
            Outcome::SseError => {
                counts.sse_error += 1;
                Some("SSE error event".to_string())
            }
            Outcome::Transport(e) => {
                counts.transport += 1;
                Some(format!("transport: {e}"))
            }
            Outcome::Lost(why) => {
                counts.lost += 1;
                if lost_examples.len() < 5 {
                    lost_examples.push(format!(
                        "#{} ({}, router {}): {why}",
                        r.index,
                        if r.stream { "stream" } else { "plain" },
                        r.router
                    ));
                }
                None
            }
        };
        if let Some(e) = err
            && error_examples.len() < 5
            && !error_examples.contains(&e)
        {
            error_examples.push(e);
        }
    }
    (counts, lost_examples, error_examples)
}

/// Cached over prompt tokens of the requests sent in `[from, to)` seconds that reported
/// usage, and how many there were.
fn hit_rate(records: &[RequestRecord], from: f64, to: f64) -> (f64, u64) {
    let (mut cached, mut prompt, mut n) = (0u64, 0u64, 0u64);
    for r in records {
        if r.sent_s >= from && r.sent_s < to && r.prompt_tokens > 0 {
            cached += r.cached_tokens;
            prompt += r.prompt_tokens;
            n += 1;
        }
    }
    let rate = if prompt == 0 {
        0.0
    } else {
        cached as f64 / prompt as f64
    };
    (rate, n)
}

/// The suite: a fault-free run as long as the longest fault's, then each fault in `faults`;
/// each report carries the fault-free hit rate of its after window.
pub async fn run_suite(cfg: &SuiteConfig, faults: &[Fault]) -> anyhow::Result<Vec<FaultReport>> {
    // The fault-free run: long enough that its window covers any fault's (a restart's wait
    // included), so the same requests are compared.
    let longest = faults
        .iter()
        .map(|f| match f {
            Fault::Blackhole => cfg.blackhole,
            _ => cfg.hold,
        })
        .max()
        .unwrap_or(cfg.hold)
        + Duration::from_secs(4);
    let base_cfg = SuiteConfig {
        hold: longest,
        ..cfg.clone()
    };
    let (base, base_records, base_len) = run(&base_cfg, Fault::None).await?;
    let mut out = vec![base];
    for f in faults {
        let (mut r, _, _) = run(cfg, *f).await?;
        // The same requests (same offsets) in the fault-free run, clipped to its length.
        let after = cfg.after.as_secs_f64();
        let from = r.fault_end_s.min(base_len - after).max(0.0);
        let (h, _) = hit_rate(&base_records, from, from + after);
        r.baseline_hit_rate = Some(h);
        out.push(r);
    }
    Ok(out)
}
