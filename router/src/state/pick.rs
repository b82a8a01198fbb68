//! The pick API of the state: one [`PickInput`] built the same way by every front door,
//! a decision (the model resolved once, tokens, routable workers, the core's plan, the
//! policy's choice), the assignment, and the reports that end it.
//!
//! ```text
//! PickInput --resolve (alias draw)--> Resolved --routable_workers--> allowed
//!    --tokens_for (no lock)--> RouteRequest --core.plan--> Plan
//!    --InferencePolicy verdict (reject | restrict | shed)--> candidates --policy--> Decision
//!    pick: core.assign --> Picked          explain: DecisionRecord (nothing assigned)
//! first_token / observe_itl / done / abort / expire --> released once, metrics
//! ```

use std::time::Instant;

use serde::Serialize;

use kvroute_policy::{PoolState, PoolStateBuilder, RequestFacts, Verdict};

use super::RouterState;
use super::catalog::{AliasDraw, Resolved};
use super::policy::{self, ModelSwitchRecord, VerdictRecord};
use super::tickets::{DecisionId, TicketError};
use super::tokenizers::Degraded;
use crate::routing::{
    AssignmentId, Candidate, Decision, EjectedWorker, FailureKind, OutlierEvent, RouteRequest,
    WorkerId,
};

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
    /// The model already resolved by the caller (the gateway resolves it to rewrite the
    /// body); `None`: resolved here.
    pub resolved: Option<&'a Resolved>,
    /// Worker ids not to choose (e.g. a retry after a connection failure).
    pub exclude: &'a [String],
    /// The request's output limit, if it set one (see [`max_tokens_of`]).
    pub max_tokens: Option<u32>,
    /// The verified tenant ([`crate::tenant`]); `None`: anonymous. Never a client's claim:
    /// set only from credentials the front door verified.
    pub tenant: Option<&'a str>,
    /// Request labels for policy rules (classifiers, `x-kvroute-labels`); empty when none.
    pub labels: &'a [&'a str],
    /// Seed of the request's weighted draws (alias split, weighted targets); `None`: the
    /// hash of its `x-request-id` header, else the router's seeded sequence.
    pub seed: Option<u64>,
}

/// The output limit of an OpenAI or Anthropic request body: `max_completion_tokens`, else
/// `max_tokens`; `None` when absent or not a non-negative integer.
pub fn max_tokens_of(body: &serde_json::Map<String, serde_json::Value>) -> Option<u32> {
    ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(serde_json::Value::as_u64))
        .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
}

/// What a request body is, by the path it came on (or, without a path, by its fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// An OpenAI chat completions body (`messages`).
    Chat,
    /// An OpenAI completions body (`prompt`).
    Completion,
    /// Anything else: routed on load alone.
    Other,
}

impl BodyKind {
    /// The kind of `body` sent to `path` (query ignored); an empty path guesses from the
    /// body's fields.
    pub fn of(path: &str, body: &serde_json::Value) -> Self {
        let path = path.split('?').next().unwrap_or_default();
        match path {
            "/v1/chat/completions" => BodyKind::Chat,
            "/v1/completions" => BodyKind::Completion,
            _ if path.is_empty() && body.get("messages").is_some() => BodyKind::Chat,
            _ if path.is_empty() && body.get("prompt").is_some() => BodyKind::Completion,
            _ => BodyKind::Other,
        }
    }
}

impl<'a> PickInput<'a> {
    /// The one way every front door (gateway, Picker, explain) turns a client's JSON body
    /// into a pick: the prompt by `kind`, `cache_salt`, the output limit.
    pub fn from_body(
        model: &'a str,
        kind: BodyKind,
        body: &'a serde_json::Map<String, serde_json::Value>,
        headers: Option<&'a http::HeaderMap>,
        exclude: &'a [String],
    ) -> Self {
        let prompt = match kind {
            BodyKind::Chat => Prompt::Chat(body),
            BodyKind::Completion => body
                .get("prompt")
                .map_or(Prompt::Unavailable, Prompt::Completion),
            BodyKind::Other => Prompt::Unavailable,
        };
        Self {
            model,
            prompt,
            cache_salt: body.get("cache_salt").and_then(serde_json::Value::as_str),
            lora: None,
            headers,
            resolved: None,
            exclude,
            max_tokens: max_tokens_of(body),
            tenant: None,
            labels: &[],
            seed: None,
        }
    }
}

/// A request assigned to a worker. Release it exactly once with [`RouterState::done`] or
/// [`RouterState::abort`] (or let it expire).
#[derive(Clone, Debug, PartialEq)]
pub struct Picked {
    /// Handle for first_token / done / abort.
    pub assignment: AssignmentId,
    /// Chosen worker id.
    pub worker: String,
    /// Its host:port.
    pub address: String,
    /// The model name to send (rewrite the body when it differs from the request's).
    pub backend_model: String,
    /// Predicted TTFT, seconds (NaN when the policy predicts nothing).
    pub predicted_ttft_s: f64,
    /// The calibrated p90 upper bound on that TTFT, seconds (NaN: no prediction, or too few
    /// first tokens seen yet; `routing::TtftBound`).
    pub ttft_p90_bound_s: f64,
    /// Why it was chosen (metric label form).
    pub reason: &'static str,
    /// Scored on load alone.
    pub degraded: bool,
    /// What the matched policy rule leaves to the gateway: hook for the limiter and the
    /// provider relay.
    pub policy: PolicyHooks,
    /// The next-best candidates' addresses, best first (at most [`MAX_FALLBACKS`]): where an
    /// external proxy may retry when the chosen worker fails (the endpoint picker's
    /// fallback list). The assignment stays on the chosen worker.
    pub fallbacks: Vec<String>,
}

