//! The Picker gRPC service for external gateways, and the upkeep task that expires assignments
//! nobody reported and retires workers that are gone.
//!
//! ```text
//! proxy --Pick(path, headers, body)--> PickerService --RouterState::pick--> decision id, worker
//! proxy --ReportFirstToken / ReportDone / ReportAborted--> RouterState (released once)
//! UpkeepTask (every ttl/4) --RouterState::maintain--> unreported assignments released,
//!                                                     gone workers retired
//! ```
//!
//! The body is the client's JSON request. Chat requests (`/v1/chat/completions` or any body
//! with `messages`) and completions (`/v1/completions`, `prompt`) are tokenized like the
//! embedded gateway does; other paths are routed on load alone (degraded, and said so). When
//! the model is an alias, the response carries the body with `model` rewritten to the backend
//! model. Errors: bad JSON or no `model` -> `INVALID_ARGUMENT`; unknown model -> `NOT_FOUND`;
//! no routable worker, or the decision pool full -> `UNAVAILABLE`. Decisions (JSON parsing,
//! tokenizing) run on the bounded [`BlockingPool`], never on the async threads.
//!
//! The client's credentials travel in the Pick request's `headers` (`authorization`,
//! `x-api-key`, `x-kvroute-tenant`) and are checked against the model's pool like the embedded
//! gateway does ([`crate::gateway::tenancy`]; the pool's mTLS picker may name the tenant):
//! `UNAUTHENTICATED`, `PERMISSION_DENIED`, or `RESOURCE_EXHAUSTED` at a tenant limit, whose
//! permit stays with the decision id until it is reported or expires.
//!
//! Decision ids are 128 random bits (32 hex characters), bound to the caller's identity
//! ([`crate::auth`]; `anonymous` on a plaintext listener). A report with an id that is
//! malformed, never issued or already released is refused with `NOT_FOUND`, one issued to
//! another caller with `PERMISSION_DENIED`; on a TLS listener only a picker identity (of the
//! model's pool, when the model comes from a pool) may call at all. Every refusal counts in
//! `kvroute_router_pick_refused_total{reason}`.
//!
//! A request over `--max-body-bytes` ->
//! `RESOURCE_EXHAUSTED` (tonic refuses it from its length prefix; [`CountOversize`] counts it
//! in `kvroute_router_limit_hits_total{limit="pick_message_size"}`), and so is a Pick while
//! `--max-outstanding-picks` assignments are outstanding (`outstanding_picks`).

use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName, HeaderValue};
use kvroute_proto::v1::picker_server::{Picker, PickerServer};
use kvroute_proto::v1::{
    PickRequest, PickResponse, ReportAbortedRequest, ReportDoneRequest, ReportFirstTokenRequest,
    ReportResponse, pick_response,
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tonic::codegen::{BoxFuture, Service};
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use crate::auth::{Caller, PickRefused, authorize_pick};
use crate::blocking_pool::{BlockingPool, Caller as PoolCaller, PoolError};
use crate::gateway::GatewayError;
use crate::gateway::tenancy;
use crate::limits::Limit;
use crate::routing::AssignmentId;
use crate::state::{
    BodyKind, DecisionId, PickError, PickInput, Picked, RouterState, TicketError, Usage,
};

/// The tonic Picker service.
#[derive(Clone)]
pub struct PickerService {
    state: RouterState,
    pool: BlockingPool,
    tls: bool,
}

impl PickerService {
    /// A service routing with `state`, deciding on `pool`, for anonymous callers (plaintext
    /// listener until [`PickerService::tls`]).
    pub fn new(state: RouterState, pool: BlockingPool) -> Self {
        Self {
            state,
            pool,
            tls: false,
        }
    }

    /// Served behind TLS (`--grpc-tls-dir`): callers are authenticated by certificate.
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    fn refuse(&self, refused: PickRefused) -> Status {
        self.state
            .metrics()
            .auth
            .pick_refused
            .with_label_values(&[refused.label()])
            .inc();
        // Debug, not info: forged ids cost a caller nothing, the counter says how many.
        tracing::debug!(reason = refused.label(), %refused, "refusing a Pick API call");
        refused.status()
    }

    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        Caller::of(request, self.tls).map_err(|u| self.refuse(u.into()))
    }

    /// The assignment of a report's decision id, if this caller holds it.
    fn assignment<T>(&self, request: &Request<T>, id: &str) -> Result<AssignmentId, Status> {
        let caller = self.caller(request)?;
        if let Caller::Verified { identity, .. } = &caller
            && !matches!(identity, kvroute_tls::Identity::Picker { .. })
        {
            return Err(self.refuse(PickRefused::NotAPicker(identity.uri())));
        }
        let id = DecisionId::parse(id).ok_or_else(|| self.refuse(PickRefused::UnknownId))?;
        self.state.decision(id, &caller.owner()).map_err(|e| {
            self.refuse(match e {
                TicketError::Unknown => PickRefused::UnknownId,
                TicketError::Foreign => PickRefused::ForeignId,
            })
        })
    }

    /// As a tonic server; bodies up to `--max-body-bytes` (the same bound as the embedded
    /// gateway's, so both front doors take the same requests), plus 64 KiB for the path and
    /// headers. Refusals are counted.
    pub fn into_server(self) -> CountOversize<PickerServer<Self>> {
        let limit = self.state.config().max_body_bytes.saturating_add(64 << 10);
        let state = self.state.clone();
        CountOversize {
            inner: PickerServer::new(self).max_decoding_message_size(limit),
            state,
        }
    }
}

