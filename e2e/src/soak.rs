//! The soak: a local deployment on loopback (3 mock vLLM workers with their sidecars, 2 router
//! replicas exchanging placements, a [`FaultProxy`](crate::fault_proxy::FaultProxy) in front of
//! each), seeded mixed load for a configurable duration, churn and faults injected on a
//! schedule, and the router and sidecar processes sampled throughout: resident memory, open
//! file descriptors, threads, and tokio's alive tasks (`kvroute_*_runtime_alive_tasks`).
//! docs/soak.md says what is asserted and what was measured.
//!
//! ```text
//! load (seeded: shared prefixes and independent prompts, half streaming, rate cycling
//!       through a few levels) --round-robin--> router-0, router-1 --> worker-i
//! faults, every `fault_every`, in turn: worker killed, vLLM restarted, ZMQ gap,
//!       sidecar-2 restarted, blackhole, router-1 restarted
//! timeline: [warm-up][quiet: idle baseline][baseline cycle] ... [last cycle][drain checks]
//! samples: /proc/PID/{status,fd} and /metrics of every router and sidecar, every few seconds
//! ```
//!
//! A process a fault restarts is a new PID; the leak checks are made on the processes that
//! lived through the whole run (router-0 and the sidecars other than the last one: the
//! schedule restarts only router-1 and the last sidecar); the restarted ones are reported.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::faults::{self, Counts, Fault, Planned, SuiteConfig};
use crate::local::{DeployConfig, Deployment, Topology};

/// The bound on resident memory: the last cycle's highest sample within this fraction above
/// the baseline (the median of the first cycle after the warm-up).
pub const RSS_BOUND: f64 = 0.05;
/// Open file descriptors a survivor may hold, once the load drained, above its idle baseline.
pub const FD_SLACK: u64 = 8;
/// Alive tokio tasks a survivor may hold, once the load drained, above its idle baseline.
pub const TASK_SLACK: u64 = 8;
/// The faults the soak injects, in turn.
pub const SOAK_FAULTS: [Fault; 6] = [
    Fault::WorkerKilled,
    Fault::VllmRestarted,
    Fault::ZmqGap,
    Fault::SidecarRestarted,
    Fault::Blackhole,
    Fault::RouterKilled,
];

/// The soak's settings.
#[derive(Clone, Debug, Serialize)]
pub struct SoakConfig {
    /// Seed of the request stream.
    pub seed: u64,
    /// Load time, not counting the quiet gap after the warm-up.
    pub duration: Duration,
    /// Mock workers (each with a sidecar).
    pub workers: usize,
    /// Router replicas (with `--peers`).
    pub routers: usize,
    /// Requests per second of each phase of a load cycle, in order.
    pub rates: Vec<f64>,
    /// Length of one phase.
    pub phase: Duration,
    /// No requests this long after the warm-up: the idle baseline is sampled then.
    pub quiet: Duration,
    /// A fault every this long ([`SOAK_FAULTS`] in turn).
    pub fault_every: Duration,
    /// The first fault this long after the load began.
    pub first_fault: Duration,
    /// How often every process is sampled.
    pub sample_every: Duration,
    /// How long a killed process stays down, and how long a ZMQ gap is given.
    pub hold: Duration,
    /// How long the sidecars' traffic is blackholed.
    pub blackhole: Duration,
    /// A request not finished within this is lost.
    pub request_deadline: Duration,
    /// The workers' clock speed-up.
    pub speedup: f64,
    /// Tokenizer directory (workers and routers).
    #[serde(skip)]
    pub tokenizer: PathBuf,
    /// Where the processes' logs go.
    #[serde(skip)]
    pub log_dir: PathBuf,
}

impl SoakConfig {
    /// The soak's settings for `duration` of load: 3 workers, 2 replicas, a 60 s cycle of 2, 5
    /// and 8 requests/s, a fault every 25 s, a sample every 5 s.
    pub fn new(seed: u64, duration: Duration, tokenizer: PathBuf, log_dir: PathBuf) -> Self {
        Self {
            seed,
            duration,
            workers: 3,
            routers: 2,
            rates: vec![2.0, 5.0, 8.0],
            phase: Duration::from_secs(20),
            quiet: Duration::from_secs(15),
            fault_every: Duration::from_secs(25),
            first_fault: Duration::from_secs(10),
            sample_every: Duration::from_secs(5),
            hold: Duration::from_secs(2),
            blackhole: Duration::from_secs(5),
            request_deadline: Duration::from_secs(30),
            speedup: 20.0,
            tokenizer,
            log_dir,
        }
    }