/// How many next-best candidates a [`Picked`] lists at most.
pub const MAX_FALLBACKS: usize = 8;

/// The parts of a verdict acted on after the pick: the per-tenant limiter reads `limits`,
/// the provider relay reads `overflow` (never set for a local-only request).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyHooks {
    /// The matched rule (`policy`, `rule`), if any.
    pub rule: Option<(String, String)>,
    /// The rule's per-tenant limits.
    pub limits: Option<kvroute_policy::Limits>,
    /// The rule's overflow provider and whether the pool crossed its threshold at decision
    /// time ([`kvroute_policy::Overflow::triggered`]).
    pub overflow: Option<(String, bool)>,
    /// The request must stay on local workers.
    pub local_only: bool,
    /// It must never leave the cluster: local-only, or labelled as personal data (`pii`).
    pub stay_local: bool,
    /// The service class of the tenant metrics: the matched rule's class, else the
    /// request's `x-kvroute-service-class`, when some policy declares that class
    /// ([`kvroute_policy::PolicySet::declared_class`]); `None` (label `default`) otherwise.
    pub class: Option<String>,
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
    /// The calibrated p90 upper bound the router would publish with it, seconds (NaN: none
    /// yet).
    pub ttft_p90_bound_s: f64,
    /// Every candidate with its figures (after policy restrictions).
    pub candidates: Vec<CandidateRecord>,
    /// Allowed workers that were no candidate because passive health ejected them (or that
    /// stayed candidates, `kept`, because every allowed worker was ejected).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ejected: Vec<EjectedRecord>,
    /// The tenant the request was evaluated for.
    pub tenant: Option<String>,
    /// The request's labels.
    pub labels: Vec<String>,
    /// The split alias's draw, if the model is one.
    pub alias: Option<AliasDraw>,
    /// The LoRA adapter the request runs with, if its model names one (docs/lora.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraRecord>,
    /// The InferencePolicy rule that matched and what it did.
    pub verdict: VerdictRecord,
}

/// A worker passive health left out of a [`DecisionRecord`]'s candidates.
#[derive(Clone, Debug, Serialize)]
pub struct EjectedRecord {
    /// Worker id.
    pub worker: String,
    /// Worker address.
    pub address: String,
    /// Why it is not a candidate: always `ejected`.
    pub why: &'static str,
    /// The failure that ejected it (`connect`, `http_5xx`, `stream_cut`, `timeout`).
    pub reason: &'static str,
    /// Seconds of ejection left.
    pub remaining_s: f64,
    /// Ejections in a row (the ejection time is the base time times this, capped).
    pub ejections: u32,
    /// Every allowed worker was ejected, so it stayed a candidate.
    pub kept: bool,
}

/// The LoRA adapter of a [`DecisionRecord`]: only workers of `base_model` that serve
/// `adapter` were candidates, and cache hits count only blocks cached under the adapter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoraRecord {
    /// The adapter's name.
    pub adapter: String,
    /// The model of the workers that serve it.
    pub base_model: String,
}

/// The `tracing` target of the decision log: with it at debug level (`RUST_LOG=warn,
/// kvroute_router::decisions=debug`) every decision the gateway, the Pick API and the
/// endpoint picker make is logged as one JSON line of its candidates' figures. Off by
/// default; nothing is built for it then. It holds worker names, the assignment id and
/// numbers, never the client's prompt, model name or headers (docs/troubleshooting.md).
pub const DECISION_LOG_TARGET: &str = "kvroute_router::decisions";

/// One line of the decision log.
#[derive(Serialize)]
struct DecisionLogLine<'a> {
    assignment: u64,
    policy: &'static str,
    chosen: String,
    reason: &'static str,
    degraded: bool,
    prompt_tokens: usize,
    candidates: Vec<CandidateRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pool: Option<&'a str>,
}

impl RouterState {
    fn log_decision(&self, d: &Decided, assignment: AssignmentId) {
        if !tracing::enabled!(target: DECISION_LOG_TARGET, tracing::Level::DEBUG) {
            return;
        }
        let line = DecisionLogLine {
            assignment: assignment.0,
            policy: d.decision.policy,
            chosen: d.name_of(d.decision.chosen).0,
            reason: d.decision.reason.as_str(),
            degraded: d.decision.degraded,
            prompt_tokens: d.decision.prompt_tokens,
            candidates: d.candidate_records(&self.load_only_ids()),
            pool: d.resolved.pool.as_deref(),
        };
        match serde_json::to_string(&line) {
            Ok(json) => tracing::debug!(target: DECISION_LOG_TARGET, decision = %json),
            Err(e) => {
                tracing::debug!(target: DECISION_LOG_TARGET, error = %e, "decision not logged");
            }
        }
    }
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
    /// No kvroute sidecar reports this worker (a GIE InferencePool pod): its figures rest on
    /// the router's own in-flight count alone, with no cache view (cached tokens are 0 and
    /// it is stale).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub load_only: bool,
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
    #[error("the tokenizer of model `{model}` {}", crate::gateway::error::tokenizer_not_ready_text(*.failed))]
    TokenizerNotReady {
        /// The client-facing model name.
        model: String,
        /// At least one load attempt failed (else it is still loading).
        failed: bool,
    },
    /// An InferencePolicy rule rejects the request.
    #[error("{message}")]
    Rejected {
        /// HTTP status the rule gives (400-599).
        status: u16,
        /// The rule's message.
        message: String,
        /// The policy (`namespace/name`).
        policy: String,
        /// The rule.
        rule: String,
    },
    /// A sheddable request whose TTFT target every local candidate is predicted to miss.
    #[error(
        "every local worker is predicted to miss this request's TTFT target of {target_ms} ms; retry later"
    )]
    Shed {
        /// The target, milliseconds.
        target_ms: u64,
        /// Seconds to wait before retrying.
        retry_after_s: u64,
        /// The rule that made it sheddable.
        rule: String,
    },
    /// A policy keeps the request on local workers (or restricts its targets) and none of
    /// them can take it.
    #[error("no local worker can take this request for model `{model}` now")]
    NoLocalCapacity {
        /// The client-facing model name.
        model: String,
        /// The rule that restricted it.
        rule: String,
    },
}

