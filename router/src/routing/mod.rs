//! Pure routing core: KV index, TTFT prediction, choice and baseline policies. No I/O, no
//! clock, no global RNG: time is `now: f64` seconds and randomness a seed, both inputs.
//!
//! ```text
//! sidecar reports ---> KvIndex (blocks per worker) + loads ----+
//! request tokens ----> PromptHashes (kvroute-hash chain) ------+--> ChoiceContext
//! first tokens ------> Predictor (per-worker rate, overhead) --+        |
//!                                                          dyn Policy::choose
//! Assignments <-- assign / first_token / finish / abort / expire <-- Decision
//! ```
//!
//! # API
//! - [`RoutingCore`] is all the service needs. Events in: `snapshot(key, block_size, epoch,
//!   blocks, now) -> WorkerId` (a stream opened), `stored / removed / cleared(w, blocks,
//!   now)`, `load(w, LoadSample, now)`, `stream_closed(w, now)`, `retire(w)`,
//!   `retire_gone(now, grace, listed)`. Decisions out: `plan(&RouteRequest, allowed, now) ->
//!   Plan`, a [`Policy`] chooses from `plan.context`, `assign(&plan, &decision, now) ->
//!   AssignmentId`, then `first_token(id, now, observed)`, `finish_observed / finish /
//!   abort(id)`, `expire(now, ttl)`. Its index, predictor and assignments are private.
//! - [`WorkerTable`] (inside the core): one slot per worker with its key, block size, epoch,
//!   stream liveness, load and KV capacity, and the lifecycle (see `workers.rs`).
//! - [`KvIndex`]: blocks per [`WorkerId`]; `match_prefix(hashes, &mut out)` gives
//!   `(worker, leading blocks held)`.
//! - [`Predictor`]: `predict(w, queue_tokens, uncached_tokens)`, `observe(...)`, `error()`.
//! - [`Policy`] (object-safe) with [`ChoiceContext`] in and [`Decision`] out (serde
//!   `Serialize` for `/debug/explain`); [`policy_by_name`] builds `kvroute`, `random`,
//!   `round-robin`, `least-loaded`, `max-prefix`, `llm-d`, `llm-d-sticky`, `dynamo-cost`,
//!   `sglang-cache-aware` (the last four follow named upstream releases: `baselines/`).
//!   A simulator can build a [`ChoiceContext`] itself (all fields public) and call any policy.
//! - [`PromptHashes`]: a request's hash chain per block size (kvroute-hash, hash/SPEC.md).
//!
//! # Rules worth knowing
//! - Prediction: `ttft = step_s + (queue_tokens + uncached) / rate + overhead`; `step_s` is
//!   what is left of the engine step the worker runs, from the streamed chunks the data path
//!   relays (`steps.rs`, [`StepClocks`]; 0 without them; as long as the last step; the
//!   published prediction, by default, takes the shortest of the last 8 when no prompt
//!   in the running step awaits a first token there, `StepConfig::decode_steps`);
//!   `queue_tokens` is the router's own not-yet-first-tokened uncached tokens on the worker
//!   plus, at the mean uncached tokens routed so far each, the reported waiting requests
//!   beyond those the router and its peers had waiting there when the report was applied
//!   (`Worker::own_waiting_at_report`: a report lags, and its waiting requests are mostly the
//!   router's own). `rate` is the
//!   worker's learned rate, or the mean (in seconds per token) of the workers whose learned
//!   rates chain within `CoreConfig::rate_pool` (2x) of each other (`Candidate.pooled_rate`;
//!   each worker's fit and overhead stay its own).
//! - p90 bound ([`TtftBound`], `bound.rs`): each assignment with a prediction also gets a
//!   bound, the prediction times a quantile of the last 200 observed / predicted ratios at a
//!   level adaptive conformal inference steers by the misses seen at first tokens; none until
//!   20 first tokens were seen (`RoutingCore::ttft_bound`, `Assignment::ttft_bound`,
//!   `FirstToken::bound`). The ratios are of the served first token, timed from the
//!   gateway's receipt of the request (`RoutingCore::first_token_served`), as a client
//!   times it; the TTFT model learns the engine's part.
//! - Admission wait (`Candidate.admission_wait`): on a worker reporting its KV capacity, the
//!   time until the router's requests there free the KV that what is waiting and the new
//!   request need, beyond the queue's prefill time (the two overlap: the request starts at
//!   the later). On one reporting none and saturated (fresh report, `waiting > 0`, KV usage
//!   at or above `saturated_kv_usage`): a learned wait per queued request times the requests
//!   queued, learned from first tokens of requests sent while it was saturated (zero until
//!   then).
//! - A worker whose stream is closed is no candidate. Stale worker (silent for `stale_after_s`): its indexed leading blocks
//!   count at `stale_cache_trust` (0.5) and `stale_penalty_s` (0.1 s) is added: neither trusted
//!   warm nor assumed empty.
//! - Pending overlay: the blocks of a prompt the router sent to a worker count as cached there
//!   (in `expected_cached_tokens`, shown as `pending_blocks`; `cached_blocks` stays the
//!   index's) until its first token plus `CoreConfig::pending_grace_s` (1 s): a burst sharing
//!   a new prefix, routed before the first report lands, is not spread over every worker.
//! - Evictions before admission (`CoreConfig::expect_evictions`, set from the policy's
//!   `Policy::expects_evictions`: kvroute's only): on a worker reporting
//!   its KV capacity, the prompts queued ahead of a new one and the running requests' output
//!   until it is admitted allocate from vLLM's free queue, oldest first: first the free
//!   blocks the router knows nothing of, then the blocks its own finished requests released,
//!   in release order (`Overlay::kept_leading`). The new prompt's cached prefix counts in
//!   `expected_cached_tokens` only as far as it is in use there or released after the blocks
//!   those allocations take. On a worker the router has overcommitted (its outstanding
//!   requests' peak KV, `Candidate::active_kv_tokens`, plus this prompt's need exceed the
//!   reported capacity by more than `CoreConfig::overcommit_margin_tokens`, 2,000), only the
//!   part in use counts.
//! - kvroute's score = predicted TTFT + cache-affinity charge (`cache_affinity` x time to
//!   recompute the leading tokens the best-cached non-saturated candidate holds) + KV-balance
//!   charge (`kv_balance` x prefill time of the router's outstanding uncached tokens beyond
//!   the least-occupied candidate's; off) + KV-block charge (`block_balance`, 2 x prefill
//!   time of the distinct blocks outstanding with this prompt beyond the least candidate's,
//!   on a candidate where they exceed `block_balance_kv_share`, 90%, of its reported KV and
//!   it does not hold more of the prompt than `hot_prefix_max_kv_share` of that KV) + KV-fit
//!   charge (`kv_fit` x prefill time of the blocks the prompt adds wherever it goes that do
//!   not fit beside the candidate's working set, `Candidate::working_set_blocks`, in its
//!   reported KV, beyond the least any candidate evicts; working sets are tracked only with
//!   `CoreConfig::working_set_horizon` above 0, off by default; `working_set.rs`).
//!   All are in each candidate's `score`.
//! - GPU degraded (`Candidate.gpu_degraded`, see `gpu.rs`: a GPU throttled by heat, power
//!   brake or HW slowdown, a recent critical XID, uncorrected ECC): kvroute adds
//!   `gpu_degraded_penalty_s` (1 s) to its score while some candidate is healthy, so it loses
//!   ties and close calls but still takes work when the healthy ones are clearly slower.
//! - Passive health (`outlier.rs`): the data path reports each request's outcome
//!   (`outcome(w, Success | Failure(kind), now)`); `consecutive_failures` failures (or
//!   `consecutive_timeouts` timeouts) in a row eject the worker for `base x ejections` seconds
//!   (capped); ejected workers are no candidates (`Plan::ejected`) unless every allowed one
//!   is; at most `max_ejection_percent` of the open workers are ejected at once.
//! - Peer replicas (`peers.rs`, docs/replicas.md): the other router replicas' outstanding
//!   placements ([`PeerShare`], fed by the peer exchange) count like the replica's own: their
//!   blocks as placed (`pending_blocks`), their requests in `inflight`, `decoding` and the
//!   queue; a lost peer's share decays to nothing over `PeerConfig::decay_s`.
//! - Degraded (no tokens): no cache figures, predictions from queue and overhead alone, the
//!   decision is marked `degraded` with reason `degraded_load_only`.

