//! The router's own outstanding assignments: what it has sent to each worker and not yet
//! seen finish. Load reports lag; these do not, so the queue ahead of a new request counts
//! them too.
//!
//! ```text
//! assign --> WaitingFirstToken --first_token--> Decoding --finish/abort/expire--> released
//!                    \----------------------finish/abort/expire-------------------/
//! ```
//!
//! Every assignment is released exactly once: `finish`, `abort` and `expire` return it the
//! first time and `None` (or nothing) afterwards, and the per-worker totals move only then.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use super::bound::BoundOutcome;
use super::predict::Prediction;
use super::workers::WorkerId;

/// Handle of one assignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct AssignmentId(pub u64);

impl std::fmt::Display for AssignmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for AssignmentId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(AssignmentId)
    }
}

/// Where an assignment is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AssignmentState {
    /// Sent; prefill not finished.
    WaitingFirstToken,
    /// First token seen; decoding.
    Decoding,
}

/// One request sent to a worker.
#[derive(Clone, Debug, Serialize)]
pub struct Assignment {
    /// The worker it went to.
    pub worker: WorkerId,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Prompt tokens the worker was expected to compute (not cached).
    pub uncached_tokens: u64,
    /// Prefill tokens that were ahead of it when assigned, with what the prediction took off
    /// as the head's drain added back (`Candidate::queue_tokens` plus `queue_drain_s` at the
    /// rate learned then): the queue as it stood when the head began, which the TTFT model
    /// learns from.
    pub undrained_queue_tokens: f64,
    /// Seconds of the head's prefill the prediction counted as done (see
    /// `Candidate::queue_drain_s`).
    pub queue_drain_s: f64,
    /// Seconds the prediction counted for the worker's running engine step
    /// (`Candidate::step_s`): the TTFT model learns the first token less these.
    pub step_s: f64,
    /// TTFT predicted when assigned, as the choice compared it (seconds; NaN when the
    /// policy made no prediction): the fit learns from its error.
    pub predicted_ttft: f64,
    /// TTFT published when assigned (`Candidate::published_ttft`; the same but with
    /// `DecodeSteps::Published`): the bound and the error metric follow it.
    pub published_ttft: f64,
    /// The TTFT model's part of it, each line's (`Candidate::model`): both learn from the
    /// first token.
    pub ttft_model: Prediction,
    /// The p90 upper bound published with that prediction (seconds; NaN for none).
    pub ttft_bound: f64,
    /// When it was assigned (seconds, caller's clock).
    pub assigned_at: f64,
    /// Current state.
    pub state: AssignmentState,
    /// When the first token arrived.
    pub first_token_at: Option<f64>,
    /// Output tokens expected (the request's `max_tokens`, else the router's running mean).
    pub output_tokens: u64,
    /// KV tokens it takes on the worker beyond blocks in use there (see
    /// `Candidate::kv_need_tokens`); freed, with its output, when it ends.
    pub kv_need_tokens: u64,
}

/// What the caller passes to [`Assignments::assign`].
#[derive(Clone, Copy, Debug)]
pub struct NewAssignment {
    /// The chosen worker.
    pub worker: WorkerId,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Prompt tokens expected to be computed.
    pub uncached_tokens: u64,
    /// Prefill tokens ahead of it, the head's drain added back (see
    /// [`Assignment::undrained_queue_tokens`]).
    pub undrained_queue_tokens: f64,
    /// Seconds of the head's prefill the prediction counted as done.
    pub queue_drain_s: f64,
    /// Seconds the prediction counted for the worker's running step (see
    /// [`Assignment::step_s`]).
    pub step_s: f64,
    /// Predicted TTFT as the choice compared it (seconds; NaN for none).
    pub predicted_ttft: f64,
    /// Predicted TTFT as published (see [`Assignment::published_ttft`]).
    pub published_ttft: f64,
    /// The TTFT model's part of it (see [`Assignment::model`]).
    pub ttft_model: Prediction,
    /// Its p90 upper bound (seconds; NaN for none; set by the core when it assigns).
    pub ttft_bound: f64,
    /// Output tokens expected.
    pub output_tokens: u64,
    /// KV tokens it takes beyond blocks in use.
    pub kv_need_tokens: u64,
}

/// The first token of an assignment, as reported.
#[derive(Clone, Debug)]
pub struct FirstToken {
    /// The assignment, now decoding.
    pub assignment: Assignment,
    /// Observed TTFT (seconds).
    pub observed_ttft: f64,
    /// Whether the TTFT was within the bound published with the prediction (set by the
    /// core; `Unbounded` from [`Assignments::first_token`]).
    pub bound: BoundOutcome,
}

