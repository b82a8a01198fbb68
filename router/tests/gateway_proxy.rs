//! Gateway component tests over real sockets: a fake worker (axum on 127.0.0.1:0 whose SSE
//! stream the test releases chunk by chunk) behind the real gateway, and a fake router that
//! counts assignments so "released exactly once" can be checked on every path.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use kvroute_router::gateway::AdmissionConfig;
use kvroute_router::gateway::openai::Usage;
use kvroute_router::gateway::{
    Dispatch, GatewayConfig, GatewayRequest, PREDICTED_TTFT_HEADER, PickError, Picked, Resolved,
    TTFT_BOUND_HEADER, WORKER_HEADER, router_with,
};
use kvroute_router::listener::{ListenerConfig, ListenerMetrics, Refusal};
use kvroute_router::routing::AssignmentId;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(10);

/// Polls `cond` until true or the deadline passes.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + DEADLINE;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Serves `app` as the router does (kvroute_router::listener, default limits).
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(kvroute_router::listener::serve(
        listener,
        app,
        ListenerConfig::defaults("gateway"),
        None,
        ListenerMetrics::unregistered().expect("metrics"),
        CancellationToken::new(),
    ));
    addr
}

/// A worker for the fake upstream (started on worker, a listener of its own).
async fn serve_worker(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

// ---------------------------------------------------------------- fake worker

#[derive(Clone)]
struct Worker {
    /// Permits released by the test; each chunk after the first waits for one.
    gate: Arc<Semaphore>,
    /// Set when the worker's response stream is dropped (client side closed it).
    stream_dropped: Arc<AtomicBool>,
    /// Bodies received, in order.
    bodies: Arc<Mutex<Vec<Value>>>,
    /// Answer every request with this status instead.
    fail_with: Option<u16>,
}

impl Default for Worker {
    fn default() -> Self {
        Self {
            gate: Arc::new(Semaphore::new(0)),
            stream_dropped: Arc::default(),
            bodies: Arc::default(),
            fail_with: None,
        }
    }
}

struct DropFlag(Arc<AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

const CHUNKS: [&str; 3] = ["Hello", " there", "!"];

fn chunk(content: &str) -> String {
    json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "served",
        "choices": [{"index": 0, "delta": {"content": content}, "logprobs": null, "finish_reason": null}]})
    .to_string()
}

async fn worker_chat(State(w): State<Worker>, body: axum::body::Bytes) -> Response {
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    w.bodies.lock().push(v.clone());
    if let Some(status) = w.fail_with {
        let code = StatusCode::from_u16(status).expect("status");
        let err = json!({"error": {"message": "worker says no", "type": "BadRequestError", "code": status}});
        return (code, err.to_string()).into_response();
    }
    if v.get("max_tokens").and_then(Value::as_u64) == Some(0) {
        let err = json!({"error": {"message": "max_tokens must be at least 1", "type": "BadRequestError", "code": 400}});
        return (StatusCode::BAD_REQUEST, err.to_string()).into_response();
    }
    let usage = json!({"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23,
        "prompt_tokens_details": {"cached_tokens": 16}});
    if v.get("stream").and_then(Value::as_bool) != Some(true) {
        let resp = json!({"id": "chatcmpl-7", "object": "chat.completion", "model": "served",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there!"},
                "finish_reason": "stop", "stop_reason": null}],
            "usage": usage});
        return ([("content-type", "application/json")], resp.to_string()).into_response();
    }
    let flag = DropFlag(w.stream_dropped.clone());
    let gate = w.gate.clone();
    let stream = async_stream::stream! {
        let _flag = flag;
        let role = json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "served",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]});
        yield Ok::<_, std::convert::Infallible>(format!("data: {role}\n\n"));
        for (i, c) in CHUNKS.iter().enumerate() {
            if i > 0 {
                // Waits for the test; a client that went away leaves it waiting here until
                // the connection error drops the stream.
                if let Ok(p) = gate.acquire().await {
                    p.forget();
                }
            }
            yield Ok(format!("data: {}\n\n", chunk(c)));
        }
        let fin = json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "served",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": null}]});
        yield Ok(format!("data: {fin}\n\n"));
        let u = json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "served",
            "choices": [], "usage": usage});
        yield Ok(format!("data: {u}\n\ndata: [DONE]\n\n"));
    };
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .expect("response")
}

