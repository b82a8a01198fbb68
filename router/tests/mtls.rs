//! mTLS on the router's gRPC listener, over loopback with certificates made here (rcgen):
//! who may open an Ingest stream for which worker, who may pick and report, and rotation
//! of leaf certificates and of the CA while a stream stays open.
//!
//! Workers (static discovery, namespace `ml`): `ml/qwen-0` at 127.0.0.1 and `ml/qwen-1` at
//! 127.0.0.2 (WorkerSet `qwen`), `ml/other-0` at 127.0.0.3 (WorkerSet `other`). Clients bind
//! their source address to play each pod. `ml/qwen-2` at 127.0.0.4 is the probe for "a new
//! connection works" during rotations (a new stream for a worker takes over its old one, so
//! the probes never reuse the long-lived streams' workers).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvroute_proto::v1::ingest_client::IngestClient;
use kvroute_proto::v1::picker_client::PickerClient;
use kvroute_proto::v1::{
    Delta, DeltaOp, IngestControl, PickRequest, ReportAbortedRequest, ReportDoneRequest,
    SnapshotChunk, WorkerIdentity, WorkerReport, delta_op, ingest_control, worker_report,
};
use kvroute_router::{Addrs, Args, Server};
use kvroute_tls::testpki::{TestCa, write_dir};
use kvroute_tls::{ClientTls, Identity, WatchedClient};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tonic::transport::{Channel, Endpoint};

const MODEL: &str = "tiny";
const BLOCK: usize = 16;

const CONFIG: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: qwen, namespace: ml}
spec:
  model: {name: tiny}
  replicas: 2
  engine: {mode: mock, port: 8000}
status:
  replicas: 2
  readyReplicas: 2
  workers:
    - {pod: qwen-0, address: "127.0.0.1:18001", ready: true}
    - {pod: qwen-1, address: "127.0.0.2:18002", ready: true}
    - {pod: qwen-2, address: "127.0.0.4:18004", ready: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: other, namespace: ml}
spec:
  model: {name: tiny}
  replicas: 1
  engine: {mode: mock, port: 8000}
