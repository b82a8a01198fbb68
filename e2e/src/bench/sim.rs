//! Discrete-event simulation of a pool of vLLM workers behind a router, in virtual time.
//!
//! ```text
//! users (closed loop) / Poisson arrivals
//!     | turn k of a session (history + new tokens)
//!     v
//! RoutingCore::decide(policy)  <-- index updates and load samples, `report_delay_s` late
//!     |                                           ^
//!     v submit                                    | ResidentSet::apply (the sidecar's re-hash)
//! Engine (mock vLLM, one per worker) --step--> KV events, first tokens, finishes
//!     first token -> RoutingCore::first_token (the gateway sees it at once)
//!     finished    -> RoutingCore::finish, the session's next turn
//! ```
//!
//! Everything is the real code: the mock worker's engine model, the sidecar's re-hashing of
//! vLLM events into kvroute hashes, the router's index, predictor, assignments and policies.
//! Only sockets are replaced by a delay. The greedy-clairvoyant policy does not use the
//! router: it clones every worker's engine, runs the request on each clone until its first
//! token, and picks the fastest (perfect, instantaneous knowledge of cache and queue, used
//! greedily: a heuristic, not a bound). Each request also gets its TTFT floor (`floor.rs`).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use anyhow::bail;
use kvroute_mock_vllm::engine::{Engine, EngineConfig, EngineEvent, EngineRequest};
use kvroute_router::routing::{
    AssignmentId, Calibration, CoreConfig, LoadSample, Policy, RouteRequest, RoutingCore,
    StepConfig, WorkerId, policy_by_name_calibrated,
};
use kvroute_sidecar::state::{ApplyStats, Op, Ops, ResidentSet, StateConfig};
use kvroute_vllm_wire::KvEvent;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::floor::FloorTracker;
use super::workload::Session;

/// The model name workers serve in the simulation (part of the kvroute hash root).
const MODEL: &str = "Qwen/Qwen3-32B-FP8";

/// How requests arrive.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arrivals {
    /// `users` clients, each sending its next turn as soon as the previous one finished.
    Closed {
        /// Concurrent clients.
        users: usize,
    },
    /// New sessions start at Poisson times (`rate_per_s`); a session's turns follow each
    /// other as in the closed loop.
    Poisson {
        /// Mean session starts per simulated second.
        rate_per_s: f64,
    },
}

/// Settings of one simulated run.
#[derive(Clone, Debug, Serialize)]
pub struct SimConfig {
    /// Simulated workers.
    pub workers: usize,
    /// The worker profile's name or path; a comma-separated list gives worker i the
    /// `i % len`-th profile (a heterogeneous pool, see profiles.rs).
    pub profile: String,
    /// Delay between a KV event / load sample on a worker and the router applying it.
    pub report_delay_s: f64,
    /// How often the sidecar scrapes the worker's load.
    pub scrape_interval_s: f64,
    /// How requests arrive.
    pub arrivals: Arrivals,
    /// Seed of the engines' token sampling and of the arrival times.
    pub seed: u64,
    /// Also simulate every request on every worker (as greedy-clairvoyant does) and record the true
    /// TTFTs, so a policy's regret can be measured. Slow; off in normal runs.
    pub diagnose: bool,
    /// Start the router from [`super::profiles::GENERIC_PRIOR`] (no home advantage: the
    /// kinference scenarios) instead of the router's own default prior, which equals the
    /// built-in L40S profile (the default suite, whose committed figures were made with it).
    pub generic_prior: bool,
    /// kvroute's overcommit margin, when not the router's default.
    pub overcommit_margin: Option<super::OvercommitMargin>,
    /// kvroute's rate pool fraction (0: off), when not the router's default.
    pub rate_pool: Option<f64>,
    /// The share of the running engine step kvroute's predictions count, when not the
    /// router's default.
    pub step_share: Option<f64>,
    /// kvroute's working-set horizon (0: off), when not the router's default.
    pub working_set_horizon: Option<u32>,
    /// kvroute's decode-only steps, when not the router's default.
    pub decode_steps: Option<kvroute_router::routing::DecodeSteps>,
    /// kvroute's engine step budget for its whole-steps TTFT line (0: off), when not the
    /// router's default.
    pub step_budget_tokens: Option<f64>,
}