    /// One load cycle (every phase once).
    pub fn cycle(&self) -> Duration {
        self.phase * u32::try_from(self.rates.len().max(1)).unwrap_or(1)
    }

    /// The warm-up: 20% of the duration, at least 30 s, rounded up to whole cycles.
    pub fn warmup(&self) -> Duration {
        let want = (self.duration.as_secs_f64() * 0.2).max(30.0);
        let cycle = self.cycle().as_secs_f64();
        Duration::from_secs_f64((want / cycle).ceil() * cycle)
    }
}

/// The soak's request `i`: a quarter are independent prompts (48 to 320 tokens of their own),
/// the rest the fault suite's shared-prefix requests ([`faults::request`]); half stream.
pub fn soak_request(seed: u64, i: u64) -> (Vec<u32>, u32, bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x50A4 ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03));
    if rng.random_bool(0.25) {
        let len = rng.random_range(48..320usize);
        let prompt = (0..len)
            .map(|_| rng.random_range(1_000..30_000u32))
            .collect();
        (prompt, rng.random_range(16..64u32), rng.random_bool(0.5))
    } else {
        let (_, prompt, max_tokens, stream) = faults::request(seed, i);
        (prompt, max_tokens, stream)
    }
}

/// When request `i` is sent: the phases' rates in turn, cycle after cycle, with the quiet gap
/// after the warm-up.
fn send_offset(cfg: &SoakConfig, i: u64) -> Duration {
    let phase = cfg.phase.as_secs_f64();
    let per_phase: Vec<u64> = cfg
        .rates
        .iter()
        .map(|r| (r * phase).round().max(1.0) as u64)
        .collect();
    let per_cycle: u64 = per_phase.iter().sum();
    let (c, mut j) = (i / per_cycle, i % per_cycle);
    let mut at = c as f64 * cfg.cycle().as_secs_f64();
    for (k, n) in per_phase.iter().enumerate() {
        if j < *n {
            at += k as f64 * phase + j as f64 * phase / *n as f64;
            break;
        }
        j -= n;
    }
    if at >= cfg.warmup().as_secs_f64() {
        at += cfg.quiet.as_secs_f64();
    }
    Duration::from_secs_f64(at)
}

/// One sample of one process.
#[derive(Clone, Debug, Serialize)]
pub struct ProcSample {
    /// Seconds after the load began.
    pub t_s: f64,
    /// The process id (a restart changes it).
    pub pid: u32,
    /// `VmRSS` of `/proc/PID/status`, KiB.
    pub rss_kib: u64,
    /// Entries of `/proc/PID/fd`.
    pub fds: u64,
    /// `Threads` of `/proc/PID/status`.
    pub threads: u64,
    /// The process's `*_runtime_alive_tasks` gauge (`None`: `/metrics` did not answer).
    pub tasks: Option<u64>,
}

/// Reads `/proc/PID`: (VmRSS KiB, threads, open fds); `None` if the process is gone.
fn read_proc(pid: u32) -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((field("VmRSS:")?, field("Threads:")?, fds))
}

/// The value of the unlabelled series `name` in a Prometheus text page.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The processes sampled: (name, pid, admin URL, task gauge).
fn processes(d: &Deployment) -> Vec<(String, Option<u32>, String, &'static str)> {
    let mut out = Vec::new();
    for (r, admin) in d.router_admins.iter().enumerate() {
        out.push((
            format!("router-{r}"),
            d.router_pid(r),
            admin.clone(),
            "kvroute_router_runtime_alive_tasks",
        ));
    }
    for (i, admin) in d.sidecar_admin_urls.iter().enumerate() {
        out.push((
            format!("sidecar-{i}"),
            d.sidecar_pid(i),
            admin.clone(),
            "kvroute_sidecar_runtime_alive_tasks",
        ));
    }
    out
}

/// Samples every router and sidecar now.
async fn sample_all(
    client: &reqwest::Client,
    d: &Deployment,
    t_s: f64,
) -> Vec<(String, ProcSample)> {
    let mut out = Vec::new();
    for (name, pid, admin, gauge) in processes(d) {
        let Some(pid) = pid else { continue };
        let tasks = match client.get(format!("{admin}/metrics")).send().await {
            Ok(resp) => resp
                .text()
                .await
                .ok()
                .and_then(|t| metric_value(&t, gauge))
                .map(|v| v as u64),
            Err(_) => None,
        };
        let Some((rss_kib, threads, fds)) = read_proc(pid) else {
            continue;
        };
        out.push((
            name,
            ProcSample {
                t_s,
                pid,
                rss_kib,
                fds,
                threads,
                tasks,
            },
        ));
    }
    out
}