status:
  replicas: 1
  readyReplicas: 1
  workers:
    - {pod: other-0, address: "127.0.0.3:18003", ready: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {name: chat, namespace: ml}
spec:
  targets: [{workerSet: qwen}]
"#;

fn workerset(name: &str) -> Identity {
    Identity::WorkerSet {
        namespace: "ml".into(),
        name: name.into(),
    }
}

fn picker(pool: &str) -> Identity {
    Identity::Picker {
        namespace: "ml".into(),
        pool: pool.into(),
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

/// A router with mTLS on loopback.
struct Router {
    addrs: Addrs,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _config: tempfile::TempDir,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Router {
    async fn start(tls_dir: &Path) -> Router {
        Router::start_with(tls_dir, kvroute_router::peer::PeerArgs::default()).await
    }

    /// A router with the peer exchange's settings `peer`.
    async fn start_with(tls_dir: &Path, peer: kvroute_router::peer::PeerArgs) -> Router {
        let config = tempfile::tempdir().expect("tempdir");
        let path = config.path().join("router.yaml");
        std::fs::write(&path, CONFIG).expect("write config");
        let args = Args {
            http_addr: "127.0.0.1:0".parse().expect("addr"),
            grpc_addr: "127.0.0.1:0".parse().expect("addr"),
            admin_addr: "127.0.0.1:0".parse().expect("addr"),
            config: Some(path),
            grpc_tls_dir: Some(tls_dir.to_path_buf()),
            tls_reload_interval_ms: 50,
            // Must not let an authenticated caller register ids discovery does not list.
            route_unlisted: true,
            seed: Some(7),
            peer,
            ..Args::default()
        };
        let server = Server::bind(args).await.expect("bind router");
        let addrs = server.addrs().expect("addrs");
        let stop = CancellationToken::new();
        let task = tokio::spawn(server.serve(stop.clone()));
        Router {
            addrs,
            stop,
            task: Some(task),
            _config: config,
        }
    }

    fn grpc_url(&self) -> String {
        format!("http://localhost:{}", self.addrs.grpc.port())
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.addrs.admin))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("body")
    }

    /// Waits until the metrics contain `line`.
    async fn wait_metric(&self, line: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let m = self.metrics().await;
            if m.lines().any(|l| l == line) {
                return;
            }
            assert!(Instant::now() < deadline, "no `{line}` in\n{m}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("router stops")
                .expect("join")
                .expect("router exits cleanly");
        }
    }
}

/// A client TLS directory and its watched configuration.
struct Client {
    dir: PathBuf,
    tls: ClientTls,
}

impl Client {
    fn new(dir: PathBuf, from: &str) -> Client {
        let config: Arc<WatchedClient> = WatchedClient::client(&dir).expect("client TLS");
        let tls = ClientTls::new(config, Some("localhost"))
            .expect("server name")
            .bind(ip(from));
        Client { dir, tls }
    }

    /// Re-reads the directory now (what the sidecar's watch does periodically).
    fn reload(&self) {
        let outcome = self.tls.config().reload();
        assert_eq!(
            outcome.label(),
            "reloaded",
            "{outcome:?} in {}",
            self.dir.display()
        );
    }

    async fn channel(&self, url: &str) -> Result<Channel, tonic::transport::Error> {
        let endpoint = Endpoint::from_shared(url.to_string())
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(5));
        self.tls.channel(endpoint).await
    }
}

fn identity(worker: &str, epoch: u64) -> WorkerIdentity {
    WorkerIdentity {
        worker_id: worker.into(),
        pod: worker.rsplit('/').next().unwrap_or(worker).into(),
        namespace: "ml".into(),
        // What a stream claims; an authenticated worker's address comes from discovery.
        address: "10.9.9.9:1".into(),
        model: MODEL.into(),
        block_size: BLOCK as u32,
        epoch,
        worker_set: String::new(),
    }
}

fn first_snapshot(worker: &str) -> WorkerReport {
    WorkerReport {
        seq: 0,
        body: Some(worker_report::Body::Snapshot(SnapshotChunk {
            identity: Some(identity(worker, 1)),
            blocks: vec![],
            first: true,
            last: true,
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

/// An open Ingest stream.
struct Stream {
    tx: mpsc::Sender<WorkerReport>,
    rx: Streaming<IngestControl>,
}

impl Stream {
    /// Opens a stream for `worker` and waits for the router's first answer.
    async fn open(channel: Channel, worker: &str) -> Result<Stream, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(first_snapshot(worker)).await.expect("queue");
        let mut rx = IngestClient::new(channel)
            .report(ReceiverStream::new(rx))
            .await?
            .into_inner();
        match next(&mut rx).await? {
            IngestControl {
                body: Some(ingest_control::Body::Ack(a)),
            } if a.seq == 0 => Ok(Stream { tx, rx }),
            other => panic!("expected ack 0, got {other:?}"),
        }
    }

    /// Sends a delta and waits for its ack: the report landed.
    async fn report(&mut self, seq: u64, blocks: Vec<u64>) {
        self.tx.send(stored(seq, blocks)).await.expect("send");
        match next(&mut self.rx).await.expect("control") {
            IngestControl {
                body: Some(ingest_control::Body::Ack(a)),
            } => assert_eq!(a.seq, seq),
            other => panic!("expected ack {seq}, got {other:?}"),
        }
    }
}

async fn next(rx: &mut Streaming<IngestControl>) -> Result<IngestControl, tonic::Status> {
    match tokio::time::timeout(Duration::from_secs(10), rx.next()).await {
        Ok(Some(r)) => r,
        Ok(None) => Err(tonic::Status::cancelled("control stream ended")),
        Err(_) => panic!("no control message within 10 s"),
    }
}

/// Opens a stream that must be refused with `code`.
async fn refused(client: &Client, url: &str, worker: &str, code: tonic::Code) {
    let channel = client.channel(url).await.expect("TLS connect");
    match Stream::open(channel, worker).await {
        Ok(_) => panic!("{worker}: accepted"),
        Err(s) => assert_eq!(s.code(), code, "{worker}: {s}"),
    }
}

/// A connection whose TLS handshake the router must refuse: connecting or the first call fails.
async fn handshake_refused(client: &Client, url: &str) {
    if let Ok(channel) = client.channel(url).await {
        Stream::open(channel, "ml/qwen-0")
            .await
            .err()
            .expect("no stream without an accepted handshake");
    }
}

fn pick_request() -> PickRequest {
    let toks: Vec<u32> = (0..64).collect();
    PickRequest {
        path: "/v1/completions".into(),
        headers: Default::default(),
        body: serde_json::to_vec(
            &serde_json::json!({"model": MODEL, "prompt": toks, "max_tokens": 4}),
        )
        .expect("json"),
    }
}

#[tokio::test]
async fn ingest_streams_need_the_workers_identity_and_pod_ip() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("a");
    let foreign = TestCa::new("foreign");
    let router_id = Identity::Router {
        namespace: "ml".into(),
        pool: "chat".into(),
    };
    let server_dir = tmp.path().join("router");
    write_dir(
        &server_dir,
        &ca.leaf(Some(&router_id), &["localhost"]),
        &[&ca],
    );
    let r = Router::start(&server_dir).await;
    let url = r.grpc_url();

    let dir = |name: &str| tmp.path().join(name);
    write_dir(
        &dir("qwen"),
        &ca.leaf(Some(&workerset("qwen")), &[]),
        &[&ca],
    );
    write_dir(
        &dir("other"),
        &ca.leaf(Some(&workerset("other")), &[]),
        &[&ca],
    );
    write_dir(&dir("picker"), &ca.leaf(Some(&picker("chat")), &[]), &[&ca]);
    write_dir(
        &dir("anonymous-leaf"),
        &ca.leaf(None, &["x.example"]),
        &[&ca],
    );
    // Signed by a CA the router does not trust; it trusts the router's CA itself.
    let foreign_leaf = foreign.leaf(Some(&workerset("qwen")), &[]);
    write_dir(&dir("foreign"), &foreign_leaf, &[&ca]);

    // No client certificate at all (tonic's own TLS, no identity).
    let no_cert = Endpoint::from_shared(format!("https://localhost:{}", r.addrs.grpc.port()))
        .expect("endpoint")
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem()))
                .domain_name("localhost"),
        )
        .expect("tls config");
    if let Ok(channel) = no_cert.connect().await {
        Stream::open(channel, "ml/qwen-0")
            .await
            .err()
            .expect("no stream without a client certificate");
    }
    r.wait_metric("kvroute_router_tls_handshake_failures_total{reason=\"no_certificate\"} 1")
        .await;

    // A certificate from a foreign CA.
    handshake_refused(&Client::new(dir("foreign"), "127.0.0.1"), &url).await;
    r.wait_metric("kvroute_router_tls_handshake_failures_total{reason=\"bad_certificate\"} 1")
        .await;

    // Verified certificates that may not report for the worker they claim.
    let qwen_at_0 = Client::new(dir("qwen"), "127.0.0.1");
    use tonic::Code::{PermissionDenied, Unauthenticated};
    refused(
        &Client::new(dir("other"), "127.0.0.1"),
        &url,
        "ml/qwen-0",
        PermissionDenied,
    )
    .await;
    refused(&qwen_at_0, &url, "ml/qwen-1", PermissionDenied).await;
    refused(&qwen_at_0, &url, "ml/qwen-9", PermissionDenied).await;
    refused(&qwen_at_0, &url, "ml/other-0", PermissionDenied).await;
    refused(
        &Client::new(dir("picker"), "127.0.0.1"),
        &url,
        "ml/qwen-0",
        PermissionDenied,
    )
    .await;
    refused(
        &Client::new(dir("anonymous-leaf"), "127.0.0.1"),
        &url,
        "ml/qwen-0",
        Unauthenticated,
    )
    .await;
    let m = r.metrics().await;
    for (reason, n) in [
        ("foreign_workerset", 2),
        ("peer_address", 1),
        ("unlisted", 1),
        ("not_a_workerset", 1),
        ("no_identity", 1),
    ] {
        let line = format!("kvroute_router_ingest_refused_total{{reason=\"{reason}\"}} {n}");
        assert!(m.lines().any(|l| l == line), "no `{line}` in\n{m}");
    }

    // The right pod with its WorkerSet's certificate: accepted, and its reports land.
    let mut s0 = Stream::open(qwen_at_0.channel(&url).await.expect("connect"), "ml/qwen-0")
        .await
        .expect("qwen-0 accepted");
    s0.report(1, vec![11, 12, 13]).await;
    let qwen_at_2 = Client::new(dir("qwen"), "127.0.0.2");
    let mut s1 = Stream::open(qwen_at_2.channel(&url).await.expect("connect"), "ml/qwen-1")
        .await
        .expect("qwen-1 accepted from its own IP");
    s1.report(1, vec![21]).await;
    let workers: serde_json::Value =
        reqwest::get(format!("http://{}/debug/workers", r.addrs.admin))
            .await
            .expect("workers")
            .json()
            .await
            .expect("json");
    let row = |id: &str| {
        workers["workers"]
            .as_array()
            .expect("rows")
            .iter()
            .find(|w| w["id"] == id)
            .cloned()
            .expect("row")
    };
    assert_eq!(row("ml/qwen-0")["index_blocks"], 3);
    assert_eq!(row("ml/qwen-0")["sidecar_connected"], true);
    // The address comes from discovery, not from what the stream claimed.
    assert_eq!(row("ml/qwen-0")["address"], "127.0.0.1:18001");
    assert!(
        !workers.to_string().contains("10.9.9.9"),
        "a claimed address leaked: {workers}"
    );
    assert!(
        r.metrics()
            .await
            .contains("kvroute_router_grpc_unauthenticated 0")
    );

    // --- Rotation 1: new leaves from the same CA, while s0 and s1 stay open.
    write_dir(
        &server_dir,
        &ca.leaf(Some(&router_id), &["localhost"]),
        &[&ca],
    );
    r.wait_metric("kvroute_router_tls_reloads_total{outcome=\"reloaded\"} 1")
        .await;
    write_dir(
        &dir("qwen"),
        &ca.leaf(Some(&workerset("qwen")), &[]),
        &[&ca],
    );
    let probe = Client::new(dir("qwen"), "127.0.0.4");
    s0.report(2, vec![14]).await;
    s1.report(2, vec![22]).await;
    let fresh = Stream::open(probe.channel(&url).await.expect("connect"), "ml/qwen-2")
        .await
        .expect("new connection with the new leaf");
    drop(fresh);

    // --- Rotation 2: a new CA. First both CAs are trusted and the leaves move to the new
    // one; a client still holding the old CA's leaf keeps working meanwhile.
    let ca2 = TestCa::new("b");
    write_dir(
        &server_dir,
        &ca2.leaf(Some(&router_id), &["localhost"]),
        &[&ca, &ca2],
    );
    r.wait_metric("kvroute_router_tls_reloads_total{outcome=\"reloaded\"} 2")
        .await;
    write_dir(
        &dir("qwen-old"),
        &ca.leaf(Some(&workerset("qwen")), &[]),
        &[&ca, &ca2],
    );
    let old_leaf = Client::new(dir("qwen-old"), "127.0.0.4");
    write_dir(
        &dir("qwen"),
        &ca2.leaf(Some(&workerset("qwen")), &[]),
        &[&ca, &ca2],
    );
    probe.reload();
    s0.report(3, vec![15]).await;
    s1.report(3, vec![23]).await;
    let old = Stream::open(old_leaf.channel(&url).await.expect("connect"), "ml/qwen-2")
        .await
        .expect("the old CA's leaf is still trusted during the overlap");
    drop(old);
    let mut s2 = Stream::open(probe.channel(&url).await.expect("connect"), "ml/qwen-2")
        .await
        .expect("the new CA's leaf is trusted");
    s2.report(1, vec![16]).await;

    // Then the old CA goes: its leaves are refused, the open streams still flow.
    write_dir(
        &server_dir,
        &ca2.leaf(Some(&router_id), &["localhost"]),
        &[&ca2],
    );
    r.wait_metric("kvroute_router_tls_reloads_total{outcome=\"reloaded\"} 3")
        .await;
    handshake_refused(&old_leaf, &url).await;
    r.wait_metric("kvroute_router_tls_handshake_failures_total{reason=\"bad_certificate\"} 2")
        .await;
    s0.report(4, vec![18]).await;
    s1.report(4, vec![24]).await;
    s2.report(2, vec![17]).await;

    // A half-written update (a key that does not match its certificate) is not used.
    let bad_key = server_dir.join(".bad.key");
    std::fs::write(&bad_key, ca2.leaf(None, &["localhost"]).key_pem).expect("write a key");
    // Renamed over `tls.key` in one step, so the router sees exactly one bad change.
    std::fs::rename(&bad_key, server_dir.join("tls.key")).expect("replace tls.key");
    r.wait_metric("kvroute_router_tls_reloads_total{outcome=\"failed\"} 1")
        .await;
    s0.report(5, vec![19]).await;
    drop(s2);
    let still = Stream::open(probe.channel(&url).await.expect("connect"), "ml/qwen-2")
        .await
        .expect("the previous configuration stays in use");
    drop(still);
    r.shutdown().await;
}

#[tokio::test]
async fn pick_ids_are_bound_to_the_picker() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("a");
    let router_id = Identity::Router {
        namespace: "ml".into(),
        pool: "chat".into(),
    };
    let server_dir = tmp.path().join("router");
    write_dir(
        &server_dir,
        &ca.leaf(Some(&router_id), &["localhost"]),
        &[&ca],
    );
    let r = Router::start(&server_dir).await;
    let url = r.grpc_url();
    let dir = |name: &str| tmp.path().join(name);
    write_dir(
        &dir("qwen"),
        &ca.leaf(Some(&workerset("qwen")), &[]),
        &[&ca],
    );
    write_dir(&dir("chat"), &ca.leaf(Some(&picker("chat")), &[]), &[&ca]);
    write_dir(&dir("chat-2"), &ca.leaf(Some(&picker("chat")), &[]), &[&ca]);
    write_dir(
        &dir("elsewhere"),
        &ca.leaf(Some(&picker("elsewhere")), &[]),
        &[&ca],
    );

    let qwen = Client::new(dir("qwen"), "127.0.0.1");
    let _s0 = Stream::open(qwen.channel(&url).await.expect("connect"), "ml/qwen-0")
        .await
        .expect("worker");

    let picker_client = |name: &str| {
        let c = Client::new(dir(name), "127.0.0.1");
        let url = url.clone();
        async move { PickerClient::new(c.channel(&url).await.expect("connect")) }
    };
    let mut chat = picker_client("chat").await;
    let a = chat.pick(pick_request()).await.expect("pick").into_inner();
    let b = chat.pick(pick_request()).await.expect("pick").into_inner();
    assert_eq!(a.worker_id, "ml/qwen-0");
    assert_eq!(a.decision_id.len(), 32);
    assert_ne!(a.decision_id, b.decision_id);

    // A picker of another pool may not pick this pool's model, nor report its decisions.
    let mut elsewhere = picker_client("elsewhere").await;
    let e = elsewhere
        .pick(pick_request())
        .await
        .expect_err("foreign pool");
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let e = elsewhere
        .report_done(ReportDoneRequest {
            decision_id: a.decision_id.clone(),
            ..Default::default()
        })
        .await
        .expect_err("foreign id");
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    // Neither may a sidecar's certificate pick.
    let mut sidecar = PickerClient::new(qwen.channel(&url).await.expect("connect"));
    let e = sidecar
        .pick(pick_request())
        .await
        .expect_err("not a picker");
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    // Another certificate of the same identity holds the same decisions.
    let mut chat2 = picker_client("chat-2").await;
    // Forged and unknown ids.
    for forged in ["1", &"0".repeat(32), &"f".repeat(32), "zz"] {
        let e = chat2
            .report_aborted(ReportAbortedRequest {
                decision_id: forged.to_string(),
                reason: "x".into(),
            })
            .await
            .expect_err("forged id");
        assert_eq!(e.code(), tonic::Code::NotFound, "{forged}");
    }
    assert!(
        chat2
            .report_done(ReportDoneRequest {
                decision_id: a.decision_id.clone(),
                ..Default::default()
            })
            .await
            .expect("same identity")
            .into_inner()
            .known
    );
    assert!(
        chat.report_aborted(ReportAbortedRequest {
            decision_id: b.decision_id.clone(),
            reason: "client went away".into(),
        })
        .await
        .expect("own id")
        .into_inner()
        .known
    );
    let e = chat
        .report_done(ReportDoneRequest {
            decision_id: b.decision_id,
            ..Default::default()
        })
        .await
        .expect_err("released ids are gone");
    assert_eq!(e.code(), tonic::Code::NotFound);
    let m = r.metrics().await;
    for (reason, n) in [
        ("foreign_pool", 1),
        ("foreign_id", 1),
        ("not_a_picker", 1),
        ("unknown_id", 5),
    ] {
        let line = format!("kvroute_router_pick_refused_total{{reason=\"{reason}\"}} {n}");
        assert!(m.lines().any(|l| l == line), "no `{line}` in\n{m}");
    }
    r.shutdown().await;
}

