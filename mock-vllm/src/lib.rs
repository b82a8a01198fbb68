//! kvroute-mock-vllm: a process that clients, sidecars and routers cannot tell from a vLLM 0.33
//! server except by speed and by the text it generates. No GPU: a pure engine model runs in
//! simulated time and a driver paces it against the wall clock (`--speedup`).
//!
//! ```text
//!  HTTP (server.rs, openai.rs) --text.rs--> driver.rs (tokio; wall clock x speedup)
//!        ^ SSE / JSON <---- ReqEvent ----------+  | step(now)
//!                                              |  v
//!   ZMQ PUB + ROUTER replay <-- vllm-wire <----+ engine (pure: scheduler, KV cache, profile)
//!   (kv_publisher.rs)  (encode_batch, frames)      vllm_hash.rs (vLLM's block hashes)
//! ```
//!
//! [`engine`] is the pure model, also driven directly by the bench simulation and cloned by the
//! oracle policy; [`vllm_hash`] reproduces vLLM's block hashes. The engine emits the
//! `kvroute-vllm-wire` event type, which that crate writes as vLLM's msgpack batches byte for
//! byte.

pub mod driver;
pub mod engine;
pub mod kv_publisher;
pub mod lora;
pub mod metrics;
pub mod openai;
pub mod server;
pub mod text;
pub mod tls;
pub mod vllm_args;
pub mod vllm_hash;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::Context as _;
use axum::serve::ListenerExt as _;
use tokio::sync::mpsc;
use tracing::{info, warn};

use engine::{DEFAULT_PROFILE, Engine, EngineConfig, Profile};
use kv_publisher::{KvEventsConfig, Publisher, PublisherEndpoints};
use vllm_hash::HashAlgo;