/// What happened to one request.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRecord {
    /// Index of the worker that served it.
    pub worker: usize,
    /// When it arrived, simulated seconds.
    pub arrival: f64,
    /// From arrival to first token, seconds.
    pub ttft: f64,
    /// From arrival to the last token, seconds.
    pub e2e: f64,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens the worker's prefix cache held.
    pub cached_tokens: usize,
    /// Predicted TTFT of the chosen worker (NaN for greedy-clairvoyant / policies without one).
    pub predicted_ttft: f64,
    /// The p90 upper bound the router published with that prediction (its
    /// `routing::TtftBound`; NaN when it had none yet).
    pub published_bound: f64,
    /// The request's TTFT floor: on an idle worker already caching the longest prefix any
    /// earlier request made (`floor.rs`), seconds.
    pub floor_ttft: f64,
    /// With `SimConfig::diagnose`: the TTFT the request would have had on each worker, had it
    /// been sent there at its arrival (empty otherwise).
    pub true_ttfts: Vec<f64>,
    /// With `SimConfig::diagnose`: each worker's predicted TTFT, as the decision record had
    /// them (empty for greedy-clairvoyant).
    pub predicted_ttfts: Vec<f64>,
    /// With `SimConfig::diagnose`: each worker's policy score.
    pub scores: Vec<f64>,
    /// With `SimConfig::diagnose`: the decision record's candidates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidates: Option<serde_json::Value>,
    /// With `SimConfig::diagnose`: why the policy chose the worker (`Reason::as_str`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// With `SimConfig::diagnose`: the prompt's first token id (in the shared-prefix workload
    /// it tells the prefix apart).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_token: Option<u32>,
}

/// The outcome of one run.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// Every completed request, in completion order.
    pub records: Vec<RequestRecord>,
    /// Requests the engine refused (prompt longer than the model or the cache).
    pub rejected: usize,
    /// Simulated seconds from the first arrival to the last completion.
    pub makespan: f64,
}

/// A policy of the benchmark: one of the router's, or greedy-clairvoyant.
pub enum SimPolicy {
    /// One of the router's policies, choosing from the router's view of the workers.
    Router(Box<dyn Policy>),
    /// `greedy-clairvoyant`: sends each request to the worker with the lowest true TTFT for
    /// it alone (simulated on every worker), ignoring what that does to later requests. A
    /// heuristic with perfect knowledge, not a limit: other policies beat it on some tails.
    GreedyClairvoyant,
}

impl SimPolicy {
    /// `greedy-clairvoyant` or any name `policy_by_name` accepts.
    pub fn by_name(name: &str, seed: u64) -> anyhow::Result<Self> {
        Self::calibrated(name, seed, Calibration::default())
    }

    /// [`SimPolicy::by_name`] with the baselines that take a calibration (llm-d's peak
    /// prefill throughput) calibrated on `profile` as upstream's recipe says. `profile` may
    /// be a pool (`a,b,...`, see [`super::profiles::pool`]): the slowest worker's peak, the
    /// one that saturates first.
    pub fn for_profile(name: &str, seed: u64, profile: &str) -> anyhow::Result<Self> {
        let peak = super::profiles::pool(profile)?
            .iter()
            .map(super::floor::peak_prefill_throughput)
            .fold(f64::INFINITY, f64::min);
        Self::calibrated(
            name,
            seed,
            Calibration {
                peak_prefill_tokens_per_s: Some(peak),
            },
        )
    }

