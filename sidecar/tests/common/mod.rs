//! Test doubles for the component tests: a vLLM-shaped ZMQ publisher (PUB + ROUTER replay)
//! and a kvroute Ingest receiver that models the router's view of the worker.

#![allow(dead_code)]
#![allow(clippy::unwrap_used)] // test helpers (outside #[test] fns): a panic is the failure report

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvroute_proto::v1::ingest_server::{Ingest, IngestServer};
use kvroute_proto::v1::{IngestControl, WorkerReport, delta_op, ingest_control, worker_report};
use parking_lot::Mutex;
use rmpv::Value;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Batches kept for replay, by sequence number.
type ReplayBuffer = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;
/// Control senders of the open streams (weak: a stream's reader task owns its sender, so the
/// router's side ends when the reader does).
type Controls = Arc<Mutex<Vec<mpsc::WeakSender<Result<IngestControl, tonic::Status>>>>>;

pub const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `cond` until it holds or the deadline passes.
pub async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// vLLM-shaped payloads
// ---------------------------------------------------------------------------------------------

fn s(x: &str) -> Value {
    Value::from(x)
}

pub fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], block_size: u32) -> Value {
    Value::Map(vec![
        (s("type"), s("BlockStored")),
        (
            s("block_hashes"),
            Value::Array(hashes.iter().map(|&h| Value::from(h)).collect()),
        ),
        (
            s("parent_block_hash"),
            parent.map_or(Value::Nil, Value::from),
        ),
        (
            s("token_ids"),
            Value::Array(tokens.iter().map(|&t| Value::from(t)).collect()),
        ),
        (s("block_size"), Value::from(block_size)),
        (s("lora_id"), Value::Nil),
        (s("medium"), s("GPU")),
        (s("lora_name"), Value::Nil),
        (
            s("extra_keys"),
            Value::Array(hashes.iter().map(|_| Value::Nil).collect()),
        ),
        (s("group_idx"), Value::from(0)),
        (s("kv_cache_spec_kind"), s("full_attention")),
    ])
}

pub fn removed(hash: u64) -> Value {
    Value::Map(vec![
        (s("type"), s("BlockRemoved")),
        (s("block_hashes"), Value::Array(vec![Value::from(hash)])),
        (s("medium"), s("GPU")),
        (s("group_idx"), Value::from(0)),
    ])
}

pub fn cleared() -> Value {
    Value::Map(vec![(s("type"), s("AllBlocksCleared"))])
}