/// Command-line arguments: vLLM's names where vLLM has the flag, so `engine: mock` can pass
/// a real vLLM argument list. Unknown vLLM flags are accepted and ignored with a warning.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_HOST", default_value = "0.0.0.0")]
    pub host: String,
    /// HTTP port.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_PORT", default_value_t = 8000)]
    pub port: u16,
    /// Model name(s) the server answers to (default: `--model`).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_SERVED_MODEL_NAME", num_args = 1.., value_delimiter = ',')]
    pub served_model_name: Vec<String>,
    /// Model name or path (reported as `root` / `model_path`; a directory with tokenizer.json
    /// doubles as `--tokenizer`).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_MODEL", default_value = "mock-model")]
    pub model: String,
    /// Tokens per KV block (default: the profile's, 16).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_BLOCK_SIZE")]
    pub block_size: Option<usize>,
    /// Longest prompt + output (default: the profile's).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Token budget per step (default: the profile's, 2048).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_MAX_NUM_BATCHED_TOKENS")]
    pub max_num_batched_tokens: Option<usize>,
    /// Most running sequences (default: the profile's, 256).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_MAX_NUM_SEQS")]
    pub max_num_seqs: Option<usize>,
    /// KV blocks, overriding the profile's capacity (vLLM `--num-gpu-blocks-override`).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_NUM_GPU_BLOCKS_OVERRIDE")]
    pub num_gpu_blocks_override: Option<usize>,
    /// vLLM's KV events JSON, e.g. `{"enable_kv_cache_events":true,"publisher":"zmq",
    /// "endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5657","topic":""}`.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_KV_EVENTS_CONFIG")]
    pub kv_events_config: Option<String>,
    /// Report `usage.prompt_tokens_details.cached_tokens`.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_ENABLE_PROMPT_TOKENS_DETAILS")]
    pub enable_prompt_tokens_details: bool,
    /// Accepted for compatibility (prefix caching is on by default).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_ENABLE_PREFIX_CACHING")]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_NO_ENABLE_PREFIX_CACHING")]
    pub no_enable_prefix_caching: bool,
    /// Block hash of the published events: sha256_cbor or sha256 (pickle).
    #[arg(
        long,
        env = "KVROUTE_MOCK_VLLM_PREFIX_CACHING_HASH_ALGO",
        default_value = "sha256_cbor"
    )]
    pub prefix_caching_hash_algo: String,
    /// Tokenizer directory (tokenizer.json + tokenizer_config.json). Without one, ids are bytes.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,
    /// Timing profile: a built-in name (l40s-qwen3-32b-fp8, tiny) or a JSON/YAML file.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_PROFILE", default_value = DEFAULT_PROFILE)]
    pub profile: String,
    /// Run the simulated clock this many times faster than the wall clock.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_SPEEDUP", default_value_t = 1.0)]
    pub speedup: f64,
    /// Seed of the generated tokens.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_SEED", default_value_t = 0)]
    pub seed: u64,
    /// Chance per generated token of EOS (requests with ignore_eos never stop early).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_EOS_PROBABILITY", default_value_t = 0.0)]
    pub eos_probability: f64,
    /// Restart the engine (cache empty, event seq 0) after this many finished requests.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_RESTART_AFTER")]
    pub restart_after: Option<u64>,
    /// Data-parallel rank written into event batches.
    #[arg(
        long,
        env = "KVROUTE_MOCK_VLLM_DATA_PARALLEL_RANK",
        default_value_t = 0
    )]
    pub data_parallel_rank: u32,
    /// Require this key on `/v1/*` (vLLM's `--api-key`): `Authorization: Bearer <key>`, or
    /// `x-api-key: <key>` as Anthropic-style clients send it; 401 otherwise. Lets the mock
    /// stand in for a cloud provider that checks its key.
    #[arg(long, env = "KVROUTE_MOCK_VLLM_API_KEY")]
    pub api_key: Option<String>,
    /// Serve HTTPS with this PEM private key (vLLM's `--ssl-keyfile`; needs --ssl-certfile).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_SSL_KEYFILE", requires = "ssl_certfile")]
    pub ssl_keyfile: Option<PathBuf>,
    /// Serve HTTPS with this PEM certificate chain (vLLM's `--ssl-certfile`).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_SSL_CERTFILE", requires = "ssl_keyfile")]
    pub ssl_certfile: Option<PathBuf>,
    /// LoRA adapters to serve, as vLLM spells them: `name=path`, or a JSON object
    /// `{"name": .., "path": .., "base_model_name": ..}` (docs/lora.md). A request whose
    /// `model` names one runs "with" it: its KV blocks are hashed and published under it.
    #[arg(long, num_args = 1.., value_parser = lora::parse_module)]
    pub lora_modules: Vec<lora::LoraModule>,
    /// Accepted for compatibility (vLLM needs it to serve adapters; the mock always can).
    #[arg(long, env = "KVROUTE_MOCK_VLLM_ENABLE_LORA")]
    pub enable_lora: bool,
    /// Serve `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`; read from vLLM's own
    /// environment variable, as vLLM does.
    #[arg(
        long,
        env = "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        value_parser = clap::builder::BoolishValueParser::new(),
        default_value_t = false
    )]
    pub allow_runtime_lora_updating: bool,
    /// Other vLLM arguments: accepted and ignored.
    #[arg(
        num_args = 0..,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        hide = true,
        value_name = "VLLM_ARGS"
    )]
    pub ignored: Vec<String>,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 0,
            served_model_name: Vec::new(),
            model: "mock-model".into(),
            block_size: None,
            max_model_len: None,
            max_num_batched_tokens: None,
            max_num_seqs: None,
            num_gpu_blocks_override: None,
            kv_events_config: None,
            enable_prompt_tokens_details: false,
            enable_prefix_caching: false,
            no_enable_prefix_caching: false,
            prefix_caching_hash_algo: "sha256_cbor".into(),
            tokenizer: None,
            profile: DEFAULT_PROFILE.into(),
            speedup: 1.0,
            seed: 0,
            eos_probability: 0.0,
            restart_after: None,
            data_parallel_rank: 0,
            api_key: None,
            ssl_keyfile: None,
            ssl_certfile: None,
            lora_modules: Vec::new(),
            enable_lora: false,
            allow_runtime_lora_updating: false,
            ignored: Vec::new(),
        }
    }
}

/// A started mock server (used by `run` and by tests).
pub struct RunningServer {
    /// The HTTP address actually bound.
    pub http_addr: SocketAddr,
    /// The KV event endpoints actually bound or connected.
    pub endpoints: PublisherEndpoints,
    /// Sends commands to the engine driver (e.g. [`driver::Cmd::Restart`]).
    pub cmd: mpsc::UnboundedSender<driver::Cmd>,
    /// The HTTP server task; it ends when the server fails, or after [`RunningServer::drain`]
    /// once in-flight requests are done.
    pub http: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Starts a graceful shutdown of the HTTP server (see [`RunningServer::drain`]).
    pub drain: tokio::sync::watch::Sender<bool>,
}

