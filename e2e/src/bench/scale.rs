//! `kvroute bench --mode scale`: N simulated sidecars stream into 1 and into R real router
//! processes (`kvroute router`, peer exchange on between replicas) while Pick requests flow,
//! and what each replica costs is read from the outside.
//!
//! ```text
//! sidecar-i (task, i < N) --one gRPC stream per replica--> router-r (process, r < R)
//!   snapshot: B blocks (16 prompt families of B/16 blocks each)
//!   every 100 ms: a Delta storing k new blocks and removing the k oldest (k = rate / 20)
//!   every 250 ms: a LoadSample (the sidecar's default scrape interval)
//! picker (task) --Pick, round-robin over the replicas--> ReportDone at once
//! ```
//!
//! Measured per replica: resident memory after the snapshots and at the end, CPU used during
//! the steady phase, **ingest lag** (from sending a report to the router's ack of its
//! sequence number: the router acks a report once applied), and the Pick round trip as the
//! client sees it (p50/p99). The hit share checks that the index stays right under the load:
//! the share of picks sent to a worker whose snapshot holds the prompt's family.
//!
//! Everything runs on one machine: the load generator competes with the routers for its
//! cores, so the figures are of this machine, not of a router alone.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use kvroute_proto::v1::ingest_client::IngestClient;
use kvroute_proto::v1::picker_client::PickerClient;
use kvroute_proto::v1::{
    Delta, DeltaOp, LoadSample, PickRequest, ReportDoneRequest, SnapshotChunk, WorkerIdentity,
    WorkerReport, delta_op, ingest_control, worker_report,
};
use serde::Serialize;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::BenchArgs;
use super::stats::quantile;
use crate::procs;

/// The model every simulated worker serves.
const MODEL: &str = "scale/model";
/// Tokens per KV block.
const BLOCK_SIZE: usize = 16;
/// Prompt families per worker snapshot.
const FAMILIES_PER_WORKER: usize = 16;
/// Workers whose snapshots hold each family.
const HOLDERS_PER_FAMILY: usize = 4;
/// A Delta every this often.
const DELTA_EVERY: Duration = Duration::from_millis(100);
/// A LoadSample every this often (the sidecar's default `--scrape-interval-ms`).
const LOAD_EVERY: Duration = Duration::from_millis(250);
/// Streams opened at once while connecting.
const CONNECT_CONCURRENCY: usize = 64;

/// Sizes of one scale run.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleConfig {
    /// Simulated sidecars (workers).
    pub sidecars: usize,
    /// Blocks in each sidecar's snapshot.
    pub snapshot_blocks: usize,
    /// Block events (stored + removed) per second per sidecar in the steady phase.
    pub block_events_per_s: f64,
    /// Length of the steady phase.
    pub seconds: f64,
    /// Pick requests per second, all replicas together.
    pub picks_per_s: f64,
    /// Replica counts to run, one deployment each.
    pub replicas: Vec<usize>,
}

