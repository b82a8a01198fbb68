//! The router's shared state: the routing core (KV index, TTFT predictor, assignments, policy)
//! behind one lock, the worker and model view from discovery, sidecar stream bookkeeping,
//! configuration and metrics. Every adapter (ingest, discovery, gateway, pick API, admin)
//! holds a [`RouterState`] clone and calls its synchronous methods; none of them holds a lock
//! across an `.await`.
//!
//! Files: `catalog` (discovery's view, model resolution, routability), `pick` (the pick
//! API: inputs, decisions, reports), `policy` (InferencePolicy sets, verdicts, shedding),
//! `sidecars` (ingest bookkeeping, `/debug/workers`), `tokenizers`, `dispatch` (the
//! embedded gateway's adapter), `lora` (the adapters workers serve, adapter resolution).
//!
//! ```text
//! discovery --set_catalog--------------+
//! ingest ----sidecar_* (snapshot/delta/load/closed)
//!                                      v
//!     RouterState { Arc<Inner { core: Mutex<Core> (routing core: index, workers, policy),
//!                               catalog: RwLock, sidecars: RwLock, metrics,
//!                               taps: Mutex (per-token metrics, step clocks), .. }> }
//!                                      ^
//! gateway / Picker --pick / first_token / done / abort ; admin --explain / workers
//! ```
//!
//! Tokenization happens here, not in the gateway: callers pass the request ([`Prompt`]) and
//! the state renders and tokenizes it with the model's tokenizer (`--tokenizer MODEL=DIR` or
//! one default `--tokenizer DIR`), so the gateway, the gRPC Picker and `/debug/explain` make
//! identical decisions. Callers that already have token ids pass [`Prompt::Tokens`].
//!
//! Routability: a worker is a candidate for a model when (1) discovery lists it as ready
//! (static file: listed in a WorkerSet's `status.workers`; Kubernetes: its pod is Ready) --
//! or, only with `--route-unlisted`, it is merely reported by a sidecar -- and (2) its sidecar
//! has completed at least one snapshot and (3) that stream is open: a worker whose stream
//! ended is no candidate. A worker of a GIE InferencePool ([`WorkerOrigin::InferencePool`])
//! has no sidecar: discovery registers it itself as an open, empty "stream" (load-only, no
//! cache view) until a sidecar of its own reports it (`sidecars::sync_load_only`). One whose reports are older than `stale_after` stays a candidate
//! but is *stale*: the core neither trusts its cache as warm nor as empty. A worker that
//! discovery no longer lists and whose stream has been closed for `retire_after` is retired
//! (see [`RouterState::maintain`]): its blocks, predictor state, assignments (released once)
//! and metric series all go. A sidecar reporting a worker that discovery does not list is
//! tracked (visible in `/debug/workers`, counted as `unlisted`) but never routed to unless
//! `--route-unlisted` is set.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::limits::{LOG_EVERY, Limit, Limits, LogEvery};
use crate::metrics::RouterMetrics;
use crate::readiness::{Phase, Readiness, StartupView, startup_blocker};
use crate::routing::{
    AssignmentId, CoreConfig, Policy, PredictedTtft, PredictedTtftConfig, PredictorConfig,
    RoutingCore, StepClocks, StepConfig, WorkerId, policy_by_name,
};

mod catalog;
mod dispatch;
mod labels;
mod lora;
mod peers;
mod pick;
mod policy;
mod sidecars;
#[cfg(test)]
mod tests;
mod tickets;
mod tokenizers;

pub use catalog::{
    AliasDraw, Catalog, DiscoveredWorker, ModelInfo, PoolView, Resolved, ServedModel, WorkerOrigin,
};
pub use peers::PeerApplied;
pub use pick::{
    BodyKind, CandidateRecord, DecisionRecord, EjectedRecord, LoraRecord, PickError, PickInput,
    Picked, PolicyHooks, Prompt, Usage, max_tokens_of,
};
pub use policy::{
    ModelSwitchRecord, PoliciesReport, PolicyMetrics, REQUEST_ID_HEADER, SERVICE_CLASS_HEADER,
    TTFT_TARGET_HEADER, VerdictRecord,
};
pub use sidecars::{
    DeltaOp, EjectionView, LoadApplied, LoadView, SidecarIdentity, SnapshotRefused, WorkerReport,
    WorkersReport,
};
pub use tickets::{DecisionId, TicketError};
pub use tokenizers::TokenizerDirs;

use crate::tokenizer_registry::Tokenizers;
use sidecars::SidecarView;

