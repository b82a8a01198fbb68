//! Golden tests over the real vLLM capture (testdata/vllm-capture), from the sidecar's side:
//! kvroute's re-hash of the published token ids is pinned; applying the live stream leaves the
//! resident set that the capture's timeline implies, and it equals the router-side chain over
//! the prompts' tokens. (That every frame decodes like vLLM decoded it is tested with the
//! decoder, in kvroute-vllm-wire.)

#![allow(clippy::unwrap_used)] // test helpers (outside #[test] fns): a panic is the failure report

use std::collections::{BTreeSet, HashMap};

use base64::Engine as _;
use kvroute_hash::{BlockHash, ExtraKey, block_hash, chain, encode_extra, root_hash};
use kvroute_sidecar::state::{ApplyStats, Ops, ResidentSet, StateConfig};
use kvroute_vllm_wire::{self as wire, KvEvent, RawExtraKey};
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/vllm-capture");
const MODEL: &str = "tiny";

fn lines(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(format!("{DIR}/{name}")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap())
        .unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A hash as the capture's JSON writes it: number, decimal string, or `{"$bin_hex": ..}`.
fn json_hash(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().unwrap_or_else(|| n.as_i64().unwrap() as u64),
        Value::String(s) => s
            .parse::<u64>()
            .or_else(|_| s.parse::<i64>().map(|i| i as u64))
            .unwrap(),
        Value::Object(o) => {
            let b = hex(o["$bin_hex"].as_str().unwrap());
            u64::from_be_bytes(b[b.len() - 8..].try_into().unwrap())
        }
        other => panic!("not a hash: {other}"),
    }
}

fn live_batches() -> Vec<(u64, Vec<u8>)> {
    lines("live.jsonl")
        .iter()
        .map(|l| (l["seq"].as_u64().unwrap(), b64(&l["frames_b64"][2])))
        .collect()
}

fn state() -> ResidentSet {
    ResidentSet::new(StateConfig {
        model: MODEL.into(),
        default_lora: None,
        block_size: None,
        max_blocks: 1 << 20,
    })
}

#[test]
fn synthetic_filters_extra_keys_and_lora() {
    let by_name: HashMap<String, Vec<u8>> = lines("synthetic.jsonl")
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_owned(),
                hex(l["payload_hex"].as_str().unwrap()),
            )
        })
        .collect();
    // Offload-tier and sliding-window events leave the GPU set alone; the clear applies.
    let mut st = state();
    let (mut ops, mut stats) = (Ops::default(), ApplyStats::default());
    st.apply(
        &wire::decode_batch(&by_name["stored_first_block_int"])
            .unwrap()
            .events[0],
        &mut ops,
        &mut stats,
    );
    assert_eq!(st.len(), 1);
    let mixed = wire::decode_batch(&by_name["mixed_batch_dp1_all_fields"]).unwrap();
    let (mut ops, mut stats) = (Ops::default(), ApplyStats::default());
    st.apply(&mixed.events[0], &mut ops, &mut stats);
    st.apply(&mixed.events[1], &mut ops, &mut stats);
    assert_eq!(
        (st.len(), stats.unknown_removed, ops.is_empty()),
        (1, 0, true)
    );
    st.apply(&mixed.events[2], &mut ops, &mut stats);
    assert!(st.is_empty());
    assert_eq!(stats.cleared, 1);
    // Salt + multimodal: block 0 = (mm, 5) then salt; block 1 = (mm, -27).
    let salted = wire::decode_batch(&by_name["stored_extra_keys_salt_mm"]).unwrap();
    let KvEvent::Stored(s) = &salted.events[0] else {
        panic!()
    };
    let mut st = state();
    let (mut ops, mut stats) = (Ops::default(), ApplyStats::default());
    st.apply(&salted.events[0], &mut ops, &mut stats);
    let RawExtraKey::Multimodal { id, .. } = &s.extra_keys[0][0] else {
        panic!()
    };
    let tokens: Vec<u32> = (100..164).collect();
    let root = root_hash(MODEL, None);
    let h0 = block_hash(
        root,
        &tokens[..32],
        &encode_extra(&[
            ExtraKey::Multimodal {
                id: id.clone(),
                offset: 5,
            },
            ExtraKey::CacheSalt("tenant-a".into()),
        ]),
    );
    let h1 = block_hash(
        h0,
        &tokens[32..],
        &encode_extra(&[ExtraKey::Multimodal {
            id: id.clone(),
            offset: (-27i64) as u64,
        }]),
    );
    assert_eq!(st.kvroute_hash(s.block_hashes[0]), Some(h0));
    assert_eq!(st.kvroute_hash(s.block_hashes[1]), Some(h1));
    // LoRA: the name goes into the root, not into each block.
    let lora = wire::decode_batch(&by_name["stored_lora"]).unwrap();
    let mut st = state();
    st.apply(&lora.events[0], &mut ops, &mut stats);
    let KvEvent::Stored(s) = &lora.events[0] else {
        panic!()
    };
    let expect = chain(root_hash(MODEL, Some("sql-adapter")), &tokens, 32, &[]);
    assert_eq!(st.kvroute_hash(s.block_hashes[1]), Some(expect[1]));
}

