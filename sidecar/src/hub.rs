//! The hub between the ZMQ side and the router streams: the resident set, the epoch, and one
//! bounded queue of pending changes per router endpoint.
//!
//! ```text
//! zmq loop --apply_batch / resync--> Hub { ResidentSet, epoch, queues[router] } --take--> pusher
//! scraper  --set_load--------------^
//! ```
//!
//! Applying events and queueing the resulting ops happen under one lock, and so does taking a
//! snapshot and clearing a queue: a snapshot is therefore always consistent with the deltas
//! that follow it. A queue that would exceed its cap is dropped and replaced by "send a
//! snapshot", so a slow or absent router costs bounded memory.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use kvroute_hash::BlockHash;
use kvroute_proto::v1::LoadSample;
use kvroute_vllm_wire::KvEvent;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::lora::{LoraChange, LoraSet};
use crate::state::{ApplyStats, Ops, ResidentSet};

/// What a pusher should send next.
#[derive(Debug)]
pub enum Outgoing {
    /// Replace the router's view: every resident block, for this epoch and block size.
    Snapshot {
        /// The epoch the blocks belong to.
        epoch: u64,
        /// Tokens per block.
        block_size: u32,
        /// Every resident block.
        blocks: Vec<BlockHash>,
    },
    /// Changes since the last take, in order.
    Deltas(Vec<Ops>),
}

#[derive(Debug, Default)]
struct RouterQueue {
    pending: VecDeque<Ops>,
    queued_blocks: usize,
    needs_snapshot: bool,
    load: Option<LoadSample>,
    /// Times the queue hit its cap and was replaced by a snapshot request.
    overflows: u64,
    notify: Arc<Notify>,
}

impl RouterQueue {
    fn push(&mut self, ops: &Ops, cap: usize) {
        if self.needs_snapshot {
            return; // the snapshot will include these changes
        }
        let n = ops.blocks().max(1);
        if self.queued_blocks + n > cap {
            self.pending.clear();
            self.queued_blocks = 0;
            self.needs_snapshot = true;
            self.overflows += 1;
            return;
        }
        self.pending.push_back(ops.clone());
        self.queued_blocks += n;
    }
}

struct Inner {
    state: ResidentSet,
    epoch: u64,
    /// Start time of the vLLM process the current epoch's state came from, when known (from
    /// vLLM's `process_start_time_seconds`); cleared when the ZMQ side resyncs by itself.
    vllm_start: Option<f64>,
    routers: HashMap<String, RouterQueue>,
    /// The LoRA adapters vLLM serves (polled, plus names seen in events).
    lora: LoraSet,
}

/// Shared between the ZMQ loop, the scraper and the pushers.
pub struct Hub {
    inner: Mutex<Inner>,
    /// Raised when vLLM's metrics show a new process: the ZMQ side reconnects at once
    /// instead of waiting for the socket's own reconnect backoff (up to 30 s).
    restarted: Notify,
    /// Most blocks a router queue may hold before it is coalesced into a snapshot.
    queue_cap_blocks: usize,
}

impl Hub {
    /// A hub over `state` in `epoch`, each router queue holding at most `queue_cap_blocks` blocks.
    pub fn new(state: ResidentSet, epoch: u64, queue_cap_blocks: usize) -> Self {
        Hub {
            restarted: Notify::new(),
            inner: Mutex::new(Inner {
                state,
                epoch,
                vllm_start: None,
                routers: HashMap::new(),
                lora: LoraSet::default(),
            }),
            queue_cap_blocks,
        }
    }

    /// Applies a batch of events and queues the resulting changes for every router.
    pub fn apply_batch(&self, events: &[KvEvent]) -> ApplyStats {
        let mut ops = Ops::default();
        let mut stats = ApplyStats::default();
        let mut g = self.inner.lock();
        let block_size_before = g.state.block_size();
        for event in events {
            g.state.apply(event, &mut ops, &mut stats);
            if let KvEvent::Stored(s) = event
                && let Some(name) = &s.lora_name
            {
                stats.lora_dropped += g.lora.note(name).dropped;
            }
        }
        // A new block size changes the identity: every router needs a fresh snapshot.
        let identity_changed = g.state.block_size() != block_size_before;
        let cap = self.queue_cap_blocks;
        for q in g.routers.values_mut() {
            if identity_changed {
                q.needs_snapshot = true;
                q.pending.clear();
                q.queued_blocks = 0;
            } else if !ops.is_empty() {
                q.push(&ops, cap);
            } else {
                continue;
            }
            q.notify.notify_one();
        }
        stats
    }

    /// Drops the worker's state and starts a new epoch; every router gets a snapshot.
    pub fn resync(&self) -> u64 {
        let mut g = self.inner.lock();
        g.vllm_start = None;
        Self::resync_locked(&mut g)
    }

