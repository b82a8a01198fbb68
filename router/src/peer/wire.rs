//! The peer exchange's wire format: a [`PeerUpdate`] checked into an [`Update`] the state can
//! apply, and the updates a replica sends. Tolerant (unknown fields are skipped by prost),
//! bounded (a peer cannot make this replica hold more than the caps allow), typed errors;
//! golden bytes in `proto/tests/peer_golden.rs`, fuzzed by `router/fuzz/fuzz_targets/peer_update.rs`.
//!
//! ```text
//! bytes --prost--> PeerUpdate --Update::check(limits)--> Update { replica, reset, placed, started, ended }
//! own events (placed / started / ended) --batch()--> PeerUpdate
//! ```

use kvroute_proto::v1::{PeerPlacement, PeerUpdate};

/// Caps on one update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireLimits {
    /// Longest replica id.
    pub max_replica_len: usize,
    /// Longest worker key.
    pub max_worker_len: usize,
    /// Most placements, started and ended ids in one update, together.
    pub max_items: usize,
    /// Most blocks in one placement's chain.
    pub max_blocks: usize,
}

impl Default for WireLimits {
    fn default() -> Self {
        Self {
            max_replica_len: 128,
            max_worker_len: 253,
            max_items: 16_384,
            max_blocks: 8_192,
        }
    }
}

/// Why an update was refused. `label()` is the metric label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// No replica id, or one too long or not printable ASCII.
    #[error("bad replica id")]
    BadReplica,
    /// More items than [`WireLimits::max_items`].
    #[error("{0} items in one update, more than allowed")]
    TooManyItems(usize),
    /// A placement names no worker, or a key too long.
    #[error("a placement's worker key is empty or too long")]
    BadWorker,
    /// A placement's chain is longer than [`WireLimits::max_blocks`].
    #[error("a placement carries {0} blocks, more than allowed")]
    TooManyBlocks(usize),
}

impl WireError {
    /// Metric label (a fixed set).
    pub fn label(&self) -> &'static str {
        match self {
            WireError::BadReplica => "bad_replica",
            WireError::TooManyItems(_) => "too_many_items",
            WireError::BadWorker => "bad_worker",
            WireError::TooManyBlocks(_) => "too_many_blocks",
        }
    }
}

/// A checked update.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    /// The sender's replica id.
    pub replica: String,
    /// Its sequence number on the stream.
    pub seq: u64,
    /// Drop what is held of the sender first.
    pub reset: bool,
    /// New placements.
    pub placed: Vec<PeerPlacement>,
    /// Placements past their first token.
    pub started: Vec<u64>,
    /// Placements that ended.
    pub ended: Vec<u64>,
}

fn printable(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic())
}

impl Update {
    /// Checks `u` against `limits`.
    pub fn check(u: PeerUpdate, limits: &WireLimits) -> Result<Self, WireError> {
        if u.replica.is_empty()
            || u.replica.len() > limits.max_replica_len
            || !printable(&u.replica)
        {
            return Err(WireError::BadReplica);
        }
        let items = u.placed.len() + u.started.len() + u.ended.len();
        if items > limits.max_items {
            return Err(WireError::TooManyItems(items));
        }
        for p in &u.placed {
            if p.worker.is_empty() || p.worker.len() > limits.max_worker_len {
                return Err(WireError::BadWorker);
            }
            if p.blocks.len() > limits.max_blocks {
                return Err(WireError::TooManyBlocks(p.blocks.len()));
            }
        }
        Ok(Self {
            replica: u.replica,
            seq: u.seq,
            reset: u.reset,
            placed: u.placed,
            started: u.started,
            ended: u.ended,
        })
    }
}

/// One change of a replica's own placements, as it is published to the peer streams.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerEvent {
    /// A request was placed.
    Placed(PeerPlacement),
    /// A placement got its first token.
    Started(u64),
    /// A placement ended.
    Ended(u64),
}

/// Gathers events into one update of at most `max_items` items (the rest stay for the next).
pub fn batch(replica: &str, seq: u64, events: &mut Vec<PeerEvent>, max_items: usize) -> PeerUpdate {
    let take = events.len().min(max_items.max(1));
    let mut u = PeerUpdate {
        replica: replica.to_owned(),
        seq,
        ..PeerUpdate::default()
    };
    for e in events.drain(..take) {
        match e {
            PeerEvent::Placed(p) => u.placed.push(p),
            PeerEvent::Started(id) => u.started.push(id),
            PeerEvent::Ended(id) => u.ended.push(id),
        }
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(worker: &str, blocks: usize) -> PeerPlacement {
        PeerPlacement {
            id: 1,
            worker: worker.into(),
            blocks: vec![7; blocks],
            ..PeerPlacement::default()
        }
    }

    #[test]
    fn checks_replica_worker_and_sizes() {
        let l = WireLimits {
            max_items: 3,
            max_blocks: 4,
            ..WireLimits::default()
        };
        let ok = PeerUpdate {
            replica: "r1".into(),
            placed: vec![placement("ns/w0", 4)],
            started: vec![1],
            ended: vec![2],
            ..PeerUpdate::default()
        };
        assert!(Update::check(ok.clone(), &l).is_ok());
        let bad = |f: fn(&mut PeerUpdate)| {
            let mut u = ok.clone();
            f(&mut u);
            Update::check(u, &l).map(|_| ()).map_err(|e| e.label())
        };
        assert_eq!(bad(|u| u.replica.clear()), Err("bad_replica"));
        assert_eq!(bad(|u| u.replica = "a b".into()), Err("bad_replica"));
        assert_eq!(bad(|u| u.ended.push(3)), Err("too_many_items"));
        assert_eq!(bad(|u| u.placed[0].worker.clear()), Err("bad_worker"));
        assert_eq!(bad(|u| u.placed[0].blocks.push(1)), Err("too_many_blocks"));
    }

    #[test]
    fn batches_keep_order_and_leave_the_rest() {
        let mut events = vec![
            PeerEvent::Placed(placement("w", 1)),
            PeerEvent::Started(1),
            PeerEvent::Ended(1),
        ];
        let u = batch("r", 5, &mut events, 2);
        assert_eq!(
            (u.seq, u.placed.len(), u.started, u.ended.len()),
            (5, 1, vec![1], 0)
        );
        assert_eq!(events, vec![PeerEvent::Ended(1)]);
    }
}
