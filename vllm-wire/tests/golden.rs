//! Golden tests over bytes real vLLM produced (testdata/vllm-capture): every live frame,
//! replay reply and synthetic payload decodes to what vLLM itself decoded (the capture's
//! JSON), and encodes back to vLLM's own bytes wherever vLLM 0.33 would have written them.

#![allow(clippy::unwrap_used)] // test helpers (outside #[test] fns): a panic is the failure report

use std::collections::HashMap;

use base64::Engine as _;
use kvroute_vllm_wire::{
    self as wire, EventBatch, KvEvent, RawExtraKey, SkipReason, decode_batch, split_frames,
};
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/vllm-capture");

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

fn frames_of(line: &Value) -> Vec<Vec<u8>> {
    line["frames_b64"]
        .as_array()
        .unwrap()
        .iter()
        .map(b64)
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
        assert_eq!(ev.type_name(), j["type"], "{ctx}: type");
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
                assert_eq!(s.lora_id, j["lora_id"].as_i64(), "{ctx}: lora id");
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
                assert_eq!(s.medium.as_deref(), j["medium"].as_str(), "{ctx}: medium");
                assert_eq!(s.group_idx, j["group_idx"].as_i64(), "{ctx}: group");
                assert_eq!(
                    s.kv_cache_spec_kind.as_deref(),
                    j["kv_cache_spec_kind"].as_str(),
                    "{ctx}: kind"
                );
            }
            KvEvent::Removed(r) => {
                assert_eq!(r.block_hashes, hashes(), "{ctx}: hashes");
                assert_eq!(r.medium.as_deref(), j["medium"].as_str(), "{ctx}: medium");
                assert_eq!(r.group_idx, j["group_idx"].as_i64(), "{ctx}: group");
            }
            KvEvent::Cleared => {}
            KvEvent::Unknown(name) => panic!("{ctx}: unknown type {name}"),
        }
        // The filter, computed from vLLM's JSON alone.
        let medium = j["medium"].as_str().unwrap_or("GPU");
        let group = j["group_idx"].as_i64().unwrap_or(0);
        let kind = j["kv_cache_spec_kind"].as_str().unwrap_or("full_attention");
        let expected = if medium != "GPU" {
            Some(SkipReason::OtherMedium)
        } else if group != 0 || kind != "full_attention" {
            Some(SkipReason::OtherGroup)
        } else {
            None
        };
        assert_eq!(ev.skip_reason(), expected, "{ctx}: skip reason");
    }
}

/// Decoding what the encoder wrote gives back the same batch.
fn assert_reencodes(batch: &EventBatch, ctx: &str) {
    assert_eq!(&decode_batch(&batch.encode()).unwrap(), batch, "{ctx}");
}

/// vLLM 0.32 wrote BlockStored with a fixmap header (11 entries), 0.33 with map16.
fn as_0_33(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while let Some(pos) = rest.windows(6).position(|w| w == b"\x8b\xa4type") {
        out.extend_from_slice(&rest[..pos]);
        out.extend_from_slice(&[0xde, 0x00, 0x0b]);
        rest = &rest[pos + 1..];
    }
    out.extend_from_slice(rest);
    out
}

#[test]
fn live_frames_decode_like_vllm_and_encode_back() {
    let live = lines("live.jsonl");
    assert_eq!(live.len(), 10);
    for (i, line) in live.iter().enumerate() {
        let raw: Vec<Vec<u8>> = (0..3)
            .map(|f| std::fs::read(format!("{DIR}/live-frames/{i:03}-f{f}.bin")).unwrap())
            .collect();
        assert_eq!(
            raw,
            frames_of(line),
            "frame files and live.jsonl agree (message {i})"
        );
        let frames = split_frames(&raw).unwrap();
        assert_eq!(frames.seq, i as u64);
        let batch = decode_batch(frames.payload).unwrap();
        assert_matches(&batch, &line["payload_decoded"], &format!("live {i}"));
        // Byte for byte, unless vLLM sent a field the encoder does not write (the last
        // batch's `session_id`, from kv_cache_report_mode=full).
        let written_keys = [
            "type",
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name",
            "extra_keys",
            "group_idx",
            "kv_cache_spec_kind",
        ];
        let only_written_keys = line["payload_decoded"][1]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| {
                e.as_object()
                    .unwrap()
                    .keys()
                    .all(|k| written_keys.contains(&k.as_str()))
            });
        assert_eq!(only_written_keys, i != 9, "live {i}");
        if only_written_keys {
            assert_eq!(
                batch.encode(),
                as_0_33(frames.payload),
                "live {i}: re-encoded bytes"
            );
        }
        assert_reencodes(&batch, &format!("live {i}"));
        let rebuilt: [Vec<u8>; 3] = wire::live_message(raw[0].clone(), i as u64, batch.encode());
        assert_eq!(rebuilt[..2], raw[..2], "live {i}: topic and seq frames");
    }
}

