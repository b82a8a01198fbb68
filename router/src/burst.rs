//! A burst across router replicas: N replicas in one process, each its own [`RouterState`]
//! fed the same workers (as every sidecar streams to every replica), the peer exchange
//! running over real gRPC on loopback (or off), and a burst of requests sharing a prefix
//! never seen before sent round-robin across the replicas. Shared by the replicas test
//! (`router/tests/replicas.rs`) and benchmark (`cargo bench -p kvroute-router --bench
//! replicas`); docs/replicas.md.
//!
//! ```text
//! replica 0 --Peers.Share--> replica 1, 2        request i --> replica i % N --pick--> worker
//! replica 1 --Peers.Share--> replica 0, 2        per wave of N requests: wait until every
//! replica 2 --Peers.Share--> replica 0, 1        replica counts the others' placements
//! ```
//!
//! Hits are counted from the placements themselves: the first request on a worker computes
//! the prefix there, every later one on the same worker finds it cached.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::RouterMetrics;
use crate::peer::{PeerDialer, PeersService};
use crate::state::{
    Catalog, DiscoveredWorker, LoadApplied, PickInput, Prompt, RouterConfig, RouterState,
    SidecarIdentity,
};

/// Model every worker serves.
pub const MODEL: &str = "burst-model";
/// Block size of every worker.
pub const BLOCK_SIZE: usize = 16;

/// Replicas in one process.
pub struct Cluster {
    /// The replicas' states.
    pub states: Vec<RouterState>,
    /// Their gRPC addresses (Peers service).
    pub addrs: Vec<SocketAddr>,
    /// Stops the servers and dialers.
    pub stop: CancellationToken,
    workers: Vec<String>,
    exchange: bool,
}

/// What a burst did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BurstOutcome {
    /// Requests placed per worker.
    pub per_worker: BTreeMap<String, usize>,
    /// Requests that found the prefix on their worker (placed after another one there).
    pub hits: usize,
    /// Requests placed.
    pub placed: usize,
    /// Requests refused (no worker).
    pub refused: usize,
    /// Time spent in `pick` calls, summed.
    pub pick_time: Duration,
    /// Time from the end of each wave until every replica counted the wave's placements,
    /// summed (0 without the exchange).
    pub sync_time: Duration,
    /// Waves.
    pub waves: usize,
}

impl BurstOutcome {
    /// Hits over placements.
    pub fn hit_rate(&self) -> f64 {
        if self.placed == 0 {
            0.0
        } else {
            self.hits as f64 / self.placed as f64
        }
    }

    /// The most requests one worker got.
    pub fn max_per_worker(&self) -> usize {
        self.per_worker.values().copied().max().unwrap_or(0)
    }
}

fn worker(id: &str) -> DiscoveredWorker {
    DiscoveredWorker {
        id: id.to_string(),
        address: format!("{id}:8000"),
        model: MODEL.to_string(),
        worker_set: "burst".to_string(),
        namespace: String::new(),
        pod_ip: None,
        ready: true,
        origin: Default::default(),
        step_budget_tokens: None,
    }
}

impl Cluster {
    /// `replicas` replicas over `workers` idle workers with empty caches, the peer exchange
    /// on when `exchange`. Returns once every replica's streams to the others are open.
    pub async fn start(replicas: usize, workers: usize, exchange: bool) -> anyhow::Result<Self> {
        let d = RouterConfig::default();
        Self::start_with(
            replicas,
            workers,
            exchange,
            d.hot_prefix_window,
            d.queue_drain,
        )
        .await
    }