/// Router settings the state needs (from flags).
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// Policy name (`kvroute`, `random`, `round-robin`, ...; see `routing::policies`).
    pub policy: String,
    /// Near-tie margin of the kvroute policy, seconds.
    pub tie_margin_s: f64,
    /// Hot-prefix window of the kvroute policy, requests (0: off).
    pub hot_prefix_window: u32,
    /// `CoreConfig::working_set_horizon` (`--working-set-horizon`; 0: off).
    pub working_set_horizon: u32,
    /// `CoreConfig::queue_drain` (on by default; tests turn it off).
    pub queue_drain: bool,
    /// `CoreConfig::rate_pool` (`--rate-pool`).
    pub rate_pool: Option<f64>,
    /// `CoreConfig::steps`: the engine step each worker runs, from the chunks relayed.
    pub steps: StepConfig,
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
    /// A worker that discovery does not list and whose sidecar stream has been closed this
    /// long is retired: its blocks, predictor state, assignments and metric series go.
    pub retire_after: Duration,
    /// Tokenizer directories: per served/backend model, plus an optional default.
    pub tokenizers: TokenizerDirs,
    /// Prior of the TTFT predictor.
    pub predictor: PredictorConfig,
    /// How long the listeners stay open once draining begins (see [`crate::readiness`]).
    pub drain_delay: Duration,
    /// The bounded router's caps ([`crate::limits`]).
    pub limits: Limits,
    /// Tenant identity, limits and metrics settings ([`crate::tenant`]).
    pub tenants: crate::tenant::TenantConfig,
    /// Passive health: when workers that keep failing are ejected, and for how long.
    pub outlier: crate::routing::OutlierConfig,
    /// How the other replicas' placements count (active-active replicas).
    pub peers: crate::routing::PeerConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            policy: "kvroute".into(),
            tie_margin_s: 0.02,
            hot_prefix_window: PredictedTtftConfig::default().hot_prefix_window,
            working_set_horizon: CoreConfig::default().working_set_horizon,
            queue_drain: CoreConfig::default().queue_drain,
            rate_pool: CoreConfig::default().rate_pool,
            steps: StepConfig::default(),
            seed: 0,
            assignment_ttl: Duration::from_secs(600),
            stale_after: Duration::from_secs(30),
            max_body_bytes: 16 << 20,
            route_unlisted: false,
            retire_after: Duration::from_secs(30),
            tokenizers: TokenizerDirs::default(),
            predictor: PredictorConfig::default(),
            drain_delay: Duration::ZERO,
            limits: Limits::default(),
            tenants: crate::tenant::TenantConfig::default(),
            outlier: crate::routing::OutlierConfig::default(),
            peers: crate::routing::PeerConfig::default(),
        }
    }
}

/// The routing core and the policy, mutated together.
struct Core {
    routing: RoutingCore,
    policy: Box<dyn Policy>,
    /// What each outstanding assignment needs for metrics: model label and worker key.
    labels: HashMap<AssignmentId, (String, String)>,
    /// Pick API decision ids of outstanding assignments (forgotten with the assignment).
    tickets: tickets::Tickets,
}

struct Inner {
    config: RouterConfig,
    metrics: RouterMetrics,
    tokenizers: Tokenizers,
    epoch: Instant,
    core: Mutex<Core>,
    /// What the relay's per-token observations update, so that they never wait for the
    /// core (a routing decision). Entries come and go under the core lock, with
    /// `Core::labels` (lock order: core, then this).
    taps: Mutex<TokenTaps>,
    catalog: RwLock<Catalog>,
    sidecars: RwLock<HashMap<String, SidecarView>>,
    next_stream: AtomicU64,
    discovery_synced: AtomicBool,
    readiness: Readiness,
    limit_log: LogEvery,
    tenants: Arc<crate::tenant::Tenants>,
    policy: policy::PolicyStore,
    /// The request classifiers (labels for policy rules).
    classifier: kvroute_classify::Classifier,
    /// This replica's id in the peer exchange (random per process).
    replica_id: String,
    /// This replica's placement events for the peer streams (set by the first subscriber).
    peer_events: std::sync::OnceLock<tokio::sync::broadcast::Sender<crate::peer::wire::PeerEvent>>,
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
        dir: std::path::PathBuf,
        /// Why.
        #[source]
        source: kvroute_tokenization::TokenizeError,
    },
    /// A tenant metric could not be registered.
    #[error("tenant metrics: {0}")]
    Metrics(prometheus::Error),
}

