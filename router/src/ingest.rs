//! The Ingest gRPC service: sidecars stream their worker's KV blocks and load; the router
//! applies them to the index and answers with acks and snapshot requests.
//!
//! ```text
//! sidecar --WorkerReport(seq, snapshot | delta | load)--> IngestService::report (one task per stream)
//!                                                            | Session::on_report (sync)
//!                                                            v
//!                                                  RouterState::sidecar_* --> KV index, loads
//! sidecar <--IngestControl(ack | snapshot_request)----------+
//! ```
//!
//! Rules ([`Session`]): the first report must be a snapshot chunk with `first` set and the
//! worker identity, else the stream is refused (`INVALID_ARGUMENT`). An epoch older than the
//! one known for the worker is refused (`FAILED_PRECONDITION`). A jump in `seq` means a lost
//! report: the router sends one `SnapshotRequest` and ignores deltas until the new snapshot
//! starts (load samples still apply: they carry no cache state). A report with a `seq` at or
//! below one already seen is a duplicate and ignored. When the stream ends or fails, the
//! worker becomes stale (not emptied); a newer stream for the same worker takes it over and
//! the older one is closed (`ABORTED`).
//!
//! Authentication ([`crate::auth`]): on a TLS listener a stream without a kvroute identity is
//! refused at once (`UNAUTHENTICATED`), and the first snapshot's worker id must be one that
//! discovery lists for the certificate's WorkerSet, from its pod IP (`PERMISSION_DENIED`
//! otherwise); each refusal counts in `kvroute_router_ingest_refused_total{reason}`.
//!
//! Caps ([`crate::limits`]): a message over 4 MiB, a stream over `--max-ingest-streams`, a
//! stream silent past `--ingest-first-report-timeout-s` and a new worker over the worker caps end the
//! stream with `RESOURCE_EXHAUSTED`; blocks over a worker's cap are dropped, and when its cap
//! later moves past what the index holds the router asks for a snapshot. Each is counted in
//! `kvroute_router_limit_hits_total`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use kvroute_proto::limits::MAX_MESSAGE_BYTES;
use kvroute_proto::v1::ingest_server::{Ingest, IngestServer};
use kvroute_proto::v1::{
    Ack, DeltaOp as WireDeltaOp, GpuStats, IngestControl, LoraAdapters, SnapshotRequest,
    WorkerReport, delta_op, ingest_control, worker_report,
};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Caller, StreamRefused};
use crate::limits::{
    CONTROL_QUEUE, Limit, MAX_GPU_UUID_BYTES, MAX_GPUS_PER_WORKER, MAX_LORA_ADAPTERS_PER_WORKER,
    MAX_LORA_NAME_BYTES,
};
use crate::routing::GpuStatus;
use crate::state::{DeltaOp, LoadApplied, LoadView, RouterState, SidecarIdentity, SnapshotRefused};

/// Where a stream is in its protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Nothing received yet.
    AwaitingFirst,
    /// Between the first and the last chunk of a snapshot.
    InSnapshot,
    /// Applying deltas.
    Live,
    /// Lost a report; waiting for the snapshot that was asked for.
    AwaitingSnapshot,
}

/// Per-stream protocol state. Synchronous: the socket loop feeds it one report at a time.
#[derive(Debug)]
pub struct Session {
    stream: u64,
    caller: Caller,
    identity: Option<SidecarIdentity>,
    next_seq: u64,
    phase: Phase,
}

impl Session {
    /// A new stream from an anonymous (plaintext) caller, registered with `state`.
    pub fn new(state: &RouterState) -> Self {
        Self::for_caller(state, Caller::Anonymous)
    }

    /// A new stream from `caller`, registered with `state`.
    pub fn for_caller(state: &RouterState, caller: Caller) -> Self {
        Self {
            stream: state.new_stream_id(),
            caller,
            identity: None,
            next_seq: 0,
            phase: Phase::AwaitingFirst,
        }
    }

    /// The worker this stream reports for, once known.
    pub fn worker(&self) -> Option<&str> {
        self.identity.as_ref().map(|i| i.worker_id.as_str())
    }