pub fn batch(events: Vec<Value>) -> Vec<u8> {
    let v = Value::Array(vec![
        Value::F64(1_796_050_150.5),
        Value::Array(events),
        Value::from(0),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &v).unwrap();
    out
}

// ---------------------------------------------------------------------------------------------
// Publisher: PUB for live batches, ROUTER answering replay requests from its buffer
// ---------------------------------------------------------------------------------------------

pub struct Publisher {
    pub pub_endpoint: String,
    pub replay_endpoint: String,
    socket: PubSocket,
    /// Every batch "published", including those deliberately not sent (the replay buffer).
    buffer: ReplayBuffer,
    next_seq: u64,
    stop: CancellationToken,
}

impl Publisher {
    pub async fn start() -> Publisher {
        let mut socket = PubSocket::new();
        let pub_endpoint = socket.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let mut router = RouterSocket::new();
        let replay_endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let buffer: ReplayBuffer = Arc::default();
        let stop = CancellationToken::new();
        let (buf, token) = (buffer.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    _ = token.cancelled() => return,
                    m = router.recv() => m,
                };
                let Ok(msg) = msg else { continue };
                let frames = msg.into_vec();
                // [identity, "", start seq]
                let (Some(id), Some(start)) = (frames.first().cloned(), frames.last()) else {
                    continue;
                };
                let start = u64::from_be_bytes(start[..8].try_into().unwrap());
                let replies: Vec<(u64, Vec<u8>)> = buf
                    .lock()
                    .iter()
                    .filter(|(s, _)| *s >= start)
                    .cloned()
                    .collect();
                for (seq, payload) in replies {
                    let m = vec![
                        id.clone(),
                        Bytes::new(),
                        Bytes::new(),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        payload.into(),
                    ];
                    router.send(ZmqMessage::try_from(m).unwrap()).await.unwrap();
                }
                let end = vec![
                    id,
                    Bytes::new(),
                    Bytes::new(),
                    Bytes::from_static(&[0xff; 8]),
                    Bytes::new(),
                ];
                router
                    .send(ZmqMessage::try_from(end).unwrap())
                    .await
                    .unwrap();
            }
        });
        Publisher {
            pub_endpoint,
            replay_endpoint,
            socket,
            buffer,
            next_seq: 0,
            stop,
        }
    }

    /// Publishes the next batch live (and keeps it for replay).
    pub async fn publish(&mut self, payload: Vec<u8>) -> u64 {
        let seq = self.record(payload.clone());
        let m = vec![
            Bytes::new(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload.into(),
        ];
        self.socket
            .send(ZmqMessage::try_from(m).unwrap())
            .await
            .unwrap();
        seq
    }

    /// Keeps the next batch for replay but "loses" it on the live stream.
    pub fn drop_live(&mut self, payload: Vec<u8>) -> u64 {
        self.record(payload)
    }

    fn record(&mut self, payload: Vec<u8>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.buffer.lock().push((seq, payload));
        seq
    }

    /// Simulates a vLLM restart: sequence numbers start again at 0, the buffer is empty.
    pub fn restart(&mut self) {
        self.next_seq = 0;
        self.buffer.lock().clear();
    }

    /// Forgets buffered batches older than `seq` (a replay buffer that wrapped).
    pub fn forget_before(&mut self, seq: u64) {
        self.buffer.lock().retain(|(s, _)| *s >= seq);
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

// ---------------------------------------------------------------------------------------------
// Ingest receiver: the router side, reduced to its view of one worker
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
pub struct View {
    pub epoch: Option<u64>,
    pub block_size: u32,
    pub blocks: BTreeSet<u64>,
    pub streams: usize,
    pub snapshots: usize,
    pub reports: usize,
    pub loads: usize,
    /// Per-stream sequence numbers that were not 0, 1, 2, ...
    pub seq_errors: usize,
    pub first_report_not_snapshot: usize,
    /// Streams the sidecar ended cleanly (end of stream).
    pub clean_ends: usize,
    /// Streams that ended with an error (e.g. reset by a dying sidecar).
    pub error_ends: usize,
    /// With TLS: the identity (URI) and IP of the last stream's peer.
    pub peer: Option<(String, std::net::IpAddr)>,
    /// Most blocks seen in one report (a `CLEARED` op counts as one).
    pub max_report_blocks: usize,
    next_seq: u64,
    in_snapshot: bool,
}

impl View {
    fn apply(&mut self, r: &WorkerReport) {
        if r.seq != self.next_seq {
            self.seq_errors += 1;
        }
        if r.seq == 0 && !matches!(r.body, Some(worker_report::Body::Snapshot(ref c)) if c.first) {
            self.first_report_not_snapshot += 1;
        }
        self.next_seq = r.seq + 1;
        self.reports += 1;
        let weight = match &r.body {
            Some(worker_report::Body::Snapshot(c)) => c.blocks.len(),
            Some(worker_report::Body::Delta(d)) => {
                d.ops.iter().map(|o| o.blocks.len().max(1)).sum()
            }
            _ => 0,
        };
        self.max_report_blocks = self.max_report_blocks.max(weight);
        match &r.body {
            Some(worker_report::Body::Snapshot(c)) => {
                if c.first {
                    let id = c.identity.clone().unwrap_or_default();
                    self.epoch = Some(id.epoch);
                    self.block_size = id.block_size;
                    self.blocks.clear();
                    self.snapshots += 1;
                }
                self.blocks.extend(&c.blocks);
                self.in_snapshot = !c.last;
            }
            Some(worker_report::Body::Delta(d)) => {
                for op in &d.ops {
                    match delta_op::Kind::try_from(op.kind) {
                        Ok(delta_op::Kind::Stored) => self.blocks.extend(&op.blocks),
                        Ok(delta_op::Kind::Removed) => op.blocks.iter().for_each(|b| {
                            self.blocks.remove(b);
                        }),
                        Ok(delta_op::Kind::Cleared) => self.blocks.clear(),
                        _ => {}
                    }
                }
            }
            Some(worker_report::Body::Load(_)) => self.loads += 1,
            None => {}
        }
    }
}

#[derive(Clone)]
struct Receiver {
    view: Arc<Mutex<View>>,
    /// While false, the receiver does not read its streams (a slow router).
    reading: watch::Receiver<bool>,
    /// While false, the receiver reads a new stream but holds back its answer (the response
    /// headers): the sidecar is still opening the call.
    answering: watch::Receiver<bool>,
    controls: Controls,
}

type ControlStream = Pin<Box<dyn Stream<Item = Result<IngestControl, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl Ingest for Receiver {
    type ReportStream = ControlStream;

    async fn report(
        &self,
        request: tonic::Request<tonic::Streaming<WorkerReport>>,
    ) -> Result<tonic::Response<ControlStream>, tonic::Status> {
        let peer = request
            .extensions()
            .get::<tonic::transport::server::TlsConnectInfo<tonic::transport::server::TcpConnectInfo>>()
            .and_then(|i| {
                let certs = i.peer_certs()?;
                let id = kvroute_tls::Identity::from_cert(certs.first()?).ok()?;
                Some((id.uri(), i.get_ref().remote_addr()?.ip()))
            });
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        self.controls.lock().push(tx.downgrade());
        let view = self.view.clone();
        if peer.is_some() {
            view.lock().peer = peer;
        }
        let mut reading = self.reading.clone();
        {
            let mut v = view.lock();
            v.streams += 1;
            v.next_seq = 0;
        }
        tokio::spawn(async move {
            loop {
                if reading.wait_for(|r| *r).await.is_err() {
                    return;
                }
                let report = match inbound.message().await {
                    Ok(Some(report)) => report,
                    Ok(None) => {
                        view.lock().clean_ends += 1;
                        return;
                    }
                    Err(_) => {
                        view.lock().error_ends += 1;
                        return;
                    }
                };
                view.lock().apply(&report);
                let ack = IngestControl {
                    body: Some(ingest_control::Body::Ack(kvroute_proto::v1::Ack {
                        seq: report.seq,
                    })),
                };
                if tx.send(Ok(ack)).await.is_err() {
                    return;
                }
            }
        });
        let mut answering = self.answering.clone();
        if answering.wait_for(|a| *a).await.is_err() {
            return Err(tonic::Status::unavailable("receiver stopped"));
        }
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

pub struct Router {
    pub addr: SocketAddr,
    pub view: Arc<Mutex<View>>,
    reading: watch::Sender<bool>,
    answering: watch::Sender<bool>,
    controls: Controls,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Router {
    /// Starts a receiver on `addr` (port 0 for a fresh one). `small_windows` shrinks HTTP/2
    /// flow-control windows so a non-reading receiver pushes back quickly.
    pub async fn start(addr: SocketAddr, small_windows: bool) -> Router {
        Self::start_with(addr, small_windows, None).await
    }

    /// Like [`Router::start`], serving mTLS with `tls` (client certificates required).
    pub async fn start_tls(addr: SocketAddr, tls: Arc<kvroute_tls::WatchedServer>) -> Router {
        Self::start_with(addr, false, Some(tls)).await
    }

    async fn start_with(
        addr: SocketAddr,
        small_windows: bool,
        tls: Option<Arc<kvroute_tls::WatchedServer>>,
    ) -> Router {
        // A restart on the address of a router just stopped: its listener may close a moment
        // after `stop` returns, so binding is retried for a while (EADDRINUSE flaked in CI).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("bind {addr}: {e}"),
            }
        };
        let addr = listener.local_addr().unwrap();
        let (reading, reading_rx) = watch::channel(true);
        let (answering, answering_rx) = watch::channel(true);
        let view: Arc<Mutex<View>> = Arc::default();
        let controls: Arc<Mutex<Vec<_>>> = Arc::default();
        let svc = IngestServer::new(Receiver {
            view: view.clone(),
            reading: reading_rx,
            answering: answering_rx,
            controls: controls.clone(),
        });
        let stop = CancellationToken::new();
        let token = stop.clone();
        let mut builder = tonic::transport::Server::builder();
        if small_windows {
            builder = builder
                .initial_stream_window_size(1024)
                .initial_connection_window_size(1024);
        }
        let router = builder.add_service(svc);
        let task = tokio::spawn(async move {
            let _ = match tls {
                None => {
                    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                    router
                        .serve_with_incoming_shutdown(incoming, token.cancelled_owned())
                        .await
                }
                Some(tls) => {
                    let incoming =
                        kvroute_tls::tls_incoming(listener, tls, Duration::from_secs(5), |_| {});
                    router
                        .serve_with_incoming_shutdown(incoming, token.cancelled_owned())
                        .await
                }
            };
        });
        Router {
            addr,
            view,
            reading,
            answering,
            controls,
            stop,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_reading(&self, on: bool) {
        self.reading.send_replace(on);
    }

    /// While `on` is false, new streams are read but not answered (no response headers yet).
    pub fn set_answering(&self, on: bool) {
        self.answering.send_replace(on);
    }

    /// Asks every open stream for a fresh snapshot.
    pub async fn request_snapshot(&self) {
        let senders: Vec<_> = self
            .controls
            .lock()
            .iter()
            .filter_map(mpsc::WeakSender::upgrade)
            .collect();
        for tx in senders {
            let req = IngestControl {
                body: Some(ingest_control::Body::SnapshotRequest(
                    kvroute_proto::v1::SnapshotRequest {
                        reason: "test".into(),
                    },
                )),
            };
            let _ = tx.send(Ok(req)).await;
        }
    }

    /// Stops the server and drops every stream (a router restart).
    pub async fn stop(self) -> SocketAddr {
        // End every open stream with an error, as a dying router would.
        let senders: Vec<_> = std::mem::take(&mut *self.controls.lock())
            .iter()
            .filter_map(mpsc::WeakSender::upgrade)
            .collect();
        for tx in senders {
            let _ = tx
                .send(Err(tonic::Status::unavailable("router restarting")))
                .await;
        }
        self.reading.send_replace(false);
        self.stop.cancel();
        self.task.abort();
        let _ = self.task.await;
        self.addr
    }
}