async fn start_worker(w: Worker) -> SocketAddr {
    let app = Router::new()
        .route("/v1/chat/completions", post(worker_chat))
        .route("/v1/completions", post(worker_chat))
        .with_state(w);
    serve_worker(app).await
}

// ---------------------------------------------------------------- fake router

#[derive(Default)]
struct Ledger {
    in_flight: HashSet<u64>,
    picks: Vec<String>,
    first_tokens: u32,
    inter_tokens: u32,
    done: Vec<Option<Usage>>,
    aborts: u32,
    double_releases: u32,
    last_route_body: Option<Value>,
}

struct FakeRouter {
    /// (name, base URL), tried in order.
    workers: Vec<(String, String)>,
    /// client name -> served name.
    models: HashMap<String, String>,
    next: AtomicU64,
    ledger: Mutex<Ledger>,
}

impl FakeRouter {
    fn new(workers: Vec<(String, String)>) -> Arc<Self> {
        let models = HashMap::from([
            ("served".to_string(), "served".to_string()),
            ("alias".to_string(), "served".to_string()),
        ]);
        Arc::new(Self {
            workers,
            models,
            next: AtomicU64::new(1),
            ledger: Mutex::new(Ledger::default()),
        })
    }

    fn release(&self, p: &Picked) {
        let mut l = self.ledger.lock();
        if !l.in_flight.remove(&p.assignment.0) {
            l.double_releases += 1;
        }
    }
}

impl Dispatch for FakeRouter {
    fn model_names(&self) -> Vec<String> {
        self.models.keys().cloned().collect()
    }
    fn resolve_model(&self, client_model: &str) -> Option<Resolved> {
        self.models.get(client_model).map(|m| Resolved {
            backend_model: m.clone(),
            pool: None,
            alias: None,
            lora_base: None,
        })
    }
    fn pick(&self, request: &GatewayRequest<'_>, exclude: &[String]) -> Result<Picked, PickError> {
        assert_eq!(request.resolved.backend_model, "served");
        let (name, url) = self
            .workers
            .iter()
            .find(|(n, _)| !exclude.contains(n))
            .ok_or_else(|| PickError::NoReadyWorker(request.client_model.into()))?;
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let mut l = self.ledger.lock();
        l.in_flight.insert(id);
        l.picks.push(name.clone());
        l.last_route_body = Some(Value::Object(request.body.clone()));
        Ok(Picked {
            assignment: AssignmentId(id),
            worker: name.clone(),
            address: url.trim_start_matches("http://").to_string(),
            backend_model: request.resolved.backend_model.clone(),
            predicted_ttft_s: 0.0425,
            ttft_p90_bound_s: 0.0625,
            reason: "lowest_predicted_ttft",
            degraded: false,
            fallbacks: Vec::new(),
            policy: Default::default(),
        })
    }
    fn first_token(&self, _picked: &Picked, _ttft: Duration) {
        self.ledger.lock().first_tokens += 1;
    }
    fn inter_token(&self, _picked: &Picked, _gap: Duration) {
        self.ledger.lock().inter_tokens += 1;
    }
    fn done(&self, picked: &Picked, usage: Option<Usage>, _e2e: Duration) {
        self.release(picked);
        self.ledger.lock().done.push(usage);
    }
    fn abort(&self, picked: &Picked) {
        self.release(picked);
        self.ledger.lock().aborts += 1;
    }
}

struct Setup {
    base: String,
    router: Arc<FakeRouter>,
    client: reqwest::Client,
}

