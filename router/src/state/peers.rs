//! The state's side of the peer exchange (docs/replicas.md): this replica's placements
//! published as [`PeerEvent`]s for the peer streams, and the peers' updates applied to the
//! routing core's [`crate::routing::PeerShare`].
//!
//! ```text
//! pick --assign--> publish(Placed)   first_token --> publish(Started)   release / expire / retire --> publish(Ended)
//!                     \--> broadcast channel --> one dialer task per peer --> Peers.Share
//! Peers.Share (peer's stream) --apply_peer_update--> core.peers_mut(): placed / started / ended / reset
//!                     stream ended --peer_lost--> the peer's share decays
//! ```

use std::time::Instant;

use kvroute_proto::v1::PeerPlacement;
use tokio::sync::broadcast;

use super::RouterState;
use crate::peer::wire::{PeerEvent, Update};
use crate::routing::{AssignmentId, PeerPlacement as CorePlacement, RoutingCore};

/// Events buffered per peer stream before a slow one lags (and gets a full list again).
const EVENT_BUFFER: usize = 16_384;

/// What applying one peer update did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerApplied {
    /// Placements taken.
    pub placed: usize,
    /// Placements naming a worker this replica does not know (skipped).
    pub unknown_worker: usize,
    /// Placements refused at the cap.
    pub refused: usize,
}

/// A placement of `routing`'s outstanding assignment `id`, as peers are told about it.
pub(super) fn placement_of(routing: &RoutingCore, id: AssignmentId) -> Option<PeerPlacement> {
    let a = routing.assignment(id)?;
    let key = routing.worker(a.worker)?.key.clone();
    Some(PeerPlacement {
        id: id.0,
        worker: key,
        blocks: routing
            .placement_chain(id)
            .map(<[u64]>::to_vec)
            .unwrap_or_default(),
        prompt_tokens: a.prompt_tokens,
        uncached_tokens: a.uncached_tokens,
        kv_tokens: a.kv_need_tokens + a.output_tokens,
        started: a.first_token_at.is_some(),
    })
}

impl RouterState {
    /// This replica's id in the peer exchange (random per process).
    pub fn replica_id(&self) -> &str {
        &self.0.replica_id
    }

    /// Subscribes to this replica's placement events; the first call turns publishing on
    /// (without peers nothing is published).
    pub fn peer_events(&self) -> broadcast::Receiver<PeerEvent> {
        self.0
            .peer_events
            .get_or_init(|| broadcast::channel(EVENT_BUFFER).0)
            .subscribe()
    }

    /// True once a peer stream subscribed.
    pub(super) fn peers_on(&self) -> bool {
        self.0.peer_events.get().is_some()
    }

    /// Publishes an event to the peer streams (none subscribed: dropped).
    pub(super) fn publish(&self, event: PeerEvent) {
        if let Some(tx) = self.0.peer_events.get() {
            let _ = tx.send(event);
        }
    }

    /// Every outstanding placement of this replica (the full list a peer stream starts with).
    pub fn own_placements(&self) -> Vec<PeerPlacement> {
        let core = self.0.core.lock();
        let ids: Vec<AssignmentId> = core.routing.assignments().map(|(id, _)| id).collect();
        ids.into_iter()
            .filter_map(|id| placement_of(&core.routing, id))
            .collect()
    }

    /// A peer's stream opened (its share counts in full again).
    pub fn peer_connected(&self, replica: &str) {
        self.0.core.lock().routing.peers_mut().connected(replica);
    }

    /// A peer's stream ended at `now`: its share decays.
    pub fn peer_lost(&self, replica: &str, now: Instant) {
        let t = self.secs(now);
        self.0.core.lock().routing.peers_mut().lost(replica, t);
    }

    /// Applies a checked peer update at `now`.
    pub fn apply_peer_update(&self, u: &Update, now: Instant) -> PeerApplied {
        let t = self.secs(now);
        let mut out = PeerApplied::default();
        let mut core = self.0.core.lock();
        let routing = &mut core.routing;
        if u.reset {
            routing.peers_mut().reset(&u.replica, t);
        }
        for p in &u.placed {
            let Some(w) = routing.worker_id(&p.worker) else {
                out.unknown_worker += 1;
                continue;
            };
            let placement = CorePlacement {
                id: p.id,
                worker: w,
                chain: p.blocks.clone(),
                uncached_tokens: p.uncached_tokens,
                prompt_tokens: p.prompt_tokens,
                kv_tokens: p.kv_tokens,
                started: p.started,
            };
            match routing.peers_mut().placed(&u.replica, placement, t) {
                Ok(()) => out.placed += 1,
                Err(_) => out.refused += 1,
            }
        }
        for &id in &u.started {
            routing.peers_mut().started(&u.replica, id, t);
        }
        for &id in &u.ended {
            routing.peers_mut().ended(&u.replica, id, t);
        }
        out
    }

    /// Peer placements held now.
    pub fn peer_placements(&self) -> usize {
        self.0.core.lock().routing.peers().placements()
    }

    /// True when this replica holds peer `replica`'s placement `id`.
    pub fn holds_peer_placement(&self, replica: &str, id: u64) -> bool {
        self.0.core.lock().routing.peers().holds(replica, id)
    }
}