/// A fault the soak injected.
#[derive(Clone, Debug, Serialize)]
pub struct FaultEvent {
    /// The fault.
    pub fault: Fault,
    /// When it began, seconds after the load began.
    pub at_s: f64,
    /// How long injecting and ending it took.
    pub took_s: f64,
    /// An error injecting or ending it, if any.
    pub error: Option<String>,
}

/// One process's figures over the run (its last PID's samples).
#[derive(Clone, Debug, Serialize)]
pub struct ProcessSummary {
    /// `router-<r>` or `sidecar-<i>`.
    pub name: String,
    /// PIDs it had (more than one: a fault restarted it).
    pub pids: Vec<u32>,
    /// Lived through the whole run (one PID): the leak checks apply.
    pub checked: bool,
    /// Samples of its last PID.
    pub samples: usize,
    /// RSS (KiB) at the first sample of its last PID.
    pub rss_start_kib: u64,
    /// Median RSS (KiB) over the first cycle after the warm-up (and the quiet gap).
    pub rss_baseline_kib: u64,
    /// Highest RSS (KiB) after the warm-up.
    pub rss_max_kib: u64,
    /// Highest RSS (KiB) in the last cycle of load.
    pub rss_last_max_kib: u64,
    /// RSS (KiB) at the last sample under load.
    pub rss_end_kib: u64,
    /// RSS (KiB) once the load drained.
    pub rss_drained_kib: u64,
    /// Open fds at the idle baseline (the quiet gap after the warm-up).
    pub fds_idle: u64,
    /// Highest open fds under load after the warm-up.
    pub fds_max: u64,
    /// Open fds once the load drained.
    pub fds_drained: u64,
    /// Alive tasks at the idle baseline.
    pub tasks_idle: Option<u64>,
    /// Highest alive tasks under load after the warm-up.
    pub tasks_max: Option<u64>,
    /// Alive tasks once the load drained.
    pub tasks_drained: Option<u64>,
    /// Threads at the idle baseline and once drained.
    pub threads_idle: u64,
    /// See `threads_idle`.
    pub threads_drained: u64,
}

impl ProcessSummary {
    /// RSS growth of the last cycle over the baseline, as a fraction.
    pub fn rss_last_growth(&self) -> f64 {
        self.rss_last_max_kib as f64 / self.rss_baseline_kib.max(1) as f64 - 1.0
    }

    /// RSS growth of the highest sample after the warm-up over the baseline, as a fraction.
    pub fn rss_max_growth(&self) -> f64 {
        self.rss_max_kib as f64 / self.rss_baseline_kib.max(1) as f64 - 1.0
    }
}

/// What the soak measured.
#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    /// The settings.
    pub config: SoakConfig,
    /// Warm-up length, seconds.
    pub warmup_s: f64,
    /// The baseline cycle `[from, to)` and the last cycle, seconds after the load began.
    pub baseline_window_s: (f64, f64),
    /// See `baseline_window_s`.
    pub last_window_s: (f64, f64),
    /// Requests by outcome.
    pub counts: Counts,
    /// Up to 5 lost requests, described.
    pub lost_examples: Vec<String>,
    /// Up to 5 distinct errors seen.
    pub error_examples: Vec<String>,
    /// The faults injected.
    pub faults: Vec<FaultEvent>,
    /// Seconds the load took to drain at the quiet gap (`None`: it did not within the suite's
    /// settle deadline).
    pub quiet_settled_s: Option<f64>,
    /// Seconds after the load stopped until in-flight and assignment counts were all 0.
    pub settled_s: Option<f64>,
    /// What was left when they did not settle.
    pub unsettled: Option<String>,
    /// The replicas' cache views equalled the workers' own after the load stopped.
    pub views_agree: bool,
    /// The last disagreement seen, if any.
    pub view_mismatch: Option<String>,
    /// Per process.
    pub processes: Vec<ProcessSummary>,
    /// Every sample, by process.
    pub samples: BTreeMap<String, Vec<ProcSample>>,
    /// Seconds the whole run took (deployment included).
    pub wall_s: f64,
}

