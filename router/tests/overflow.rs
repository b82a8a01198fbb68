//! Overflow over real HTTPS: a fake provider (axum behind rustls on 127.0.0.1:0, a test CA
//! from `kvroute_tls::testpki`) that checks the API key and streams chunks the test releases
//! one by one, behind the real gateway with a fake local router whose policy plan and local
//! state each test sets.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use kvroute_crds::{AnyResource, parse_documents};
use kvroute_router::gateway::openai::Usage;
use kvroute_router::gateway::{
    Dispatch, GatewayConfig, GatewayRequest, OverflowPlan, PickError, Picked, Resolved, router_with,
};
use kvroute_router::provider::{
    ClientApi, ClientTimeouts, OverflowAction, ProviderMetrics, ProviderState, ProviderUsage,
    Providers, ProvidersConfig, RelayRequest,
};
use kvroute_router::routing::AssignmentId;
use kvroute_router::state::PolicyHooks;
use kvroute_router::tenant::identity::Cidr;
use kvroute_router::tenant::{LimitSpec, PoolAuth, TENANT_HEADER, TenantConfig, Tenants};
use kvroute_tls::testpki::TestCa;
use parking_lot::Mutex;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

const DEADLINE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- fake provider

#[derive(Clone)]
struct Provider {
    /// The key it accepts (`Authorization: Bearer` on OpenAI routes, `x-api-key` on Anthropic).
    key: Arc<Mutex<String>>,
    /// Each chunk after the first waits for a permit from the test.
    gate: Arc<Semaphore>,
    /// (path, headers, body) of every request that reached it.
    seen: Arc<Mutex<Vec<(String, HeaderMap, Value)>>>,
}

impl Provider {
    fn new(key: &str) -> Self {
        Self {
            key: Arc::new(Mutex::new(key.into())),
            gate: Arc::new(Semaphore::new(0)),
            seen: Arc::default(),
        }
    }

    fn requests(&self) -> usize {
        self.seen.lock().len()
    }
}

fn unauthorized() -> Response {
    let e = json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}});
    (StatusCode::UNAUTHORIZED, e.to_string()).into_response()
}

fn sse(stream: impl futures::Stream<Item = String> + Send + 'static) -> Response {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(
            stream.map(Ok::<_, std::convert::Infallible>),
        ))
        .expect("response")
}

async fn openai_chat(
    State(p): State<Provider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    p.seen
        .lock()
        .push(("/v1/chat/completions".into(), headers.clone(), v.clone()));
    let want = format!("Bearer {}", p.key.lock());
    if headers.get("authorization").and_then(|h| h.to_str().ok()) != Some(want.as_str()) {
        return unauthorized();
    }
    let model = v["model"].as_str().unwrap_or_default().to_string();
    let usage = json!({"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14});
    if v["stream"] != json!(true) {
        let r = json!({"id": "chatcmpl-p", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "from the provider"}, "finish_reason": "stop"}],
            "usage": usage});
        return ([("content-type", "application/json")], r.to_string()).into_response();
    }
    let gate = p.gate.clone();
    sse(async_stream::stream! {
        for (i, c) in ["one", " two", " three"].iter().enumerate() {
            if i > 0 && let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
            let chunk = json!({"id": "chatcmpl-p", "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": {"content": c}, "finish_reason": null}]});
            yield format!("data: {chunk}\n\n");
        }
        let fin = json!({"id": "chatcmpl-p", "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        let u = json!({"id": "chatcmpl-p", "object": "chat.completion.chunk", "model": model,
            "choices": [], "usage": usage});
        yield format!("data: {fin}\n\ndata: {u}\n\ndata: [DONE]\n\n");
    })
}

