//! The HTTP adapter: vLLM's OpenAI-compatible routes on axum. Handlers tokenize, hand the
//! request to the driver and turn what comes back into vLLM-shaped JSON or SSE. A handler that
//! is dropped (client gone) aborts its request in the engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use parking_lot::RwLock;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::driver::{Cmd, ReqEvent, Snapshot};
use crate::engine::{EngineRequest, FinishReason, SubmitError};
use crate::kv_publisher::PublisherEndpoints;
use crate::lora::{Adapters, Served};
use crate::metrics::Metrics;
use crate::openai::{
    self, ApiError, ChunkDelta, Endpoint, RequestParams, ResponseMeta, SSE_DONE, UsageCounts,
};
use crate::text::{IncrementalDecoder, TextModel};

/// The vLLM version the mock answers as.
pub const VLLM_VERSION: &str = "0.33.0";

/// Everything the handlers share.
pub struct AppState {
    /// Requests, aborts and resets to the engine's driver.
    pub cmd: mpsc::UnboundedSender<Cmd>,
    /// The load and configuration the driver last published.
    pub snapshot: Arc<RwLock<Snapshot>>,
    /// The metrics `/metrics` renders.
    pub metrics: Metrics,
    /// Turns token ids into text and prompts into token ids.
    pub text: TextModel,
    /// Served model names; the first is reported in responses.
    pub served: Vec<String>,
    /// A local directory (tokenizer) routers may load, or the `--model` value.
    pub model_path: String,
    /// The tokenizer directory reported by `/server_info` and `/model_info`, if one was given.
    pub tokenizer_path: Option<String>,
    /// `--enable-prompt-tokens-details`: report cached tokens in `usage`.
    pub prompt_tokens_details: bool,
    /// The timing profile's name or path, reported by `/server_info`.
    pub profile: String,
    /// How much faster than real time the engine runs.
    pub speedup: f64,
    /// The KV event sockets' addresses, reported by `/server_info`.
    pub endpoints: PublisherEndpoints,
    /// The next request id.
    pub next_id: AtomicU64,
    /// The process start time in Unix seconds (the models' `created`).
    pub created: u64,
    /// The LoRA adapters loaded now (`--lora-modules`, then runtime loads and unloads).
    pub adapters: RwLock<Adapters>,
    /// `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` are served
    /// (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`).
    pub runtime_lora_updating: bool,
    /// Fault injection (`POST /mock/fault`): while not 0, every generation request is answered
    /// with this HTTP status (an engine failure as the router sees it), nothing generated.
    pub fault_status: AtomicU16,
    /// Fault injection (`POST /mock/drop-events`): KV event batches still to leave off the
    /// PUB socket; `None` when the mock publishes no events.
    pub drop_events: Option<Arc<AtomicU64>>,
}

type Shared = Arc<AppState>;

impl AppState {
    fn max_model_len(&self) -> usize {
        self.snapshot.read().config.max_model_len
    }

    fn model_name(&self) -> &str {
        self.served.first().map(String::as_str).unwrap_or("mock")
    }

    /// What the request's `model` names: a served base name, a loaded adapter, else 404.
    fn check_model(&self, params: &RequestParams) -> Result<Served, ApiError> {
        let model = params.model.as_deref();
        self.adapters
            .read()
            .resolve(model, &self.served)
            .ok_or_else(|| ApiError::model_not_found(model.unwrap_or_default()))
    }
}

/// Requires `key` on `/v1/*` (as vLLM's `--api-key` does): `Authorization: Bearer <key>` or
/// `x-api-key: <key>`; anything else gets vLLM's 401 body. Probes and metrics stay open.
pub fn require_api_key(app: Router, key: &str) -> Router {
    let key: Arc<str> = Arc::from(key);
    app.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let key = key.clone();
            async move {
                let h = req.headers();
                let bearer = h
                    .get(axum::http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "));
                let header = h.get("x-api-key").and_then(|v| v.to_str().ok());
                let ok = bearer == Some(&*key) || header == Some(&*key);
                if req.uri().path().starts_with("/v1") && !ok {
                    return (
                        axum::http::StatusCode::UNAUTHORIZED,
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        r#"{"error":"Unauthorized"}"#,
                    )
                        .into_response();
                }
                next.run(req).await
            }
        },
    ))
}