    /// Applies one report; returns the control messages to send back, or a status that ends
    /// the stream.
    pub fn on_report(
        &mut self,
        state: &RouterState,
        report: WorkerReport,
        now: Instant,
    ) -> Result<Vec<IngestControl>, Status> {
        let m = state.metrics();
        let seq = report.seq;
        let Some(body) = report.body else {
            m.ingest_reports.with_label_values(&["empty"]).inc();
            return Ok(Vec::new());
        };
        if self.phase == Phase::AwaitingFirst {
            return self.first(state, seq, body, now);
        }
        let mut out = Vec::new();
        if seq < self.next_seq {
            m.ingest_reports.with_label_values(&["duplicate"]).inc();
            return Ok(out);
        }
        if seq > self.next_seq && self.phase != Phase::AwaitingSnapshot {
            m.sidecar_stream_events.with_label_values(&["gap"]).inc();
            tracing::info!(
                worker = self.worker(),
                expected = self.next_seq,
                got = seq,
                "report lost; asking for a snapshot"
            );
            self.phase = Phase::AwaitingSnapshot;
            out.push(snapshot_request(format!(
                "sequence gap: expected {}, got {seq}",
                self.next_seq
            )));
        }
        self.next_seq = seq.saturating_add(1);
        let applied = match body {
            worker_report::Body::Snapshot(chunk) if chunk.first => {
                let mut identity = self.identity.clone().unwrap_or_default();
                if let Some(id) = chunk.identity {
                    let id = identity_from_wire(id);
                    if id.worker_id != identity.worker_id {
                        return Err(Status::invalid_argument(
                            "a stream reports for one worker only",
                        ));
                    }
                    identity = id;
                }
                self.start_snapshot(state, identity, &chunk.blocks, chunk.last, now)?;
                m.ingest_reports.with_label_values(&["snapshot"]).inc();
                true
            }
            worker_report::Body::Snapshot(chunk) => {
                if self.phase == Phase::InSnapshot {
                    self.owned(state.sidecar_snapshot_chunk(
                        self.stream,
                        self.worker_id(),
                        &chunk.blocks,
                        chunk.last,
                        now,
                    ))?;
                    if chunk.last {
                        self.phase = Phase::Live;
                    }
                    m.ingest_reports.with_label_values(&["snapshot"]).inc();
                    true
                } else {
                    // A continuation without its start: we lost the first chunk.
                    if self.phase != Phase::AwaitingSnapshot {
                        m.sidecar_stream_events.with_label_values(&["gap"]).inc();
                        self.phase = Phase::AwaitingSnapshot;
                        out.push(snapshot_request(
                            "snapshot chunk without its first chunk".into(),
                        ));
                    }
                    m.ingest_reports.with_label_values(&["ignored"]).inc();
                    false
                }
            }
            worker_report::Body::Delta(delta) => {
                if self.phase == Phase::AwaitingSnapshot {
                    m.ingest_reports.with_label_values(&["ignored"]).inc();
                    false
                } else {
                    let ops = delta_ops(&delta.ops);
                    self.owned(state.sidecar_delta(self.stream, self.worker_id(), &ops, now))?;
                    m.ingest_reports.with_label_values(&["delta"]).inc();
                    true
                }
            }
            worker_report::Body::Load(load) => {
                // `clamp` lets NaN through; a NaN usage is no measurement, so the sample is
                // handled like a failed scrape (shown, never fed to the predictor).
                let usage_known = !load.kv_cache_usage.is_nan();
                let view = LoadView {
                    waiting: load.num_requests_waiting,
                    running: load.num_requests_running,
                    kv_usage: if usage_known {
                        load.kv_cache_usage.clamp(0.0, 1.0) as f32
                    } else {
                        0.0
                    },
                    scrape_failed: load.scrape_failed || !usage_known,
                    kv_capacity_tokens: load.kv_capacity_tokens,
                    gpus: gpus_from_wire(state, load.gpus, load.gpu),
                    lora_adapters: load.lora_adapters.map(|l| adapters_from_wire(state, l)),
                };
                match state.sidecar_load(self.stream, self.worker_id(), view, now) {
                    LoadApplied::NotOwner => self.owned(false)?,
                    LoadApplied::Applied => {}
                    // Not while a requested snapshot is still to come: it will do.
                    LoadApplied::Resync(why) if self.phase != Phase::AwaitingSnapshot => {
                        m.sidecar_stream_events
                            .with_label_values(&["cap_resync"])
                            .inc();
                        out.push(snapshot_request(why.to_string()));
                    }
                    LoadApplied::Resync(_) => {}
                }
                m.ingest_reports.with_label_values(&["load"]).inc();
                self.phase != Phase::AwaitingSnapshot
            }
        };
        if applied {
            out.push(IngestControl {
                body: Some(ingest_control::Body::Ack(Ack { seq })),
            });
        }
        Ok(out)
    }