async fn anthropic_messages(
    State(p): State<Provider>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    p.seen
        .lock()
        .push(("/v1/messages".into(), headers.clone(), v.clone()));
    let key = p.key.lock().clone();
    if headers.get("x-api-key").and_then(|h| h.to_str().ok()) != Some(key.as_str())
        || headers.get("anthropic-version").is_none()
    {
        return unauthorized();
    }
    let model = v["model"].as_str().unwrap_or_default().to_string();
    let gate = p.gate.clone();
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    sse(async_stream::stream! {
        yield event("message_start", json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "model": model, "content": [], "usage": {"input_tokens": 7, "output_tokens": 1}}}));
        yield event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
        for (i, c) in ["Bon", "jour"].iter().enumerate() {
            if i > 0 && let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
            yield event("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": c}}));
        }
        yield event("content_block_stop", json!({"type": "content_block_stop", "index": 0}));
        yield event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}));
        yield event("message_stop", json!({"type": "message_stop"}));
    })
}

/// Serves the fake provider over TLS with a certificate for `names`; returns its address.
async fn start_provider(p: Provider, ca: &TestCa, names: &[&str]) -> SocketAddr {
    let leaf = ca.leaf(None, names);
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("certs");
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("key");
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let app = Router::new()
        .route("/v1/chat/completions", post(openai_chat))
        .route("/v1/messages", post(anthropic_messages))
        .with_state(p);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // Handshake failures (a client that does not trust us) just end the connection.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .await;
            });
        }
    });
    addr
}

// ---------------------------------------------------------------- fake local router

/// A local pool of one worker whose predicted TTFT (or absence) and policy plan the test sets.
struct Local {
    worker: String,
    ttft_s: f64,
    saturated: bool,
    plan: OverflowPlan,
    in_flight: Mutex<Vec<u64>>,
    picks: AtomicU64,
    /// The pool's auth (`None`: no pool, every request anonymous).
    auth: Option<Arc<PoolAuth>>,
    /// The gateway's tenants (limits and series) in front of this pool.
    tenants: Arc<Tenants>,
}

impl Local {
    fn new(worker: SocketAddr, ttft_s: f64, saturated: bool, plan: OverflowPlan) -> Arc<Self> {
        Arc::new(Self {
            worker: worker.to_string(),
            ttft_s,
            saturated,
            plan,
            in_flight: Mutex::new(Vec::new()),
            picks: AtomicU64::new(0),
            auth: None,
            tenants: Tenants::unregistered(),
        })
    }

    /// The same pool behind auth that believes the tenant header from loopback, with
    /// `tenants` in front of it.
    fn trusting_loopback(
        worker: SocketAddr,
        ttft_s: f64,
        plan: OverflowPlan,
        tenants: Arc<Tenants>,
    ) -> Arc<Self> {
        let mut local = Arc::into_inner(Self::new(worker, ttft_s, false, plan)).expect("one");
        local.tenants = tenants;
        local.auth = Some(Arc::new(PoolAuth {
            api_key_secrets: Vec::new(),
            jwt: None,
            trusted_peers: vec![Cidr::parse("127.0.0.1/32").expect("cidr")],
            allow_anonymous: false,
        }));
        Arc::new(local)
    }
}

