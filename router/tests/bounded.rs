//! The bounded router over real gRPC on loopback (docs/security.md, "Bounded router"):
//! messages over the cap are refused and counted while the largest realistic snapshot, cut by
//! the sidecar's encoder, still passes; a worker announcing 10^8 blocks (as a snapshot and as
//! a flood of stores) stays at its block cap; 10^5 worker ids leave the worker table at its
//! cap; meanwhile requests still go to the honest worker that holds their prefix, and the
//! process's resident memory stays within a bound.
//!
//! The tests run one at a time (`SERIAL`): each measures the process's resident memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kvroute_proto::limits::{MAX_BLOCKS_PER_MESSAGE, MAX_MESSAGE_BYTES, snapshot_chunks};
use kvroute_proto::v1::ingest_client::IngestClient;
use kvroute_proto::v1::picker_client::PickerClient;
use kvroute_proto::v1::{
    Delta, DeltaOp, IngestControl, LoadSample, PickRequest, ReportAbortedRequest, SnapshotChunk,
    WorkerIdentity, WorkerReport, delta_op, ingest_control, worker_report,
};
use kvroute_router::{Addrs, Args, Server};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

const BLOCK: usize = 16;
const MODEL: &str = "tiny";
/// Generous: nothing here should take long, but a loaded CI machine may be slow.
const DEADLINE: Duration = Duration::from_secs(120);

/// Held by each test: one at a time (each has its own runtime; this lock works across them).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Resident memory of this process (`VmRSS` of /proc/self/status), bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

const MIB: u64 = 1 << 20;

