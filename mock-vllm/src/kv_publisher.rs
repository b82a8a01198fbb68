//! The ZMQ side of KV events, as vLLM's `ZmqEventPublisher` runs it: a PUB socket sending
//! `[topic, seq, payload]` per engine step that has events, and a ROUTER socket answering
//! replay requests from a bounded buffer of recent batches, then the end marker.
//!
//! ```text
//! driver --Batch(ts, events)--> publisher task --PUB--> subscribers
//!                                   | ring buffer (buffer_steps)
//!                                   v
//!                 DEALER ["", seq] --ROUTER--> ["", topic, seq, payload]... ["", "", ff*8, ""]
//! ```

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use kvroute_vllm_wire::{self as wire, KvEvent};
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// vLLM's `--kv-events-config` (vllm/config/kv_events.py); unknown keys are ignored.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct KvEventsConfig {
    /// Whether the engine produces KV events at all.
    pub enable_kv_cache_events: bool,
    /// The publisher kind: `zmq` (the default when absent) or `null` (none).
    pub publisher: Option<String>,
    /// The PUB socket's endpoint, bound or connected (see [`pub_should_bind`]).
    pub endpoint: String,
    /// The ROUTER endpoint that answers replay requests from a sequence number; none when absent.
    pub replay_endpoint: Option<String>,
    /// How many batches the replay buffer keeps.
    pub buffer_steps: usize,
    /// vLLM's PUB high-water mark; accepted for compatibility, not applied by the mock.
    pub hwm: usize,
    /// Capacity of the queue between the engine and the publisher task.
    pub max_queue_size: usize,
    /// The ZMQ topic frame sent before each batch (empty by default).
    pub topic: String,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enable_kv_cache_events: false,
            publisher: None,
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
        }
    }
}

impl KvEventsConfig {
    /// Parses the flag's JSON.
    pub fn parse(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// Whether a ZMQ publisher runs (`publisher` "null" disables it, as in vLLM).
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher.as_deref().unwrap_or("zmq") == "zmq"
    }
}

/// vLLM binds the PUB endpoint when it contains `*` or `::` or is ipc/inproc and connects
/// otherwise. Port 0 cannot be connected to, so the mock binds it too (tests use it).
pub fn pub_should_bind(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
        || endpoint.ends_with(":0")
}

/// `tcp://*:N` becomes `tcp://0.0.0.0:N` (the zeromq crate does not resolve `*`).
fn bind_address(endpoint: &str) -> String {
    endpoint.replace("://*:", "://0.0.0.0:")
}

/// A message to the publisher task.
#[derive(Debug)]
pub enum PublisherMsg {
    /// One engine step's events, with the batch timestamp (seconds since the epoch).
    Batch {
        /// The batch timestamp, seconds since the Unix epoch.
        ts: f64,
        /// The step's KV events, in order.
        events: Vec<KvEvent>,
    },
    /// The engine restarted: sequence numbers start again at 0 and the buffer empties.
    Restart,
}

/// Where the sockets ended up (ports resolved).
#[derive(Clone, Debug, Default)]
pub struct PublisherEndpoints {
    /// The PUB socket's address: the bound one (the OS's port for port 0) or the one it
    /// connects to.
    pub pub_endpoint: Option<String>,
    /// The replay ROUTER socket's bound address, when replay is configured.
    pub replay_endpoint: Option<String>,
}

type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// The running publisher: send it [`PublisherMsg`]s.
pub struct Publisher {
    /// Where the engine sends its batches and restarts.
    pub tx: mpsc::Sender<PublisherMsg>,
    /// The addresses the sockets ended up on.
    pub endpoints: PublisherEndpoints,
    /// Fault injection (`POST /mock/drop-events`): while above 0, each batch is numbered and
    /// kept for replay as usual but not sent on the PUB socket, and this counts down: the
    /// subscriber sees a sequence gap, as when ZMQ drops frames past its high-water mark.
    pub drop_live: Arc<AtomicU64>,
}

