//! The real-time driver: one tokio task owns the [`Engine`] and runs its steps against the
//! wall clock divided by `--speedup`. Everything it reports (token times, metrics, usage) is in
//! simulated seconds; only the pacing uses the wall clock.
//!
//! ```text
//! HTTP handlers --Cmd (submit/abort/reset/restart)--> Driver::run --step--> Engine
//!      ^ per-request channel <-- ReqEvent (tokens, finish) --+-- KV batches --> Publisher
//!                                                            +-- Snapshot (load) --> /metrics
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use kvroute_vllm_wire::KvEvent;
use parking_lot::RwLock;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::engine::{
    Engine, EngineConfig, EngineEvent, EngineRequest, FinishReason, Load, RequestTiming,
    SubmitError, Usage,
};
use crate::kv_publisher::PublisherMsg;
use crate::metrics::Metrics;

/// Simulated time: seconds since the driver started, running `speedup` times the wall clock.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    wall_origin: Instant,
    unix_origin: f64,
    speedup: f64,
}

impl Clock {
    /// A clock at simulated 0 now, `unix_origin` being that instant in Unix time; a `speedup`
    /// that is not a positive finite number counts as 1.
    pub fn new(speedup: f64, unix_origin: f64) -> Self {
        Self {
            wall_origin: Instant::now(),
            unix_origin,
            speedup: if speedup.is_finite() && speedup > 0.0 {
                speedup
            } else {
                1.0
            },
        }
    }

    /// Simulated seconds now.
    pub fn now(&self) -> f64 {
        self.wall_origin.elapsed().as_secs_f64() * self.speedup
    }

    /// The wall-clock instant at which simulated time `sim` arrives.
    pub fn wall_at(&self, sim: f64) -> Instant {
        let secs = (sim / self.speedup).clamp(0.0, 1e9);
        self.wall_origin + std::time::Duration::from_secs_f64(secs)
    }

    /// Simulated time as seconds since the Unix epoch (event batch `ts`).
    pub fn unix(&self, sim: f64) -> f64 {
        self.unix_origin + sim
    }
}

/// What a request's handler hears back.
#[derive(Clone, Debug, PartialEq)]
pub enum ReqEvent {
    /// A generated token at simulated time `at`.
    Token {
        /// The token id.
        token: u32,
        /// The end of the step that produced it, in simulated seconds.
        at: f64,
    },
    /// The request finished.
    Finished {
        /// Token counts for the response's `usage`.
        usage: Usage,
        /// Why it stopped (the response's `finish_reason`).
        reason: FinishReason,
        /// When it arrived, was first scheduled, got its first token and finished.
        timing: RequestTiming,
    },
    /// The engine restarted under the request.
    Aborted,
}

/// Commands to the driver.
pub enum Cmd {
    /// Start a request: the engine's answer goes to `reply`, then its tokens and end to `events`.
    Submit {
        /// The request as the engine takes it.
        req: EngineRequest,
        /// Where the request's tokens and its end are sent.
        events: mpsc::UnboundedSender<ReqEvent>,
        /// Accepted, or why not.
        reply: oneshot::Sender<Result<(), SubmitError>>,
    },
    /// The client went away.
    Abort(u64),
    /// `/reset_prefix_cache`.
    Reset(oneshot::Sender<bool>),
    /// Restart the engine (SIGHUP, `--restart-after`): cache empty, event seq back to 0.
    Restart,
    /// `GET`/`POST /mock/cache`: what the engine's prefix cache holds now.
    Cache {
        /// Prompts whose cached leading tokens to report.
        prompts: Vec<Vec<u32>>,
        /// The answer.
        reply: oneshot::Sender<CacheView>,
    },
}

/// What the engine's prefix cache holds, for `/mock/cache` (a test's read-only view).
#[derive(Clone, Debug, Default)]
pub struct CacheView {
    /// Hashes of the cached blocks (the ids the KV events carry), sorted.
    pub block_hashes: Vec<u64>,
    /// For each asked prompt, the leading tokens a new request would find cached.
    pub prefix_tokens: Vec<usize>,
}

/// What the HTTP side can read without asking the driver.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The engine's load after its last step.
    pub load: Load,
    /// The engine's configuration (a restart keeps it).
    pub config: EngineConfig,
    /// Engine restarts since the process started.
    pub restarts: u64,
}

/// The driver task's state.
pub struct Driver {
    engine: Engine,
    fresh: Engine,
    rx: mpsc::UnboundedReceiver<Cmd>,
    streams: HashMap<u64, mpsc::UnboundedSender<ReqEvent>>,
    /// Time of each live request's last token (inter-token latency).
    last_token: HashMap<u64, f64>,
    metrics: Metrics,
    publisher: Option<mpsc::Sender<PublisherMsg>>,
    clock: Clock,
    snapshot: Arc<RwLock<Snapshot>>,
    restart_after: Option<u64>,
    finished_since_restart: u64,
    restarts: u64,
}

