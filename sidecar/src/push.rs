//! Pushes the worker's cache state and load to every router replica over gRPC
//! (`kvroute.v1.Ingest/Report`).
//!
//! ```text
//! RouterSet (static list + DNS of a headless Service, re-resolved)
//!   └─ Pusher per endpoint: connect -> snapshot chunks -> deltas + load samples ...
//!        ^ reconnect with capped exponential backoff, fresh snapshot every stream
//!        ^ IngestControl.snapshot_request -> fresh snapshot; Ack -> lag
//! ```
//!
//! Each report carries a per-stream sequence number starting at 0. Messages are bounded:
//! snapshots are chunked and deltas split to at most `max_blocks_per_report` blocks, itself
//! at most [`MAX_BLOCKS_PER_MESSAGE`], so no report reaches the router's 4 MiB cap
//! ([`kvroute_proto::limits`]).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kvroute_proto::limits::{MAX_BLOCKS_PER_MESSAGE, MAX_MESSAGE_BYTES, split_delta};
use kvroute_proto::v1::ingest_client::IngestClient;
use kvroute_proto::v1::{
    Delta, DeltaOp, IngestControl, WorkerIdentity, WorkerReport, delta_op, ingest_control,
    worker_report,
};
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::hub::{Hub, Outgoing};
use crate::metrics::{STREAM_CONNECTING, STREAM_DISCONNECTED, STREAM_STREAMING, SidecarMetrics};
use crate::state::{Op, Ops};

/// Who the worker is, minus what the hub knows (epoch, block size).
#[derive(Debug, Clone, Default)]
pub struct IdentityTemplate {
    /// Stable id of the worker, unique in the pool (e.g. `<namespace>/<pod>`).
    pub worker_id: String,
    /// The worker's pod name (empty outside Kubernetes).
    pub pod: String,
    /// The worker's namespace (empty outside Kubernetes).
    pub namespace: String,
    /// host:port of the worker's OpenAI-compatible HTTP API.
    pub address: String,
    /// The model the worker serves (its first served name).
    pub model: String,
    /// The InferenceWorkerSet the worker belongs to (empty outside Kubernetes).
    pub worker_set: String,
}

/// Tunables of the router streams.
#[derive(Debug, Clone)]
pub struct PushConfig {
    /// Most blocks in one report (a snapshot chunk or a delta); at most
    /// [`MAX_BLOCKS_PER_MESSAGE`] are used.
    pub max_blocks_per_report: usize,
    /// First delay before reconnecting to a router.
    pub backoff_initial: Duration,
    /// Longest delay between reconnects (the delay doubles up to it).
    pub backoff_max: Duration,
    /// How long connecting to a router may take.
    pub connect_timeout: Duration,
    /// On shutdown, how long to wait for the router to end its side after ours ended.
    pub close_timeout: Duration,
    /// mTLS to the routers (`--router-tls-dir`); `None`: plaintext.
    pub tls: Option<kvroute_tls::ClientTls>,
    /// The local IP to connect from (`--router-source-ip`); `None`: the OS chooses.
    pub source_ip: Option<std::net::IpAddr>,
}

impl Default for PushConfig {
    fn default() -> Self {
        PushConfig {
            // 64 Ki blocks: 512 KiB per snapshot chunk, under 1 MiB per delta (4 MiB cap).
            max_blocks_per_report: 64 * 1024,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            close_timeout: Duration::from_secs(2),
            tls: None,
            source_ip: None,
        }
    }
}

/// Capped exponential backoff (pure; the delay is an input to `sleep`).
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// A backoff whose first delay is `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            next: initial,
            initial,
            max,
        }
    }

    /// The delay to wait now; the next one is twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Back to the initial delay (after a successful connect).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

pub use kvroute_proto::limits::snapshot_chunks;

/// Converts queued ops to one `Delta`, merging neighbours of the same kind.
pub fn to_delta(batches: &[Ops]) -> Delta {
    let mut ops: Vec<DeltaOp> = Vec::new();
    for op in batches.iter().flat_map(|b| b.0.iter()) {
        let (kind, blocks) = match op {
            Op::Stored(v) => (delta_op::Kind::Stored, v.as_slice()),
            Op::Removed(v) => (delta_op::Kind::Removed, v.as_slice()),
            Op::Cleared => (delta_op::Kind::Cleared, &[][..]),
        };
        match ops.last_mut() {
            Some(last) if last.kind == kind as i32 && kind != delta_op::Kind::Cleared => {
                last.blocks.extend_from_slice(blocks)
            }
            _ => ops.push(DeltaOp {
                kind: kind as i32,
                blocks: blocks.to_vec(),
            }),
        }
    }
    Delta { ops }
}