    fn calibrated(name: &str, seed: u64, calibration: Calibration) -> anyhow::Result<Self> {
        if name == "greedy-clairvoyant" {
            return Ok(SimPolicy::GreedyClairvoyant);
        }
        Ok(SimPolicy::Router(
            policy_by_name_calibrated(name, seed, calibration)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        ))
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Time(f64);

impl Eq for Time {}
impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Time {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[derive(Debug)]
enum Event {
    /// A user (closed loop) or a new session (open loop) is ready to send its next turn.
    NextTurn { slot: usize },
    /// Poisson: start the next session.
    SessionArrival,
    /// A worker's step ends; its output becomes visible.
    StepEnd { worker: usize },
    /// Index changes from a worker's sidecar reach the router.
    DeliverOps { worker: usize, ops: Ops },
    /// A load sample reaches the router.
    DeliverLoad { worker: usize, sample: LoadSample },
    /// The sidecar scrapes a worker's load.
    Scrape { worker: usize },
}

struct Pending(Time, u64, Event);
impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        self.0 == o.0 && self.1 == o.1
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    // Min-heap on (time, insertion order).
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

struct Worker {
    engine: Engine,
    resident: ResidentSet,
    id: WorkerId,
    stepping: bool,
    output: Option<kvroute_mock_vllm::engine::StepOutput>,
}

/// A request in flight.
struct Live {
    slot: usize,
    worker: usize,
    arrival: f64,
    first_token: Option<f64>,
    assignment: Option<AssignmentId>,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    predicted_ttft: f64,
    published_bound: f64,
    floor_ttft: f64,
    diag: Diag,
}

/// Per-request diagnostics (see `SimConfig::diagnose`).
#[derive(Default)]
struct Diag {
    true_ttfts: Vec<f64>,
    predicted_ttfts: Vec<f64>,
    scores: Vec<f64>,
    candidates: Option<serde_json::Value>,
    reason: Option<&'static str>,
}

/// Where a session stands: its next turn and its history so far.
struct SlotState {
    session: Option<usize>,
    turn: usize,
    history: Vec<u32>,
}

/// Runs `sessions` through a simulated pool routed by `policy`.
pub fn run(cfg: &SimConfig, sessions: &[Session], policy: SimPolicy) -> anyhow::Result<RunResult> {
    let pool = super::profiles::pool(&cfg.profile)?;
    if cfg.workers == 0 {
        bail!("the pool needs at least one worker");
    }
    // The kinference scenarios start the router from a generic prior, not the simulated
    // GPU's (no home advantage); the default suite keeps the router's default prior.
    let mut core_cfg = if cfg.generic_prior {
        super::profiles::sim_core_config()
    } else {
        CoreConfig::default()
    };
    // The eviction expectation is kvroute's model: it moves the uncached tokens every
    // policy's bookkeeping records, and the baselines keep their own sources' view.
    core_cfg.expect_evictions = matches!(&policy, SimPolicy::Router(p) if p.expects_evictions());
    if let Some(m) = cfg.overcommit_margin {
        core_cfg.overcommit_margin_tokens = m.0;
    }
    if let Some(f) = cfg.rate_pool {
        core_cfg.rate_pool =
            kvroute_router::routing::rate_pool_from(f).map_err(anyhow::Error::msg)?;
    }
    if let Some(h) = cfg.working_set_horizon {
        core_cfg.working_set_horizon = h;
    }
    if let Some(d) = cfg.decode_steps {
        core_cfg.steps.decode_steps = d;
    }
    if let Some(c) = cfg.step_share {
        core_cfg.steps.share = StepConfig::check_share(c).map_err(anyhow::Error::msg)?;
    }
    if let Some(t) = cfg.step_budget_tokens {
        core_cfg.predictor.step_budget_tokens =
            kvroute_router::routing::PredictorConfig::check_step_budget(t)
                .map_err(anyhow::Error::msg)?;
    }
    let mut core = RoutingCore::new(core_cfg);
    let mut workers = Vec::with_capacity(cfg.workers);
    for i in 0..cfg.workers {
        let profile = &pool[i % pool.len()];
        let mut ec = EngineConfig::from_profile(profile);
        // One seed for all workers: a request generates the same tokens wherever it runs,
        // so multi-turn histories do not depend on the policy.
        ec.seed = cfg.seed;
        let block_size = ec.block_size;
        let id = core.snapshot(&format!("worker-{i}"), block_size, 1, &[], 0.0);
        // One WorkerSet per GPU profile, as a cluster runs them: rates pool within a set.
        core.set_speed_class(id, &profile.name);
        // Its engine's step budget, as the router learns it from the WorkerSet (the
        // engine's `--max-num-batched-tokens` or vLLM's default for the GPU), unless
        // `--step-budget-tokens` sets one for every worker.
        if cfg.step_budget_tokens.is_none() {
            core.set_step_budget(id, Some(f64::from(profile.max_num_batched_tokens)));
        }
        workers.push(Worker {
            engine: Engine::new(profile.clone(), ec),
            resident: ResidentSet::new(StateConfig {
                model: MODEL.to_string(),
                default_lora: None,
                block_size: Some(block_size as u32),
                max_blocks: 1 << 22,
            }),
            id,
            stepping: false,
            output: None,
        });
    }
    let by_id: HashMap<WorkerId, usize> =
        workers.iter().enumerate().map(|(i, w)| (w.id, i)).collect();
    let allowed: Vec<WorkerId> = workers.iter().map(|w| w.id).collect();
    let floor = FloorTracker::new(&pool);
    let mut sim = Sim {
        floor,
        now: 0.0,
        seq: 0,
        queue: BinaryHeap::new(),
        cfg: cfg.clone(),
        core,
        workers,
        by_id,
        allowed,
        policy,
        sessions,
        next_session: 0,
        slots: Vec::new(),
        live: HashMap::new(),
        next_request_id: 1,
        result: RunResult::default(),
        arrivals_rng: ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x6172_7269_7661_6c73),
        active_sessions: 0,
        first_arrival: None,
        last_finish: 0.0,
    };
    sim.start();
    sim.run_to_end();
    let Sim {
        mut result,
        first_arrival,
        last_finish,
        ..
    } = sim;
    result.makespan = (last_finish - first_arrival.unwrap_or(0.0)).max(0.0);
    Ok(result)
}

struct Sim<'a> {
    floor: FloorTracker,
    now: f64,
    seq: u64,
    queue: BinaryHeap<Pending>,
    cfg: SimConfig,
    core: RoutingCore,
    workers: Vec<Worker>,
    by_id: HashMap<WorkerId, usize>,
    allowed: Vec<WorkerId>,
    policy: SimPolicy,
    sessions: &'a [Session],
    next_session: usize,
    slots: Vec<SlotState>,
    live: HashMap<u64, Live>,
    next_request_id: u64,
    result: RunResult,
    arrivals_rng: ChaCha8Rng,
    active_sessions: usize,
    first_arrival: Option<f64>,
    last_finish: f64,
}

impl Sim<'_> {
    fn push(&mut self, at: f64, ev: Event) {
        self.seq += 1;
        self.queue.push(Pending(Time(at), self.seq, ev));
    }

