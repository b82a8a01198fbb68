//! The mock against bytes real vLLM produced (testdata/vllm-capture): the capture's request
//! sequence replayed through the engine must publish the same event batches (types, order,
//! hashes, eviction order), encoded like msgspec; and vLLM 0.33's synthetic payloads must be
//! reproduced byte for byte.

#![allow(clippy::unwrap_used)] // test helpers (outside #[test] fns): a panic is the failure report

use std::collections::HashMap;
use std::path::PathBuf;

use kvroute_mock_vllm::engine::{Engine, EngineConfig, EngineEvent, EngineRequest, Profile};
use kvroute_mock_vllm::vllm_hash::{self, ExtraKeys, HashAlgo};
use kvroute_vllm_wire::{BlockRemoved, BlockStored, KvEvent, RawExtraKey, encode_batch};
use serde_json::Value;

fn capture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/vllm-capture")
}

fn jsonl(name: &str) -> Vec<Value> {
    std::fs::read_to_string(capture_dir().join(name))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Integers in the capture's JSON are numbers or (beyond 2^53) decimal strings.
fn as_u64(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(s) => s.parse().unwrap(),
        other => panic!("not an integer: {other}"),
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The capture's engine: block size 32, 15 usable blocks, sha256 (pickle) hashes.
fn capture_engine() -> Engine {
    let profile = Profile::builtin("tiny").unwrap();
    let mut cfg = EngineConfig::from_profile(&profile);
    cfg.block_size = 32;
    cfg.num_blocks = 15;
    cfg.max_model_len = 256;
    cfg.hash_algo = HashAlgo::Sha256Pickle;
    Engine::new(profile, cfg)
}

/// Runs one request to completion; returns the KV batches (one per step that had events).
fn run(engine: &mut Engine, req: EngineRequest, now: &mut f64) -> Vec<Vec<KvEvent>> {
    engine.submit(req, *now).unwrap();
    let mut batches = Vec::new();
    while engine.next_step_at().is_some() {
        let out = engine.step(*now).unwrap();
        *now = out.end();
        let kv: Vec<KvEvent> = out
            .events
            .into_iter()
            .filter_map(|e| match e {
                EngineEvent::Kv(k) => Some(k),
                _ => None,
            })
            .collect();
        if !kv.is_empty() {
            batches.push(kv);
        }
    }
    batches
}

fn decode(bytes: &[u8]) -> rmpv::Value {
    rmpv::decode::read_value(&mut &bytes[..]).unwrap()
}

/// A value's structure: map keys in order with value types; arrays by element types.
fn shape(v: &rmpv::Value) -> String {
    use rmpv::Value as V;
    match v {
        V::Nil => "nil".into(),
        V::Boolean(_) => "bool".into(),
        V::Integer(_) => "int".into(),
        V::F32(_) | V::F64(_) => "float".into(),
        V::String(_) => "str".into(),
        V::Binary(_) => "bin".into(),
        V::Array(items) => {
            let mut kinds: Vec<String> = items.iter().map(shape).collect();
            kinds.dedup();
            format!("[{}]", kinds.join(","))
        }
        V::Map(entries) => {
            let parts: Vec<String> = entries
                .iter()
                .map(|(k, v)| {
                    let key = k.as_str().unwrap_or("?");
                    // parent_block_hash is nil or int depending on the block: both are its type.
                    let s = if key == "parent_block_hash" {
                        "nil|int".into()
                    } else {
                        shape(v)
                    };
                    format!("{key}:{s}")
                })
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        V::Ext(..) => "ext".into(),
    }
}

fn hashes_of(ev: &KvEvent) -> Vec<u64> {
    match ev {
        KvEvent::Stored(BlockStored { block_hashes, .. })
        | KvEvent::Removed(BlockRemoved { block_hashes, .. }) => block_hashes.clone(),
        KvEvent::Cleared | KvEvent::Unknown(_) => Vec::new(),
    }
}

fn kind(ev: &KvEvent) -> (&str, usize) {
    (ev.type_name(), hashes_of(ev).len())
}

fn live_payload(i: usize) -> Vec<u8> {
    std::fs::read(capture_dir().join(format!("live-frames/{i:03}-f2.bin"))).unwrap()
}

#[test]
fn replaying_the_captured_session_publishes_what_vllm_published() {
    let requests = jsonl("requests.jsonl");
    let live = jsonl("live.jsonl");
    let mut engine = capture_engine();
    let mut now = 0.0;
    let mut ours: Vec<(String, Vec<KvEvent>)> = Vec::new();
    for (id, r) in requests.iter().enumerate() {
        let tag = r["tag"].as_str().unwrap().to_string();
        if tag == "F" {
            break; // kv_cache_report_mode=full re-announcements are not modelled
        }
        if tag == "RESET" {
            assert!(engine.reset_prefix_cache());
            continue;
        }
        let prompt: Vec<u32> = r["prompt_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let req = EngineRequest {
            id: id as u64,
            prompt,
            max_tokens: r["usage"]["completion_tokens"].as_u64().unwrap() as u32,
            ignore_eos: true,
            cache_salt: r["request"]["json"]["cache_salt"]
                .as_str()
                .map(str::to_string),
            lora_name: None,
        };
        for batch in run(&mut engine, req, &mut now) {
            ours.push((tag.clone(), batch));
        }
    }
    let captured: Vec<&Value> = live.iter().filter(|l| l["request_tag"] != "F").collect();
    assert_eq!(ours.len(), captured.len(), "one batch per step with events");

    // Our hashes equal vLLM's wherever the block holds prompt tokens only; a block of
    // generated tokens (C's block 3) differs, so map ours -> theirs through the stores.
    let mut ours_to_theirs: HashMap<u64, u64> = HashMap::new();
    for (i, ((tag, batch), cap)) in ours.iter().zip(&captured).enumerate() {
        assert_eq!(tag, cap["request_tag"].as_str().unwrap(), "batch {i}");
        let cap_events = cap["payload_decoded"][1].as_array().unwrap();
        let our_kinds: Vec<_> = batch.iter().map(kind).collect();
        let cap_kinds: Vec<_> = cap_events
            .iter()
            .map(|e| {
                let n = e
                    .get("block_hashes")
                    .map(|h| h.as_array().unwrap().len())
                    .unwrap_or(0);
                (e["type"].as_str().unwrap(), n)
            })
            .collect();
        assert_eq!(our_kinds, cap_kinds, "batch {i} ({tag})");
        let mut byte_exact = true;
        for (ev, cap_ev) in batch.iter().zip(cap_events) {
            let theirs: Vec<u64> = cap_ev
                .get("block_hashes")
                .map(|h| h.as_array().unwrap().iter().map(as_u64).collect())
                .unwrap_or_default();
            match ev {
                KvEvent::Stored(BlockStored {
                    token_ids,
                    parent,
                    extra_keys,
                    ..
                }) => {
                    let cap_tokens: Vec<u32> = cap_ev["token_ids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap() as u32)
                        .collect();
                    if *token_ids == cap_tokens {
                        assert_eq!(
                            hashes_of(ev),
                            theirs,
                            "batch {i} ({tag}): prompt block hashes"
                        );
                    } else {
                        byte_exact = false;
                    }
                    for (o, t) in hashes_of(ev).into_iter().zip(&theirs) {
                        ours_to_theirs.insert(o, *t);
                    }
                    let cap_parent = cap_ev["parent_block_hash"].clone();
                    match parent {
                        None => assert!(cap_parent.is_null(), "batch {i}"),
                        Some(p) => assert_eq!(ours_to_theirs.get(p), Some(&as_u64(&cap_parent))),
                    }
                    let cap_extra: Vec<Vec<RawExtraKey>> =
                        serde_json::from_value::<Vec<Option<Vec<String>>>>(
                            cap_ev["extra_keys"].clone(),
                        )
                        .unwrap()
                        .into_iter()
                        .map(|keys| {
                            keys.unwrap_or_default()
                                .into_iter()
                                .map(RawExtraKey::Str)
                                .collect()
                        })
                        .collect();
                    assert_eq!(extra_keys, &cap_extra, "batch {i} ({tag}) extra_keys");
                }
                KvEvent::Removed(BlockRemoved { block_hashes, .. }) => {
                    let mapped: Vec<u64> = block_hashes.iter().map(|h| ours_to_theirs[h]).collect();
                    assert_eq!(mapped, theirs, "batch {i} ({tag}): eviction order");
                    if mapped != *block_hashes {
                        byte_exact = false;
                    }
                }
                KvEvent::Cleared | KvEvent::Unknown(_) => {}
            }
        }

        // Same msgpack structure as the captured frame, and the same bytes (apart from the
        // BlockStored header: 0.32 wrote a fixmap, 0.33 writes map16) where the values agree.
        let cap_bytes = live_payload(cap["index"].as_u64().unwrap() as usize);
        let ts = decode(&cap_bytes)[0].as_f64().unwrap();
        let our_bytes = encode_batch(ts, batch, Some(0));
        assert_eq!(
            shape(&decode(&our_bytes)),
            shape(&decode(&cap_bytes)),
            "batch {i}"
        );
        if byte_exact {
            let mut expected = Vec::new();
            let mut rest = &cap_bytes[..];
            while let Some(pos) = rest.windows(6).position(|w| w == b"\x8b\xa4type") {
                expected.extend_from_slice(&rest[..pos]);
                expected.extend_from_slice(&[0xde, 0x00, 0x0b]);
                rest = &rest[pos + 1..];
            }
            expected.extend_from_slice(rest);
            assert_eq!(our_bytes, expected, "batch {i} ({tag}) bytes");
        }
    }
}

#[test]
fn vllm_0_33_synthetic_payloads_byte_for_byte() {
    let synthetic: HashMap<String, Vec<u8>> = jsonl("synthetic.jsonl")
        .into_iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_string(),
                hex(l["payload_hex"].as_str().unwrap()),
            )
        })
        .collect();
    let ts = 1764500000.25;
    let mut engine = capture_engine();
    let mut now = 0.0;
    // Block 0 (tokens 100..131), then blocks 1-2 with block 0 as a cache hit.
    let first = run(
        &mut engine,
        EngineRequest {
            id: 1,
            prompt: (100..132).collect(),
            max_tokens: 1,
            ignore_eos: true,
            ..Default::default()
        },
        &mut now,
    );
    assert_eq!(
        encode_batch(ts, &first[0], Some(0)),
        synthetic["stored_first_block_int"]
    );
    let second = run(
        &mut engine,
        EngineRequest {
            id: 2,
            prompt: (100..196).collect(),
            max_tokens: 1,
            ignore_eos: true,
            ..Default::default()
        },
        &mut now,
    );
    assert_eq!(
        encode_batch(ts, &second[0], Some(0)),
        synthetic["stored_with_parent_int"]
    );
    // Evicting: a 3-block cache forces out blocks 2 then 1 (tail of the chain first).
    let stored = hashes_of(&second[0][0]);
    let removed = vec![
        KvEvent::Removed(BlockRemoved::on_gpu(vec![stored[1]])),
        KvEvent::Removed(BlockRemoved::on_gpu(vec![stored[0]])),
    ];
    assert_eq!(
        encode_batch(ts, &removed, Some(0)),
        synthetic["removed_int"]
    );
    assert_eq!(
        encode_batch(ts, &[KvEvent::Cleared], Some(0)),
        synthetic["all_blocks_cleared"]
    );
}

#[test]
fn sha256_pickle_chain_reproduces_all_35_captured_blocks() {
    let mut scratch = Vec::new();
    let blocks = jsonl("blocks.jsonl");
    assert_eq!(blocks.len(), 35);
    for b in &blocks {
        let parent: [u8; 32] = hex(b["parent_digest_hex"].as_str().unwrap())
            .try_into()
            .unwrap();
        let tokens: Vec<u32> = b["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let salt = b["extra_keys_event"]
            .as_array()
            .and_then(|k| k.first())
            .and_then(Value::as_str);
        let extra = ExtraKeys {
            lora_name: None,
            cache_salt: salt,
        };
        let d = vllm_hash::block_digest(
            HashAlgo::Sha256Pickle,
            &parent,
            &tokens,
            &extra,
            &mut scratch,
        );
        assert_eq!(
            d.to_vec(),
            hex(b["digest_hex"].as_str().unwrap()),
            "block {} of {}",
            b["block_index_in_event"],
            b["request_tag"]
        );
        assert_eq!(vllm_hash::digest_to_u64(&d), as_u64(&b["block_hash"]));
    }
}