impl Dispatch for Local {
    fn model_names(&self) -> Vec<String> {
        vec!["local-llm".into()]
    }
    fn resolve_model(&self, client_model: &str) -> Option<Resolved> {
        (client_model == "local-llm").then(|| Resolved {
            backend_model: "local-llm".into(),
            pool: self.auth.as_ref().map(|_| "pool".to_string()),
            alias: None,
            lora_base: None,
        })
    }
    fn pick(&self, request: &GatewayRequest<'_>, _exclude: &[String]) -> Result<Picked, PickError> {
        if self.saturated {
            return Err(PickError::NoReadyWorker(request.client_model.into()));
        }
        let id = self.picks.fetch_add(1, Ordering::SeqCst);
        self.in_flight.lock().push(id);
        Ok(Picked {
            assignment: AssignmentId(id),
            worker: "w0".into(),
            address: self.worker.clone(),
            backend_model: "local-llm".into(),
            predicted_ttft_s: self.ttft_s,
            ttft_p90_bound_s: f64::NAN,
            reason: "lowest_predicted_ttft",
            degraded: false,
            fallbacks: Vec::new(),
            // What the policy engine would say of this pick under the plan's rule.
            policy: PolicyHooks {
                overflow: self.plan.action.as_ref().map(|a| {
                    let over = a
                        .ttft_threshold_ms
                        .is_some_and(|t| self.ttft_s * 1000.0 > t as f64);
                    (a.provider.clone(), over)
                }),
                local_only: self.plan.stay_local,
                stay_local: self.plan.stay_local,
                ..PolicyHooks::default()
            },
        })
    }
    fn first_token(&self, _picked: &Picked, _ttft: Duration) {}
    fn inter_token(&self, _picked: &Picked, _gap: Duration) {}
    fn done(&self, picked: &Picked, _usage: Option<Usage>, _e2e: Duration) {
        self.in_flight.lock().retain(|i| *i != picked.assignment.0);
    }
    fn abort(&self, picked: &Picked) {
        self.in_flight.lock().retain(|i| *i != picked.assignment.0);
    }
    fn overflow_plan(&self, _request: &GatewayRequest<'_>) -> OverflowPlan {
        self.plan.clone()
    }
    fn pool_auth(&self, _pool: &str) -> Option<Arc<PoolAuth>> {
        self.auth.clone()
    }
}

async fn local_worker() -> SocketAddr {
    async fn answer() -> Response {
        let r = json!({"id": "chatcmpl-l", "object": "chat.completion", "model": "local-llm",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "from the local worker"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4}});
        ([("content-type", "application/json")], r.to_string()).into_response()
    }
    let app = Router::new().route("/v1/chat/completions", post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

// ---------------------------------------------------------------- setup

struct Setup {
    base: String,
    providers: Providers,
    local: Arc<Local>,
    secrets: tempfile::TempDir,
    usage: Arc<Mutex<Vec<ProviderUsage>>>,
    tenants: Arc<Tenants>,
    client: reqwest::Client,
}

fn write_secret(dir: &std::path::Path, name: &str, key: &str, value: &str) {
    std::fs::create_dir_all(dir.join(name)).expect("mkdir");
    std::fs::write(dir.join(name).join(key), value).expect("write");
}

/// Objects for an OpenAI provider `cloud` and an Anthropic provider `claude`, both on `addr`.
fn objects(addr: SocketAddr, sni: Option<&str>, limits: &str) -> String {
    let tls = match sni {
        Some(name) => format!("{{caSecretRef: {{name: provider-ca, key: ca.crt}}, sni: {name}}}"),
        None => "{caSecretRef: {name: provider-ca, key: ca.crt}}".into(),
    };
    format!(
        r#"apiVersion: kvroute.dev/v1alpha1
kind: InferenceProvider
metadata: {{name: cloud, namespace: ns}}
spec: {{kind: openai, models: [gpt-x], gatewayBackendRef: {{name: oai}}{limits}}}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceProvider
metadata: {{name: claude, namespace: ns}}
spec: {{kind: anthropic, models: [claude-x], gatewayBackendRef: {{name: anth}}}}
---
apiVersion: kvroute.dev/v1alpha1
kind: GatewayBackend
metadata: {{name: oai, namespace: ns}}
spec:
  url: https://127.0.0.1:{port}
  tls: {tls}
  auth: {{secretRef: {{name: oai-key, key: apiKey}}}}
---
apiVersion: kvroute.dev/v1alpha1
kind: GatewayBackend
metadata: {{name: anth, namespace: ns}}
spec:
  url: https://127.0.0.1:{port}/
  tls: {tls}
  auth: {{secretRef: {{name: anth-key, key: apiKey}}, type: header, headerName: x-api-key}}
"#,
        port = addr.port()
    )
}

async fn setup(
    ca: &TestCa,
    provider_addr: SocketAddr,
    key: &str,
    sni: Option<&str>,
    limits: &str,
    local: Arc<Local>,
) -> Setup {
    let tenants = local.tenants.clone();
    let secrets = tempfile::tempdir().expect("tempdir");
    write_secret(secrets.path(), "provider-ca", "ca.crt", ca.pem());
    write_secret(secrets.path(), "oai-key", "apiKey", &format!("{key}\n"));
    write_secret(secrets.path(), "anth-key", "apiKey", key);
    let providers = Providers::new(
        ProvidersConfig {
            secrets_dir: Some(secrets.path().to_path_buf()),
            timeouts: ClientTimeouts {
                connect: Duration::from_secs(5),
                first_byte: DEADLINE,
                idle: DEADLINE,
            },
        },
        ProviderMetrics::unregistered(),
    );
    let (mut ps, mut bs) = (Vec::new(), Vec::new());
    for d in parse_documents(&objects(provider_addr, sni, limits)).expect("objects") {
        match d {
            AnyResource::Provider(p) => ps.push(p),
            AnyResource::GatewayBackend(b) => bs.push(b),
            _ => {}
        }
    }
    providers.apply(ps, bs);
    let usage: Arc<Mutex<Vec<ProviderUsage>>> = Arc::default();
    let sink = usage.clone();
    providers.set_usage_hook(Arc::new(move |u| sink.lock().push(u.clone())));
    let cfg = GatewayConfig {
        providers: Some(providers.clone()),
        expose_routing_headers: true,
        tenants: tenants.clone(),
        ..GatewayConfig::default()
    };
    let app = router_with(local.clone(), cfg).expect("gateway");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        // with the peer's address, as the router serves it (trusted-peer tenants need it)
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        let _ = axum::serve(listener, app).await;
    });
    Setup {
        base: format!("http://{addr}"),
        providers,
        local,
        secrets,
        usage,
        tenants,
        client: reqwest::Client::new(),
    }
}

