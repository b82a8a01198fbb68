//! `kvroute bench --mode attack`: how responsive a real router process stays while hostile
//! clients hit its gateway. One router (`kvroute router`, default limits, no workers) on
//! loopback; a baseline, then three attacks one after the other, each for a fixed time:
//!
//! ```text
//! slow-loris   N connections trickling a request head, one byte a second (reconnecting
//!              when cut off)
//! body-flood   K clients each sending 10 MB bodies back to back
//! idle         10,000 connections that send nothing (fewer when the open-file limit says so)
//! meanwhile:   GET /healthz on the admin port every 20 ms (one keep-alive connection) and
//!              GET /health on the gateway every 20 ms (a new connection each: it meets the
//!              connection cap like any new client), from a thread of their own
//! ```
//!
//! Reported per attack: `/healthz` p50/p99 and failures, gateway `/health` p50/p99 and the
//! share answered, and the router's refusal counters. `--quick` shortens and shrinks it all.
//! Every connection goes to 127.0.0.1; every loop ends with its attack.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::BenchArgs;
use super::stats::quantile;
use crate::procs;

/// Sizes and durations of one attack run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AttackConfig {
    /// How long each attack (and the baseline) lasts.
    pub seconds: f64,
    /// Slow-loris connections.
    pub loris: usize,
    /// Clients sending 10 MB bodies.
    pub flooders: usize,
    /// Idle connections (before the open-file limit cuts them down).
    pub idle: usize,
}

impl AttackConfig {
    fn of(args: &BenchArgs) -> Self {
        if args.quick {
            Self {
                seconds: 3.0,
                loris: 200,
                flooders: 8,
                idle: 1_000,
            }
        } else {
            Self {
                seconds: 10.0,
                loris: 2_000,
                flooders: 32,
                idle: 10_000,
            }
        }
    }
}

/// What one attack did to the router.
#[derive(Clone, Debug, Serialize)]
pub struct AttackResult {
    /// `baseline`, `slow-loris`, `body-flood` or `idle`.
    pub attack: String,
    /// Attack connections opened.
    pub connections: usize,
    /// Admin `/healthz` latency, ms.
    pub healthz_p50_ms: f64,
    /// Admin `/healthz` latency, ms.
    pub healthz_p99_ms: f64,
    /// `/healthz` probes that failed or timed out (5 s).
    pub healthz_failures: usize,
    /// Gateway `/health` latency on a new connection, ms (answered probes only).
    pub gateway_p50_ms: f64,
    /// Gateway `/health` latency on a new connection, ms (answered probes only).
    pub gateway_p99_ms: f64,
    /// Share of gateway probes answered 200.
    pub gateway_answered: f64,
    /// The router's refusal counters that moved during the attack, `reason=count`.
    pub refused: Vec<String>,
    /// CPU seconds the router process used during the attack (from /proc; NaN elsewhere).
    pub router_cpu_s: f64,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct AttackReport {
    /// Sizes used.
    pub config: AttackConfig,
    /// The bench process's open-file limit (caps the idle attack).
    pub open_files_limit: Option<usize>,
    /// One row per attack.
    pub attacks: Vec<AttackResult>,
}

/// CPU seconds (user + system) `pid` has used so far, from /proc (Linux's USER_HZ is 100).
fn cpu_seconds(pid: Option<u32>) -> f64 {
    let read = || -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = stat.rsplit_once(") ")?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        Some(ticks / 100.0)
    };
    read().unwrap_or(f64::NAN)
}

fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// `kvroute bench --mode attack`.
pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let cfg = AttackConfig::of(args);
    let limit = open_files_limit();
    let (http, grpc, admin) = (
        procs::free_local_port()?,
        procs::free_local_port()?,
        procs::free_local_port()?,
    );
    let router_args: Vec<String> = vec![
        format!("--http-addr=127.0.0.1:{http}"),
        format!("--grpc-addr=127.0.0.1:{grpc}"),
        format!("--admin-addr=127.0.0.1:{admin}"),
        "--route-unlisted".into(),
    ];
    let log = args.log_dir.as_ref().map(|d| d.join("router-attack.log"));
    if let Some(d) = &args.log_dir {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    let mut router = procs::spawn_kvroute(
        "router",
        "router",
        &router_args,
        &procs::SpawnOptions {
            env: Vec::new(),
            log,
        },
    )?;
    let admin_url = format!("http://127.0.0.1:{admin}");
    procs::wait_http_ok(
        &format!("{admin_url}/healthz"),
        Duration::from_secs(60),
        Some(&mut router),
    )
    .await?;
    let target = Target {
        gateway: format!("127.0.0.1:{http}"),
        admin: admin_url,
    };
    let idle = cfg
        .idle
        .min(limit.map_or(1_000, |l| l.saturating_sub(1_000)));
    let mut attacks = Vec::new();
    for kind in [
        Attack::Baseline,
        Attack::SlowLoris(cfg.loris),
        Attack::BodyFlood(cfg.flooders),
        Attack::Idle(idle),
    ] {
        let cpu = cpu_seconds(router.id());
        let mut r = measure(&target, kind, Duration::from_secs_f64(cfg.seconds)).await?;
        r.router_cpu_s = cpu_seconds(router.id()) - cpu;
        eprintln!(
            "{}: /healthz p50 {:.2} ms p99 {:.2} ms",
            r.attack, r.healthz_p50_ms, r.healthz_p99_ms
        );
        attacks.push(r);
    }
    drop(router);
    let report = AttackReport {
        config: cfg,
        open_files_limit: limit,
        attacks,
    };
    let table = markdown(&report);
    println!("{table}");
    write(
        args.json.as_ref(),
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    write(args.markdown.as_ref(), table)?;
    Ok(())
}

fn write(path: Option<&PathBuf>, text: String) -> anyhow::Result<()> {
    if let Some(p) = path {
        std::fs::write(p, text).with_context(|| format!("write {}", p.display()))?;
    }
    Ok(())
}

/// The report as a Markdown table.
pub fn markdown(r: &AttackReport) -> String {
    let mut out = String::from(
        "| attack | connections | /healthz p50 ms | /healthz p99 ms | /healthz failed | gateway /health p50 ms | p99 ms | answered | router CPU s | refused by the router |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for a in &r.attacks {
        out.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {:.0}% | {:.2} | {} |\n",
            a.attack,
            a.connections,
            a.healthz_p50_ms,
            a.healthz_p99_ms,
            a.healthz_failures,
            a.gateway_p50_ms,
            a.gateway_p99_ms,
            a.gateway_answered * 100.0,
            a.router_cpu_s,
            if a.refused.is_empty() {
                "-".to_string()
            } else {
                a.refused.join(", ")
            }
        ));
    }
    out
}

#[derive(Clone)]
struct Target {
    gateway: String,
    admin: String,
}

/// Tells the attack loops to end.
#[derive(Clone)]
struct Stop(watch::Receiver<bool>);

impl Stop {
    fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    async fn wait(&mut self) {
        // An error means the sender is gone: stop too.
        let _ = self.0.wait_for(|s| *s).await;
    }
}

#[derive(Clone, Copy, Debug)]
enum Attack {
    Baseline,
    SlowLoris(usize),
    BodyFlood(usize),
    Idle(usize),
}

impl Attack {
    fn name(self) -> &'static str {
        match self {
            Attack::Baseline => "baseline",
            Attack::SlowLoris(_) => "slow-loris",
            Attack::BodyFlood(_) => "body-flood",
            Attack::Idle(_) => "idle",
        }
    }
}

/// The router's `kvroute_router_refused_total` series of the gateway, by reason.
async fn refusals(admin: &str) -> Vec<(String, f64)> {
    let Ok(resp) = reqwest::get(format!("{admin}/metrics")).await else {
        return Vec::new();
    };
    let text = resp.text().await.unwrap_or_default();
    let prefix = "kvroute_router_refused_total{listener=\"gateway\",reason=\"";
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix)?;
            let (reason, value) = rest.split_once("\"}")?;
            Some((reason.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

async fn measure(t: &Target, kind: Attack, length: Duration) -> anyhow::Result<AttackResult> {
    let before = refusals(&t.admin).await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let attack = {
        let (gateway, mut stop) = (t.gateway.clone(), Stop(stop_rx));
        tokio::spawn(async move {
            match kind {
                Attack::Baseline => {
                    stop.wait().await;
                    0
                }
                Attack::SlowLoris(n) => slow_loris(&gateway, n, stop).await,
                Attack::BodyFlood(n) => body_flood(&gateway, n, stop).await,
                Attack::Idle(n) => idle(&gateway, n, stop).await,
            }
        })
    };
    // Let the attack build up before measuring.
    tokio::time::sleep(length / 5).await;
    // The probes get a thread and runtime of their own, so the attack's tasks in this process
    // do not delay them: what they measure is the router.
    let target = t.clone();
    let probes = tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("probe runtime")?
            .block_on(probe(&target, length))
    })
    .await
    .context("probe thread")??;
    let _ = stop_tx.send(true);
    let connections = attack.await.context("attack task")?;
    let after = refusals(&t.admin).await;
    let refused = after
        .iter()
        .filter_map(|(reason, v)| {
            let was = before
                .iter()
                .find(|(r, _)| r == reason)
                .map_or(0.0, |b| b.1);
            (*v > was).then(|| format!("{reason}={}", v - was))
        })
        .collect();
    let ms = |v: &[f64], q| quantile(v, q) * 1e3;
    Ok(AttackResult {
        attack: kind.name().to_string(),
        connections,
        healthz_p50_ms: ms(&probes.healthz, 0.5),
        healthz_p99_ms: ms(&probes.healthz, 0.99),
        healthz_failures: probes.healthz_failures,
        gateway_p50_ms: ms(&probes.gateway, 0.5),
        gateway_p99_ms: ms(&probes.gateway, 0.99),
        gateway_answered: probes.gateway.len() as f64
            / (probes.gateway.len() + probes.gateway_failures).max(1) as f64,
        refused,
        router_cpu_s: f64::NAN,
    })
}

