//! Whether this router replica should be sent traffic: starting, ready, or draining. The
//! admin `/readyz` (the Kubernetes readiness probe) and grpc.health.v1 both read this one
//! phase, so an HTTP load balancer and a gRPC one see the same thing.
//!
//! ```text
//!            startup_blocker(view) == None              GET /drain (preStop) or SIGTERM
//! Starting --------------------------------> Ready ----------------------------------> Draining
//!    \---------------------------------------------------------------------------------^
//! /readyz 503, health NOT_SERVING      /readyz 200, SERVING          /readyz 503, NOT_SERVING;
//! (Ingest stays SERVING: sidecars                                    listeners still open for
//!  must reach a replica that starts)                                 `--drain-delay-s`, then close
//! ```
//!
//! Ready means this replica decides as well as any other could: discovery has synced, every
//! tokenizer discovery named has loaded (or failed at least once: a failing source fails the
//! same way on every replica, and hiding them all would take down every other model too; the
//! model itself answers 503 `tokenizer_not_ready` and `/readyz?model=` says so), and, when
//! discovery lists any worker, at least one of them has streamed its snapshot here (sidecars
//! find a new replica within their DNS interval; until then it would answer 503 where an
//! older replica routes). No worker at all is *not* a reason to be unready: with none
//! anywhere, every replica is equally unable, and a client is better served by a 503
//! `no_ready_worker` than by a Service without endpoints (connection refused); which models
//! have workers is `/readyz?model=NAME`. The phase is a latch: once ready, a replica stays
//! ready until it drains, so a model added later (whose tokenizer is still loading) or a
//! worker fleet that restarts never makes every replica unready at once.

use std::collections::BTreeSet;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

/// Where a replica is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not yet ready: discovery, tokenizers or sidecar streams still pending.
    Starting,
    /// Serving traffic.
    Ready,
    /// Shutting down: still serving, but telling load balancers to stop sending.
    Draining,
}

/// What start-up readiness is judged on (a snapshot of the router state).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartupView {
    /// Discovery completed its first sync.
    pub discovery_synced: bool,
    /// Models whose tokenizer has neither loaded nor failed yet (load-only pools excluded).
    pub tokenizers_pending: BTreeSet<String>,
    /// Workers discovery lists as ready.
    pub listed_workers: usize,
    /// Workers that are candidates here (listed, snapshot streamed, stream open).
    pub routable_workers: usize,
}

/// Why a starting replica is not ready yet, or `None` when it is.
pub fn startup_blocker(v: &StartupView) -> Option<String> {
    if !v.discovery_synced {
        return Some("discovery has not synced".into());
    }
    if !v.tokenizers_pending.is_empty() {
        let models: Vec<&str> = v.tokenizers_pending.iter().map(String::as_str).collect();
        return Some(format!("tokenizer still loading for {}", models.join(", ")));
    }
    if v.listed_workers > 0 && v.routable_workers == 0 {
        return Some(format!(
            "waiting for the sidecars of {} listed worker(s) to stream here",
            v.listed_workers
        ));
    }
    None
}

/// The phase, published on a `watch` channel, and when draining began.
pub struct Readiness {
    phase: watch::Sender<Phase>,
    drain_started: Mutex<Option<Instant>>,
    drain_delay: Duration,
}

impl Readiness {
    /// A starting replica that keeps its listeners open `drain_delay` after draining begins.
    pub fn new(drain_delay: Duration) -> Self {
        Self {
            phase: watch::Sender::new(Phase::Starting),
            drain_started: Mutex::new(None),
            drain_delay,
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        *self.phase.borrow()
    }

    /// Follows phase changes.
    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// Starting -> Ready (no effect in another phase). Returns the phase afterwards.
    pub fn mark_ready(&self) -> Phase {
        self.phase.send_if_modified(|p| {
            let starting = *p == Phase::Starting;
            if starting {
                *p = Phase::Ready;
            }
            starting
        });
        self.phase()
    }

    /// Begins draining at `now` (a second call keeps the first start) and returns when the
    /// listeners may close: the start plus the drain delay.
    pub fn start_drain(&self, now: Instant) -> Instant {
        let started = *self.drain_started.lock().get_or_insert(now);
        self.phase.send_if_modified(|p| {
            let changed = *p != Phase::Draining;
            *p = Phase::Draining;
            changed
        });
        started + self.drain_delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> StartupView {
        StartupView {
            discovery_synced: true,
            ..StartupView::default()
        }
    }

    #[test]
    fn synced_discovery_and_loaded_tokenizers_are_ready_without_any_worker() {
        assert_eq!(startup_blocker(&view()), None);
        let unsynced = StartupView {
            discovery_synced: false,
            ..view()
        };
        assert_eq!(
            startup_blocker(&unsynced).as_deref(),
            Some("discovery has not synced")
        );
        let loading = StartupView {
            tokenizers_pending: BTreeSet::from(["llama".to_string(), "qwen3".to_string()]),
            ..view()
        };
        assert_eq!(
            startup_blocker(&loading).as_deref(),
            Some("tokenizer still loading for llama, qwen3")
        );
    }

    #[test]
    fn listed_workers_wait_for_one_stream_here() {
        let listed = StartupView {
            listed_workers: 3,
            ..view()
        };
        assert!(
            startup_blocker(&listed)
                .expect("blocked")
                .contains("3 listed worker(s)")
        );
        let one = StartupView {
            routable_workers: 1,
            ..listed
        };
        assert_eq!(startup_blocker(&one), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_phase_latches_and_the_drain_keeps_its_first_start() {
        let r = Readiness::new(Duration::from_secs(5));
        let mut rx = r.subscribe();
        assert_eq!(r.phase(), Phase::Starting);
        assert_eq!(r.mark_ready(), Phase::Ready);
        assert!(rx.has_changed().expect("sender alive"));
        rx.mark_unchanged();
        // Ready again is no change.
        assert_eq!(r.mark_ready(), Phase::Ready);
        assert!(!rx.has_changed().expect("sender alive"));

        let t0 = Instant::now();
        assert_eq!(r.start_drain(t0), t0 + Duration::from_secs(5));
        assert_eq!(r.phase(), Phase::Draining);
        // SIGTERM after the preStop hook: the drain already ran from t0.
        let later = t0 + Duration::from_secs(7);
        assert_eq!(r.start_drain(later), t0 + Duration::from_secs(5));
        // A draining replica never becomes ready again.
        assert_eq!(r.mark_ready(), Phase::Draining);
    }
}