impl SoakReport {
    /// The bounds this run misses, one line each (empty: all met).
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.counts.lost > 0 {
            v.push(format!(
                "{} requests lost without a clear error: {:?}",
                self.counts.lost, self.lost_examples
            ));
        }
        if self.settled_s.is_none() {
            v.push(format!(
                "in-flight/assignment counts did not return to 0: {}",
                self.unsettled.as_deref().unwrap_or("?")
            ));
        }
        if !self.views_agree {
            v.push(format!(
                "cache views differ after the load stopped: {}",
                self.view_mismatch.as_deref().unwrap_or("-")
            ));
        }
        if self.quiet_settled_s.is_none() {
            v.push("the load did not drain in the quiet gap: no idle baseline".into());
        }
        for f in &self.faults {
            if let Some(e) = &f.error {
                v.push(format!("{} at {:.0}s: {e}", f.fault.name(), f.at_s));
            }
        }
        let checked: Vec<&ProcessSummary> = self.processes.iter().filter(|p| p.checked).collect();
        if !checked.iter().any(|p| p.name.starts_with("router"))
            || !checked.iter().any(|p| p.name.starts_with("sidecar"))
        {
            v.push("no router or no sidecar lived through the whole run".into());
        }
        for p in checked {
            let n = &p.name;
            if p.rss_baseline_kib == 0 || p.rss_last_max_kib == 0 {
                v.push(format!("{n}: no samples in the baseline or the last cycle"));
            } else if p.rss_last_growth() > RSS_BOUND {
                v.push(format!(
                    "{n}: RSS grew {:.1}% (last cycle's max {} KiB vs baseline {} KiB; bound {:.0}%)",
                    p.rss_last_growth() * 100.0,
                    p.rss_last_max_kib,
                    p.rss_baseline_kib,
                    RSS_BOUND * 100.0
                ));
            }
            if p.fds_drained > p.fds_idle + FD_SLACK {
                v.push(format!(
                    "{n}: {} fds once drained vs {} at the idle baseline (slack {FD_SLACK})",
                    p.fds_drained, p.fds_idle
                ));
            }
            match (p.tasks_idle, p.tasks_drained) {
                (Some(idle), Some(drained)) if drained > idle + TASK_SLACK => v.push(format!(
                    "{n}: {drained} alive tasks once drained vs {idle} at the idle baseline (slack {TASK_SLACK})"
                )),
                (Some(_), Some(_)) => {}
                _ => v.push(format!("{n}: no alive-task figure (idle or drained)")),
            }
        }
        v
    }

    /// The report as markdown: the run, the requests, the faults, a row per process.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let c = &self.counts;
        let _ = writeln!(
            s,
            "# kvroute soak: {:.0} min of load, seed {}\n",
            self.config.duration.as_secs_f64() / 60.0,
            self.config.seed
        );
        let _ = writeln!(
            s,
            "Warm-up {:.0} s; baseline cycle {:.0}-{:.0} s; last cycle {:.0}-{:.0} s; run took {:.0} s.\n",
            self.warmup_s,
            self.baseline_window_s.0,
            self.baseline_window_s.1,
            self.last_window_s.0,
            self.last_window_s.1,
            self.wall_s
        );
        let _ = writeln!(
            s,
            "Requests: {} sent, {} ok, {} HTTP errors, {} SSE errors, {} transport errors, {} lost.",
            c.sent, c.ok, c.http_error, c.sse_error, c.transport, c.lost
        );
        let mut by_fault: BTreeMap<&str, usize> = BTreeMap::new();
        for f in &self.faults {
            *by_fault.entry(f.fault.name()).or_default() += 1;
        }
        let _ = writeln!(
            s,
            "Faults: {} injected ({by_fault:?}). Drained in {} s; cache views agree after: {}.\n",
            self.faults.len(),
            self.settled_s
                .map(|x| format!("{x:.1}"))
                .unwrap_or_else(|| "never".into()),
            self.views_agree
        );
        let _ = writeln!(
            s,
            "| process | checked | PIDs | RSS start | RSS baseline | RSS max | RSS last-cycle max | RSS end | growth (last / max) | fds idle / max / drained | tasks idle / max / drained | threads idle / drained |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        let mib = |k: u64| format!("{:.1} MiB", k as f64 / 1024.0);
        let opt = |x: Option<u64>| x.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        let pct = |base: u64, x: f64| {
            if base == 0 {
                "-".to_string()
            } else {
                format!("{:+.1}%", x * 100.0)
            }
        };
        for p in &self.processes {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} / {} | {} / {} / {} | {} / {} |",
                p.name,
                if p.checked { "yes" } else { "no (restarted)" },
                p.pids.len(),
                mib(p.rss_start_kib),
                mib(p.rss_baseline_kib),
                mib(p.rss_max_kib),
                mib(p.rss_last_max_kib),
                mib(p.rss_end_kib),
                pct(p.rss_baseline_kib, p.rss_last_growth()),
                pct(p.rss_baseline_kib, p.rss_max_growth()),
                p.fds_idle,
                p.fds_max,
                p.fds_drained,
                opt(p.tasks_idle),
                opt(p.tasks_max),
                opt(p.tasks_drained),
                p.threads_idle,
                p.threads_drained
            );
        }
        let v = self.violations();
        if v.is_empty() {
            let _ = writeln!(s, "\nEvery bound met.");
        } else {
            let _ = writeln!(s, "\nBounds missed:\n");
            for line in v {
                let _ = writeln!(s, "- {line}");
            }
        }
        s
    }
}