#[test]
fn replay_replies_decode_and_equal_live() {
    let live: HashMap<u64, Vec<u8>> = lines("live.jsonl")
        .iter()
        .map(|l| (l["seq"].as_u64().unwrap(), b64(&l["frames_b64"][2])))
        .collect();
    let mut replies = 0;
    let mut ends = 0;
    for line in lines("replay.jsonl") {
        let frames = frames_of(&line);
        if line["direction"] == "request" {
            let start = line["start_seq"].as_u64().unwrap();
            assert_eq!(wire::decode_seq(&frames[1]).unwrap(), start);
            assert_eq!(wire::parse_replay_request(&frames), Ok(start));
            let ours: [Vec<u8>; 2] = wire::replay_request(start);
            assert_eq!(ours[..], frames[..], "request frames");
            continue;
        }
        let f = split_frames(&frames).unwrap();
        if line["end_marker"] == true {
            assert!(f.is_end_marker());
            let ours: [Vec<u8>; 4] = wire::replay_end();
            assert_eq!(ours[..], frames[..], "end marker frames");
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
        let ours: [Vec<u8>; 4] = wire::replay_reply(frames[1].clone(), f.seq, f.payload.to_vec());
        assert_eq!(ours[..], frames[..], "reply frames");
        let batch = decode_batch(f.payload).unwrap();
        assert_matches(
            &batch,
            &line["payload_decoded"],
            &format!("replay seq {}", f.seq),
        );
        replies += 1;
    }
    assert_eq!((replies, ends), (15, 3));
}

fn synthetic() -> Vec<(String, Vec<u8>, Value)> {
    lines("synthetic.jsonl")
        .into_iter()
        .map(|l| {
            let name = l["name"].as_str().unwrap().to_owned();
            let bytes = hex(l["payload_hex"].as_str().unwrap());
            assert_eq!(bytes, b64(&l["payload_b64"]), "{name}");
            (name, bytes, l["payload_decoded"].clone())
        })
        .collect()
}

#[test]
fn synthetic_payloads_decode_like_vllm_and_round_trip() {
    let all = synthetic();
    assert_eq!(all.len(), 13);
    let mut byte_exact = Vec::new();
    for (name, bytes, json) in &all {
        let batch = decode_batch(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_matches(&batch, json, name);
        assert_reencodes(&batch, name);
        if batch.encode() == *bytes {
            byte_exact.push(name.as_str());
        }
    }
    // What vLLM 0.33 wrote for GPU blocks with int hashes is reproduced byte for byte; the
    // rest differ only in forms the encoder does not write (bin digests, omitted fields, the
    // 2-element batch, newer keys), which the round trip above covers.
    assert_eq!(
        byte_exact,
        [
            "stored_with_parent_int",
            "stored_first_block_int",
            "stored_lora",
            "stored_extra_keys_salt_mm",
            "removed_int",
            "all_blocks_cleared",
            "stored_small_int_hashes",
        ]
    );
}

#[test]
fn synthetic_filters_hash_forms_and_extra_keys() {
    let by_name: HashMap<String, EventBatch> = synthetic()
        .into_iter()
        .map(|(name, bytes, _)| (name, decode_batch(&bytes).unwrap()))
        .collect();
    let mixed = &by_name["mixed_batch_dp1_all_fields"];
    assert_eq!(mixed.dp_rank, Some(1));
    let reasons: Vec<_> = mixed.events.iter().map(KvEvent::skip_reason).collect();
    assert_eq!(
        reasons,
        [
            Some(SkipReason::OtherMedium),
            Some(SkipReason::OtherMedium),
            None
        ]
    );
    assert_eq!(mixed.events[2], KvEvent::Cleared);

    // Salt + multimodal: block 0 = (mm, 5) then salt; block 1 = (mm, -27).
    let KvEvent::Stored(s) = &by_name["stored_extra_keys_salt_mm"].events[0] else {
        panic!()
    };
    let [
        RawExtraKey::Multimodal { id, offset: 5 },
        RawExtraKey::Str(salt),
    ] = s.extra_keys[0].as_slice()
    else {
        panic!("block 0 keys: {:?}", s.extra_keys[0])
    };
    assert_eq!(salt, "tenant-a");
    assert_eq!(
        s.extra_keys[1],
        [RawExtraKey::Multimodal {
            id: id.clone(),
            offset: -27
        }]
    );

    // 32-byte digests read like their int form (last 8 bytes big-endian).
    let KvEvent::Stored(b) = &by_name["stored_bytes_hashes"].events[0] else {
        panic!()
    };
    let KvEvent::Stored(i) = &by_name["stored_with_parent_int"].events[0] else {
        panic!()
    };
    assert_eq!((b.parent, &b.block_hashes), (i.parent, &i.block_hashes));
    let KvEvent::Removed(r) = &by_name["stored_small_int_hashes"].events[0] else {
        panic!()
    };
    assert_eq!(
        r.block_hashes,
        [
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
    // Older batches: 2 elements (no rank) and events without the 0.33 fields.
    let legacy = &by_name["legacy_2_element_batch_minimal_stored"];
    assert_eq!(legacy.dp_rank, None);
    assert!(legacy.events.iter().all(|e| e.skip_reason().is_none()));
}
