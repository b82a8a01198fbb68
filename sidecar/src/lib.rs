//! kvroute-sidecar: runs next to vLLM in every worker pod and streams a compact summary of the
//! worker's KV cache and load to every router replica.
//!
//! ```text
//! vLLM --ZMQ PUB [topic, seq, msgpack]--> zmq::Subscriber --vllm_wire::decode_batch--> seq::SeqTracker
//!      <--ROUTER replay (DEALER)---------/                                          |
//!                                         hub::Hub { state::ResidentSet (vLLM hash -> kvroute hash) }
//! vLLM --/metrics--> scrape::Scraper --+                                            |
//! NVML ------------> gpu::GpuProbe ----+--> LoadSample --> hub --> push::Pusher per router --gRPC-->
//! admin: /metrics, /healthz
//! ```
//!
//! Pure modules: [`state`] (resident set, re-hashing), [`seq`] (gaps and restarts); vLLM's
//! wire format is the `kvroute-vllm-wire` crate. Adapters: [`zmq`], [`scrape`], [`gpu`],
//! [`push`], [`admin`].

pub mod admin;
pub mod gpu;
pub mod hub;
pub mod lora;
pub mod metrics;
pub mod push;
pub mod scrape;
pub mod seq;
pub mod state;
pub mod zmq;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::gpu::{DeviceFilter, GpuProbe};
use crate::hub::Hub;
use crate::metrics::SidecarMetrics;
use crate::push::{IdentityTemplate, PushConfig, RouterSet};
use crate::state::{ResidentSet, StateConfig};

