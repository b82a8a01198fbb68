//! The HTTP handlers: read and check the body, pick a worker, forward, pass the answer back
//! chunk by chunk while measuring it. The only module here that touches axum and the socket.
//!
//! ```text
//! client --body (limit)--> decode --resolve/pick--> AssignmentGuard --POST--> worker
//!   ^                                   ^ retry elsewhere if it never started (connect / 503)
//!   +-- SSE events, as they arrive <-- SseParser <-- worker bytes (TTFT, ITL, usage measured)
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::admission::{Admission, peer_ip};
use super::anthropic::{self, StreamTranslator};
use super::dispatch::{AssignmentGuard, Dispatch, GatewayRequest, Resolved};
use super::error::{GatewayError, anthropic_from_upstream};
use super::openai::{self, Endpoint, StreamItem, Usage};
use super::overflow::Routed;
use super::sse::{SseEvent, SseParser};
use super::tenancy;
use super::upstream::{SendError, Upstream};
use crate::blocking_pool::{BlockingPool, Caller, PoolError};
use crate::listener::{Guarded, ListenerMetrics, Refusal, is_body_timeout};
use crate::provider::{ClientApi, Providers};
use crate::routing::FailureKind;
use crate::state::max_tokens_of;

/// Response header naming the chosen worker.
pub const WORKER_HEADER: &str = "x-kvroute-worker";
/// Response header with the predicted TTFT of the chosen worker, in milliseconds.
pub const PREDICTED_TTFT_HEADER: &str = "x-kvroute-predicted-ttft-ms";
/// Response header with the calibrated p90 upper bound on that TTFT, in milliseconds
/// (absent until the router has seen enough first tokens to calibrate it).
pub const TTFT_BOUND_HEADER: &str = "x-kvroute-ttft-p90-bound-ms";

/// Shared by every handler.
#[derive(Clone)]
pub(crate) struct Gateway {
    pub dispatch: Arc<dyn Dispatch>,
    pub upstream: Upstream,
    pub max_body_bytes: usize,
    pub max_retries: u32,
    pub expose_routing_headers: bool,
    pub admission: Admission,
    pub body_timeout: Duration,
    pub pool: BlockingPool,
    pub metrics: ListenerMetrics,
    pub tenants: Arc<crate::tenant::Tenants>,
    pub providers: Option<Providers>,
    /// OpenTelemetry decision spans (`--otlp-endpoint`); `None`: off.
    pub traces: Option<Arc<crate::traces::Traces>>,
}

/// Which error shape the client understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    OpenAi,
    Anthropic,
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut resp = (status, Bytes::from(body.to_string())).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(flavor: Flavor, e: &GatewayError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    tracing::debug!(
        error = e.label(),
        status = e.status(),
        "gateway request failed"
    );
    let body = match flavor {
        Flavor::OpenAi => e.openai_body(),
        Flavor::Anthropic => e.anthropic_body(),
    };
    let mut resp = json_response(status, &body);
    if let Some(s) = e.retry_after() {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    if let Some(c) = e.www_authenticate() {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(c));
    }
    resp
}

/// Admission control in front of the generation handlers: a request that gets no ticket is
/// answered at once, before its body is read; an admitted one holds its ticket until its
/// response body ends.
pub(crate) async fn admit(State(gw): State<Gateway>, req: Request, next: Next) -> Response {
    let flavor = if req.uri().path() == "/v1/messages" {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    };
    match gw.admission.admit(peer_ip(req.extensions())) {
        Err(e) => error_response(flavor, &e),
        Ok(ticket) => {
            let (parts, body) = next.run(req).await.into_parts();
            Response::from_parts(
                parts,
                Body::new(Guarded {
                    inner: body,
                    _guard: ticket,
                }),
            )
        }
    }
}

impl Gateway {
    fn decision_headers(&self, resp: &mut Response, a: &AssignmentGuard) {
        DecisionHeaders::of(a, self.expose_routing_headers).apply(resp);
    }

    /// Reads the request body, refusing more than `max_body_bytes` without buffering them
    /// (a declared length over the limit is refused before a byte is read).
    async fn read_body(&self, headers: &HeaderMap, body: Body) -> Result<Bytes, GatewayError> {
        let limit = self.max_body_bytes;
        let too_large = || {
            self.metrics.refuse("gateway", Refusal::BodyTooLarge);
            GatewayError::BodyTooLarge { limit }
        };
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        let mut stream = body.into_data_stream();
        let mut buf = BytesMut::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                if is_body_timeout(&e) {
                    GatewayError::BodyTimeout {
                        limit_s: self.body_timeout.as_secs(),
                    }
                } else {
                    GatewayError::MalformedJson("the request body could not be read".into())
                }
            })?;
            if buf.len() + chunk.len() > limit {
                return Err(too_large());
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.freeze())
    }
}