/// The router's outstanding work on one worker.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct WorkerInflight {
    /// Assignments waiting for their first token.
    pub waiting: u32,
    /// Uncached prompt tokens of those (prefill work still ahead on the worker).
    pub waiting_prefill_tokens: u64,
    /// Uncached prompt tokens of the oldest of them: the prompt the worker is prefilling now
    /// (it takes waiting prompts in arrival order).
    pub head_prefill_tokens: u64,
    /// Since when (caller's clock) that oldest one has been at the head: its assignment to
    /// a worker with none waiting, or the first token or release of the one before it.
    pub head_since: f64,
    /// Tokens of the head already prefilled when it became the head: an engine with chunked
    /// prefill fills each step's token budget from several waiting prompts, so the step that
    /// finished the one before it computed a first chunk of this one too. Estimated at the
    /// previous head's first token from the prefill rate (what it computed since it reached
    /// the head beyond its own prompt); 0 when unknown.
    pub head_done: f64,
    /// Assignments decoding.
    pub decoding: u32,
    /// Prompt tokens of every outstanding assignment (waiting and decoding): the KV
    /// footprint the router itself put there.
    pub active_tokens: u64,
    /// Uncached prompt tokens of every outstanding assignment: the KV the router's requests
    /// add beyond blocks the worker already held (shared prefixes are stored once).
    pub active_uncached_tokens: u64,
    /// KV the router's outstanding assignments hold or will hold there: their
    /// `kv_need_tokens` plus expected output.
    pub active_kv_tokens: u64,
}

impl WorkerInflight {
    /// All outstanding assignments.
    pub fn outstanding(&self) -> u32 {
        self.waiting + self.decoding
    }

    /// Tokens the worker has computed toward the head by `now` at `prefill_rate` tokens/s:
    /// what was done when it became the head plus the rate times the time since. Not capped
    /// at the head's own tokens: past them, the rest went into the next prompt.
    pub fn head_computed(&self, now: f64, prefill_rate: f64) -> f64 {
        self.head_done + (now - self.head_since).max(0.0) * prefill_rate
    }
}

/// Outstanding assignments of every worker.
#[derive(Debug, Default)]
pub struct Assignments {
    next: u64,
    live: HashMap<AssignmentId, Assignment>,
    per_worker: Vec<WorkerInflight>,
    /// Per worker, the assignments waiting for their first token, oldest first (ids grow).
    waiting_order: Vec<BTreeSet<AssignmentId>>,
}

impl Assignments {
    /// No assignments.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a new assignment at `now`.
    pub fn assign(&mut self, a: NewAssignment, now: f64) -> AssignmentId {
        self.next += 1;
        let id = AssignmentId(self.next);
        self.wait(a.worker, id, a.uncached_tokens, now);
        let w = self.slot(a.worker);
        w.waiting += 1;
        w.waiting_prefill_tokens += a.uncached_tokens;
        w.active_tokens += a.prompt_tokens;
        w.active_uncached_tokens += a.uncached_tokens;
        w.active_kv_tokens += a.kv_need_tokens + a.output_tokens;
        self.live.insert(
            id,
            Assignment {
                worker: a.worker,
                prompt_tokens: a.prompt_tokens,
                uncached_tokens: a.uncached_tokens,
                undrained_queue_tokens: a.undrained_queue_tokens,
                queue_drain_s: a.queue_drain_s,
                step_s: a.step_s,
                ttft_model: a.ttft_model,
                predicted_ttft: a.predicted_ttft,
                published_ttft: a.published_ttft,
                ttft_bound: a.ttft_bound,
                assigned_at: now,
                state: AssignmentState::WaitingFirstToken,
                first_token_at: None,
                output_tokens: a.output_tokens,
                kv_need_tokens: a.kv_need_tokens,
            },
        );
        id
    }

    /// Queues `id` behind `w`'s waiting assignments; the head if none wait.
    fn wait(&mut self, w: WorkerId, id: AssignmentId, uncached: u64, now: f64) {
        let i = w.index();
        if self.waiting_order.len() <= i {
            self.waiting_order.resize_with(i + 1, BTreeSet::new);
        }
        let first = self.waiting_order[i].is_empty();
        self.waiting_order[i].insert(id);
        if first {
            let s = self.slot(w);
            s.head_prefill_tokens = uncached;
            s.head_since = now;
            s.head_done = 0.0;
        }
    }