    /// Ends the stream: the worker becomes stale if this stream still owns it.
    pub fn close(&self, state: &RouterState) {
        if let Some(w) = self.worker() {
            state.sidecar_closed(self.stream, w, Instant::now());
        }
    }

    fn first(
        &mut self,
        state: &RouterState,
        seq: u64,
        body: worker_report::Body,
        now: Instant,
    ) -> Result<Vec<IngestControl>, Status> {
        let worker_report::Body::Snapshot(chunk) = body else {
            state
                .metrics()
                .sidecar_stream_events
                .with_label_values(&["bad_first_report"])
                .inc();
            return Err(Status::invalid_argument(
                "the first report must be a snapshot",
            ));
        };
        let (true, Some(identity)) = (chunk.first, chunk.identity) else {
            state
                .metrics()
                .sidecar_stream_events
                .with_label_values(&["bad_first_report"])
                .inc();
            return Err(Status::invalid_argument(
                "the first snapshot chunk must set `first` and carry the identity",
            ));
        };
        let mut identity = identity_from_wire(identity);
        match state.authorize_stream(&self.caller, &identity.worker_id) {
            Ok(None) => {}
            Ok(Some(listed)) => {
                // An authenticated worker is where discovery says, whatever the stream claims.
                if !listed.address.is_empty() {
                    identity.address = listed.address;
                }
                identity.worker_set = listed.worker_set;
            }
            Err(refused) => return Err(refuse(state, &refused)),
        }
        self.start_snapshot(state, identity, &chunk.blocks, chunk.last, now)?;
        self.next_seq = seq.saturating_add(1);
        state
            .metrics()
            .ingest_reports
            .with_label_values(&["snapshot"])
            .inc();
        Ok(vec![IngestControl {
            body: Some(ingest_control::Body::Ack(Ack { seq })),
        }])
    }

    fn start_snapshot(
        &mut self,
        state: &RouterState,
        identity: SidecarIdentity,
        blocks: &[u64],
        last: bool,
        now: Instant,
    ) -> Result<(), Status> {
        match state.sidecar_snapshot_start(self.stream, &identity, blocks, now) {
            Ok(()) => {}
            // Counted as a limit hit by the state.
            Err(e @ SnapshotRefused::IdentityTooLong { .. }) => {
                return Err(Status::invalid_argument(e.to_string()));
            }
            Err(e @ SnapshotRefused::BadIdentity) => {
                state
                    .metrics()
                    .sidecar_stream_events
                    .with_label_values(&["bad_first_report"])
                    .inc();
                return Err(Status::invalid_argument(e.to_string()));
            }
            Err(e @ SnapshotRefused::OlderEpoch { .. }) => {
                state
                    .metrics()
                    .sidecar_stream_events
                    .with_label_values(&["stale_epoch"])
                    .inc();
                return Err(Status::failed_precondition(e.to_string()));
            }
            // Counted as limit hits by the state.
            Err(
                e @ (SnapshotRefused::TooManyWorkersForModel { .. }
                | SnapshotRefused::TooManyWorkers { .. }),
            ) => return Err(Status::resource_exhausted(e.to_string())),
        }
        if last {
            // A one-chunk snapshot is complete at once.
            state.sidecar_snapshot_chunk(self.stream, &identity.worker_id, &[], true, now);
        }
        if self.identity.is_none() {
            tracing::info!(worker = %identity.worker_id, address = %identity.address, epoch = identity.epoch, "sidecar connected");
        }
        self.identity = Some(identity);
        self.phase = if last { Phase::Live } else { Phase::InSnapshot };
        Ok(())
    }

    fn worker_id(&self) -> &str {
        self.worker().unwrap_or_default()
    }

    /// A state call returned false: a newer stream owns the worker now.
    fn owned(&self, still_owner: bool) -> Result<(), Status> {
        if still_owner {
            Ok(())
        } else {
            Err(Status::aborted("a newer stream reports for this worker"))
        }
    }
}