/// vLLM hashes resident after the capture, from the JSON timeline alone (independent of our
/// decoder and state).
fn expected_resident_vllm() -> BTreeSet<u64> {
    let mut set = BTreeSet::new();
    for line in lines("live.jsonl") {
        for ev in line["payload_decoded"][1].as_array().unwrap() {
            let hashes = || ev["block_hashes"].as_array().unwrap().iter().map(json_hash);
            match ev["type"].as_str().unwrap() {
                "BlockStored" => set.extend(hashes()),
                "BlockRemoved" => hashes().for_each(|h| {
                    assert!(set.remove(&h), "removed hash {h} was resident");
                }),
                "AllBlocksCleared" => set.clear(),
                other => panic!("{other}"),
            }
        }
    }
    set
}

fn prompt(tag: &str) -> Vec<u32> {
    let r = lines("requests.jsonl")
        .into_iter()
        .find(|r| r["tag"] == tag)
        .unwrap();
    r["prompt_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn live_stream_leaves_the_resident_set_vllm_has() {
    let mut st = state();
    let mut total = ApplyStats::default();
    let mut stored_seen = 0;
    for (seq, payload) in live_batches() {
        let batch = wire::decode_batch(&payload).unwrap();
        let (mut ops, mut stats) = (Ops::default(), ApplyStats::default());
        for ev in &batch.events {
            st.apply(ev, &mut ops, &mut stats);
        }
        // Every block stored in this batch is placed (no unknown parents).
        for ev in &batch.events {
            if let KvEvent::Stored(s) = ev {
                for h in &s.block_hashes {
                    assert!(st.kvroute_hash(*h).is_some(), "seq {seq}: block {h} placed");
                    stored_seen += 1;
                }
            }
        }
        total.unknown_parent += stats.unknown_parent;
        total.unknown_removed += stats.unknown_removed;
        total.duplicate_stores += stats.duplicate_stores;
    }
    assert_eq!(stored_seen, 35);
    assert_eq!((total.unknown_parent, total.unknown_removed), (0, 0));
    // F re-announces A0, A1 ("full" report mode) and B2: A0, A1 are duplicates.
    assert_eq!(total.duplicate_stores, 2);
    assert_eq!(st.block_size(), Some(32));

    let expected = expected_resident_vllm();
    assert_eq!(expected.len(), 4, "A0, A1, A2, B2");
    assert_eq!(st.len(), expected.len());
    let ours: BTreeSet<BlockHash> = expected
        .iter()
        .map(|h| st.kvroute_hash(*h).unwrap())
        .collect();
    assert_eq!(ours, st.blocks().collect());

    // The router hashes the prompt's tokens itself: it must find exactly these blocks.
    let a = chain(root_hash(MODEL, None), &prompt("A"), 32, &[]);
    let b = chain(root_hash(MODEL, None), &prompt("B"), 32, &[]);
    assert_eq!((a.len(), b.len()), (3, 3));
    assert_eq!(a[..2], b[..2], "A and B share two blocks");
    let router_view: BTreeSet<BlockHash> = a.iter().chain(&b).copied().collect();
    assert_eq!(router_view, ours);

    // Pinned kvroute hashes (hash/SPEC.md v1, model "tiny"): they must never change.
    assert_eq!(a, PINNED_A.to_vec());
    assert_eq!(b[2], PINNED_B2);
}

#[test]
fn salted_request_rehash_and_generated_block() {
    // Replay the stream up to S (seq 4) and check S's salted chain and C's generated block.
    let mut st = state();
    let (mut ops, mut stats) = (Ops::default(), ApplyStats::default());
    let batches = live_batches();
    for (_, payload) in &batches[..5] {
        for ev in wire::decode_batch(payload).unwrap().events {
            st.apply(&ev, &mut ops, &mut stats);
        }
    }
    let s_batch = wire::decode_batch(&batches[4].1).unwrap();
    let KvEvent::Stored(s) = &s_batch.events[0] else {
        panic!()
    };
    let salt = encode_extra(&[ExtraKey::CacheSalt("tenant-a".into())]);
    let expect = chain(root_hash(MODEL, None), &prompt("S"), 32, &salt);
    let got: Vec<_> = s
        .block_hashes
        .iter()
        .map(|h| st.kvroute_hash(*h).unwrap())
        .collect();
    assert_eq!(got, expect);
    assert_eq!(got[0], PINNED_S0);
    assert_ne!(
        got[0],
        chain(root_hash(MODEL, None), &prompt("A"), 32, &[])[0],
        "salt separates tenants"
    );
    // C's 4th block holds 5 prompt + 27 generated tokens: hashed like any full block.
    let c = lines("requests.jsonl")
        .into_iter()
        .find(|r| r["tag"] == "C")
        .unwrap();
    let mut c_tokens = prompt("C");
    c_tokens.extend(
        c["output_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32),
    );
    let c_chain = chain(root_hash(MODEL, None), &c_tokens, 32, &[]);
    let c3 = wire::decode_batch(&batches[3].1).unwrap();
    let KvEvent::Stored(c3) = &c3.events[0] else {
        panic!()
    };
    assert_eq!(st.kvroute_hash(c3.block_hashes[0]), Some(c_chain[3]));
}

#[test]
fn replay_from_zero_rebuilds_the_same_set() {
    let mut live = state();
    let mut replayed = state();
    let (mut ops, mut stats) = (Ops::default(), ApplyStats::default());
    for (_, payload) in live_batches() {
        for ev in wire::decode_batch(&payload).unwrap().events {
            live.apply(&ev, &mut ops, &mut stats);
        }
    }
    for line in lines("replay.jsonl") {
        if line["replay"] != "from_0" || line["direction"] != "reply" || line["end_marker"] == true
        {
            continue;
        }
        let frames: Vec<Vec<u8>> = line["frames_b64"]
            .as_array()
            .unwrap()
            .iter()
            .map(b64)
            .collect();
        for ev in wire::decode_batch(wire::split_frames(&frames).unwrap().payload)
            .unwrap()
            .events
        {
            replayed.apply(&ev, &mut ops, &mut stats);
        }
    }
    let a: BTreeSet<_> = live.blocks().collect();
    let b: BTreeSet<_> = replayed.blocks().collect();
    assert_eq!(a, b);
}

/// kvroute hashes of request A's three blocks, B's third block and S's salted first block.
const PINNED_A: [u64; 3] = [
    2605964798222574864,
    10193900140680515966,
    8263034893855998174,
];
const PINNED_B2: u64 = 18156839241261178744;
const PINNED_S0: u64 = 14233101693097261540;