async fn gateway(workers: Vec<(String, String)>, cfg: GatewayConfig) -> Setup {
    let router = FakeRouter::new(workers);
    let app = router_with(router.clone(), cfg).expect("gateway");
    let addr = serve(app).await;
    Setup {
        base: format!("http://{addr}"),
        router,
        client: reqwest::Client::new(),
    }
}

/// The routing headers on: these tests check the decision they carry.
fn exposing() -> GatewayConfig {
    GatewayConfig {
        expose_routing_headers: true,
        ..GatewayConfig::default()
    }
}

async fn one_worker(w: Worker) -> Setup {
    let addr = start_worker(w).await;
    gateway(vec![("w0".into(), format!("http://{addr}"))], exposing()).await
}

fn chat_body(stream: bool) -> Value {
    json!({"model": "alias", "messages": [{"role": "user", "content": "hi"}], "stream": stream,
        "max_completion_tokens": 3, "ignore_eos": true, "x_extra": {"keep": [1, 2]}})
}

/// Reads SSE `data:` payloads from a response until `n` have arrived.
async fn read_events(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buf: &mut String,
    n: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            out.push(event.trim_end().to_string());
            if out.len() == n {
                return out;
            }
        }
        let next = tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("event in time");
        match next {
            Some(Ok(b)) => buf.push_str(std::str::from_utf8(&b).expect("utf8")),
            other => panic!("stream ended early after {out:?}: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn streaming_passes_chunks_through_before_the_worker_finishes() {
    let worker = Worker::default();
    let s = one_worker(worker.clone()).await;
    let resp = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat_body(true))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()[WORKER_HEADER], "w0");
    assert_eq!(resp.headers()[PREDICTED_TTFT_HEADER], "42.500");
    assert_eq!(resp.headers()[TTFT_BOUND_HEADER], "62.500");
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    // The role chunk and the first token arrive while the worker is still blocked.
    let first = read_events(&mut stream, &mut buf, 2).await;
    assert!(first[1].contains("\"Hello\""), "{first:?}");
    assert!(!worker.stream_dropped.load(Ordering::SeqCst));
    eventually("first token reported", || {
        s.router.ledger.lock().first_tokens == 1
    })
    .await;
    assert!(
        s.router.ledger.lock().done.is_empty(),
        "not released while streaming"
    );

    worker.gate.add_permits(CHUNKS.len());
    let rest = read_events(&mut stream, &mut buf, 4).await;
    assert!(rest[0].contains("\" there\""));
    assert!(rest[1].contains("\"!\""));
    assert!(rest[2].contains("\"finish_reason\":\"stop\""));
    // The usage chunk the gateway asked for is stripped: the client did not ask for it.
    assert_eq!(rest[3], "data: [DONE]");
    assert!(
        tokio::time::timeout(DEADLINE, stream.next())
            .await
            .expect("end")
            .is_none()
    );

    {
        let l = s.router.ledger.lock();
        assert_eq!(
            (l.first_tokens, l.inter_tokens, l.aborts, l.double_releases),
            (1, 2, 0, 0)
        );
        assert_eq!(
            l.done,
            vec![Some(Usage {
                prompt_tokens: 20,
                completion_tokens: 3,
                cached_tokens: 16
            })]
        );
        assert!(l.in_flight.is_empty());
    }

    // The worker got every client field; model rewritten, include_usage forced on.
    let sent = worker.bodies.lock()[0].clone();
    let mut expected = chat_body(true);
    expected["model"] = json!("served");
    expected["stream_options"] = json!({"include_usage": true});
    assert_eq!(sent, expected);
}

