//! A fake sidecar for router tests: one ingest stream announcing a worker (empty snapshot),
//! which makes a statically listed worker routable. Keep the returned pair alive as long as
//! the worker should stay routable.

use kvroute_proto::v1::ingest_client::IngestClient;
use kvroute_proto::v1::{
    IngestControl, SnapshotChunk, WorkerIdentity, WorkerReport, worker_report,
};
use kvroute_router::Addrs;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// Opens the stream of worker `namespace/pod` at `127.0.0.1:port` serving `model`.
pub async fn sidecar(
    addrs: &Addrs,
    namespace: &str,
    pod: &str,
    port: u16,
    model: &str,
) -> (mpsc::Sender<WorkerReport>, Streaming<IngestControl>) {
    let mut client = IngestClient::connect(format!("http://{}", addrs.grpc))
        .await
        .expect("connect ingest");
    let (tx, rx) = mpsc::channel(4);
    let identity = WorkerIdentity {
        worker_id: format!("{namespace}/{pod}"),
        pod: pod.into(),
        namespace: namespace.into(),
        address: format!("127.0.0.1:{port}"),
        model: model.into(),
        block_size: 16,
        epoch: 1,
        worker_set: String::new(),
    };
    let first = WorkerReport {
        seq: 0,
        body: Some(worker_report::Body::Snapshot(SnapshotChunk {
            identity: Some(identity),
            first: true,
            last: true,
            blocks: Vec::new(),
        })),
    };
    tx.send(first).await.expect("queue snapshot");
    let resp = client
        .report(ReceiverStream::new(rx))
        .await
        .expect("ingest stream");
    (tx, resp.into_inner())
}