// Routing takes the clock as an input (`now`); clippy.toml lists the clock reads denied here.
#![deny(clippy::disallowed_methods)]

mod admission;
mod assign;
mod baselines;
mod bound;
mod choose;
mod core;
mod gpu;
mod hot;
mod index;
mod keys;
mod outlier;
mod overlay;
mod peers;
mod plan;
mod policies;
mod predict;
mod request;
mod steps;
mod workers;
mod working_set;

pub use assign::{
    Assignment, AssignmentId, AssignmentState, Assignments, FirstToken, NewAssignment,
    WorkerInflight,
};
pub use baselines::{
    ApproxTree, DynamoCost, DynamoCostConfig, LlmdDefault, LlmdDefaultWeights, LlmdSticky,
    LlmdStickyConfig, SglangCacheAware, SglangCacheAwareConfig,
};
pub use bound::{BoundConfig, BoundOutcome, TtftBound};
pub use choose::{
    Candidate, CandidateReport, ChoiceContext, Decision, EvictionRule, Policy, PredictedTtft,
    PredictedTtftConfig, Reason,
};
pub use core::{
    CapResync, CoreConfig, IndexStats, Retired, RouteRequest, RoutingCore, Stored, rate_pool_from,
};
pub use gpu::{GpuIssue, GpuStatus};
pub use index::KvIndex;
pub use outlier::{
    EjectedWorker, Ejection, FailureKind, Health, Outcome, OutlierConfig, OutlierEvent,
};
pub use peers::{PeerConfig, PeerLoad, PeerPlacement, PeerRefused, PeerShare};
pub use plan::Plan;
pub use policies::{
    Calibration, LeastLoaded, MaxPrefix, MaxPrefixWeights, POLICY_NAMES, RandomPolicy, RoundRobin,
    UnknownPolicy, policy_by_name, policy_by_name_calibrated,
};
pub use predict::{
    ErrorStats, FirstTokenSample, Line, Prediction, Predictor, PredictorConfig, WholeSteps,
    WorkerModel, whole_steps_tokens,
};
pub use request::PromptHashes;
pub use steps::{DecodeSteps, StepClocks, StepConfig};
pub use workers::{BlockCaps, LoadSample, Worker, WorkerId, WorkerTable};

/// Candidates and contexts the policy tests share.
#[cfg(test)]
pub(crate) mod test_support {
    use super::choose::{Candidate, ChoiceContext};
    use super::workers::WorkerId;

    /// Worker `w`'s candidate for a 64-block prompt (block size 16), nothing cached.
    pub(crate) fn c(w: u32) -> Candidate {
        Candidate {
            worker: WorkerId(w),
            block_size: 16,
            prompt_blocks: 64,
            ..Candidate::default()
        }
    }

    /// A 1,024-token decision over `candidates`.
    pub(crate) fn ctx(candidates: Vec<Candidate>) -> ChoiceContext {
        ChoiceContext {
            prompt_tokens: 1024,
            degraded: false,
            prefix_anchor: None,
            candidates,
        }
    }
}