impl Driver {
    /// The driver over `engine`, fed by `rx`, and the snapshot it keeps current for the HTTP side.
    /// `restart_after = Some(n)` restarts the engine after every `n` finished requests (0: never).
    pub fn new(
        engine: Engine,
        rx: mpsc::UnboundedReceiver<Cmd>,
        metrics: Metrics,
        publisher: Option<mpsc::Sender<PublisherMsg>>,
        clock: Clock,
        restart_after: Option<u64>,
    ) -> (Self, Arc<RwLock<Snapshot>>) {
        let snapshot = Arc::new(RwLock::new(Snapshot {
            load: engine.load(),
            config: engine.config().clone(),
            restarts: 0,
        }));
        metrics.set_cache_config(engine.config());
        metrics.set_load(&engine.load());
        let driver = Self {
            fresh: engine.clone(),
            engine,
            rx,
            streams: HashMap::new(),
            last_token: HashMap::new(),
            metrics,
            publisher,
            clock,
            snapshot: snapshot.clone(),
            restart_after: restart_after.filter(|&n| n > 0),
            finished_since_restart: 0,
            restarts: 0,
        };
        (driver, snapshot)
    }

    /// Runs until every command sender is gone.
    pub async fn run(mut self) {
        loop {
            if !self.engine.has_work() {
                match self.rx.recv().await {
                    Some(cmd) => self.handle(cmd),
                    None => return,
                }
                continue;
            }
            let now = self.clock.now();
            let before = self.engine.stats();
            let Some(out) = self.engine.step(now) else {
                // Work that cannot be scheduled yet: wait for the next command.
                match self.rx.recv().await {
                    Some(cmd) => self.handle(cmd),
                    None => return,
                }
                continue;
            };
            self.metrics.add_stats(&before, &self.engine.stats());
            self.publish_snapshot();
            let end = out.end();
            let deadline = self.clock.wall_at(end);
            let restarts = self.restarts;
            loop {
                tokio::select! {
                    biased;
                    cmd = self.rx.recv() => match cmd {
                        Some(cmd) => self.handle(cmd),
                        None => return,
                    },
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
            // A restart during the step discarded the engine that produced these events.
            if self.restarts == restarts {
                self.deliver(out.events, end);
            }
            self.publish_snapshot();
        }
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Submit { req, events, reply } => {
                let id = req.id;
                let result = self.engine.submit(req, self.clock.now());
                if result.is_ok() {
                    self.streams.insert(id, events);
                }
                let _ = reply.send(result);
                self.publish_snapshot();
            }
            Cmd::Abort(id) => {
                if self.engine.abort(id) {
                    self.metrics.aborted();
                }
                self.streams.remove(&id);
                self.last_token.remove(&id);
                self.publish_snapshot();
            }
            Cmd::Reset(reply) => {
                let _ = reply.send(self.engine.reset_prefix_cache());
            }
            Cmd::Restart => self.restart(),
            Cmd::Cache { prompts, reply } => {
                let view = CacheView {
                    block_hashes: self.engine.cached_block_hashes(),
                    prefix_tokens: prompts
                        .iter()
                        .map(|p| self.engine.cached_prefix_tokens(p))
                        .collect(),
                };
                let _ = reply.send(view);
            }
        }
    }

    fn restart(&mut self) {
        for (_, tx) in self.streams.drain() {
            let _ = tx.send(ReqEvent::Aborted);
            self.metrics.aborted();
        }
        self.last_token.clear();
        self.engine = self.fresh.clone();
        self.finished_since_restart = 0;
        self.restarts += 1;
        // A new start time, as a restarted vLLM process reports.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.metrics.set_start_time(now);
        if let Some(p) = &self.publisher {
            let _ = p.try_send(PublisherMsg::Restart);
        }
        info!(
            restarts = self.restarts,
            "engine restarted: cache empty, event seq back to 0"
        );
        self.publish_snapshot();
    }

    fn deliver(&mut self, events: Vec<EngineEvent>, end: f64) {
        let mut kv: Vec<KvEvent> = Vec::new();
        let mut gone: Vec<u64> = Vec::new();
        let mut restart = false;
        for ev in events {
            match ev {
                EngineEvent::Kv(k) => kv.push(k),
                EngineEvent::FirstToken { .. } => {}
                EngineEvent::Token { id, token } => {
                    if let Some(last) = self.last_token.insert(id, end) {
                        self.metrics.inter_token(end - last);
                    }
                    if let Some(tx) = self.streams.get(&id)
                        && tx.send(ReqEvent::Token { token, at: end }).is_err()
                    {
                        gone.push(id);
                    }
                }
                EngineEvent::Finished {
                    id,
                    usage,
                    reason,
                    timing,
                } => {
                    self.metrics.finished(reason.as_str(), &timing);
                    self.last_token.remove(&id);
                    if let Some(tx) = self.streams.remove(&id) {
                        let _ = tx.send(ReqEvent::Finished {
                            usage,
                            reason,
                            timing,
                        });
                    }
                    self.finished_since_restart += 1;
                    if self
                        .restart_after
                        .is_some_and(|n| self.finished_since_restart >= n)
                    {
                        restart = true;
                    }
                }
            }
        }
        if !kv.is_empty()
            && let Some(p) = &self.publisher
        {
            let msg = PublisherMsg::Batch {
                ts: self.clock.unix(end),
                events: kv,
            };
            if p.try_send(msg).is_err() {
                warn!("KV event queue full: batch dropped");
            }
        }
        for id in gone {
            self.handle(Cmd::Abort(id));
        }
        if restart {
            self.restart();
        }
    }

    fn publish_snapshot(&self) {
        let load = self.engine.load();
        self.metrics.set_load(&load);
        let mut s = self.snapshot.write();
        s.load = load;
        s.restarts = self.restarts;
    }
}