fn overflow_to(provider: &str, stay_local: bool) -> OverflowPlan {
    OverflowPlan {
        action: Some(OverflowAction {
            provider: provider.into(),
            ttft_threshold_ms: Some(500),
            queue_threshold: None,
        }),
        stay_local,
        tenant: Some("team-a".into()),
        best_local_queue: None,
        limits: None,
        class: None,
    }
}

fn chat(stream: bool) -> Value {
    json!({"model": "local-llm", "messages": [{"role": "user", "content": "hi"}], "stream": stream, "max_tokens": 8})
}

fn messages(stream: bool) -> Value {
    json!({"model": "local-llm", "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "salut"}]})
}

/// Reads SSE events (blank-line separated) until `n` have arrived.
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

async fn rest(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buf: &mut String,
) -> String {
    while let Some(chunk) = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("chunk in time")
    {
        buf.push_str(std::str::from_utf8(&chunk.expect("chunk")).expect("utf8"));
    }
    std::mem::take(buf)
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn slow_local_overflows_and_streams_token_by_token_with_usage() {
    let ca = TestCa::new("provider");
    let provider = Provider::new("sk-good");
    let addr = start_provider(provider.clone(), &ca, &["127.0.0.1"]).await;
    let local = Local::new(
        local_worker().await,
        2.0,
        false,
        overflow_to("cloud", false),
    );
    let s = setup(&ca, addr, "sk-good", None, "", local).await;
    assert_eq!(
        s.providers.status()["cloud"],
        ProviderState::Ready { insecure: false }
    );

    let resp = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat(true))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-kvroute-provider"], "cloud");
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    // The first token arrives while the provider still holds the rest back.
    let first = read_events(&mut stream, &mut buf, 1).await;
    assert!(first[0].contains("\"one\""), "{first:?}");
    assert_eq!(provider.gate.available_permits(), 0);
    // The request's tenant series (anonymous: no pool auth) have its first token already,
    // and no tokens until its usage arrives at the end.
    let tm = &s.tenants.metrics;
    let series = ["local-llm", "default", "anonymous"];
    assert_eq!(tm.ttft.with_label_values(&series).get_sample_count(), 1);
    let tokens = |kind: &str| {
        tm.tokens
            .with_label_values(&["local-llm", "default", "anonymous", kind])
            .get()
    };
    assert_eq!(tokens("prompt"), 0);
    provider.gate.add_permits(1);
    let second = read_events(&mut stream, &mut buf, 1).await;
    assert!(second[0].contains("\" two\""), "{second:?}");
    provider.gate.add_permits(1);
    let tail = rest(&mut stream, &mut buf).await;
    assert!(
        tail.contains("\" three\"") && tail.ends_with("data: [DONE]\n\n"),
        "{tail}"
    );
    // The client did not ask for the usage chunk: it is counted, not relayed.
    assert!(!tail.contains("\"usage\""), "{tail}");

    // The provider got the provider's model, the key, and no client credentials.
    let seen = provider.seen.lock().clone();
    assert_eq!(seen.len(), 1);
    let (path, headers, body) = &seen[0];
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(body["model"], "gpt-x");
    assert_eq!(body["stream_options"]["include_usage"], true);
    assert_eq!(headers["authorization"], "Bearer sk-good");
    // The local assignment was released.
    assert!(s.local.in_flight.lock().is_empty());
    let m = s.providers.metrics();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while m.requests.with_label_values(&["cloud", "ok"]).get() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "request counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(m.tokens.with_label_values(&["cloud", "prompt"]).get(), 11);
    assert_eq!(
        m.tokens.with_label_values(&["cloud", "completion"]).get(),
        3
    );
    assert_eq!(m.ttft.with_label_values(&["cloud"]).get_sample_count(), 1);
    assert_eq!(m.in_flight.with_label_values(&["cloud"]).get(), 0);
    let usage = s.usage.lock().clone();
    assert_eq!(usage.len(), 1);
    assert_eq!(
        (
            usage[0].tenant.as_deref(),
            usage[0].prompt_tokens,
            usage[0].completion_tokens
        ),
        // The tenant is the verified one of the request (anonymous here: no pool auth).
        (None, 11, 3)
    );
    // ... and the tenant's series count the provider's usage.
    assert_eq!((tokens("prompt"), tokens("completion")), (11, 3));
    assert_eq!(tm.requests.with_label_values(&series).get(), 1);
}

#[tokio::test]
async fn an_overflowed_request_settles_its_tenants_tokens_and_reports_its_first_token() {
    let ca = TestCa::new("provider");
    let provider = Provider::new("sk-good");
    let addr = start_provider(provider.clone(), &ca, &["127.0.0.1"]).await;
    // Room for one request's estimate and 16 tokens more: a second request fits only if the
    // first one's charge was settled to the provider's usage (11 + 3 = 14 tokens).
    let body = serde_json::to_vec(&chat(false)).expect("json");
    let estimate = (body.len() as u64).div_ceil(4) + 8;
    assert!(
        estimate > 16 + 2,
        "the test needs an estimate above 18: {estimate}"
    );
    let tenants = Tenants::new(
        &TenantConfig {
            default_limits: Some(LimitSpec {
                tokens_per_minute: Some(estimate + 16),
                ..LimitSpec::default()
            }),
            metrics_allow: vec!["team-a".into()],
            ..TenantConfig::default()
        },
        &prometheus::Registry::new(),
    )
    .expect("tenants");
    let worker = local_worker().await;
    let local = Local::trusting_loopback(worker, 2.0, overflow_to("cloud", false), tenants);
    let s = setup(&ca, addr, "sk-good", None, "", local).await;
    let send = || {
        s.client
            .post(format!("{}/v1/chat/completions", s.base))
            .header(TENANT_HEADER, "team-a")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
    };
    let first = send().await.expect("send");
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["x-kvroute-provider"], "cloud");
    let answer: Value = first.json().await.expect("json");
    assert_eq!(answer["usage"]["prompt_tokens"], 11);
    let tm = &s.tenants.metrics;
    let tokens = |kind: &str| {
        tm.tokens
            .with_label_values(&["local-llm", "default", "team-a", kind])
            .get()
    };
    assert_eq!((tokens("prompt"), tokens("completion")), (11, 3));
    assert_eq!(
        tm.ttft
            .with_label_values(&["local-llm", "default", "team-a"])
            .get_sample_count(),
        1
    );
    // The estimate was refunded down to 14 tokens: the second request fits.
    let second = send().await.expect("send");
    assert_eq!(second.status(), 200, "{:?}", second.text().await);
    assert_eq!(tokens("prompt"), 22);
    // The third does not (about 14 tokens of room left, and no minute has passed).
    let third = send().await.expect("send");
    assert_eq!(third.status(), 429);
    assert_eq!(provider.requests(), 2);
    assert!(s.local.in_flight.lock().is_empty());
}

#[tokio::test]
async fn fast_local_stays_local() {
    let ca = TestCa::new("provider");
    let provider = Provider::new("sk-good");
    let addr = start_provider(provider.clone(), &ca, &["127.0.0.1"]).await;
    let local = Local::new(
        local_worker().await,
        0.1,
        false,
        overflow_to("cloud", false),
    );
    let s = setup(&ca, addr, "sk-good", None, "", local).await;
    let r = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat(false))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "from the local worker"
    );
    assert_eq!(provider.requests(), 0);
}