/// A Picker server that answers an oversized request `RESOURCE_EXHAUSTED` and counts it.
/// tonic refuses a message over the decoding limit before the handler runs, with
/// `OUT_OF_RANGE` (which the handler never returns), so only the response shows it: a
/// unary error travels in the response headers, where this rewrites the code. (The
/// handler counts its own refusals.)
#[derive(Clone)]
pub struct CountOversize<S> {
    inner: S,
    state: RouterState,
}

impl<S: NamedService> NamedService for CountOversize<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for CountOversize<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let state = self.state.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            let out_of_range = http::HeaderValue::from(tonic::Code::OutOfRange as i32);
            if response.headers().get("grpc-status") == Some(&out_of_range) {
                response.headers_mut().insert(
                    "grpc-status",
                    http::HeaderValue::from(tonic::Code::ResourceExhausted as i32),
                );
                state.limit_hit(
                    Limit::PickMessageSize,
                    format_args!("Pick request refused: over --max-body-bytes"),
                );
            }
            Ok(response)
        })
    }
}

fn headers_of(map: &std::collections::HashMap<String, String>) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (k, v) in map {
        // Headers that are not valid HTTP are dropped: they cannot match a policy rule.
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            out.append(k, v);
        }
    }
    out
}

/// The gRPC status of a refusal by the tenant step (the same cases as the gateway's 401, 403,
/// 404 and 429; the message is the one HTTP clients get).
fn tenant_status(e: &GatewayError) -> Status {
    match e.status() {
        401 => Status::unauthenticated(e.to_string()),
        403 => Status::permission_denied(e.to_string()),
        404 => Status::not_found(e.to_string()),
        429 => Status::resource_exhausted(e.to_string()),
        _ => Status::internal("internal error"),
    }
}

fn pick_status(e: &PickError) -> Status {
    match e {
        PickError::UnknownModel(_) => Status::not_found(e.to_string()),
        PickError::NoReadyWorker(_) | PickError::TokenizerNotReady { .. } => {
            Status::unavailable(e.to_string())
        }
        PickError::NoLocalCapacity { .. } => Status::unavailable(e.to_string()),
        PickError::Shed { .. } => Status::resource_exhausted(e.to_string()),
        PickError::Rejected { status, .. } => match status {
            401 => Status::unauthenticated(e.to_string()),
            403 => Status::permission_denied(e.to_string()),
            429 => Status::resource_exhausted(e.to_string()),
            400..=499 => Status::failed_precondition(e.to_string()),
            _ => Status::unavailable(e.to_string()),
        },
    }
}

/// A decision the caller has not received yet: aborted if the call is cancelled meanwhile
/// (dropped with the finished job), so nothing waits for the TTL.
struct Unsent {
    state: RouterState,
    picked: Option<Picked>,
    /// Tenant metrics and the tenant's limit permit (released if never sent).
    tap: Option<crate::tenant::TenantTap>,
}

impl Unsent {
    fn send(mut self) -> Option<(Picked, Option<crate::tenant::TenantTap>)> {
        let tap = self.tap.take();
        self.picked.take().map(|p| (p, tap))
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(p) = self.picked.take() {
            self.state.abort(p.assignment, "pick call cancelled");
        }
    }
}