/// Command-line flags of `kvroute sidecar` / `kvroute-sidecar`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// vLLM's KV-event PUB endpoint (connect), or where vLLM connects to (with --zmq-bind or a
    /// `*` host).
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_ZMQ_ENDPOINT",
        default_value = "tcp://127.0.0.1:5557"
    )]
    pub zmq_endpoint: String,
    /// Bind the SUB socket instead of connecting (vLLM's endpoint then has no `*`).
    #[arg(long, env = "KVROUTE_SIDECAR_ZMQ_BIND", default_value_t = false)]
    pub zmq_bind: bool,
    /// KV-event topic (vLLM `kv-events-config.topic`).
    #[arg(long, env = "KVROUTE_SIDECAR_TOPIC", default_value = "")]
    pub topic: String,
    /// vLLM's ROUTER replay endpoint; empty disables replay (gaps then resync).
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_REPLAY_ENDPOINT",
        default_value = "tcp://127.0.0.1:5657"
    )]
    pub replay_endpoint: String,
    /// vLLM's HTTP base URL, for /metrics.
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_VLLM_URL",
        default_value = "http://127.0.0.1:8000"
    )]
    pub vllm_url: String,
    /// How often vLLM's /metrics is scraped.
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_SCRAPE_INTERVAL_MS",
        default_value_t = 250
    )]
    pub scrape_interval_ms: u64,
    /// mTLS to the routers: a directory with tls.crt, tls.key (this sidecar's certificate,
    /// identity spiffe://kvroute.dev/ns/<namespace>/workerset/<name>) and ca.crt (the CAs
    /// that verify routers). Re-read when the files change; open streams are kept. Without
    /// it the streams are plaintext.
    #[arg(long, env = "KVROUTE_SIDECAR_ROUTER_TLS_DIR")]
    pub router_tls_dir: Option<std::path::PathBuf>,
    /// The name the routers' certificates must carry (e.g. the router Service's DNS name);
    /// empty: the host of each router endpoint.
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_ROUTER_TLS_SERVER_NAME",
        default_value = ""
    )]
    pub router_tls_server_name: String,
    /// The local IP the router streams come from (default: the OS chooses). With mTLS the
    /// router accepts a worker's stream only from its pod IP; set this where the OS would pick
    /// another source address (several addresses on one host, the e2e harness's loopback pods).
    #[arg(long, env = "KVROUTE_SIDECAR_ROUTER_SOURCE_IP")]
    pub router_source_ip: Option<std::net::IpAddr>,
    /// How often --router-tls-dir is checked for changed files, in milliseconds.
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_TLS_RELOAD_INTERVAL_MS",
        default_value_t = 5_000
    )]
    pub tls_reload_interval_ms: u64,
    /// Router Ingest endpoint (repeatable), e.g. http://router:9000.
    #[arg(long = "router", env = "KVROUTE_SIDECAR_ROUTER", value_delimiter = ',')]
    pub routers: Vec<String>,
    /// host:port of a headless Service whose addresses are all routers, re-resolved periodically.
    #[arg(long, env = "KVROUTE_SIDECAR_ROUTER_DNS")]
    pub router_dns: Option<String>,
    /// How often --router-dns is re-resolved, in milliseconds.
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_ROUTER_DNS_INTERVAL_MS",
        default_value_t = 10_000
    )]
    pub router_dns_interval_ms: u64,
    /// Stable worker id (default: "<namespace>/<pod>", or the worker address).
    #[arg(long, env = "KVROUTE_SIDECAR_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Name of the worker's pod; with the namespace, the default worker id.
    #[arg(long, env = "KVROUTE_SIDECAR_POD_NAME", default_value = "")]
    pub pod_name: String,
    /// Namespace of the worker's pod.
    #[arg(long, env = "KVROUTE_SIDECAR_POD_NAMESPACE", default_value = "")]
    pub pod_namespace: String,
    /// host:port where routers reach this worker's vLLM HTTP API.
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_WORKER_ADDRESS",
        default_value = "127.0.0.1:8000"
    )]
    pub worker_address: String,
    /// Served model name (seeds kvroute's block hashes; must match what the router uses).
    #[arg(long, env = "KVROUTE_SIDECAR_MODEL")]
    pub model: String,
    /// LoRA adapter assumed when an event names none.
    #[arg(long, env = "KVROUTE_SIDECAR_LORA")]
    pub lora: Option<String>,
    /// How often vLLM's /v1/models is polled for the LoRA adapters it serves (adapters loaded
    /// at runtime appear within it, or with their first KV event); 0 turns polling off.
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_LORA_POLL_INTERVAL_MS",
        default_value_t = 5_000
    )]
    pub lora_poll_interval_ms: u64,
    /// vLLM's `--api-key`, when vLLM requires one on /v1/* (for the adapter poll).
    #[arg(long, env = "KVROUTE_SIDECAR_VLLM_API_KEY", hide_env_values = true)]
    pub vllm_api_key: Option<String>,
    /// vLLM block size; learned from events or vLLM's metrics when absent.
    #[arg(long, env = "KVROUTE_SIDECAR_BLOCK_SIZE")]
    pub block_size: Option<u32>,
    /// InferenceWorkerSet the worker belongs to.
    #[arg(long, env = "KVROUTE_SIDECAR_WORKER_SET", default_value = "")]
    pub worker_set: String,
    /// Admin HTTP address (/metrics, /healthz).
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_ADMIN_ADDR",
        default_value = "0.0.0.0:9090"
    )]
    pub admin_addr: SocketAddr,
    /// Most blocks queued per router before deltas are dropped for a snapshot.
    #[arg(long, env = "KVROUTE_SIDECAR_QUEUE_CAP_BLOCKS", default_value_t = 1 << 20)]
    pub queue_cap_blocks: usize,
    /// Most blocks per report (snapshot chunk or delta); values above 131072 (128 Ki, what
    /// fits the router's 4 MiB message cap with margin) are lowered to it.
    #[arg(long, env = "KVROUTE_SIDECAR_MAX_BLOCKS_PER_REPORT", default_value_t = 64 * 1024)]
    pub max_blocks_per_report: usize,
    /// Longest a replay may take before the state is resynced instead.
    #[arg(
        long,
        env = "KVROUTE_SIDECAR_REPLAY_TIMEOUT_MS",
        default_value_t = 5_000
    )]
    pub replay_timeout_ms: u64,
    /// Skip NVML (no GPU stats).
    #[arg(long, env = "KVROUTE_SIDECAR_NO_GPU", default_value_t = false)]
    pub no_gpu: bool,
    /// File naming the engine container's GPUs (UUIDs or indices, as in
    /// `NVIDIA_VISIBLE_DEVICES`); GPU stats cover only those. Empty: every GPU NVML shows.
    /// The operator sets it (docs/gpu.md).
    #[arg(long, env = "KVROUTE_SIDECAR_GPU_DEVICES_FILE", default_value = "")]
    pub gpu_devices_file: String,
    /// Report this many simulated, healthy GPUs instead of asking NVML (for the mock engine
    /// in demos and tests, so GPU dashboards have data; docs/observability.md). 0: off.
    #[arg(long, env = "KVROUTE_SIDECAR_MOCK_GPUS", default_value_t = 0)]
    pub mock_gpus: u32,
}