    fn start(&mut self) {
        match self.cfg.arrivals {
            Arrivals::Closed { users } => {
                for _ in 0..users.max(1) {
                    let slot = self.new_slot();
                    self.push(0.0, Event::NextTurn { slot });
                }
            }
            Arrivals::Poisson { .. } => self.push(0.0, Event::SessionArrival),
        }
        for w in 0..self.workers.len() {
            // Stagger scrapes like independent sidecars would be.
            let offset = self.cfg.scrape_interval_s * w as f64 / self.workers.len() as f64;
            self.push(offset, Event::Scrape { worker: w });
        }
    }

    fn new_slot(&mut self) -> usize {
        self.slots.push(SlotState {
            session: None,
            turn: 0,
            history: Vec::new(),
        });
        self.slots.len() - 1
    }

    fn done(&self) -> bool {
        self.next_session >= self.sessions.len()
            && self.live.is_empty()
            && self.active_sessions == 0
    }

    fn run_to_end(&mut self) {
        while let Some(Pending(Time(t), _, ev)) = self.queue.pop() {
            self.now = t;
            match ev {
                Event::NextTurn { slot } => self.next_turn(slot),
                Event::SessionArrival => self.session_arrival(),
                Event::StepEnd { worker } => self.step_end(worker),
                Event::DeliverOps { worker, ops } => self.deliver_ops(worker, ops),
                Event::DeliverLoad { worker, sample } => {
                    let id = self.workers[worker].id;
                    self.core.load(id, sample, self.now);
                }
                Event::Scrape { worker } => {
                    if self.done() {
                        continue;
                    }
                    let l = self.workers[worker].engine.load();
                    let block_size = self.workers[worker].engine.config().block_size;
                    let sample = LoadSample {
                        waiting: l.waiting as u32,
                        running: l.running as u32,
                        kv_usage: l.kv_cache_usage as f32,
                        // What the sidecar reads from `vllm:cache_config_info`.
                        kv_capacity_tokens: (l.num_blocks * block_size) as u64,
                    };
                    self.push(
                        self.now + self.cfg.report_delay_s,
                        Event::DeliverLoad { worker, sample },
                    );
                    self.push(
                        self.now + self.cfg.scrape_interval_s,
                        Event::Scrape { worker },
                    );
                }
            }
        }
    }

