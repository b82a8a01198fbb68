//! The other router replicas' placements: what each peer replica sent to which worker and has
//! not seen end yet, so that this replica's pending overlay and load estimate count them too
//! (active-active replicas that do not herd; docs/replicas.md).
//!
//! ```text
//! peer stream --placed(peer, id, w, chain, figures)--> PeerShare { overlay (blocks), loads per worker }
//!             --started(peer, id) / ended(peer, id) / reset(peer)-->
//!             --lost(peer, now): its share decays linearly to 0 over `decay_s`, then is dropped
//! plan: leading(w, chain) next to the own overlay; load(w) added to the own in-flight figures
//! ```
//!
//! A placement older than `ttl_s` is dropped whatever its peer said (an end that never came).
//! Ids are the peer's own assignment ids; each placement gets a local id for the overlay.

use std::collections::HashMap;

use kvroute_hash::BlockHash;
use serde::Serialize;

use super::assign::AssignmentId;
use super::overlay::Overlay;
use super::workers::WorkerId;

/// Settings of the peers' share.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PeerConfig {
    /// Seconds over which a lost peer's placements decay from full weight to nothing.
    pub decay_s: f64,
    /// A peer placement is dropped this many seconds after it was made, ended or not.
    pub ttl_s: f64,
    /// Seconds a placement's blocks still count as cached on its worker after its first token
    /// (as `CoreConfig::pending_grace_s` for the replica's own).
    pub grace_s: f64,
    /// Most peer placements held at once; more are refused (counted by the caller).
    pub max_placements: usize,
    /// Most blocks of a peer placement's chain kept (the rest are cut).
    pub max_chain_blocks: usize,
}

impl Default for PeerConfig {
    fn default() -> Self {
        Self {
            decay_s: 10.0,
            ttl_s: 600.0,
            grace_s: 1.0,
            max_placements: 65_536,
            max_chain_blocks: 8_192,
        }
    }
}

/// A peer's placement as its stream describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerPlacement {
    /// The peer's assignment id.
    pub id: u64,
    /// The worker (resolved by the caller from the worker key).
    pub worker: WorkerId,
    /// The prompt's hash chain at the worker's block size.
    pub chain: Vec<BlockHash>,
    /// Prefill tokens the peer expected there (its uncached tokens).
    pub uncached_tokens: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// KV the request holds there (its KV need plus expected output).
    pub kv_tokens: u64,
    /// Already past its first token.
    pub started: bool,
}

/// What the peers' outstanding placements add on one worker (weighted: a lost peer's share
/// is scaled down while it decays).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PeerLoad {
    /// Placements waiting for their first token.
    pub waiting: f64,
    /// Their uncached prompt tokens.
    pub waiting_prefill_tokens: f64,
    /// Placements decoding.
    pub decoding: f64,
    /// Prompt tokens of every outstanding placement.
    pub active_tokens: f64,
    /// Uncached prompt tokens of every outstanding placement.
    pub active_uncached_tokens: f64,
    /// KV every outstanding placement holds.
    pub active_kv_tokens: f64,
}

#[derive(Clone, Debug)]
struct Held {
    local: AssignmentId,
    worker: WorkerId,
    uncached: u64,
    prompt: u64,
    kv: u64,
    started: bool,
    placed_at: f64,
}

/// Sums of one peer's outstanding placements on one worker.
#[derive(Clone, Copy, Debug, Default)]
struct Sums {
    waiting: u64,
    waiting_prefill: u64,
    decoding: u64,
    active: u64,
    active_uncached: u64,
    active_kv: u64,
}

impl Sums {
    /// Adds (`sign` 1) or removes (`sign` -1) a placement.
    fn apply(&mut self, h: &Held, sign: i8) {
        let f = |v: &mut u64, x: u64| {
            *v = if sign > 0 {
                v.saturating_add(x)
            } else {
                v.saturating_sub(x)
            };
        };
        if h.started {
            f(&mut self.decoding, 1);
        } else {
            f(&mut self.waiting, 1);
            f(&mut self.waiting_prefill, h.uncached);
        }
        f(&mut self.active, h.prompt);
        f(&mut self.active_uncached, h.uncached);
        f(&mut self.active_kv, h.kv);
    }
}