    /// Notes the start time of the vLLM process (from its metrics). vLLM publishes nothing
    /// until its first engine step, so after a restart the event stream alone would keep the
    /// old process's blocks until the first request; a changed start time resyncs at once.
    /// Returns true when it resynced. After a resync by the ZMQ side (seq went back) the
    /// next start time seen is simply adopted, so one restart never drops the state twice.
    pub fn observe_vllm_start(&self, start: f64) -> bool {
        let mut g = self.inner.lock();
        match g.vllm_start {
            Some(known) if known == start => false,
            None => {
                g.vllm_start = Some(start);
                false
            }
            Some(_) => {
                g.vllm_start = Some(start);
                Self::resync_locked(&mut g);
                self.restarted.notify_one();
                true
            }
        }
    }

    /// Completes after [`Hub::observe_vllm_start`] saw a vLLM restart.
    pub async fn vllm_restarted(&self) {
        self.restarted.notified().await
    }

    fn resync_locked(g: &mut Inner) -> u64 {
        g.state.reset();
        g.epoch = g.epoch.wrapping_add(1);
        for q in g.routers.values_mut() {
            q.pending.clear();
            q.queued_blocks = 0;
            q.needs_snapshot = true;
            q.notify.notify_one();
        }
        g.epoch
    }

    /// Replaces the LoRA adapters with what vLLM's `/v1/models` lists.
    pub fn set_adapters(&self, polled: Vec<(String, String)>) -> LoraChange {
        self.inner.lock().lora.replace(polled)
    }

    /// The LoRA adapters known now.
    pub fn adapters(&self) -> LoraSet {
        self.inner.lock().lora.clone()
    }

    /// Latest load sample, with the adapter list added; each router sends only the newest
    /// one.
    pub fn set_load(&self, mut sample: LoadSample) {
        let mut g = self.inner.lock();
        sample.lora_adapters = Some(g.lora.to_proto());
        for q in g.routers.values_mut() {
            q.load = Some(sample.clone());
            q.notify.notify_one();
        }
    }

    /// Adopts a block size learned outside the event stream (vLLM's metrics) when none is
    /// known yet.
    pub fn learn_block_size(&self, block_size: u32) {
        let mut g = self.inner.lock();
        if g.state.block_size().is_none() && block_size > 0 {
            g.state.set_block_size(block_size);
            for q in g.routers.values_mut() {
                q.needs_snapshot = true;
                q.pending.clear();
                q.queued_blocks = 0;
                q.notify.notify_one();
            }
        }
    }

    /// Registers a router endpoint; its first take is a snapshot.
    pub fn register(&self, key: &str) -> Arc<Notify> {
        let mut g = self.inner.lock();
        let q = g.routers.entry(key.to_owned()).or_default();
        q.needs_snapshot = true;
        q.notify.notify_one();
        q.notify.clone()
    }

    /// Forgets a router endpoint and its queue.
    pub fn unregister(&self, key: &str) {
        self.inner.lock().routers.remove(key);
    }

    /// The next snapshot for `key` will be a full one (reconnect, router request).
    pub fn request_snapshot(&self, key: &str) {
        if let Some(q) = self.inner.lock().routers.get_mut(key) {
            q.needs_snapshot = true;
            q.pending.clear();
            q.queued_blocks = 0;
            q.notify.notify_one();
        }
    }

    /// Takes what `key` should send next: a snapshot when one is needed, else up to
    /// `max_blocks` worth of queued deltas; plus the latest load sample.
    pub fn take(&self, key: &str, max_blocks: usize) -> (Option<Outgoing>, Option<LoadSample>) {
        let mut g = self.inner.lock();
        let Inner {
            state,
            epoch,
            routers,
            ..
        } = &mut *g;
        let Some(q) = routers.get_mut(key) else {
            return (None, None);
        };
        let load = q.load.take();
        if q.needs_snapshot {
            q.needs_snapshot = false;
            q.pending.clear();
            q.queued_blocks = 0;
            let snapshot = Outgoing::Snapshot {
                epoch: *epoch,
                block_size: state.block_size().unwrap_or(0),
                blocks: state.blocks().collect(),
            };
            return (Some(snapshot), load);
        }
        let mut out = Vec::new();
        let mut taken = 0;
        while let Some(ops) = q.pending.front() {
            let n = ops.blocks().max(1);
            if !out.is_empty() && taken + n > max_blocks {
                break;
            }
            taken += n;
            q.queued_blocks = q.queued_blocks.saturating_sub(n);
            out.extend(q.pending.pop_front());
        }
        if !q.pending.is_empty() {
            q.notify.notify_one();
        }
        ((!out.is_empty()).then_some(Outgoing::Deltas(out)), load)
    }