    /// [`Self::start`] with kvroute's hot-prefix window set (0: the rule off) and the queue
    /// drain on or off (`CoreConfig::queue_drain`). A burst of one prefix is all of each
    /// replica's traffic, so the rule may copy it to other workers; and [`Self::burst`]
    /// reports no first tokens, so with the drain on each replica's own placements would
    /// leave its queues with the wall-clock time between waves. The exchange test turns both
    /// off to see the placements the exchange alone makes, the same on every run.
    pub async fn start_with(
        replicas: usize,
        workers: usize,
        exchange: bool,
        hot_prefix_window: u32,
        queue_drain: bool,
    ) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let ids: Vec<String> = (0..workers).map(|i| format!("w{i}")).collect();
        let mut states = Vec::new();
        let mut addrs = Vec::new();
        for r in 0..replicas {
            let metrics = RouterMetrics::register(&prometheus::Registry::new())?;
            let cfg = RouterConfig {
                seed: 1 + r as u64,
                hot_prefix_window,
                queue_drain,
                ..RouterConfig::default()
            };
            let state = RouterState::new(cfg, metrics)?;
            state.set_catalog(Catalog {
                pools: Vec::new(),
                workers: ids.iter().map(|id| worker(id)).collect(),
            });
            state.set_discovery_synced();
            let now = Instant::now();
            for (i, id) in ids.iter().enumerate() {
                let identity = SidecarIdentity {
                    worker_id: id.clone(),
                    address: format!("{id}:8000"),
                    model: MODEL.to_string(),
                    block_size: BLOCK_SIZE,
                    epoch: 1,
                    worker_set: "burst".to_string(),
                };
                let stream = (i + 1) as u64;
                // Fresh ids and epoch 1: never refused.
                let _ = state.sidecar_snapshot_start(stream, &identity, &[], now);
                state.sidecar_snapshot_chunk(stream, id, &[], true, now);
                let _: LoadApplied = state.sidecar_load(
                    stream,
                    id,
                    crate::state::LoadView {
                        waiting: 0,
                        running: 0,
                        kv_usage: 0.0,
                        scrape_failed: false,
                        kv_capacity_tokens: 0,
                        gpus: Vec::new(),
                        lora_adapters: None,
                    },
                    now,
                );
            }
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            addrs.push(listener.local_addr()?);
            let svc = PeersService::new(state.clone(), false, None).into_server();
            let s = stop.clone();
            tokio::spawn(async move {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(incoming, s.cancelled_owned())
                    .await;
            });
            states.push(state);
        }
        if exchange {
            for (r, state) in states.iter().enumerate() {
                let others: BTreeSet<String> = addrs
                    .iter()
                    .enumerate()
                    .filter(|(o, _)| *o != r)
                    .map(|(_, a)| a.to_string())
                    .collect();
                let (_tx, rx) = watch::channel(others);
                let dialer = PeerDialer {
                    state: state.clone(),
                    targets: rx,
                    tls: None,
                };
                let s = stop.clone();
                tokio::spawn(async move {
                    // Keep the sender alive as long as the dialer.
                    let _tx = _tx;
                    dialer.run(s).await;
                });
            }
        }
        let c = Self {
            states,
            addrs,
            stop,
            workers: ids,
            exchange,
        };
        if exchange {
            let want = (replicas - 1) as i64;
            c.wait("peer streams open", |s| {
                s.metrics().peer_streams.with_label_values(&["in"]).get() == want
            })
            .await?;
        }
        Ok(c)
    }

    async fn wait(&self, what: &str, cond: impl Fn(&RouterState) -> bool) -> anyhow::Result<()> {
        let end = Instant::now() + Duration::from_secs(20);
        while !self.states.iter().all(&cond) {
            anyhow::ensure!(Instant::now() < end, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// Sends `requests` requests sharing a `prefix_tokens` prefix never seen before (each
    /// with its own `suffix_tokens` suffix), round-robin across the replicas, in waves of one
    /// request per replica; with the exchange on, each wave waits until every replica counts
    /// the others' placements of it (the exchange's lag stays below the requests' spacing).
    /// Nothing completes during the burst.
    pub async fn burst(
        &self,
        requests: usize,
        prefix_tokens: usize,
        suffix_tokens: usize,
        salt: u32,
    ) -> anyhow::Result<BurstOutcome> {
        let n = self.states.len();
        let mut out = BurstOutcome::default();
        for w in &self.workers {
            out.per_worker.insert(w.clone(), 0);
        }
        let prefix: Vec<u32> = (0..prefix_tokens as u32)
            .map(|t| 1 + (t.wrapping_mul(7919) ^ salt.wrapping_mul(104_729)) % 50_000)
            .collect();
        let mut i = 0;
        while i < requests {
            let wave = n.min(requests - i);
            let mut placed: Vec<(usize, u64)> = Vec::new();
            for r in 0..wave {
                let mut tokens = prefix.clone();
                tokens.extend((0..suffix_tokens as u32).map(|t| 60_000 + ((i as u32) << 10) + t));
                let input = token_input(&tokens, 128);
                let started = Instant::now();
                let picked = self.states[r].pick(&input, Instant::now());
                out.pick_time += started.elapsed();
                match picked {
                    Ok(p) => {
                        let count = out.per_worker.entry(p.worker.clone()).or_default();
                        if *count > 0 {
                            out.hits += 1;
                        }
                        *count += 1;
                        out.placed += 1;
                        placed.push((r, p.assignment.0));
                    }
                    Err(_) => out.refused += 1,
                }
                i += 1;
            }
            out.waves += 1;
            if self.exchange {
                let synced = Instant::now();
                let end = synced + Duration::from_secs(20);
                loop {
                    let all = placed.iter().all(|&(r, id)| {
                        let replica = self.states[r].replica_id().to_owned();
                        self.states
                            .iter()
                            .enumerate()
                            .filter(|(o, _)| *o != r)
                            .all(|(_, s)| s.holds_peer_placement(&replica, id))
                    });
                    if all {
                        break;
                    }
                    anyhow::ensure!(Instant::now() < end, "timed out waiting for the exchange");
                    tokio::task::yield_now().await;
                }
                out.sync_time += synced.elapsed();
            }
        }
        Ok(out)
    }
}

/// Figures of [`Cluster::throughput`].
#[derive(Clone, Debug, Default)]
pub struct Throughput {
    /// Requests routed, all replicas together.
    pub requests: usize,
    /// Wall time from the first pick to the last.
    pub wall: Duration,
    /// Median time of one pick.
    pub p50: Duration,
    /// 99th percentile time of one pick.
    pub p99: Duration,
}

impl Throughput {
    /// Routed requests per second, all replicas together.
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

impl Cluster {
    /// Every replica routes `per_replica` requests at once, each on a thread of its own (as
    /// separate processes would), with the exchange running: prompts of `prompt_tokens`
    /// tokens, a quarter of them a prefix shared by all, each request completing at once
    /// (first token, done) so that the pool stays idle.
    pub async fn throughput(
        &self,
        per_replica: usize,
        prompt_tokens: usize,
    ) -> anyhow::Result<Throughput> {
        let started = Instant::now();
        let mut tasks = Vec::new();
        for (r, state) in self.states.iter().enumerate() {
            let state = state.clone();
            tasks.push(tokio::task::spawn_blocking(move || {
                let mut times = Vec::with_capacity(per_replica);
                let shared = prompt_tokens / 4;
                for i in 0..per_replica {
                    let tokens: Vec<u32> = (0..prompt_tokens as u32)
                        .map(|t| {
                            if (t as usize) < shared {
                                1 + t
                            } else {
                                (((r * per_replica + i) as u32).wrapping_mul(65_521) ^ t)
                                    .wrapping_add(1)
                            }
                        })
                        .collect();
                    let input = token_input(&tokens, 64);
                    let t = Instant::now();
                    let picked = state.pick(&input, t);
                    times.push(t.elapsed());
                    if let Ok(p) = picked {
                        state.first_token(p.assignment, Some(0.05), Instant::now());
                        state.done(p.assignment, crate::state::Usage::default());
                    }
                }
                times
            }));
        }
        let mut times = Vec::new();
        for t in tasks {
            times.extend(t.await?);
        }
        let wall = started.elapsed();
        times.sort_unstable();
        let at = |q: f64| {
            times
                .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        Ok(Throughput {
            requests: times.len(),
            wall,
            p50: at(0.5),
            p99: at(0.99),
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A pick of `model` [`MODEL`] for a prompt given as token ids.
fn token_input(tokens: &[u32], max_tokens: u32) -> PickInput<'_> {
    PickInput {
        model: MODEL,
        prompt: Prompt::Tokens(tokens),
        cache_salt: None,
        lora: None,
        headers: None,
        resolved: None,
        exclude: &[],
        max_tokens: Some(max_tokens),
        tenant: None,
        labels: &[],
        seed: None,
    }
}
