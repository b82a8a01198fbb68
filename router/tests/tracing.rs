//! OpenTelemetry traces over real sockets: a client sends a W3C `traceparent` to the real
//! gateway; a mock worker (axum on 127.0.0.1:0) records the `traceparent` it receives; an
//! in-test OTLP collector (the OTLP TraceService over real gRPC on 127.0.0.1:0) records the
//! spans the router exports.
//!
//! ```text
//! client --traceparent T-P--> gateway --traceparent T-S--> mock worker
//!                                 '--OTLP/gRPC span S (trace T, parent P)--> collector
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use kvroute_router::gateway::openai::Usage;
use kvroute_router::gateway::{
    Dispatch, GatewayConfig, GatewayRequest, PickError, Picked, Resolved, router_with,
};
use kvroute_router::routing::AssignmentId;
use kvroute_router::traces::{
    ATTR_ERROR, ATTR_MODEL, ATTR_PREDICTED_TTFT, ATTR_REASON, ATTR_WORKER, SPAN_NAME, Traces,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use parking_lot::Mutex;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The OTLP collector: keeps every span it is sent.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        self.0.lock().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

async fn start_collector() -> (SocketAddr, Collector) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let collector = Collector::default();
    let service = TraceServiceServer::new(collector.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, collector)
}

/// The mock worker: answers a chat completion and keeps the `traceparent` it got.
#[derive(Clone, Default)]
struct Worker(Arc<Mutex<Vec<Option<String>>>>);

async fn worker_chat(State(w): State<Worker>, headers: HeaderMap) -> axum::Json<Value> {
    let tp = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    w.0.lock().push(tp);
    axum::Json(json!({
        "id": "c1", "object": "chat.completion", "model": "served",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    }))
}

async fn start_worker() -> (SocketAddr, Worker) {
    let w = Worker::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(worker_chat))
        .with_state(w.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, w)
}

/// Routes every request to the one worker with a fixed prediction.
struct OneWorker {
    address: String,
    next: AtomicU64,
}

impl Dispatch for OneWorker {
    fn model_names(&self) -> Vec<String> {
        vec!["served".into()]
    }
    fn resolve_model(&self, client_model: &str) -> Option<Resolved> {
        (client_model == "served").then(|| Resolved {
            backend_model: "served".into(),
            pool: None,
            alias: None,
            lora_base: None,
        })
    }
    fn pick(&self, request: &GatewayRequest<'_>, _exclude: &[String]) -> Result<Picked, PickError> {
        // `"user": "nobody"` plays a pool without a ready worker.
        if request.body.get("user").and_then(Value::as_str) == Some("nobody") {
            return Err(PickError::NoReadyWorker(request.client_model.into()));
        }
        Ok(Picked {
            assignment: AssignmentId(self.next.fetch_add(1, Ordering::SeqCst)),
            worker: "w0".into(),
            address: self.address.clone(),
            backend_model: request.resolved.backend_model.clone(),
            predicted_ttft_s: 0.0425,
            ttft_p90_bound_s: f64::NAN,
            reason: "lowest_predicted_ttft",
            degraded: false,
            policy: Default::default(),
            fallbacks: Vec::new(),
        })
    }
    fn first_token(&self, _picked: &Picked, _ttft: Duration) {}
    fn inter_token(&self, _picked: &Picked, _gap: Duration) {}
    fn done(&self, _picked: &Picked, _usage: Option<Usage>, _e2e: Duration) {}
    fn abort(&self, _picked: &Picked) {}
}

