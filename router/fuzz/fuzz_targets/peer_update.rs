//! The peer exchange's decoder (`kvroute_router::peer::wire`) and its application to a real
//! `RouterState`: arbitrary bytes cut into protobuf `PeerUpdate`s, each decoded, checked and
//! applied as `PeersService` does. No panic; the peers' placements never exceed the cap; a
//! checked update always names a printable replica id; and once every peer is lost and its
//! decay has passed, nothing of them is left (a lost peer's share never sticks).
//!
//! Input: repeated `[len, len bytes of protobuf]` (a chunk that does not decode is skipped,
//! as tonic would refuse it). `cargo +nightly fuzz run peer_update`; seeds in
//! `seeds/peer_update/` (the golden update of `proto/tests/peer_golden.rs`).
#![no_main]

use std::time::{Duration, Instant};

use kvroute_proto::v1::PeerUpdate;
use kvroute_router::metrics::RouterMetrics;
use kvroute_router::peer::wire::{Update, WireLimits};
use kvroute_router::state::{
    Catalog, DiscoveredWorker, RouterConfig, RouterState, SidecarIdentity,
};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

const WORKERS: [&str; 2] = ["default/w0", "default/w1"];

fn state() -> RouterState {
    let metrics = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let state = RouterState::new(RouterConfig::default(), metrics).expect("state");
    state.set_catalog(Catalog {
        pools: Vec::new(),
        workers: WORKERS
            .iter()
            .map(|id| DiscoveredWorker {
                id: id.to_string(),
                address: format!("{id}:8000"),
                model: "m".into(),
                worker_set: "s".into(),
                namespace: "default".into(),
                pod_ip: None,
                ready: true,
                origin: Default::default(),
            })
            .collect(),
    });
    let now = Instant::now();
    for (i, id) in WORKERS.iter().enumerate() {
        let identity = SidecarIdentity {
            worker_id: id.to_string(),
            address: format!("{id}:8000"),
            model: "m".into(),
            block_size: 16,
            epoch: 1,
            worker_set: "s".into(),
        };
        let _ = state.sidecar_snapshot_start(i as u64 + 1, &identity, &[], now);
        state.sidecar_snapshot_chunk(i as u64 + 1, id, &[], true, now);
    }
    state
}

fuzz_target!(|data: &[u8]| {
    let state = state();
    let limits = WireLimits::default();
    let cap = state.config().peers.max_placements;
    let now = Instant::now();
    let mut replicas = Vec::new();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let (chunk, next) = tail.split_at((len as usize).min(tail.len()));
        rest = next;
        let Ok(u) = PeerUpdate::decode(chunk) else {
            continue;
        };
        let Ok(u) = Update::check(u, &limits) else {
            continue;
        };
        assert!(!u.replica.is_empty() && u.replica.bytes().all(|b| b.is_ascii_graphic()));
        if !replicas.contains(&u.replica) {
            state.peer_connected(&u.replica);
            replicas.push(u.replica.clone());
        }
        let applied = state.apply_peer_update(&u, now);
        assert!(applied.placed + applied.unknown_worker + applied.refused == u.placed.len());
        assert!(state.peer_placements() <= cap);
    }
    for r in &replicas {
        state.peer_lost(r, now);
    }
    let decay = Duration::from_secs_f64(state.config().peers.decay_s);
    state.maintain(now + decay + Duration::from_secs(1));
    assert_eq!(state.peer_placements(), 0, "a lost peer's share stuck");
});