/// Why a decision was not made: a plain status, or a refusal of the caller (counted by the
/// service).
enum NotDecided {
    Status(Status),
    Refused(PickRefused),
}

impl From<Status> for NotDecided {
    fn from(s: Status) -> Self {
        NotDecided::Status(s)
    }
}

/// Parses a Pick body, checks the caller against the model's pool and decides (on the
/// decision pool).
fn decide(
    state: &RouterState,
    caller: &Caller,
    req: PickRequest,
) -> Result<(Unsent, Option<Vec<u8>>), NotDecided> {
    let body: Value = serde_json::from_slice(&req.body)
        .map_err(|e| Status::invalid_argument(format!("body is not JSON: {e}")))?;
    let Some(model) = body.get("model").and_then(Value::as_str).map(str::to_owned) else {
        return Err(Status::invalid_argument("body has no string `model`").into());
    };
    let headers = headers_of(&req.headers);
    let kind = BodyKind::of(&req.path, &body);
    let empty = serde_json::Map::new();
    let mut input = PickInput::from_body(
        &model,
        kind,
        body.as_object().unwrap_or(&empty),
        Some(&headers),
        &[],
    );
    // Resolved here (not in `pick`) so the caller can be checked against the model's pool.
    let resolved = state.resolve_with_headers(&model, Some(&headers));
    let pool = resolved.as_ref().and_then(|r| r.pool.as_deref());
    authorize_pick(caller, &model, pool).map_err(NotDecided::Refused)?;
    // The client's credentials travel in the Pick request's headers; the pool's mTLS picker
    // may name the tenant in `x-kvroute-tenant`.
    let trusted = matches!(
        caller,
        Caller::Verified {
            identity: kvroute_tls::Identity::Picker { .. },
            ..
        }
    );
    let tokens = tenancy::estimated_tokens(req.body.len(), input.max_tokens);
    let tenants = state.tenants();
    let admitted = tenancy::admit(
        state, tenants, &model, &headers, None, trusted, tokens, None,
    )
    .map_err(|e| tenant_status(&e))?;
    // Counted even when no decision follows (dropped with the error).
    let mut tap = tenancy::tap(tenants, &model, admitted.tenant.clone(), admitted.permit);
    input.resolved = Some(&admitted.resolved);
    input.tenant = admitted.tenant.as_deref();
    let a = state
        .pick(&input, Instant::now())
        .map_err(|e| pick_status(&e))?;
    let rewritten_body = if a.backend_model != model {
        crate::gateway::openai::with_model(&req.body, &a.backend_model)
    } else {
        None
    };
    tap.routed(a.policy.class.as_deref());
    let rule_limits =
        crate::gateway::OverflowPlan::of_hooks(&a.policy, admitted.tenant.as_deref()).limits;
    let mut unsent = Unsent {
        state: state.clone(),
        picked: Some(a),
        tap: None,
    };
    // The matched rule's per-tenant limits, as the gateway and the endpoint picker take them
    // (a refusal drops `unsent`, which releases the assignment).
    tap.rule_permit = crate::gateway::overflow::rule_permit(
        tenants,
        admitted.tenant.as_deref(),
        rule_limits.as_ref(),
        tokens,
    )
    .map_err(|e| tenant_status(&e))?;
    unsent.tap = Some(tap);
    Ok((unsent, rewritten_body))
}