#[tokio::test]
async fn wrong_key_is_a_clear_error_without_internals() {
    let ca = TestCa::new("provider");
    let provider = Provider::new("sk-good");
    let addr = start_provider(provider.clone(), &ca, &["127.0.0.1"]).await;
    let local = Local::new(local_worker().await, 0.0, true, overflow_to("cloud", false));
    let s = setup(&ca, addr, "sk-wrong", None, "", local).await;
    let r = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat(true))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 502);
    let text = r.text().await.expect("body");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["error"]["code"], "provider_error");
    assert_eq!(
        v["error"]["message"],
        "the overflow provider failed: the provider refused the router's credentials"
    );
    for secret in [
        "sk-wrong",
        "sk-good",
        &addr.port().to_string(),
        "127.0.0.1",
        "Incorrect API key",
    ] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
    assert_eq!(provider.requests(), 1);
    assert_eq!(
        s.providers
            .metrics()
            .requests
            .with_label_values(&["cloud", "auth_error"])
            .get(),
        1
    );

    // Rotating the Secret fixes it without a restart.
    write_secret(s.secrets.path(), "oai-key", "apiKey", "sk-good");
    assert!(s.providers.refresh_secrets());
    let r = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat(false))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "from the provider");
    assert_eq!(v["model"], "gpt-x");
}