/// The LoRA adapters of a load sample, `(name, base model)`: at most
/// [`MAX_LORA_ADAPTERS_PER_WORKER`], names within [`MAX_LORA_NAME_BYTES`] (others dropped,
/// counted), empty names skipped, a too-long base model left empty.
fn adapters_from_wire(state: &RouterState, l: LoraAdapters) -> Vec<(String, String)> {
    let total = l.adapters.len();
    let kept: Vec<(String, String)> = l
        .adapters
        .into_iter()
        .filter(|a| !a.name.is_empty() && a.name.len() <= MAX_LORA_NAME_BYTES)
        .take(MAX_LORA_ADAPTERS_PER_WORKER)
        .map(|a| {
            let base = if a.base_model.len() > MAX_LORA_NAME_BYTES {
                String::new()
            } else {
                a.base_model
            };
            (a.name, base)
        })
        .collect();
    if kept.len() < total {
        state.limit_hit(
            Limit::WorkerLoraAdapters,
            format_args!(
                "load sample with {total} LoRA adapters: {} dropped (over {MAX_LORA_ADAPTERS_PER_WORKER}, or a name over {MAX_LORA_NAME_BYTES} bytes or empty)",
                total - kept.len()
            ),
        );
    }
    kept
}

/// The worker's GPUs from a load sample: `gpus`, or `gpu` alone from a sidecar that predates
/// `gpus`; each classified (degraded or not) here, once. At most [`MAX_GPUS_PER_WORKER`] are
/// kept (counted when more came), UUIDs cut to [`MAX_GPU_UUID_BYTES`].
fn gpus_from_wire(
    state: &RouterState,
    gpus: Vec<GpuStats>,
    first: Option<GpuStats>,
) -> Vec<GpuStatus> {
    let gpus = if gpus.is_empty() {
        first.into_iter().collect()
    } else {
        gpus
    };
    if gpus.len() > MAX_GPUS_PER_WORKER {
        state.limit_hit(
            Limit::WorkerGpus,
            format_args!("load sample with {} GPUs: the rest dropped", gpus.len()),
        );
    }
    gpus.into_iter()
        .take(MAX_GPUS_PER_WORKER)
        .map(|mut g| {
            if g.uuid.len() > MAX_GPU_UUID_BYTES {
                let cut = (0..=MAX_GPU_UUID_BYTES)
                    .rev()
                    .find(|&i| g.uuid.is_char_boundary(i))
                    .unwrap_or(0);
                g.uuid.truncate(cut);
            }
            GpuStatus {
                index: g.index,
                uuid: g.uuid,
                utilization_percent: g.utilization_percent.min(100),
                memory_used_bytes: g.memory_used_bytes,
                memory_total_bytes: g.memory_total_bytes,
                temperature_celsius: g.temperature_celsius,
                power_milliwatts: g.power_milliwatts,
                sm_clock_mhz: g.sm_clock_mhz,
                throttle_reasons: g.throttle_reasons,
                ecc_uncorrected_errors: g.ecc_uncorrected_errors,
                recent_xid: g.recent_xid,
                xid_events: g.xid_events,
                issues: Vec::new(),
            }
            .classified()
        })
        .collect()
}

/// Counts a refused stream and says why in its status.
fn refuse(state: &RouterState, refused: &StreamRefused) -> Status {
    state
        .metrics()
        .auth
        .ingest_refused
        .with_label_values(&[refused.label()])
        .inc();
    tracing::warn!(reason = refused.label(), %refused, "refusing sidecar stream");
    refused.status()
}

fn snapshot_request(reason: String) -> IngestControl {
    IngestControl {
        body: Some(ingest_control::Body::SnapshotRequest(SnapshotRequest {
            reason,
        })),
    }
}

fn identity_from_wire(id: kvroute_proto::v1::WorkerIdentity) -> SidecarIdentity {
    SidecarIdentity {
        worker_id: id.worker_id,
        address: id.address,
        model: id.model,
        block_size: id.block_size as usize,
        epoch: id.epoch,
        worker_set: id.worker_set,
    }
}

fn delta_ops(ops: &[WireDeltaOp]) -> Vec<DeltaOp<'_>> {
    ops.iter()
        .filter_map(|op| match delta_op::Kind::try_from(op.kind) {
            Ok(delta_op::Kind::Stored) => Some(DeltaOp::Stored(&op.blocks)),
            Ok(delta_op::Kind::Removed) => Some(DeltaOp::Removed(&op.blocks)),
            Ok(delta_op::Kind::Cleared) => Some(DeltaOp::Cleared),
            // Unknown kinds from a newer sidecar are skipped, not fatal.
            Ok(delta_op::Kind::Unspecified) | Err(_) => None,
        })
        .collect()
}