impl ScaleConfig {
    /// The sizes from the flags (`--quick`: 100 sidecars, 500 blocks, 10 s).
    pub fn of(args: &BenchArgs) -> anyhow::Result<Self> {
        let replicas = args
            .scale_replicas
            .split(',')
            .map(|s| s.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .context("--scale-replicas: a comma-separated list of counts")?;
        anyhow::ensure!(
            !replicas.is_empty() && replicas.iter().all(|&r| (1..=8).contains(&r)),
            "--scale-replicas: counts from 1 to 8"
        );
        let (sidecars, blocks, seconds) = if args.quick {
            (100, 512, 10.0)
        } else {
            (args.sidecars, args.snapshot_blocks, args.scale_seconds)
        };
        anyhow::ensure!(sidecars >= HOLDERS_PER_FAMILY, "--sidecars: at least 4");
        anyhow::ensure!(
            (FAMILIES_PER_WORKER..=1 << 20).contains(&blocks),
            "--snapshot-blocks: 16 to 1048576"
        );
        anyhow::ensure!(
            seconds > 0.0 && seconds <= 3_600.0,
            "--scale-seconds: above 0, at most 3600"
        );
        anyhow::ensure!(
            args.block_events_per_s >= 0.0 && args.picks_per_s > 0.0,
            "--block-events-per-s must be >= 0 and --picks-per-s > 0"
        );
        Ok(Self {
            sidecars,
            snapshot_blocks: blocks,
            block_events_per_s: args.block_events_per_s,
            seconds,
            picks_per_s: args.picks_per_s,
            replicas,
        })
    }

    fn family_blocks(&self) -> usize {
        self.snapshot_blocks / FAMILIES_PER_WORKER
    }

    fn families(&self) -> usize {
        self.sidecars * FAMILIES_PER_WORKER / HOLDERS_PER_FAMILY
    }
}

/// What one replica cost during one run.
#[derive(Clone, Debug, Serialize)]
pub struct ReplicaFigures {
    /// Replicas in the deployment.
    pub replicas: usize,
    /// This replica's index.
    pub replica: usize,
    /// Resident memory once every snapshot was acked, MiB.
    pub rss_after_snapshots_mib: f64,
    /// Resident memory at the end of the steady phase, MiB.
    pub rss_end_mib: f64,
    /// CPU used in the steady phase, in cores (CPU seconds / wall seconds).
    pub cpu_cores: f64,
    /// Ingest lag in the steady phase, ms: send to ack.
    pub ingest_lag_p50_ms: f64,
    /// 99th percentile of it.
    pub ingest_lag_p99_ms: f64,
    /// The largest.
    pub ingest_lag_max_ms: f64,
    /// Reports the replica acked in the steady phase.
    pub reports_acked: usize,
    /// Reports sent in the steady phase and never acked by the end.
    pub reports_unacked: usize,
    /// Picks this replica answered.
    pub picks: usize,
    /// Pick round trip as the client sees it, ms.
    pub pick_p50_ms: f64,
    /// 99th percentile of it.
    pub pick_p99_ms: f64,
    /// Picks that failed.
    pub pick_errors: usize,
    /// The router's own decision time (`kvroute_router_decision_duration_seconds`), the upper
    /// bound of the histogram bucket holding the median, ms.
    pub decision_p50_ms_at_most: f64,
    /// The same for the 99th percentile.
    pub decision_p99_ms_at_most: f64,
    /// Share of picks sent to a worker whose snapshot holds the prompt's family.
    pub hit_share: f64,
}

/// One deployment's run.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleRun {
    /// Replicas.
    pub replicas: usize,
    /// Seconds from the first stream to every snapshot acked by every replica.
    pub snapshot_load_s: f64,
    /// Streams the routers refused or cut.
    pub streams_failed: usize,
    /// Per replica.
    pub per_replica: Vec<ReplicaFigures>,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleReport {
    /// Sizes.
    pub config: ScaleConfig,
    /// Cores of this machine (the load generator shares them).
    pub machine_cores: usize,
    /// One per replica count.
    pub runs: Vec<ScaleRun>,
}

/// `kvroute bench --mode scale`.
pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let cfg = ScaleConfig::of(args)?;
    let families = Arc::new(Families::new(&cfg, args.seed()));
    let mut runs = Vec::new();
    for &r in &cfg.replicas {
        eprintln!(
            "scale: {} sidecars x {} blocks into {r} replica(s)",
            cfg.sidecars, cfg.snapshot_blocks
        );
        runs.push(run_one(&cfg, r, &families, args).await?);
    }
    let report = ScaleReport {
        config: cfg,
        machine_cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        runs,
    };
    let table = markdown(&report);
    println!("{table}");
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("write {}", p.display()))?;
    }
    if let Some(p) = &args.markdown {
        std::fs::write(p, table).with_context(|| format!("write {}", p.display()))?;
    }
    Ok(())
}