    /// Takes `id` out of `w`'s waiting assignments; when it was the head, the next oldest
    /// becomes the head, at `now` if known (a release without a clock keeps the old head's
    /// start: the next one may have been prefilled alongside), with `done` of its tokens
    /// already prefilled.
    fn unwait(&mut self, w: WorkerId, id: AssignmentId, now: Option<f64>, done: f64) {
        let Some(order) = self.waiting_order.get_mut(w.index()) else {
            return;
        };
        let was_head = order.first() == Some(&id);
        order.remove(&id);
        if !was_head {
            return;
        }
        let next = order
            .first()
            .and_then(|n| self.live.get(n))
            .map_or(0, |a| a.uncached_tokens);
        let s = self.slot(w);
        s.head_prefill_tokens = next;
        if let Some(now) = now {
            s.head_since = now;
            s.head_done = if next > 0 { done.max(0.0) } else { 0.0 };
        }
    }

    /// When the oldest of `w`'s assignments still waiting for a first token was assigned.
    pub fn oldest_waiting_assigned_at(&self, w: WorkerId) -> Option<f64> {
        let id = self.waiting_order.get(w.index())?.first()?;
        self.live.get(id).map(|a| a.assigned_at)
    }

    fn slot(&mut self, w: WorkerId) -> &mut WorkerInflight {
        let i = w.index();
        if self.per_worker.len() <= i {
            self.per_worker.resize(i + 1, WorkerInflight::default());
        }
        &mut self.per_worker[i]
    }

    /// Marks the first token. `observed_ttft` defaults to `now - assigned_at` (pass the data
    /// path's own measurement when it has one). `prefill_rate` (tokens/s; 0 for unknown) is
    /// the worker's: when this was the head, what the worker computed since it reached the
    /// head beyond this prompt went into the next one, which starts as the head with that
    /// much done. `None` when the id is unknown, released or already past its first token.
    pub fn first_token(
        &mut self,
        id: AssignmentId,
        now: f64,
        observed_ttft: Option<f64>,
        prefill_rate: f64,
    ) -> Option<FirstToken> {
        let a = self.live.get_mut(&id)?;
        if a.state != AssignmentState::WaitingFirstToken {
            return None;
        }
        a.state = AssignmentState::Decoding;
        a.first_token_at = Some(now);
        let observed = observed_ttft.unwrap_or(now - a.assigned_at);
        let snapshot = a.clone();
        let worker = snapshot.worker;
        let head = self
            .waiting_order
            .get(worker.index())
            .and_then(|o| o.first())
            == Some(&id);
        let carry = match self.per_worker.get(worker.index()) {
            Some(s) if head && prefill_rate.is_finite() && prefill_rate > 0.0 => {
                (s.head_computed(now, prefill_rate) - snapshot.uncached_tokens as f64).max(0.0)
            }
            _ => 0.0,
        };
        self.unwait(worker, id, Some(now), carry);
        let w = self.slot(worker);
        w.waiting = w.waiting.saturating_sub(1);
        w.waiting_prefill_tokens = w
            .waiting_prefill_tokens
            .saturating_sub(snapshot.uncached_tokens);
        w.decoding += 1;
        Some(FirstToken {
            assignment: snapshot,
            observed_ttft: observed,
            bound: BoundOutcome::Unbounded,
        })
    }

    /// Releases a completed assignment; `None` if unknown or already released.
    pub fn finish(&mut self, id: AssignmentId) -> Option<Assignment> {
        self.release(id, None)
    }

    /// Releases an aborted assignment; `None` if unknown or already released.
    pub fn abort(&mut self, id: AssignmentId) -> Option<Assignment> {
        self.release(id, None)
    }

    /// Releases every assignment older than `ttl` seconds (its completion was never
    /// reported) and returns them.
    pub fn expire(&mut self, now: f64, ttl: f64) -> Vec<(AssignmentId, Assignment)> {
        let old: Vec<AssignmentId> = self
            .live
            .iter()
            .filter(|(_, a)| now - a.assigned_at > ttl)
            .map(|(&id, _)| id)
            .collect();
        let mut out: Vec<(AssignmentId, Assignment)> = old
            .into_iter()
            .filter_map(|id| self.release(id, Some(now)).map(|a| (id, a)))
            .collect();
        out.sort_by_key(|(id, _)| *id);
        out
    }

    /// Releases every assignment of a worker (it went away).
    pub fn release_worker(&mut self, worker: WorkerId) -> Vec<(AssignmentId, Assignment)> {
        let ids: Vec<AssignmentId> = self
            .live
            .iter()
            .filter(|(_, a)| a.worker == worker)
            .map(|(&id, _)| id)
            .collect();
        let mut out: Vec<(AssignmentId, Assignment)> = ids
            .into_iter()
            .filter_map(|id| self.release(id, None).map(|a| (id, a)))
            .collect();
        out.sort_by_key(|(id, _)| *id);
        out
    }

