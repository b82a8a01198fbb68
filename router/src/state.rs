//! The router's shared state: the routing core (KV index, TTFT predictor, assignments, policy)
//! behind one lock, the worker and model view from discovery, sidecar stream bookkeeping,
//! configuration and metrics. Every adapter (ingest, discovery, gateway, pick API, admin)
//! holds a [`RouterState`] clone and calls its synchronous methods; none of them holds a lock
//! across an `.await`.
//!
//! ```text
//! discovery --set_catalog--------------+
//! ingest ----sidecar_* (snapshot/delta/load/closed)
//!                                      v
//!                    RouterState { RwLock<Inner{ core, catalog, sidecars }> , metrics }
//!                                      ^
//! gateway / Picker --pick / first_token / done / abort ; admin --explain / workers
//! ```
//!
//! Tokenization happens here, not in the gateway: callers pass the request ([`Prompt`]) and
//! the state renders and tokenizes it with the model's tokenizer (`--tokenizer MODEL=DIR`, one
//! default `--tokenizer DIR`, or the source discovery names: [`crate::tokenizer_registry`]),
//! so the gateway, the gRPC Picker and `/debug/explain` make identical decisions. Callers that already have token ids pass [`Prompt::Tokens`].
//!
//! Routability: a worker is a candidate for a model when (1) discovery lists it as ready
//! (static file: listed in a WorkerSet's `status.workers`; Kubernetes: its pod is Ready) --
//! or, only with `--route-unlisted`, it is merely reported by a sidecar -- and (2) its sidecar
//! has completed at least one snapshot. A worker whose sidecar stream ended or whose reports
//! are older than `stale_after` stays a candidate but is *stale*: the core neither trusts its
//! cache as warm nor as empty. A sidecar reporting a worker that discovery does not list is
//! tracked (visible in `/debug/workers`, counted as `unlisted`) but never routed to unless
//! `--route-unlisted` is set.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use serde::Serialize;

use kvroute_tokenization::{ChatRequest, PromptInput, TokenizeError};
use serde::Deserialize;

use crate::metrics::RouterMetrics;
use crate::routing::{
    AssignmentId, Candidate, CoreConfig, Decision, LoadSample, Policy, PredictedTtft,
    PredictedTtftConfig, PredictorConfig, RouteRequest, RoutingCore, WorkerId, policy_by_name,
};
use crate::tokenizer_registry::{Lookup, Tokenizers};

/// Router settings the state needs (from flags).
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// Policy name (`kvroute`, `random`, `round-robin`, ...; see `routing::policies`).
    pub policy: String,
    /// Near-tie margin of the kvroute policy, seconds.
    pub tie_margin_s: f64,
    /// Seed of the policy's RNG (give each replica its own).
    pub seed: u64,
    /// Assignments not released within this time expire.
    pub assignment_ttl: Duration,
    /// A worker whose last sidecar report is older than this is stale.
    pub stale_after: Duration,
    /// Largest accepted request body (the gateway answers 413 above it).
    pub max_body_bytes: usize,
    /// Route to workers that only a sidecar reports (not listed by discovery).
    pub route_unlisted: bool,
    /// Tokenizer directories: per served/backend model, plus an optional default.
    pub tokenizers: TokenizerDirs,
    /// Prior of the TTFT predictor.
    pub predictor: PredictorConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            policy: "kvroute".into(),
            tie_margin_s: 0.02,
            seed: 0,
            assignment_ttl: Duration::from_secs(600),
            stale_after: Duration::from_secs(30),
            max_body_bytes: 16 << 20,
            route_unlisted: false,
            tokenizers: TokenizerDirs::default(),
            predictor: PredictorConfig::default(),
        }
    }
}

/// Where each model's tokenizer lives.
#[derive(Clone, Debug, Default)]
pub struct TokenizerDirs {
    /// `--tokenizer DIR`: used for every model without its own entry.
    pub default: Option<PathBuf>,
    /// `--tokenizer MODEL=DIR`.
    pub per_model: BTreeMap<String, PathBuf>,
}

impl TokenizerDirs {
    /// The directory for `model`, if any.
    pub fn dir_for(&self, model: &str) -> Option<&PathBuf> {
        self.per_model.get(model).or(self.default.as_ref())
    }
}

// ------------------------------------------------------------------------------------------
// Discovery view
// ------------------------------------------------------------------------------------------

/// Everything discovery knows: pools (model names and aliases) and workers. Replaced as a
/// whole on every discovery change ([`RouterState::set_catalog`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Catalog {
    /// InferencePools.
    pub pools: Vec<PoolView>,
    /// Workers of InferenceWorkerSets.
    pub workers: Vec<DiscoveredWorker>,
}

/// One InferencePool as the router uses it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoolView {
    /// `namespace/name`.
    pub name: String,
    /// Client-facing model names of the pool: the backend model names themselves and aliases.
    pub models: Vec<ServedModel>,
    /// Names of the InferenceWorkerSets whose workers serve the pool (empty: any worker of
    /// the model).
    pub worker_sets: Vec<String>,
}

/// A client-facing model name.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServedModel {
    /// The name clients send.
    pub name: String,
    /// The model name the workers serve (the same as `name` unless it is an alias).
    pub backend_model: String,
}

/// A worker discovery knows about.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DiscoveredWorker {
    /// Stable id (`namespace/pod`); sidecars report the same id.
    pub id: String,
    /// host:port of its OpenAI-compatible API.
    pub address: String,
    /// Model it serves (served model name).
    pub model: String,
    /// Its InferenceWorkerSet.
    pub worker_set: String,
    /// Pod Ready (always true for the static file).
    pub ready: bool,
}

/// A model as `GET /v1/models` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModelInfo {
    /// The client-facing name.
    pub id: String,
    /// The model the workers serve.
    pub backend_model: String,
    /// The pool it comes from (`None` for models known only from workers).
    pub pool: Option<String>,
}

/// Where a client-facing model name goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The model name to send to workers (rewrite the body when it differs).
    pub backend_model: String,
    /// The pool, if the name came from one.
    pub pool: Option<String>,
}

// ------------------------------------------------------------------------------------------
// Pick API
// ------------------------------------------------------------------------------------------