/// A router on loopback, stopped when dropped.
struct Router {
    addrs: Addrs,
    state: kvroute_router::state::RouterState,
    stop: CancellationToken,
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
        tokio::spawn(server.serve(stop.clone()));
        Router { addrs, state, stop }
    }

    fn grpc_url(&self) -> String {
        format!("http://{}", self.addrs.grpc)
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(self.grpc_url())
            .expect("url")
            .connect()
            .await
            .expect("connect")
    }

    async fn metric(&self, line_prefix: &str) -> u64 {
        let text = reqwest::get(format!("http://{}/metrics", self.addrs.admin))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("body");
        text.lines()
            .find_map(|l| l.strip_prefix(line_prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {line_prefix} in\n{text}"))
    }

    async fn limit_hits(&self, limit: &str) -> u64 {
        self.metric(&format!(
            "kvroute_router_limit_hits_total{{limit=\"{limit}\"}}"
        ))
        .await
    }

    fn row(&self, id: &str) -> kvroute_router::state::WorkerReport {
        self.state
            .workers_report(Instant::now())
            .workers
            .into_iter()
            .find(|w| w.id == id)
            .unwrap_or_else(|| panic!("no worker {id}"))
    }
}

fn identity(worker: &str, model: &str) -> WorkerIdentity {
    WorkerIdentity {
        worker_id: worker.into(),
        pod: worker.rsplit('/').next().unwrap_or(worker).into(),
        namespace: "default".into(),
        address: format!("{worker}:8000"),
        model: model.into(),
        block_size: BLOCK as u32,
        epoch: 1,
        worker_set: String::new(),
    }
}

fn report(seq: u64, body: worker_report::Body) -> WorkerReport {
    WorkerReport {
        seq,
        body: Some(body),
    }
}

fn snapshot(seq: u64, chunk: SnapshotChunk) -> WorkerReport {
    report(seq, worker_report::Body::Snapshot(chunk))
}

fn stored(seq: u64, blocks: Vec<u64>) -> WorkerReport {
    report(
        seq,
        worker_report::Body::Delta(Delta {
            ops: vec![DeltaOp {
                kind: delta_op::Kind::Stored as i32,
                blocks,
            }],
        }),
    )
}

fn capacity(seq: u64, blocks: u64) -> WorkerReport {
    report(
        seq,
        worker_report::Body::Load(LoadSample {
            timestamp_ms: 1,
            kv_cache_usage: 0.1,
            kv_capacity_tokens: blocks * BLOCK as u64,
            ..LoadSample::default()
        }),
    )
}

/// Prompt `n` of 1,024 tokens (64 blocks) and its block hashes.
fn prompt(n: u32) -> (Vec<u32>, Vec<u64>) {
    let toks: Vec<u32> = (0..1_024).map(|i| n * 100_000 + i).collect();
    let chain = kvroute_hash::chain(kvroute_hash::root_hash(MODEL, None), &toks, BLOCK, &[]);
    (toks, chain)
}

/// A sidecar's stream: reports go out through `tx`; a task reads the router's answers,
/// keeping the last acked seq, the snapshot requests and how the stream ended.
struct Stream {
    tx: Option<mpsc::Sender<WorkerReport>>,
    acked: Arc<AtomicU64>,
    snapshot_requests: mpsc::UnboundedReceiver<String>,
    ended: tokio::task::JoinHandle<Option<tonic::Status>>,
}

impl Stream {
    /// Opens a stream whose first report is `first`.
    async fn open(channel: Channel, first: WorkerReport) -> Stream {
        Self::try_open(channel, first).await.expect("stream opened")
    }

    /// Opens a stream whose first report is `first`; `Err` when the router refuses the call.
    async fn try_open(channel: Channel, first: WorkerReport) -> Result<Stream, tonic::Status> {
        let (tx, rx) = mpsc::channel(4);
        tx.send(first).await.expect("queue the first report");
        let mut inbound = IngestClient::new(channel)
            .max_encoding_message_size(usize::MAX)
            .report(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let acked = Arc::new(AtomicU64::new(u64::MAX));
        let (req_tx, snapshot_requests) = mpsc::unbounded_channel();
        let seen = acked.clone();
        let ended = tokio::spawn(async move {
            while let Some(m) = inbound.next().await {
                match m {
                    Ok(IngestControl {
                        body: Some(ingest_control::Body::Ack(a)),
                    }) => seen.store(a.seq, Ordering::Release),
                    Ok(IngestControl {
                        body: Some(ingest_control::Body::SnapshotRequest(r)),
                    }) => {
                        let _ = req_tx.send(r.reason);
                    }
                    Ok(_) => {}
                    Err(status) => return Some(status),
                }
            }
            None
        });
        Ok(Stream {
            tx: Some(tx),
            acked,
            snapshot_requests,
            ended,
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

    /// Waits until the router acked `seq`.
    async fn acked(&self, seq: u64) {
        let deadline = Instant::now() + DEADLINE;
        while self.acked.load(Ordering::Acquire) != seq {
            assert!(!self.ended.is_finished(), "stream ended before ack {seq}");
            assert!(Instant::now() < deadline, "no ack {seq}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Ends our side; returns the status the router ended its side with (None: OK).
    async fn close(mut self) -> Option<tonic::Status> {
        self.tx = None;
        tokio::time::timeout(DEADLINE, self.ended)
            .await
            .expect("stream ends")
            .expect("join")
    }

    /// The status the router ends the stream with, without closing our side.
    async fn refused(self) -> tonic::Status {
        tokio::time::timeout(DEADLINE, self.ended)
            .await
            .expect("stream ends")
            .expect("join")
            .expect("an error status")
    }
}

/// An honest worker holding `blocks`, its stream open, synced.
async fn honest(r: &Router, id: &str, blocks: Vec<u64>) -> Stream {
    let chunk = snapshot_chunks(identity(id, MODEL), &blocks, MAX_BLOCKS_PER_MESSAGE)
        .pop()
        .expect("one chunk");
    let s = Stream::open(r.channel().await, snapshot(0, chunk)).await;
    s.acked(0).await;
    s
}

/// Picks for `toks` over the Picker API and releases the assignment; returns the worker.
async fn pick(picker: &mut PickerClient<Channel>, toks: &[u32]) -> String {
    let body =
        serde_json::to_vec(&serde_json::json!({"model": MODEL, "prompt": toks})).expect("json");
    let resp = picker
        .pick(PickRequest {
            path: "/v1/completions".into(),
            headers: Default::default(),
            body,
        })
        .await
        .expect("pick")
        .into_inner();
    picker
        .report_aborted(ReportAbortedRequest {
            decision_id: resp.decision_id.clone(),
            reason: "test".into(),
        })
        .await
        .expect("release");
    resp.worker_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_over_the_cap_are_refused_and_a_realistic_snapshot_still_fits() {
    let _serial = SERIAL.lock().await;
    let r = Router::start(|a| {
        a.max_body_bytes = 1 << 20;
        a.max_ingest_streams = 3;
    })
    .await;

    // One message just over 4 MiB: refused from its length prefix, counted.
    let over = (MAX_MESSAGE_BYTES / 8) as u64;
    let big = SnapshotChunk {
        identity: Some(identity("big", MODEL)),
        first: true,
        last: true,
        blocks: (0..over).collect(),
    };
    let s = Stream::open(r.channel().await, snapshot(0, big)).await;
    let status = s.refused().await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(r.limit_hits("ingest_message_size").await, 1);

    // The largest realistic worker: an H200 serving a 0.5B model with an fp8 KV cache holds
    // about 1.3 M blocks (10 MiB of hashes). Cut by the sidecar's encoder it passes; the
    // first snapshot stops at the cap for an unknown capacity (256 Ki), the capacity report
    // raises the cap and the router asks for the snapshot again, which now fits whole.
    let blocks: Vec<u64> = (0..1_310_720u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let chunks = snapshot_chunks(identity("h200", MODEL), &blocks, usize::MAX);
    assert!(chunks.len() >= 10);
    let mut chunks = chunks.into_iter().enumerate();
    let (_, first) = chunks.next().expect("first chunk");
    let mut s = Stream::open(r.channel().await, snapshot(0, first)).await;
    let mut seq = 0;
    for (i, c) in chunks {
        seq = i as u64;
        s.send(snapshot(seq, c)).await;
    }
    s.acked(seq).await;
    let row = r.row("h200");
    assert_eq!(row.index_blocks, 256 << 10);
    assert!(row.blocks_truncated);
    seq += 1;
    s.send(capacity(seq, 1_310_720)).await;
    let why = tokio::time::timeout(DEADLINE, s.snapshot_requests.recv())
        .await
        .expect("a snapshot request")
        .expect("reason");
    assert!(why.contains("raised"), "{why}");
    for c in snapshot_chunks(identity("h200", MODEL), &blocks, usize::MAX) {
        seq += 1;
        s.send(snapshot(seq, c)).await;
    }
    s.acked(seq).await;
    let row = r.row("h200");
    assert_eq!(row.index_blocks, 1_310_720);
    assert!(!row.blocks_truncated && row.synced, "{row:?}");
    let index = r.state.workers_report(Instant::now());
    eprintln!(
        "index: {} pairs, {} bytes ({:.1} bytes a pair)",
        index.index_pairs,
        index.index_memory_bytes,
        index.index_memory_bytes as f64 / index.index_pairs as f64
    );
    assert_eq!(row.block_cap, 2 * 1_310_720);
    assert_eq!(r.limit_hits("ingest_message_size").await, 1);

    // Streams: two are open ("h200" and "extra"); the third slot too; the fourth is refused.
    let extra = honest(&r, "extra", vec![1, 2, 3]).await;
    let third = honest(&r, "third", vec![4]).await;
    let refused = Stream::try_open(
        r.channel().await,
        snapshot(
            0,
            SnapshotChunk {
                identity: Some(identity("fourth", MODEL)),
                first: true,
                last: true,
                blocks: vec![],
            },
        ),
    )
    .await;
    let status = match refused {
        Err(status) => status,
        Ok(s) => s.refused().await,
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(r.limit_hits("ingest_streams").await, 1);
    assert!(third.close().await.is_none());
    assert!(extra.close().await.is_none());
    assert!(s.close().await.is_none());

    // A Pick request over --max-body-bytes (+ 64 KiB of framing) never reaches the handler;
    // it is refused and counted too.
    let mut picker = PickerClient::new(r.channel().await);
    let status = picker
        .pick(PickRequest {
            path: "/v1/completions".into(),
            headers: Default::default(),
            body: vec![b' '; 2 << 20],
        })
        .await
        .expect_err("too large");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(r.limit_hits("pick_message_size").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_sends_nothing_is_closed() {
    let _serial = SERIAL.lock().await;
    let r = Router::start(|a| a.ingest_first_report_timeout_s = 0.2).await;
    let (tx, rx) = mpsc::channel::<WorkerReport>(1);
    let mut inbound = IngestClient::new(r.channel().await)
        .report(ReceiverStream::new(rx))
        .await
        .expect("opened")
        .into_inner();
    let end = tokio::time::timeout(DEADLINE, inbound.next())
        .await
        .expect("the router ends the stream");
    let status = end.expect("a status").expect_err("an error");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(r.limit_hits("first_report_timeout").await, 1);
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreported_picks_are_capped() {
    let _serial = SERIAL.lock().await;
    let r = Router::start(|a| a.max_outstanding_picks = 2).await;
    let (p, chain) = prompt(1);
    let w = honest(&r, "w", chain).await;
    let mut picker = PickerClient::new(r.channel().await);
    let body = serde_json::to_vec(&serde_json::json!({"model": MODEL, "prompt": p})).expect("json");
    let req = || PickRequest {
        path: "/v1/completions".into(),
        headers: Default::default(),
        body: body.clone(),
    };
    let first = picker.pick(req()).await.expect("pick 1").into_inner();
    picker.pick(req()).await.expect("pick 2");
    let status = picker.pick(req()).await.expect_err("a third is refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(r.limit_hits("outstanding_picks").await, 1);
    assert_eq!(r.limit_hits("pick_message_size").await, 0);
    picker
        .report_aborted(ReportAbortedRequest {
            decision_id: first.decision_id,
            reason: "test".into(),
        })
        .await
        .expect("release");
    picker.pick(req()).await.expect("room again");
    assert!(w.close().await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_identities_are_refused_and_gpu_lists_cut() {
    let _serial = SERIAL.lock().await;
    let r = Router::start(|_| {}).await;
    let mut long = identity("long", MODEL);
    long.model = "m".repeat(100_000);
    let chunk = SnapshotChunk {
        identity: Some(long),
        first: true,
        last: true,
        blocks: vec![],
    };
    let status = Stream::open(r.channel().await, snapshot(0, chunk))
        .await
        .refused()
        .await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_eq!(r.limit_hits("identity_size").await, 1);

    let s = honest(&r, "gpus", vec![1]).await;
    let gpu = |i: u32| kvroute_proto::v1::GpuStats {
        index: i,
        uuid: format!("GPU-{i}-{}", "u".repeat(200)),
        memory_total_bytes: 1 << 30,
        ..Default::default()
    };
    s.send(report(
        1,
        worker_report::Body::Load(LoadSample {
            timestamp_ms: 1,
            kv_cache_usage: 0.1,
            gpus: (0..10_000).map(gpu).collect(),
            ..LoadSample::default()
        }),
    ))
    .await;
    s.acked(1).await;
    let load = r.row("gpus").load.expect("a load sample");
    assert_eq!(load.gpus.len(), 64);
    assert!(load.gpus.iter().all(|g| g.uuid.len() <= 96));
    assert_eq!(r.limit_hits("worker_gpus").await, 1);

    // LoRA adapter lists: at most 256 names of at most 256 bytes are kept (docs/lora.md).
    let adapter = |name: String| kvroute_proto::v1::LoraAdapter {
        name,
        base_model: MODEL.into(),
    };
    let mut adapters: Vec<_> = (0..10_000).map(|i| adapter(format!("a{i:05}"))).collect();
    adapters.insert(0, adapter("x".repeat(10_000)));
    s.send(report(
        2,
        worker_report::Body::Load(LoadSample {
            timestamp_ms: 2,
            kv_cache_usage: 0.1,
            lora_adapters: Some(kvroute_proto::v1::LoraAdapters { adapters }),
            ..LoadSample::default()
        }),
    ))
    .await;
    s.acked(2).await;
    let row = r.row("gpus");
    assert_eq!(row.lora_adapters.len(), 256);
    assert_eq!(
        row.lora_adapters[0], "a00000",
        "the long name is dropped, not cut"
    );
    assert_eq!(r.limit_hits("worker_lora_adapters").await, 1);
    assert!(s.close().await.is_none());
}

/// Blocks a hostile worker announces: 10^8, each distinct.
const HOSTILE_BLOCKS: u64 = 100_000_000;
/// Its cap (no capacity reported).
const HOSTILE_CAP: u64 = 50_000;

fn hostile_hash(worker: u64, i: u64) -> u64 {
    (worker << 60 | i).wrapping_mul(0xD6E8_FEB8_6659_FD93)
}

/// Streams `HOSTILE_BLOCKS` blocks as one snapshot (`as_snapshot`) or as stores after an
/// empty snapshot, producing each message as it is sent; returns the last seq.
async fn hostile(channel: Channel, worker: u64, as_snapshot: bool) -> Stream {
    let id = identity(&format!("hostile-{worker}"), MODEL);
    let per = MAX_BLOCKS_PER_MESSAGE as u64;
    let n = HOSTILE_BLOCKS.div_ceil(per);
    let chunk = |i: u64| -> Vec<u64> {
        (i * per..((i + 1) * per).min(HOSTILE_BLOCKS))
            .map(|b| hostile_hash(worker, b))
            .collect()
    };
    let first = if as_snapshot {
        snapshot(
            0,
            SnapshotChunk {
                identity: Some(id),
                first: true,
                last: n == 1,
                blocks: chunk(0),
            },
        )
    } else {
        snapshot(
            0,
            SnapshotChunk {
                identity: Some(id),
                first: true,
                last: true,
                blocks: vec![],
            },
        )
    };
    let s = Stream::open(channel, first).await;
    let (start, end) = if as_snapshot { (1, n) } else { (0, n) };
    for i in start..end {
        let seq = if as_snapshot { i } else { i + 1 };
        let r = if as_snapshot {
            snapshot(
                seq,
                SnapshotChunk {
                    identity: None,
                    first: false,
                    last: i + 1 == n,
                    blocks: chunk(i),
                },
            )
        } else {
            stored(seq, chunk(i))
        };
        s.send(r).await;
    }
    s.acked(if as_snapshot { n - 1 } else { n }).await;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_announcing_1e8_blocks_stays_at_its_cap_and_others_are_served() {
    let _serial = SERIAL.lock().await;
    // Two prompts with half the traffic each would be hot prefixes that kvroute copies to
    // a second worker; this test is about the hostile streams, so each stays on its holder.
    let r = Router::start(|a| {
        a.worker_blocks_unknown_capacity = HOSTILE_CAP;
        a.hot_prefix_window = 0;
    })
    .await;
    let (p, p_chain) = prompt(1);
    let (q, q_chain) = prompt(2);
    let a = honest(&r, "honest-a", p_chain).await;
    let b = honest(&r, "honest-b", q_chain).await;
    let mut picker = PickerClient::new(r.channel().await);
    assert_eq!(pick(&mut picker, &p).await, "honest-a");
    assert_eq!(pick(&mut picker, &q).await, "honest-b");
    let before = rss_bytes();

    let started = Instant::now();
    let snap = tokio::spawn(hostile(r.channel().await, 1, true));
    let flood = tokio::spawn(hostile(r.channel().await, 2, false));
    // Requests keep landing on the worker that holds their prefix meanwhile.
    let mut peak = before;
    let mut picks = 0;
    while !(snap.is_finished() && flood.is_finished()) {
        assert!(
            started.elapsed() < DEADLINE * 2,
            "the hostile streams never end"
        );
        assert_eq!(pick(&mut picker, &p).await, "honest-a");
        assert_eq!(pick(&mut picker, &q).await, "honest-b");
        picks += 2;
        peak = peak.max(rss_bytes());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let snap = snap.await.expect("join");
    let flood = flood.await.expect("join");
    peak = peak.max(rss_bytes());
    for id in ["hostile-1", "hostile-2"] {
        let row = r.row(id);
        assert_eq!(row.index_blocks, HOSTILE_CAP, "{row:?}");
        assert_eq!(row.block_cap, HOSTILE_CAP);
        assert_eq!(row.blocks_dropped, HOSTILE_BLOCKS - HOSTILE_CAP);
        assert!(row.blocks_truncated);
    }
    assert_eq!(
        r.metric("kvroute_router_ingest_blocks_over_cap_total")
            .await,
        2 * (HOSTILE_BLOCKS - HOSTILE_CAP)
    );
    assert!(r.limit_hits("worker_blocks").await > 0);
    assert_eq!(pick(&mut picker, &p).await, "honest-a");
    assert_eq!(pick(&mut picker, &q).await, "honest-b");
    // The bound: 2 x 50,000 blocks in the index (a few MB) plus message buffers (4 MiB per
    // stream at most) and allocator slack. Without the cap, 2 x 10^8 blocks would take GBs.
    let grew = peak.saturating_sub(before);
    eprintln!(
        "hostile blocks: {picks} picks served; RSS {} MiB before, peak {} MiB (+{} MiB) in {:.1} s",
        before / MIB,
        peak / MIB,
        grew / MIB,
        started.elapsed().as_secs_f64()
    );
    assert!(grew < 128 * MIB, "RSS grew by {} MiB", grew / MIB);
    for s in [snap, flood, a, b] {
        assert!(s.close().await.is_none());
    }
}

/// The first report of hostile worker `prefix-i`, of the model `tiny` or of a model of its
/// own.
fn flood_report(prefix: &str, i: u32, own_model: bool) -> WorkerReport {
    let model = if own_model {
        format!("model-{i}")
    } else {
        MODEL.to_string()
    };
    snapshot(
        0,
        SnapshotChunk {
            identity: Some(identity(&format!("{prefix}-{i}"), &model)),
            first: true,
            last: true,
            blocks: vec![i.into()],
        },
    )
}

/// Tries to add `n` workers over gRPC, 64 streams at a time, each closed once answered.
/// Returns how many the router took.
async fn worker_flood(r: &Router, prefix: &str, n: u32, own_model: bool) -> u32 {
    let channel = r.channel().await;
    futures::stream::iter(0..n)
        .map(|i| {
            let channel = channel.clone();
            let first = flood_report(prefix, i, own_model);
            async move {
                let (tx, rx) = mpsc::channel(1);
                tx.send(first).await.expect("queue");
                let mut inbound = IngestClient::new(channel)
                    .report(ReceiverStream::new(rx))
                    .await
                    .expect("opened")
                    .into_inner();
                let answer = tokio::time::timeout(DEADLINE, inbound.next())
                    .await
                    .expect("an answer");
                match answer {
                    Some(Ok(_)) => 1,
                    Some(Err(status)) => {
                        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                        0
                    }
                    None => panic!("stream ended without an answer"),
                }
            }
        })
        .buffer_unordered(64)
        .fold(0, |n, taken| async move { n + taken })
        .await
}

/// The same through the ingest protocol layer the gRPC service drives
/// ([`kvroute_router::ingest::Session`]), without the transport: 10^5 gRPC streams would
/// take minutes in a debug build.
fn session_flood(r: &Router, prefix: &str, n: u32) -> u32 {
    let mut taken = 0;
    for i in 0..n {
        let mut s = kvroute_router::ingest::Session::new(&r.state);
        let report = flood_report(prefix, i, i.is_multiple_of(2));
        match s.on_report(&r.state, report, Instant::now()) {
            Ok(_) => taken += 1,
            Err(status) => assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}"),
        }
        s.close(&r.state);
    }
    taken
}

const STATIC_CONFIG: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: tiny-set, namespace: default}
spec:
  model: {name: tiny}
  replicas: 3
  engine: {mode: mock, port: 8000}
status:
  replicas: 3
  readyReplicas: 3
  workers:
    - {pod: honest-a, address: "default/honest-a:8000", ready: true}
    - {pod: honest-b, address: "default/honest-b:8000", ready: true}
    - {pod: late, address: "default/late:8000", ready: true}
"#;

async fn worker_table_stays_at_the_cap(route_unlisted: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("router.yaml");
    std::fs::write(&path, STATIC_CONFIG).expect("write config");
    let r = Router::start(|a| {
        a.route_unlisted = route_unlisted;
        if !route_unlisted {
            a.config = Some(path.clone());
        }
        a.max_workers_per_model = 64;
        a.max_workers = 128;
        // Closed streams' workers stay in the table for the whole test.
        a.retire_after_s = 3_600.0;
    })
    .await;
    let (p, p_chain) = prompt(1);
    let (q, q_chain) = prompt(2);
    let a = honest(&r, "default/honest-a", p_chain).await;
    let b = honest(&r, "default/honest-b", q_chain).await;
    let before = rss_bytes();
    let started = Instant::now();

    // 10^5 ids: 2,000 over gRPC, the rest through the protocol layer. The 2 honest workers
    // count: 62 more of model tiny, then 64 of other models make 128 in all.
    assert_eq!(worker_flood(&r, "tiny", 1_000, false).await, 62);
    assert_eq!(r.limit_hits("workers_per_model").await, 1_000 - 62);
    assert_eq!(worker_flood(&r, "other", 1_000, true).await, 64);
    assert_eq!(r.limit_hits("workers").await, 1_000 - 64);
    assert_eq!(session_flood(&r, "hostile", 98_000), 0);
    let with_sidecar = |r: &Router| {
        r.state
            .workers_report(Instant::now())
            .workers
            .iter()
            .filter(|w| w.epoch > 0)
            .count()
    };
    assert_eq!(with_sidecar(&r), 128);
    assert_eq!(
        r.limit_hits("workers_per_model").await + r.limit_hits("workers").await,
        100_000 - 126
    );
    let tiny = r
        .state
        .workers_report(Instant::now())
        .workers
        .iter()
        .filter(|w| w.model == MODEL && w.epoch > 0)
        .count();
    assert_eq!(tiny, 64);

    let mut picker = PickerClient::new(r.channel().await);
    assert_eq!(pick(&mut picker, &p).await, "default/honest-a");
    assert_eq!(pick(&mut picker, &q).await, "default/honest-b");
    if !route_unlisted {
        // A worker discovery lists is taken even now.
        let late = honest(&r, "default/late", vec![7]).await;
        assert_eq!(with_sidecar(&r), 129);
        assert!(late.close().await.is_none());
    }
    let grew = rss_bytes().saturating_sub(before);
    eprintln!(
        "worker flood (route_unlisted={route_unlisted}): RSS +{} MiB in {:.1} s",
        grew / MIB,
        started.elapsed().as_secs_f64()
    );
    assert!(grew < 64 * MIB, "RSS grew by {} MiB", grew / MIB);
    for s in [a, b] {
        assert!(s.close().await.is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_worker_ids_leaves_the_table_at_the_cap_with_route_unlisted() {
    let _serial = SERIAL.lock().await;
    worker_table_stays_at_the_cap(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_worker_ids_leaves_the_table_at_the_cap_with_discovery() {
    let _serial = SERIAL.lock().await;
    worker_table_stays_at_the_cap(false).await;
}