/// A forwarded request whose worker answered with headers.
pub(super) struct Sent {
    pub(super) assignment: AssignmentGuard,
    response: reqwest::Response,
    sent_at: Instant,
}

/// The routing-relevant part of a request, owned so the decision can run off the async
/// threads (tokenizing a long prompt takes milliseconds) and be repeated for retries.
pub(super) struct Route {
    pub(super) resolved: Resolved,
    pub(super) client_model: String,
    pub(super) endpoint: Endpoint,
    pub(super) body: Map<String, Value>,
    pub(super) headers: HeaderMap,
    pub(super) tenant: Option<String>,
    /// When the gateway began handling the request (before reading its body): the published
    /// p90 TTFT bound is calibrated on first tokens timed from here, as the client times them.
    pub(super) received_at: Instant,
}

impl Route {
    pub(super) fn request(&self) -> GatewayRequest<'_> {
        GatewayRequest {
            resolved: &self.resolved,
            client_model: &self.client_model,
            endpoint: self.endpoint,
            body: &self.body,
            headers: &self.headers,
            tenant: self.tenant.as_deref(),
        }
    }
}

impl Gateway {
    /// Runs the routing decision on the blocking pool. The assignment guard is made there too:
    /// if the client goes away meanwhile, the finished decision is dropped and so released.
    pub(super) async fn pick(
        &self,
        route: &Arc<Route>,
        exclude: &[String],
    ) -> Result<AssignmentGuard, GatewayError> {
        let (dispatch, r, exclude) = (self.dispatch.clone(), route.clone(), exclude.to_vec());
        let decided = self
            .pool
            .run(Caller::Gateway, move || {
                dispatch
                    .pick(&r.request(), &exclude)
                    .map(|p| AssignmentGuard::new(dispatch.clone(), p).received_at(r.received_at))
            })
            .await;
        let result = match decided {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(e)) => Err(GatewayError::from_pick(&e, &route.client_model)),
            Err(PoolError::Full) => {
                self.metrics.refuse("gateway", Refusal::DecisionPoolFull);
                Err(GatewayError::DecisionPoolFull)
            }
            Err(PoolError::Panicked) => Err(GatewayError::Internal),
        };
        if let (Err(e), Some(t)) = (&result, &self.traces) {
            t.failed(&route.headers, &route.client_model, e.label());
        }
        result
    }

    /// Picks a worker (the first attempt uses `first` when given) and sends; retries on
    /// another worker while the request never started.
    pub(super) async fn forward(
        &self,
        route: Arc<Route>,
        body: Bytes,
        mut first: Option<AssignmentGuard>,
    ) -> Result<Sent, GatewayError> {
        let mut exclude: Vec<String> = Vec::new();
        let mut last_failure: Option<GatewayError> = None;
        for attempt in 0..=self.max_retries {
            let picked = match first.take() {
                Some(a) => Ok(a),
                None => self.pick(&route, &exclude).await,
            };
            let assignment = match picked {
                Ok(a) => a,
                Err(GatewayError::NoReadyWorker(m)) => {
                    return Err(last_failure.unwrap_or(GatewayError::NoReadyWorker(m)));
                }
                Err(e) => return Err(e),
            };
            let trace_headers = self.trace_headers(&route, &assignment, attempt);
            let url = format!(
                "http://{}{}",
                assignment.picked().address,
                route.endpoint.path()
            );
            // A policy rule may have switched the request to another model of the pool.
            let picked_model = &assignment.picked().backend_model;
            let body = if *picked_model == route.resolved.backend_model {
                body.clone()
            } else {
                // The gateway wrote this body itself: it is always an object.
                openai::with_model(&body, picked_model).map_or_else(|| body.clone(), Bytes::from)
            };
            let sent_at = Instant::now();
            match self.upstream.post_json(&url, body, trace_headers).await {
                Ok(response) if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                    tracing::debug!(worker = %assignment.picked().worker, "worker answered 503; trying another");
                    exclude.push(assignment.picked().worker.clone());
                    assignment.failed(FailureKind::Http5xx);
                    last_failure = Some(GatewayError::NoReadyWorker(route.client_model.clone()));
                }
                Ok(response) => {
                    return Ok(Sent {
                        assignment,
                        response,
                        sent_at,
                    });
                }
                Err(SendError::Connect) => {
                    tracing::debug!(worker = %assignment.picked().worker, "cannot connect to worker; trying another");
                    exclude.push(assignment.picked().worker.clone());
                    assignment.failed(FailureKind::Connect);
                    last_failure = Some(GatewayError::Upstream(
                        "could not connect to the worker".into(),
                    ));
                }
                Err(SendError::Reset) => {
                    // Nothing of an answer reached us: another worker may serve it.
                    tracing::debug!(worker = %assignment.picked().worker, "worker closed the connection before answering; trying another");
                    exclude.push(assignment.picked().worker.clone());
                    assignment.failed(FailureKind::Connect);
                    last_failure = Some(GatewayError::Upstream(
                        "the worker closed the connection before answering".into(),
                    ));
                }
                Err(SendError::Timeout) => {
                    assignment.failed(FailureKind::Timeout);
                    return Err(GatewayError::UpstreamTimeout);
                }
                Err(SendError::Other) => {
                    // The request may have reached the worker, which then broke it off.
                    assignment.failed(FailureKind::StreamCut);
                    return Err(GatewayError::Upstream(
                        "the request to the worker failed".into(),
                    ));
                }
            }
        }
        Err(last_failure
            .unwrap_or_else(|| GatewayError::Upstream("no worker accepted the request".into())))
    }

    /// The trace-context headers for the request to the worker: the decision's span as the
    /// parent when traces are on, else the client's own context passed through.
    fn trace_headers(
        &self,
        route: &Route,
        assignment: &AssignmentGuard,
        attempt: u32,
    ) -> HeaderMap {
        let Some(traces) = &self.traces else {
            return crate::traces::pass_through(&route.headers);
        };
        let p = assignment.picked();
        traces.decision(
            &route.headers,
            &crate::traces::Decision {
                model: &route.client_model,
                backend_model: &p.backend_model,
                worker: &p.worker,
                address: &p.address,
                predicted_ttft_s: p.predicted_ttft_s,
                reason: p.reason,
                degraded: p.degraded,
                attempt,
            },
        )
    }

    /// The worker answered with an error status: pass 4xx through in the client's shape, turn
    /// 5xx into 502.
    async fn upstream_error(&self, flavor: Flavor, sent: Sent) -> Response {
        let Sent {
            assignment,
            response,
            ..
        } = sent;
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap_or_default();
        let mut resp = if (400..500).contains(&status) {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            match flavor {
                Flavor::OpenAi => {
                    let mut r = (code, body).into_response();
                    r.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    r
                }
                Flavor::Anthropic => json_response(code, &anthropic_from_upstream(status, &body)),
            }
        } else {
            let e = GatewayError::Upstream(format!("the worker answered with status {status}"));
            error_response(flavor, &e)
        };
        self.decision_headers(&mut resp, &assignment);
        if status >= 500 {
            assignment.failed(FailureKind::Http5xx);
        } else {
            assignment.abort();
        }
        resp
    }
}

