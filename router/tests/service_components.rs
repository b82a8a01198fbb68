//! Component tests of the router service over real sockets (127.0.0.1:0): a tonic client
//! plays the sidecar (Ingest) and the external gateway (Picker); reqwest reads the admin API.

use std::time::{Duration, Instant};

use kvroute_proto::v1::ingest_client::IngestClient;
use kvroute_proto::v1::picker_client::PickerClient;
use kvroute_proto::v1::{
    Delta, DeltaOp, GpuStats, IngestControl, LoadSample, PickRequest, ReportDoneRequest,
    ReportFirstTokenRequest, SnapshotChunk, WorkerIdentity, WorkerReport, delta_op, ingest_control,
    pick_response, worker_report,
};
use kvroute_router::state::{PickInput, Prompt};
use kvroute_router::{Addrs, Args, Server};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

const BLOCK: usize = 16;
const MODEL: &str = "tiny";

/// A router on loopback, stopped when dropped.
struct Router {
    addrs: Addrs,
    state: kvroute_router::state::RouterState,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Router {
    async fn start(edit: impl FnOnce(&mut Args)) -> Router {
        let mut args = Args {
            http_addr: "127.0.0.1:0".parse().expect("addr"),
            grpc_addr: "127.0.0.1:0".parse().expect("addr"),
            admin_addr: "127.0.0.1:0".parse().expect("addr"),
            route_unlisted: true,
            seed: Some(7),
            ..Args::default()
        };
        edit(&mut args);
        let server = Server::bind(args).await.expect("bind router");
        let addrs = server.addrs().expect("addrs");
        let state = server.state().clone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(server.serve(stop.clone()));
        Router {
            addrs,
            state,
            stop,
            task: Some(task),
        }
    }

    fn grpc_url(&self) -> String {
        format!("http://{}", self.addrs.grpc)
    }

    fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addrs.admin)
    }

    async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let res = tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("router stops")
                .expect("join");
            res.expect("router exits cleanly");
        }
    }
}

/// Polls `f` until it returns true; fails after 15 s.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tokens(n: u32, offset: u32) -> Vec<u32> {
    (offset..offset + n).collect()
}

fn chain(toks: &[u32]) -> Vec<u64> {
    kvroute_hash::chain(kvroute_hash::root_hash(MODEL, None), toks, BLOCK, &[])
}

fn identity(worker: &str, address: &str, epoch: u64) -> WorkerIdentity {
    WorkerIdentity {
        worker_id: worker.into(),
        pod: worker.rsplit('/').next().unwrap_or(worker).into(),
        namespace: "default".into(),
        address: address.into(),
        model: MODEL.into(),
        block_size: BLOCK as u32,
        epoch,
        worker_set: String::new(),
    }
}

fn snapshot(
    seq: u64,
    id: Option<WorkerIdentity>,
    blocks: Vec<u64>,
    first: bool,
    last: bool,
) -> WorkerReport {
    WorkerReport {
        seq,
        body: Some(worker_report::Body::Snapshot(SnapshotChunk {
            identity: id,
            first,
            last,
            blocks,
        })),
    }
}

fn stored(seq: u64, blocks: Vec<u64>) -> WorkerReport {
    WorkerReport {
        seq,
        body: Some(worker_report::Body::Delta(Delta {
            ops: vec![DeltaOp {
                kind: delta_op::Kind::Stored as i32,
                blocks,
            }],
        })),
    }
}

fn load(seq: u64, waiting: u32) -> WorkerReport {
    WorkerReport {
        seq,
        body: Some(worker_report::Body::Load(LoadSample {
            timestamp_ms: 1,
            num_requests_waiting: waiting,
            num_requests_running: 0,
            kv_cache_usage: 0.1,
            gpu: None,
            scrape_failed: false,
            kv_capacity_tokens: 0,
            gpus: Vec::new(),
            lora_adapters: None,
        })),
    }
}