    fn release(&mut self, id: AssignmentId, now: Option<f64>) -> Option<Assignment> {
        let a = self.live.remove(&id)?;
        if a.state == AssignmentState::WaitingFirstToken {
            self.unwait(a.worker, id, now, 0.0);
        }
        let w = self.slot(a.worker);
        match a.state {
            AssignmentState::WaitingFirstToken => {
                w.waiting = w.waiting.saturating_sub(1);
                w.waiting_prefill_tokens =
                    w.waiting_prefill_tokens.saturating_sub(a.uncached_tokens);
            }
            AssignmentState::Decoding => w.decoding = w.decoding.saturating_sub(1),
        }
        w.active_tokens = w.active_tokens.saturating_sub(a.prompt_tokens);
        w.active_uncached_tokens = w.active_uncached_tokens.saturating_sub(a.uncached_tokens);
        w.active_kv_tokens = w
            .active_kv_tokens
            .saturating_sub(a.kv_need_tokens + a.output_tokens);
        Some(a)
    }

    /// An outstanding assignment.
    pub fn get(&self, id: AssignmentId) -> Option<&Assignment> {
        self.live.get(&id)
    }

    /// The router's outstanding work on `w`.
    pub fn inflight(&self, w: WorkerId) -> WorkerInflight {
        self.per_worker.get(w.index()).copied().unwrap_or_default()
    }

