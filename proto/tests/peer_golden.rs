//! Golden bytes of a `PeerUpdate` (the router replicas' exchange, docs/replicas.md). The
//! fixture was written by hand (a small Python protobuf writer), so this checks prost's
//! encoding against an independent one; unknown fields (a newer peer) are skipped.

mod support;
use kvroute_proto::v1::{PeerPlacement, PeerShareEnd, PeerUpdate};
use prost::Message as _;
use support::{assert_golden, unhex};

const FIXTURE: &str = include_str!("golden/peer_update.hex");

fn update() -> PeerUpdate {
    PeerUpdate {
        replica: "r-1a2b".into(),
        seq: 7,
        reset: true,
        placed: vec![
            PeerPlacement {
                id: 42,
                worker: "default/w0".into(),
                blocks: vec![0x0102_0304_0506_0708, u64::MAX],
                prompt_tokens: 2_048,
                uncached_tokens: 512,
                kv_tokens: 2_816,
                started: false,
            },
            PeerPlacement {
                id: 43,
                worker: "default/w1".into(),
                blocks: Vec::new(),
                prompt_tokens: 16,
                uncached_tokens: 16,
                kv_tokens: 300,
                started: true,
            },
        ],
        started: vec![40, 41],
        ended: vec![39],
    }
}

#[test]
fn peer_update_matches_the_golden_bytes() {
    assert_golden(&update(), &unhex(FIXTURE));
}

#[test]
fn a_newer_peers_fields_are_skipped() {
    let mut bytes = unhex(FIXTURE);
    // Field 15 (varint) 1 and field 16 (length-delimited) "x": unknown here.
    bytes.extend_from_slice(&[0x78, 0x01, 0x82, 0x01, 0x01, b'x']);
    assert_eq!(PeerUpdate::decode(bytes.as_slice()).unwrap(), update());
}

#[test]
fn the_end_of_a_share_is_empty() {
    assert!(PeerShareEnd {}.encode_to_vec().is_empty());
}