    /// Blocks queued for `key` (a gauge; bounded by the cap).
    pub fn queued_blocks(&self, key: &str) -> usize {
        self.inner
            .lock()
            .routers
            .get(key)
            .map_or(0, |q| q.queued_blocks)
    }

    /// Times the queue of `key` overflowed into a snapshot.
    pub fn overflows(&self, key: &str) -> u64 {
        self.inner
            .lock()
            .routers
            .get(key)
            .map_or(0, |q| q.overflows)
    }

    /// Most blocks a router queue holds before it becomes a snapshot request.
    pub fn queue_cap_blocks(&self) -> usize {
        self.queue_cap_blocks
    }

    /// The current epoch (raised on every resync).
    pub fn epoch(&self) -> u64 {
        self.inner.lock().epoch
    }

    /// How many blocks are resident.
    pub fn resident_blocks(&self) -> usize {
        self.inner.lock().state.len()
    }

    /// A copy of the resident kvroute hashes (for tests and the interop check).
    pub fn resident_set(&self) -> Vec<BlockHash> {
        self.inner.lock().state.blocks().collect()
    }

    /// The block size: configured, or learned from the events or vLLM's metrics; `None` before.
    pub fn block_size(&self) -> Option<u32> {
        self.inner.lock().state.block_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateConfig;
    use kvroute_vllm_wire::BlockStored;

    fn hub() -> Hub {
        let state = ResidentSet::new(StateConfig {
            model: "m".into(),
            default_lora: None,
            block_size: None,
            max_blocks: 100,
        });
        Hub::new(state, 7, 4)
    }

    fn store(h: u64) -> KvEvent {
        KvEvent::Stored(BlockStored {
            block_hashes: vec![h],
            token_ids: vec![h as u32, 0],
            block_size: Some(2),
            ..Default::default()
        })
    }

    #[test]
    fn vllm_start_time_change_resyncs_once() {
        let hub = hub();
        assert!(!hub.observe_vllm_start(100.0));
        hub.apply_batch(&[store(1)]);
        assert!(!hub.observe_vllm_start(100.0));
        assert_eq!(hub.resident_blocks(), 1);
        assert!(hub.observe_vllm_start(200.0));
        assert_eq!((hub.resident_blocks(), hub.epoch()), (0, 8));
        // The ZMQ side saw the next restart first: the new start time is adopted, no 2nd drop.
        hub.resync();
        hub.apply_batch(&[store(1)]);
        assert!(!hub.observe_vllm_start(300.0));
        assert_eq!((hub.resident_blocks(), hub.epoch()), (1, 9));
    }

    #[test]
    fn queue_overflow_turns_into_a_snapshot() {
        let hub = hub();
        hub.register("r");
        assert!(matches!(
            hub.take("r", 100).0,
            Some(Outgoing::Snapshot { epoch: 7, .. })
        ));
        // The first store teaches the block size: a new identity, so a snapshot again.
        hub.apply_batch(&[store(1)]);
        assert!(matches!(
            hub.take("r", 100).0,
            Some(Outgoing::Snapshot { block_size: 2, .. })
        ));
        hub.apply_batch(&[store(2), store(3)]);
        assert_eq!(hub.queued_blocks("r"), 2);
        assert!(matches!(hub.take("r", 100).0, Some(Outgoing::Deltas(d)) if d.len() == 1));
        for h in 10..20 {
            hub.apply_batch(&[store(h)]);
            assert!(hub.queued_blocks("r") <= 4);
        }
        assert!(hub.overflows("r") >= 1);
        let Some(Outgoing::Snapshot {
            blocks, block_size, ..
        }) = hub.take("r", 100).0
        else {
            panic!("no snapshot")
        };
        assert_eq!((blocks.len(), block_size), (13, 2));
    }
    #[test]
    fn load_samples_carry_the_adapters_of_polls_and_events() {
        let hub = hub();
        hub.register("r");
        hub.set_load(LoadSample::default());
        let (_, load) = hub.take("r", 100);
        assert_eq!(load.unwrap().lora_adapters, Some(Default::default()));
        hub.set_adapters(vec![("sql".into(), "m".into())]);
        let KvEvent::Stored(mut s) = store(5) else {
            unreachable!()
        };
        s.lora_name = Some("de".into());
        hub.apply_batch(&[KvEvent::Stored(s)]);
        hub.set_load(LoadSample::default());
        let (_, load) = hub.take("r", 100);
        let adapters = load.unwrap().lora_adapters.unwrap().adapters;
        let got: Vec<(&str, &str)> = adapters
            .iter()
            .map(|a| (a.name.as_str(), a.base_model.as_str()))
            .collect();
        assert_eq!(got, [("de", ""), ("sql", "m")]);
    }
}