impl Publisher {
    /// Binds or connects the sockets and spawns the publishing and replay tasks.
    pub async fn start(config: &KvEventsConfig, dp_rank: u32) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let mut options = zeromq::SocketOptions::default();
        // The crate retries a refused connect inside one `connect` call with a backoff that
        // grows to 30 s, so a subscriber binding 7 s after us would be reached only at about
        // 12.8 s, one binding at 13 s at about 25.6 s. libzmq (vLLM) retries every 100 ms
        // (`ZMQ_RECONNECT_IVL`), so one attempt is cut at CONNECT_ATTEMPT and the publishing
        // task starts a fresh one (see `PublishLoop::connect`).
        options.connect_timeout(CONNECT_ATTEMPT);
        let mut pub_socket = zeromq::PubSocket::with_options(options);
        let mut connect_to = None;
        let pub_endpoint = if pub_should_bind(&config.endpoint) {
            let ep = pub_socket
                .bind(&bind_address(&config.endpoint))
                .await
                .with_context(|| format!("binding KV event PUB socket {}", config.endpoint))?;
            Some(ep.to_string())
        } else {
            // vLLM connects when a subscriber binds; the subscriber may come up later (or go
            // away), so connecting happens in the publishing task, retried until it succeeds,
            // instead of failing start-up after the zeromq crate's connect timeout.
            connect_to = Some(config.endpoint.clone());
            Some(config.endpoint.clone())
        };
        let buffer: ReplayBuffer = Arc::new(Mutex::new(VecDeque::new()));
        let topic = Bytes::from(config.topic.clone().into_bytes());
        let mut replay_endpoint = None;
        if let Some(ep) = &config.replay_endpoint {
            let mut router = zeromq::RouterSocket::new();
            let bound = router
                .bind(&bind_address(ep))
                .await
                .with_context(|| format!("binding KV event replay socket {ep}"))?;
            replay_endpoint = Some(bound.to_string());
            let replay = Replay {
                socket: router,
                buffer: buffer.clone(),
                topic: topic.clone(),
            };
            tokio::spawn(replay.run());
        }
        info!(pub_endpoint = ?pub_endpoint, replay_endpoint = ?replay_endpoint, "KV events publisher up");
        let (tx, rx) = mpsc::channel(config.max_queue_size.max(1));
        let drop_live = Arc::new(AtomicU64::new(0));
        let task = PublishLoop {
            drop_live: drop_live.clone(),
            socket: pub_socket,
            connect_to,
            rx,
            buffer,
            buffer_steps: config.buffer_steps.max(1),
            topic,
            next_seq: 0,
            dp_rank,
        };
        tokio::spawn(task.run());
        Ok(Self {
            tx,
            endpoints: PublisherEndpoints {
                pub_endpoint,
                replay_endpoint,
            },
            drop_live,
        })
    }
}

/// Longest one connect attempt of the PUB socket may take (the crate's own retries within
/// it back off from 50 ms).
const CONNECT_ATTEMPT: std::time::Duration = std::time::Duration::from_secs(1);

/// Pause between connect attempts: libzmq's default `ZMQ_RECONNECT_IVL`.
const RECONNECT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

struct PublishLoop {
    socket: zeromq::PubSocket,
    /// Endpoint to connect to before publishing (connect mode).
    connect_to: Option<String>,
    rx: mpsc::Receiver<PublisherMsg>,
    buffer: ReplayBuffer,
    buffer_steps: usize,
    topic: Bytes,
    next_seq: u64,
    dp_rank: u32,
    /// Batches still to leave off the PUB socket ([`Publisher::drop_live`]).
    drop_live: Arc<AtomicU64>,
}

impl PublishLoop {
    /// Connects the PUB socket to `ep`, retrying until the subscriber has bound it: a fresh
    /// attempt every [`RECONNECT_INTERVAL`] after each one that fails or times out, as libzmq
    /// reconnects. Logs the first failure only.
    async fn connect(&mut self, ep: &str) {
        let mut failures = 0u64;
        while let Err(e) = self.socket.connect(ep).await {
            if failures == 0 {
                warn!(endpoint = %ep, error = %e, "KV event PUB socket cannot connect yet; retrying");
            }
            failures += 1;
            tokio::time::sleep(RECONNECT_INTERVAL).await;
        }
        info!(endpoint = %ep, failures, "KV event PUB socket connected");
    }