/// The report as a markdown table.
pub fn markdown(r: &ScaleReport) -> String {
    let c = &r.config;
    let mut out = format!(
        "kvroute bench --mode scale: {} sidecars x {} snapshot blocks, {} block events/s each, {} picks/s, {} s steady, {} cores shared with the load generator\n\n",
        c.sidecars,
        c.snapshot_blocks,
        c.block_events_per_s,
        c.picks_per_s,
        c.seconds,
        r.machine_cores
    );
    out.push_str("| replicas | replica | snapshots loaded s | RSS after snapshots MiB | RSS end MiB | CPU cores | ingest lag p50 ms | p99 ms | max ms | acked | unacked | picks | pick p50 ms | pick p99 ms | decision p50 ms <= | decision p99 ms <= | pick errors | hit share | streams failed |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for run in &r.runs {
        for f in &run.per_replica {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {:.0} | {:.0} | {:.2} | {:.1} | {:.1} | {:.0} | {} | {} | {} | {:.2} | {:.2} | {} | {} | {} | {:.3} | {} |",
                f.replicas,
                f.replica,
                run.snapshot_load_s,
                f.rss_after_snapshots_mib,
                f.rss_end_mib,
                f.cpu_cores,
                f.ingest_lag_p50_ms,
                f.ingest_lag_p99_ms,
                f.ingest_lag_max_ms,
                f.reports_acked,
                f.reports_unacked,
                f.picks,
                f.pick_p50_ms,
                f.pick_p99_ms,
                f.decision_p50_ms_at_most,
                f.decision_p99_ms_at_most,
                f.pick_errors,
                f.hit_share,
                run.streams_failed,
            );
        }
    }
    out
}

/// The prompt families: token ids, their block hashes, and which workers hold them.
struct Families {
    tokens: Vec<Vec<u32>>,
    hashes: Vec<Vec<u64>>,
    family_blocks: usize,
    sidecars: usize,
}

impl Families {
    fn new(cfg: &ScaleConfig, seed: u64) -> Self {
        let root = kvroute_hash::root_hash(MODEL, None);
        let per = cfg.family_blocks();
        let mut tokens = Vec::new();
        let mut hashes = Vec::new();
        for f in 0..cfg.families() {
            let t: Vec<u32> = (0..per * BLOCK_SIZE)
                .map(|j| 1 + (mix(seed ^ ((f as u64) << 32) ^ j as u64) % 50_000) as u32)
                .collect();
            hashes.push(kvroute_hash::chain(root, &t, BLOCK_SIZE, &[]));
            tokens.push(t);
        }
        Self {
            tokens,
            hashes,
            family_blocks: per,
            sidecars: cfg.sidecars,
        }
    }

    /// Families in worker `i`'s snapshot: each family is held by `HOLDERS_PER_FAMILY`
    /// workers spread over the pool.
    fn of_worker(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let n = self.tokens.len();
        (0..FAMILIES_PER_WORKER).map(move |k| (i * FAMILIES_PER_WORKER + k) % n)
    }

    fn holds(&self, worker: usize, family: usize) -> bool {
        worker < self.sidecars && self.of_worker(worker).any(|f| f == family)
    }