/// `POST /v1/chat/completions`
pub(crate) async fn chat_completions(State(gw): State<Gateway>, req: Request) -> Response {
    openai_request(gw, Endpoint::ChatCompletions, req)
        .await
        .unwrap_or_else(|e| error_response(Flavor::OpenAi, &e))
}

/// `POST /v1/completions`
pub(crate) async fn completions(State(gw): State<Gateway>, req: Request) -> Response {
    openai_request(gw, Endpoint::Completions, req)
        .await
        .unwrap_or_else(|e| error_response(Flavor::OpenAi, &e))
}

/// `POST /v1/messages`
pub(crate) async fn messages(State(gw): State<Gateway>, req: Request) -> Response {
    anthropic_request(gw, req)
        .await
        .unwrap_or_else(|e| error_response(Flavor::Anthropic, &e))
}

/// `GET /v1/models`: the models the caller's credentials reach (all of them when no pool
/// needs auth).
pub(crate) async fn models(State(gw): State<Gateway>, req: Request) -> Response {
    let peer = peer_ip(req.extensions());
    let mut names =
        match tenancy::visible_models(gw.dispatch.as_ref(), &gw.tenants, req.headers(), peer) {
            Ok(names) => names,
            Err(e) => return error_response(Flavor::OpenAi, &e),
        };
    names.sort();
    names.dedup();
    let data: Vec<Value> = names
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "kvroute"}))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