/// The tonic service.
#[derive(Clone)]
pub struct IngestService {
    state: RouterState,
    shutdown: CancellationToken,
    tls: bool,
    /// One permit per open stream (`--max-ingest-streams`).
    streams: Arc<Semaphore>,
}

impl IngestService {
    /// A service applying reports to `state`; streams end when `shutdown` fires.
    pub fn new(state: RouterState, shutdown: CancellationToken) -> Self {
        let streams = Arc::new(Semaphore::new(state.config().limits.max_ingest_streams));
        Self {
            state,
            shutdown,
            tls: false,
            streams,
        }
    }

    /// Served behind TLS (`--grpc-tls-dir`): callers are authenticated by certificate.
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// As a tonic server. A message over [`MAX_MESSAGE_BYTES`] is refused from its length
    /// prefix, before it is buffered; sidecars chunk their snapshots to fit.
    pub fn into_server(self) -> IngestServer<Self> {
        IngestServer::new(self).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }
}

type ControlStream = Pin<Box<dyn Stream<Item = Result<IngestControl, Status>> + Send>>;

#[tonic::async_trait]
impl Ingest for IngestService {
    type ReportStream = ControlStream;

    async fn report(
        &self,
        request: Request<Streaming<WorkerReport>>,
    ) -> Result<Response<ControlStream>, Status> {
        let caller = Caller::of(&request, self.tls)
            .map_err(|u| refuse(&self.state, &StreamRefused::from(u)))?;
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            self.state.limit_hit(
                Limit::IngestStreams,
                format_args!("ingest stream refused: --max-ingest-streams are open"),
            );
            return Err(Status::resource_exhausted(
                "too many ingest streams (--max-ingest-streams)",
            ));
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(CONTROL_QUEUE);
        let state = self.state.clone();
        let shutdown = self.shutdown.clone();
        let first_deadline =
            tokio::time::Instant::now() + state.config().limits.first_report_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let m = state.metrics().clone();
            m.sidecar_streams.inc();
            m.sidecar_stream_events.with_label_values(&["opened"]).inc();
            let mut session = Session::for_caller(&state, caller);
            loop {
                let awaiting_first = session.worker().is_none();
                let next = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep_until(first_deadline), if awaiting_first => {
                        state.limit_hit(
                            Limit::FirstReportTimeout,
                            format_args!("ingest stream closed: no first report in time"),
                        );
                        let _ = tx
                            .send(Err(Status::resource_exhausted("no first report in time")))
                            .await;
                        break;
                    }
                    next = inbound.next() => next,
                };
                let report = match next {
                    Some(Ok(r)) => r,
                    // tonic's decoder refused a message over the cap from its length prefix
                    // (the only OUT_OF_RANGE it produces); the sidecar is told it was too
                    // large.
                    Some(Err(status)) if status.code() == tonic::Code::OutOfRange => {
                        state.limit_hit(
                            Limit::IngestMessageSize,
                            format_args!(
                                "ingest stream of worker {:?} ended: {}",
                                session.worker(),
                                status.message()
                            ),
                        );
                        let _ = tx
                            .send(Err(Status::resource_exhausted(status.message())))
                            .await;
                        break;
                    }
                    Some(Err(status)) => {
                        tracing::info!(worker = session.worker(), %status, "sidecar stream failed");
                        break;
                    }
                    None => break,
                };
                match session.on_report(&state, report, Instant::now()) {
                    Ok(controls) => {
                        for c in controls {
                            // The sidecar may be gone; its stream end arrives next.
                            let _ = tx.send(Ok(c)).await;
                        }
                    }
                    Err(status) => {
                        // Cap refusals are logged by the state, once per interval.
                        if status.code() != tonic::Code::ResourceExhausted {
                            tracing::warn!(worker = session.worker(), %status, "refusing sidecar stream");
                        }
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                }
            }
            session.close(&state);
            m.sidecar_streams.dec();
            m.sidecar_stream_events.with_label_values(&["closed"]).inc();
            if let Some(worker) = session.worker() {
                tracing::info!(
                    worker,
                    "sidecar stream ended; worker stale until it reports again"
                );
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