/// The operator gives every router replica one certificate for the router's Services (DNS
/// names) whose URI SANs name the pools served: none here. Replicas share placements by that
/// name; a router certificate for another name is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_holding_the_routers_service_name_share_and_others_do_not() {
    const NAME: &str = "kvroute-router-ingest.ml.svc";
    let ca = TestCa::new("peer CA");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = |n: &str| tmp.path().join(n);
    let ours = ca.leaf(None, &[NAME, "kvroute-router.ml.svc"]);
    write_dir(&dir("b"), &ours, &[&ca]);
    write_dir(&dir("a"), &ours, &[&ca]);
    let theirs = ca.leaf(None, &["kvroute-router-ingest.other.svc"]);
    write_dir(&dir("c"), &theirs, &[&ca]);
    let peer = |to: Vec<String>, name: &str| kvroute_router::peer::PeerArgs {
        peers: to,
        peer_tls_server_name: name.to_string(),
        peer_resolve_interval_s: 0.2,
        ..Default::default()
    };
    // b only listens (its name set); a and c dial it.
    let b = Router::start_with(&dir("b"), peer(Vec::new(), NAME)).await;
    let b_grpc = b.addrs.grpc.to_string();
    let a = Router::start_with(&dir("a"), peer(vec![b_grpc.clone()], NAME)).await;
    a.wait_metric("kvroute_router_peer_streams{direction=\"out\"} 1")
        .await;
    b.wait_metric("kvroute_router_peer_streams{direction=\"in\"} 1")
        .await;
    // c verifies b by the right name, but its own certificate is another Service's: b
    // refuses the stream (no kvroute identity, not valid for b's name).
    let c = Router::start_with(&dir("c"), peer(vec![b_grpc], NAME)).await;
    b.wait_metric("kvroute_router_peer_refused_total{reason=\"unauthenticated\"} 1")
        .await;
    b.wait_metric("kvroute_router_peer_streams{direction=\"in\"} 1")
        .await;
    c.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
