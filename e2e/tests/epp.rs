//! The endpoint picker conformance suite ([`kvroute_e2e::epp_conformance`]) against kvroute's
//! own EPP, over real sockets: the router runs in-process with a static file (three workers
//! of `tiny` in pool `chat`, and an InferencePolicy whose rules reject with 429 and 503 on a
//! header), a tonic client plays each worker's sidecar so the workers are routable, and the
//! suite plays Envoy over mTLS with a picker certificate of the pool.
//!
//! Beyond the suite: a caller whose certificate is not a picker's is refused; the picker's
//! metrics saw the fallback that served and the refusals; the first tokens reached the TTFT
//! histogram; the router's in-flight assignments are back to zero at the end; and while the
//! replica drains, `readiness` and the ext_proc service report NOT_SERVING, `liveness`
//! SERVING.

use std::path::Path;
use std::time::{Duration, Instant};

use kvroute_e2e::epp_conformance::{Config, InFlightProbe, Outcome, run};
use kvroute_proto::v1::ingest_client::IngestClient;
use kvroute_proto::v1::{
    IngestControl, SnapshotChunk, WorkerIdentity, WorkerReport, worker_report,
};
use kvroute_router::{Args, Server};
use kvroute_tls::testpki::{TestCa, write_dir};
use kvroute_tls::{ClientTls, Identity, WatchedClient};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const DEADLINE: Duration = Duration::from_secs(30);
const PORTS: [u16; 3] = [31, 32, 33];

const CONFIG: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: tiny-set}
spec:
  model: {name: tiny}
  replicas: 3
  engine: {mode: mock, port: 8000}
