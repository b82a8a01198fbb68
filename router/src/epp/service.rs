//! The `envoy.service.ext_proc.v3.ExternalProcessor` service: one bidirectional stream per
//! HTTP request, driven by a [`Session`] that owns everything the request holds (its body
//! buffer, its assignment), so that whatever ends the stream releases the assignment.
//!
//! ```text
//! data plane                               Session (one task per stream)
//!  request_headers --------------------->  head, subset hint (no answer yet in full duplex)
//!  request_body* (eos) ------------------>  buffer (<= --max-body-bytes, else 413)
//!                                          --decide (decision pool)--> AssignmentGuard
//!  <-- headers answer: destination header + dynamic_metadata["envoy.lb"], body answer
//!  <-- or ImmediateResponse 4xx/5xx (the gateway's error body)
//!  response_headers (served endpoint) --->  primary | fallback (assignment moved) | unknown
//!  response_body* ----------------------->  first token, gaps, usage (SSE); echoed back
//!  response eos / trailers -------------->  done (2xx) or abort           -> released once
//!  stream closed early (client gone) ---->  Session dropped: guard aborts -> released once
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Phase;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::decide::{self, Decided, EppRequest, Held, Refusal};
use super::metrics::EppMetrics;
use super::protocol::{self, BodyMode, Head, Subset, same_endpoint};
use crate::auth::{Caller, PickRefused};
use crate::blocking_pool::{BlockingPool, Caller as PoolCaller, PoolError};
use crate::gateway::openai::{self, StreamItem, Usage};
use crate::gateway::sse::{SseEvent, SseParser};
use crate::gateway::{AssignmentGuard, Dispatch, GatewayError};
use crate::limits::Limit;
use crate::state::RouterState;

/// Largest non-streamed response body read for its `usage` (larger ones are passed on
/// without it).
const MAX_USAGE_BODY: usize = 1 << 20;

/// What every stream shares.
pub(super) struct Ctx {
    pub state: RouterState,
    pub dispatch: Arc<dyn Dispatch>,
    pub pool: BlockingPool,
    pub metrics: EppMetrics,
    pub tls: bool,
    pub max_fallbacks: usize,
    pub streams: Arc<Semaphore>,
}

/// The tonic ExternalProcessor service.
#[derive(Clone)]
pub struct EppService {
    ctx: Arc<Ctx>,
}