#[tokio::test]
async fn usage_chunk_is_kept_when_the_client_asked_for_it() {
    let worker = Worker::default();
    worker.gate.add_permits(10);
    let s = one_worker(worker).await;
    let mut body = chat_body(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&body)
        .send()
        .await
        .expect("send");
    let text = text.text().await.expect("body");
    assert!(text.contains("\"cached_tokens\":16"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn client_disconnect_releases_the_assignment_and_drops_the_upstream_stream() {
    let worker = Worker::default();
    let s = one_worker(worker.clone()).await;
    let resp = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat_body(true))
        .send()
        .await
        .expect("send");
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    read_events(&mut stream, &mut buf, 2).await;
    assert_eq!(s.router.ledger.lock().in_flight.len(), 1);
    drop(stream);

    eventually("assignment released", || {
        s.router.ledger.lock().in_flight.is_empty()
    })
    .await;
    // The worker is parked waiting for a permit; one more chunk makes it notice the closed
    // connection (a server only learns of a closed socket when it writes to it).
    worker.gate.add_permits(CHUNKS.len());
    eventually("worker's stream dropped", || {
        worker.stream_dropped.load(Ordering::SeqCst)
    })
    .await;
    let l = s.router.ledger.lock();
    assert_eq!((l.aborts, l.double_releases), (1, 0));
    assert!(l.done.is_empty());
}

#[tokio::test]
async fn non_streaming_openai_is_verbatim_and_reports_usage() {
    let s = one_worker(Worker::default()).await;
    let resp = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat_body(false))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()[WORKER_HEADER], "w0");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "Hello there!");
    let l = s.router.ledger.lock();
    assert_eq!(
        l.done,
        vec![Some(Usage {
            prompt_tokens: 20,
            completion_tokens: 3,
            cached_tokens: 16
        })]
    );
    assert!(l.in_flight.is_empty());
}

#[tokio::test]
async fn completions_and_models() {
    let s = one_worker(Worker::default()).await;
    let body = json!({"model": "served", "prompt": "Once", "max_tokens": 3});
    let resp = s
        .client
        .post(format!("{}/v1/completions", s.base))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(s.router.ledger.lock().last_route_body, Some(body));
    let models: Value = s
        .client
        .get(format!("{}/v1/models", s.base))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["alias", "served"]);
    assert_eq!(models["object"], "list");
    let health = s
        .client
        .get(format!("{}/health", s.base))
        .send()
        .await
        .expect("send");
    assert_eq!(
        health.status(),
        200,
        "GET /health on the API port, as vLLM serves it"
    );
}

