//! The bounded pool where routing decisions run: tokenizing a prompt (chat template,
//! tokenizer), hashing its blocks and predicting take milliseconds of CPU for a long prompt,
//! so the gateway, the gRPC Picker and `/debug/explain` never do them on an async worker
//! thread, and never more of them at once than the pool allows.
//!
//! ```text
//! caller --run(job)--> admitted? (threads + queue permits; none left: Full, counted, 503)
//!          --wait for one of `threads` run permits--> spawn_blocking(job) --> result
//! ```
//!
//! A caller that goes away while its job waits frees its place; a job already running
//! finishes (the gateway drops the decision it made, which releases its assignment).

use std::sync::Arc;

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use tokio::sync::Semaphore;

/// Who submitted a job (the `caller` label of the shed counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The HTTP gateway.
    Gateway,
    /// The gRPC Pick API.
    Picker,
    /// `/debug/explain` on the admin port.
    Explain,
    /// The endpoint picker (ext_proc, [`crate::epp`]).
    Epp,
}

impl Caller {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Caller::Gateway => "gateway",
            Caller::Picker => "picker",
            Caller::Explain => "explain",
            Caller::Epp => "epp",
        }
    }
}

/// Why a job did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// Every thread is busy and the queue is full: shed the request (503).
    #[error("the routing decision pool is full")]
    Full,
    /// The job panicked (a bug; details are in the log).
    #[error("the routing decision failed")]
    Panicked,
}

/// Sizes of the pool (`--decision-threads`, `--decision-queue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Jobs running at once (each on a blocking thread).
    pub threads: usize,
    /// Jobs waiting for a thread beyond those; one more is shed.
    pub queue: usize,
}

impl PoolConfig {
    /// `threads` 0 means one per CPU.
    pub fn new(threads: usize, queue: usize) -> Self {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
        } else {
            threads
        };
        Self { threads, queue }
    }
}

/// A bounded pool of blocking threads for routing decisions. Cheap to clone.
#[derive(Clone, Debug)]
pub struct BlockingPool {
    admitted: Arc<Semaphore>,
    running: Arc<Semaphore>,
    shed: IntCounterVec,
    busy: IntGauge,
}

impl BlockingPool {
    /// A pool of `cfg` whose metrics live in `registry`.
    pub fn new(cfg: PoolConfig, registry: &Registry) -> prometheus::Result<Self> {
        let pool = Self::unregistered(cfg)?;
        registry.register(Box::new(pool.shed.clone()))?;
        registry.register(Box::new(pool.busy.clone()))?;
        Ok(pool)
    }

    /// A pool whose metrics are not exported (tests, benches).
    pub fn unregistered(cfg: PoolConfig) -> prometheus::Result<Self> {
        let threads = cfg.threads.clamp(1, Semaphore::MAX_PERMITS / 2);
        let queue = cfg.queue.min(Semaphore::MAX_PERMITS / 2);
        Ok(Self {
            admitted: Arc::new(Semaphore::new(threads + queue)),
            running: Arc::new(Semaphore::new(threads)),
            shed: IntCounterVec::new(
                Opts::new(
                    "kvroute_router_decision_pool_shed_total",
                    "Routing decisions refused because the decision pool was full, by caller.",
                ),
                &["caller"],
            )?,
            busy: IntGauge::new(
                "kvroute_router_decision_pool_busy",
                "Routing decisions running on the decision pool now.",
            )?,
        })
    }

    /// Runs `job` on a blocking thread once one of the pool's is free; `Full` at once when
    /// the queue is full too.
    pub async fn run<T, F>(&self, caller: Caller, job: F) -> Result<T, PoolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let Ok(admitted) = self.admitted.clone().try_acquire_owned() else {
            self.shed.with_label_values(&[caller.label()]).inc();
            return Err(PoolError::Full);
        };
        // The semaphore is never closed.
        let running = self
            .running
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| PoolError::Full)?;
        let busy = self.busy.clone();
        busy.inc();
        let joined = tokio::task::spawn_blocking(move || {
            let out = job();
            drop((running, admitted));
            out
        })
        .await;
        busy.dec();
        joined.map_err(|e| {
            tracing::error!(error = %e, caller = caller.label(), "routing decision panicked");
            PoolError::Panicked
        })
    }

    /// Shed jobs of `caller` so far.
    pub fn shed(&self, caller: Caller) -> u64 {
        self.shed.with_label_values(&[caller.label()]).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sheds_beyond_threads_plus_queue() {
        let pool = BlockingPool::unregistered(PoolConfig::new(1, 1)).expect("pool");
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let p = pool.clone();
        // The first job blocks its thread until told (both async workers stay free).
        let first = tokio::spawn(async move {
            p.run(Caller::Gateway, move || {
                let _ = started_tx.send(());
                release_rx.recv_timeout(Duration::from_secs(30)).ok();
                1
            })
            .await
        });
        tokio::time::timeout(Duration::from_secs(30), started_rx)
            .await
            .expect("first job started in time")
            .expect("started");
        // The second waits in the queue; the third finds no place.
        let p = pool.clone();
        let second = tokio::spawn(async move { p.run(Caller::Picker, || 2).await });
        tokio::time::timeout(Duration::from_secs(30), async {
            while pool.admitted.available_permits() != 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("second job queued in time");
        assert_eq!(pool.run(Caller::Explain, || 3).await, Err(PoolError::Full));
        assert_eq!(pool.shed(Caller::Explain), 1);
        release_tx.send(()).expect("release");
        assert_eq!(first.await.expect("join"), Ok(1));
        assert_eq!(second.await.expect("join"), Ok(2));
        assert_eq!(pool.run(Caller::Explain, || 4).await, Ok(4));
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_and_frees_its_place() {
        let pool = BlockingPool::unregistered(PoolConfig::new(1, 0)).expect("pool");
        let r: Result<(), _> = pool.run(Caller::Gateway, || panic!("boom")).await;
        assert_eq!(r, Err(PoolError::Panicked));
        assert_eq!(pool.run(Caller::Gateway, || 1).await, Ok(1));
    }
}