#[tokio::test]
async fn sni_override_is_what_the_certificate_is_checked_against() {
    let ca = TestCa::new("provider");
    let provider = Provider::new("sk-good");
    // The certificate names only provider.test, while the URL says 127.0.0.1.
    let addr = start_provider(provider.clone(), &ca, &["provider.test"]).await;
    let local = Local::new(local_worker().await, 0.0, true, overflow_to("cloud", false));
    let with_sni = setup(
        &ca,
        addr,
        "sk-good",
        Some("provider.test"),
        "",
        local.clone(),
    )
    .await;
    let r = with_sni
        .client
        .post(format!("{}/v1/chat/completions", with_sni.base))
        .json(&chat(false))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);

    let without = setup(&ca, addr, "sk-good", None, "", local).await;
    let r = without
        .client
        .post(format!("{}/v1/chat/completions", without.base))
        .json(&chat(false))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("TLS handshake")),
        "{v}"
    );
    assert_eq!(provider.requests(), 1);
}

#[tokio::test]
async fn anthropic_clients_go_to_anthropic_and_openai_providers() {
    let ca = TestCa::new("provider");
    let provider = Provider::new("k-1");
    let addr = start_provider(provider.clone(), &ca, &["127.0.0.1"]).await;

    // Anthropic -> Anthropic: passed through event by event, usage from message_delta.
    let local = Local::new(
        local_worker().await,
        0.0,
        true,
        overflow_to("claude", false),
    );
    let s = setup(&ca, addr, "k-1", None, "", local).await;
    let resp = s
        .client
        .post(format!("{}/v1/messages", s.base))
        .header("anthropic-version", "2023-06-01")
        .header("x-api-key", "the-clients-own-key")
        .json(&messages(true))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let head = read_events(&mut stream, &mut buf, 3).await;
    assert!(head[2].contains("\"Bon\""), "{head:?}");
    provider.gate.add_permits(1);
    let tail = rest(&mut stream, &mut buf).await;
    assert!(
        tail.contains("\"jour\"") && tail.contains("event: message_stop"),
        "{tail}"
    );
    let (path, headers, body) = provider.seen.lock()[0].clone();
    assert_eq!(path, "/v1/messages");
    assert_eq!(body["model"], "claude-x");
    assert_eq!(headers["x-api-key"], "k-1");
    let m = s.providers.metrics();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while m.tokens.with_label_values(&["claude", "completion"]).get() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "usage counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(m.tokens.with_label_values(&["claude", "prompt"]).get(), 7);
    assert_eq!(
        m.tokens.with_label_values(&["claude", "completion"]).get(),
        2
    );

    // Anthropic -> OpenAI provider: translated both ways.
    let local = Local::new(local_worker().await, 0.0, true, overflow_to("cloud", false));
    let s = setup(&ca, addr, "k-1", None, "", local).await;
    let r = s
        .client
        .post(format!("{}/v1/messages", s.base))
        .json(&messages(false))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "from the provider");
    assert_eq!(v["usage"]["output_tokens"], 3);
    let (path, _, body) = provider.seen.lock()[1].clone();
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(body["messages"][0]["content"], "salut");

    // OpenAI -> Anthropic provider: refused with a reason (no local worker either).
    let local = Local::new(
        local_worker().await,
        0.0,
        true,
        overflow_to("claude", false),
    );
    let s = setup(&ca, addr, "k-1", None, "", local).await;
    let r = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat(false))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "provider_unavailable");
    assert_eq!(provider.requests(), 2);
}