    fn session_arrival(&mut self) {
        if self.next_session >= self.sessions.len() {
            return;
        }
        let slot = self.new_slot();
        self.next_turn(slot);
        if let Arrivals::Poisson { rate_per_s } = self.cfg.arrivals {
            let u: f64 = self.arrivals_rng.random::<f64>().max(1e-12);
            let gap = -u.ln() / rate_per_s.max(1e-9);
            self.push(self.now + gap, Event::SessionArrival);
        }
    }

    /// Sends the slot's next turn, taking a new session when the current one is finished.
    fn next_turn(&mut self, slot: usize) {
        let needs_session = match self.slots[slot].session {
            None => true,
            Some(s) => self.slots[slot].turn >= self.sessions[s].turns.len(),
        };
        if needs_session {
            if self.slots[slot].session.take().is_some() {
                self.active_sessions -= 1;
            }
            // Open loop: a slot serves exactly one session.
            let reuse =
                matches!(self.cfg.arrivals, Arrivals::Closed { .. }) || self.slots[slot].turn == 0;
            if !reuse || self.next_session >= self.sessions.len() {
                return;
            }
            let st = &mut self.slots[slot];
            st.session = Some(self.next_session);
            st.turn = 0;
            st.history.clear();
            self.next_session += 1;
            self.active_sessions += 1;
        }
        let Some(s) = self.slots[slot].session else {
            return;
        };
        let session = &self.sessions[s];
        let turn = &session.turns[self.slots[slot].turn];
        let mut prompt = std::mem::take(&mut self.slots[slot].history);
        prompt.extend_from_slice(&turn.new_tokens);
        self.slots[slot].turn += 1;
        let id = self.next_request_id;
        self.next_request_id += 1;
        self.first_arrival.get_or_insert(self.now);
        let salt = session.cache_salt.clone();
        let floor_ttft = self
            .floor
            .arrival(salt.as_deref(), &prompt, turn.max_tokens);
        let mut diag = Diag::default();
        if self.cfg.diagnose {
            diag.true_ttfts = self
                .workers
                .iter()
                .map(|w| {
                    true_ttft(
                        &w.engine,
                        &prompt,
                        salt.as_deref(),
                        turn.max_tokens,
                        id,
                        self.now,
                    )
                })
                .collect();
        }
        let (worker, assignment, predicted) =
            self.route(&prompt, salt.as_deref(), turn.max_tokens, id, &mut diag);
        let published_bound = assignment
            .and_then(|a| self.core.assignment(a))
            .map_or(f64::NAN, |a| a.ttft_bound);
        let req = EngineRequest {
            id,
            prompt: prompt.clone(),
            max_tokens: turn.max_tokens,
            ignore_eos: true,
            cache_salt: salt,
            lora_name: None,
        };
        if self.workers[worker].engine.submit(req, self.now).is_err() {
            self.result.rejected += 1;
            if let Some(a) = assignment {
                self.core.abort(a);
            }
            // Skip the rest of the session: its history can only grow.
            self.slots[slot].turn = usize::MAX;
            let now = self.now;
            self.push(now, Event::NextTurn { slot });
            return;
        }
        self.live.insert(
            id,
            Live {
                slot,
                worker,
                arrival: self.now,
                first_token: None,
                assignment,
                prompt,
                generated: Vec::new(),
                predicted_ttft: predicted,
                published_bound,
                floor_ttft,
                diag,
            },
        );
        self.kick(worker);
    }