/// A load sample with one GPU whose clocks carry `throttle_reasons`.
fn load_with_gpu(seq: u64, throttle_reasons: u64) -> WorkerReport {
    let gpu = GpuStats {
        utilization_percent: 90,
        memory_used_bytes: 40 << 30,
        memory_total_bytes: 48 << 30,
        temperature_celsius: if throttle_reasons == 0 { 60 } else { 92 },
        power_milliwatts: 300_000,
        sm_clock_mhz: 1_500,
        index: 0,
        uuid: format!("GPU-{seq}-{throttle_reasons}"),
        throttle_reasons,
        ..GpuStats::default()
    };
    let mut r = load(seq, 0);
    if let Some(worker_report::Body::Load(l)) = r.body.as_mut() {
        l.gpu = Some(gpu.clone());
        l.gpus = vec![gpu];
    }
    r
}

/// A fake sidecar stream.
struct Sidecar {
    tx: Option<mpsc::Sender<WorkerReport>>,
    rx: Streaming<IngestControl>,
}

impl Sidecar {
    async fn connect(url: &str, first: WorkerReport) -> Result<Sidecar, tonic::Status> {
        let mut client = IngestClient::connect(url.to_string())
            .await
            .expect("connect ingest");
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.expect("queue first report");
        let resp = client.report(ReceiverStream::new(rx)).await?;
        Ok(Sidecar {
            tx: Some(tx),
            rx: resp.into_inner(),
        })
    }

    async fn send(&self, r: WorkerReport) {
        self.tx
            .as_ref()
            .expect("open")
            .send(r)
            .await
            .expect("send report");
    }

    async fn next(&mut self) -> Result<IngestControl, tonic::Status> {
        match tokio::time::timeout(Duration::from_secs(10), self.rx.next()).await {
            Ok(Some(r)) => r,
            Ok(None) => Err(tonic::Status::cancelled("control stream ended")),
            Err(_) => panic!("no control message within 10 s"),
        }
    }

    async fn expect_ack(&mut self, seq: u64) {
        match self.next().await.expect("control").body {
            Some(ingest_control::Body::Ack(a)) => assert_eq!(a.seq, seq),
            other => panic!("expected ack {seq}, got {other:?}"),
        }
    }
}

fn worker_row(r: &Router, id: &str) -> Option<kvroute_router::state::WorkerReport> {
    r.state
        .workers_report(Instant::now())
        .workers
        .into_iter()
        .find(|w| w.id == id)
}

fn cached_blocks(r: &Router, toks: &[u32], worker: &str) -> usize {
    let input = PickInput {
        model: MODEL,
        prompt: Prompt::Tokens(toks),
        cache_salt: None,
        lora: None,
        headers: None,
        resolved: None,
        exclude: &[],
        max_tokens: None,
        tenant: None,
        labels: &[],
        seed: None,
    };
    let rec = r.state.explain(&input, Instant::now()).expect("explain");
    rec.candidates
        .iter()
        .find(|c| c.worker == worker)
        .map_or(0, |c| c.figures.cached_blocks)
}