/// Per-token state kept beside the core (see `Inner::taps`).
#[derive(Default)]
pub(super) struct TokenTaps {
    /// Each assignment past its first token: its worker and inter-token-latency histogram.
    pub(super) streams: HashMap<AssignmentId, (WorkerId, prometheus::Histogram)>,
    /// Each worker's engine step, from the chunks relayed (`routing::StepClocks`); copied
    /// into the core before each decision.
    pub(super) steps: StepClocks,
}

impl RouterState {
    /// Builds the state: loads the tokenizers, builds the policy. Fails on an unknown policy
    /// name or an unreadable tokenizer directory.
    pub fn new(config: RouterConfig, metrics: RouterMetrics) -> Result<Self, StateError> {
        let policy: Box<dyn Policy> = if config.policy == "kvroute" {
            let cfg = PredictedTtftConfig {
                tie_margin_s: config.tie_margin_s,
                hot_prefix_window: config.hot_prefix_window,
                ..PredictedTtftConfig::default()
            };
            Box::new(PredictedTtft::new(cfg, config.seed))
        } else {
            policy_by_name(&config.policy, config.seed)?
        };
        let core_cfg = CoreConfig {
            predictor: config.predictor.clone(),
            stale_after_s: config.stale_after.as_secs_f64(),
            block_caps: config.limits.worker_blocks,
            outlier: config.outlier,
            peers: config.peers,
            queue_drain: config.queue_drain,
            rate_pool: config.rate_pool,
            steps: config.steps,
            working_set_horizon: config.working_set_horizon,
            // kvroute's model; the baseline policies keep their sources' view of the cache.
            expect_evictions: policy.expects_evictions(),
            ..CoreConfig::default()
        };
        let core = Core {
            routing: RoutingCore::new(core_cfg),
            policy,
            labels: HashMap::new(),
            tickets: tickets::Tickets::default(),
        };
        let tokenizers = Tokenizers::load(&config.tokenizers)?;
        let readiness = Readiness::new(config.drain_delay);
        let tenants = crate::tenant::Tenants::new(&config.tenants, metrics.registry())
            .map_err(StateError::Metrics)?;
        Ok(Self(Arc::new(Inner {
            config,
            metrics,
            tokenizers,
            epoch: Instant::now(),
            core: Mutex::new(core),
            taps: Mutex::new(TokenTaps::default()),
            catalog: RwLock::new(Catalog::default()),
            sidecars: RwLock::new(HashMap::new()),
            next_stream: AtomicU64::new(1),
            discovery_synced: AtomicBool::new(false),
            readiness,
            limit_log: LogEvery::new(LOG_EVERY),
            tenants,
            policy: policy::PolicyStore::default(),
            classifier: labels::classifier(),
            replica_id: format!("{:016x}", rand::random::<u64>()),
            peer_events: std::sync::OnceLock::new(),
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

    /// Tenant authentication, limits and metrics, shared by the gateway and the Pick API.
    pub fn tenants(&self) -> &Arc<crate::tenant::Tenants> {
        &self.0.tenants
    }

    /// A cap was hit: counts it and logs it (at most once per [`LOG_EVERY`] per cap, with the
    /// number of hits the line stands for). `what` says what was refused.
    pub fn limit_hit(&self, limit: Limit, what: std::fmt::Arguments<'_>) {
        self.0
            .metrics
            .limit_hits
            .with_label_values(&[limit.label()])
            .inc();
        if let Some(hits) = self.0.limit_log.hit(limit, Instant::now()) {
            tracing::warn!(limit = limit.label(), hits, "cap reached: {what}");
        }
    }

    /// Seconds since the state was created: the clock handed to the pure core.
    ///
    /// (The step clocks read it too, from the token path.)
    fn secs(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.0.epoch).as_secs_f64()
    }

    // ---------------------------------------------------------------- discovery

    /// Replaces the discovery view.
    pub fn set_catalog(&self, catalog: Catalog) {
        self.set_catalog_at(catalog, Instant::now());
    }

    /// [`RouterState::set_catalog`] at `now`: also registers (or closes) the workers that
    /// discovery lists without a sidecar ([`WorkerOrigin::InferencePool`]).
    pub fn set_catalog_at(&self, catalog: Catalog, now: Instant) {
        // Each known worker's engine step budget, as its WorkerSet now says.
        let budgets: Vec<(String, Option<f64>)> = catalog
            .workers
            .iter()
            .map(|w| (w.id.clone(), w.step_budget_tokens))
            .collect();
        *self.0.catalog.write() = catalog;
        {
            let mut core = self.0.core.lock();
            for (id, budget) in budgets {
                if let Some(w) = core.routing.worker_id(&id) {
                    core.routing.set_step_budget(w, budget);
                }
            }
        }
        self.sync_load_only(now);
    }

    /// Marks discovery as having completed its initial sync.
    pub fn set_discovery_synced(&self) {
        self.0.discovery_synced.store(true, Ordering::Release);
    }

    /// True once discovery completed its initial sync.
    pub fn discovery_synced(&self) -> bool {
        self.0.discovery_synced.load(Ordering::Acquire)
    }

    // ---------------------------------------------------------------- lifecycle

    /// Periodic upkeep at `now`: releases assignments older than the TTL and retires
    /// workers that discovery no longer lists and whose stream has been closed for
    /// `retire_after`. Returns (expired assignments, retired workers).
    pub fn maintain(&self, now: Instant) -> (usize, usize) {
        // A GIE worker whose own sidecar stream ended goes back to load-only routing.
        self.sync_load_only(now);
        let t = self.secs(now);
        self.0.core.lock().routing.peers_mut().upkeep(t);
        (self.expire(now), self.retire_gone(now))
    }

    /// Retires every gone worker (see [`RouterConfig::retire_after`]): the core drops it
    /// and releases its assignments once, the sidecar view and metric series go with it.
    pub fn retire_gone(&self, now: Instant) -> usize {
        let t = self.secs(now);
        let grace = self.0.config.retire_after.as_secs_f64();
        let listed: std::collections::HashSet<String> = {
            let catalog = self.0.catalog.read();
            let sidecars = self.0.sidecars.read();
            catalog
                .workers
                .iter()
                .filter_map(|w| catalog::find_sidecar(&sidecars, w).map(|(k, _)| k.to_string()))
                .collect()
        };
        let retired = {
            let mut core = self.0.core.lock();
            let retired = core.routing.retire_gone(t, grace, |k| listed.contains(k));
            for r in &retired {
                for (id, _) in &r.released {
                    self.forget_assignment(&mut core, *id);
                }
                // The core forgot its step clock; the next pick copies these over it, and a
                // worker that reuses the id must not start with the gone one's step.
                self.0.taps.lock().steps.forget(r.worker);
            }
            for r in &retired {
                for (id, _) in &r.released {
                    self.publish(crate::peer::wire::PeerEvent::Ended(id.0));
                }
            }
            retired
        };
        if retired.is_empty() {
            return 0;
        }
        let mut sidecars = self.0.sidecars.write();
        for r in &retired {
            // A newer stream may have taken the key over meanwhile: keep that one.
            if sidecars
                .get(&r.key)
                .is_some_and(|s| s.worker == r.worker && !s.stream_open)
            {
                sidecars.remove(&r.key);
            }
        }
        drop(sidecars);
        let m = &self.0.metrics;
        for r in &retired {
            m.forget_worker(&r.key);
            if !r.released.is_empty() {
                m.released
                    .with_label_values(&["retired"])
                    .inc_by(r.released.len() as u64);
            }
            tracing::info!(worker = %r.key, released = r.released.len(), "worker retired");
        }
        m.workers_retired.inc_by(retired.len() as u64);
        retired.len()
    }

    // ---------------------------------------------------------------- readiness

    /// The replica's phase (starting, ready, draining).
    pub fn readiness(&self) -> &Readiness {
        &self.0.readiness
    }

    /// Whether this replica should be sent traffic (see [`crate::readiness`]): a starting
    /// replica is judged at `now` and latches to ready once nothing blocks it. `Err` says
    /// why not.
    pub fn check_ready(&self, now: Instant) -> Result<(), String> {
        match self.0.readiness.phase() {
            Phase::Ready => return Ok(()),
            Phase::Draining => return Err("shutting down".into()),
            Phase::Starting => {}
        }
        let view = StartupView {
            discovery_synced: self.discovery_synced(),
            tokenizers_pending: self.0.tokenizers.first_load_pending(),
            listed_workers: self
                .0
                .catalog
                .read()
                .workers
                .iter()
                .filter(|w| w.ready)
                .count(),
            routable_workers: self
                .workers_report(now)
                .workers
                .iter()
                .filter(|w| w.routable)
                .count(),
        };
        if let Some(why) = startup_blocker(&view) {
            return Err(why);
        }
        if self.policies_pending() {
            return Err("InferencePolicies not listed yet".into());
        }
        match self.0.readiness.mark_ready() {
            Phase::Draining => Err("shutting down".into()),
            _ => Ok(()),
        }
    }
}
