//! The relay: a client request, already admitted for a provider, sent upstream and its answer
//! passed back event by event, with usage accounted.
//!
//! ```text
//! client bytes --plan()--> Planned { path, body (model rewritten), mode }
//!    mode: OpenAI -> OpenAI (passthrough, include_usage forced on, the usage chunk stripped
//!          again unless the client asked), Anthropic -> Anthropic (passthrough), Anthropic ->
//!          OpenAI provider (the gateway's translator, both ways)
//! BackendClient::post --head--> 2xx: stream (SSE events relayed as they arrive) | JSON
//!                           \-> 4xx/5xx/timeout/TLS: a client error shaped per API, no URL or key
//! InFlight (drop guard): in-flight slot back, tokens settled, metrics, tenant usage hook
//! ```
//!
//! OpenAI clients are not translated to Anthropic providers: [`plan`] refuses them with
//! [`PlanError::Unsupported`] (the request stays local; the operator reports the limitation
//! on the provider's status).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use kvroute_crds::provider::ProviderKind;
use serde_json::{Map, Value, json};

use super::client::SendError;
use super::{Entry, ProviderUsage, UsageHook};
use crate::gateway::GatewayError;
use crate::gateway::anthropic::{self, StreamTranslator};
use crate::gateway::error::anthropic_error_type;
use crate::gateway::openai::{self, Endpoint, StreamItem};
use crate::gateway::sse::{SseEvent, SseParser};

/// The API a client request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientApi {
    /// OpenAI `/v1/chat/completions`.
    Chat,
    /// OpenAI `/v1/completions`.
    Completions,
    /// Anthropic `/v1/messages`.
    Messages,
}

impl ClientApi {
    /// The client API of an OpenAI endpoint.
    pub fn of(endpoint: Endpoint) -> Self {
        match endpoint {
            Endpoint::ChatCompletions => Self::Chat,
            Endpoint::Completions => Self::Completions,
        }
    }

    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Completions => "completions",
            Self::Messages => "messages",
        }
    }

    /// Whether requests on this API can go to a provider of `kind`.
    pub fn supported_by(self, kind: ProviderKind) -> bool {
        match kind {
            ProviderKind::Openai => true,
            ProviderKind::Anthropic => self == Self::Messages,
        }
    }
}

/// What the gateway hands the relay.
#[derive(Debug, Clone)]
pub struct RelayRequest {
    /// The client's API.
    pub api: ClientApi,
    /// The client's body as received.
    pub raw: Bytes,
    /// The model name the client sent.
    pub client_model: String,
    /// The model the client's name resolved to locally (used to pick the provider's model).
    pub backend_model: String,
    /// The client's request headers (`anthropic-version` and `anthropic-beta` are passed on;
    /// nothing else, in particular not the client's credentials).
    pub headers: HeaderMap,
    /// The verified tenant, for the usage hook.
    pub tenant: Option<String>,
}

/// How the upstream's answer becomes the client's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// OpenAI client, OpenAI provider.
    OpenAi {
        /// The client asked for the usage chunk itself.
        wants_usage: bool,
    },
    /// Anthropic client, Anthropic provider.
    Anthropic,
    /// Anthropic client, OpenAI provider: translated both ways.
    AnthropicViaOpenAi {
        /// The model name the client used (Anthropic responses name it).
        client_model: String,
    },
}

/// A request ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Path below the backend URL.
    pub path: &'static str,
    /// The body to send.
    pub body: Bytes,
    /// The client asked for a stream.
    pub stream: bool,
    /// Translation of the answer.
    pub mode: Mode,
    /// The output limit (for the token estimate).
    pub max_output: Option<u64>,
}

/// Why a request cannot be sent to this provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The client's body is invalid (the gateway normally refused it earlier).
    Invalid(GatewayError),
    /// OpenAI requests are not translated to Anthropic providers.
    Unsupported,
}

fn max_output(body: &Map<String, Value>) -> Option<u64> {
    ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_u64))
}