    fn snapshot(&self, i: usize) -> Vec<u64> {
        let mut blocks = Vec::with_capacity(FAMILIES_PER_WORKER * self.family_blocks);
        for f in self.of_worker(i) {
            blocks.extend_from_slice(&self.hashes[f]);
        }
        blocks
    }
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// One router replica process and its addresses.
struct Replica {
    child: procs::Child,
    grpc: String,
    admin: String,
}

async fn start_replicas(
    n: usize,
    cfg: &ScaleConfig,
    args: &BenchArgs,
) -> anyhow::Result<Vec<Replica>> {
    let ports: Vec<(u16, u16, u16)> = (0..n)
        .map(|_| {
            Ok((
                procs::free_local_port()?,
                procs::free_local_port()?,
                procs::free_local_port()?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    if let Some(d) = &args.log_dir {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    let cap = (cfg.sidecars * 2).max(64);
    let mut out = Vec::new();
    for (r, &(http, grpc, admin)) in ports.iter().enumerate() {
        let mut a = vec![
            format!("--http-addr=127.0.0.1:{http}"),
            format!("--grpc-addr=127.0.0.1:{grpc}"),
            format!("--admin-addr=127.0.0.1:{admin}"),
            "--route-unlisted".into(),
            format!("--max-workers-per-model={cap}"),
            format!("--max-workers={cap}"),
            format!("--max-ingest-streams={cap}"),
            format!("--max-outstanding-picks={}", 65_536),
            format!("--seed={}", 1 + r),
        ];
        let peers: Vec<String> = ports
            .iter()
            .enumerate()
            .filter(|(o, _)| *o != r)
            .map(|(_, p)| format!("127.0.0.1:{}", p.1))
            .collect();
        if !peers.is_empty() {
            a.push(format!("--peers={}", peers.join(",")));
        }
        let log = args
            .log_dir
            .as_ref()
            .map(|d| d.join(format!("router-scale-{n}-{r}.log")));
        let child = procs::spawn_kvroute(
            &format!("router-{r}"),
            "router",
            &a,
            &procs::SpawnOptions {
                env: Vec::new(),
                log,
            },
        )?;
        out.push(Replica {
            child,
            grpc: format!("http://127.0.0.1:{grpc}"),
            admin: format!("http://127.0.0.1:{admin}"),
        });
    }
    for r in &mut out {
        procs::wait_http_ok(
            &format!("{}/healthz", r.admin),
            Duration::from_secs(60),
            Some(&mut r.child),
        )
        .await?;
    }
    Ok(out)
}

/// Phases the load generator's tasks follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Snapshots sent; no deltas yet.
    Loading,
    /// Deltas, loads and picks, measured.
    Steady,
    /// Picks stop (the picker finishes the one in flight); streams stay open, quiet, so no
    /// pick races its workers' streams closing.
    Stopping,
    /// Stop sending; close.
    Done,
}

/// What one stream measured in the steady phase.
#[derive(Default)]
struct StreamFigures {
    lags_ms: Vec<f32>,
    unacked: usize,
    failed: bool,
}

/// The seqs a stream sent and when, until acked.
#[derive(Default)]
struct Outstanding {
    sent: VecDeque<(u64, Instant, bool)>,
    lags_ms: Vec<f32>,
    snapshot_acked: bool,
}

impl Outstanding {
    fn acked(&mut self, seq: u64, now: Instant) {
        while let Some(&(s, at, measured)) = self.sent.front() {
            if s > seq {
                break;
            }
            self.sent.pop_front();
            if s == 0 {
                self.snapshot_acked = true;
            }
            if measured {
                self.lags_ms
                    .push((now.duration_since(at).as_secs_f64() * 1e3) as f32);
            }
        }
    }
}

fn identity(i: usize) -> WorkerIdentity {
    WorkerIdentity {
        worker_id: format!("scale/w{i}"),
        pod: format!("w{i}"),
        namespace: "scale".into(),
        address: format!("10.0.{}.{}:8000", i / 250, i % 250),
        model: MODEL.into(),
        block_size: BLOCK_SIZE as u32,
        epoch: 1,
        worker_set: String::new(),
    }
}

fn load_sample() -> WorkerReport {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    WorkerReport {
        seq: 0,
        body: Some(worker_report::Body::Load(LoadSample {
            timestamp_ms: now_ms,
            num_requests_waiting: 0,
            num_requests_running: 1,
            kv_cache_usage: 0.3,
            kv_capacity_tokens: 100_000,
            ..LoadSample::default()
        })),
    }
}

/// One simulated sidecar's stream into one replica.
#[allow(clippy::too_many_arguments)]
async fn sidecar_stream(
    endpoint: String,
    i: usize,
    snapshot: Arc<Vec<u64>>,
    per_tick: usize,
    connect: Arc<Semaphore>,
    mut phase: watch::Receiver<Phase>,
    loaded: mpsc::UnboundedSender<()>,
) -> StreamFigures {
    let mut figures = StreamFigures::default();
    let (tx, rx) = mpsc::channel::<WorkerReport>(256);
    let out = Arc::new(Mutex::new(Outstanding::default()));
    let mut sender = Sender {
        tx,
        seq: 0,
        out: out.clone(),
    };
    // Queued before the stream opens (the router answers once the first report is in).
    let first = WorkerReport {
        seq: 0,
        body: Some(worker_report::Body::Snapshot(SnapshotChunk {
            identity: Some(identity(i)),
            first: true,
            last: true,
            blocks: snapshot.to_vec(),
        })),
    };
    let mut ok = sender.send(first, false).await && sender.send(load_sample(), false).await;
    let opened = {
        let _permit = connect.acquire().await;
        async {
            let client = IngestClient::connect(endpoint).await?;
            let resp = client
                .max_decoding_message_size(4 << 20)
                .report(ReceiverStream::new(rx))
                .await?;
            anyhow::Ok(resp)
        }
        .await
    };
    let mut acks = match opened {
        Ok(resp) => resp.into_inner(),
        Err(_) => {
            figures.failed = true;
            let _ = loaded.send(());
            return figures;
        }
    };
    // Reads acks until the router ends the stream; true when it ended it with an error or
    // before the snapshot was acked.
    let reader = {
        let out = out.clone();
        tokio::spawn(async move {
            let mut told = false;
            let failed = loop {
                match acks.message().await {
                    Ok(Some(m)) => {
                        if let Some(ingest_control::Body::Ack(a)) = m.body {
                            let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                            o.acked(a.seq, Instant::now());
                            if o.snapshot_acked && !told {
                                told = true;
                                let _ = loaded.send(());
                            }
                        }
                    }
                    Ok(None) => break !told,
                    Err(_) => break true,
                }
            };
            if !told {
                let _ = loaded.send(());
            }
            failed
        })
    };
    // Deltas store fresh blocks and evict the oldest of them, so the resident set stays the
    // snapshot plus a window of 10 ticks.
    let mut next_block = mix(i as u64 ^ 0x5CA1E) | 1;
    let mut resident: VecDeque<u64> = VecDeque::new();
    let mut delta_tick = tokio::time::interval(DELTA_EVERY);
    let mut load_tick = tokio::time::interval(LOAD_EVERY);
    while ok {
        let now = *phase.borrow();
        if now == Phase::Done {
            break;
        }
        let steady = now == Phase::Steady;
        tokio::select! {
            _ = phase.changed() => {}
            _ = delta_tick.tick(), if steady && per_tick > 0 => {
                let stored: Vec<u64> = (0..per_tick)
                    .map(|_| {
                        next_block = mix(next_block);
                        next_block
                    })
                    .collect();
                resident.extend(&stored);
                let mut ops = vec![DeltaOp {
                    kind: delta_op::Kind::Stored as i32,
                    blocks: stored,
                }];
                if resident.len() > per_tick * 10 {
                    let removed: Vec<u64> = resident.drain(..per_tick).collect();
                    ops.push(DeltaOp {
                        kind: delta_op::Kind::Removed as i32,
                        blocks: removed,
                    });
                }
                ok = sender
                    .send(
                        WorkerReport {
                            seq: 0,
                            body: Some(worker_report::Body::Delta(Delta { ops })),
                        },
                        true,
                    )
                    .await;
            }
            _ = load_tick.tick(), if steady => {
                ok = sender.send(load_sample(), true).await;
            }
        }
    }
    drop(sender);
    // The router acks what it applied, then ends the stream once the input ends.
    let lost = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(true);
    let o = std::mem::take(&mut *out.lock().unwrap_or_else(|e| e.into_inner()));
    figures.failed = !ok || lost;
    figures.unacked = o.sent.iter().filter(|s| s.2).count();
    figures.lags_ms = o.lags_ms;
    figures
}

/// Sends a stream's reports in sequence, remembering when each was sent (a full queue makes
/// the sender wait, as the router's flow control says).
struct Sender {
    tx: mpsc::Sender<WorkerReport>,
    seq: u64,
    out: Arc<Mutex<Outstanding>>,
}

impl Sender {
    async fn send(&mut self, mut report: WorkerReport, measured: bool) -> bool {
        report.seq = self.seq;
        self.out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sent
            .push_back((self.seq, Instant::now(), measured));
        self.seq += 1;
        self.tx.send(report).await.is_ok()
    }
}

/// What the picker measured, per replica.
#[derive(Default, Clone)]
struct PickFigures {
    rtts_ms: Vec<f64>,
    errors: usize,
    hits: usize,
}

async fn picker(
    replicas: Vec<String>,
    families: Arc<Families>,
    rate: f64,
    mut phase: watch::Receiver<Phase>,
    seed: u64,
) -> Vec<PickFigures> {
    let mut figures = vec![PickFigures::default(); replicas.len()];
    let mut clients = Vec::new();
    for r in &replicas {
        match PickerClient::connect(r.clone()).await {
            Ok(c) => clients.push(Some(c)),
            Err(_) => clients.push(None),
        }
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut n = 0u64;
    while !matches!(*phase.borrow(), Phase::Stopping | Phase::Done) {
        tokio::select! {
            _ = phase.changed() => continue,
            _ = tick.tick() => {}
        }
        if *phase.borrow() != Phase::Steady {
            continue;
        }
        let r = (n as usize) % replicas.len();
        let family = (mix(seed ^ n) % families.tokens.len() as u64) as usize;
        n += 1;
        let f = &mut figures[r];
        let Some(client) = clients[r].as_mut() else {
            f.errors += 1;
            continue;
        };
        let mut prompt = families.tokens[family].clone();
        prompt.extend((0..32u32).map(|t| 60_000 + t + (n as u32 % 1000) * 32));
        let body = serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": 16});
        let started = Instant::now();
        let picked = client
            .pick(PickRequest {
                path: "/v1/completions".into(),
                headers: Default::default(),
                body: serde_json::to_vec(&body).unwrap_or_default(),
            })
            .await;
        match picked {
            Ok(resp) => {
                f.rtts_ms.push(started.elapsed().as_secs_f64() * 1e3);
                let resp = resp.into_inner();
                let worker = resp
                    .worker_id
                    .rsplit_once("/w")
                    .and_then(|(_, i)| i.parse::<usize>().ok());
                if worker.is_some_and(|w| families.holds(w, family)) {
                    f.hits += 1;
                }
                let _ = client
                    .report_done(ReportDoneRequest {
                        decision_id: resp.decision_id,
                        prompt_tokens: prompt.len() as u32,
                        cached_prompt_tokens: 0,
                        completion_tokens: 16,
                        e2e_seconds: 0.5,
                    })
                    .await;
            }
            Err(status) => {
                eprintln!("scale: pick on replica {r} failed: {status}");
                f.errors += 1;
            }
        }
    }
    figures
}

/// The router's decision-time histogram: the upper bounds (ms) of the buckets holding its
/// median and its 99th percentile (NaN when it has no sample or cannot be read).
async fn decision_quantiles(admin: &str) -> (f64, f64) {
    let Ok(resp) = reqwest::get(format!("{admin}/metrics")).await else {
        return (f64::NAN, f64::NAN);
    };
    let text = resp.text().await.unwrap_or_default();
    let prefix = "kvroute_router_decision_duration_seconds_bucket{le=\"";
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(prefix)?;
            let (le, count) = rest.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |b| b.1);
    if total <= 0.0 {
        return (f64::NAN, f64::NAN);
    }
    let at = |q: f64| {
        buckets
            .iter()
            .find(|b| b.1 >= q * total)
            .map_or(f64::NAN, |b| b.0 * 1e3)
    };
    (at(0.5), at(0.99))
}

/// Resident memory (MiB) and CPU seconds of a process, from /proc (NaN elsewhere).
fn proc_figures(pid: Option<u32>) -> (f64, f64) {
    let Some(pid) = pid else {
        return (f64::NAN, f64::NAN);
    };
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kib| kib / 1024.0);
    let cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = stat.rsplit_once(") ")?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
        })
        .unwrap_or(f64::NAN);
    (rss, cpu)
}

async fn run_one(
    cfg: &ScaleConfig,
    n: usize,
    families: &Arc<Families>,
    args: &BenchArgs,
) -> anyhow::Result<ScaleRun> {
    let replicas = start_replicas(n, cfg, args).await?;
    let (phase_tx, phase_rx) = watch::channel(Phase::Loading);
    let (loaded_tx, mut loaded_rx) = mpsc::unbounded_channel();
    let connect = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let per_tick = (cfg.block_events_per_s * DELTA_EVERY.as_secs_f64() / 2.0).round() as usize;
    let started = Instant::now();
    let mut streams = Vec::new();
    for i in 0..cfg.sidecars {
        let snapshot = Arc::new(families.snapshot(i));
        for (r, rep) in replicas.iter().enumerate() {
            streams.push((
                r,
                tokio::spawn(sidecar_stream(
                    rep.grpc.clone(),
                    i,
                    snapshot.clone(),
                    per_tick,
                    connect.clone(),
                    phase_rx.clone(),
                    loaded_tx.clone(),
                )),
            ));
        }
    }
    drop(loaded_tx);
    let total = streams.len();
    let deadline = Instant::now() + Duration::from_secs(600);
    for _ in 0..total {
        let left = deadline.saturating_duration_since(Instant::now());
        anyhow::ensure!(
            tokio::time::timeout(left, loaded_rx.recv()).await.is_ok(),
            "snapshots not acked within 600 s"
        );
    }
    let snapshot_load_s = started.elapsed().as_secs_f64();
    let after_snapshots: Vec<(f64, f64)> = replicas
        .iter()
        .map(|r| proc_figures(r.child.id()))
        .collect();
    // The picker gets a thread and runtime of its own, so the sidecars' tasks in this process
    // do not delay its picks: its round trips are the router's and the network's.
    let picker = {
        let (targets, families, rate, phase, seed) = (
            replicas.iter().map(|r| r.grpc.clone()).collect::<Vec<_>>(),
            families.clone(),
            cfg.picks_per_s,
            phase_rx.clone(),
            args.seed(),
        );
        tokio::task::spawn_blocking(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(picker(targets, families, rate, phase, seed)))
        })
    };
    let steady_start = Instant::now();
    phase_tx.send_replace(Phase::Steady);
    tokio::time::sleep(Duration::from_secs_f64(cfg.seconds)).await;
    let wall = steady_start.elapsed().as_secs_f64();
    let at_end: Vec<(f64, f64)> = replicas
        .iter()
        .map(|r| proc_figures(r.child.id()))
        .collect();
    phase_tx.send_replace(Phase::Stopping);
    let picks = picker
        .await
        .context("picker thread")?
        .context("picker runtime")?;
    phase_tx.send_replace(Phase::Done);
    let mut decisions = Vec::new();
    for r in &replicas {
        decisions.push(decision_quantiles(&r.admin).await);
    }
    let mut lags: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut unacked = vec![0usize; n];
    let mut streams_failed = 0;
    for (r, h) in streams {
        let f = h.await.context("sidecar task")?;
        lags[r].extend(f.lags_ms.iter().map(|&x| f64::from(x)));
        unacked[r] += f.unacked;
        streams_failed += usize::from(f.failed);
    }
    let mut per_replica = Vec::new();
    for r in 0..n {
        let l = &mut lags[r];
        l.sort_by(f64::total_cmp);
        let p = &picks[r];
        let rtts = &p.rtts_ms;
        per_replica.push(ReplicaFigures {
            replicas: n,
            replica: r,
            rss_after_snapshots_mib: after_snapshots[r].0,
            rss_end_mib: at_end[r].0,
            cpu_cores: (at_end[r].1 - after_snapshots[r].1) / wall,
            ingest_lag_p50_ms: quantile(l, 0.5),
            ingest_lag_p99_ms: quantile(l, 0.99),
            ingest_lag_max_ms: l.last().copied().unwrap_or(f64::NAN),
            reports_acked: l.len(),
            reports_unacked: unacked[r],
            picks: rtts.len(),
            pick_p50_ms: quantile(rtts, 0.5),
            pick_p99_ms: quantile(rtts, 0.99),
            pick_errors: p.errors,
            decision_p50_ms_at_most: decisions[r].0,
            decision_p99_ms_at_most: decisions[r].1,
            hit_share: if rtts.is_empty() {
                f64::NAN
            } else {
                p.hits as f64 / rtts.len() as f64
            },
        });
    }
    drop(replicas);
    Ok(ScaleRun {
        replicas: n,
        snapshot_load_s,
        streams_failed,
        per_replica,
    })
}