/// A started sidecar: its tasks, the shared hub and where the admin server listens.
pub struct Running {
    /// Where the admin HTTP server listens (the port the OS chose for port 0).
    pub admin_addr: SocketAddr,
    /// The bound SUB endpoint when the sidecar binds (e.g. with port 0).
    pub zmq_bound: Option<String>,
    /// The resident set and router queues the tasks share.
    pub hub: Arc<Hub>,
    /// The sidecar's metrics.
    pub metrics: SidecarMetrics,
    /// Cancel it to stop every task.
    pub shutdown: CancellationToken,
    tasks: JoinSet<(&'static str, anyhow::Result<()>)>,
}

impl Running {
    /// How long the tasks get to finish after shutdown (streams close gracefully within it)
    /// before the rest are aborted.
    pub const STOP_GRACE: Duration = Duration::from_secs(5);

    /// Waits until a critical task ends (an error), or shutdown; then lets the other tasks
    /// finish (each router stream is closed gracefully) for up to [`Self::STOP_GRACE`].
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let result = match self.tasks.join_next().await {
            Some(Ok((name, Ok(())))) if self.shutdown.is_cancelled() => {
                tracing::debug!(task = name, "stopped");
                Ok(())
            }
            Some(Ok((name, Ok(())))) => Err(anyhow::anyhow!("task {name} ended unexpectedly")),
            Some(Ok((name, Err(e)))) => Err(e.context(format!("task {name} failed"))),
            Some(Err(e)) => Err(anyhow::anyhow!("task panicked: {e}")),
            None => Ok(()),
        };
        self.shutdown.cancel();
        let drained = tokio::time::timeout(Self::STOP_GRACE, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("tasks still running after the stop grace; aborting them");
        }
        self.tasks.shutdown().await;
        result
    }
}