fn to_bytes(body: &Map<String, Value>) -> Bytes {
    // Serialising a `Map<String, Value>` cannot fail.
    Bytes::from(serde_json::to_vec(body).unwrap_or_default())
}

/// Builds the upstream request for a provider of `kind` serving `model`.
pub fn plan(
    kind: ProviderKind,
    api: ClientApi,
    raw: &[u8],
    model: &str,
) -> Result<Planned, PlanError> {
    match (api, kind) {
        (ClientApi::Chat | ClientApi::Completions, ProviderKind::Openai) => {
            let endpoint = match api {
                ClientApi::Completions => Endpoint::Completions,
                _ => Endpoint::ChatCompletions,
            };
            let req = openai::decode_request(endpoint, raw).map_err(PlanError::Invalid)?;
            Ok(Planned {
                path: endpoint.path(),
                body: openai::upstream_body(&req.body, model, req.stream),
                stream: req.stream,
                mode: Mode::OpenAi {
                    wants_usage: req.wants_usage,
                },
                max_output: max_output(&req.body),
            })
        }
        (ClientApi::Messages, ProviderKind::Openai) => {
            let req = anthropic::decode_request(raw).map_err(PlanError::Invalid)?;
            Ok(Planned {
                path: Endpoint::ChatCompletions.path(),
                body: openai::upstream_body(&req.chat, model, req.stream),
                stream: req.stream,
                mode: Mode::AnthropicViaOpenAi {
                    client_model: req.model,
                },
                max_output: max_output(&req.chat),
            })
        }
        (ClientApi::Messages, ProviderKind::Anthropic) => {
            // Validated as the gateway does; sent as the client wrote it but for the model.
            let req = anthropic::decode_request(raw).map_err(PlanError::Invalid)?;
            let mut body = openai::parse_object(raw).map_err(PlanError::Invalid)?;
            body.insert("model".into(), Value::from(model));
            Ok(Planned {
                path: "/v1/messages",
                body: to_bytes(&body),
                stream: req.stream,
                mode: Mode::Anthropic,
                max_output: max_output(&body),
            })
        }
        (ClientApi::Chat | ClientApi::Completions, ProviderKind::Anthropic) => {
            Err(PlanError::Unsupported)
        }
    }
}

/// Token counts a provider reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenUsage {
    /// Prompt (input) tokens, cached ones included.
    pub prompt: u64,
    /// Completion (output) tokens.
    pub completion: u64,
}

/// Anthropic `usage` (a message's or a `message_delta`'s): input includes the cache reads and
/// writes, which Anthropic reports apart.
fn anthropic_usage(u: &Value) -> Option<TokenUsage> {
    let u = u.as_object()?;
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    Some(TokenUsage {
        prompt: n("input_tokens") + n("cache_read_input_tokens") + n("cache_creation_input_tokens"),
        completion: n("output_tokens"),
    })
}

/// What one upstream event means for measurement.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EventFacts {
    /// It carries generated output.
    pub token: bool,
    /// Usage reported so far (cumulative), if it carries any.
    pub usage: Option<TokenUsage>,
    /// The stream's normal end.
    pub done: bool,
}

/// Turns upstream events into client bytes (pure).
#[derive(Debug)]
pub struct Translate {
    mode: Mode,
    translator: Option<StreamTranslator>,
    usage: TokenUsage,
}

impl Translate {
    /// For `mode`.
    pub fn new(mode: Mode) -> Self {
        let translator = match &mode {
            Mode::AnthropicViaOpenAi { client_model } => {
                Some(StreamTranslator::new(client_model.clone()))
            }
            _ => None,
        };
        Self {
            mode,
            translator,
            usage: TokenUsage::default(),
        }
    }