impl EppService {
    pub(super) fn new(ctx: Ctx) -> Self {
        Self { ctx: Arc::new(ctx) }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for EppService {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let ctx = self.ctx.clone();
        let caller = match Caller::of(&request, ctx.tls) {
            Ok(c) => c,
            Err(u) => return Err(refuse(&ctx, PickRefused::from(u))),
        };
        if let Caller::Verified { identity, .. } = &caller
            && !matches!(identity, kvroute_tls::Identity::Picker { .. })
        {
            return Err(refuse(&ctx, PickRefused::NotAPicker(identity.uri())));
        }
        let Ok(permit) = ctx.streams.clone().try_acquire_owned() else {
            ctx.state.limit_hit(
                Limit::OutstandingPicks,
                format_args!("endpoint picker stream refused: --epp-max-streams open"),
            );
            return Err(Status::resource_exhausted(
                "too many endpoint picker streams open (--epp-max-streams)",
            ));
        };
        let inbound = request.into_inner();
        // A few answers in flight at most: the data plane reads them as it goes.
        let (tx, rx) = mpsc::channel(8);
        let session = Session::new(ctx, caller, permit);
        tokio::spawn(session.run(inbound, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn refuse(ctx: &Ctx, refused: PickRefused) -> Status {
    ctx.state
        .metrics()
        .auth
        .pick_refused
        .with_label_values(&[refused.label()])
        .inc();
    ctx.metrics.error("refused_caller");
    tracing::debug!(reason = refused.label(), %refused, "refusing an endpoint picker caller");
    refused.status()
}

/// What a message asks of the stream.
enum Step {
    /// Send these answers and read on.
    Reply(Vec<ProcessingResponse>),
    /// Send this answer and end the stream.
    Last(Box<ProcessingResponse>),
    /// End the stream with a gRPC error.
    Fail(Status),
}

/// The response as it goes by: status, which endpoint served, tokens and usage.
struct Meter {
    status: u16,
    sse: Option<SseParser>,
    /// A non-streamed body, for its usage (up to [`MAX_USAGE_BODY`]).
    unary: Option<BytesMut>,
    anthropic: bool,
    last_token: Option<Instant>,
    usage: Option<Usage>,
}

/// One request's stream.
struct Session {
    ctx: Arc<Ctx>,
    caller: Caller,
    /// (request, response) body modes, from the first message.
    modes: Option<(BodyMode, BodyMode)>,
    request: Option<Head>,
    subset: Subset,
    body: BytesMut,
    routed: Option<Routed>,
    meter: Option<Meter>,
    _stream: StreamCount,
}

/// A decision on its way: the assignment until the response ends.
struct Routed {
    guard: Option<AssignmentGuard>,
    endpoints: Vec<String>,
    held: Option<Held>,
    sent_at: Instant,
    anthropic: bool,
}

/// Counts the stream in `kvroute_router_epp_streams` and holds its `--epp-max-streams` slot.
struct StreamCount {
    gauge: prometheus::IntGauge,
    _permit: OwnedSemaphorePermit,
}

impl Drop for StreamCount {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Session {
    fn new(ctx: Arc<Ctx>, caller: Caller, permit: OwnedSemaphorePermit) -> Self {
        ctx.metrics.streams.inc();
        let gauge = ctx.metrics.streams.clone();
        Self {
            ctx,
            caller,
            modes: None,
            request: None,
            subset: Subset::Any,
            body: BytesMut::new(),
            routed: None,
            meter: None,
            _stream: StreamCount {
                gauge,
                _permit: permit,
            },
        }
    }

    /// Reads the stream to its end. Returning drops the session: an assignment not reported
    /// done is aborted there.
    async fn run(
        mut self,
        mut inbound: Streaming<ProcessingRequest>,
        out: mpsc::Sender<Result<ProcessingResponse, Status>>,
    ) {
        loop {
            let msg = match inbound.message().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(status) => {
                    self.ctx.metrics.error("stream_error");
                    tracing::debug!(%status, "ext_proc stream broke");
                    break;
                }
            };
            match self.handle(msg).await {
                Step::Reply(replies) => {
                    for r in replies {
                        if out.send(Ok(r)).await.is_err() {
                            return;
                        }
                    }
                }
                Step::Last(r) => {
                    let _ = out.send(Ok(*r)).await;
                    return;
                }
                Step::Fail(status) => {
                    let _ = out.send(Err(status)).await;
                    return;
                }
            }
        }
        if let Some(r) = &self.routed
            && r.guard.is_some()
        {
            tracing::debug!("ext_proc stream ended before the response did; aborting");
        }
    }

    fn unexpected(&self, what: &str) -> Step {
        self.ctx.metrics.error("unexpected_message");
        Step::Fail(Status::failed_precondition(format!(
            "unexpected ext_proc message: {what}"
        )))
    }

    async fn handle(&mut self, msg: ProcessingRequest) -> Step {
        if self.modes.is_none() {
            self.modes = Some(BodyMode::of_config(msg.protocol_config.as_ref()));
        }
        let (request_mode, response_mode) = self
            .modes
            .unwrap_or((BodyMode::FullDuplex, BodyMode::FullDuplex));
        let metadata = msg.metadata_context;
        match msg.request {
            None => Step::Reply(Vec::new()),
            Some(Phase::RequestHeaders(h)) => {
                if self.request.is_some() {
                    return self.unexpected("request headers twice");
                }
                self.subset = protocol::subset(metadata.as_ref());
                let HttpHeaders {
                    headers,
                    end_of_stream,
                    ..
                } = h;
                self.request = Some(protocol::head(headers.as_ref()));
                if end_of_stream || request_mode == BodyMode::None {
                    // No body will come: decide on what there is (an error: no JSON body).
                    return self.decide(request_mode).await;
                }
                match request_mode {
                    BodyMode::FullDuplex => Step::Reply(Vec::new()),
                    _ => Step::Reply(vec![protocol::continue_reply(
                        protocol::Phase::RequestHeaders,
                    )]),
                }
            }
            Some(Phase::RequestBody(HttpBody {
                body,
                end_of_stream,
                ..
            })) => {
                if self.request.is_none() || self.routed.is_some() {
                    return self.unexpected("request body outside a request");
                }
                let limit = self.ctx.state.config().max_body_bytes;
                if self.body.len() + body.len() > limit {
                    self.ctx.metrics.error("body_too_large");
                    return self.refuse(GatewayError::BodyTooLarge { limit });
                }
                self.body.extend_from_slice(&body);
                if end_of_stream {
                    return self.decide(request_mode).await;
                }
                match request_mode {
                    BodyMode::FullDuplex => Step::Reply(Vec::new()),
                    _ => Step::Reply(vec![protocol::continue_reply(protocol::Phase::RequestBody)]),
                }
            }
            Some(Phase::RequestTrailers(_)) => {
                if self.request.is_none() {
                    return self.unexpected("request trailers before headers");
                }
                if self.routed.is_none() {
                    // The body ended with trailers.
                    let step = self.decide(request_mode).await;
                    return match step {
                        Step::Reply(mut r) => {
                            r.push(protocol::continue_reply(protocol::Phase::RequestTrailers));
                            Step::Reply(r)
                        }
                        other => other,
                    };
                }
                Step::Reply(vec![protocol::continue_reply(
                    protocol::Phase::RequestTrailers,
                )])
            }
            Some(Phase::ResponseHeaders(h)) => {
                let head = protocol::head(h.headers.as_ref());
                if self.routed.is_none() {
                    self.ctx.metrics.error("unexpected_message");
                    return Step::Reply(vec![protocol::continue_reply(
                        protocol::Phase::ResponseHeaders,
                    )]);
                }
                self.account_served(metadata.as_ref(), &head).await;
                let sse = head
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("text/event-stream"));
                let anthropic = self.routed.as_ref().is_some_and(|r| r.anthropic);
                self.meter = Some(Meter {
                    status: head.status,
                    sse: sse.then(SseParser::default),
                    unary: (!sse).then(BytesMut::new),
                    anthropic,
                    last_token: None,
                    usage: None,
                });
                if h.end_of_stream {
                    self.finish();
                }
                Step::Reply(vec![protocol::continue_reply(
                    protocol::Phase::ResponseHeaders,
                )])
            }
            Some(Phase::ResponseBody(HttpBody {
                body,
                end_of_stream,
                ..
            })) => {
                self.meter_body(&body, Instant::now());
                if end_of_stream {
                    self.finish();
                }
                let reply = match response_mode {
                    BodyMode::FullDuplex => protocol::response_body_reply(body, end_of_stream),
                    _ => protocol::continue_reply(protocol::Phase::ResponseBody),
                };
                Step::Reply(vec![reply])
            }
            Some(Phase::ResponseTrailers(_)) => {
                self.finish();
                Step::Reply(vec![protocol::continue_reply(
                    protocol::Phase::ResponseTrailers,
                )])
            }
        }
    }

    /// Ends the stream with the gateway's answer to `e`.
    fn refuse(&self, e: GatewayError) -> Step {
        self.ctx
            .metrics
            .decisions
            .with_label_values(&[e.label()])
            .inc();
        let anthropic = self
            .request
            .as_ref()
            .is_some_and(|h| h.path.split('?').next() == Some("/v1/messages"));
        Step::Last(Box::new(protocol::immediate(&e, anthropic)))
    }

    /// The request is complete: pick, and answer with the destination (or a refusal).
    async fn decide(&mut self, mode: BodyMode) -> Step {
        let Some(head) = self.request.as_ref() else {
            return self.unexpected("no request headers");
        };
        // Each unreported assignment holds state until it ends: the Pick API's cap.
        let max = self.ctx.state.config().limits.max_outstanding_picks;
        if self.ctx.state.in_flight() >= max {
            self.ctx.state.limit_hit(
                Limit::OutstandingPicks,
                format_args!("endpoint picker request shed: {max} assignments outstanding"),
            );
            return self.refuse(GatewayError::Overloaded);
        }
        let req = EppRequest {
            path: head.path.clone(),
            headers: head.headers.clone(),
            body: std::mem::take(&mut self.body).freeze(),
            subset: self.subset.clone(),
            caller: self.caller.clone(),
            max_fallbacks: self.ctx.max_fallbacks,
        };
        let anthropic = req.path.split('?').next() == Some("/v1/messages");
        let ctx = self.ctx.clone();
        let decided = self
            .ctx
            .pool
            .run(PoolCaller::Epp, move || {
                decide::decide(&ctx.state, &ctx.dispatch, req)
            })
            .await;
        let d = match decided {
            Ok(Ok(d)) => d,
            Ok(Err(Refusal::Client(e))) => return self.refuse(e),
            Ok(Err(Refusal::Caller(r))) => return Step::Fail(refuse(&self.ctx, r)),
            // Counted by the pool (`kvroute_router_decision_pool_shed_total{caller="epp"}`).
            Err(PoolError::Full) => return self.refuse(GatewayError::DecisionPoolFull),
            Err(PoolError::Panicked) => return self.refuse(GatewayError::Internal),
        };
        let Decided {
            guard,
            endpoints,
            body,
            rewritten,
            held,
        } = d;
        self.ctx
            .metrics
            .decisions
            .with_label_values(&["routed"])
            .inc();
        let replies = protocol::destination_replies(mode, &endpoints, &body, rewritten);
        self.routed = Some(Routed {
            guard: Some(guard),
            endpoints,
            held: Some(held),
            sent_at: Instant::now(),
            anthropic,
        });
        Step::Reply(replies)
    }

    /// Reads which endpoint served the request; when a fallback did, moves the assignment
    /// there (the primary's is released).
    async fn account_served(
        &mut self,
        metadata: Option<&envoy_types::pb::envoy::config::core::v3::Metadata>,
        head: &Head,
    ) {
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        let held = routed.held.take();
        let served = protocol::served(metadata, &head.headers);
        let label = match &served {
            None => "unreported",
            Some(s) if same_endpoint(s, &routed.endpoints[0]) => "primary",
            Some(s) if routed.endpoints.iter().any(|e| same_endpoint(e, s)) => "fallback",
            Some(_) => "unknown",
        };
        self.ctx.metrics.served.with_label_values(&[label]).inc();
        match (label, served, held) {
            ("fallback", Some(served), Some(held)) => {
                let ctx = self.ctx.clone();
                let moved = self
                    .ctx
                    .pool
                    .run(PoolCaller::Epp, move || {
                        decide::reassign(&ctx.state, &ctx.dispatch, &held, &served)
                    })
                    .await;
                match moved {
                    Ok(Ok(mut new)) => {
                        if let Some(mut old) = routed.guard.take() {
                            if let Some(tap) = old.take_tenant() {
                                new.set_tenant(tap);
                            }
                            old.abort();
                        }
                        routed.guard = Some(new);
                    }
                    _ => self.ctx.metrics.error("reassign_failed"),
                }
            }
            ("unknown", ..) => self.ctx.metrics.error("served_unknown"),
            _ => {}
        }
    }

    /// Meters one response body chunk: first token and gaps on a stream, usage.
    fn meter_body(&mut self, chunk: &[u8], now: Instant) {
        let (Some(meter), Some(routed)) = (self.meter.as_mut(), self.routed.as_mut()) else {
            return;
        };
        let Some(guard) = routed.guard.as_mut() else {
            return;
        };
        if let Some(buf) = meter.unary.as_mut() {
            if buf.len() + chunk.len() <= MAX_USAGE_BODY {
                buf.extend_from_slice(chunk);
            } else {
                meter.unary = None;
            }
            return;
        }
        let Some(parser) = meter.sse.as_mut() else {
            return;
        };
        let mut events: Vec<SseEvent> = Vec::new();
        if parser.push(chunk, &mut events).is_err() {
            // An oversized event: stop metering this stream, keep passing it on.
            meter.sse = None;
            return;
        }
        for event in &events {
            let token = if meter.anthropic {
                event.event.as_deref() == Some("content_block_delta")
            } else {
                match openai::inspect_chunk(&event.data) {
                    StreamItem::Chunk { content, usage, .. } => {
                        if usage.is_some() {
                            meter.usage = usage;
                        }
                        content
                    }
                    StreamItem::Done | StreamItem::Other => false,
                }
            };
            if token {
                match meter.last_token {
                    None => guard.first_token(now.saturating_duration_since(routed.sent_at)),
                    Some(prev) => guard.inter_token(now.saturating_duration_since(prev)),
                }
                meter.last_token = Some(now);
            }
        }
    }

    /// The response ended: done (2xx) or aborted, exactly once.
    fn finish(&mut self) {
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        let Some(guard) = routed.guard.take() else {
            return;
        };
        let e2e: Duration = routed.sent_at.elapsed();
        let meter = self.meter.take();
        let ok = meter
            .as_ref()
            .is_some_and(|m| (200..300).contains(&m.status));
        if !ok {
            // A 5xx from the worker counts toward its passive health; anything else (no
            // response seen, a 4xx) says nothing about the worker.
            if meter.as_ref().is_some_and(|m| m.status >= 500) {
                guard.failed(crate::routing::FailureKind::Http5xx);
            } else {
                guard.abort();
            }
            return;
        }
        let usage = meter.and_then(|m| {
            m.usage.or_else(|| {
                m.unary
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .as_ref()
                    .and_then(openai::usage_of)
            })
        });
        guard.done(usage, e2e);
    }
}