#[tonic::async_trait]
impl Picker for PickerService {
    async fn pick(&self, request: Request<PickRequest>) -> Result<Response<PickResponse>, Status> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        if req.body.len() > self.state.config().max_body_bytes {
            self.state.limit_hit(
                Limit::PickMessageSize,
                format_args!("Pick request refused: over --max-body-bytes"),
            );
            return Err(Status::resource_exhausted("body over --max-body-bytes"));
        }
        // Each unreported assignment holds state until it expires (--assignment-ttl-s).
        let max = self.state.config().limits.max_outstanding_picks;
        if self.state.in_flight() >= max {
            self.state.limit_hit(
                Limit::OutstandingPicks,
                format_args!("Pick refused: {max} assignments outstanding"),
            );
            return Err(Status::resource_exhausted(
                "too many outstanding assignments (--max-outstanding-picks): report them done or aborted",
            ));
        }
        let state = self.state.clone();
        let who = caller.clone();
        let decided = self
            .pool
            .run(PoolCaller::Picker, move || decide(&state, &who, req))
            .await;
        let (unsent, rewritten_body) = match decided {
            Ok(Ok(r)) => r,
            Ok(Err(NotDecided::Status(s))) => return Err(s),
            Ok(Err(NotDecided::Refused(r))) => return Err(self.refuse(r)),
            Err(PoolError::Full) => {
                return Err(Status::unavailable(
                    "the router is busy routing other requests; retry later",
                ));
            }
            Err(PoolError::Panicked) => return Err(Status::internal("internal error")),
        };
        let Some((a, tap)) = unsent.send() else {
            return Err(Status::internal("internal error"));
        };
        let Some(decision_id) = self.state.issue_decision_id(a.assignment, caller.owner()) else {
            // Released between the pick and now (expiry): nothing to report against.
            return Err(Status::unavailable(
                "the assignment ended before it could be returned",
            ));
        };
        if let Some(tap) = tap {
            self.state.attach_tenant(a.assignment, tap);
        }
        Ok(Response::new(PickResponse {
            decision_id: decision_id.to_string(),
            destination: Some(pick_response::Destination::WorkerAddress(a.address)),
            worker_id: a.worker,
            rewritten_body,
            predicted_ttft_seconds: if a.predicted_ttft_s.is_finite() {
                a.predicted_ttft_s
            } else {
                0.0
            },
            reason: a.reason.to_string(),
            degraded: a.degraded,
            ttft_p90_bound_seconds: if a.ttft_p90_bound_s.is_finite() {
                a.ttft_p90_bound_s
            } else {
                0.0
            },
        }))
    }

    async fn report_first_token(
        &self,
        request: Request<ReportFirstTokenRequest>,
    ) -> Result<Response<ReportResponse>, Status> {
        let id = self.assignment(&request, &request.get_ref().decision_id)?;
        let req = request.into_inner();
        let observed = Some(req.ttft_seconds).filter(|s| s.is_finite() && *s > 0.0);
        let known = self.state.first_token(id, observed, Instant::now());
        if known && let Some(s) = observed {
            self.state.tenant_report(id, |t| t.first_token(s));
        }
        Ok(Response::new(ReportResponse { known }))
    }

    async fn report_done(
        &self,
        request: Request<ReportDoneRequest>,
    ) -> Result<Response<ReportResponse>, Status> {
        let id = self.assignment(&request, &request.get_ref().decision_id)?;
        let req = request.into_inner();
        let usage = Usage {
            prompt_tokens: req.prompt_tokens,
            cached_prompt_tokens: req.cached_prompt_tokens,
            completion_tokens: req.completion_tokens,
            e2e_seconds: Some(req.e2e_seconds).filter(|s| s.is_finite() && *s > 0.0),
        };
        self.state.tenant_report(id, |t| {
            t.done(
                u64::from(usage.prompt_tokens),
                u64::from(usage.completion_tokens),
            );
        });
        let known = self.state.done(id, usage);
        Ok(Response::new(ReportResponse { known }))
    }

    async fn report_aborted(
        &self,
        request: Request<ReportAbortedRequest>,
    ) -> Result<Response<ReportResponse>, Status> {
        let id = self.assignment(&request, &request.get_ref().decision_id)?;
        let req = request.into_inner();
        let known = self.state.abort(id, &req.reason);
        Ok(Response::new(ReportResponse { known }))
    }
}

/// Releases assignments nobody reported within the TTL and retires gone workers.
pub struct UpkeepTask {
    state: RouterState,
}

impl UpkeepTask {
    /// A task keeping `state` tidy.
    pub fn new(state: RouterState) -> Self {
        Self { state }
    }

    /// How often it looks: a quarter of the TTL, between 10 ms and 5 s.
    pub fn period(ttl: Duration) -> Duration {
        (ttl / 4).clamp(Duration::from_millis(10), Duration::from_secs(5))
    }

    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let cfg = self.state.config();
        let mut tick =
            tokio::time::interval(Self::period(cfg.assignment_ttl.min(cfg.retire_after)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    let (expired, _retired) = self.state.maintain(Instant::now());
                    if expired > 0 {
                        tracing::warn!(expired, "released assignments nobody reported within the TTL");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_period_is_bounded() {
        assert_eq!(
            UpkeepTask::period(Duration::from_millis(1)),
            Duration::from_millis(10)
        );
        assert_eq!(
            UpkeepTask::period(Duration::from_secs(600)),
            Duration::from_secs(5)
        );
        assert_eq!(
            UpkeepTask::period(Duration::from_secs(2)),
            Duration::from_millis(500)
        );
    }
}