/// The prompt of a request, in the form the caller has it.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    /// Token ids already computed.
    Tokens(&'a [u32]),
    /// A whole OpenAI chat/completions request body (messages, tools, chat_template_kwargs).
    Chat(&'a serde_json::Map<String, serde_json::Value>),
    /// The `prompt` field of an OpenAI completions request (a string or token ids).
    Completion(&'a serde_json::Value),
    /// Nothing usable: the decision is degraded (load only).
    Unavailable,
}

/// One request to route.
#[derive(Clone, Copy, Debug)]
pub struct PickInput<'a> {
    /// Client-facing model name.
    pub model: &'a str,
    /// The prompt.
    pub prompt: Prompt<'a>,
    /// The request's `cache_salt`, if any.
    pub cache_salt: Option<&'a str>,
    /// LoRA adapter name, if any.
    pub lora: Option<&'a str>,
    /// Request headers (for policy rules; may be `None`).
    pub headers: Option<&'a http::HeaderMap>,
    /// Worker ids not to choose (e.g. a retry after a connection failure).
    pub exclude: &'a [String],
    /// The request's output limit, if it set one (see [`max_tokens_of`]).
    pub max_tokens: Option<u32>,
}

/// The output limit of an OpenAI or Anthropic request body: `max_completion_tokens`, else
/// `max_tokens`; `None` when absent or not a non-negative integer.
pub fn max_tokens_of(body: &serde_json::Map<String, serde_json::Value>) -> Option<u32> {
    ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(serde_json::Value::as_u64))
        .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
}

/// Handle of one assignment, as the data path and the Picker API pass it around.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct DecisionId(pub u64);

impl std::fmt::Display for DecisionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for DecisionId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(DecisionId)
    }
}

/// A routing decision, ready to serialize (`/debug/explain`, `kvroute explain`).
#[derive(Clone, Debug, Serialize)]
pub struct DecisionRecord {
    /// The client-facing model.
    pub model: String,
    /// The model the workers serve.
    pub backend_model: String,
    /// Pool, if any.
    pub pool: Option<String>,
    /// Chosen worker id.
    pub chosen: String,
    /// Chosen worker address.
    pub address: String,
    /// Why it was chosen (metric label form).
    pub reason: &'static str,
    /// Policy name.
    pub policy: &'static str,
    /// True when scored on load alone.
    pub degraded: bool,
    /// Why degraded (no-tokenizer, tokenization-failed, no-prompt), if so.
    pub degraded_reason: Option<String>,
    /// Prompt tokens (0 when degraded).
    pub prompt_tokens: usize,
    /// Predicted TTFT of the chosen worker, seconds.
    pub predicted_ttft_s: f64,
    /// Every candidate with its figures.
    pub candidates: Vec<CandidateRecord>,
}

/// One candidate of a [`DecisionRecord`].
#[derive(Clone, Debug, Serialize)]
pub struct CandidateRecord {
    /// Worker id.
    pub worker: String,
    /// Worker address.
    pub address: String,
    /// The policy's score (lower wins).
    pub score: f64,
    /// The core's figures (cache, load, prediction).
    #[serde(serialize_with = "figures_without_core_id")]
    #[serde(flatten)]
    pub figures: Candidate,
}

/// Serializes a candidate's figures without its core-internal numeric `worker` id, which
/// would clash with the record's worker name.
fn figures_without_core_id<S: serde::Serializer>(c: &Candidate, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::{Error, SerializeMap};
    let serde_json::Value::Object(mut map) = serde_json::to_value(c).map_err(S::Error::custom)?
    else {
        return Err(S::Error::custom("candidate is not an object"));
    };
    map.remove("worker");
    let mut out = s.serialize_map(Some(map.len()))?;
    for (k, v) in &map {
        out.serialize_entry(k, v)?;
    }
    out.end()
}

/// A request assigned to a worker. Release it exactly once with [`RouterState::done`] or
/// [`RouterState::abort`] (or let it expire).
#[derive(Clone, Debug)]
pub struct Assignment {
    /// Handle for first_token / done / abort.
    pub decision_id: DecisionId,
    /// Chosen worker id.
    pub worker_id: String,
    /// Its host:port.
    pub address: String,
    /// The model name to send (rewrite the body when it differs from the request's).
    pub backend_model: String,
    /// Predicted TTFT, seconds (NaN when the policy predicts nothing).
    pub predicted_ttft_s: f64,
    /// The full decision record.
    pub decision: DecisionRecord,
}

/// Why a request could not be routed. `label()` is the metric label.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum PickError {
    /// No pool or worker serves the model.
    #[error("model `{0}` does not exist")]
    UnknownModel(String),
    /// The model exists but no worker is routable now.
    #[error("no ready worker for model `{0}`")]
    NoReadyWorker(String),
    /// The model's tokenizer is not loaded yet (or failing) and none of its pools allows
    /// load-only routing.
    #[error("the tokenizer of model `{model}` {}", crate::tokenizer_registry::not_ready_text(*.failed))]
    TokenizerNotReady {
        /// The client-facing model name.
        model: String,
        /// At least one load attempt failed (else it is still loading).
        failed: bool,
    },
}

impl PickError {
    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            PickError::UnknownModel(_) => "unknown_model",
            PickError::NoReadyWorker(_) => "no_ready_worker",
            PickError::TokenizerNotReady { .. } => "tokenizer_not_ready",
        }
    }
}

/// Usage of a finished request, as the worker reported it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: u32,
    /// Completion tokens.
    pub completion_tokens: u32,
    /// End-to-end seconds as the data path measured it, if it did.
    pub e2e_seconds: Option<f64>,
}

/// How an assignment ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Completed.
    Done,
    /// Aborted (error, client disconnect).
    Aborted,
    /// Not reported within the TTL.
    Expired,
}

impl Release {
    fn label(self) -> &'static str {
        match self {
            Release::Done => "done",
            Release::Aborted => "aborted",
            Release::Expired => "expired",
        }
    }
}

// ------------------------------------------------------------------------------------------
// Sidecar ingest API
// ------------------------------------------------------------------------------------------

/// Identity of a reporting worker (from the first snapshot chunk).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SidecarIdentity {
    /// Worker id.
    pub worker_id: String,
    /// host:port of its API.
    pub address: String,
    /// Served model.
    pub model: String,
    /// Block size.
    pub block_size: usize,
    /// Epoch.
    pub epoch: u64,
    /// WorkerSet name.
    pub worker_set: String,
}

/// A load sample from a sidecar.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LoadView {
    /// Requests waiting.
    pub waiting: u32,
    /// Requests running.
    pub running: u32,
    /// KV cache usage 0..1.
    pub kv_usage: f32,
    /// The sidecar's last scrape of vLLM failed.
    pub scrape_failed: bool,
    /// KV cache size in tokens (0: unknown).
    pub kv_capacity_tokens: u64,
}

/// Block changes in one delta op.
#[derive(Clone, Copy, Debug)]
pub enum DeltaOp<'a> {
    /// Blocks became resident.
    Stored(&'a [u64]),
    /// Blocks were evicted.
    Removed(&'a [u64]),
    /// Every block was dropped.
    Cleared,
}

/// Why a snapshot start was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotRefused {
    /// Identity is incomplete.
    #[error("identity without worker_id, model or block_size")]
    BadIdentity,
    /// The router already knows a newer epoch of this worker.
    #[error("epoch {got} is older than the known epoch {known}")]
    OlderEpoch {
        /// The stream's epoch.
        got: u64,
        /// The newest epoch known.
        known: u64,
    },
}

