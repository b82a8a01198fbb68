//! The ZMQ adapter: SUB loop on vLLM's KV-event PUB socket, DEALER replay from its ROUTER.
//!
//! ```text
//! vLLM PUB --[topic, seq, payload]--> SUB loop --SeqTracker--> decode --> Hub::apply_batch
//!                                        | gap: DEALER ["", seq] --> ROUTER replay ... end marker
//!                                        | restart / lost: Hub::resync (new epoch)
//! ```
//!
//! Only I/O, gaps and replays happen here; decoding is `kvroute-vllm-wire`, sequencing `seq`,
//! state `state`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kvroute_vllm_wire::{self as wire, DecodeError, KvEvent};
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::hub::Hub;
use crate::metrics::SidecarMetrics;
use crate::seq::{Live, Replayed, SeqTracker};

/// How the sidecar reaches vLLM's sockets.
#[derive(Debug, Clone)]
pub struct ZmqConfig {
    /// vLLM's KV event endpoint (`tcp://host:port`), connected to or bound.
    pub endpoint: String,
    /// Bind the SUB socket (vLLM then connects); otherwise connect to vLLM's bound PUB.
    pub bind: bool,
    /// The topic subscribed to (empty: every topic).
    pub topic: String,
    /// vLLM's ROUTER replay socket; without it every gap is a resync.
    pub replay_endpoint: Option<String>,
    /// Longest a replay may take before it is abandoned (and the state resynced).
    pub replay_timeout: Duration,
}

/// Whether to bind: explicitly requested, or the endpoint names a wildcard / local transport
/// the way vLLM decides for its own side (`*`, `::`, ipc, inproc mean "bind").
pub fn should_bind(endpoint: &str, bind_flag: bool) -> bool {
    bind_flag
        || endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

/// The ZMQ loop: receives vLLM's KV events, checks their sequence numbers, replays gaps and
/// applies the events to the hub.
pub struct Subscriber {
    /// Endpoints, topic and replay settings.
    pub config: ZmqConfig,
    /// Where the events are applied.
    pub hub: Arc<Hub>,
    /// Event, gap, replay and resync counters.
    pub metrics: SidecarMetrics,
}

/// One connect attempt's limit (see [`Subscriber::open`]).
const CONNECT_ATTEMPT: Duration = Duration::from_secs(1);

/// Connects `sub` to `endpoint`, starting a fresh attempt whenever one times out, until it
/// connects (true) or `shutdown` (false).
async fn connect_soon(
    sub: &mut SubSocket,
    endpoint: &str,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(false),
            r = sub.connect(endpoint) => match r {
                Ok(()) => return Ok(true),
                Err(zeromq::ZmqError::ConnectTimeout(_)) => continue,
                Err(e) => return Err(e.into()),
            },
        }
    }
}

impl Subscriber {
    /// Opens the SUB socket (bound or connecting) and returns the bound endpoint, if bound.
    pub async fn open(&self) -> anyhow::Result<(SubSocket, Option<String>)> {
        let mut options = SocketOptions::default();
        // vLLM may start long after us. The crate retries a refused connect with a backoff
        // that grows to 30 s, so one attempt is cut at CONNECT_ATTEMPT and `connect` starts
        // a fresh one: vLLM is reached within about a second of binding (after that the SUB
        // socket reconnects by itself).
        options.connect_timeout(CONNECT_ATTEMPT);
        let mut sub = SubSocket::with_options(options);
        let bound = if should_bind(&self.config.endpoint, self.config.bind) {
            let ep = sub
                .bind(&self.config.endpoint.replace('*', "0.0.0.0"))
                .await?;
            Some(ep.to_string())
        } else {
            None
        };
        sub.subscribe(&self.config.topic).await?;
        Ok((sub, bound))
    }