async fn openai_request(
    gw: Gateway,
    endpoint: Endpoint,
    req: Request,
) -> Result<Response, GatewayError> {
    let received_at = Instant::now();
    let peer = peer_ip(req.extensions());
    let (parts, body) = req.into_parts();
    let bytes = gw.read_body(&parts.headers, body).await?;
    let request = openai::decode_request(endpoint, &bytes)?;
    let tokens = tenancy::estimated_tokens(bytes.len(), max_tokens_of(&request.body));
    let admitted = tenancy::admit(
        gw.dispatch.as_ref(),
        &gw.tenants,
        &request.model,
        &parts.headers,
        peer,
        false,
        tokens,
        None,
    )?;
    let body = openai::upstream_body(
        &request.body,
        &admitted.resolved.backend_model,
        request.stream,
    );
    let (stream, wants_usage) = (request.stream, request.wants_usage);
    let tap = tenancy::tap(
        &gw.tenants,
        &request.model,
        admitted.tenant.clone(),
        admitted.permit,
    );
    let route = Arc::new(Route {
        resolved: admitted.resolved,
        client_model: request.model,
        endpoint,
        body: request.body,
        headers: parts.headers,
        tenant: admitted.tenant,
        received_at,
    });
    let sent = match gw
        .forward_or_overflow(route, body, ClientApi::of(endpoint), bytes, tap)
        .await?
    {
        Routed::Local(sent) => *sent,
        Routed::Provider(resp) => return Ok(resp),
    };
    if !sent.response.status().is_success() {
        return Ok(gw.upstream_error(Flavor::OpenAi, sent).await);
    }
    let Sent {
        assignment,
        response,
        sent_at,
    } = sent;
    if stream {
        let headers = DecisionHeaders::of(&assignment, gw.expose_routing_headers);
        return Ok(sse_response(relay(
            response,
            headers,
            OpenAiSink { wants_usage },
            assignment,
            sent_at,
        )));
    }
    let (body, usage) = match read_unary(response).await {
        Ok(read) => read,
        Err(e) => {
            assignment.failed(failure_of(&e));
            return Err(e);
        }
    };
    let mut resp = json_bytes_response(body);
    gw.decision_headers(&mut resp, &assignment);
    assignment.done(usage, sent_at.elapsed());
    Ok(resp)
}

async fn anthropic_request(gw: Gateway, req: Request) -> Result<Response, GatewayError> {
    let received_at = Instant::now();
    let peer = peer_ip(req.extensions());
    let (parts, body) = req.into_parts();
    let bytes = gw.read_body(&parts.headers, body).await?;
    let request = anthropic::decode_request(&bytes)?;
    let tokens = tenancy::estimated_tokens(bytes.len(), max_tokens_of(&request.chat));
    let admitted = tenancy::admit(
        gw.dispatch.as_ref(),
        &gw.tenants,
        &request.model,
        &parts.headers,
        peer,
        false,
        tokens,
        None,
    )?;
    let body = openai::upstream_body(
        &request.chat,
        &admitted.resolved.backend_model,
        request.stream,
    );
    let (stream, model) = (request.stream, request.model.clone());
    let tap = tenancy::tap(
        &gw.tenants,
        &request.model,
        admitted.tenant.clone(),
        admitted.permit,
    );
    let route = Arc::new(Route {
        resolved: admitted.resolved,
        client_model: request.model,
        endpoint: Endpoint::ChatCompletions,
        body: request.chat,
        headers: parts.headers,
        tenant: admitted.tenant,
        received_at,
    });
    let sent = match gw
        .forward_or_overflow(route, body, ClientApi::Messages, bytes, tap)
        .await?
    {
        Routed::Local(sent) => *sent,
        Routed::Provider(resp) => return Ok(resp),
    };
    if !sent.response.status().is_success() {
        return Ok(gw.upstream_error(Flavor::Anthropic, sent).await);
    }
    let Sent {
        assignment,
        response,
        sent_at,
    } = sent;
    if stream {
        let sink = AnthropicSink {
            translator: StreamTranslator::new(model.clone()),
        };
        let headers = DecisionHeaders::of(&assignment, gw.expose_routing_headers);
        return Ok(sse_response(relay(
            response, headers, sink, assignment, sent_at,
        )));
    }
    let (body, usage) = match read_unary(response).await {
        Ok(read) => read,
        Err(e) => {
            assignment.failed(failure_of(&e));
            return Err(e);
        }
    };
    let chat: Value = serde_json::from_slice(&body)
        .map_err(|_| GatewayError::Upstream("the worker's answer is not valid JSON".into()))?;
    let mut resp = json_response(StatusCode::OK, &anthropic::message_from_chat(&chat, &model));
    gw.decision_headers(&mut resp, &assignment);
    assignment.done(usage, sent_at.elapsed());
    Ok(resp)
}