#[tokio::test]
async fn ingest_snapshot_gap_resnapshot_and_stale_on_disconnect() {
    let r = Router::start(|_| {}).await;
    let p = tokens(64, 0);
    let mut sc = Sidecar::connect(
        &r.grpc_url(),
        snapshot(
            0,
            Some(identity("w0", "127.0.0.1:1", 1)),
            chain(&p[..32]),
            true,
            true,
        ),
    )
    .await
    .expect("stream accepted");
    sc.expect_ack(0).await;
    assert_eq!(worker_row(&r, "w0").expect("row").index_blocks, 2);
    assert_eq!(cached_blocks(&r, &p, "w0"), 2);

    // In-order delta: applied and acked.
    sc.send(stored(1, chain(&p)[2..3].to_vec())).await;
    sc.expect_ack(1).await;
    assert_eq!(cached_blocks(&r, &p, "w0"), 3);

    // seq 2 lost: the router asks for a snapshot and ignores deltas until it comes.
    sc.send(stored(3, chain(&p)[3..4].to_vec())).await;
    match sc.next().await.expect("control").body {
        Some(ingest_control::Body::SnapshotRequest(req)) => {
            assert!(req.reason.contains("gap"), "{}", req.reason)
        }
        other => panic!("expected a snapshot request, got {other:?}"),
    }
    sc.send(load(4, 3)).await;
    sc.send(stored(5, chain(&p)[3..4].to_vec())).await;
    // The snapshot (two chunks) replaces everything: all 4 blocks.
    sc.send(snapshot(
        6,
        Some(identity("w0", "127.0.0.1:1", 1)),
        chain(&p)[..2].to_vec(),
        true,
        false,
    ))
    .await;
    sc.send(snapshot(7, None, chain(&p)[2..].to_vec(), false, true))
        .await;
    sc.expect_ack(6).await;
    sc.expect_ack(7).await;
    assert_eq!(cached_blocks(&r, &p, "w0"), 4);
    let row = worker_row(&r, "w0").expect("row");
    assert!(
        row.sidecar_connected && row.synced && !row.stale && row.routable,
        "{row:?}"
    );
    assert_eq!(
        row.load.map(|l| l.waiting),
        Some(3),
        "load samples apply while waiting for the snapshot"
    );

    // The sidecar goes away: stale, blocks kept, still routable (at a discount).
    drop(sc);
    eventually("worker stale", || {
        worker_row(&r, "w0").is_some_and(|w| w.stale && !w.sidecar_connected)
    })
    .await;
    let row = worker_row(&r, "w0").expect("row");
    assert_eq!(row.index_blocks, 4, "stale is not empty");
    let metrics = reqwest::get(r.admin_url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    assert!(
        metrics.contains("kvroute_router_sidecar_stream_events_total{event=\"gap\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvroute_router_sidecar_streams 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvroute_router_workers{state=\"disconnected\"} 1"),
        "{metrics}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn ingest_refuses_bad_first_reports_and_older_epochs() {
    let r = Router::start(|_| {}).await;
    // A delta first.
    let status = match Sidecar::connect(&r.grpc_url(), stored(0, vec![1])).await {
        Ok(mut sc) => sc.next().await.expect_err("refused"),
        Err(s) => s,
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    // Epoch 5 known; a stream with epoch 4 is refused, epoch 5 again is accepted.
    let mut sc = Sidecar::connect(
        &r.grpc_url(),
        snapshot(
            0,
            Some(identity("w1", "127.0.0.1:2", 5)),
            vec![],
            true,
            true,
        ),
    )
    .await
    .expect("accepted");
    sc.expect_ack(0).await;
    let status = match Sidecar::connect(
        &r.grpc_url(),
        snapshot(
            0,
            Some(identity("w1", "127.0.0.1:2", 4)),
            vec![],
            true,
            true,
        ),
    )
    .await
    {
        Ok(mut old) => old.next().await.expect_err("refused"),
        Err(s) => s,
    };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let mut again = Sidecar::connect(
        &r.grpc_url(),
        snapshot(
            0,
            Some(identity("w1", "127.0.0.1:2", 5)),
            vec![],
            true,
            true,
        ),
    )
    .await
    .expect("accepted");
    again.expect_ack(0).await;
    // The newer stream owns the worker: the old one is closed on its next report.
    sc.send(load(1, 0)).await;
    let status = sc.next().await.expect_err("superseded");
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    // ... without making the worker stale: the new stream is alive.
    assert!(worker_row(&r, "w1").is_some_and(|w| w.sidecar_connected && !w.stale));
    r.shutdown().await;
}

fn completion_body(model: &str, toks: &[u32]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"model": model, "prompt": toks, "max_tokens": 4}))
        .expect("json")
}