/// Builds the engine configuration from the flags and the profile.
pub fn engine_config(
    args: &Args,
    profile: &Profile,
    text: &text::TextModel,
) -> anyhow::Result<EngineConfig> {
    let mut cfg = EngineConfig::from_profile(profile);
    if let Some(bs) = args.block_size {
        anyhow::ensure!(bs > 0, "--block-size must be > 0");
        cfg = cfg.with_block_size(profile, bs);
    }
    if let Some(n) = args.num_gpu_blocks_override {
        cfg.num_blocks = n.max(1);
    }
    if let Some(n) = args.max_model_len {
        cfg.max_model_len = n.max(1);
    }
    if let Some(n) = args.max_num_batched_tokens {
        cfg.max_num_batched_tokens = n.max(1);
    }
    if let Some(n) = args.max_num_seqs {
        cfg.max_num_seqs = n.max(1);
    }
    cfg.enable_prefix_caching = !args.no_enable_prefix_caching;
    cfg.hash_algo = HashAlgo::parse(&args.prefix_caching_hash_algo).with_context(|| {
        format!(
            "--prefix-caching-hash-algo {}: the mock supports sha256_cbor and sha256",
            args.prefix_caching_hash_algo
        )
    })?;
    cfg.seed = args.seed;
    cfg.sample_token_range = text.sample_range();
    cfg.eos_token_id = text.eos_token_id();
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.eos_probability),
        "--eos-probability must be within 0..=1"
    );
    cfg.eos_probability = args.eos_probability;
    Ok(cfg)
}

fn load_text_model(args: &Args) -> anyhow::Result<(text::TextModel, Option<String>)> {
    let dir = match &args.tokenizer {
        Some(d) => Some(d.clone()),
        None => {
            let p = PathBuf::from(&args.model);
            p.join("tokenizer.json").is_file().then_some(p)
        }
    };
    match dir {
        Some(d) => {
            let tok = kvroute_tokenization::Tokenizer::from_dir(&d)
                .with_context(|| format!("loading tokenizer from {}", d.display()))?;
            Ok((
                text::TextModel::Hf(Arc::new(tok)),
                Some(d.display().to_string()),
            ))
        }
        None => {
            warn!("no --tokenizer: token ids are UTF-8 bytes and chat uses a plain template");
            Ok((text::TextModel::Bytes, None))
        }
    }
}