/// The router with every route vLLM (and the peers' probes) use.
pub fn router(state: Shared) -> Router {
    let lora_updates = state.runtime_lora_updating;
    let app = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ping", get(health))
        .route("/version", get(version))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/metrics", get(metrics))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/get_load", get(get_load))
        .route("/mock/fault", post(set_fault))
        .route("/mock/drop-events", post(drop_events))
        .route("/mock/cache", get(cache_view).post(cache_prefixes));
    let app = if lora_updates {
        app.route("/v1/load_lora_adapter", post(load_lora_adapter))
            .route("/v1/unload_lora_adapter", post(unload_lora_adapter))
    } else {
        app
    };
    app.with_state(state)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        (status, axum::Json(self.body())).into_response()
    }
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn version() -> axum::Json<Value> {
    axum::Json(json!({"version": VLLM_VERSION}))
}

async fn models(State(s): State<Shared>) -> axum::Json<Value> {
    let max_model_len = s.max_model_len();
    let mut data: Vec<Value> = s
        .served
        .iter()
        .map(|name| {
            json!({
                "id": name, "object": "model", "created": s.created, "owned_by": "vllm",
                "root": s.model_path, "parent": null, "max_model_len": max_model_len,
                "permission": [crate::lora::permission(name, s.created)]
            })
        })
        .collect();
    data.extend(s.adapters.read().cards(s.model_name(), s.created));
    axum::Json(json!({"object": "list", "data": data}))
}

async fn load_lora_adapter(State(s): State<Shared>, body: Bytes) -> Response {
    change_adapters(&s, &body, Adapters::load)
}

async fn unload_lora_adapter(State(s): State<Shared>, body: Bytes) -> Response {
    change_adapters(&s, &body, Adapters::unload)
}

/// Loads or unloads an adapter; vLLM answers a plain-text success line or its JSON error.
fn change_adapters(
    s: &AppState,
    body: &[u8],
    change: fn(&mut Adapters, &Value) -> Result<String, crate::lora::AdapterError>,
) -> Response {
    let v = match openai::parse_body(body) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    match change(&mut s.adapters.write(), &v) {
        Ok(text) => text.into_response(),
        Err(e) => ApiError {
            status: e.status(),
            kind: if e.status() == 404 {
                "NotFoundError"
            } else {
                "BadRequestError"
            },
            message: e.to_string(),
            param: None,
        }
        .into_response(),
    }
}