    /// Catches up by replay, then applies live messages until `shutdown`; `connect` says to
    /// connect `sub` first, and to reconnect when the hub reports a vLLM restart (bound or
    /// connected, a restart resets the sequence tracking and catches up again).
    pub async fn run(
        self,
        mut sub: SubSocket,
        connect: bool,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        if connect && !connect_soon(&mut sub, &self.config.endpoint, &shutdown).await? {
            return Ok(());
        }
        let mut tracker = SeqTracker::new();
        self.catch_up(&mut tracker).await;
        loop {
            let msg = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                _ = self.hub.vllm_restarted() => {
                    // The hub already dropped the state: start over on a fresh socket (when
                    // this side connects), and forget the old process's sequence, so the new
                    // one's seq 0 is its first message rather than a second restart.
                    if connect {
                        tracing::info!("vLLM restarted: reconnecting the SUB socket");
                        drop(sub);
                        sub = self.open().await?.0;
                        if !connect_soon(&mut sub, &self.config.endpoint, &shutdown).await? {
                            return Ok(());
                        }
                    } else {
                        tracing::info!("vLLM restarted: the sequence starts over");
                    }
                    tracker = SeqTracker::new();
                    self.catch_up(&mut tracker).await;
                    continue;
                }
                m = sub.recv() => m,
            };
            match msg {
                Ok(msg) => self.on_live(&mut tracker, msg.into_vec()).await,
                Err(error) => {
                    // A peer disconnect surfaces as an error; the socket reconnects itself.
                    tracing::debug!(%error, "SUB recv error");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Replays everything vLLM still buffers (from seq 0), so a sidecar that starts after
    /// vLLM knows the cache at once instead of at the next live message. Live messages that
    /// the replay already covered are then dropped as duplicates.
    async fn catch_up(&self, tracker: &mut SeqTracker) {
        if self.config.replay_endpoint.is_none() {
            return;
        }
        // vLLM may not be up yet (a pod's containers start together): one short connect
        // attempt, so live messages are not left unread for the whole replay timeout. A vLLM
        // that was already running and busy is caught up by the gap replay its first live
        // message (seq > 0) triggers, with the full timeout.
        let complete = self.replay(tracker, 0, CONNECT_ATTEMPT).await;
        tracker.finish_replay(0);
        tracing::info!(complete, next_seq = ?tracker.expected(), "initial replay done");
    }

    async fn on_live(&self, tracker: &mut SeqTracker, frames: Vec<Bytes>) {
        self.metrics.live_messages.inc();
        let (seq, payload) = match wire::split_frames(&frames) {
            Ok(f) => (f.seq, f.payload),
            Err(e) => return self.decode_error(&e),
        };
        loop {
            match tracker.on_live(seq) {
                Live::Apply => return self.apply_payload(payload),
                Live::Duplicate => return self.metrics.duplicates.inc(),
                Live::Restart => {
                    tracing::warn!(
                        seq,
                        "vLLM sequence went back: publisher restarted, resyncing"
                    );
                    self.resync("vllm_restart");
                }
                Live::Gap { from } => {
                    self.metrics.gaps.inc();
                    tracing::info!(from, to = seq, "sequence gap, replaying");
                    let complete = self.replay(tracker, from, self.config.replay_timeout).await;
                    if !tracker.finish_replay(seq) || !complete {
                        if complete {
                            self.metrics.replays.with_label_values(&["short"]).inc();
                        }
                        self.resync("replay_failed");
                        tracker.resync_at(seq);
                    }
                }
            }
        }
    }

    /// Replays from `from`, connecting within `connect_limit` (capped by the replay timeout);
    /// applies each batch as it arrives. Returns false on failure.
    async fn replay(&self, tracker: &mut SeqTracker, from: u64, connect_limit: Duration) -> bool {
        let Some(endpoint) = &self.config.replay_endpoint else {
            self.metrics
                .replays
                .with_label_values(&["unconfigured"])
                .inc();
            return false;
        };
        let result = tokio::time::timeout(
            self.config.replay_timeout,
            self.replay_inner(
                endpoint,
                tracker,
                from,
                connect_limit.min(self.config.replay_timeout),
            ),
        )
        .await;
        match result {
            Ok(Ok(())) => {
                self.metrics.replays.with_label_values(&["complete"]).inc();
                true
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "replay failed");
                self.metrics.replays.with_label_values(&["failed"]).inc();
                false
            }
            Err(_) => {
                tracing::warn!("replay timed out");
                self.metrics.replays.with_label_values(&["timeout"]).inc();
                false
            }
        }
    }

    async fn replay_inner(
        &self,
        endpoint: &str,
        tracker: &mut SeqTracker,
        from: u64,
        connect_limit: Duration,
    ) -> anyhow::Result<()> {
        // A fresh DEALER per replay: the crate only reconnects SUB sockets.
        let mut options = SocketOptions::default();
        options.connect_timeout(connect_limit);
        let mut dealer = DealerSocket::with_options(options);
        dealer.connect(endpoint).await?;
        let request = ZmqMessage::try_from(wire::replay_request::<Bytes>(from).to_vec())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        dealer.send(request).await?;
        loop {
            let frames = dealer.recv().await?.into_vec();
            let f = match wire::split_frames(&frames) {
                Ok(f) => f,
                Err(e) => {
                    self.decode_error(&e);
                    continue;
                }
            };
            if f.is_end_marker() {
                return Ok(());
            }
            self.metrics.replayed_batches.inc();
            match tracker.on_replayed(f.seq) {
                Replayed::Apply => self.apply_payload(f.payload),
                Replayed::Duplicate => self.metrics.duplicates.inc(),
                Replayed::Lost { expected, got } => {
                    tracing::warn!(
                        expected,
                        got,
                        "replay buffer no longer holds the missing batches, resyncing"
                    );
                    self.metrics.replays.with_label_values(&["lost"]).inc();
                    self.resync("replay_lost");
                    self.apply_payload(f.payload);
                }
            }
        }
    }

    fn resync(&self, reason: &str) {
        self.metrics.resyncs.with_label_values(&[reason]).inc();
        let epoch = self.hub.resync();
        tracing::info!(reason, epoch, "state dropped, new epoch");
    }

    fn apply_payload(&self, payload: &[u8]) {
        let batch = match wire::decode_batch(payload) {
            Ok(b) => b,
            Err(e) => return self.decode_error(&e),
        };
        for event in &batch.events {
            let label = match (event, event.skip_reason()) {
                (_, Some(skip)) => skip.reason(),
                (KvEvent::Stored(_), None) => "stored",
                (KvEvent::Removed(_), None) => "removed",
                (KvEvent::Cleared, None) => "cleared",
                // Never reached: an unknown event always has a skip reason.
                (KvEvent::Unknown(_), None) => "unknown_type",
            };
            self.metrics.events.with_label_values(&[label]).inc();
        }
        let stats = self.hub.apply_batch(&batch.events);
        self.metrics
            .blocks
            .with_label_values(&["stored"])
            .inc_by(stats.stored);
        self.metrics
            .blocks
            .with_label_values(&["removed"])
            .inc_by(stats.removed);
        self.metrics.unknown_parent.inc_by(stats.unknown_parent);
        self.metrics.lora_dropped.inc_by(stats.lora_dropped);
        self.metrics.unknown_removed.inc_by(stats.unknown_removed);
        if stats.bad_token_count > 0 {
            self.metrics
                .decode_errors
                .with_label_values(&["bad_token_count"])
                .inc_by(stats.bad_token_count);
        }
    }

    fn decode_error(&self, e: &DecodeError) {
        tracing::debug!(error = %e, "undecodable KV-event message");
        self.metrics
            .decode_errors
            .with_label_values(&[e.reason()])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::should_bind;

    #[test]
    fn bind_rule_mirrors_vllm() {
        assert!(should_bind("tcp://*:5557", false));
        assert!(should_bind("ipc:///tmp/kv", false));
        assert!(!should_bind("tcp://127.0.0.1:5557", false));
        assert!(should_bind("tcp://127.0.0.1:5557", true));
    }
}