#[tokio::test]
async fn local_only_and_pii_never_leave_the_cluster() {
    let ca = TestCa::new("provider");
    let provider = Provider::new("sk-good");
    let addr = start_provider(provider.clone(), &ca, &["127.0.0.1"]).await;
    // Saturated and slow: every threshold says overflow, but the request must stay.
    let local = Local::new(local_worker().await, 0.0, true, overflow_to("cloud", true));
    let s = setup(&ca, addr, "sk-good", None, "", local).await;
    for (path, body) in [
        ("/v1/chat/completions", chat(true)),
        ("/v1/messages", messages(false)),
    ] {
        let r = s
            .client
            .post(format!("{}{path}", s.base))
            .json(&body)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 503, "{path}");
        let v: Value = r.json().await.expect("json");
        let message = if path == "/v1/messages" {
            assert_eq!(v["error"]["type"], "overloaded_error");
            &v["error"]["message"]
        } else {
            assert_eq!(v["error"]["code"], "no_local_capacity");
            &v["error"]["message"]
        };
        assert!(
            message
                .as_str()
                .is_some_and(|m| m.contains("must stay on local workers")),
            "{v}"
        );
    }
    // Direct calls of the entry point refuse too.
    let r = s
        .providers
        .relay(
            "cloud",
            RelayRequest {
                api: ClientApi::Chat,
                raw: bytes::Bytes::from(chat(false).to_string()),
                client_model: "local-llm".into(),
                backend_model: "local-llm".into(),
                headers: HeaderMap::new(),
                tenant: None,
            },
            true,
        )
        .await;
    assert_eq!(r.status(), 503);
    assert_eq!(provider.requests(), 0);
    assert_eq!(
        s.providers
            .metrics()
            .refused
            .with_label_values(&["cloud", "stays_local"])
            .get(),
        3
    );
}