/// Sidecar bookkeeping per worker id.
#[derive(Clone, Debug)]
struct SidecarView {
    core_id: WorkerId,
    identity: SidecarIdentity,
    /// The stream currently owning the worker (a newer stream takes over).
    stream: u64,
    stream_open: bool,
    /// A snapshot has completed at least once.
    synced: bool,
    load: Option<LoadView>,
}

/// One worker as `/debug/workers` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerReport {
    /// Worker id.
    pub id: String,
    /// Address.
    pub address: String,
    /// Model.
    pub model: String,
    /// WorkerSet.
    pub worker_set: String,
    /// Listed by discovery.
    pub listed: bool,
    /// Pod ready (discovery).
    pub ready: bool,
    /// Sidecar stream open now.
    pub sidecar_connected: bool,
    /// A snapshot has completed.
    pub synced: bool,
    /// Stale (stream gone or reports too old).
    pub stale: bool,
    /// Routable now.
    pub routable: bool,
    /// Epoch.
    pub epoch: u64,
    /// Block size.
    pub block_size: usize,
    /// Resident blocks in the index.
    pub index_blocks: u64,
    /// Seconds since the last report (None: never reported).
    pub last_report_age_s: Option<f64>,
    /// Last load sample.
    pub load: Option<LoadView>,
    /// Router in-flight assignments (waiting first token + decoding).
    pub in_flight: u32,
    /// Of which waiting for the first token.
    pub waiting_first_token: u32,
}

/// `/debug/workers` body.
#[derive(Clone, Debug, Serialize)]
pub struct WorkersReport {
    /// Distinct blocks in the index.
    pub index_distinct_blocks: usize,
    /// (block, worker) pairs.
    pub index_pairs: u64,
    /// Estimated index memory.
    pub index_memory_bytes: usize,
    /// Outstanding assignments (all workers).
    pub in_flight: usize,
    /// Workers.
    pub workers: Vec<WorkerReport>,
}

// ------------------------------------------------------------------------------------------
// State
// ------------------------------------------------------------------------------------------

/// The routing core and the policy, mutated together.
struct Core {
    routing: RoutingCore,
    policy: Box<dyn Policy>,
    /// What each outstanding assignment needs for metrics: model label and worker key.
    labels: HashMap<AssignmentId, (String, String)>,
}

struct Inner {
    config: RouterConfig,
    metrics: RouterMetrics,
    tokenizers: Tokenizers,
    epoch: Instant,
    core: Mutex<Core>,
    catalog: RwLock<Catalog>,
    sidecars: RwLock<HashMap<String, SidecarView>>,
    next_stream: AtomicU64,
    discovery_synced: AtomicBool,
}

/// Shared router state; cheap to clone.
#[derive(Clone)]
pub struct RouterState(Arc<Inner>);

/// Error building the state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// `--policy` names no policy.
    #[error(transparent)]
    UnknownPolicy(#[from] crate::routing::UnknownPolicy),
    /// A tokenizer directory could not be loaded.
    #[error("tokenizer {dir}: {source}")]
    Tokenizer {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: TokenizeError,
    },
}

impl RouterState {
    /// Builds the state: loads the tokenizers, builds the policy. Fails on an unknown policy
    /// name or an unreadable tokenizer directory.
    pub fn new(config: RouterConfig, metrics: RouterMetrics) -> Result<Self, StateError> {
        let policy: Box<dyn Policy> = if config.policy == "kvroute" {
            let cfg = PredictedTtftConfig {
                tie_margin_s: config.tie_margin_s,
                ..PredictedTtftConfig::default()
            };
            Box::new(PredictedTtft::new(cfg, config.seed))
        } else {
            policy_by_name(&config.policy, config.seed)?
        };
        let core_cfg = CoreConfig {
            predictor: config.predictor.clone(),
            stale_after_s: config.stale_after.as_secs_f64(),
            ..CoreConfig::default()
        };
        let core = Core {
            routing: RoutingCore::new(core_cfg),
            policy,
            labels: HashMap::new(),
        };
        let tokenizers = Tokenizers::load(&config.tokenizers)?;
        Ok(Self(Arc::new(Inner {
            config,
            metrics,
            tokenizers,
            epoch: Instant::now(),
            core: Mutex::new(core),
            catalog: RwLock::new(Catalog::default()),
            sidecars: RwLock::new(HashMap::new()),
            next_stream: AtomicU64::new(1),
            discovery_synced: AtomicBool::new(false),
        })))
    }

    /// Configuration.
    pub fn config(&self) -> &RouterConfig {
        &self.0.config
    }

    /// Metrics.
    pub fn metrics(&self) -> &RouterMetrics {
        &self.0.metrics
    }

