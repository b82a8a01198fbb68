//! Golden tests over the real vLLM capture (testdata/vllm-capture): every live frame, replay
//! reply and synthetic payload decodes to what vLLM itself decoded; kvroute's re-hash of the
//! published token ids is pinned; applying the live stream leaves the resident set that the
//! capture's timeline implies, and it equals the router-side chain over the prompts' tokens.

#![allow(clippy::unwrap_used)] // test helpers (outside #[test] fns): a panic is the failure report

use std::collections::{BTreeSet, HashMap};

use base64::Engine as _;
use kvroute_hash::{BlockHash, ExtraKey, block_hash, chain, encode_extra, root_hash};
use kvroute_sidecar::state::{ApplyStats, Ops, ResidentSet, StateConfig};
use kvroute_sidecar::wire::{self, EventBatch, KvEvent, RawExtraKey, SkipReason};
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

fn json_extra(v: &Value) -> Vec<RawExtraKey> {
    match v {
        Value::Null => vec![],
        Value::Array(items) => items
            .iter()
            .map(|k| match k {
                Value::String(s) => RawExtraKey::Str(s.clone()),
                Value::Array(p) if p.len() == 2 && p[0].is_string() => RawExtraKey::Multimodal {
                    id: p[0].as_str().unwrap().into(),
                    offset: p[1].as_i64().unwrap(),
                },
                other => panic!("unexpected extra key {other}"),
            })
            .collect(),
        other => panic!("unexpected extra keys {other}"),
    }
}