/// One router endpoint's stream, reconnecting forever until shut down.
pub struct Pusher {
    /// The router's gRPC endpoint (`http://host:port`).
    pub endpoint: String,
    /// Where the resident set and this router's queue live.
    pub hub: Arc<Hub>,
    /// The worker identity sent in every snapshot.
    pub identity: IdentityTemplate,
    /// Report size, backoff and connect timeout.
    pub config: PushConfig,
    /// The sidecar's metrics (labelled with `endpoint`).
    pub metrics: SidecarMetrics,
}

impl Pusher {
    /// Streams reports to the router until `shutdown`, reconnecting with backoff after each
    /// failure.
    pub async fn run(self, shutdown: CancellationToken) {
        let notify = self.hub.register(&self.endpoint);
        let mut backoff = Backoff::new(self.config.backoff_initial, self.config.backoff_max);
        let state = self
            .metrics
            .stream_state
            .with_label_values(&[&self.endpoint]);
        loop {
            state.set(STREAM_CONNECTING);
            let result = self.session(&notify, &mut backoff, &shutdown).await;
            state.set(STREAM_DISCONNECTED);
            if shutdown.is_cancelled() {
                break;
            }
            self.metrics
                .connect_failures
                .with_label_values(&[&self.endpoint])
                .inc();
            if let Err(error) = result {
                tracing::warn!(router = %self.endpoint, error = format!("{error:#}"), "router stream ended");
            }
            // Whatever the router had is unknown now: the next stream starts with a snapshot.
            self.hub.request_snapshot(&self.endpoint);
            let delay = backoff.next_delay();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        state.set(STREAM_DISCONNECTED);
        self.hub.unregister(&self.endpoint);
    }

    /// One stream, until it fails or `shutdown`: then the stream is closed gracefully (our
    /// side ends, the router ends its side), so the router sees a clean end rather than a
    /// reset.
    async fn session(
        &self,
        notify: &tokio::sync::Notify,
        backoff: &mut Backoff,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        let endpoint = tonic::transport::Endpoint::from_shared(self.endpoint.clone())
            .context("router endpoint")?
            .connect_timeout(self.config.connect_timeout)
            .local_address(self.config.source_ip)
            .tcp_nodelay(true);
        let channel = tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            c = async {
                match &self.config.tls {
                    // TLS is done by the connector, with the files current at this connect.
                    Some(tls) => tls.channel(endpoint).await,
                    None => endpoint.connect().await,
                }
            } => c.context("connect")?,
        };
        // A report over the router's cap would end the stream there; failing here says why.
        let mut client = IngestClient::new(channel).max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.hub.request_snapshot(&self.endpoint);
        let (tx, rx) = mpsc::channel::<WorkerReport>(8);
        let mut outbox: VecDeque<WorkerReport> = VecDeque::new();
        let mut seq = 0u64;
        // Queue the snapshot before opening the call, so a router that waits for the first
        // report before answering does not deadlock us.
        self.collect(&mut outbox, &mut seq);
        while let Some(report) = outbox.front() {
            let Ok(permit) = tx.try_reserve() else { break };
            self.count_sent(report);
            permit.send(outbox.pop_front().unwrap_or_default());
        }
        let open = client.report(ReceiverStream::new(rx));
        tokio::pin!(open);
        let mut inbound = tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                // The router may have read our reports already: dropping the opening call
                // would reset the stream. End our side and let the router answer and end its.
                drop(tx);
                self.await_router_end(async {
                    if let Ok(response) = open.await {
                        drain(response.into_inner()).await;
                    }
                })
                .await;
                return Ok(());
            }
            r = &mut open => r.context("open Report stream")?.into_inner(),
        };
        self.metrics
            .connects
            .with_label_values(&[&self.endpoint])
            .inc();
        self.metrics
            .stream_state
            .with_label_values(&[&self.endpoint])
            .set(STREAM_STREAMING);
        backoff.reset();
        let lag = self
            .metrics
            .lag_reports
            .with_label_values(&[&self.endpoint]);
        let queued = self
            .metrics
            .queued_blocks
            .with_label_values(&[&self.endpoint]);
        let overflows = self
            .metrics
            .queue_overflows
            .with_label_values(&[&self.endpoint]);
        let mut acked: Option<u64> = None;
        let mut overflows_seen = 0;
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                ctrl = inbound.message() => match ctrl.context("router stream")? {
                    Some(IngestControl { body: Some(ingest_control::Body::SnapshotRequest(r)) }) => {
                        tracing::info!(router = %self.endpoint, reason = %r.reason, "router asked for a snapshot");
                        self.hub.request_snapshot(&self.endpoint);
                    }
                    Some(IngestControl { body: Some(ingest_control::Body::Ack(a)) }) => acked = Some(a.seq),
                    Some(_) => {}
                    None => anyhow::bail!("router closed the stream"),
                },
                permit = tx.reserve(), if !outbox.is_empty() => {
                    let permit = permit.context("request stream closed")?;
                    if let Some(report) = outbox.pop_front() {
                        self.count_sent(&report);
                        permit.send(report);
                    }
                }
                _ = notify.notified(), if outbox.is_empty() => self.collect(&mut outbox, &mut seq),
            }
            let sent = seq;
            lag.set(
                i64::try_from(sent.saturating_sub(acked.map_or(0, |a| a + 1))).unwrap_or(i64::MAX),
            );
            queued.set(i64::try_from(self.hub.queued_blocks(&self.endpoint)).unwrap_or(i64::MAX));
            let o = self.hub.overflows(&self.endpoint);
            if o > overflows_seen {
                overflows.inc_by(o - overflows_seen);
                overflows_seen = o;
            }
        }
        // Shutdown: end our side (no more reports), then let the router end its side.
        drop(tx);
        self.await_router_end(drain(inbound)).await;
        Ok(())
    }

    /// After our side ended: waits, up to the close timeout, for `ended` (the router ending
    /// its side).
    async fn await_router_end(&self, ended: impl std::future::Future<Output = ()>) {
        if tokio::time::timeout(self.config.close_timeout, ended)
            .await
            .is_ok()
        {
            tracing::info!(router = %self.endpoint, "stream closed");
        } else {
            tracing::debug!(router = %self.endpoint, "router did not end the stream in time");
        }
    }

    /// Moves what the hub has for this router into the outbox as numbered reports.
    fn collect(&self, outbox: &mut VecDeque<WorkerReport>, seq: &mut u64) {
        let max_blocks = self
            .config
            .max_blocks_per_report
            .clamp(1, MAX_BLOCKS_PER_MESSAGE);
        let (outgoing, load) = self.hub.take(&self.endpoint, max_blocks);
        let mut push = |body: worker_report::Body| {
            outbox.push_back(WorkerReport {
                seq: *seq,
                body: Some(body),
            });
            *seq += 1;
        };
        match outgoing {
            Some(Outgoing::Snapshot {
                epoch,
                block_size,
                blocks,
            }) => {
                self.metrics
                    .snapshots
                    .with_label_values(&[&self.endpoint])
                    .inc();
                let t = &self.identity;
                let identity = WorkerIdentity {
                    worker_id: t.worker_id.clone(),
                    pod: t.pod.clone(),
                    namespace: t.namespace.clone(),
                    address: t.address.clone(),
                    model: t.model.clone(),
                    block_size,
                    epoch,
                    worker_set: t.worker_set.clone(),
                };
                for chunk in snapshot_chunks(identity, &blocks, max_blocks) {
                    push(worker_report::Body::Snapshot(chunk));
                }
            }
            Some(Outgoing::Deltas(batches)) => {
                // `take` hands over whole batches: one vLLM event batch may exceed the bound.
                for delta in split_delta(to_delta(&batches), max_blocks) {
                    push(worker_report::Body::Delta(delta));
                }
            }
            None => {}
        }
        if let Some(load) = load {
            push(worker_report::Body::Load(load));
        }
    }

    fn count_sent(&self, report: &WorkerReport) {
        let kind = match report.body {
            Some(worker_report::Body::Snapshot(_)) => "snapshot",
            Some(worker_report::Body::Delta(_)) => "delta",
            Some(worker_report::Body::Load(_)) => "load",
            None => "empty",
        };
        let bytes = report.encoded_len() as u64;
        self.metrics
            .bytes_sent
            .with_label_values(&[&self.endpoint, kind])
            .inc_by(bytes);
        self.metrics
            .reports_sent
            .with_label_values(&[&self.endpoint, kind])
            .inc();
    }
}