#[derive(Clone, Debug, Default)]
struct Peer {
    name: String,
    /// When its stream ended (`None`: connected).
    lost_at: Option<f64>,
    /// Outstanding placements by the peer's id.
    held: HashMap<u64, Held>,
    /// Their sums per worker (by worker index), kept with `held`.
    sums: Vec<Sums>,
}

impl Peer {
    fn add(&mut self, id: u64, h: Held) {
        let i = h.worker.index();
        if self.sums.len() <= i {
            self.sums.resize(i + 1, Sums::default());
        }
        self.sums[i].apply(&h, 1);
        if let Some(old) = self.held.insert(id, h) {
            self.sub(&old);
        }
    }

    fn sub(&mut self, h: &Held) {
        if let Some(s) = self.sums.get_mut(h.worker.index()) {
            s.apply(h, -1);
        }
    }

    fn remove(&mut self, id: u64) -> Option<Held> {
        let h = self.held.remove(&id)?;
        self.sub(&h);
        Some(h)
    }
}

/// Why a peer placement was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerRefused {
    /// [`PeerConfig::max_placements`] are held already.
    Full,
}

/// Every peer's outstanding placements.
#[derive(Debug, Default)]
pub struct PeerShare {
    cfg: PeerConfig,
    peers: Vec<Peer>,
    overlay: Overlay,
    next_local: u64,
    placements: usize,
}

impl PeerShare {
    /// An empty share.
    pub fn new(cfg: PeerConfig) -> Self {
        Self {
            cfg,
            ..Self::default()
        }
    }

    fn peer(&mut self, name: &str) -> usize {
        if let Some(i) = self.peers.iter().position(|p| p.name == name) {
            return i;
        }
        self.peers.push(Peer {
            name: name.to_owned(),
            ..Peer::default()
        });
        self.peers.len() - 1
    }

    /// The peer (re)connected: its share counts in full again.
    pub fn connected(&mut self, peer: &str) {
        let i = self.peer(peer);
        self.peers[i].lost_at = None;
    }

    /// The peer placed a request (a repeated id replaces the earlier placement).
    pub fn placed(&mut self, peer: &str, p: PeerPlacement, now: f64) -> Result<(), PeerRefused> {
        let i = self.peer(peer);
        self.ended(peer, p.id, now);
        if self.placements >= self.cfg.max_placements {
            return Err(PeerRefused::Full);
        }
        self.next_local += 1;
        let local = AssignmentId(self.next_local);
        let mut chain = p.chain;
        chain.truncate(self.cfg.max_chain_blocks);
        self.overlay.add(local, p.worker, chain);
        if p.started {
            self.overlay.settle(local, now, self.cfg.grace_s);
        }
        self.peers[i].add(
            p.id,
            Held {
                local,
                worker: p.worker,
                uncached: p.uncached_tokens,
                prompt: p.prompt_tokens,
                kv: p.kv_tokens,
                started: p.started,
                placed_at: now,
            },
        );
        self.placements += 1;
        Ok(())
    }

    /// The peer's placement `id` got its first token.
    pub fn started(&mut self, peer: &str, id: u64, now: f64) {
        let Some(i) = self.peers.iter().position(|p| p.name == peer) else {
            return;
        };
        let peer = &mut self.peers[i];
        if let Some(h) = peer.held.get(&id).cloned()
            && !h.started
        {
            peer.sub(&h);
            let started = Held { started: true, ..h };
            if let Some(s) = peer.sums.get_mut(started.worker.index()) {
                s.apply(&started, 1);
            }
            peer.held.insert(id, started);
            self.overlay.settle(h.local, now, self.cfg.grace_s);
        }
    }

    /// The peer's placement `id` ended (done, aborted, expired there).
    pub fn ended(&mut self, peer: &str, id: u64, now: f64) {
        let Some(i) = self.peers.iter().position(|p| p.name == peer) else {
            return;
        };
        if let Some(h) = self.peers[i].remove(id) {
            self.overlay.end(h.local, now);
            self.placements -= 1;
        }
    }

    /// Drops everything the peer placed (it is about to send its full list again).
    pub fn reset(&mut self, peer: &str, now: f64) {
        let Some(i) = self.peers.iter().position(|p| p.name == peer) else {
            return;
        };
        let held = std::mem::take(&mut self.peers[i].held);
        self.peers[i].sums.clear();
        self.placements -= held.len();
        for h in held.into_values() {
            self.overlay.end(h.local, now);
        }
    }