    /// One upstream event: appends the client's bytes to `out`.
    pub fn event(&mut self, event: &SseEvent, out: &mut BytesMut) -> EventFacts {
        match &self.mode {
            Mode::OpenAi { wants_usage } => {
                let item = openai::inspect_chunk(&event.data);
                let mut facts = EventFacts::default();
                match &item {
                    StreamItem::Chunk {
                        content,
                        usage,
                        usage_only,
                        ..
                    } => {
                        facts.token = *content;
                        facts.usage = usage.map(|u| TokenUsage {
                            prompt: u.prompt_tokens,
                            completion: u.completion_tokens,
                        });
                        if *usage_only && !wants_usage {
                            return facts;
                        }
                    }
                    StreamItem::Done => facts.done = true,
                    StreamItem::Other => {}
                }
                out.extend_from_slice(&event.encode());
                facts
            }
            Mode::AnthropicViaOpenAi { .. } => {
                let (item, json) = openai::inspect_chunk_json(&event.data);
                let mut facts = EventFacts::default();
                let events = match (&item, json, self.translator.as_mut()) {
                    (StreamItem::Chunk { content, usage, .. }, Some(json), Some(t)) => {
                        facts.token = *content;
                        facts.usage = usage.map(|u| TokenUsage {
                            prompt: u.prompt_tokens,
                            completion: u.completion_tokens,
                        });
                        t.on_chunk(&json)
                    }
                    (StreamItem::Done, _, Some(t)) => {
                        facts.done = true;
                        t.finish()
                    }
                    _ => Vec::new(),
                };
                for e in events {
                    out.extend_from_slice(&e.encode());
                }
                facts
            }
            Mode::Anthropic => {
                let mut facts = EventFacts::default();
                if let Ok(v) = serde_json::from_str::<Value>(&event.data) {
                    match v.get("type").and_then(Value::as_str) {
                        Some("message_start") => {
                            if let Some(u) = v
                                .get("message")
                                .and_then(|m| m.get("usage"))
                                .and_then(anthropic_usage)
                            {
                                self.usage = u;
                                facts.usage = Some(u);
                            }
                        }
                        Some("content_block_delta") => {
                            let d = v.get("delta");
                            facts.token = ["text", "thinking", "partial_json"].iter().any(|k| {
                                d.and_then(|d| d.get(*k))
                                    .and_then(Value::as_str)
                                    .is_some_and(|s| !s.is_empty())
                            });
                        }
                        Some("message_delta") => {
                            if let Some(u) = v.get("usage").and_then(anthropic_usage) {
                                // The delta's output count is cumulative; its input count,
                                // when present, replaces message_start's.
                                self.usage.completion = u.completion;
                                if u.prompt > 0 {
                                    self.usage.prompt = u.prompt;
                                }
                                facts.usage = Some(self.usage);
                            }
                        }
                        Some("message_stop") => facts.done = true,
                        _ => {}
                    }
                }
                out.extend_from_slice(&event.encode());
                facts
            }
        }
    }

    /// The upstream stream ended without its end marker: close the client's stream properly.
    pub fn end(&mut self, out: &mut BytesMut) {
        if let Some(t) = self.translator.as_mut() {
            for e in t.finish() {
                out.extend_from_slice(&e.encode());
            }
        }
    }

    /// The upstream stream broke: tell the client in its API's shape.
    pub fn error(&mut self, message: &str, out: &mut BytesMut) {
        match &self.mode {
            Mode::OpenAi { .. } => {
                let e = json!({"error": {"message": message, "type": "server_error", "param": null, "code": "provider_error"}});
                out.extend_from_slice(&SseEvent::data(e.to_string()).encode());
            }
            Mode::Anthropic | Mode::AnthropicViaOpenAi { .. } => {
                out.extend_from_slice(&StreamTranslator::error_event(message).encode());
            }
        }
    }