#[tokio::test]
async fn anthropic_messages_stream_and_unary() {
    let worker = Worker::default();
    worker.gate.add_permits(10);
    let s = one_worker(worker.clone()).await;
    let body = json!({"model": "alias", "max_tokens": 16, "system": "Be brief.", "stream": true,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
    let resp = s
        .client
        .post(format!("{}/v1/messages", s.base))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()[WORKER_HEADER], "w0");
    let text = resp.text().await.expect("body");
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(text.contains(r#""stop_reason":"end_turn""#), "{text}");
    assert!(text.contains(r#""cache_read_input_tokens":16"#), "{text}");
    let sent = worker.bodies.lock()[0].clone();
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(sent["model"], "served");

    let mut unary = body.clone();
    unary["stream"] = json!(false);
    let v: Value = s
        .client
        .post(format!("{}/v1/messages", s.base))
        .json(&unary)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(v["type"], "message");
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": "Hello there!"}])
    );
    assert_eq!(v["usage"]["input_tokens"], 4);
    assert_eq!(v["model"], "alias");
    let l = s.router.ledger.lock();
    assert!(l.in_flight.is_empty());
    assert_eq!((l.done.len(), l.aborts, l.double_releases), (2, 0, 0));
}

async fn post_raw(s: &Setup, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let resp = s
        .client
        .post(format!("{}{path}", s.base))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("send");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("error body is JSON"))
}

#[tokio::test]
async fn bad_input_gets_shaped_errors_and_the_gateway_stays_up() {
    let cfg = GatewayConfig {
        max_body_bytes: 1024,
        ..GatewayConfig::default()
    };
    let addr = start_worker(Worker::default()).await;
    let s = gateway(vec![("w0".into(), format!("http://{addr}"))], cfg).await;
    let big =
        json!({"model": "alias", "messages": [{"role": "user", "content": "x".repeat(2000)}]})
            .to_string();
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v1/chat/completions", "{nope".into(), 400, "invalid_json"),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}]}"#.into(),
            400,
            "missing_required_parameter",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"alias"}"#.into(),
            400,
            "missing_required_parameter",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"alias","messages":"x"}"#.into(),
            400,
            "invalid_value",
        ),
        (
            "/v1/completions",
            r#"{"model":"alias"}"#.into(),
            400,
            "missing_required_parameter",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#.into(),
            404,
            "model_not_found",
        ),
        (
            "/v1/chat/completions",
            big.clone(),
            413,
            "request_too_large",
        ),
    ];
    for (path, body, status, code) in cases {
        let (got, v) = post_raw(&s, path, body.clone()).await;
        assert_eq!(got, status, "{path} {body:.60}: {v}");
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(
            v["error"]["message"].is_string()
                && v["error"]["type"].is_string()
                && v["error"].get("param").is_some()
        );
    }
    // A chunked body (no Content-Length) over the limit is refused too.
    let chunks = futures::stream::iter(vec![Ok::<_, std::io::Error>(big.clone().into_bytes())]);
    let (got, _) = post_raw(
        &s,
        "/v1/chat/completions",
        reqwest::Body::wrap_stream(chunks),
    )
    .await;
    assert_eq!(got, 413);

    let anthropic: Vec<(String, u16, &str)> = vec![
        ("[".into(), 400, "invalid_request_error"),
        (
            r#"{"model":"alias","messages":[{"role":"user","content":"x"}]}"#.into(),
            400,
            "invalid_request_error",
        ),
        (
            r#"{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"x"}]}"#.into(),
            404,
            "not_found_error",
        ),
        (big.clone(), 413, "request_too_large"),
    ];
    for (body, status, kind) in anthropic {
        let (got, v) = post_raw(&s, "/v1/messages", body.clone()).await;
        assert_eq!(got, status, "{body:.60}: {v}");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], kind, "{v}");
    }
    // The worker's own 4xx passes through in the client's shape, and releases.
    let (got, v) = post_raw(
        &s,
        "/v1/chat/completions",
        r#"{"model":"alias","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(
        (got, v["error"]["message"].as_str()),
        (400, Some("max_tokens must be at least 1"))
    );
    let (got, v) = post_raw(
        &s,
        "/v1/messages",
        r#"{"model":"alias","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(
        (got, &v["error"]),
        (
            400,
            &json!({"type": "invalid_request_error", "message": "max_tokens must be at least 1"})
        )
    );

    // Still serving.
    let resp = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat_body(false))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let l = s.router.ledger.lock();
    assert!(l.in_flight.is_empty());
    assert_eq!(l.double_releases, 0);
}

#[tokio::test]
async fn no_ready_worker_is_503_and_upstream_failure_is_502() {
    let s = gateway(vec![], GatewayConfig::default()).await;
    let (got, v) = post_raw(&s, "/v1/chat/completions", chat_body(false).to_string()).await;
    assert_eq!(
        (got, v["error"]["code"].as_str()),
        (503, Some("no_ready_worker"))
    );
    let (got, v) = post_raw(
        &s,
        "/v1/messages",
        r#"{"model":"alias","max_tokens":1,"messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(
        (got, v["error"]["type"].as_str()),
        (503, Some("overloaded_error"))
    );

    let broken = Worker {
        fail_with: Some(500),
        ..Worker::default()
    };
    let s = one_worker(broken).await;
    let (got, v) = post_raw(&s, "/v1/chat/completions", chat_body(true).to_string()).await;
    assert_eq!(
        (got, v["error"]["code"].as_str()),
        (502, Some("upstream_error"))
    );
    assert!(
        !v.to_string().contains("127.0.0.1"),
        "no internals leak: {v}"
    );
    let l = s.router.ledger.lock();
    assert_eq!((l.in_flight.len(), l.aborts, l.double_releases), (0, 1, 0));
}