    async fn run(mut self) {
        use futures::StreamExt as _;
        // In connect mode the subscriber binds (the sidecar, on 127.0.0.1): when it restarts,
        // connect again, as libzmq does for vLLM. Batches wait in the queue meanwhile.
        let connect_to = self.connect_to.take();
        let mut monitor = match &connect_to {
            Some(ep) => {
                let monitor = self.socket.monitor();
                self.connect(ep).await;
                Some(monitor)
            }
            None => None,
        };
        loop {
            let next = async {
                match monitor.as_mut() {
                    Some(m) => m.next().await,
                    None => std::future::pending().await,
                }
            };
            let msg = tokio::select! {
                msg = self.rx.recv() => msg,
                event = next => {
                    match (event, &connect_to) {
                        (Some(zeromq::SocketEvent::Disconnected(_)), Some(ep)) => {
                            warn!(endpoint = %ep, "KV event subscriber went away; reconnecting");
                            self.connect(ep).await;
                        }
                        (None, _) => monitor = None,
                        _ => {}
                    }
                    continue;
                }
            };
            let Some(msg) = msg else { break };
            match msg {
                PublisherMsg::Restart => {
                    self.next_seq = 0;
                    self.buffer.lock().clear();
                }
                PublisherMsg::Batch { ts, events } => {
                    if events.is_empty() {
                        continue;
                    }
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    let payload = Bytes::from(wire::encode_batch(
                        ts,
                        &events,
                        Some(i64::from(self.dp_rank)),
                    ));
                    {
                        let mut buf = self.buffer.lock();
                        buf.push_back((seq, payload.clone()));
                        while buf.len() > self.buffer_steps {
                            buf.pop_front();
                        }
                    }
                    let dropped = self
                        .drop_live
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                        .is_ok();
                    if dropped {
                        debug!(seq, "KV event batch dropped (POST /mock/drop-events)");
                        continue;
                    }
                    let frames = wire::live_message(self.topic.clone(), seq, payload);
                    let Ok(msg) = ZmqMessage::try_from(frames.to_vec()) else {
                        continue;
                    };
                    // Like ZMQ past the high-water mark: a failed send is dropped, the seq gap
                    // tells subscribers to replay.
                    if let Err(e) = self.socket.send(msg).await {
                        debug!(error = %e, seq, "KV event publish failed");
                    }
                }
            }
        }
    }
}

struct Replay {
    socket: zeromq::RouterSocket,
    buffer: ReplayBuffer,
    topic: Bytes,
}

impl Replay {
    async fn run(mut self) {
        loop {
            let msg = match self.socket.recv().await {
                Ok(m) => m,
                Err(e) => {
                    debug!(error = %e, "replay socket receive failed");
                    continue;
                }
            };
            let mut frames = msg.into_vec();
            if frames.is_empty() {
                continue;
            }
            let identity = frames.remove(0);
            let start = match wire::parse_replay_request(&frames) {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "bad KV event replay request");
                    continue;
                }
            };
            let batches: Vec<(u64, Bytes)> = self
                .buffer
                .lock()
                .iter()
                .filter(|(seq, _)| *seq >= start)
                .cloned()
                .collect();
            for (seq, payload) in batches {
                let mut frames = vec![identity.clone()];
                frames.extend(wire::replay_reply(self.topic.clone(), seq, payload));
                if let Ok(m) = ZmqMessage::try_from(frames)
                    && self.socket.send(m).await.is_err()
                {
                    break;
                }
            }
            let mut end = vec![identity];
            end.extend(wire::replay_end::<Bytes>());
            if let Ok(m) = ZmqMessage::try_from(end) {
                let _ = self.socket.send(m).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_rules_and_config_defaults() {
        assert!(pub_should_bind("tcp://*:5557"));
        assert!(pub_should_bind("ipc:///tmp/x"));
        assert!(pub_should_bind("tcp://127.0.0.1:0"));
        assert!(!pub_should_bind("tcp://127.0.0.1:5557"));
        let c = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "replay_endpoint": "tcp://*:5657", "future_key": 1}"#,
        )
        .unwrap();
        assert!(c.publishes());
        assert_eq!(c.endpoint, "tcp://*:5557");
        assert_eq!(c.buffer_steps, 10_000);
        assert_eq!(c.topic, "");
        assert!(
            !KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "null"}"#)
                .unwrap()
                .publishes()
        );
    }
}