/// Keeps one [`Pusher`] per router endpoint: the static list plus the addresses a DNS name
/// (a headless Service) resolves to, re-resolved every `resolve_every`.
pub struct RouterSet {
    /// Router endpoints always streamed to (`host:port` or a URL).
    pub static_routers: Vec<String>,
    /// A DNS name (`host:port`) whose addresses are routers too, e.g. a headless Service.
    pub dns: Option<String>,
    /// How often `dns` is resolved again.
    pub resolve_every: Duration,
    /// Shared with every pusher.
    pub hub: Arc<Hub>,
    /// The worker identity every pusher sends.
    pub identity: IdentityTemplate,
    /// Every pusher's report size, backoff and connect timeout.
    pub config: PushConfig,
    /// The sidecar's metrics.
    pub metrics: SidecarMetrics,
}

impl RouterSet {
    /// Starts and stops pushers as the router set changes until `shutdown`, then waits for
    /// every pusher to close its stream.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut pushers = tokio::task::JoinSet::new();
        self.follow(&shutdown, &mut pushers).await;
        while pushers.join_next().await.is_some() {}
    }

    async fn follow(&self, shutdown: &CancellationToken, pushers: &mut tokio::task::JoinSet<()>) {
        let mut running: HashMap<String, CancellationToken> = HashMap::new();
        loop {
            let mut wanted: BTreeSet<String> =
                self.static_routers.iter().map(|r| normalize(r)).collect();
            if let Some(dns) = &self.dns {
                match tokio::net::lookup_host(dns.as_str()).await {
                    Ok(addrs) => wanted.extend(addrs.map(|a| format!("http://{a}"))),
                    Err(error) => {
                        tracing::warn!(%dns, %error, "router DNS lookup failed; keeping current routers")
                    }
                }
                if wanted.is_empty() {
                    // Keep what we have rather than dropping every stream on a DNS blip.
                    wanted.extend(running.keys().cloned());
                }
            }
            running.retain(|endpoint, token| {
                let keep = wanted.contains(endpoint);
                if !keep {
                    tracing::info!(router = %endpoint, "router gone");
                    token.cancel();
                }
                keep
            });
            for endpoint in wanted {
                if running.contains_key(&endpoint) {
                    continue;
                }
                tracing::info!(router = %endpoint, "router added");
                let token = shutdown.child_token();
                let pusher = Pusher {
                    endpoint: endpoint.clone(),
                    hub: self.hub.clone(),
                    identity: self.identity.clone(),
                    config: self.config.clone(),
                    metrics: self.metrics.clone(),
                };
                let span = tracing::info_span!("pusher", router = %endpoint);
                pushers.spawn(tracing::Instrument::instrument(
                    pusher.run(token.clone()),
                    span,
                ));
                running.insert(endpoint, token);
            }
            if self.dns.is_none() {
                shutdown.cancelled().await;
                return;
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.resolve_every) => {}
            }
        }
    }
}