impl PickError {
    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            PickError::UnknownModel(_) => "unknown_model",
            PickError::NoReadyWorker(_) => "no_ready_worker",
            PickError::TokenizerNotReady { .. } => "tokenizer_not_ready",
            PickError::Rejected { .. } => "policy_rejected",
            PickError::Shed { .. } => "slo_shed",
            PickError::NoLocalCapacity { .. } => "no_local_capacity",
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

/// One decision, before it is assigned or explained.
struct Decided {
    resolved: Resolved,
    decision: Decision,
    /// (worker id, address, core id, WorkerSet) of every candidate.
    names: Vec<(String, String, WorkerId, String)>,
    degraded_reason: Option<&'static str>,
    verdict: VerdictRecord,
    hooks: PolicyHooks,
    /// The request's labels (classifiers and the caller's).
    labels: Vec<String>,
    /// Allowed workers passive health ejected.
    ejected: Vec<EjectedWorker>,
    /// The p90 bound on the chosen worker's predicted TTFT (the assignment's, when one was
    /// made).
    ttft_bound: f64,
}

impl Decided {
    /// Every candidate as a record: its worker's name and address, score and figures;
    /// `load_only` names the workers no sidecar reports.
    fn candidate_records(&self, load_only: &[String]) -> Vec<CandidateRecord> {
        self.decision
            .candidates
            .iter()
            .map(|r| {
                let (worker, address) = self.name_of(r.candidate.worker);
                CandidateRecord {
                    load_only: load_only.contains(&worker),
                    worker,
                    address,
                    score: r.score,
                    figures: r.candidate.clone(),
                }
            })
            .collect()
    }

    /// The addresses of the candidates other than the chosen one, by score (lower wins,
    /// scoreless last), at most [`MAX_FALLBACKS`].
    fn fallbacks(&self) -> Vec<String> {
        let mut ranked: Vec<(f64, WorkerId)> = self
            .decision
            .candidates
            .iter()
            .filter(|r| r.candidate.worker != self.decision.chosen)
            .map(|r| (r.score, r.candidate.worker))
            .collect();
        ranked.sort_by(|a, b| a.0.is_nan().cmp(&b.0.is_nan()).then(a.0.total_cmp(&b.0)));
        ranked
            .into_iter()
            .take(MAX_FALLBACKS)
            .map(|(_, w)| self.name_of(w).1)
            .filter(|a| !a.is_empty())
            .collect()
    }