async fn start_gateway(worker: SocketAddr, traces: Option<Arc<Traces>>) -> String {
    let dispatch = Arc::new(OneWorker {
        address: worker.to_string(),
        next: AtomicU64::new(1),
    });
    let app = router_with(
        dispatch,
        GatewayConfig {
            traces,
            ..GatewayConfig::default()
        },
    )
    .expect("gateway");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

async fn chat(base: &str, traceparent: Option<&str>) {
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "served", "messages": [{"role": "user", "content": "hello"}]}));
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let resp = req.send().await.expect("send");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_span_is_exported_and_parents_the_request_to_the_worker() {
    let (collector_addr, collector) = start_collector().await;
    let (worker_addr, worker) = start_worker().await;
    let traces = Arc::new(Traces::otlp(&format!("http://{collector_addr}")).expect("exporter"));
    let base = start_gateway(worker_addr, Some(traces.clone())).await;

    let incoming = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    chat(&base, Some(&incoming)).await;

    // The worker got the same trace with a new parent: the router's span.
    let got = worker
        .0
        .lock()
        .first()
        .cloned()
        .flatten()
        .expect("traceparent at the worker");
    let parts: Vec<&str> = got.split('-').collect();
    assert_eq!(parts.len(), 4, "{got}");
    assert_eq!(parts[0], "00");
    assert_eq!(parts[1], TRACE_ID, "same trace id");
    assert_ne!(
        parts[2], CLIENT_SPAN,
        "the router's span is the parent, not the client's"
    );
    assert_eq!(parts[2].len(), 16);
    assert_eq!(parts[3], "01", "sampled");
    let router_span = parts[2].to_string();

    // The collector got that span, child of the client's, with the decision on it.
    let end = tokio::time::Instant::now() + DEADLINE;
    let span = loop {
        traces.flush();
        let found = collector
            .0
            .lock()
            .iter()
            .find(|s| hex(&s.span_id) == router_span)
            .cloned();
        if let Some(s) = found {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "the collector never got span {router_span}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(span.name, SPAN_NAME);
    assert_eq!(hex(&span.trace_id), TRACE_ID);
    assert_eq!(hex(&span.parent_span_id), CLIENT_SPAN);
    assert_eq!(
        attr(&span, ATTR_WORKER),
        Some(&AnyValue::StringValue("w0".into()))
    );
    assert_eq!(
        attr(&span, ATTR_PREDICTED_TTFT),
        Some(&AnyValue::DoubleValue(0.0425))
    );
    assert_eq!(
        attr(&span, ATTR_REASON),
        Some(&AnyValue::StringValue("lowest_predicted_ttft".into()))
    );
    assert_eq!(
        attr(&span, ATTR_MODEL),
        Some(&AnyValue::StringValue("served".into()))
    );

    // Without a client trace the router starts one, and the worker still gets a parent.
    chat(&base, None).await;
    let second = worker
        .0
        .lock()
        .get(1)
        .cloned()
        .flatten()
        .expect("traceparent");
    assert!(!second.contains(TRACE_ID), "{second}");
    assert_eq!(second.split('-').count(), 4, "{second}");

    // A decision that finds no worker is an error span in the client's trace.
    let other_trace = "0af7651916cd43dd8448eb211c80319c";
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .header("traceparent", format!("00-{other_trace}-{CLIENT_SPAN}-01"))
        .json(&json!({"model": "served", "user": "nobody", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 503);
    let end = tokio::time::Instant::now() + DEADLINE;
    let failed = loop {
        traces.flush();
        let found = collector
            .0
            .lock()
            .iter()
            .find(|s| hex(&s.trace_id) == other_trace)
            .cloned();
        if let Some(s) = found {
            break s;
        }
        assert!(tokio::time::Instant::now() < end, "no error span");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(hex(&failed.parent_span_id), CLIENT_SPAN);
    assert_eq!(
        attr(&failed, ATTR_ERROR),
        Some(&AnyValue::StringValue("no_ready_worker".into()))
    );
    assert_eq!(
        failed.status.as_ref().map(|s| s.code),
        Some(2),
        "STATUS_CODE_ERROR"
    );
    assert_eq!(worker.0.lock().len(), 2, "nothing reached the worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_traces_off_the_client_context_passes_through_unchanged() {
    let (worker_addr, worker) = start_worker().await;
    let base = start_gateway(worker_addr, None).await;
    let incoming = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    chat(&base, Some(&incoming)).await;
    chat(&base, None).await;
    let seen = worker.0.lock().clone();
    assert_eq!(seen, vec![Some(incoming), None]);
}