    /// The peer's stream ended at `now`: its share decays over `decay_s`, then goes. Its
    /// placements' blocks count as cached until then.
    pub fn lost(&mut self, peer: &str, now: f64) {
        let Some(i) = self.peers.iter().position(|p| p.name == peer) else {
            return;
        };
        if self.peers[i].lost_at.is_some() {
            return;
        }
        self.peers[i].lost_at = Some(now);
        let decay = self.cfg.decay_s.max(0.0);
        let locals: Vec<AssignmentId> = self.peers[i].held.values().map(|h| h.local).collect();
        for l in locals {
            self.overlay.settle(l, now, decay);
        }
    }

    /// A worker was retired: every peer placement on it goes.
    pub fn drop_worker(&mut self, w: WorkerId) {
        for p in &mut self.peers {
            let before = p.held.len();
            p.held.retain(|_, h| h.worker != w);
            if let Some(s) = p.sums.get_mut(w.index()) {
                *s = Sums::default();
            }
            self.placements -= before - p.held.len();
        }
        self.overlay.drop_worker(w);
    }

    /// Drops what has decayed away and placements past their TTL; forgets lost peers with
    /// nothing left. Returns how many placements were dropped.
    pub fn upkeep(&mut self, now: f64) -> usize {
        let (decay, ttl) = (self.cfg.decay_s.max(0.0), self.cfg.ttl_s.max(0.0));
        let mut dropped = Vec::new();
        for p in &mut self.peers {
            let gone = p.lost_at.is_some_and(|t| now - t >= decay);
            let expired: Vec<u64> = p
                .held
                .iter()
                .filter(|(_, h)| gone || now - h.placed_at >= ttl)
                .map(|(&id, _)| id)
                .collect();
            for id in expired {
                if let Some(h) = p.remove(id) {
                    dropped.push(h.local);
                }
            }
        }
        self.peers
            .retain(|p| p.lost_at.is_none() || !p.held.is_empty());
        self.placements -= dropped.len();
        let n = dropped.len();
        for l in dropped {
            self.overlay.end(l, now);
        }
        n
    }

    /// Weight of a peer's share at `now`: 1 while connected, falling linearly to 0 over
    /// `decay_s` once lost.
    fn weight(&self, p: &Peer, now: f64) -> f64 {
        match p.lost_at {
            None => 1.0,
            Some(t) if self.cfg.decay_s > 0.0 => {
                (1.0 - (now - t) / self.cfg.decay_s).clamp(0.0, 1.0)
            }
            Some(_) => 0.0,
        }
    }

    /// What the peers' outstanding placements add on `w` at `now`.
    pub fn load(&self, w: WorkerId, now: f64) -> PeerLoad {
        let mut out = PeerLoad::default();
        for p in &self.peers {
            let k = self.weight(p, now);
            if k <= 0.0 {
                continue;
            }
            let Some(s) = p.sums.get(w.index()) else {
                continue;
            };
            out.waiting += k * s.waiting as f64;
            out.waiting_prefill_tokens += k * s.waiting_prefill as f64;
            out.decoding += k * s.decoding as f64;
            out.active_tokens += k * s.active as f64;
            out.active_uncached_tokens += k * s.active_uncached as f64;
            out.active_kv_tokens += k * s.active_kv as f64;
        }
        out
    }

    /// Leading blocks of `chain` the peers placed on `w` and still count as there.
    pub fn leading(&self, w: WorkerId, chain: &[BlockHash], now: f64) -> usize {
        self.overlay.leading(w, chain, now)
    }

    /// [`PeerShare::leading`] and how many of those blocks are still in use, by binary search
    /// (`Overlay::leading_and_in_use`).
    pub fn leading_and_in_use(&self, w: WorkerId, chain: &[BlockHash], now: f64) -> (usize, usize) {
        self.overlay.leading_and_in_use(w, chain, now)
    }

    /// Peer placements held.
    pub fn placements(&self) -> usize {
        self.placements
    }

    /// Peers known, with whether each is connected and its placements held.
    pub fn peers(&self) -> impl Iterator<Item = (&str, bool, usize)> {
        self.peers
            .iter()
            .map(|p| (p.name.as_str(), p.lost_at.is_none(), p.held.len()))
    }