    /// Chooses a worker: the router core with the policy, or greedy-clairvoyant.
    fn route(
        &mut self,
        prompt: &[u32],
        salt: Option<&str>,
        max_tokens: u32,
        id: u64,
        diag: &mut Diag,
    ) -> (usize, Option<AssignmentId>, f64) {
        match &mut self.policy {
            SimPolicy::Router(policy) => {
                let req = RouteRequest {
                    tokens: Some(prompt),
                    model: MODEL,
                    lora: None,
                    cache_salt: salt,
                    max_tokens: Some(max_tokens),
                };
                let Some((plan, decision)) =
                    self.core
                        .decide(policy.as_mut(), &req, &self.allowed, self.now)
                else {
                    return (0, None, f64::NAN);
                };
                let worker = self.by_id.get(&decision.chosen).copied().unwrap_or(0);
                let predicted = decision.predicted_ttft();
                if self.cfg.diagnose {
                    let mut pred = vec![f64::NAN; self.workers.len()];
                    let mut scores = vec![f64::NAN; self.workers.len()];
                    for c in &decision.candidates {
                        if let Some(&i) = self.by_id.get(&c.candidate.worker) {
                            pred[i] = c.candidate.published_ttft();
                            scores[i] = c.score;
                        }
                    }
                    diag.predicted_ttfts = pred;
                    diag.scores = scores;
                    diag.candidates = serde_json::to_value(&decision.candidates).ok();
                    diag.reason = Some(decision.reason.as_str());
                }
                let a = self.core.assign(&plan, &decision, self.now);
                (worker, Some(a), predicted)
            }
            SimPolicy::GreedyClairvoyant => {
                let mut best = (0, f64::INFINITY);
                for (i, w) in self.workers.iter().enumerate() {
                    let ttft = true_ttft(&w.engine, prompt, salt, max_tokens, id, self.now);
                    if ttft < best.1 {
                        best = (i, ttft);
                    }
                }
                (best.0, None, best.1)
            }
        }
    }

    /// Starts a step on an idle worker that has work.
    fn kick(&mut self, worker: usize) {
        let now = self.now;
        let w = &mut self.workers[worker];
        if w.stepping || !w.engine.has_work() {
            return;
        }
        if let Some(out) = w.engine.step(now) {
            let end = out.end();
            w.output = Some(out);
            w.stepping = true;
            self.push(end, Event::StepEnd { worker });
        }
    }

    fn step_end(&mut self, worker: usize) {
        let Some(out) = self.workers[worker].output.take() else {
            return;
        };
        self.workers[worker].stepping = false;
        // A streamed chunk of a routed request marks the step's end for the router, as the
        // chunks it relays do live (`routing::StepClocks`).
        let streamed = out.events.iter().any(|ev| match ev {
            EngineEvent::FirstToken { id, .. } | EngineEvent::Token { id, .. } => {
                self.live.get(id).is_some_and(|l| l.assignment.is_some())
            }
            _ => false,
        });
        if streamed {
            let id = self.workers[worker].id;
            self.core.step_observed(id, self.now);
        }
        let mut kv: Vec<KvEvent> = Vec::new();
        for ev in out.events {
            match ev {
                EngineEvent::Kv(e) => kv.push(e),
                EngineEvent::FirstToken { id, at } => {
                    if let Some(l) = self.live.get_mut(&id) {
                        l.first_token = Some(at);
                        if let Some(a) = l.assignment {
                            self.core.first_token(a, at, None);
                        }
                    }
                }
                EngineEvent::Token { id, token } => {
                    if let Some(l) = self.live.get_mut(&id) {
                        l.generated.push(token);
                    }
                }
                EngineEvent::Finished { id, usage, .. } => {
                    if let Some(l) = self.live.remove(&id) {
                        self.finish(l, usage.cached_tokens);
                    }
                }
            }
        }
        if !kv.is_empty() {
            let w = &mut self.workers[worker];
            let mut ops = Ops::default();
            let mut stats = ApplyStats::default();
            for e in &kv {
                w.resident.apply(e, &mut ops, &mut stats);
            }
            if !ops.is_empty() {
                self.push(
                    self.now + self.cfg.report_delay_s,
                    Event::DeliverOps { worker, ops },
                );
            }
        }
        self.kick(worker);
    }