async fn pick(
    client: &mut PickerClient<tonic::transport::Channel>,
    model: &str,
    toks: &[u32],
) -> Result<kvroute_proto::v1::PickResponse, tonic::Status> {
    client
        .pick(PickRequest {
            path: "/v1/completions".into(),
            headers: Default::default(),
            body: completion_body(model, toks),
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn pick_prefers_the_warm_worker_and_reports_release_once() {
    let r = Router::start(|_| {}).await;
    let p = tokens(256, 1000);
    let mut warm = Sidecar::connect(
        &r.grpc_url(),
        snapshot(
            0,
            Some(identity("warm", "127.0.0.1:11", 1)),
            chain(&p),
            true,
            true,
        ),
    )
    .await
    .expect("warm");
    warm.expect_ack(0).await;
    let mut cold = Sidecar::connect(
        &r.grpc_url(),
        snapshot(
            0,
            Some(identity("cold", "127.0.0.1:12", 1)),
            vec![],
            true,
            true,
        ),
    )
    .await
    .expect("cold");
    cold.expect_ack(0).await;

    let mut client = PickerClient::connect(r.grpc_url()).await.expect("picker");
    let resp = pick(&mut client, MODEL, &p).await.expect("pick");
    assert_eq!(resp.worker_id, "warm");
    assert_eq!(
        resp.destination,
        Some(pick_response::Destination::WorkerAddress(
            "127.0.0.1:11".into()
        ))
    );
    assert!(!resp.degraded);
    assert!(resp.rewritten_body.is_none());
    // 128 random bits, as 32 hex digits; never the sequential internal handle.
    assert_eq!(resp.decision_id.len(), 32, "{}", resp.decision_id);
    assert!(resp.decision_id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(r.state.in_flight(), 1);

    let first = client
        .report_first_token(ReportFirstTokenRequest {
            decision_id: resp.decision_id.clone(),
            ttft_seconds: 0.05,
        })
        .await
        .expect("first token")
        .into_inner();
    assert!(first.known);
    let done = ReportDoneRequest {
        decision_id: resp.decision_id.clone(),
        prompt_tokens: 256,
        cached_prompt_tokens: 256,
        completion_tokens: 4,
        e2e_seconds: 0.2,
    };
    assert!(
        client
            .report_done(done.clone())
            .await
            .expect("done")
            .into_inner()
            .known
    );
    assert_eq!(r.state.in_flight(), 0);
    let again = client
        .report_done(done)
        .await
        .expect_err("released only once: the id is gone");
    assert_eq!(again.code(), tonic::Code::NotFound);
    for forged in ["not-a-number", "1", "0", &"0".repeat(32)] {
        let e = client
            .report_first_token(ReportFirstTokenRequest {
                decision_id: forged.into(),
                ttft_seconds: 1.0,
            })
            .await
            .expect_err("forged id");
        assert_eq!(e.code(), tonic::Code::NotFound, "{forged}");
    }

    let unknown = pick(&mut client, "nope", &p)
        .await
        .expect_err("unknown model");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    let bad = client
        .pick(PickRequest {
            path: "/v1/completions".into(),
            headers: Default::default(),
            body: b"{not json".to_vec(),
        })
        .await
        .expect_err("bad json");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);

    let metrics = reqwest::get(r.admin_url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    assert!(
        metrics.contains("kvroute_router_assignments_released_total{how=\"done\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvroute_router_prompt_tokens_total{kind=\"cached\",model=\"tiny\"} 256"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvroute_router_ttft_seconds_count{model=\"tiny\",worker=\"warm\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvroute_router_pick_refused_total{reason=\"unknown_id\"} 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvroute_router_grpc_unauthenticated 1"),
        "{metrics}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn unreported_assignments_expire_and_are_released() {
    let r = Router::start(|a| a.assignment_ttl_s = 0.2).await;
    let mut sc = Sidecar::connect(
        &r.grpc_url(),
        snapshot(
            0,
            Some(identity("w", "127.0.0.1:13", 1)),
            vec![],
            true,
            true,
        ),
    )
    .await
    .expect("sidecar");
    sc.expect_ack(0).await;
    let mut client = PickerClient::connect(r.grpc_url()).await.expect("picker");
    let resp = pick(&mut client, MODEL, &tokens(32, 0))
        .await
        .expect("pick");
    eventually("assignment expired", || r.state.in_flight() == 0).await;
    let done = ReportDoneRequest {
        decision_id: resp.decision_id,
        ..Default::default()
    };
    let e = client
        .report_done(done)
        .await
        .expect_err("expired ids are unknown");
    assert_eq!(e.code(), tonic::Code::NotFound);
    let metrics = reqwest::get(r.admin_url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    assert!(
        metrics.contains("kvroute_router_assignments_released_total{how=\"expired\"} 1"),
        "{metrics}"
    );
    r.shutdown().await;
}

/// grpc.health.v1 status of `service`.
async fn health_of(grpc_url: &str, service: &str) -> i32 {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let channel = tonic::transport::Endpoint::from_shared(grpc_url.to_string())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("check")
        .into_inner()
        .status
}

/// Readiness from start to drain, over the admin port and grpc.health.v1: a replica whose
/// discovery lists a worker is not ready until that worker's sidecar streams to it (the
/// Ingest service serves meanwhile); once ready it stays ready; on shutdown it says not ready
/// while it still serves, for `--drain-delay-s`.
#[tokio::test]
async fn not_ready_until_a_listed_worker_streams_and_unready_while_draining() {
    use tonic_health::pb::health_check_response::ServingStatus::{NotServing, Serving};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("router.yaml");
    std::fs::write(&path, STATIC_CONFIG).expect("write config");
    let mut r = Router::start(|a| {
        a.config = Some(path.clone());
        a.route_unlisted = false;
        // Longer than the test: the drain is observed, then the server task is aborted.
        a.drain_delay_s = 600.0;
    })
    .await;
    let http = reqwest::Client::new();
    let readyz = || async {
        let resp = http
            .get(r.admin_url("/readyz"))
            .send()
            .await
            .expect("readyz");
        (
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        )
    };
    let (status, text) = readyz().await;
    assert_eq!(status, 503);
    assert!(text.contains("1 listed worker"), "{text}");
    let grpc = r.grpc_url();
    assert_eq!(health_of(&grpc, "").await, NotServing as i32);
    assert_eq!(
        health_of(&grpc, "kvroute.v1.Picker").await,
        NotServing as i32
    );
    assert_eq!(health_of(&grpc, "kvroute.v1.Ingest").await, Serving as i32);

    let mut sc = Sidecar::connect(
        &grpc,
        snapshot(
            0,
            Some(identity("default/w0", "127.0.0.1:21", 1)),
            vec![],
            true,
            true,
        ),
    )
    .await
    .expect("listed sidecar");
    sc.expect_ack(0).await;
    // The health task re-judges readiness by itself (nobody asks /readyz here).
    let mut serving = false;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !serving {
        assert!(Instant::now() < deadline, "never SERVING");
        serving = health_of(&grpc, "").await == Serving as i32;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(readyz().await.0, 200);
    assert_eq!(health_of(&grpc, "kvroute.v1.Picker").await, Serving as i32);

    // Drain: not ready everywhere, but requests are still served.
    r.stop.cancel();
    eventually("draining", || {
        r.state.readiness().phase() == kvroute_router::readiness::Phase::Draining
    })
    .await;
    let (status, text) = readyz().await;
    assert_eq!((status, text.as_str()), (503, "shutting down\n"));
    for service in ["", "kvroute.v1.Picker", "kvroute.v1.Ingest"] {
        assert_eq!(
            health_of(&grpc, service).await,
            NotServing as i32,
            "{service}"
        );
    }
    let mut client = PickerClient::connect(grpc.clone()).await.expect("picker");
    let resp = pick(&mut client, "chat-default", &tokens(32, 0))
        .await
        .expect("a draining router still routes");
    assert_eq!(resp.worker_id, "default/w0");
    if let Some(task) = r.task.take() {
        task.abort();
    }
}

#[tokio::test]
async fn health_service_answers_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let r = Router::start(|_| {}).await;
    let channel = tonic::transport::Endpoint::from_shared(r.grpc_url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut client = HealthClient::new(channel);
    for service in ["", "kvroute.v1.Picker", "kvroute.v1.Ingest"] {
        let resp = client
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("check")
            .into_inner();
        assert_eq!(
            resp.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
    r.shutdown().await;
}

const STATIC_CONFIG: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: tiny-set}
spec:
  model: {name: tiny}
  replicas: 1
  engine: {mode: mock, port: 8000}
status:
  replicas: 1
  readyReplicas: 1
  workers:
    - {pod: w0, address: "127.0.0.1:21", ready: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {name: pool}
spec:
  targets: [{workerSet: tiny-set}]
  modelAliases: [{name: chat-default, model: tiny}]
"#;

#[tokio::test]
async fn static_config_aliases_rewrite_and_admin_views() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("router.yaml");
    std::fs::write(&path, STATIC_CONFIG).expect("write config");
    let r = Router::start(|a| {
        a.config = Some(path.clone());
        a.route_unlisted = false;
    })
    .await;
    let http = reqwest::Client::new();
    let ready = http
        .get(r.admin_url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503, "no worker has reported yet");
    assert_eq!(
        http.get(r.admin_url("/healthz"))
            .send()
            .await
            .expect("healthz")
            .status(),
        200
    );

    // An unlisted sidecar is tracked but not routable; the listed one (same id) is.
    let mut stray = Sidecar::connect(
        &r.grpc_url(),
        snapshot(
            0,
            Some(identity("stray", "127.0.0.1:99", 1)),
            vec![],
            true,
            true,
        ),
    )
    .await
    .expect("stray");
    stray.expect_ack(0).await;
    let mut client = PickerClient::connect(r.grpc_url()).await.expect("picker");
    let none = pick(&mut client, "chat-default", &tokens(32, 0))
        .await
        .expect_err("no listed worker yet");
    assert_eq!(none.code(), tonic::Code::Unavailable);
    let mut sc = Sidecar::connect(
        &r.grpc_url(),
        snapshot(
            0,
            Some(identity("default/w0", "127.0.0.1:21", 1)),
            vec![],
            true,
            true,
        ),
    )
    .await
    .expect("listed");
    sc.expect_ack(0).await;
    assert_eq!(
        http.get(r.admin_url("/readyz"))
            .send()
            .await
            .expect("readyz")
            .status(),
        200
    );

    let resp = pick(&mut client, "chat-default", &tokens(32, 0))
        .await
        .expect("pick alias");
    assert_eq!(resp.worker_id, "default/w0");
    let body: serde_json::Value =
        serde_json::from_slice(resp.rewritten_body.as_deref().expect("rewritten")).expect("json");
    assert_eq!(body["model"], "tiny");

    let workers: serde_json::Value = http
        .get(r.admin_url("/debug/workers"))
        .send()
        .await
        .expect("workers")
        .json()
        .await
        .expect("json");
    let rows = workers["workers"].as_array().expect("rows");
    let listed = rows
        .iter()
        .find(|w| w["id"] == "default/w0")
        .expect("listed row");
    assert_eq!(listed["routable"], true);
    assert_eq!(listed["in_flight"], 1);
    let stray_row = rows.iter().find(|w| w["id"] == "stray").expect("stray row");
    assert_eq!(
        (
            stray_row["listed"].as_bool(),
            stray_row["routable"].as_bool()
        ),
        (Some(false), Some(false))
    );

    let explain = http
        .post(r.admin_url("/debug/explain"))
        .json(&serde_json::json!({"model": "chat-default", "prompt": tokens(32, 0)}))
        .send()
        .await
        .expect("explain");
    assert_eq!(explain.status(), 200);
    let rec: serde_json::Value = explain.json().await.expect("json");
    assert_eq!(rec["chosen"], "default/w0");
    assert_eq!(rec["backend_model"], "tiny");
    assert_eq!(rec["candidates"].as_array().map(Vec::len), Some(1));
    assert_eq!(rec["candidates"][0]["worker"], "default/w0", "{rec}");
    assert_eq!(r.state.in_flight(), 1, "explain assigns nothing");
    let missing = http
        .post(r.admin_url("/debug/explain"))
        .json(&serde_json::json!({"model": "nope", "prompt": "x"}))
        .send()
        .await
        .expect("explain");
    assert_eq!(missing.status(), 404);
    let bad = http
        .post(r.admin_url("/debug/explain"))
        .body("{")
        .send()
        .await
        .expect("explain");
    assert_eq!(bad.status(), 400);
    r.shutdown().await;
}

#[tokio::test]
async fn chat_requests_are_tokenized_and_failures_degrade_visibly() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizers/qwen3");
    let r = Router::start(|a| a.tokenizer = vec![dir.to_string()]).await;
    let mut sc = Sidecar::connect(
        &r.grpc_url(),
        snapshot(
            0,
            Some(identity("w", "127.0.0.1:31", 1)),
            vec![],
            true,
            true,
        ),
    )
    .await
    .expect("sidecar");
    sc.expect_ack(0).await;
    let mut client = PickerClient::connect(r.grpc_url()).await.expect("picker");
    let chat = |body: serde_json::Value| PickRequest {
        path: "/v1/chat/completions".into(),
        headers: Default::default(),
        body: serde_json::to_vec(&body).expect("json"),
    };
    let ok = client
        .pick(chat(serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}]})))
        .await
        .expect("pick")
        .into_inner();
    assert!(!ok.degraded, "{ok:?}");
    assert_ne!(ok.reason, "degraded_load_only");
    let bad = client
        .pick(chat(
            serde_json::json!({"model": MODEL, "messages": "not a list"}),
        ))
        .await
        .expect("a bad prompt still routes, on load")
        .into_inner();
    assert!(bad.degraded);
    let metrics = reqwest::get(r.admin_url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    assert!(
        metrics.contains("kvroute_router_tokenization_failures_total{model=\"tiny\",reason=\"invalid_request\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "kvroute_router_degraded_decisions_total{model=\"tiny\",reason=\"invalid_request\"} 1"
        ),
        "{metrics}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_throttling_gpu_shows_in_workers_explain_and_metrics_and_loses_the_tie() {
    let r = Router::start(|_| {}).await;
    let mut streams = Vec::new();
    for (name, addr, throttle) in [("hot", "127.0.0.1:21", 0x40), ("cool", "127.0.0.1:22", 0)] {
        let mut sc = Sidecar::connect(
            &r.grpc_url(),
            snapshot(0, Some(identity(name, addr, 1)), vec![], true, true),
        )
        .await
        .expect("stream");
        sc.expect_ack(0).await;
        sc.send(load_with_gpu(1, throttle)).await;
        sc.expect_ack(1).await;
        streams.push(sc);
    }

    let hot = worker_row(&r, "hot").expect("hot row");
    assert!(hot.gpu_degraded);
    let gpus = &hot.load.as_ref().expect("load").gpus;
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].temperature_celsius, 92);
    assert_eq!(
        gpus[0].issues,
        [kvroute_router::routing::GpuIssue::ThermalSlowdown]
    );
    assert!(!worker_row(&r, "cool").expect("cool row").gpu_degraded);

    // Same (empty) cache and load: a tie but for the GPU.
    let p = tokens(64, 5_000);
    let input = PickInput {
        model: MODEL,
        prompt: Prompt::Tokens(&p),
        cache_salt: None,
        lora: None,
        headers: None,
        resolved: None,
        exclude: &[],
        max_tokens: None,
        tenant: None,
        labels: &[],
        seed: None,
    };
    let rec = r.state.explain(&input, Instant::now()).expect("explain");
    assert_eq!(rec.chosen, "cool");
    let flag = |w: &str| {
        rec.candidates
            .iter()
            .find(|c| c.worker == w)
            .map(|c| c.figures.gpu_degraded)
    };
    assert_eq!((flag("hot"), flag("cool")), (Some(true), Some(false)));
    let mut client = PickerClient::connect(r.grpc_url()).await.expect("picker");
    for _ in 0..5 {
        let resp = pick(&mut client, MODEL, &p).await.expect("pick");
        assert_eq!(resp.worker_id, "cool");
    }

    let metrics = reqwest::get(r.admin_url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    assert!(
        metrics.contains("kvroute_router_worker_gpu_degraded{worker=\"hot\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("kvroute_router_worker_gpu_temperature_celsius{gpu=\"0\",worker=\"hot\"} 92")
    );

    // A healthy sample clears it.
    streams[0].send(load_with_gpu(2, 0)).await;
    streams[0].expect_ack(2).await;
    assert!(!worker_row(&r, "hot").expect("hot row").gpu_degraded);
    drop(streams);
    r.shutdown().await;
}