struct Probes {
    healthz: Vec<f64>,
    healthz_failures: usize,
    gateway: Vec<f64>,
    gateway_failures: usize,
}

async fn probe(t: &Target, length: Duration) -> anyhow::Result<Probes> {
    let admin = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let fresh = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()?;
    let (healthz_url, gateway_url) = (
        format!("{}/healthz", t.admin),
        format!("http://{}/health", t.gateway),
    );
    let healthz = async {
        let (mut ok, mut failed) = (Vec::new(), 0);
        let end = Instant::now() + length;
        while Instant::now() < end {
            let start = Instant::now();
            match admin.get(&healthz_url).send().await {
                Ok(r) if r.status().is_success() => ok.push(start.elapsed().as_secs_f64()),
                _ => failed += 1,
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (ok, failed)
    };
    let gateway = async {
        let (mut ok, mut failed) = (Vec::new(), 0);
        let end = Instant::now() + length;
        while Instant::now() < end {
            let start = Instant::now();
            match fresh.get(&gateway_url).send().await {
                Ok(r) if r.status().is_success() => ok.push(start.elapsed().as_secs_f64()),
                _ => failed += 1,
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (ok, failed)
    };
    let ((healthz, healthz_failures), (gateway, gateway_failures)) = tokio::join!(healthz, gateway);
    Ok(Probes {
        healthz,
        healthz_failures,
        gateway,
        gateway_failures,
    })
}

const HEAD: &[u8] =
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: attack\r\ncontent-type: application/json\r\n";

/// `n` connections each sending a head one byte a second; a cut-off one reconnects.
async fn slow_loris(gateway: &str, n: usize, stop: Stop) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (gateway, mut stop) = (gateway.to_string(), stop.clone());
            tokio::spawn(async move {
                let mut opened = 0;
                // Spread the trickle over the second.
                tokio::time::sleep(Duration::from_millis((i % 1000) as u64)).await;
                'connect: while !stop.is_set() {
                    let Ok(mut tcp) = TcpStream::connect(&gateway).await else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    opened += 1;
                    for byte in HEAD {
                        if tcp.write_all(&[*byte]).await.is_err() {
                            continue 'connect;
                        }
                        tokio::select! {
                            () = stop.wait() => break 'connect,
                            () = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                }
                opened
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap_or(0);
    }
    total
}

/// `n` clients each sending 10 MB bodies back to back (a new connection for each).
async fn body_flood(gateway: &str, n: usize, stop: Stop) -> usize {
    const BODY: usize = 10_000_000;
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (gateway, stop) = (gateway.to_string(), stop.clone());
            tokio::spawn(async move {
                let chunk = vec![b' '; 64 << 10];
                let mut opened = 0;
                while !stop.is_set() {
                    let Ok(mut tcp) = TcpStream::connect(&gateway).await else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    opened += 1;
                    let head =
                        [HEAD, format!("content-length: {BODY}\r\n\r\n").as_bytes()].concat();
                    if tcp.write_all(&head).await.is_err() {
                        continue;
                    }
                    let mut sent = 0;
                    while sent < BODY && !stop.is_set() {
                        if tcp.write_all(&chunk).await.is_err() {
                            break;
                        }
                        sent += chunk.len();
                    }
                    let mut buf = [0u8; 512];
                    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await;
                }
                opened
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap_or(0);
    }
    total
}

/// `n` connections that send nothing, held until the attack ends.
async fn idle(gateway: &str, n: usize, mut stop: Stop) -> usize {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        if stop.is_set() {
            break;
        }
        if let Ok(tcp) = TcpStream::connect(gateway).await {
            held.push(tcp);
        }
    }
    let opened = held.len();
    stop.wait().await;
    drop(held);
    opened
}