/// Median of `v` (0 when empty).
fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// One process's summary from its samples, the idle baseline and the drained sample.
fn summarize(
    name: &str,
    samples: &[ProcSample],
    idle: Option<&ProcSample>,
    drained: Option<&ProcSample>,
    baseline: (f64, f64),
    last: (f64, f64),
) -> ProcessSummary {
    let mut pids: Vec<u32> = Vec::new();
    for s in samples.iter().chain(idle).chain(drained) {
        if !pids.contains(&s.pid) {
            pids.push(s.pid);
        }
    }
    let pid = pids.last().copied().unwrap_or(0);
    let mine: Vec<&ProcSample> = samples.iter().filter(|s| s.pid == pid).collect();
    let after: Vec<&ProcSample> = mine
        .iter()
        .copied()
        .filter(|s| s.t_s >= baseline.0)
        .collect();
    let in_window = |w: (f64, f64)| -> Vec<u64> {
        mine.iter()
            .filter(|s| s.t_s >= w.0 && s.t_s < w.1)
            .map(|s| s.rss_kib)
            .collect()
    };
    let idle = idle.filter(|s| s.pid == pid);
    let drained = drained.filter(|s| s.pid == pid);
    ProcessSummary {
        name: name.to_string(),
        checked: pids.len() == 1 && idle.is_some() && drained.is_some(),
        pids,
        samples: mine.len(),
        rss_start_kib: mine.first().map_or(0, |s| s.rss_kib),
        rss_baseline_kib: median(in_window(baseline)),
        rss_max_kib: after.iter().map(|s| s.rss_kib).max().unwrap_or(0),
        rss_last_max_kib: in_window(last).into_iter().max().unwrap_or(0),
        rss_end_kib: mine.last().map_or(0, |s| s.rss_kib),
        rss_drained_kib: drained.map_or(0, |s| s.rss_kib),
        fds_idle: idle.map_or(0, |s| s.fds),
        fds_max: after.iter().map(|s| s.fds).max().unwrap_or(0),
        fds_drained: drained.map_or(0, |s| s.fds),
        tasks_idle: idle.and_then(|s| s.tasks),
        tasks_max: after.iter().filter_map(|s| s.tasks).max(),
        tasks_drained: drained.and_then(|s| s.tasks),
        threads_idle: idle.map_or(0, |s| s.threads),
        threads_drained: drained.map_or(0, |s| s.threads),
    }
}

/// Samples every process a few times, `pause` apart, and keeps each one's lowest fd count
/// (with that sample's other figures): idle connections a client pool is closing do not count.
async fn settled_sample(
    client: &reqwest::Client,
    d: &Deployment,
    t0: Instant,
    pause: Duration,
) -> BTreeMap<String, ProcSample> {
    let mut best: BTreeMap<String, ProcSample> = BTreeMap::new();
    for _ in 0..3 {
        tokio::time::sleep(pause).await;
        for (name, s) in sample_all(client, d, t0.elapsed().as_secs_f64()).await {
            let keep = best
                .get(&name)
                .is_none_or(|b| b.pid != s.pid || s.fds < b.fds);
            if keep {
                best.insert(name, s);
            }
        }
    }
    best
}