    /// Seconds since the state was created: the clock handed to the pure core.
    fn secs(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.0.epoch).as_secs_f64()
    }

    // ---------------------------------------------------------------- discovery

    /// Replaces the discovery view.
    pub fn set_catalog(&self, catalog: Catalog) {
        *self.0.catalog.write() = catalog;
    }

    /// Marks discovery as having completed its initial sync.
    pub fn set_discovery_synced(&self) {
        self.0.discovery_synced.store(true, Ordering::Release);
    }

    /// True once discovery completed its initial sync.
    pub fn discovery_synced(&self) -> bool {
        self.0.discovery_synced.load(Ordering::Acquire)
    }

    /// The client-facing models: pool names and aliases, plus the models of listed workers,
    /// plus with `--route-unlisted` the models sidecars report.
    pub fn models(&self) -> Vec<ModelInfo> {
        let mut out: BTreeMap<String, ModelInfo> = BTreeMap::new();
        let bare = |out: &mut BTreeMap<String, ModelInfo>, model: &str| {
            if !model.is_empty() && !out.contains_key(model) {
                let info = ModelInfo {
                    id: model.to_string(),
                    backend_model: model.to_string(),
                    pool: None,
                };
                out.insert(model.to_string(), info);
            }
        };
        {
            let catalog = self.0.catalog.read();
            for pool in &catalog.pools {
                for m in &pool.models {
                    out.entry(m.name.clone()).or_insert_with(|| ModelInfo {
                        id: m.name.clone(),
                        backend_model: m.backend_model.clone(),
                        pool: Some(pool.name.clone()),
                    });
                }
            }
            for w in &catalog.workers {
                bare(&mut out, &w.model);
            }
        }
        if self.0.config.route_unlisted {
            for s in self.0.sidecars.read().values() {
                bare(&mut out, &s.identity.model);
            }
        }
        out.into_values().collect()
    }

    /// Resolves a client-facing model name.
    pub fn resolve_model(&self, name: &str) -> Option<Resolved> {
        self.models()
            .into_iter()
            .find(|m| m.id == name)
            .map(|m| Resolved {
                backend_model: m.backend_model,
                pool: m.pool,
            })
    }

    // ---------------------------------------------------------------- picking

    /// Chooses a worker and records the assignment.
    pub fn pick(&self, input: &PickInput<'_>, now: Instant) -> Result<Assignment, PickError> {
        let started = Instant::now();
        let result = self.decide(input, now, true);
        self.0
            .metrics
            .decision_duration
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok((record, id)) => {
                let m = &self.0.metrics;
                m.requests
                    .with_label_values(&[input.model, &record.chosen, record.reason])
                    .inc();
                if record.predicted_ttft_s.is_finite() {
                    m.predicted_ttft
                        .with_label_values(&[input.model, &record.chosen])
                        .observe(record.predicted_ttft_s);
                }
                Ok(Assignment {
                    decision_id: id.unwrap_or(DecisionId(0)),
                    worker_id: record.chosen.clone(),
                    address: record.address.clone(),
                    backend_model: record.backend_model.clone(),
                    predicted_ttft_s: record.predicted_ttft_s,
                    decision: record,
                })
            }
            Err(e) => {
                self.0
                    .metrics
                    .pick_errors
                    .with_label_values(&[input.model, e.label()])
                    .inc();
                Err(e)
            }
        }
    }

    /// The decision `pick` would make now, without assigning (nothing is recorded, though
    /// the policy's RNG or rotation may advance).
    pub fn explain(
        &self,
        input: &PickInput<'_>,
        now: Instant,
    ) -> Result<DecisionRecord, PickError> {
        self.decide(input, now, false).map(|(r, _)| r)
    }

    fn decide(
        &self,
        input: &PickInput<'_>,
        now: Instant,
        assign: bool,
    ) -> Result<(DecisionRecord, Option<DecisionId>), PickError> {
        let resolved = self
            .resolve_model(input.model)
            .ok_or_else(|| PickError::UnknownModel(input.model.into()))?;
        let pool_sets = self.pool_worker_sets(resolved.pool.as_deref());
        let candidates = self.routable_workers(&resolved.backend_model, &pool_sets, input.exclude);
        if candidates.is_empty() {
            return Err(PickError::NoReadyWorker(input.model.into()));
        }

        // Tokenize outside every lock: it is the expensive part.
        let (tokens, degraded_reason) = match self.tokens_for(input, &resolved.backend_model)? {
            Ok(t) => (Some(t), None),
            Err(reason) => {
                if let Degraded::Failed(label) = reason {
                    self.0
                        .metrics
                        .tokenization_failures
                        .with_label_values(&[input.model, label])
                        .inc();
                }
                (None, Some(reason.label().to_string()))
            }
        };
        let req = RouteRequest {
            tokens: tokens.as_deref(),
            model: &resolved.backend_model,
            lora: input.lora,
            cache_salt: input.cache_salt,
            max_tokens: input.max_tokens,
        };
        let allowed: Vec<WorkerId> = candidates.iter().map(|c| c.2).collect();
        let t = self.secs(now);

        let name_of = |w: WorkerId| {
            candidates
                .iter()
                .find(|c| c.2 == w)
                .map(|c| (c.0.clone(), c.1.clone()))
        };
        let (decision, chosen, address, id) = {
            let mut guard = self.0.core.lock();
            let core = &mut *guard;
            let decision: Decision = core
                .routing
                .decide(core.policy.as_mut(), &req, &allowed, t)
                .ok_or_else(|| PickError::NoReadyWorker(input.model.into()))?;
            let (chosen, address) = name_of(decision.chosen).unwrap_or_default();
            let id = if assign {
                let aid = core.routing.assign(&decision, t);
                core.labels
                    .insert(aid, (input.model.to_string(), chosen.clone()));
                Some(DecisionId(aid.0))
            } else {
                None
            };
            (decision, chosen, address, id)
        };

        if decision.degraded && assign {
            let reason = degraded_reason.as_deref().unwrap_or("no_prompt");
            self.0
                .metrics
                .degraded_decisions
                .with_label_values(&[input.model, reason])
                .inc();
        }
        let record = DecisionRecord {
            model: input.model.to_string(),
            backend_model: resolved.backend_model,
            pool: resolved.pool,
            chosen,
            address,
            reason: decision.reason.as_str(),
            policy: decision.policy,
            degraded: decision.degraded,
            degraded_reason,
            prompt_tokens: decision.prompt_tokens,
            predicted_ttft_s: decision.predicted_ttft(),
            candidates: decision
                .candidates
                .iter()
                .map(|r| {
                    let (worker, address) = name_of(r.candidate.worker).unwrap_or_default();
                    CandidateRecord {
                        worker,
                        address,
                        score: r.score,
                        figures: r.candidate.clone(),
                    }
                })
                .collect(),
        };
        Ok((record, id))
    }

    /// The prompt's token ids, or why the decision is degraded; a refusal when the model's
    /// tokenizer is needed but not loaded and its pool does not allow load-only routing.
    fn tokens_for(
        &self,
        input: &PickInput<'_>,
        backend_model: &str,
    ) -> Result<Result<Vec<u32>, Degraded>, PickError> {
        match self.encode_prompt(input, backend_model) {
            Err(Degraded::NotLoaded { failed }) => Err(PickError::TokenizerNotReady {
                model: input.model.to_string(),
                failed,
            }),
            other => Ok(other),
        }
    }

    fn encode_prompt(
        &self,
        input: &PickInput<'_>,
        backend_model: &str,
    ) -> Result<Vec<u32>, Degraded> {
        let tokenizer = || match self.0.tokenizers.lookup(input.model, backend_model) {
            Lookup::Ready(t) => Ok(t),
            Lookup::NotConfigured
            | Lookup::NotLoaded {
                load_only: true, ..
            } => Err(Degraded::NoTokenizer),
            Lookup::NotLoaded { failed, .. } => Err(Degraded::NotLoaded { failed }),
        };
        match input.prompt {
            Prompt::Tokens(t) => Ok(t.to_vec()),
            Prompt::Completion(v) => {
                let prompt =
                    PromptInput::deserialize(v).map_err(|_| Degraded::Failed("invalid_prompt"))?;
                if let PromptInput::TokenIds(ids) = &prompt {
                    // Token ids need no tokenizer; out-of-range ids fail at the worker.
                    return ids
                        .iter()
                        .map(|&i| {
                            u32::try_from(i).map_err(|_| Degraded::Failed("token_out_of_vocab"))
                        })
                        .collect();
                }
                tokenizer()?
                    .encode_prompt(&prompt, true)
                    .map_err(|e| Degraded::Failed(e.label()))
            }
            Prompt::Chat(body) => {
                let tok = tokenizer()?;
                let req = ChatRequest::deserialize(body)
                    .map_err(|_| Degraded::Failed("invalid_request"))?;
                tok.encode_chat(&req, kvroute_tokenization::local_now())
                    .map(|e| e.token_ids)
                    .map_err(|e| Degraded::Failed(e.label()))
            }
            Prompt::Unavailable => Err(Degraded::NoPrompt),
        }
    }

    fn pool_worker_sets(&self, pool: Option<&str>) -> Vec<String> {
        let Some(pool) = pool else { return Vec::new() };
        self.0
            .catalog
            .read()
            .pools
            .iter()
            .find(|p| p.name == pool)
            .map(|p| p.worker_sets.clone())
            .unwrap_or_default()
    }

    /// (worker id, address, core id) of every routable worker of `model`, sorted by id.
    fn routable_workers(
        &self,
        model: &str,
        sets: &[String],
        exclude: &[String],
    ) -> Vec<(String, String, WorkerId)> {
        let catalog = self.0.catalog.read();
        let sidecars = self.0.sidecars.read();
        let mut out = Vec::new();
        let in_sets = |ws: &str| sets.is_empty() || sets.iter().any(|s| s == ws);
        let mut listed_keys = Vec::new();
        for w in &catalog.workers {
            let Some((key, s)) = find_sidecar(&sidecars, w) else {
                continue;
            };
            listed_keys.push(key.to_string());
            if w.model == model
                && w.ready
                && in_sets(&w.worker_set)
                && !exclude.contains(&w.id)
                && s.synced
            {
                out.push((w.id.clone(), w.address.clone(), s.core_id));
            }
        }
        if self.0.config.route_unlisted {
            for (key, s) in sidecars.iter() {
                if s.identity.model == model
                    && s.synced
                    && !listed_keys.contains(key)
                    && in_sets(&s.identity.worker_set)
                    && !exclude.contains(key)
                {
                    out.push((key.clone(), s.identity.address.clone(), s.core_id));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    // ---------------------------------------------------------------- reports

    /// Records the first token of an assignment and teaches the predictor. `observed_ttft_s`
    /// is the data path's measurement (None: time since the pick). False when the id is
    /// unknown, released, or already past its first token.
    pub fn first_token(&self, id: DecisionId, observed_ttft_s: Option<f64>, now: Instant) -> bool {
        let t = self.secs(now);
        let aid = AssignmentId(id.0);
        let mut core = self.0.core.lock();
        let Some(ft) = core.routing.first_token(aid, t, observed_ttft_s) else {
            return false;
        };
        let labels = core.labels.get(&aid).cloned();
        drop(core);
        if let Some((model, worker)) = labels {
            let m = &self.0.metrics;
            m.ttft
                .with_label_values(&[&model, &worker])
                .observe(ft.observed_ttft);
            let predicted = ft.assignment.predicted_ttft;
            if predicted.is_finite() {
                m.ttft_prediction_error
                    .with_label_values(&[&model, &worker])
                    .observe((ft.observed_ttft - predicted).abs());
            }
        }
        true
    }

    /// Observes one inter-token gap of an assignment (streaming data paths).
    pub fn observe_itl(&self, id: DecisionId, seconds: f64) {
        let labels = self.0.core.lock().labels.get(&AssignmentId(id.0)).cloned();
        if let Some((model, worker)) = labels
            && seconds.is_finite()
            && seconds >= 0.0
        {
            self.0
                .metrics
                .itl
                .with_label_values(&[&model, &worker])
                .observe(seconds);
        }
    }

    /// Releases a completed assignment. False when unknown or already released.
    pub fn done(&self, id: DecisionId, usage: Usage) -> bool {
        let Some((model, worker)) = self.release(id, Release::Done, Some(usage.completion_tokens))
        else {
            return false;
        };
        let m = &self.0.metrics;
        let cached = u64::from(usage.cached_prompt_tokens.min(usage.prompt_tokens));
        let uncached = u64::from(usage.prompt_tokens) - cached;
        m.prompt_tokens
            .with_label_values(&[&model, "cached"])
            .inc_by(cached);
        m.prompt_tokens
            .with_label_values(&[&model, "uncached"])
            .inc_by(uncached);
        if let Some(e2e) = usage.e2e_seconds.filter(|s| s.is_finite() && *s >= 0.0) {
            m.e2e.with_label_values(&[&model, &worker]).observe(e2e);
        }
        true
    }

    /// Releases an aborted assignment. False when unknown or already released.
    pub fn abort(&self, id: DecisionId, reason: &str) -> bool {
        let released = self.release(id, Release::Aborted, None).is_some();
        if released {
            tracing::debug!(decision = %id, reason, "assignment aborted");
        }
        released
    }

    /// Releases an assignment; a completed one with its output token count also teaches the
    /// routing core the worker's decode speed.
    fn release(
        &self,
        id: DecisionId,
        how: Release,
        output_tokens: Option<u32>,
    ) -> Option<(String, String)> {
        let aid = AssignmentId(id.0);
        let t = self.secs(Instant::now());
        let mut core = self.0.core.lock();
        let released = match how {
            Release::Done => match output_tokens {
                Some(n) => core.routing.finish_observed(aid, t, u64::from(n)),
                None => core.routing.finish(aid),
            },
            Release::Aborted | Release::Expired => core.routing.abort(aid),
        };
        released?;
        let labels = core.labels.remove(&aid).unwrap_or_default();
        drop(core);
        self.0
            .metrics
            .released
            .with_label_values(&[how.label()])
            .inc();
        Some(labels)
    }

    /// Releases every assignment older than the TTL; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let t = self.secs(now);
        let ttl = self.0.config.assignment_ttl.as_secs_f64();
        let mut core = self.0.core.lock();
        let gone = core.routing.expire(t, ttl);
        for (id, _) in &gone {
            core.labels.remove(id);
        }
        drop(core);
        if !gone.is_empty() {
            self.0
                .metrics
                .released
                .with_label_values(&[Release::Expired.label()])
                .inc_by(gone.len() as u64);
        }
        gone.len()
    }

    /// Outstanding assignments.
    pub fn in_flight(&self) -> usize {
        self.0.core.lock().routing.assignments.len()
    }

    // ---------------------------------------------------------------- sidecar ingest

    /// A new report stream id (a newer stream of the same worker takes it over).
    pub fn new_stream_id(&self) -> u64 {
        self.0.next_stream.fetch_add(1, Ordering::Relaxed)
    }

    /// Starts a snapshot from stream `stream`: registers the worker (the stream now owns it),
    /// refuses older epochs, replaces everything known about its blocks with `blocks`.
    pub fn sidecar_snapshot_start(
        &self,
        stream: u64,
        identity: &SidecarIdentity,
        blocks: &[u64],
        now: Instant,
    ) -> Result<(), SnapshotRefused> {
        if identity.worker_id.is_empty() || identity.model.is_empty() || identity.block_size == 0 {
            return Err(SnapshotRefused::BadIdentity);
        }
        let t = self.secs(now);
        let mut sidecars = self.0.sidecars.write();
        if let Some(s) = sidecars.get(&identity.worker_id)
            && identity.epoch < s.identity.epoch
        {
            return Err(SnapshotRefused::OlderEpoch {
                got: identity.epoch,
                known: s.identity.epoch,
            });
        }
        let mut core = self.0.core.lock();
        let core_id = core
            .routing
            .upsert_worker(&identity.worker_id, identity.block_size);
        core.routing
            .index
            .set_block_size(core_id, identity.block_size);
        core.routing
            .index
            .apply_snapshot(core_id, identity.epoch, blocks, t);
        core.routing.index.touch(core_id, t);
        drop(core);
        let view = SidecarView {
            core_id,
            identity: identity.clone(),
            stream,
            stream_open: true,
            synced: false,
            load: None,
        };
        match sidecars.get_mut(&identity.worker_id) {
            // A re-snapshot keeps the worker routable (it was synced) while the rest arrives.
            Some(s) => {
                let synced = s.synced && s.identity.epoch == identity.epoch;
                *s = SidecarView {
                    synced,
                    load: s.load,
                    ..view
                };
            }
            None => {
                sidecars.insert(identity.worker_id.clone(), view);
            }
        }
        drop(sidecars);
        self.0
            .metrics
            .ingest_blocks
            .with_label_values(&["snapshot"])
            .inc_by(blocks.len() as u64);
        Ok(())
    }

    /// A later chunk of a snapshot; `last` completes it (the worker becomes routable). False
    /// when the stream no longer owns the worker.
    pub fn sidecar_snapshot_chunk(
        &self,
        stream: u64,
        worker: &str,
        blocks: &[u64],
        last: bool,
        now: Instant,
    ) -> bool {
        let t = self.secs(now);
        let Some(core_id) = self.owned(stream, worker) else {
            return false;
        };
        let mut core = self.0.core.lock();
        core.routing.index.apply_stored(core_id, blocks, t);
        core.routing.index.touch(core_id, t);
        drop(core);
        if last && let Some(s) = self.0.sidecars.write().get_mut(worker) {
            s.synced = true;
        }
        self.0
            .metrics
            .ingest_blocks
            .with_label_values(&["snapshot"])
            .inc_by(blocks.len() as u64);
        true
    }

    /// Applies delta ops in order. False when the stream no longer owns the worker.
    pub fn sidecar_delta(
        &self,
        stream: u64,
        worker: &str,
        ops: &[DeltaOp<'_>],
        now: Instant,
    ) -> bool {
        let t = self.secs(now);
        let Some(core_id) = self.owned(stream, worker) else {
            return false;
        };
        let (mut stored, mut removed, mut cleared) = (0u64, 0u64, 0u64);
        let mut core = self.0.core.lock();
        let index = &mut core.routing.index;
        for op in ops {
            match *op {
                DeltaOp::Stored(b) => {
                    index.apply_stored(core_id, b, t);
                    stored += b.len() as u64;
                }
                DeltaOp::Removed(b) => {
                    index.apply_removed(core_id, b, t);
                    removed += b.len() as u64;
                }
                DeltaOp::Cleared => {
                    index.clear(core_id, t);
                    cleared += 1;
                }
            }
        }
        index.touch(core_id, t);
        drop(core);
        let m = &self.0.metrics.ingest_blocks;
        m.with_label_values(&["stored"]).inc_by(stored);
        m.with_label_values(&["removed"]).inc_by(removed);
        m.with_label_values(&["cleared"]).inc_by(cleared);
        true
    }

    /// Records a load sample. A sample whose scrape failed is kept for display but neither
    /// feeds the predictor nor counts as a sign of life.
    pub fn sidecar_load(&self, stream: u64, worker: &str, load: LoadView, now: Instant) -> bool {
        let t = self.secs(now);
        let Some(core_id) = self.owned(stream, worker) else {
            return false;
        };
        if let Some(s) = self.0.sidecars.write().get_mut(worker) {
            s.load = Some(load);
        }
        if !load.scrape_failed {
            let sample = LoadSample {
                waiting: load.waiting,
                running: load.running,
                kv_usage: load.kv_usage,
                kv_capacity_tokens: load.kv_capacity_tokens,
            };
            self.0.core.lock().routing.set_load(core_id, sample, t);
        }
        true
    }

    /// The stream ended: if it still owns the worker, the worker becomes stale (its blocks
    /// are kept; the core discounts them).
    pub fn sidecar_closed(&self, stream: u64, worker: &str) {
        let mut sidecars = self.0.sidecars.write();
        let Some(s) = sidecars.get_mut(worker) else {
            return;
        };
        if s.stream != stream {
            return;
        }
        s.stream_open = false;
        let core_id = s.core_id;
        drop(sidecars);
        self.0.core.lock().routing.index.mark_stale(core_id);
    }

    fn owned(&self, stream: u64, worker: &str) -> Option<WorkerId> {
        self.0
            .sidecars
            .read()
            .get(worker)
            .filter(|s| s.stream == stream)
            .map(|s| s.core_id)
    }

    /// Open sidecar streams.
    pub fn open_streams(&self) -> usize {
        self.0
            .sidecars
            .read()
            .values()
            .filter(|s| s.stream_open)
            .count()
    }

    // ---------------------------------------------------------------- admin

    /// Workers, index and load (`/debug/workers`).
    pub fn workers_report(&self, now: Instant) -> WorkersReport {
        let t = self.secs(now);
        let stale_after = self.0.config.stale_after.as_secs_f64();
        let catalog = self.0.catalog.read().clone();
        let sidecars = self.0.sidecars.read().clone();
        let core = self.0.core.lock();
        let routing = &core.routing;
        let route_unlisted = self.0.config.route_unlisted;
        let row = |id: &str, listed: Option<&DiscoveredWorker>, s: Option<&SidecarView>| {
            let core_id = s.map(|s| s.core_id);
            let st = core_id.and_then(|c| routing.index.worker(c));
            let infl = core_id
                .map(|c| routing.assignments.inflight(c))
                .unwrap_or_default();
            let stale = core_id.is_none_or(|c| routing.index.is_stale(c, t, stale_after));
            let synced = s.is_some_and(|s| s.synced);
            let ready = listed.is_some_and(|w| w.ready);
            let pick = |a: Option<String>, b: Option<String>| a.or(b).unwrap_or_default();
            WorkerReport {
                id: id.to_string(),
                address: pick(
                    listed.map(|w| w.address.clone()),
                    s.map(|s| s.identity.address.clone()),
                ),
                model: pick(
                    listed.map(|w| w.model.clone()),
                    s.map(|s| s.identity.model.clone()),
                ),
                worker_set: pick(
                    listed.map(|w| w.worker_set.clone()),
                    s.map(|s| s.identity.worker_set.clone()),
                ),
                listed: listed.is_some(),
                ready,
                sidecar_connected: s.is_some_and(|s| s.stream_open),
                synced,
                stale,
                routable: synced && (ready || (listed.is_none() && route_unlisted)),
                epoch: st.map_or(0, |s| s.epoch),
                block_size: st.map_or(0, |s| s.block_size),
                index_blocks: st.map_or(0, |s| s.blocks),
                last_report_age_s: st.map(|s| (t - s.last_update).max(0.0)),
                load: s.and_then(|s| s.load),
                in_flight: infl.outstanding(),
                waiting_first_token: infl.waiting,
            }
        };
        let mut workers = Vec::new();
        let mut seen = Vec::new();
        for w in &catalog.workers {
            let s = find_sidecar(&sidecars, w);
            if let Some((k, _)) = s {
                seen.push(k.to_string());
            }
            workers.push(row(&w.id, Some(w), s.map(|(_, s)| s)));
        }
        let mut unlisted: Vec<_> = sidecars.iter().filter(|(k, _)| !seen.contains(k)).collect();
        unlisted.sort_by(|a, b| a.0.cmp(b.0));
        for (k, s) in unlisted {
            workers.push(row(k, None, Some(s)));
        }
        WorkersReport {
            index_distinct_blocks: routing.index.distinct_blocks(),
            index_pairs: routing.index.pairs(),
            index_memory_bytes: routing.index.memory_bytes(),
            in_flight: routing.assignments.len(),
            workers,
        }
    }

    /// Sets the scrape-time gauges (index size, in-flight, worker states).
    pub fn refresh_gauges(&self, now: Instant) {
        let report = self.workers_report(now);
        let m = &self.0.metrics;
        m.index_blocks.reset();
        m.in_flight.reset();
        let mut by_state: BTreeMap<&str, i64> = [
            ("routable", 0),
            ("stale", 0),
            ("not_ready", 0),
            ("unlisted", 0),
        ]
        .into_iter()
        .collect();
        for w in &report.workers {
            m.index_blocks
                .with_label_values(&[&w.id])
                .set(i64::try_from(w.index_blocks).unwrap_or(i64::MAX));
            m.in_flight
                .with_label_values(&[&w.id])
                .set(i64::from(w.in_flight));
            let state = if !w.listed && !self.0.config.route_unlisted {
                "unlisted"
            } else if !w.routable {
                "not_ready"
            } else if w.stale {
                "stale"
            } else {
                "routable"
            };
            *by_state.entry(state).or_default() += 1;
        }
        for (state, n) in by_state {
            m.workers.with_label_values(&[state]).set(n);
        }
    }

    /// Ready to serve: discovery synced and at least one routable worker.
    pub fn ready(&self, now: Instant) -> bool {
        self.discovery_synced() && self.workers_report(now).workers.iter().any(|w| w.routable)
    }
}

/// Why a decision had no tokens. `label()` is the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Degraded {
    /// No tokenizer configured for the model.
    NoTokenizer,
    /// The request carried no usable prompt.
    NoPrompt,
    /// Tokenization failed (label of the error).
    Failed(&'static str),
    /// The model's tokenizer is configured but not loaded, and load-only routing is not
    /// allowed: the request is refused, not degraded (see `tokens_for`).
    NotLoaded {
        /// At least one load attempt failed.
        failed: bool,
    },
}

impl Degraded {
    fn label(self) -> &'static str {
        match self {
            Degraded::NoTokenizer => "no_tokenizer",
            Degraded::NoPrompt => "no_prompt",
            Degraded::Failed(l) => l,
            Degraded::NotLoaded { .. } => "tokenizer_not_ready",
        }
    }
}

impl RouterState {
    /// The tokenizer registry: the loader task fills it, discovery sets its plan.
    pub fn tokenizers(&self) -> &Tokenizers {
        &self.0.tokenizers
    }
}

/// The sidecar view of a discovered worker: by id, else by address.
fn find_sidecar<'a>(
    sidecars: &'a HashMap<String, SidecarView>,
    w: &DiscoveredWorker,
) -> Option<(&'a str, &'a SidecarView)> {
    if let Some((k, s)) = sidecars.get_key_value(&w.id) {
        return Some((k.as_str(), s));
    }
    sidecars
        .iter()
        .find(|(_, s)| !w.address.is_empty() && s.identity.address == w.address)
        .map(|(k, s)| (k.as_str(), s))
}

// ------------------------------------------------------------------------------------------
// The embedded gateway's view of the router
// ------------------------------------------------------------------------------------------

impl crate::gateway::Dispatch for RouterState {
    fn model_names(&self) -> Vec<String> {
        self.models().into_iter().map(|m| m.id).collect()
    }

    fn resolve_model(&self, client_model: &str) -> Option<String> {
        RouterState::resolve_model(self, client_model).map(|r| r.backend_model)
    }

    fn pick(
        &self,
        request: &crate::gateway::RouteRequest<'_>,
        exclude: &[String],
    ) -> Result<crate::gateway::Picked, crate::gateway::PickError> {
        use crate::gateway::openai::Endpoint;
        let body = request.body;
        let prompt = match request.endpoint {
            Endpoint::ChatCompletions => Prompt::Chat(body),
            Endpoint::Completions => body
                .get("prompt")
                .map_or(Prompt::Unavailable, Prompt::Completion),
        };
        let input = PickInput {
            model: request.client_model,
            prompt,
            cache_salt: body.get("cache_salt").and_then(serde_json::Value::as_str),
            lora: None,
            headers: Some(request.headers),
            exclude,
            max_tokens: max_tokens_of(body),
        };
        match RouterState::pick(self, &input, Instant::now()) {
            Ok(a) => Ok(crate::gateway::Picked {
                assignment: a.decision_id.0,
                worker: a.worker_id,
                base_url: format!("http://{}", a.address),
                predicted_ttft_s: a.predicted_ttft_s,
            }),
            Err(PickError::UnknownModel(_)) => Err(crate::gateway::PickError::UnknownModel),
            Err(PickError::NoReadyWorker(_)) => Err(crate::gateway::PickError::NoReadyWorker),
            Err(PickError::TokenizerNotReady { failed, .. }) => {
                Err(crate::gateway::PickError::TokenizerNotReady { failed })
            }
        }
    }

    fn first_token(&self, picked: &crate::gateway::Picked, ttft: Duration) {
        RouterState::first_token(
            self,
            DecisionId(picked.assignment),
            Some(ttft.as_secs_f64()),
            Instant::now(),
        );
    }

    fn inter_token(&self, picked: &crate::gateway::Picked, gap: Duration) {
        self.observe_itl(DecisionId(picked.assignment), gap.as_secs_f64());
    }

    fn done(
        &self,
        picked: &crate::gateway::Picked,
        usage: Option<crate::gateway::openai::Usage>,
        e2e: Duration,
    ) {
        let sat = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        let usage = Usage {
            prompt_tokens: usage.map_or(0, |u| sat(u.prompt_tokens)),
            cached_prompt_tokens: usage.map_or(0, |u| sat(u.cached_tokens)),
            completion_tokens: usage.map_or(0, |u| sat(u.completion_tokens)),
            e2e_seconds: Some(e2e.as_secs_f64()),
        };
        RouterState::done(self, DecisionId(picked.assignment), usage);
    }

    fn abort(&self, picked: &crate::gateway::Picked) {
        RouterState::abort(self, DecisionId(picked.assignment), "gateway");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(route_unlisted: bool) -> RouterState {
        let metrics = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let cfg = RouterConfig {
            route_unlisted,
            seed: 3,
            ..RouterConfig::default()
        };
        RouterState::new(cfg, metrics).expect("state")
    }

    fn identity(id: &str, model: &str) -> SidecarIdentity {
        SidecarIdentity {
            worker_id: id.into(),
            address: format!("{id}:8000"),
            model: model.into(),
            block_size: 4,
            epoch: 1,
            worker_set: "ws".into(),
        }
    }

    fn report(s: &RouterState, stream: u64, id: &str, model: &str) {
        let now = Instant::now();
        s.sidecar_snapshot_start(stream, &identity(id, model), &[], now)
            .expect("snapshot");
        assert!(s.sidecar_snapshot_chunk(stream, id, &[], true, now));
    }

    fn input<'a>(model: &'a str, tokens: &'a [u32]) -> PickInput<'a> {
        PickInput {
            model,
            prompt: Prompt::Tokens(tokens),
            cache_salt: None,
            lora: None,
            headers: None,
            exclude: &[],
            max_tokens: None,
        }
    }

    #[test]
    fn max_tokens_of_reads_openai_and_anthropic_limits() {
        let body = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
        assert_eq!(
            max_tokens_of(&body(serde_json::json!({"max_tokens": 64}))),
            Some(64)
        );
        assert_eq!(
            max_tokens_of(&body(
                serde_json::json!({"max_tokens": 64, "max_completion_tokens": 32})
            )),
            Some(32)
        );
        assert_eq!(
            max_tokens_of(&body(serde_json::json!({"max_tokens": 1e12}))),
            None,
            "not an integer"
        );
        assert_eq!(
            max_tokens_of(&body(serde_json::json!({"max_tokens": 99_999_999_999u64}))),
            Some(u32::MAX)
        );
        assert_eq!(
            max_tokens_of(&body(serde_json::json!({"max_tokens": -1}))),
            None
        );
        assert_eq!(max_tokens_of(&body(serde_json::json!({}))), None);
    }

    #[test]
    fn models_come_from_pools_aliases_and_workers() {
        let s = state(false);
        s.set_catalog(Catalog {
            pools: vec![PoolView {
                name: "ns/p".into(),
                models: vec![
                    ServedModel {
                        name: "m".into(),
                        backend_model: "m".into(),
                    },
                    ServedModel {
                        name: "alias".into(),
                        backend_model: "m".into(),
                    },
                ],
                worker_sets: vec!["ws".into()],
            }],
            workers: vec![DiscoveredWorker {
                id: "w".into(),
                address: "w:1".into(),
                model: "other".into(),
                worker_set: "x".into(),
                ready: true,
            }],
        });
        let ids: Vec<String> = s.models().into_iter().map(|m| m.id).collect();
        assert_eq!(ids, vec!["alias", "m", "other"]);
        assert_eq!(
            s.resolve_model("alias"),
            Some(Resolved {
                backend_model: "m".into(),
                pool: Some("ns/p".into())
            })
        );
        assert_eq!(s.resolve_model("nope"), None);
    }

    #[test]
    fn unlisted_workers_route_only_when_allowed() {
        let strict = state(false);
        report(&strict, 1, "w", "m");
        let tokens = [1, 2, 3, 4];
        assert_eq!(
            strict
                .pick(&input("m", &tokens), Instant::now())
                .map(|a| a.worker_id),
            Err(PickError::UnknownModel("m".into()))
        );
        let open = state(true);
        report(&open, 1, "w", "m");
        let a = open
            .pick(&input("m", &tokens), Instant::now())
            .expect("pick");
        assert_eq!((a.worker_id.as_str(), a.address.as_str()), ("w", "w:8000"));
        let excluded = PickInput {
            exclude: &["w".to_string()],
            ..input("m", &tokens)
        };
        assert_eq!(
            open.pick(&excluded, Instant::now()).map(|a| a.worker_id),
            Err(PickError::NoReadyWorker("m".into()))
        );
    }

    #[test]
    fn release_happens_once_and_degraded_is_counted() {
        let s = state(true);
        report(&s, 1, "w", "m");
        let a = s
            .pick(
                &PickInput {
                    prompt: Prompt::Unavailable,
                    ..input("m", &[])
                },
                Instant::now(),
            )
            .expect("pick");
        assert!(a.decision.degraded);
        assert_eq!(a.decision.degraded_reason.as_deref(), Some("no_prompt"));
        assert_eq!(s.in_flight(), 1);
        assert!(s.first_token(a.decision_id, Some(0.1), Instant::now()));
        assert!(!s.first_token(a.decision_id, Some(0.1), Instant::now()));
        assert!(s.done(a.decision_id, Usage::default()));
        assert!(!s.done(a.decision_id, Usage::default()));
        assert!(!s.abort(a.decision_id, "late"));
        assert_eq!(s.in_flight(), 0);
        let text = s.metrics().encode();
        assert!(
            text.contains(
                "kvroute_router_degraded_decisions_total{model=\"m\",reason=\"no_prompt\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_superseded_stream_cannot_touch_the_worker() {
        let s = state(true);
        report(&s, 1, "w", "m");
        report(&s, 2, "w", "m");
        let now = Instant::now();
        assert!(!s.sidecar_delta(1, "w", &[DeltaOp::Stored(&[1])], now));
        s.sidecar_closed(1, "w");
        let row = s
            .workers_report(now)
            .workers
            .into_iter()
            .find(|w| w.id == "w")
            .expect("row");
        assert!(row.sidecar_connected && !row.stale, "{row:?}");
        s.sidecar_closed(2, "w");
        let row = s
            .workers_report(now)
            .workers
            .into_iter()
            .find(|w| w.id == "w")
            .expect("row");
        assert!(
            !row.sidecar_connected && row.stale && row.routable,
            "{row:?}"
        );
    }
}