#[tokio::test]
async fn provider_limits_keep_requests_local_or_refuse_them() {
    let ca = TestCa::new("provider");
    let provider = Provider::new("sk-good");
    let addr = start_provider(provider.clone(), &ca, &["127.0.0.1"]).await;
    let limits = ", limits: {requestsPerMinute: 1}";
    // Slow local worker: the first request overflows, the second stays local (limit reached).
    let local = Local::new(
        local_worker().await,
        2.0,
        false,
        overflow_to("cloud", false),
    );
    let s = setup(&ca, addr, "sk-good", None, limits, local).await;
    let mut answers = Vec::new();
    for _ in 0..2 {
        let r = s
            .client
            .post(format!("{}/v1/chat/completions", s.base))
            .json(&chat(false))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("json");
        answers.push(v["choices"][0]["message"]["content"].clone());
    }
    assert_eq!(
        answers,
        vec![json!("from the provider"), json!("from the local worker")]
    );

    // Saturated local pool: over the limit the client gets 429 with Retry-After.
    let local = Local::new(local_worker().await, 0.0, true, overflow_to("cloud", false));
    let s = setup(&ca, addr, "sk-good", None, limits, local).await;
    let ok = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat(false))
        .send()
        .await
        .expect("send");
    assert_eq!(ok.status(), 200);
    let r = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&chat(false))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("requests per minute")),
        "{v}"
    );
    assert_eq!(provider.requests(), 2);
}

// ---------------------------------------------------------------- the router process

/// The value of one series in the router's `/metrics`, if present.
async fn scrape(admin: SocketAddr, series: &str) -> Option<f64> {
    let text = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
}

async fn metric_becomes(admin: SocketAddr, series: &str, want: f64) {
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        let v = scrape(admin, series).await;
        if v == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{series} stayed at {v:?}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_router_loads_providers_from_its_file_and_rereads_secrets() {
    let ca = TestCa::new("provider");
    let dir = tempfile::tempdir().expect("tempdir");
    let secrets = dir.path().join("secrets");
    write_secret(&secrets, "provider-ca", "ca.crt", ca.pem());
    // The key comes from a Secret document of the file (file mode), the CA from the mount.
    let config = dir.path().join("router.yaml");
    let text = format!(
        "{}---\napiVersion: v1\nkind: Secret\nmetadata: {{name: oai-key}}\nstringData: {{apiKey: sk-1}}\n",
        objects("127.0.0.1:1".parse().expect("addr"), None, "")
    );
    std::fs::write(&config, text).expect("write config");
    let args = kvroute_router::Args {
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        admin_addr: "127.0.0.1:0".parse().expect("addr"),
        config: Some(config),
        secrets_dir: Some(secrets.clone()),
        seed: Some(7),
        ..kvroute_router::Args::default()
    };
    let server = kvroute_router::Server::bind(args)
        .await
        .expect("bind router");
    let admin = server.addrs().expect("addrs").admin;
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(server.serve(stop.clone()));
    let ready = |p: &str| format!("kvroute_router_provider_ready{{provider=\"{p}\"}}");
    metric_becomes(admin, &ready("cloud"), 1.0).await;
    // `claude`'s key (anth-key) exists nowhere.
    metric_becomes(admin, &ready("claude"), 0.0).await;
    // A CA bundle replaced by junk is noticed by the Secret poll: not ready any more.
    write_secret(&secrets, "provider-ca", "ca.crt", "junk");
    metric_becomes(admin, &ready("cloud"), 0.0).await;
    write_secret(&secrets, "provider-ca", "ca.crt", ca.pem());
    metric_becomes(admin, &ready("cloud"), 1.0).await;
    stop.cancel();
}