    /// A whole (non-streaming) answer: the client's body and the usage.
    pub fn unary(&self, body: Bytes) -> Result<(Bytes, Option<TokenUsage>), GatewayError> {
        let parsed = serde_json::from_slice::<Value>(&body);
        match &self.mode {
            Mode::OpenAi { .. } => {
                let usage = parsed
                    .ok()
                    .as_ref()
                    .and_then(openai::usage_of)
                    .map(|u| TokenUsage {
                        prompt: u.prompt_tokens,
                        completion: u.completion_tokens,
                    });
                Ok((body, usage))
            }
            Mode::Anthropic => {
                let usage = parsed
                    .ok()
                    .as_ref()
                    .and_then(|v| v.get("usage"))
                    .and_then(anthropic_usage);
                Ok((body, usage))
            }
            Mode::AnthropicViaOpenAi { client_model } => {
                let chat = parsed.map_err(|_| {
                    GatewayError::ProviderFailed("the provider's answer is not valid JSON".into())
                })?;
                let usage = openai::usage_of(&chat).map(|u| TokenUsage {
                    prompt: u.prompt_tokens,
                    completion: u.completion_tokens,
                });
                let msg = anthropic::message_from_chat(&chat, client_model);
                Ok((Bytes::from(msg.to_string()), usage))
            }
        }
    }
}