status:
  replicas: 3
  readyReplicas: 3
  workers:
    - {pod: w0, address: "127.0.0.1:31", ready: true}
    - {pod: w1, address: "127.0.0.1:32", ready: true}
    - {pod: w2, address: "127.0.0.1:33", ready: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePool
metadata: {name: chat}
spec:
  targets: [{workerSet: tiny-set}]
  routing: {allowLoadOnly: true}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferencePolicy
metadata: {name: conformance}
spec:
  pool: chat
  rules:
    - name: shed
      match: {headers: [{name: x-conformance, value: shed}]}
      actions: {reject: {status: 429, message: "shed for the conformance suite"}}
    - name: down
      match: {headers: [{name: x-conformance, value: down}]}
      actions: {reject: {status: 503, message: "down for the conformance suite"}}
"#;

type Sidecar = (mpsc::Sender<WorkerReport>, tonic::Streaming<IngestControl>);

async fn sidecar(grpc: std::net::SocketAddr, pod: &str, port: u16) -> Sidecar {
    let mut client = IngestClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect ingest");
    let (tx, rx) = mpsc::channel(4);
    let identity = WorkerIdentity {
        worker_id: format!("default/{pod}"),
        pod: pod.into(),
        namespace: "default".into(),
        address: format!("127.0.0.1:{port}"),
        model: "tiny".into(),
        block_size: 16,
        epoch: 1,
        worker_set: String::new(),
    };
    tx.send(WorkerReport {
        seq: 0,
        body: Some(worker_report::Body::Snapshot(SnapshotChunk {
            identity: Some(identity),
            first: true,
            last: true,
            blocks: Vec::new(),
        })),
    })
    .await
    .expect("queue snapshot");
    let resp = client
        .report(ReceiverStream::new(rx))
        .await
        .expect("ingest stream");
    (tx, resp.into_inner())
}

async fn channel(dir: &Path, epp: std::net::SocketAddr) -> tonic::transport::Channel {
    let tls = ClientTls::new(
        WatchedClient::client(dir.to_path_buf()).expect("client tls"),
        Some("localhost"),
    )
    .expect("client tls");
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{epp}")).expect("endpoint");
    tls.channel(endpoint).await.expect("connect to the picker")
}

async fn metric(admin: std::net::SocketAddr, series: &str) -> f64 {
    let text = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kvroute_passes_the_endpoint_picker_conformance_suite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("router.yaml");
    std::fs::write(&config, CONFIG).expect("write config");
    let ca = TestCa::new("epp");
    let router_id = Identity::Router {
        namespace: "default".into(),
        pool: "chat".into(),
    };
    write_dir(
        &dir.path().join("router"),
        &ca.leaf(Some(&router_id), &["localhost"]),
        &[&ca],
    );
    let picker_id = Identity::Picker {
        namespace: "default".into(),
        pool: "chat".into(),
    };
    write_dir(
        &dir.path().join("picker"),
        &ca.leaf(Some(&picker_id), &[]),
        &[&ca],
    );
    let worker_id = Identity::WorkerSet {
        namespace: "default".into(),
        name: "tiny-set".into(),
    };
    write_dir(
        &dir.path().join("worker"),
        &ca.leaf(Some(&worker_id), &[]),
        &[&ca],
    );

    let mut args = Args {
        http_addr: "127.0.0.1:0".parse().expect("addr"),
        grpc_addr: "127.0.0.1:0".parse().expect("addr"),
        admin_addr: "127.0.0.1:0".parse().expect("addr"),
        config: Some(config),
        seed: Some(7),
        max_body_bytes: 64 << 10,
        ..Args::default()
    };
    args.epp.epp_listen = Some("127.0.0.1:0".parse().expect("addr"));
    args.epp.epp_tls_dir = Some(dir.path().join("router"));
    args.epp.epp_fallbacks = 2;
    let server = Server::bind(args).await.expect("bind router");
    let addrs = server.addrs().expect("addrs");
    let epp = addrs.epp.expect("the picker listens");
    let stop = CancellationToken::new();
    let serving = tokio::spawn(server.serve(stop.clone()));
    let mut sidecars = Vec::new();
    for (i, port) in PORTS.iter().enumerate() {
        sidecars.push(sidecar(addrs.grpc, &format!("w{i}"), *port).await);
    }
    // Ready (every listed worker streamed its snapshot) before the suite asks for health.
    let end = Instant::now() + DEADLINE;
    loop {
        let ready = reqwest::get(format!("http://{}/readyz", addrs.admin))
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            break;
        }
        assert!(Instant::now() < end, "the router never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let endpoints: Vec<String> = PORTS.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut cfg = Config::new("tiny", &endpoints);
    cfg.min_fallbacks = 2;
    cfg.reject_429 = Some(vec![("x-conformance".into(), "shed".into())]);
    cfg.reject_503 = Some(vec![("x-conformance".into(), "down".into())]);
    cfg.in_flight = Some(InFlightProbe {
        url: format!("http://{}/metrics", addrs.admin),
        metric: "kvroute_router_in_flight".into(),
    });
    cfg.max_body_bytes = Some(64 << 10);
    cfg.deadline = DEADLINE;
    let report = run(channel(&dir.path().join("picker"), epp).await, &cfg).await;
    println!("{report}");
    assert!(report.passed(), "{report}");
    for name in [
        "health",
        "fallback_list",
        "subset_hint_honoured",
        "served_fallback_is_accounted",
        "reject_429",
        "reject_503",
        "in_flight_zero_after_done",
        "in_flight_zero_after_abort",
        "oversized_body_is_413",
    ] {
        assert_eq!(report.outcome(name), Some(&Outcome::Passed), "{name}");
    }

    // A certificate that is not a picker's may not pick.
    let as_worker = run(channel(&dir.path().join("worker"), epp).await, &cfg).await;
    match as_worker.outcome("destination_header_matches_metadata") {
        Some(Outcome::Failed(why)) => assert!(why.contains("not a picker"), "{why}"),
        other => panic!("a worker certificate picked: {other:?}"),
    }

    let admin = addrs.admin;
    assert!(
        metric(
            admin,
            "kvroute_router_epp_served_total{endpoint=\"fallback\"}"
        )
        .await
            >= 1.0
    );
    assert!(
        metric(
            admin,
            "kvroute_router_epp_served_total{endpoint=\"primary\"}"
        )
        .await
            >= 1.0
    );
    assert!(
        metric(
            admin,
            "kvroute_router_epp_decisions_total{outcome=\"policy_rejected\"}"
        )
        .await
            >= 2.0
    );
    assert!(
        metric(
            admin,
            "kvroute_router_epp_decisions_total{outcome=\"no_ready_worker\"}"
        )
        .await
            >= 2.0,
        "subset refusals are counted"
    );
    assert!(metric(admin, "kvroute_router_ttft_seconds_count").await >= 1.0);
    assert_eq!(
        metric(admin, "kvroute_router_epp_unauthenticated").await,
        0.0
    );
    assert_eq!(metric(admin, "kvroute_router_in_flight").await, 0.0);

    // Draining: readiness and the ext_proc service say NOT_SERVING, liveness stays SERVING.
    let drained = reqwest::get(format!("http://{admin}/drain"))
        .await
        .expect("drain");
    assert!(drained.status().is_success());
    let mut health = HealthClient::new(channel(&dir.path().join("picker"), epp).await);
    let end = Instant::now() + DEADLINE;
    loop {
        let mut statuses = Vec::new();
        for service in [
            "liveness",
            "readiness",
            "envoy.service.ext_proc.v3.ExternalProcessor",
        ] {
            let s = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .expect("health")
                .into_inner()
                .status;
            statuses.push(s);
        }
        let (on, off) = (
            ServingStatus::Serving as i32,
            ServingStatus::NotServing as i32,
        );
        if statuses == [on, off, off] {
            break;
        }
        assert!(Instant::now() < end, "health while draining: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    stop.cancel();
    let _ = tokio::time::timeout(DEADLINE, serving).await;
    drop(sidecars);
}