async fn metrics(State(s): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

async fn server_info(State(s): State<Shared>) -> axum::Json<Value> {
    let snap = s.snapshot.read().clone();
    axum::Json(json!({
        "model_path": s.model_path,
        "tokenizer_path": s.tokenizer_path,
        "served_model_name": s.model_name(),
        "served_model_names": s.served,
        "max_model_len": snap.config.max_model_len,
        "block_size": snap.config.block_size,
        "num_gpu_blocks": snap.config.num_blocks,
        "max_num_batched_tokens": snap.config.max_num_batched_tokens,
        "max_num_seqs": snap.config.max_num_seqs,
        "prefix_caching_hash_algo": snap.config.hash_algo.name(),
        "profile": s.profile,
        "speedup": s.speedup,
        "kv_events_endpoint": s.endpoints.pub_endpoint,
        "kv_events_replay_endpoint": s.endpoints.replay_endpoint,
        "engine_restarts": snap.restarts,
        "version": VLLM_VERSION,
    }))
}

async fn model_info(State(s): State<Shared>) -> axum::Json<Value> {
    axum::Json(json!({
        "model_path": s.model_path,
        "tokenizer_path": s.tokenizer_path,
        "is_generation": true,
        "served_model_name": s.model_name(),
    }))
}

async fn get_load(State(s): State<Shared>) -> axum::Json<Value> {
    let l = s.snapshot.read().load;
    axum::Json(json!({
        "load": l.running + l.waiting,
        "num_requests_running": l.running,
        "num_requests_waiting": l.waiting,
        "kv_cache_usage_perc": l.kv_cache_usage,
        "num_waiting_prefill_tokens": l.waiting_prefill_tokens,
        "cached_blocks": l.cached_blocks,
    }))
}

async fn reset_prefix_cache(State(s): State<Shared>) -> Response {
    let (tx, rx) = oneshot::channel();
    if s.cmd.send(Cmd::Reset(tx)).is_err() {
        return ApiError::internal("engine is not running").into_response();
    }
    match rx.await {
        Ok(true) => axum::Json(json!({"success": true})).into_response(),
        // vLLM answers 200 either way; `success` says whether running requests blocked it.
        Ok(false) => axum::Json(json!({"success": false})).into_response(),
        Err(_) => ApiError::internal("engine is not running").into_response(),
    }
}

async fn tokenize(State(s): State<Shared>, body: Bytes) -> Result<axum::Json<Value>, ApiError> {
    let v = openai::parse_body(&body)?;
    let params = RequestParams::from_value(&v)?;
    s.check_model(&params)?;
    let ids = if v.get("messages").is_some() {
        s.text.encode_chat(&v)?.1
    } else if let Some(p) = v.get("prompt") {
        let add_special = v
            .get("add_special_tokens")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        s.text.encode_prompt(p, add_special)?
    } else {
        return Err(ApiError::bad_request(
            "either prompt or messages is required",
        ));
    };
    Ok(axum::Json(json!({
        "count": ids.len(),
        "max_model_len": s.max_model_len(),
        "tokens": ids,
        "token_strs": null,
    })))
}

async fn detokenize(State(s): State<Shared>, body: Bytes) -> Result<axum::Json<Value>, ApiError> {
    let v = openai::parse_body(&body)?;
    let ids: Vec<u32> = v
        .get("tokens")
        .and_then(|t| serde_json::from_value(t.clone()).ok())
        .ok_or_else(|| ApiError::bad_request("tokens must be a list of token ids"))?;
    Ok(axum::Json(json!({"prompt": s.text.decode(&ids)})))
}

/// `POST /mock/fault` `{"status": N}`: answer every generation request with status `N`
/// (500..=599) from now on; `{"status": 0}` ends the fault. The mock's own test hook: vLLM
/// has no such route.
async fn set_fault(State(s): State<Shared>, body: Bytes) -> Response {
    let status = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("status").and_then(Value::as_u64));
    match status {
        Some(n @ (0 | 500..=599)) => {
            // The match bounds it to u16.
            s.fault_status.store(n as u16, Ordering::Relaxed);
            StatusCode::NO_CONTENT.into_response()
        }
        _ => ApiError::bad_request("body must be {\"status\": 0 or 500..=599}").into_response(),
    }
}

/// `POST /mock/drop-events` `{"count": N}` (N at most 1,000,000): the next N KV event
/// batches get their sequence numbers and stay in the replay buffer but are not published, a
/// gap in the stream as dropped ZMQ frames leave one; `{"count": 0}` cancels what is left. 409
/// when the mock publishes no events. A test hook: vLLM has no such route.
async fn drop_events(State(s): State<Shared>, body: Bytes) -> Response {
    let count = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("count").and_then(Value::as_u64));
    let Some(count) = count.filter(|n| *n <= 1_000_000) else {
        return ApiError::bad_request("body must be {\"count\": 0..=1000000}").into_response();
    };
    match &s.drop_events {
        Some(left) => {
            left.store(count, Ordering::Relaxed);
            StatusCode::NO_CONTENT.into_response()
        }
        None => ApiError {
            status: 409,
            kind: "BadRequestError",
            message: "no KV events are published (--kv-events-config)".into(),
            param: None,
        }
        .into_response(),
    }
}

/// Asks the driver what the prefix cache holds; the prefix lengths are for `prompts`; the
/// hash list only `with_hashes`.
async fn ask_cache(
    s: &AppState,
    prompts: Vec<Vec<u32>>,
    with_hashes: bool,
) -> Result<Value, ApiError> {
    let (tx, rx) = oneshot::channel();
    s.cmd
        .send(Cmd::Cache { prompts, reply: tx })
        .map_err(|_| ApiError::internal("engine is not running"))?;
    let view = rx
        .await
        .map_err(|_| ApiError::internal("engine is not running"))?;
    let hashes: Option<Vec<String>> = with_hashes.then(|| {
        view.block_hashes
            .iter()
            .map(|h| format!("{h:016x}"))
            .collect()
    });
    Ok(json!({
        "cached_blocks": view.block_hashes.len(),
        "block_hashes": hashes,
        "block_size": s.snapshot.read().config.block_size,
        "prefix_tokens": view.prefix_tokens,
    }))
}