/// A port nothing listens on.
async fn dead_url() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    format!("http://{addr}")
}

#[tokio::test]
async fn requests_that_never_started_are_retried_on_another_worker() {
    let good = Worker::default();
    good.gate.add_permits(10);
    let unavailable = Worker {
        fail_with: Some(503),
        ..Worker::default()
    };
    let good_addr = start_worker(good.clone()).await;
    let busy_addr = start_worker(unavailable.clone()).await;
    let workers = vec![
        ("dead".to_string(), dead_url().await),
        ("busy".to_string(), format!("http://{busy_addr}")),
        ("good".to_string(), format!("http://{good_addr}")),
    ];
    let s = gateway(workers.clone(), exposing()).await;
    let resp = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat_body(true))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()[WORKER_HEADER], "good");
    assert!(
        resp.text()
            .await
            .expect("body")
            .ends_with("data: [DONE]\n\n")
    );
    assert_eq!(unavailable.bodies.lock().len(), 1);
    {
        let l = s.router.ledger.lock();
        assert_eq!(l.picks, ["dead", "busy", "good"]);
        assert_eq!(
            (l.aborts, l.done.len(), l.in_flight.len(), l.double_releases),
            (2, 1, 0, 0)
        );
    }

    // With one retry allowed, the third worker is never tried: the last failure is reported.
    let cfg = GatewayConfig {
        max_retries: 1,
        ..GatewayConfig::default()
    };
    let s = gateway(workers, cfg).await;
    let (got, v) = post_raw(&s, "/v1/chat/completions", chat_body(false).to_string()).await;
    assert_eq!(
        (got, v["error"]["code"].as_str()),
        (503, Some("no_ready_worker"))
    );
    {
        let l = s.router.ledger.lock();
        assert_eq!(l.picks, ["dead", "busy"]);
        assert_eq!((l.aborts, l.in_flight.len()), (2, 0));
    }

    // Only dead workers: 502 after trying each once.
    let s = gateway(
        vec![
            ("d1".into(), dead_url().await),
            ("d2".into(), dead_url().await),
        ],
        GatewayConfig::default(),
    )
    .await;
    let (got, v) = post_raw(&s, "/v1/chat/completions", chat_body(false).to_string()).await;
    assert_eq!(
        (got, v["error"]["code"].as_str()),
        (502, Some("upstream_error"))
    );
    assert_eq!(s.router.ledger.lock().picks, ["d1", "d2"]);
}

// ---------------------------------------------------------------- admission

#[tokio::test]
async fn routing_headers_are_off_by_default() {
    let addr = start_worker(Worker::default()).await;
    let s = gateway(
        vec![("w0".into(), format!("http://{addr}"))],
        GatewayConfig::default(),
    )
    .await;
    let resp = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat_body(false))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get(WORKER_HEADER).is_none());
    assert!(resp.headers().get(PREDICTED_TTFT_HEADER).is_none());
    assert!(resp.headers().get(TTFT_BOUND_HEADER).is_none());
}