    fn finish(&mut self, l: Live, cached_tokens: usize) {
        if let Some(a) = l.assignment {
            self.core
                .finish_observed(a, self.now, l.generated.len() as u64);
        }
        let first = l.first_token.unwrap_or(self.now);
        self.result.records.push(RequestRecord {
            worker: l.worker,
            arrival: l.arrival,
            ttft: first - l.arrival,
            e2e: self.now - l.arrival,
            prompt_tokens: l.prompt.len(),
            cached_tokens,
            predicted_ttft: l.predicted_ttft,
            published_bound: l.published_bound,
            floor_ttft: l.floor_ttft,
            true_ttfts: l.diag.true_ttfts,
            predicted_ttfts: l.diag.predicted_ttfts,
            scores: l.diag.scores,
            candidates: l.diag.candidates,
            reason: l.diag.reason,
            first_token: self
                .cfg
                .diagnose
                .then(|| l.prompt.first().copied())
                .flatten(),
        });
        self.last_finish = self.last_finish.max(self.now);
        // The next turn's history: this prompt and the model's reply.
        let mut history = l.prompt;
        history.extend_from_slice(&l.generated);
        let salt = self.slots[l.slot]
            .session
            .and_then(|s| self.sessions[s].cache_salt.as_deref());
        self.floor.finished(salt, &history);
        self.slots[l.slot].history = history;
        let now = self.now;
        self.push(now, Event::NextTurn { slot: l.slot });
    }

    fn deliver_ops(&mut self, worker: usize, ops: Ops) {
        let id = self.workers[worker].id;
        let now = self.now;
        for op in ops.0 {
            match op {
                Op::Stored(h) => {
                    self.core.stored(id, &h, now);
                }
                Op::Removed(h) => {
                    self.core.removed(id, &h, now);
                }
                Op::Cleared => self.core.cleared(id, now),
            }
        }
    }
}

/// The TTFT a request would really get on this engine if it arrived now: run a copy of the
/// engine until the request's first token.
fn true_ttft(
    engine: &Engine,
    prompt: &[u32],
    salt: Option<&str>,
    max_tokens: u32,
    id: u64,
    now: f64,
) -> f64 {
    let mut e = engine.clone();
    let req = EngineRequest {
        id,
        prompt: prompt.to_vec(),
        max_tokens,
        ignore_eos: true,
        cache_salt: salt.map(str::to_owned),
        lora_name: None,
    };
    if e.submit(req, now).is_err() {
        return f64::INFINITY;
    }
    let mut t = now;
    for _ in 0..100_000 {
        let Some(out) = e.step(t) else {
            return f64::INFINITY;
        };
        for ev in &out.events {
            if let EngineEvent::FirstToken { id: got, at } = ev
                && *got == id
            {
                return at - now;
            }
        }
        t = out.end();
    }
    f64::INFINITY
}

/// Requests finished per simulated minute.
pub fn throughput_rpm(r: &RunResult) -> f64 {
    if r.makespan <= 0.0 {
        return 0.0;
    }
    r.records.len() as f64 / r.makespan * 60.0
}