    fn name_of(&self, w: WorkerId) -> (String, String) {
        self.names
            .iter()
            .find(|c| c.2 == w)
            .map(|c| (c.0.clone(), c.1.clone()))
            .unwrap_or_default()
    }
}

impl RouterState {
    /// Chooses a worker and records the assignment.
    pub fn pick(&self, input: &PickInput<'_>, now: Instant) -> Result<Picked, PickError> {
        let started = Instant::now();
        let result = self.decide(input, now, true);
        self.0
            .metrics
            .decision_duration
            .observe(started.elapsed().as_secs_f64());
        let m = &self.0.metrics;
        match result {
            // `decide(.., true)` always assigns; a missing id would be a bug, not a panic.
            Ok((d, Some(assignment))) => {
                self.log_decision(&d, assignment);
                let (worker, address) = d.name_of(d.decision.chosen);
                let fallbacks = d.fallbacks();
                let predicted_ttft_s = d.decision.predicted_ttft();
                m.requests
                    .with_label_values(&[input.model, &worker, d.decision.reason.as_str()])
                    .inc();
                if predicted_ttft_s.is_finite() {
                    m.predicted_ttft
                        .with_label_values(&[input.model, &worker])
                        .observe(predicted_ttft_s);
                }
                if d.decision.degraded {
                    let reason = d.degraded_reason.unwrap_or(crate::reasons::NO_PROMPT);
                    m.degraded_decisions
                        .with_label_values(&[input.model, reason])
                        .inc();
                }
                Ok(Picked {
                    assignment,
                    worker,
                    address,
                    backend_model: d.resolved.backend_model,
                    predicted_ttft_s,
                    ttft_p90_bound_s: d.ttft_bound,
                    reason: d.decision.reason.as_str(),
                    degraded: d.decision.degraded,
                    fallbacks,
                    policy: d.hooks,
                })
            }
            Ok((_, None)) => Err(PickError::NoReadyWorker(input.model.into())),
            Err(e) => {
                // The client's name is a label only once it resolved to a known model.
                let model = match &e {
                    PickError::UnknownModel(_) => "unknown",
                    _ => input.model,
                };
                m.pick_errors.with_label_values(&[model, e.label()]).inc();
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
        let (d, _) = self.decide(input, now, false)?;
        let (chosen, address) = d.name_of(d.decision.chosen);
        let candidates = d.candidate_records(&self.load_only_ids());
        let ejected = d
            .ejected
            .iter()
            .map(|e| {
                let (worker, address) = d.name_of(e.worker);
                EjectedRecord {
                    worker,
                    address,
                    why: "ejected",
                    reason: e.reason.label(),
                    remaining_s: e.remaining_s.max(0.0),
                    ejections: e.ejections,
                    kept: e.kept,
                }
            })
            .collect();
        let lora = d.resolved.lora_base.clone().map(|base_model| LoraRecord {
            adapter: d.resolved.backend_model.clone(),
            base_model,
        });
        Ok(DecisionRecord {
            model: input.model.to_string(),
            backend_model: d.resolved.backend_model,
            pool: d.resolved.pool,
            chosen,
            address,
            reason: d.decision.reason.as_str(),
            policy: d.decision.policy,
            degraded: d.decision.degraded,
            degraded_reason: d.degraded_reason.map(str::to_string),
            prompt_tokens: d.decision.prompt_tokens,
            predicted_ttft_s: d.decision.predicted_ttft(),
            ttft_p90_bound_s: d.ttft_bound,
            candidates,
            ejected,
            tenant: input.tenant.map(str::to_string),
            labels: d.labels.clone(),
            alias: d.resolved.alias.clone(),
            lora,
            verdict: d.verdict,
        })
    }

    /// The one decision path of the gateway, the Pick API and explain: resolve (a split
    /// alias draws its model), routable workers, tokens, plan, the InferencePolicy verdict
    /// (reject, restrict candidates, shed), the routing policy's choice, and with `assign`
    /// the assignment. Policy metrics count only assigning calls (not explain).
    fn decide(
        &self,
        input: &PickInput<'_>,
        now: Instant,
        assign: bool,
    ) -> Result<(Decided, Option<AssignmentId>), PickError> {
        let m = &self.0.metrics;
        let seed = input.seed.or_else(|| policy::request_seed(input.headers));
        let resolved = match input.resolved {
            Some(r) => r.clone(),
            None => self
                .resolve_model_seeded(input.model, seed)
                .ok_or_else(|| PickError::UnknownModel(input.model.into()))?,
        };
        let seed = seed
            .or_else(|| resolved.alias.as_ref().map(|a| a.seed))
            .unwrap_or_else(|| self.next_seed());
        let policies = self.policy_set();
        let (class_header, target_header) =
            policy::class_headers(input.headers, &m.policy.bad_headers);
        let headers = policy::Headers(input.headers);
        let labels = super::labels::label(&self.0.classifier, input);
        let mut facts = request_facts(input, &resolved, &labels.all, &headers, class_header);
        let pool_sets = self.pool_worker_sets(resolved.pool.as_deref());
        let names = self.routable_workers(
            resolved.served_model(),
            resolved.lora(),
            &pool_sets,
            input.exclude,
        );
        if names.is_empty() {
            // No local candidate: a reject or local-only rule still says why; a rule that
            // names an alternative model may still serve it there.
            let verdict = policies.evaluate(&facts, &PoolState::default());
            self.check_verdict(&verdict, assign)?;
            if switch_of(&verdict, &resolved, input).is_none() {
                if verdict.local_only() {
                    return Err(PickError::NoLocalCapacity {
                        model: input.model.into(),
                        rule: verdict.rule().unwrap_or_default().into(),
                    });
                }
                return Err(PickError::NoReadyWorker(input.model.into()));
            }
        }

        // Tokenize outside every lock: it is the expensive part. (Not for a model without
        // candidates: only its alternative can serve it.)
        let (tokens, degraded_reason) = if names.is_empty() {
            (None, Some(Degraded::NoPrompt.label()))
        } else {
            self.tokenize(input, resolved.served_model())?
        };
        facts.prompt_tokens = tokens.as_ref().map_or(0, |t| t.len() as u64);
        let req = RouteRequest {
            tokens: tokens.as_deref(),
            model: resolved.served_model(),
            lora: resolved.lora().or(input.lora),
            cache_salt: input.cache_salt,
            max_tokens: input.max_tokens,
        };
        let allowed: Vec<WorkerId> = names.iter().map(|c| c.2).collect();
        let t = self.secs(now);

        let mut guard = self.0.core.lock();
        guard.routing.set_step_clocks(&self.0.taps.lock().steps);
        let mut plan = guard.routing.plan(&req, &allowed, t);
        let pool = pool_state(&guard.routing, &plan);
        let verdict = policies.evaluate(&facts, &pool);
        let mut record = VerdictRecord::of(&verdict);
        let hooks = PolicyHooks::of(&verdict, &pool, &labels.all, &policies, class_header);

        // A rule naming an alternative model: plan it too (its own tokens, outside the
        // lock), then keep the requested model only when it is predicted to answer first.
        let mut chosen_model = None;
        if let Some(switch) = switch_of(&verdict, &resolved, input) {
            drop(guard);
            let alternative = self.prepare_alternative(input, &resolved, &switch.model);
            guard = self.0.core.lock();
            plan = guard.routing.plan(&req, &allowed, t);
            let cached_best = best_ttft_where(&plan, |c| c.expected_cached_tokens > 0.0);
            let mut sw = ModelSwitchRecord {
                requested: resolved.backend_model.clone(),
                alternative: switch.model.to_string(),
                requested_best_ttft_s: best_ttft_where(&plan, |_| true),
                requested_cached_best_ttft_s: cached_best,
                ..ModelSwitchRecord::default()
            };
            match alternative {
                Err(detail) => {
                    sw.outcome = "unavailable";
                    sw.detail = Some(detail);
                }
                Ok(alt) => {
                    let alt_req = RouteRequest {
                        tokens: alt.tokens.as_deref(),
                        model: alt.resolved.served_model(),
                        lora: alt.resolved.lora(),
                        ..req
                    };
                    let alt_allowed: Vec<WorkerId> = alt.names.iter().map(|c| c.2).collect();
                    let alt_plan = guard.routing.plan(&alt_req, &alt_allowed, t);
                    sw.alternative_best_ttft_s = best_ttft_where(&alt_plan, |_| true);
                    // A worker that caches the prompt's prefix and answers first keeps it.
                    let cache_first = match (cached_best, sw.alternative_best_ttft_s) {
                        (Some(r), Some(a)) => r < a,
                        (Some(_), None) => true,
                        (None, _) => false,
                    };
                    if switch.keep_when_cached && cache_first {
                        sw.outcome = "kept-cached";
                    } else if alt_plan.context.candidates.is_empty() {
                        sw.outcome = "unavailable";
                        sw.detail = Some("no ready worker".into());
                    } else {
                        sw.outcome = "switched";
                        plan = alt_plan;
                        chosen_model = Some(alt);
                    }
                }
            }
            if assign {
                m.policy
                    .model_switches
                    .with_label_values(&[verdict.rule().unwrap_or_default(), sw.outcome])
                    .inc();
            }
            record.model_switch = Some(sw);
        }
        let (resolved, names, degraded_reason, alt_tokens) = match chosen_model {
            Some(alt) => (
                alt.resolved,
                alt.names,
                alt.degraded_reason,
                Some(alt.tokens),
            ),
            None => (resolved, names, degraded_reason, None),
        };
        // The prompt the chosen plan was made from (a policy may keep its own record of it).
        let prompt = match &alt_tokens {
            Some(t) => t.as_deref(),
            None => tokens.as_deref(),
        };
        let core = &mut *guard;
        let checked = self
            .check_verdict(&verdict, assign)
            .and_then(|()| {
                let Some(route) = verdict.route() else {
                    return Ok(());
                };
                let set_of = |w: WorkerId| names.iter().find(|n| n.2 == w).map(|n| n.3.clone());
                if policy::restrict(
                    route,
                    &mut plan.context.candidates,
                    &set_of,
                    seed,
                    &mut record,
                ) {
                    Ok(())
                } else {
                    Err(PickError::NoLocalCapacity {
                        model: input.model.into(),
                        rule: verdict.rule().unwrap_or_default().into(),
                    })
                }
            })
            .and_then(|()| {
                self.shed_check(
                    &verdict,
                    &plan.context.candidates,
                    class_header,
                    target_header,
                    &mut record,
                    assign,
                )
            });
        if let Err(e) = checked {
            drop(guard);
            return Err(e);
        }
        let decision = core
            .policy
            .choose_prompt(&plan.context, prompt, t)
            .ok_or_else(|| PickError::NoReadyWorker(input.model.into()))?;
        let mut ttft_bound = core.routing.ttft_bound(decision.predicted_ttft());
        let id = if assign {
            let aid = core.routing.assign(&plan, &decision, t);
            ttft_bound = core
                .routing
                .assignment(aid)
                .map_or(f64::NAN, |a| a.ttft_bound);
            let worker = names
                .iter()
                .find(|c| c.2 == decision.chosen)
                .map(|c| c.0.clone())
                .unwrap_or_default();
            core.labels.insert(aid, (input.model.to_string(), worker));
            if self.peers_on()
                && let Some(p) = super::peers::placement_of(&core.routing, aid)
            {
                self.publish(crate::peer::wire::PeerEvent::Placed(p));
            }
            Some(aid)
        } else {
            None
        };
        drop(guard);
        if assign {
            m.policy
                .verdicts
                .with_label_values(&[
                    verdict.policy().unwrap_or("-"),
                    verdict.rule().unwrap_or("-"),
                ])
                .inc();
            for l in labels.classified.iter_names() {
                m.policy.labels.with_label_values(&[l]).inc();
            }
        }
        let decided = Decided {
            resolved,
            decision,
            names,
            degraded_reason,
            verdict: record,
            hooks,
            labels: labels.all.iter().map(|l| l.to_string()).collect(),
            ejected: plan.ejected,
            ttft_bound,
        };
        Ok((decided, id))
    }

    /// Tokens of `input`'s prompt for `model`, or why the decision is degraded (counted).
    /// A configured tokenizer that is not loaded yet refuses the request.
    fn tokenize(
        &self,
        input: &PickInput<'_>,
        model: &str,
    ) -> Result<(Option<Vec<u32>>, Option<&'static str>), PickError> {
        match self.tokens_for(input, model)? {
            Ok(t) => Ok((Some(t), None)),
            Err(reason) => {
                if let Degraded::Failed(label) = reason {
                    self.0
                        .metrics
                        .tokenization_failures
                        .with_label_values(&[input.model, label])
                        .inc();
                }
                Ok((None, Some(reason.label())))
            }
        }
    }

    /// Resolves, lists and tokenizes a rule's alternative `model` for `input` (outside the
    /// core lock), or says why it cannot serve the request.
    fn prepare_alternative(
        &self,
        input: &PickInput<'_>,
        requested: &Resolved,
        model: &str,
    ) -> Result<Alternative, String> {
        let resolved = self
            .resolve_model(model)
            .ok_or_else(|| format!("model {model:?} is not served"))?;
        if resolved.pool != requested.pool {
            return Err(format!("model {model:?} is not in the request's pool"));
        }
        let sets = self.pool_worker_sets(resolved.pool.as_deref());
        let names = self.routable_workers(
            resolved.served_model(),
            resolved.lora(),
            &sets,
            input.exclude,
        );
        if names.is_empty() {
            return Err("no ready worker".into());
        }
        let alt_input = PickInput {
            model,
            lora: None,
            ..*input
        };
        let (tokens, degraded_reason) = self
            .tokenize(&alt_input, resolved.served_model())
            .map_err(|_| format!("the tokenizer of {model:?} is not loaded yet"))?;
        Ok(Alternative {
            resolved,
            names,
            tokens,
            degraded_reason,
        })
    }

    /// The policy's hooks for a request no local worker can take now (evaluated on an empty
    /// pool state, so an overflow rule triggers): what the gateway's overflow step needs when
    /// the local pick found no capacity. Never assigns nor counts.
    pub fn hooks_without_capacity(&self, input: &PickInput<'_>) -> Option<PolicyHooks> {
        let seed = input.seed.or_else(|| policy::request_seed(input.headers));
        let resolved = match input.resolved {
            Some(r) => r.clone(),
            None => self.resolve_model_seeded(input.model, seed)?,
        };
        let policies = self.policy_set();
        let (class_header, _) =
            policy::class_headers(input.headers, &self.0.metrics.policy.bad_headers);
        let headers = policy::Headers(input.headers);
        let labels = super::labels::label(&self.0.classifier, input);
        let facts = request_facts(input, &resolved, &labels.all, &headers, class_header);
        let pool = PoolState::default();
        let verdict = policies.evaluate(&facts, &pool);
        Some(PolicyHooks::of(
            &verdict,
            &pool,
            &labels.all,
            &policies,
            class_header,
        ))
    }

    /// A reject verdict becomes [`PickError::Rejected`] (counted when `assign`).
    fn check_verdict(&self, verdict: &Verdict<'_>, assign: bool) -> Result<(), PickError> {
        let Some(r) = verdict.reject() else {
            return Ok(());
        };
        let rule = verdict.rule().unwrap_or_default();
        if assign {
            let p = &self.0.metrics.policy;
            p.rejected.with_label_values(&[rule]).inc();
            p.verdicts
                .with_label_values(&[verdict.policy().unwrap_or("-"), rule])
                .inc();
        }
        Err(PickError::Rejected {
            status: r.status,
            message: r.message.to_string(),
            policy: verdict.policy().unwrap_or_default().into(),
            rule: rule.into(),
        })
    }

    /// Service class and SLO shedding: the class in effect (rule, else header), the TTFT
    /// target (header, else rule), and for a sheddable request whose every candidate has a
    /// prediction above the target, [`PickError::Shed`] (counted when `assign`).
    fn shed_check(
        &self,
        verdict: &Verdict<'_>,
        candidates: &[crate::routing::Candidate],
        class_header: Option<&str>,
        target_header: Option<u64>,
        record: &mut VerdictRecord,
        assign: bool,
    ) -> Result<(), PickError> {
        let class = verdict.service_class();
        record.service_class = class
            .and_then(|c| c.name.as_deref())
            .or(class_header)
            .map(str::to_string);
        let target_s = target_header
            .map(|ms| ms as f64 / 1000.0)
            .or_else(|| class.and_then(|c| c.ttft_target_s));
        record.ttft_target_ms = target_s.map(|s| (s * 1000.0).round() as u64);
        record.sheddable = class.is_some_and(|c| c.sheddable);
        let (Some(target), true) = (target_s, record.sheddable) else {
            return Ok(());
        };
        let all_late = !candidates.is_empty()
            && candidates
                .iter()
                .all(|c| c.predicted_ttft.is_finite() && c.predicted_ttft > target);
        if !all_late {
            return Ok(());
        }
        let best = candidates
            .iter()
            .map(|c| c.predicted_ttft)
            .fold(f64::INFINITY, f64::min);
        let rule = verdict.rule().unwrap_or_default();
        if assign {
            let p = &self.0.metrics.policy;
            p.slo_shed.with_label_values(&[rule]).inc();
            p.verdicts
                .with_label_values(&[verdict.policy().unwrap_or("-"), rule])
                .inc();
        }
        Err(PickError::Shed {
            target_ms: record.ttft_target_ms.unwrap_or_default(),
            retry_after_s: best.ceil().clamp(1.0, 60.0) as u64,
            rule: rule.into(),
        })
    }
    // ---------------------------------------------------------------- Pick API ids

    /// A random decision id for `assignment`, bound to `owner` (the caller's identity). `None`
    /// when the assignment is no longer outstanding.
    pub fn issue_decision_id(&self, assignment: AssignmentId, owner: String) -> Option<DecisionId> {
        let mut core = self.0.core.lock();
        if !core.labels.contains_key(&assignment) {
            return None;
        }
        Some(core.tickets.issue(assignment, owner))
    }

    /// Keeps `tap` (tenant metrics, the tenant's limit permit) with `assignment`'s decision id
    /// until the assignment ends.
    pub fn attach_tenant(&self, assignment: AssignmentId, tap: crate::tenant::TenantTap) {
        self.0.core.lock().tickets.attach(assignment, tap);
    }

    /// Runs `f` on the tenant tap of `assignment`, if it has one (outside no lock but the
    /// core's: `f` must be quick).
    pub fn tenant_report(
        &self,
        assignment: AssignmentId,
        f: impl FnOnce(&mut crate::tenant::TenantTap),
    ) {
        if let Some(t) = self.0.core.lock().tickets.tap_mut(assignment) {
            f(t);
        }
    }

    /// The assignment of decision id `id` when `owner` holds it.
    pub fn decision(&self, id: DecisionId, owner: &str) -> Result<AssignmentId, TicketError> {
        self.0.core.lock().tickets.check(id, owner)
    }

    // ---------------------------------------------------------------- reports

    /// Records the first token of an assignment and teaches the predictor. `observed_ttft_s`
    /// is the data path's measurement (None: time since the pick). False when the id is
    /// unknown, released, or already past its first token.
    pub fn first_token(
        &self,
        id: AssignmentId,
        observed_ttft_s: Option<f64>,
        now: Instant,
    ) -> bool {
        self.first_token_served(id, observed_ttft_s, None, now)
    }

    /// [`RouterState::first_token`] with `served_ttft_s`, the time since the gateway received
    /// the request, which the published p90 bound is calibrated on (see
    /// `RoutingCore::first_token_served`).
    pub fn first_token_served(
        &self,
        id: AssignmentId,
        observed_ttft_s: Option<f64>,
        served_ttft_s: Option<f64>,
        now: Instant,
    ) -> bool {
        let t = self.secs(now);
        let aid = id;
        let mut core = self.0.core.lock();
        let Some(ft) = core
            .routing
            .first_token_served(aid, t, observed_ttft_s, served_ttft_s)
        else {
            return false;
        };
        self.publish(crate::peer::wire::PeerEvent::Started(aid.0));
        let labels = core.labels.get(&aid).cloned();
        {
            let mut taps = self.0.taps.lock();
            if let Some((model, worker)) = &labels {
                let itl = self.0.metrics.itl.with_label_values(&[model, worker]);
                taps.streams.insert(aid, (ft.assignment.worker, itl));
            }
            // The first token's chunk ends an engine step there.
            taps.steps
                .observe(&self.0.config.steps, ft.assignment.worker, t);
        }
        drop(core);
        if let Some((model, worker)) = labels {
            let m = &self.0.metrics;
            m.ttft
                .with_label_values(&[&model, &worker])
                .observe(ft.observed_ttft);
            let predicted = ft.assignment.published_ttft;
            if predicted.is_finite() {
                m.ttft_prediction_error
                    .with_label_values(&[&model, &worker])
                    .observe((ft.observed_ttft - predicted).abs());
                m.ttft_bound
                    .with_label_values(&[&model, ft.bound.as_str()])
                    .inc();
            }
        }
        true
    }

    /// Observes one inter-token gap of an assignment (streaming data paths): its ITL
    /// histogram, and the end of an engine step on its worker (`routing::StepClocks`).
    pub fn observe_itl(&self, id: AssignmentId, seconds: f64) {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return;
        }
        let t = self.secs(Instant::now());
        // Not the core lock: a token waits for no routing decision.
        let mut taps = self.0.taps.lock();
        let taps = &mut *taps;
        if let Some((w, h)) = taps.streams.get(&id) {
            h.observe(seconds);
            taps.steps.observe(&self.0.config.steps, *w, t);
        }
    }

    /// Releases a completed assignment. False when unknown or already released.
    pub fn done(&self, id: AssignmentId, usage: Usage) -> bool {
        let Some((model, worker)) =
            self.release(id, Release::Done, Some(usage.completion_tokens), None)
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

    /// Releases an aborted assignment. False when unknown or already released. A `reason`
    /// that names a worker failure ([`FailureKind::from_report`]: `connect`, `http_5xx`,
    /// `stream_cut`, `timeout`) also counts toward the worker's passive health; any other
    /// reason (the client went away) does not.
    pub fn abort(&self, id: AssignmentId, reason: &str) -> bool {
        if let Some(kind) = FailureKind::from_report(reason) {
            return self.failed(id, kind);
        }
        let released = self.release(id, Release::Aborted, None, None).is_some();
        if released {
            tracing::debug!(decision = %id, reason, "assignment aborted");
        }
        released
    }

    /// The worker of an assignment failed it (`kind`): counts toward its passive health (it
    /// may be ejected), then releases the assignment. False when unknown or already released.
    pub fn failed(&self, id: AssignmentId, kind: FailureKind) -> bool {
        let released = self
            .release(id, Release::Aborted, None, Some(kind))
            .is_some();
        if released {
            tracing::debug!(decision = %id, reason = kind.label(), "assignment failed");
        }
        released
    }

    /// Releases an assignment; a completed one with its output token count also teaches the
    /// routing core the worker's decode speed. A completion ends the worker's failure run
    /// (passive health); a `failure` adds to it, which may eject the worker.
    fn release(
        &self,
        id: AssignmentId,
        how: Release,
        output_tokens: Option<u32>,
        failure: Option<FailureKind>,
    ) -> Option<(String, String)> {
        let aid = id;
        let t = self.secs(Instant::now());
        let mut core = self.0.core.lock();
        let event = match (how, failure) {
            (_, Some(kind)) => core.routing.assignment_failed(aid, kind, t),
            (Release::Done, None) => {
                core.routing.assignment_succeeded(aid, t);
                None
            }
            _ => None,
        };
        let released = match how {
            Release::Done => match output_tokens {
                Some(n) => core.routing.finish_observed(aid, t, u64::from(n)),
                None => core.routing.finish(aid),
            },
            Release::Aborted | Release::Expired => core.routing.abort(aid),
        };
        released?;
        self.publish(crate::peer::wire::PeerEvent::Ended(aid.0));
        let labels = self.forget_assignment(&mut core, aid).unwrap_or_default();
        drop(core);
        let m = &self.0.metrics;
        m.released.with_label_values(&[how.label()]).inc();
        if let Some(kind) = failure {
            m.worker_failures.with_label_values(&[kind.label()]).inc();
        }
        match event.map(|(_, e)| e) {
            Some(OutlierEvent::Ejected(e)) => {
                m.outlier_ejections
                    .with_label_values(&[e.reason.label()])
                    .inc();
                tracing::warn!(
                    worker = %labels.1,
                    reason = e.reason.label(),
                    ejections = e.ejections,
                    seconds = e.until - t,
                    "worker ejected (passive health)"
                );
            }
            Some(OutlierEvent::Refused(kind)) => {
                m.outlier_ejections_refused
                    .with_label_values(&[kind.label()])
                    .inc();
                tracing::warn!(
                    worker = %labels.1,
                    reason = kind.label(),
                    "worker not ejected: max-ejection-percent reached"
                );
            }
            Some(OutlierEvent::None) | None => {}
        }
        Some(labels)
    }

    /// Drops what the state keeps beside the routing core for an assignment that ended
    /// (metric labels, ITL handle, decision id); returns its labels. Called with the core
    /// locked (lock order: core, then itl).
    pub(super) fn forget_assignment(
        &self,
        core: &mut super::Core,
        id: AssignmentId,
    ) -> Option<(String, String)> {
        self.0.taps.lock().streams.remove(&id);
        core.tickets.forget(id);
        core.labels.remove(&id)
    }

    /// Releases every assignment older than the TTL; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let t = self.secs(now);
        let ttl = self.0.config.assignment_ttl.as_secs_f64();
        let mut core = self.0.core.lock();
        let gone = core.routing.expire(t, ttl);
        for (id, _) in &gone {
            self.forget_assignment(&mut core, *id);
            self.publish(crate::peer::wire::PeerEvent::Ended(id.0));
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
        self.0.core.lock().routing.outstanding()
    }
}

/// Labels that mark personal data: `pii` and `pii:<kind>`.
pub(crate) fn is_personal(labels: &[&str]) -> bool {
    labels.iter().any(|l| *l == "pii" || l.starts_with("pii:"))
}

/// A model a rule may switch a request to, once resolved, listed and tokenized.
struct Alternative {
    resolved: Resolved,
    names: Vec<(String, String, WorkerId, String)>,
    tokens: Option<Vec<u32>>,
    degraded_reason: Option<&'static str>,
}

/// The matched rule's alternative model, unless it is the model requested or the request
/// names a LoRA adapter (which only its base model serves).
fn switch_of<'p>(
    verdict: &Verdict<'p>,
    resolved: &Resolved,
    input: &PickInput<'_>,
) -> Option<&'p kvroute_policy::ModelSwitch> {
    if resolved.lora().or(input.lora).is_some() {
        return None;
    }
    verdict
        .route()
        .and_then(|r| r.switch.as_ref())
        .filter(|s| *s.model != *resolved.backend_model && *s.model != *input.model)
}

/// The lowest finite predicted TTFT of a plan's candidates that `keep` accepts.
fn best_ttft_where(plan: &crate::routing::Plan, keep: impl Fn(&Candidate) -> bool) -> Option<f64> {
    plan.context
        .candidates
        .iter()
        .filter(|c| keep(c))
        .map(|c| c.predicted_ttft)
        .filter(|t| t.is_finite())
        .reduce(f64::min)
}

/// The pool-state figures rules match on, folded from a plan's candidates.
fn pool_state(routing: &crate::routing::RoutingCore, plan: &crate::routing::Plan) -> PoolState {
    let mut pool = PoolStateBuilder::default();
    for c in &plan.context.candidates {
        let gpus = routing.worker(c.worker).map(|w| &w.gpus[..]);
        let gpu = gpus.filter(|g| !g.is_empty()).map(|g| {
            g.iter()
                .map(|x| f64::from(x.utilization_percent))
                .sum::<f64>()
                / (100.0 * g.len() as f64)
        });
        pool.add(
            c.predicted_ttft,
            c.waiting.max(c.inflight),
            f64::from(c.kv_usage),
            gpu,
        );
    }
    pool.finish()
}

/// The policy engine's view of a request (prompt tokens filled in once tokenized).
fn request_facts<'a>(
    input: &PickInput<'a>,
    resolved: &'a Resolved,
    labels: &'a [&'a str],
    headers: &'a policy::Headers<'a>,
    service_class: Option<&'a str>,
) -> RequestFacts<'a> {
    RequestFacts {
        pool: resolved.pool.as_deref(),
        tenant: input.tenant,
        model: input.model,
        backend_model: (resolved.backend_model != input.model)
            .then_some(resolved.backend_model.as_str()),
        labels,
        headers,
        service_class,
        prompt_tokens: 0,
        max_output_tokens: input.max_tokens,
    }
}

impl PolicyHooks {
    /// What the gateway acts on after the pick, from `verdict` on `pool` (`set`: the
    /// policies that gave it; `class_header`: the request's valid class header).
    fn of(
        verdict: &Verdict<'_>,
        pool: &PoolState,
        labels: &[&str],
        set: &kvroute_policy::PolicySet,
        class_header: Option<&str>,
    ) -> Self {
        let class = verdict
            .service_class()
            .and_then(|c| c.name.as_deref())
            .or(class_header)
            .and_then(|c| set.declared_class(c))
            .map(str::to_string);
        Self {
            class,
            rule: verdict
                .matched
                .map(|x| (x.policy.to_string(), x.rule.to_string())),
            limits: verdict.limits().copied(),
            overflow: verdict
                .overflow()
                .map(|o| (o.provider.to_string(), o.triggered(pool))),
            local_only: verdict.local_only(),
            stay_local: verdict.local_only() || is_personal(labels),
        }
    }
}