fn anthropic_body() -> Value {
    json!({"model": "alias", "max_tokens": 3,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
}

/// Starts a streaming request and reads its first event: it then holds its admission
/// ticket until the worker's gate lets the rest through.
async fn hold_a_stream(s: &Setup) -> impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> {
    let resp = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat_body(true))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let first = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("first event in time");
    assert!(first.is_some());
    stream
}

#[tokio::test]
async fn over_the_concurrency_limit_requests_are_shed_with_retry_after() {
    let worker = Worker::default();
    let addr = start_worker(worker.clone()).await;
    let metrics = ListenerMetrics::unregistered().expect("metrics");
    let cfg = GatewayConfig {
        admission: AdmissionConfig {
            max_concurrent_requests: 1,
            max_concurrent_requests_per_client: 0,
        },
        metrics: metrics.clone(),
        ..GatewayConfig::default()
    };
    let s = gateway(vec![("w0".into(), format!("http://{addr}"))], cfg).await;
    let mut held = hold_a_stream(&s).await;

    let resp = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat_body(false))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "overloaded");
    assert_eq!(v["error"]["type"], "service_unavailable_error");

    let resp = s
        .client
        .post(format!("{}/v1/messages", s.base))
        .json(&anthropic_body())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("overloaded_error"))
    );
    // Listing models is not a generation: never shed.
    let models = s
        .client
        .get(format!("{}/v1/models", s.base))
        .send()
        .await
        .expect("send");
    assert_eq!(models.status(), 200);
    assert_eq!(metrics.refused("gateway", Refusal::ConcurrencyLimit), 2);
    // Shed requests never reached the router.
    assert_eq!(s.router.ledger.lock().in_flight.len(), 1);

    // The place frees when the held stream's body ends.
    worker.gate.add_permits(CHUNKS.len());
    while tokio::time::timeout(DEADLINE, held.next())
        .await
        .expect("stream ends in time")
        .is_some()
    {}
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let resp = s
            .client
            .post(format!("{}/v1/chat/completions", s.base))
            .json(&chat_body(false))
            .send()
            .await
            .expect("send");
        if resp.status() == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the place was never freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_client_over_its_own_limit_gets_429() {
    let worker = Worker::default();
    let addr = start_worker(worker.clone()).await;
    let metrics = ListenerMetrics::unregistered().expect("metrics");
    let cfg = GatewayConfig {
        admission: AdmissionConfig {
            max_concurrent_requests: 100,
            max_concurrent_requests_per_client: 1,
        },
        metrics: metrics.clone(),
        ..GatewayConfig::default()
    };
    let s = gateway(vec![("w0".into(), format!("http://{addr}"))], cfg).await;
    let _held = hold_a_stream(&s).await;
    let resp = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat_body(false))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert_eq!(
        metrics.refused("gateway", Refusal::ClientConcurrencyLimit),
        1
    );
    assert_eq!(metrics.refused("gateway", Refusal::ConcurrencyLimit), 0);
    worker.gate.add_permits(CHUNKS.len());
}

#[tokio::test]
async fn a_full_decision_pool_sheds_with_503() {
    use kvroute_router::blocking_pool::{BlockingPool, Caller, PoolConfig};
    let pool = BlockingPool::unregistered(PoolConfig::new(1, 0)).expect("pool");
    let metrics = ListenerMetrics::unregistered().expect("metrics");
    let addr = start_worker(Worker::default()).await;
    let cfg = GatewayConfig {
        pool: pool.clone(),
        metrics: metrics.clone(),
        ..GatewayConfig::default()
    };
    let s = gateway(vec![("w0".into(), format!("http://{addr}"))], cfg).await;
    // Another caller (an explain, say) holds the pool's only thread.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (started, running) = tokio::sync::oneshot::channel();
    let busy = tokio::spawn({
        let pool = pool.clone();
        async move {
            pool.run(Caller::Explain, move || {
                let _ = started.send(());
                let _ = released.recv_timeout(DEADLINE);
            })
            .await
        }
    });
    tokio::time::timeout(DEADLINE, running)
        .await
        .expect("in time")
        .expect("started");
    let (got, v) = post_raw(&s, "/v1/chat/completions", chat_body(false).to_string()).await;
    assert_eq!(
        (got, v["error"]["code"].as_str()),
        (503, Some("overloaded"))
    );
    let resp = s
        .client
        .post(format!("{}/v1/messages", s.base))
        .json(&anthropic_body())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(metrics.refused("gateway", Refusal::DecisionPoolFull), 2);
    assert_eq!(pool.shed(Caller::Gateway), 2);
    assert!(s.router.ledger.lock().picks.is_empty());
    release.send(()).expect("release");
    busy.await.expect("join").expect("ran");
    let (got, _) = post_raw(&s, "/v1/chat/completions", chat_body(false).to_string()).await;
    assert_eq!(got, 200);
}