/// A gateway error in the client API's shape.
pub fn error_response(api: ClientApi, e: &GatewayError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    let body = match api {
        ClientApi::Messages => e.anthropic_body(),
        ClientApi::Chat | ClientApi::Completions => e.openai_body(),
    };
    let mut resp = json_response(status, Bytes::from(body.to_string()));
    if let Some(s) = e.retry_after() {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    resp
}

fn json_response(status: StatusCode, body: Bytes) -> Response {
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The message inside a provider's error body (OpenAI or Anthropic shape), if any.
fn upstream_message(body: &[u8]) -> Option<String> {
    let v = serde_json::from_slice::<Value>(body).ok()?;
    let e = v.get("error")?;
    e.get("message")
        .and_then(Value::as_str)
        .or_else(|| e.as_str())
        .map(|m| m.chars().take(1024).collect())
}

/// A provider's non-success answer as the client's error, and the outcome label. Client
/// mistakes (400, 404, 413, 422) pass through with the provider's message; the provider
/// refusing the router's credentials is the router's problem (502), never a 401 to the client.
pub fn upstream_failure(api: ClientApi, status: u16, body: &[u8]) -> (Response, &'static str) {
    match status {
        400 | 404 | 409 | 413 | 422 => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            let message = upstream_message(body)
                .unwrap_or_else(|| format!("the provider refused the request ({status})"));
            let body = match api {
                ClientApi::Messages => {
                    json!({"type": "error", "error": {"type": anthropic_error_type(status), "message": message}})
                }
                ClientApi::Chat | ClientApi::Completions => json!({"error": {"message": message,
                    "type": "invalid_request_error", "param": null, "code": "provider_rejected"}}),
            };
            (
                json_response(code, Bytes::from(body.to_string())),
                "client_error",
            )
        }
        401 | 403 => (
            error_response(
                api,
                &GatewayError::ProviderFailed(
                    "the provider refused the router's credentials".into(),
                ),
            ),
            "auth_error",
        ),
        429 => (
            error_response(
                api,
                &GatewayError::ProviderRateLimited("the provider is rate limiting".into()),
            ),
            "rate_limited",
        ),
        408 | 504 => (
            error_response(api, &GatewayError::ProviderTimeout),
            "timeout",
        ),
        503 | 529 => (
            error_response(
                api,
                &GatewayError::ProviderUnavailable("the provider is overloaded".into()),
            ),
            "upstream_error",
        ),
        _ => (
            error_response(
                api,
                &GatewayError::ProviderFailed(format!(
                    "the provider answered with status {status}"
                )),
            ),
            "upstream_error",
        ),
    }
}

fn send_failure(api: ClientApi, e: SendError) -> Response {
    let err = match e {
        SendError::Connect => {
            GatewayError::ProviderFailed("could not connect to the provider".into())
        }
        SendError::Tls => GatewayError::ProviderFailed(
            "the TLS handshake with the provider failed (certificate or server name)".into(),
        ),
        SendError::Timeout => GatewayError::ProviderTimeout,
        SendError::Other => {
            GatewayError::ProviderFailed("the request to the provider failed".into())
        }
    };
    error_response(api, &err)
}

/// A request at the provider. Dropped however the request ends (done, error, client gone):
/// gives the in-flight slot back, settles the token estimate with the usage, counts the
/// outcome, reports the usage to the usage hook and settles the request's tenant tap (its
/// tokens and limit holds), exactly once. The tap also gets the first token, timed from
/// when the gateway received the request.
pub struct InFlight {
    entry: Arc<Entry>,
    hook: Option<UsageHook>,
    tenant: Option<String>,
    estimate: u64,
    sent_at: Instant,
    first_token: bool,
    usage: Option<TokenUsage>,
    outcome: &'static str,
    /// The request's tenant tap and when the gateway received the request.
    tap: Option<(crate::tenant::TenantTap, Instant)>,
}

impl InFlight {
    pub(super) fn new(
        entry: Arc<Entry>,
        hook: Option<UsageHook>,
        tenant: Option<String>,
        estimate: u64,
    ) -> Self {
        entry
            .metrics
            .in_flight
            .with_label_values(&[entry.name()])
            .inc();
        Self {
            entry,
            hook,
            tenant,
            estimate,
            sent_at: Instant::now(),
            first_token: false,
            // A request dropped before an outcome was set: the client went away.
            outcome: "client_gone",
            usage: None,
            tap: None,
        }
    }

    /// Reports this request's first token and usage to its tenant tap too.
    pub(super) fn set_tenant(&mut self, tap: crate::tenant::TenantTap, received_at: Instant) {
        self.tap = Some((tap, received_at));
    }

    fn token(&mut self, now: Instant) {
        if !self.first_token {
            self.first_token = true;
            self.entry
                .metrics
                .ttft
                .with_label_values(&[self.entry.name()])
                .observe(now.saturating_duration_since(self.sent_at).as_secs_f64());
            if let Some((tap, received_at)) = &self.tap {
                tap.first_token(now.saturating_duration_since(*received_at).as_secs_f64());
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let name = self.entry.name();
        let m = &self.entry.metrics;
        m.in_flight.with_label_values(&[name]).dec();
        m.requests.with_label_values(&[name, self.outcome]).inc();
        let actual = self
            .usage
            .map_or(self.estimate, |u| u.prompt + u.completion);
        {
            let mut l = self.entry.limiter.lock();
            l.settle(Instant::now(), self.estimate, actual);
            l.release();
        }
        if let Some(u) = self.usage {
            m.tokens
                .with_label_values(&[name, "prompt"])
                .inc_by(u.prompt);
            m.tokens
                .with_label_values(&[name, "completion"])
                .inc_by(u.completion);
            if let Some(hook) = &self.hook {
                hook(&ProviderUsage {
                    provider: name.to_string(),
                    tenant: self.tenant.clone(),
                    prompt_tokens: u.prompt,
                    completion_tokens: u.completion,
                    estimated_tokens: self.estimate,
                });
            }
            if let Some((tap, _)) = &mut self.tap {
                tap.done(u.prompt, u.completion);
            }
        }
    }
}

/// Headers passed on to the provider (the client's credentials never are).
fn forwarded_headers(
    kind: ProviderKind,
    client: &HeaderMap,
) -> Vec<(http::HeaderName, HeaderValue)> {
    let mut out = vec![(
        header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    )];
    if kind == ProviderKind::Anthropic {
        let version = client
            .get("anthropic-version")
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("2023-06-01"));
        out.push((http::HeaderName::from_static("anthropic-version"), version));
        if let Some(beta) = client.get("anthropic-beta") {
            out.push((
                http::HeaderName::from_static("anthropic-beta"),
                beta.clone(),
            ));
        }
    }
    out
}

/// Sends `planned` and turns the answer into the client's response. `flight` is the admitted
/// request's guard; it lives until the response body ends.
pub(super) async fn send(
    entry: Arc<Entry>,
    api: ClientApi,
    planned: Planned,
    headers: &HeaderMap,
    mut flight: InFlight,
) -> Response {
    let extra = forwarded_headers(entry.resolved.kind, headers);
    let response = match entry.client.post(planned.path, planned.body, &extra).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(
                provider = entry.name(),
                error = e.label(),
                "overflow request failed"
            );
            flight.outcome = e.label();
            return send_failure(api, e);
        }
    };
    let status = response.status().as_u16();
    let idle = entry.client.timeouts().idle;
    let mut body = Body::new(response.into_body()).into_data_stream();
    if !(200..300).contains(&status) {
        // Error bodies are small; read a bounded amount for the message.
        let mut buf = BytesMut::new();
        while buf.len() < 64 << 10 {
            match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(Ok(chunk))) => buf.extend_from_slice(&chunk),
                _ => break,
            }
        }
        let (resp, outcome) = upstream_failure(api, status, &buf);
        tracing::warn!(
            provider = entry.name(),
            status,
            outcome,
            "overflow provider refused the request"
        );
        flight.outcome = outcome;
        return resp;
    }
    let mut translate = Translate::new(planned.mode);
    if !planned.stream {
        let mut buf = BytesMut::new();
        loop {
            match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(Ok(chunk))) => buf.extend_from_slice(&chunk),
                Ok(None) => break,
                Ok(Some(Err(_))) => {
                    flight.outcome = "broken_stream";
                    return error_response(
                        api,
                        &GatewayError::ProviderFailed("the provider's answer broke off".into()),
                    );
                }
                Err(_) => {
                    flight.outcome = "timeout";
                    return error_response(api, &GatewayError::ProviderTimeout);
                }
            }
        }
        return match translate.unary(buf.freeze()) {
            Ok((bytes, usage)) => {
                flight.usage = usage;
                flight.outcome = "ok";
                flight.token(Instant::now());
                json_response(StatusCode::OK, bytes)
            }
            Err(e) => {
                flight.outcome = "upstream_error";
                error_response(api, &e)
            }
        };
    }
    let stream = async_stream::stream! {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        loop {
            let mut out = BytesMut::new();
            let mut ended = false;
            let mut broke: Option<(&'static str, &'static str)> = None;
            match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(Ok(chunk))) => {
                    if parser.push(&chunk, &mut events).is_err() {
                        broke = Some(("the provider sent an oversized event", "broken_stream"));
                    }
                }
                Ok(Some(Err(_))) => broke = Some(("the provider's stream broke off", "broken_stream")),
                Err(_) => broke = Some(("the provider stopped sending", "timeout")),
                Ok(None) => {
                    if let Ok(Some(last)) = parser.finish() {
                        events.push(last);
                    }
                    ended = true;
                }
            }
            let now = Instant::now();
            for event in events.drain(..) {
                let facts = translate.event(&event, &mut out);
                if facts.token {
                    flight.token(now);
                }
                if facts.usage.is_some() {
                    flight.usage = facts.usage;
                }
                if facts.done {
                    flight.outcome = "ok";
                }
            }
            if let Some((message, outcome)) = broke {
                translate.error(message, &mut out);
                flight.outcome = outcome;
                ended = true;
            } else if ended {
                translate.end(&mut out);
                flight.outcome = "ok";
            }
            if !out.is_empty() {
                yield Ok::<Bytes, Infallible>(out.freeze());
            }
            if ended {
                break;
            }
        }
        drop(flight);
    };
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(b: &Bytes) -> Value {
        serde_json::from_slice(b).expect("json")
    }

    #[test]
    fn plans_rewrite_the_model_and_refuse_what_is_not_translated() {
        let chat = br#"{"model":"local","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":9}"#;
        let p = plan(ProviderKind::Openai, ClientApi::Chat, chat, "gpt-x").expect("plan");
        assert_eq!(p.path, "/v1/chat/completions");
        let b = body(&p.body);
        assert_eq!(b["model"], "gpt-x");
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!((p.stream, p.max_output), (true, Some(9)));
        assert_eq!(p.mode, Mode::OpenAi { wants_usage: false });
        assert_eq!(
            plan(ProviderKind::Anthropic, ClientApi::Chat, chat, "claude"),
            Err(PlanError::Unsupported)
        );
        let msg = br#"{"model":"local","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":"u"}}"#;
        let p = plan(
            ProviderKind::Anthropic,
            ClientApi::Messages,
            msg,
            "claude-x",
        )
        .expect("plan");
        assert_eq!(p.path, "/v1/messages");
        let b = body(&p.body);
        assert_eq!(b["model"], "claude-x");
        assert_eq!(b["metadata"]["user_id"], "u");
        assert_eq!(p.mode, Mode::Anthropic);
        let p = plan(ProviderKind::Openai, ClientApi::Messages, msg, "gpt-x").expect("plan");
        assert_eq!(p.path, "/v1/chat/completions");
        assert_eq!(body(&p.body)["messages"][0]["content"], "hi");
        assert_eq!(
            p.mode,
            Mode::AnthropicViaOpenAi {
                client_model: "local".into()
            }
        );
        assert!(matches!(
            plan(ProviderKind::Openai, ClientApi::Chat, b"{", "m"),
            Err(PlanError::Invalid(GatewayError::MalformedJson(_)))
        ));
    }

    #[test]
    fn anthropic_stream_usage_and_tokens() {
        let mut t = Translate::new(Mode::Anthropic);
        let mut out = BytesMut::new();
        let start = SseEvent::named(
            "message_start",
            r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":10,"cache_read_input_tokens":4,"output_tokens":1}}}"#,
        );
        let f = t.event(&start, &mut out);
        assert_eq!(
            f.usage,
            Some(TokenUsage {
                prompt: 14,
                completion: 1
            })
        );
        let delta = SseEvent::named(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
        );
        assert!(t.event(&delta, &mut out).token);
        let md = SseEvent::named(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}"#,
        );
        assert_eq!(
            t.event(&md, &mut out).usage,
            Some(TokenUsage {
                prompt: 14,
                completion: 7
            })
        );
        let stop = SseEvent::named("message_stop", r#"{"type":"message_stop"}"#);
        assert!(t.event(&stop, &mut out).done);
        // Passed through byte for byte.
        let expected: Vec<u8> = [start, delta, md, stop]
            .iter()
            .flat_map(|e| e.encode().to_vec())
            .collect();
        assert_eq!(&out[..], &expected[..]);
    }

    #[test]
    fn openai_usage_chunk_is_stripped_unless_asked_for() {
        let usage = SseEvent::data(
            r#"{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        );
        let mut out = BytesMut::new();
        let f = Translate::new(Mode::OpenAi { wants_usage: false }).event(&usage, &mut out);
        assert_eq!(
            f.usage,
            Some(TokenUsage {
                prompt: 3,
                completion: 2
            })
        );
        assert!(out.is_empty());
        Translate::new(Mode::OpenAi { wants_usage: true }).event(&usage, &mut out);
        assert!(!out.is_empty());
    }

    #[test]
    fn upstream_failures_are_shaped_without_internals() {
        let (resp, outcome) = upstream_failure(
            ClientApi::Chat,
            401,
            br#"{"error":{"message":"Incorrect API key provided: sk-abc"}}"#,
        );
        assert_eq!((resp.status().as_u16(), outcome), (502, "auth_error"));
        let (resp, outcome) = upstream_failure(
            ClientApi::Messages,
            400,
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens too large"}}"#,
        );
        assert_eq!((resp.status().as_u16(), outcome), (400, "client_error"));
        let (resp, _) = upstream_failure(ClientApi::Chat, 429, b"");
        assert_eq!(resp.status().as_u16(), 429);
        assert!(resp.headers().contains_key(header::RETRY_AFTER));
        assert_eq!(
            upstream_failure(ClientApi::Chat, 500, b"<html>")
                .0
                .status()
                .as_u16(),
            502
        );
        assert_eq!(
            upstream_failure(ClientApi::Chat, 529, b"")
                .0
                .status()
                .as_u16(),
            503
        );
    }
}