/// Asserts a decoded batch equals vLLM's own decoding of the same payload.
fn assert_matches(batch: &EventBatch, json: &Value, ctx: &str) {
    let arr = json.as_array().unwrap();
    assert!(
        (batch.ts - arr[0].as_f64().unwrap()).abs() < 1e-6,
        "{ctx}: ts"
    );
    assert_eq!(
        batch.dp_rank,
        arr.get(2).and_then(Value::as_i64),
        "{ctx}: dp rank"
    );
    let events = arr[1].as_array().unwrap();
    assert_eq!(batch.events.len(), events.len(), "{ctx}: event count");
    for (i, (ev, j)) in batch.events.iter().zip(events).enumerate() {
        let ctx = format!("{ctx} event {i}");
        let hashes = || {
            j["block_hashes"]
                .as_array()
                .unwrap()
                .iter()
                .map(json_hash)
                .collect::<Vec<_>>()
        };
        match ev {
            KvEvent::Stored(s) => {
                assert_eq!(j["type"], "BlockStored", "{ctx}");
                assert_eq!(s.block_hashes, hashes(), "{ctx}: hashes");
                assert_eq!(
                    s.parent,
                    (!j["parent_block_hash"].is_null()).then(|| json_hash(&j["parent_block_hash"])),
                    "{ctx}"
                );
                let tokens: Vec<u32> = j["token_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap() as u32)
                    .collect();
                assert_eq!(s.token_ids, tokens, "{ctx}: tokens");
                assert_eq!(
                    s.block_size.map(u64::from),
                    j["block_size"].as_u64(),
                    "{ctx}: block size"
                );
                assert_eq!(
                    s.lora_name.as_deref(),
                    j["lora_name"].as_str(),
                    "{ctx}: lora"
                );
                let extra: Vec<Vec<RawExtraKey>> = match &j["extra_keys"] {
                    Value::Array(per_block) => per_block.iter().map(json_extra).collect(),
                    _ => vec![],
                };
                assert_eq!(s.extra_keys, extra, "{ctx}: extra keys");
            }
            KvEvent::Removed(r) => {
                assert_eq!(j["type"], "BlockRemoved", "{ctx}");
                assert_eq!(r.block_hashes, hashes(), "{ctx}: hashes");
            }
            KvEvent::Cleared => assert_eq!(j["type"], "AllBlocksCleared", "{ctx}"),
            KvEvent::Skipped(reason) => {
                let medium = j["medium"].as_str().unwrap_or("GPU");
                let group = j["group_idx"].as_i64().unwrap_or(0);
                match reason {
                    SkipReason::OtherMedium => assert_ne!(medium, "GPU", "{ctx}"),
                    SkipReason::OtherGroup => assert!(
                        group != 0 || j["kv_cache_spec_kind"] != "full_attention",
                        "{ctx}"
                    ),
                    SkipReason::UnknownType => panic!("{ctx}: unknown type {}", j["type"]),
                }
            }
        }
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
fn live_frames_decode_like_vllm() {
    let live = lines("live.jsonl");
    assert_eq!(live.len(), 10);
    for (i, line) in live.iter().enumerate() {
        let raw: Vec<Vec<u8>> = (0..3)
            .map(|f| std::fs::read(format!("{DIR}/live-frames/{i:03}-f{f}.bin")).unwrap())
            .collect();
        let from_json: Vec<Vec<u8>> = line["frames_b64"]
            .as_array()
            .unwrap()
            .iter()
            .map(b64)
            .collect();
        assert_eq!(
            raw, from_json,
            "frame files and live.jsonl agree (message {i})"
        );
        let frames = wire::split_frames(&raw).unwrap();
        assert_eq!(frames.seq, i as u64);
        let batch = wire::decode_batch(frames.payload).unwrap();
        assert_matches(&batch, &line["payload_decoded"], &format!("live {i}"));
    }
}

#[test]
fn replay_replies_decode_and_equal_live() {
    let live: HashMap<u64, Vec<u8>> = live_batches().into_iter().collect();
    let mut replies = 0;
    let mut ends = 0;
    for line in lines("replay.jsonl") {
        if line["direction"] == "request" {
            let frames: Vec<Vec<u8>> = line["frames_b64"]
                .as_array()
                .unwrap()
                .iter()
                .map(b64)
                .collect();
            assert_eq!(
                wire::decode_seq(&frames[1]).unwrap(),
                line["start_seq"].as_u64().unwrap()
            );
            continue;
        }
        let frames: Vec<Vec<u8>> = line["frames_b64"]
            .as_array()
            .unwrap()
            .iter()
            .map(b64)
            .collect();
        let f = wire::split_frames(&frames).unwrap();
        if line["end_marker"] == true {
            assert!(f.is_end_marker());
            ends += 1;
            continue;
        }
        assert_eq!(f.seq, line["seq"].as_u64().unwrap());
        assert_eq!(
            f.payload,
            live[&f.seq].as_slice(),
            "replayed payload of seq {} is the live one",
            f.seq
        );
        let batch = wire::decode_batch(f.payload).unwrap();
        assert_matches(
            &batch,
            &line["payload_decoded"],
            &format!("replay seq {}", f.seq),
        );
        replies += 1;
    }
    assert_eq!((replies, ends), (15, 3));
}

#[test]
fn synthetic_payloads_decode_like_vllm() {
    let all = lines("synthetic.jsonl");
    assert_eq!(all.len(), 13);
    for line in &all {
        let name = line["name"].as_str().unwrap();
        let bytes = hex(line["payload_hex"].as_str().unwrap());
        assert_eq!(bytes, b64(&line["payload_b64"]), "{name}");
        let batch = wire::decode_batch(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_matches(&batch, &line["payload_decoded"], name);
    }
}

#[test]
fn synthetic_filters_and_extra_keys() {
    let by_name: HashMap<String, Vec<u8>> = lines("synthetic.jsonl")
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_owned(),
                hex(l["payload_hex"].as_str().unwrap()),
            )
        })
        .collect();
    let mixed = wire::decode_batch(&by_name["mixed_batch_dp1_all_fields"]).unwrap();
    assert_eq!(mixed.dp_rank, Some(1));
    assert_eq!(
        mixed.events,
        vec![
            KvEvent::Skipped(SkipReason::OtherMedium),
            KvEvent::Skipped(SkipReason::OtherMedium),
            KvEvent::Cleared
        ]
    );
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
    // 32-byte digests map like their int form (last 8 bytes big-endian).
    let bytes = wire::decode_batch(&by_name["stored_bytes_hashes"]).unwrap();
    let KvEvent::Stored(b) = &bytes.events[0] else {
        panic!()
    };
    let int_form = wire::decode_batch(&by_name["stored_with_parent_int"]).unwrap();
    let KvEvent::Stored(i) = &int_form.events[0] else {
        panic!()
    };
    assert_eq!((b.parent, &b.block_hashes), (i.parent, &i.block_hashes));
    let small = wire::decode_batch(&by_name["stored_small_int_hashes"]).unwrap();
    let KvEvent::Removed(r) = &small.events[0] else {
        panic!()
    };
    assert_eq!(
        r.block_hashes,
        vec![
            0,
            127,
            128,
            65535,
            1 << 32,
            (1 << 63) - 1,
            1 << 63,
            u64::MAX
        ]
    );
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