/// `x-kvroute-worker`, `x-kvroute-predicted-ttft-ms` and `x-kvroute-ttft-p90-bound-ms` of a
/// decision (none unless exposed).
struct DecisionHeaders {
    worker: Option<HeaderValue>,
    predicted: Option<HeaderValue>,
    bound: Option<HeaderValue>,
}

impl DecisionHeaders {
    fn of(a: &AssignmentGuard, expose: bool) -> Self {
        if !expose {
            return Self {
                worker: None,
                predicted: None,
                bound: None,
            };
        }
        let p = a.picked();
        let ms = |s: f64| {
            s.is_finite()
                .then(|| HeaderValue::from_str(&format!("{:.3}", s * 1000.0)).ok())
                .flatten()
        };
        Self {
            worker: HeaderValue::from_str(&p.worker).ok(),
            predicted: ms(p.predicted_ttft_s),
            bound: ms(p.ttft_p90_bound_s),
        }
    }

    fn apply(self, resp: &mut Response) {
        if let Some(v) = self.worker {
            resp.headers_mut().insert(WORKER_HEADER, v);
        }
        if let Some(v) = self.predicted {
            resp.headers_mut().insert(PREDICTED_TTFT_HEADER, v);
        }
        if let Some(v) = self.bound {
            resp.headers_mut().insert(TTFT_BOUND_HEADER, v);
        }
    }
}

fn json_bytes_response(body: Bytes) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

async fn read_unary(response: reqwest::Response) -> Result<(Bytes, Option<Usage>), GatewayError> {
    let body = response.bytes().await.map_err(|e| {
        if e.is_timeout() {
            GatewayError::UpstreamTimeout
        } else {
            GatewayError::Upstream("the worker's answer broke off".into())
        }
    })?;
    let usage = serde_json::from_slice::<Value>(&body)
        .ok()
        .as_ref()
        .and_then(openai::usage_of);
    Ok((body, usage))
}

/// The passive-health kind of a failed read of the worker's answer.
fn failure_of(e: &GatewayError) -> FailureKind {
    match e {
        GatewayError::UpstreamTimeout => FailureKind::Timeout,
        _ => FailureKind::StreamCut,
    }
}

/// A relayed stream body plus the headers that go with it.
struct Relayed<S> {
    stream: S,
    headers: DecisionHeaders,
}

fn sse_response<S>(relayed: Relayed<S>) -> Response
where
    S: futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    let mut resp = Response::new(Body::from_stream(relayed.stream));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    relayed.headers.apply(&mut resp);
    resp
}

/// Turns the worker's events into the client's bytes.
trait Sink: Send + 'static {
    /// The sink rewrites chunks and needs each as JSON (the others get `None`, and the relay
    /// classifies without building it).
    const NEEDS_JSON: bool;
    /// One worker event (already classified; `json`: the chunk, when `NEEDS_JSON`); appends
    /// what the client gets to `out`.
    fn event(
        &mut self,
        event: &SseEvent,
        item: &StreamItem,
        json: Option<&Value>,
        out: &mut BytesMut,
    );
    /// The worker's stream ended normally.
    fn end(&mut self, out: &mut BytesMut);
    /// The worker's stream broke.
    fn error(&mut self, message: &str, out: &mut BytesMut);
}

struct OpenAiSink {
    wants_usage: bool,
}

impl Sink for OpenAiSink {
    const NEEDS_JSON: bool = false;

    fn event(
        &mut self,
        event: &SseEvent,
        item: &StreamItem,
        _json: Option<&Value>,
        out: &mut BytesMut,
    ) {
        if let StreamItem::Chunk {
            usage_only: true, ..
        } = item
            && !self.wants_usage
        {
            return;
        }
        out.extend_from_slice(&event.encode());
    }

    fn end(&mut self, _out: &mut BytesMut) {}