/// Starts every task and returns once the sockets are bound.
pub async fn start(args: Args) -> anyhow::Result<Running> {
    let Args {
        zmq_endpoint,
        zmq_bind,
        topic,
        replay_endpoint,
        vllm_url,
        scrape_interval_ms,
        router_tls_dir,
        router_tls_server_name,
        router_source_ip,
        tls_reload_interval_ms,
        routers,
        router_dns,
        router_dns_interval_ms,
        worker_id,
        pod_name,
        pod_namespace,
        worker_address,
        model,
        lora,
        lora_poll_interval_ms,
        vllm_api_key,
        block_size,
        worker_set,
        admin_addr,
        queue_cap_blocks,
        max_blocks_per_report,
        replay_timeout_ms,
        no_gpu,
        gpu_devices_file,
        mock_gpus,
    } = args;
    anyhow::ensure!(
        !routers.is_empty() || router_dns.is_some(),
        "give at least one --router or --router-dns"
    );
    let worker_id = worker_id.unwrap_or_else(|| {
        if pod_name.is_empty() {
            worker_address.clone()
        } else {
            format!("{pod_namespace}/{pod_name}")
        }
    });
    let registry = prometheus::Registry::new();
    let metrics = SidecarMetrics::register(&registry).context("register metrics")?;
    let state = ResidentSet::new(StateConfig {
        model: model.clone(),
        default_lora: lora,
        block_size,
        max_blocks: 16 << 20,
    });
    let hub = Arc::new(Hub::new(
        state,
        initial_epoch(SystemTime::now()),
        queue_cap_blocks,
    ));
    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();

    let tls = match router_tls_dir {
        Some(dir) => {
            let config = kvroute_tls::WatchedClient::client(dir.clone())
                .with_context(|| format!("--router-tls-dir {}", dir.display()))?;
            tracing::info!(dir = %dir.display(), identity = ?config.identity().map(|i| i.uri()), "router streams use mTLS");
            let name =
                (!router_tls_server_name.is_empty()).then_some(router_tls_server_name.as_str());
            let mut tls = kvroute_tls::ClientTls::new(config.clone(), name)
                .context("--router-tls-server-name")?;
            if let Some(ip) = router_source_ip {
                tls = tls.bind(ip);
            }
            // The watch ends with the sidecar; it never fails (bad files are logged, kept out).
            let reloads = metrics.tls_reloads.clone();
            tokio::spawn(config.watch(
                Duration::from_millis(tls_reload_interval_ms.max(10)),
                shutdown.clone(),
                move |outcome| reloads.with_label_values(&[outcome.label()]).inc(),
            ));
            Some(tls)
        }
        None => {
            tracing::warn!(
                "router streams are plaintext: pass --router-tls-dir outside development"
            );
            None
        }
    };

    let subscriber = zmq::Subscriber {
        config: zmq::ZmqConfig {
            endpoint: zmq_endpoint.clone(),
            bind: zmq_bind,
            topic,
            replay_endpoint: (!replay_endpoint.is_empty()).then_some(replay_endpoint),
            replay_timeout: Duration::from_millis(replay_timeout_ms),
        },
        hub: hub.clone(),
        metrics: metrics.clone(),
    };
    let (sub, zmq_bound) = subscriber
        .open()
        .await
        .with_context(|| format!("open SUB socket {zmq_endpoint}"))?;
    let connect = zmq_bound.is_none();
    let token = shutdown.clone();
    tasks.spawn(tracing::Instrument::instrument(
        async move { ("zmq", subscriber.run(sub, connect, token).await) },
        tracing::info_span!("zmq"),
    ));

    let router_set = RouterSet {
        static_routers: routers,
        dns: router_dns,
        resolve_every: Duration::from_millis(router_dns_interval_ms.max(100)),
        hub: hub.clone(),
        identity: IdentityTemplate {
            worker_id,
            pod: pod_name,
            namespace: pod_namespace,
            address: worker_address,
            model,
            worker_set,
        },
        config: PushConfig {
            max_blocks_per_report: max_blocks_per_report.max(1),
            tls,
            source_ip: router_source_ip,
            ..PushConfig::default()
        },
        metrics: metrics.clone(),
    };
    let token = shutdown.clone();
    tasks.spawn(tracing::Instrument::instrument(
        async move {
            router_set.run(token).await;
            ("routers", Ok(()))
        },
        tracing::info_span!("routers"),
    ));

    let gpu = if mock_gpus > 0 {
        GpuProbe::with_backend(
            Box::new(gpu::SimulatedGpus::new(mock_gpus)),
            DeviceFilter::All,
        )
    } else if no_gpu {
        GpuProbe::disabled()
    } else {
        let filter = if gpu_devices_file.is_empty() {
            DeviceFilter::All
        } else {
            DeviceFilter::File(gpu_devices_file.into())
        };
        tokio::task::spawn_blocking(move || GpuProbe::init(filter)).await?
    };
    if lora_poll_interval_ms > 0 {
        let poller = lora::Poller {
            url: vllm_url.clone(),
            interval: Duration::from_millis(lora_poll_interval_ms),
            api_key: vllm_api_key,
            hub: hub.clone(),
            metrics: metrics.clone(),
        };
        let token = shutdown.clone();
        tasks.spawn(tracing::Instrument::instrument(
            async move {
                poller.run(token).await;
                ("lora", Ok(()))
            },
            tracing::info_span!("lora"),
        ));
    }
    let scraper = scrape::Scraper {
        url: vllm_url,
        interval: Duration::from_millis(scrape_interval_ms),
        hub: hub.clone(),
        metrics: metrics.clone(),
        gpu,
    };
    let token = shutdown.clone();
    tasks.spawn(tracing::Instrument::instrument(
        async move {
            scraper.run(token).await;
            ("scrape", Ok(()))
        },
        tracing::info_span!("scrape"),
    ));

    let listener = tokio::net::TcpListener::bind(admin_addr)
        .await
        .with_context(|| format!("bind admin {admin_addr}"))?;
    let admin_addr = listener.local_addr()?;
    let app = admin::router(admin::AdminState {
        registry,
        metrics: metrics.clone(),
        hub: hub.clone(),
    });
    let token = shutdown.clone();
    tasks.spawn(async move {
        let r = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .with_graceful_shutdown(token.cancelled_owned())
        .await;
        ("admin", r.map_err(anyhow::Error::from))
    });
    tracing::info!(%admin_addr, zmq = %zmq_endpoint, "sidecar started");
    Ok(Running {
        admin_addr,
        zmq_bound,
        hub,
        metrics,
        shutdown,
        tasks,
    })
}

/// Runs the sidecar until a critical task fails, SIGTERM (the kubelet stopping the pod) or
/// Ctrl-C; on a signal the router streams are closed gracefully and the exit status is 0.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let running = start(args).await?;
    let stop = stop_signal().context("listen for SIGTERM")?;
    let shutdown = running.shutdown.clone();
    tokio::spawn(async move {
        let signal = stop.await;
        tracing::info!(signal, "stopping: closing the router streams");
        shutdown.cancel();
    });
    running.wait().await
}

/// Resolves with the signal's name on the first SIGTERM or Ctrl-C (SIGINT). The handlers are
/// installed before this returns, so a signal that arrives at once is not missed.
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = &'static str>> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let ctrl_c = tokio::signal::ctrl_c();
    Ok(async move {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = ctrl_c => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = ctrl_c.await;
            "ctrl-c"
        }
    })
}

/// A fresh epoch from the start time: later sidecar starts get larger epochs.
pub fn initial_epoch(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