    /// True when the peer holds placement `id`.
    pub fn holds(&self, peer: &str, id: u64) -> bool {
        self.peers
            .iter()
            .any(|p| p.name == peer && p.held.contains_key(&id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(id: u64, w: u32, chain: &[u64], uncached: u64) -> PeerPlacement {
        PeerPlacement {
            id,
            worker: WorkerId(w),
            chain: chain.to_vec(),
            uncached_tokens: uncached,
            prompt_tokens: 100,
            kv_tokens: 120,
            started: false,
        }
    }

    #[test]
    fn placements_count_as_blocks_and_load_until_they_end() {
        let mut s = PeerShare::new(PeerConfig::default());
        s.connected("b");
        s.placed("b", placement(1, 0, &[10, 11, 12], 64), 0.0)
            .expect("room");
        s.placed("b", placement(2, 0, &[10, 11], 32), 0.0)
            .expect("room");
        assert_eq!(s.leading(WorkerId(0), &[10, 11, 12, 13], 0.0), 3);
        assert_eq!(s.leading(WorkerId(1), &[10, 11], 0.0), 0);
        let l = s.load(WorkerId(0), 0.0);
        assert_eq!((l.waiting, l.waiting_prefill_tokens), (2.0, 96.0));
        s.started("b", 1, 1.0);
        let l = s.load(WorkerId(0), 1.0);
        assert_eq!((l.waiting, l.decoding), (1.0, 1.0));
        s.ended("b", 1, 1.2);
        s.ended("b", 2, 1.2);
        assert_eq!(s.placements(), 0);
        assert_eq!(s.load(WorkerId(0), 1.2), PeerLoad::default());
        // Blocks stay a grace period (1 s) after the first token, then go.
        assert_eq!(s.leading(WorkerId(0), &[10, 11, 12], 1.5), 3);
        assert_eq!(s.leading(WorkerId(0), &[10, 11, 12], 2.0), 0);
    }

    #[test]
    fn a_lost_peer_decays_instead_of_sticking() {
        let mut s = PeerShare::new(PeerConfig {
            decay_s: 10.0,
            ..PeerConfig::default()
        });
        s.connected("b");
        for id in 0..4 {
            s.placed("b", placement(id, 0, &[1, 2], 100), 0.0)
                .expect("room");
        }
        s.lost("b", 5.0);
        assert_eq!(s.load(WorkerId(0), 5.0).waiting, 4.0);
        assert_eq!(s.load(WorkerId(0), 10.0).waiting, 2.0, "half way");
        assert_eq!(s.leading(WorkerId(0), &[1, 2], 14.0), 2);
        assert_eq!(s.load(WorkerId(0), 15.0).waiting, 0.0);
        assert_eq!(s.upkeep(15.0), 4);
        assert_eq!(s.placements(), 0);
        assert_eq!(
            s.peers().count(),
            0,
            "a lost peer with nothing left is forgotten"
        );
        assert_eq!(s.leading(WorkerId(0), &[1, 2], 15.0), 0);
    }

    #[test]
    fn reset_reconnect_ttl_cap_and_retired_workers() {
        let mut s = PeerShare::new(PeerConfig {
            ttl_s: 60.0,
            max_placements: 3,
            max_chain_blocks: 2,
            ..PeerConfig::default()
        });
        s.connected("b");
        s.placed("b", placement(1, 0, &[1, 2, 3], 10), 0.0)
            .expect("room");
        assert_eq!(s.leading(WorkerId(0), &[1, 2, 3], 0.0), 2, "chain cut at 2");
        s.placed("b", placement(1, 1, &[1], 10), 0.0)
            .expect("a repeated id replaces");
        assert_eq!(s.placements(), 1);
        s.placed("c", placement(1, 0, &[5], 10), 0.0).expect("room");
        s.placed("c", placement(2, 0, &[6], 10), 0.0).expect("room");
        assert_eq!(
            s.placed("c", placement(3, 0, &[7], 10), 0.0),
            Err(PeerRefused::Full)
        );
        s.lost("c", 1.0);
        s.connected("c");
        s.reset("c", 1.0);
        assert_eq!(s.placements(), 1);
        assert_eq!(s.load(WorkerId(0), 1.0), PeerLoad::default());
        assert!(s.holds("b", 1));
        s.drop_worker(WorkerId(1));
        assert!(!s.holds("b", 1));
        s.placed("b", placement(9, 0, &[1], 10), 10.0)
            .expect("room");
        assert_eq!(s.upkeep(69.0), 0);
        assert_eq!(s.upkeep(70.0), 1, "past its TTL");
    }
}