    fn error(&mut self, message: &str, out: &mut BytesMut) {
        let e = json!({"error": {"message": message, "type": "server_error", "param": null, "code": "upstream_error"}});
        out.extend_from_slice(&SseEvent::data(e.to_string()).encode());
    }
}

struct AnthropicSink {
    translator: StreamTranslator,
}

impl Sink for AnthropicSink {
    const NEEDS_JSON: bool = true;

    fn event(
        &mut self,
        _event: &SseEvent,
        item: &StreamItem,
        json: Option<&Value>,
        out: &mut BytesMut,
    ) {
        let events = match (item, json) {
            (StreamItem::Chunk { .. }, Some(json)) => self.translator.on_chunk(json),
            (StreamItem::Done, _) => self.translator.finish(),
            _ => Vec::new(),
        };
        for e in events {
            out.extend_from_slice(&e.encode());
        }
    }

    fn end(&mut self, out: &mut BytesMut) {
        for e in self.translator.finish() {
            out.extend_from_slice(&e.encode());
        }
    }

    fn error(&mut self, message: &str, out: &mut BytesMut) {
        out.extend_from_slice(&StreamTranslator::error_event(message).encode());
    }
}

/// Measures a stream: first token, gaps, usage.
struct Meter {
    sent_at: Instant,
    last_token: Option<Instant>,
    usage: Option<Usage>,
}

impl Meter {
    fn token(&mut self, now: Instant, assignment: &mut AssignmentGuard) {
        match self.last_token {
            None => assignment.first_token(now.saturating_duration_since(self.sent_at)),
            Some(prev) => assignment.inter_token(now.saturating_duration_since(prev)),
        }
        self.last_token = Some(now);
    }
}

/// Relays the worker's SSE stream to the client event by event. The assignment lives inside
/// the stream: when the client goes away, the body (and with it this stream, the assignment
/// and the worker's response) is dropped, which aborts the assignment and closes the upstream
/// connection.
fn relay<K: Sink>(
    response: reqwest::Response,
    headers: DecisionHeaders,
    mut sink: K,
    assignment: AssignmentGuard,
    sent_at: Instant,
) -> Relayed<impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static> {
    let stream = async_stream::stream! {
        let mut upstream = response.bytes_stream();
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        let mut meter = Meter { sent_at, last_token: None, usage: None };
        let mut assignment = Some(assignment);
        loop {
            let mut out = BytesMut::new();
            let mut ended = false;
            let mut broke: Option<(&'static str, FailureKind)> = None;
            match upstream.next().await {
                Some(Ok(chunk)) => {
                    if parser.push(&chunk, &mut events).is_err() {
                        broke = Some(("the worker sent an oversized event", FailureKind::StreamCut));
                    }
                }
                Some(Err(e)) => {
                    broke = Some(if e.is_timeout() {
                        ("the worker timed out", FailureKind::Timeout)
                    } else {
                        ("the worker's stream broke off", FailureKind::StreamCut)
                    });
                }
                None => {
                    if let Ok(Some(last)) = parser.finish() {
                        events.push(last);
                    }
                    ended = true;
                }
            }
            let now = Instant::now();
            for event in events.drain(..) {
                let (item, json) = if K::NEEDS_JSON {
                    openai::inspect_chunk_json(&event.data)
                } else {
                    (openai::inspect_chunk(&event.data), None)
                };
                match &item {
                    StreamItem::Chunk { content, usage, .. } => {
                        if *content && let Some(a) = assignment.as_mut() {
                            meter.token(now, a);
                        }
                        if usage.is_some() {
                            meter.usage = *usage;
                        }
                    }
                    StreamItem::Done => {
                        if let Some(a) = assignment.take() {
                            a.done(meter.usage, now.saturating_duration_since(meter.sent_at));
                        }
                    }
                    StreamItem::Other => {}
                }
                sink.event(&event, &item, json.as_ref(), &mut out);
            }
            if let Some((message, kind)) = broke {
                tracing::debug!(message, "upstream stream failed");
                sink.error(message, &mut out);
                if let Some(a) = assignment.take() {
                    a.failed(kind);
                }
                ended = true;
            } else if ended {
                sink.end(&mut out);
                if let Some(a) = assignment.take() {
                    a.done(meter.usage, now.saturating_duration_since(meter.sent_at));
                }
            }
            if !out.is_empty() {
                yield Ok(out.freeze());
            }
            if ended {
                break;
            }
        }
    };
    Relayed { stream, headers }
}