/// `GET /mock/cache`: the engine's prefix cache as the worker itself sees it, read-only:
/// `{"cached_blocks": N, "block_hashes": ["<16 hex digits>", ...], "block_size": B}` (the
/// hashes as the KV events carry them, sorted). A test double's hook for comparing a router's
/// view with the worker's own (the fault suite, docs/faults.md); vLLM has no such route and,
/// like the rest of the mock, it has no authentication beyond `--api-key` on `/v1/*`.
async fn cache_view(State(s): State<Shared>) -> Response {
    match ask_cache(&s, Vec::new(), true).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /mock/cache` `{"prompts": [[token ids], ...], "hashes": bool}` (at most 1,024
/// prompts): the `GET /mock/cache` body plus `prefix_tokens`, for each prompt the leading
/// tokens a new request would find cached now; `"hashes": false` leaves the hash list out
/// (`null`). Read-only, like `GET`.
async fn cache_prefixes(State(s): State<Shared>, body: Bytes) -> Response {
    let v = serde_json::from_slice::<Value>(&body).ok();
    let with_hashes = v
        .as_ref()
        .and_then(|v| v.get("hashes")?.as_bool())
        .unwrap_or(true);
    let prompts =
        v.and_then(|v| serde_json::from_value::<Vec<Vec<u32>>>(v.get("prompts")?.clone()).ok());
    let Some(prompts) = prompts.filter(|p| p.len() <= 1_024) else {
        return ApiError::bad_request(
            "body must be {\"prompts\": [[token ids], ...]} (at most 1024)",
        )
        .into_response();
    };
    match ask_cache(&s, prompts, with_hashes).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The injected fault's answer, if one is set.
fn injected_fault(s: &AppState) -> Option<Response> {
    let status = s.fault_status.load(Ordering::Relaxed);
    (status != 0).then(|| {
        ApiError {
            status,
            kind: "InternalServerError",
            message: "injected fault (POST /mock/fault)".into(),
            param: None,
        }
        .into_response()
    })
}

async fn chat_completions(State(s): State<Shared>, body: Bytes) -> Response {
    if let Some(r) = injected_fault(&s) {
        return r;
    }
    generate(s, body, Endpoint::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(s): State<Shared>, body: Bytes) -> Response {
    if let Some(r) = injected_fault(&s) {
        return r;
    }
    generate(s, body, Endpoint::Completions)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Aborts the request in the engine when the handler or its stream is dropped early.
struct AbortGuard {
    id: u64,
    cmd: mpsc::UnboundedSender<Cmd>,
    done: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.cmd.send(Cmd::Abort(self.id));
        }
    }
}

fn submit_error(e: SubmitError) -> ApiError {
    ApiError::bad_request(e.to_string())
}

async fn generate(s: Shared, body: Bytes, endpoint: Endpoint) -> Result<Response, ApiError> {
    let v = openai::parse_body(&body)?;
    let params = RequestParams::from_value(&v)?;
    let served = s.check_model(&params)?;
    let prompt = match endpoint {
        Endpoint::Chat => {
            if !v.get("messages").is_some_and(Value::is_array) {
                return Err(ApiError::bad_request("messages: Field required"));
            }
            s.text.encode_chat(&v)?.1
        }
        Endpoint::Completions => {
            let p = v
                .get("prompt")
                .ok_or_else(|| ApiError::bad_request("prompt: Field required"))?;
            let add_special = v
                .get("add_special_tokens")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            s.text.encode_prompt(p, add_special)?
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::bad_request("The prompt cannot be empty."));
    }
    let max_tokens = params.effective_max_tokens(prompt.len(), s.max_model_len())?;
    let id = s.next_id.fetch_add(1, Ordering::Relaxed);
    let meta = ResponseMeta {
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-{id:016x}"),
            Endpoint::Completions => format!("cmpl-{id:016x}"),
        },
        created: unix_now(),
        model: params
            .model
            .clone()
            .unwrap_or_else(|| s.model_name().to_string()),
        endpoint,
        prompt_token_ids: params.return_token_ids.then(|| prompt.clone()),
    };
    let prompt_tokens = prompt.len();
    let (tx, rx) = mpsc::unbounded_channel();
    let (reply_tx, reply_rx) = oneshot::channel();
    let req = EngineRequest {
        id,
        prompt,
        max_tokens,
        ignore_eos: params.ignore_eos,
        cache_salt: params.cache_salt.clone(),
        lora_name: match served {
            Served::Base => None,
            Served::Adapter(name) => Some(name),
        },
    };
    s.cmd
        .send(Cmd::Submit {
            req,
            events: tx,
            reply: reply_tx,
        })
        .map_err(|_| ApiError::internal("engine is not running"))?;
    match reply_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(submit_error(e)),
        Err(_) => return Err(ApiError::internal("engine is not running")),
    }
    let guard = AbortGuard {
        id,
        cmd: s.cmd.clone(),
        done: false,
    };
    let job = Job {
        s,
        meta,
        params,
        prompt_tokens,
        rx,
        guard,
    };
    if job.params.stream {
        Ok(job.stream())
    } else {
        job.collect().await
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

struct Job {
    s: Shared,
    meta: ResponseMeta,
    params: RequestParams,
    prompt_tokens: usize,
    rx: mpsc::UnboundedReceiver<ReqEvent>,
    guard: AbortGuard,
}

impl Job {
    fn usage(&self, completion_tokens: usize, cached_tokens: usize) -> Value {
        openai::usage_json(
            UsageCounts {
                prompt_tokens: self.prompt_tokens,
                completion_tokens,
                cached_tokens,
            },
            self.s.prompt_tokens_details,
        )
    }

    async fn collect(mut self) -> Result<Response, ApiError> {
        let mut ids = Vec::new();
        loop {
            match self.rx.recv().await {
                Some(ReqEvent::Token { token, .. }) => ids.push(token),
                Some(ReqEvent::Finished { usage, reason, .. }) => {
                    self.guard.done = true;
                    let text = self.s.text.decode(&ids);
                    let body = openai::completion_json(
                        &self.meta,
                        &text,
                        self.params.return_token_ids.then_some(&ids[..]),
                        reason.as_str(),
                        self.usage(usage.completion_tokens, usage.cached_tokens),
                    );
                    return Ok(axum::Json(body).into_response());
                }
                Some(ReqEvent::Aborted) | None => {
                    self.guard.done = true;
                    return Err(ApiError::internal("the engine restarted; request aborted"));
                }
            }
        }
    }

    fn stream(self) -> Response {
        let stream = async_stream::stream! {
            let mut job = self;
            let mut decoder = IncrementalDecoder::default();
            // The last text chunk is held back so the finish reason can ride on it.
            let mut pending: Option<(String, Vec<u32>)> = None;
            let mut generated = 0usize;
            let mut sent_role = false;
            loop {
                let ev = job.rx.recv().await;
                match ev {
                    Some(ReqEvent::Token { token, .. }) => {
                        if !sent_role && job.meta.endpoint == Endpoint::Chat {
                            sent_role = true;
                            let usage = job.params.continuous_usage_stats.then(|| job.usage(0, 0));
                            let v = openai::chunk_json(&job.meta, ChunkDelta::Role, None, usage);
                            yield Ok::<_, std::convert::Infallible>(openai::sse_data(&v));
                        }
                        if let Some((text, ids)) = pending.take() {
                            yield Ok(job.text_chunk(&text, &ids, None, generated));
                        }
                        generated += 1;
                        let text = decoder.push(&job.s.text, token);
                        pending = Some((text, vec![token]));
                    }
                    Some(ReqEvent::Finished { usage, reason, .. }) => {
                        job.guard.done = true;
                        let (text, ids) = pending.take().unwrap_or_default();
                        yield Ok(job.text_chunk(&text, &ids, Some(reason), generated));
                        if job.params.include_usage {
                            let u = job.usage(usage.completion_tokens, usage.cached_tokens);
                            yield Ok(openai::sse_data(&openai::usage_chunk_json(&job.meta, u)));
                        }
                        yield Ok(SSE_DONE.to_string());
                        break;
                    }
                    Some(ReqEvent::Aborted) | None => {
                        job.guard.done = true;
                        let e = ApiError::internal("the engine restarted; request aborted");
                        yield Ok(openai::sse_data(&e.body()));
                        yield Ok(SSE_DONE.to_string());
                        break;
                    }
                }
            }
        };
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
    }

    fn text_chunk(
        &self,
        text: &str,
        ids: &[u32],
        reason: Option<FinishReason>,
        generated: usize,
    ) -> String {
        let usage = self
            .params
            .continuous_usage_stats
            .then(|| self.usage(generated, 0));
        let v = openai::chunk_json(
            &self.meta,
            ChunkDelta::Text {
                text,
                token_ids: self.params.return_token_ids.then_some(ids),
            },
            reason.map(FinishReason::as_str),
            usage,
        );
        openai::sse_data(&v)
    }
}