/// `host:port` -> `http://host:port`.
fn normalize(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    }
}

/// Reads the router's stream until it ends (or fails).
async fn drain(mut inbound: tonic::Streaming<IngestControl>) {
    while let Ok(Some(_)) = inbound.message().await {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let d: Vec<_> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(d, vec![100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay().as_millis(), 100);
    }

    #[test]
    fn a_delta_costs_at_most_16_bytes_per_block() {
        use prost::Message as _;
        // One vLLM step storing 4 blocks and evicting 4: the smallest realistic report.
        let ops = Ops(vec![
            Op::Removed((0..4).map(|i| u64::MAX - i).collect()),
            Op::Stored((0..4).map(|i| i << 60).collect()),
        ]);
        let report = WorkerReport {
            seq: 123_456,
            body: Some(worker_report::Body::Delta(to_delta(&[ops]))),
        };
        let per_block = report.encoded_len() as f64 / 8.0;
        assert!(per_block <= 16.0, "{per_block} bytes per block");
    }

    #[test]
    fn delta_merges_same_kind() {
        let d = to_delta(&[
            Ops(vec![Op::Stored(vec![1])]),
            Ops(vec![Op::Stored(vec![2]), Op::Removed(vec![1])]),
        ]);
        assert_eq!(d.ops.len(), 2);
        assert_eq!(d.ops[0].blocks, vec![1, 2]);
        assert_eq!(normalize("a:1"), "http://a:1");
    }
}