/// Starts the engine driver, the KV event publisher and the HTTP server.
pub async fn start(args: Args) -> anyhow::Result<RunningServer> {
    if !args.ignored.is_empty() {
        warn!(args = ?args.ignored, "ignoring vLLM arguments the mock does not model");
    }
    anyhow::ensure!(
        args.speedup.is_finite() && args.speedup > 0.0,
        "--speedup must be a positive number"
    );
    let profile = Profile::load(&args.profile).context("loading --profile")?;
    let (text, tokenizer_path) = load_text_model(&args)?;
    let config = engine_config(&args, &profile, &text)?;
    let served = if args.served_model_name.is_empty() {
        vec![args.model.clone()]
    } else {
        args.served_model_name.clone()
    };
    let metrics = metrics::Metrics::register(&served[0]).context("registering metrics")?;

    let kv_config = match &args.kv_events_config {
        Some(json) => KvEventsConfig::parse(json).context("parsing --kv-events-config")?,
        None => KvEventsConfig::default(),
    };
    let publisher = if kv_config.publishes() {
        Some(Publisher::start(&kv_config, args.data_parallel_rank).await?)
    } else {
        None
    };
    let endpoints = publisher
        .as_ref()
        .map(|p| p.endpoints.clone())
        .unwrap_or_default();

    let mut config = config;
    config.kv_events = publisher.is_some();
    let engine = Engine::new(profile.clone(), config);
    let unix_origin = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    metrics.set_start_time(unix_origin);
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (driver, snapshot) = driver::Driver::new(
        engine,
        cmd_rx,
        metrics.clone(),
        publisher.as_ref().map(|p| p.tx.clone()),
        driver::Clock::new(args.speedup, unix_origin),
        args.restart_after,
    );
    tokio::spawn(driver.run());

    let model_path = tokenizer_path.clone().unwrap_or_else(|| args.model.clone());
    let state = Arc::new(server::AppState {
        cmd: cmd_tx.clone(),
        snapshot,
        metrics,
        text,
        served,
        model_path,
        tokenizer_path,
        prompt_tokens_details: args.enable_prompt_tokens_details,
        profile: profile.name.clone(),
        speedup: args.speedup,
        endpoints: endpoints.clone(),
        next_id: AtomicU64::new(1),
        created: unix_origin as u64,
        adapters: parking_lot::RwLock::new(lora::Adapters::new(args.lora_modules.clone())),
        runtime_lora_updating: args.allow_runtime_lora_updating,
        fault_status: std::sync::atomic::AtomicU16::new(0),
        drop_events: publisher.as_ref().map(|p| p.drop_live.clone()),
    });
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let http_addr = listener.local_addr()?;
    let app = match &args.api_key {
        Some(key) => server::require_api_key(server::router(state), key),
        None => server::router(state),
    };
    let tls = match (&args.ssl_keyfile, &args.ssl_certfile) {
        (Some(key), Some(cert)) => Some(tls::acceptor(key, cert)?),
        _ => None,
    };
    // Like vLLM's server on SIGTERM: stop accepting, let in-flight requests finish.
    let (drain, mut draining) = tokio::sync::watch::channel(false);
    let http = match tls {
        None => tokio::spawn(async move {
            // vLLM's server (uvicorn on uvloop or asyncio) sets TCP_NODELAY on every
            // connection; without it a streamed token written right after the previous one
            // waits for the client's delayed ACK (Nagle), tens of milliseconds.
            let listener = listener.tap_io(|tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %e, "TCP_NODELAY not set");
                }
            });
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = draining.wait_for(|d| *d).await;
                })
                .await
        }),
        Some(acceptor) => tokio::spawn(tls::serve(listener, acceptor, app, draining)),
    };
    info!(%http_addr, profile = %profile.name, speedup = args.speedup, "mock vLLM serving");
    Ok(RunningServer {
        http_addr,
        endpoints,
        cmd: cmd_tx,
        http,
        drain,
    })
}

#[derive(clap::Parser)]
#[command(name = "kvroute-mock-vllm")]
struct Reparse {
    #[command(flatten)]
    args: Args,
}

/// When clap stopped at an unknown flag, parses the process's command line again without the
/// unknown flags so that known flags after them still count.
fn rescue_known_flags(args: Args) -> Args {
    use clap::{CommandFactory as _, Parser as _};
    if args.ignored.is_empty() {
        return args;
    }
    let argv: Vec<String> = std::env::args().collect();
    // `kvroute mock-vllm ...` or `kvroute-mock-vllm ...`: the tokens after the command name.
    let start = if argv.get(1).is_some_and(|a| a == "mock-vllm") {
        2
    } else {
        1
    };
    let known: Vec<String> = Reparse::command()
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    let (kept, dropped) = vllm_args::filter_known(argv.get(start..).unwrap_or(&[]), &known);
    let mut full = vec!["kvroute-mock-vllm".to_string()];
    full.extend(kept);
    match Reparse::try_parse_from(&full) {
        Ok(mut r) => {
            r.args.ignored = dropped;
            r.args
        }
        Err(e) => {
            warn!(error = %e, "could not re-parse the command line without unknown flags");
            args
        }
    }
}

/// Longest wait for in-flight requests after SIGTERM.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs the mock worker until Ctrl-C / SIGTERM (after in-flight requests finish); SIGHUP
/// restarts the engine.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    let args = rescue_known_flags(args);
    let server = start(args).await?;
    let RunningServer {
        cmd, http, drain, ..
    } = server;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::pin!(http);
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = terminate.recv() => {
                // As vLLM does: no new requests, the ones in flight finish (bounded).
                info!("SIGTERM: finishing in-flight requests");
                let _ = drain.send(true);
                let _ = tokio::time::timeout(DRAIN_LIMIT, &mut http).await;
                return Ok(());
            }
            _ = hangup.recv() => {
                info!("SIGHUP: restarting the engine");
                let _ = cmd.send(driver::Cmd::Restart);
            }
            res = &mut http => {
                return match res {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e).context("HTTP server failed"),
                    Err(e) => Err(e).context("HTTP server task failed"),
                };
            }
        }
    }
}