/// Runs the soak and measures it (the bounds are [`SoakReport::violations`]).
pub async fn run_soak(cfg: &SoakConfig) -> anyhow::Result<SoakReport> {
    let wall = Instant::now();
    let dc = DeployConfig {
        name: "soak",
        model: faults::MODEL,
        workers: cfg.workers,
        speedup: cfg.speedup,
        profile: "l40s-qwen3-32b-fp8",
        tokenizer: &cfg.tokenizer,
        log_dir: &cfg.log_dir,
    };
    let topology = Topology {
        routers: cfg.routers,
        peers: true,
        fault_proxies: true,
    };
    let router_args: Vec<String> = vec!["--seed".into(), cfg.seed.to_string()];
    let mut d = Deployment::start_topology(&dc, "kvroute", "", &router_args, topology)
        .await
        .context("start the soak's deployment")?;
    // No idle pooled connections: the soak's own polling must not hold fds in the processes
    // it counts.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(0)
        .build()?;
    let suite = SuiteConfig {
        hold: cfg.hold,
        blackhole: cfg.blackhole,
        request_deadline: cfg.request_deadline,
        ..SuiteConfig::ci(cfg.seed, cfg.tokenizer.clone(), cfg.log_dir.clone())
    };
    let probes = faults::probes(cfg.seed);
    let warmup = cfg.warmup().as_secs_f64();
    let quiet = cfg.quiet.as_secs_f64();
    let cycle = cfg.cycle().as_secs_f64();
    let load_end = cfg.duration.as_secs_f64() + quiet;
    let baseline = (warmup + quiet, warmup + quiet + cycle);
    let last = (load_end - cycle, load_end);

    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let ready = faults::watch_readiness(d.router_admins.clone(), stop.clone());
    let plan_cfg = cfg.clone();
    let seed = cfg.seed;
    let plan = move |i: u64| -> Planned {
        let (prompt, max_tokens, stream) = soak_request(seed, i);
        (send_offset(&plan_cfg, i), prompt, max_tokens, stream)
    };
    let load = faults::start_load_with(
        plan,
        cfg.request_deadline,
        d.gateways.clone(),
        ready,
        t0,
        stop.clone(),
    );

    let mut samples: BTreeMap<String, Vec<ProcSample>> = BTreeMap::new();
    let mut events = Vec::new();
    let mut idle: Option<BTreeMap<String, ProcSample>> = None;
    let mut quiet_settled_s = None;
    let mut next_fault = cfg.first_fault.as_secs_f64();
    let mut next_sample = 0.0;
    let mut k = 0usize;
    loop {
        let now = t0.elapsed().as_secs_f64();
        if now >= load_end {
            break;
        }
        if idle.is_none() && now >= warmup {
            // The quiet gap: wait for the warm-up's requests to drain, then the idle baseline.
            let admins = faults::live_admins(&d, None);
            quiet_settled_s = faults::wait_settled(&client, &d, &admins).await.0;
            idle = Some(settled_sample(&client, &d, t0, Duration::from_millis(500)).await);
            continue;
        }
        if now >= next_fault {
            // No fault near the quiet gap (its drain must not wait for a restart) nor in the
            // last 10 s.
            let near_quiet = now >= warmup - 20.0 && now < warmup + quiet;
            if !near_quiet && now < load_end - 10.0 {
                let fault = SOAK_FAULTS[k % SOAK_FAULTS.len()];
                k += 1;
                let target = (fault == Fault::SidecarRestarted).then(|| cfg.workers - 1);
                let started = Instant::now();
                let out = faults::inject(&suite, &mut d, &client, fault, target).await;
                events.push(FaultEvent {
                    fault,
                    at_s: now,
                    took_s: started.elapsed().as_secs_f64(),
                    error: out.err().map(|e| format!("{e:#}")),
                });
            }
            next_fault += cfg.fault_every.as_secs_f64();
            continue;
        }
        if now >= next_sample {
            for (name, s) in sample_all(&client, &d, now).await {
                samples.entry(name).or_default().push(s);
            }
            next_sample = now + cfg.sample_every.as_secs_f64();
            continue;
        }
        let mut wake = next_fault.min(next_sample).min(load_end);
        if idle.is_none() {
            wake = wake.min(warmup);
        }
        tokio::time::sleep_until((t0 + Duration::from_secs_f64(wake)).into()).await;
    }
    stop.store(true, Ordering::Relaxed);
    let records = load.await.context("the load task")?;

    let admins = faults::live_admins(&d, None);
    let (settled_s, unsettled) = faults::wait_settled(&client, &d, &admins).await;
    let (views_agree, view_mismatch) =
        faults::wait_views_agree(&client, &d, &admins, &probes).await;
    let drained = settled_sample(&client, &d, t0, Duration::from_secs(1)).await;
    drop(d);

    let idle = idle.unwrap_or_default();
    let mut processes = Vec::new();
    for (name, list) in &samples {
        processes.push(summarize(
            name,
            list,
            idle.get(name),
            drained.get(name),
            baseline,
            last,
        ));
    }
    let (counts, lost_examples, error_examples) = faults::tally(&records);
    Ok(SoakReport {
        config: cfg.clone(),
        warmup_s: warmup,
        baseline_window_s: baseline,
        last_window_s: last,
        counts,
        lost_examples,
        error_examples,
        faults: events,
        quiet_settled_s,
        settled_s,
        unsettled: if settled_s.is_none() { unsettled } else { None },
        views_agree,
        view_mismatch: if views_agree { None } else { view_mismatch },
        processes,
        samples,
        wall_s: wall.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(minutes: u64) -> SoakConfig {
        SoakConfig::new(
            1,
            Duration::from_secs(minutes * 60),
            PathBuf::new(),
            PathBuf::new(),
        )
    }

    #[test]
    fn warmup_is_a_fifth_in_whole_cycles_and_at_least_30_s() {
        assert_eq!(cfg(3).warmup(), Duration::from_secs(60));
        assert_eq!(cfg(10).warmup(), Duration::from_secs(120));
        assert_eq!(cfg(30).warmup(), Duration::from_secs(360));
    }

    #[test]
    fn send_offsets_follow_the_phases_and_skip_the_quiet_gap() {
        let c = cfg(3);
        // 40 requests at 2/s, then 100 at 5/s, then 160 at 8/s: 300 a cycle.
        assert_eq!(send_offset(&c, 0), Duration::ZERO);
        assert_eq!(send_offset(&c, 40), Duration::from_secs(20));
        assert_eq!(send_offset(&c, 140), Duration::from_secs(40));
        // The second cycle starts after the 60 s warm-up: shifted by the 15 s quiet gap.
        assert_eq!(send_offset(&c, 300), Duration::from_secs(75));
        let offs: Vec<Duration> = (0..900).map(|i| send_offset(&c, i)).collect();
        assert!(offs.windows(2).all(|w| w[0] <= w[1]));
        assert!(
            !offs
                .iter()
                .any(|o| *o > Duration::from_secs(60) && *o < Duration::from_secs(75))
        );
    }

    #[test]
    fn summary_checks_only_a_process_that_kept_its_pid() {
        let s = |t_s: f64, pid: u32, rss_kib: u64| ProcSample {
            t_s,
            pid,
            rss_kib,
            fds: 10,
            threads: 4,
            tasks: Some(5),
        };
        let list = vec![
            s(10.0, 1, 100),
            s(80.0, 1, 200),
            s(100.0, 1, 210),
            s(130.0, 1, 205),
        ];
        let p = summarize(
            "router-0",
            &list,
            Some(&list[0]),
            Some(&list[3]),
            (75.0, 120.0),
            (120.0, 180.0),
        );
        assert!(p.checked);
        assert_eq!(p.rss_baseline_kib, 210);
        assert_eq!(p.rss_last_max_kib, 205);
        assert!(p.rss_last_growth() < 0.0);
        let mut moved = list.clone();
        moved[3].pid = 2;
        let p = summarize(
            "router-1",
            &moved,
            Some(&list[0]),
            Some(&moved[3]),
            (75.0, 120.0),
            (120.0, 180.0),
        );
        assert!(!p.checked);
        assert_eq!(p.pids, vec![1, 2]);
    }

    #[test]
    fn reads_this_process_and_unlabelled_metrics() {
        let (rss, threads, fds) = read_proc(std::process::id()).expect("own /proc entry");
        assert!(rss > 0 && threads > 0 && fds > 0);
        let page = "# HELP x y\nkvroute_router_runtime_alive_tasks 17\nkvroute_router_runtime_alive_tasks_other 3\n";
        assert_eq!(
            metric_value(page, "kvroute_router_runtime_alive_tasks"),
            Some(17.0)
        );
        assert_eq!(metric_value(page, "kvroute_router_missing"), None);
    }
}