    /// Every outstanding assignment, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (AssignmentId, &Assignment)> {
        self.live.iter().map(|(&id, a)| (id, a))
    }

    /// Number of outstanding assignments.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// True without outstanding assignments.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(worker: u32, prompt: u64, uncached: u64) -> NewAssignment {
        NewAssignment {
            worker: WorkerId(worker),
            prompt_tokens: prompt,
            uncached_tokens: uncached,
            undrained_queue_tokens: 0.0,
            queue_drain_s: 0.0,
            step_s: 0.0,
            ttft_model: Prediction::line(f64::NAN),
            predicted_ttft: 0.1,
            published_ttft: 0.1,
            ttft_bound: f64::NAN,
            output_tokens: 100,
            kv_need_tokens: uncached,
        }
    }

    #[test]
    fn lifecycle_moves_totals_and_releases_once() {
        let mut a = Assignments::new();
        let x = a.assign(new(1, 1_000, 600), 0.0);
        let y = a.assign(new(1, 500, 500), 0.5);
        let w = a.inflight(WorkerId(1));
        assert_eq!(
            (
                w.waiting,
                w.waiting_prefill_tokens,
                w.decoding,
                w.active_tokens
            ),
            (2, 1_100, 0, 1_500)
        );
        assert_eq!(w.active_uncached_tokens, 1_100);
        assert_eq!(
            w.active_kv_tokens,
            1_100 + 200,
            "KV need plus expected output"
        );

        let ft = a.first_token(x, 0.4, None, 0.0).expect("first token");
        assert!((ft.observed_ttft - 0.4).abs() < 1e-12);
        assert!(
            a.first_token(x, 0.5, None, 0.0).is_none(),
            "first token only once"
        );
        let w = a.inflight(WorkerId(1));
        assert_eq!(
            (w.waiting, w.waiting_prefill_tokens, w.decoding),
            (1, 500, 1)
        );

        assert!(a.finish(x).is_some());
        assert!(a.finish(x).is_none());
        assert!(a.abort(x).is_none());
        assert!(a.abort(y).is_some());
        assert!(a.finish(y).is_none());
        assert!(a.first_token(y, 1.0, Some(0.2), 0.0).is_none());
        let w = a.inflight(WorkerId(1));
        assert_eq!(
            (
                w.waiting,
                w.waiting_prefill_tokens,
                w.decoding,
                w.active_tokens
            ),
            (0, 0, 0, 0)
        );
        assert!(a.is_empty());
    }

    #[test]
    fn the_head_is_the_oldest_waiting_one_since_the_one_before_left() {
        let mut a = Assignments::new();
        let w = WorkerId(0);
        let x = a.assign(new(0, 1_000, 600), 1.0);
        let y = a.assign(new(0, 500, 500), 1.5);
        let head = |a: &Assignments| {
            let i = a.inflight(w);
            (i.head_prefill_tokens, i.head_since)
        };
        assert_eq!(head(&a), (600, 1.0));
        // A later one overtaking the head leaves the head where it is.
        a.first_token(y, 2.0, None, 0.0).expect("first token");
        assert_eq!(head(&a), (600, 1.0));
        let z = a.assign(new(0, 300, 300), 2.5);
        a.first_token(x, 3.0, None, 0.0).expect("first token");
        assert_eq!(
            head(&a),
            (300, 3.0),
            "the next oldest is the head from its first token"
        );
        // Released without a clock (abort): the next keeps the old start.
        let v = a.assign(new(0, 200, 200), 3.5);
        assert!(a.abort(z).is_some());
        assert_eq!(head(&a), (200, 3.0));
        // Expiry knows the time.
        assert!(a.finish(x).is_some() && a.finish(y).is_some());
        let u = a.assign(new(0, 100, 100), 100.0);
        assert_eq!(a.expire(70.0, 60.0).len(), 1);
        assert_eq!(head(&a), (100, 70.0));
        assert!(a.finish(u).is_some());
        assert_eq!(a.inflight(w).waiting, 0);
        // Another worker's queue is its own.
        a.assign(new(1, 50, 50), 80.0);
        assert_eq!(head(&a).0, 0);
        assert!(a.get(v).is_none());
    }

    #[test]
    fn the_next_head_starts_with_what_the_last_step_computed_of_it() {
        // Chunked prefill: the step that finishes x (600 tokens) fills its budget with a
        // first chunk of y. At 1,000 tokens/s, x at the head from 1.0 and done at 2.0 leaves
        // 400 tokens of y computed.
        let mut a = Assignments::new();
        let w = WorkerId(0);
        let x = a.assign(new(0, 600, 600), 1.0);
        let y = a.assign(new(0, 500, 500), 1.5);
        let z = a.assign(new(0, 300, 300), 1.6);
        a.first_token(x, 2.0, None, 1_000.0).expect("first token");
        let i = a.inflight(w);
        assert_eq!((i.head_prefill_tokens, i.head_since), (500, 2.0));
        assert!((i.head_done - 400.0).abs() < 1e-9, "{}", i.head_done);
        // A first token earlier than the rate says carries nothing (never negative).
        a.first_token(y, 2.05, None, 1_000.0).expect("first token");
        let i = a.inflight(w);
        assert_eq!((i.head_prefill_tokens, i.head_done), (300, 0.0));
        // One that is not the head carries nothing either and leaves the head alone.
        let v = a.assign(new(0, 200, 200), 2.2);
        a.first_token(v, 2.3, None, 1_000.0).expect("first token");
        let i = a.inflight(w);
        assert_eq!(
            (i.head_prefill_tokens, i.head_since, i.head_done),
            (300, 2.05, 0.0)
        );
        // Unknown rate: nothing carried; an expired head's successor starts from nothing.
        let u = a.assign(new(0, 100, 100), 2.4);
        a.first_token(z, 9.0, None, f64::NAN).expect("first token");
        assert_eq!(a.inflight(w).head_done, 0.0);
        let t = a.assign(new(0, 50, 50), 100.0);
        for done in [x, y, z, v] {
            assert!(a.finish(done).is_some());
        }
        assert_eq!(a.expire(70.0, 60.0).len(), 1, "u expired");
        let i = a.inflight(w);
        assert_eq!(
            (i.head_prefill_tokens, i.head_since, i.head_done),
            (50, 70.0, 0.0)
        );
        assert!(a.get(u).is_none() && a.get(t).is_some());
        // The last one leaving leaves no head.
        a.first_token(t, 101.0, None, 1_000.0).expect("first token");
        let i = a.inflight(w);
        assert_eq!((i.head_prefill_tokens, i.head_done), (0, 0.0));
    }

    #[test]
    fn expiry_releases_only_old_ones_and_only_once() {
        let mut a = Assignments::new();
        let old = a.assign(new(0, 10, 10), 0.0);
        let young = a.assign(new(0, 10, 10), 50.0);
        let gone = a.expire(100.0, 60.0);
        assert_eq!(
            gone.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            vec![old]
        );
        assert!(a.expire(100.0, 60.0).is_empty());
        assert!(
            a.finish(old).is_none(),
            "expired assignment is not released again"
        );
        assert_eq!(a.inflight(WorkerId(0)).waiting, 1);
        assert_eq!(a.release_worker(WorkerId(0)).len(), 1);
        assert!(a.finish(young).is_none());
        assert_eq!(a.inflight(WorkerId(0)).outstanding(), 0);
        assert_eq!(a.inflight(WorkerId(9)).outstanding(), 0);
    }
}
