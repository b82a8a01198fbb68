//! Events built from arbitrary bytes encode to msgpack that decodes (rmpv) to the same values,
//! with vLLM's keys in vLLM's order; replay requests of any shape parse or fail cleanly.
#![no_main]

use kvroute_mock_vllm::engine::KvEvent;
use kvroute_mock_vllm::kv_wire;
use libfuzzer_sys::fuzz_target;
use rmpv::Value;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map(|(f, r)| (*f, r)).unwrap_or((0, &[]));
        self.0 = rest;
        first
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, _| (acc << 8) | u64::from(self.u8()))
    }
    fn string(&mut self) -> String {
        let n = self.u8() as usize % 40;
        (0..n).map(|_| char::from(b'a' + self.u8() % 26)).collect()
    }
}

fn event(b: &mut Bytes<'_>) -> KvEvent {
    match b.u8() % 3 {
        0 => {
            let n = 1 + b.u8() as usize % 4;
            let block_size = 1 + b.u8() as usize % 20;
            KvEvent::BlockStored {
                block_hashes: (0..n).map(|_| b.u64()).collect(),
                parent_block_hash: (b.u8() % 2 == 0).then(|| b.u64()),
                token_ids: (0..n * block_size).map(|_| b.u64() as u32).collect(),
                block_size,
                lora_name: (b.u8() % 4 == 0).then(|| b.string()),
                extra_keys: (0..n)
                    .map(|_| (b.u8() % 3 == 0).then(|| vec![b.string()]))
                    .collect(),
            }
        }
        1 => KvEvent::BlockRemoved { block_hashes: vec![b.u64()] },
        _ => KvEvent::AllBlocksCleared,
    }
}

fn get<'v>(map: &'v [(Value, Value)], key: &str) -> &'v Value {
    &map.iter().find(|(k, _)| k.as_str() == Some(key)).expect("key present").1
}

fuzz_target!(|data: &[u8]| {
    let _ = kv_wire::parse_replay_request(&data.chunks(9).collect::<Vec<_>>());
    let mut b = Bytes(data);
    let ts = f64::from_bits(b.u64());
    let events: Vec<KvEvent> = (0..b.u8() % 6).map(|_| event(&mut b)).collect();
    let dp = u32::from(b.u8());
    let bytes = kv_wire::encode_batch(ts, &events, dp);
    let decoded = rmpv::decode::read_value(&mut &bytes[..]).expect("valid msgpack");
    let batch = decoded.as_array().expect("batch array");
    assert_eq!(batch.len(), 3);
    assert_eq!(batch[0].as_f64().map(f64::to_bits), Some(ts.to_bits()));
    assert_eq!(batch[2].as_u64(), Some(u64::from(dp)));
    let decoded_events = batch[1].as_array().expect("events array");
    assert_eq!(decoded_events.len(), events.len());
    for (ev, dv) in events.iter().zip(decoded_events) {
        let map = dv.as_map().expect("event map");
        assert_eq!(map[0].0.as_str(), Some("type"));
        match ev {
            KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size, lora_name, extra_keys } => {
                let keys: Vec<_> = map.iter().map(|(k, _)| k.as_str().unwrap_or("")).collect();
                assert_eq!(keys, ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"]);
                let hashes: Vec<u64> = get(map, "block_hashes").as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
                assert_eq!(&hashes, block_hashes);
                assert_eq!(get(map, "parent_block_hash").as_u64(), *parent_block_hash);
                let toks: Vec<u32> = get(map, "token_ids").as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
                assert_eq!(&toks, token_ids);
                assert_eq!(get(map, "block_size").as_u64(), Some(*block_size as u64));
                assert_eq!(get(map, "lora_name").as_str(), lora_name.as_deref());
                assert_eq!(get(map, "extra_keys").as_array().unwrap().len(), extra_keys.len());
            }
            KvEvent::BlockRemoved { block_hashes } => {
                assert_eq!(get(map, "type").as_str(), Some("BlockRemoved"));
                assert_eq!(get(map, "block_hashes")[0].as_u64(), Some(block_hashes[0]));
            }
            KvEvent::AllBlocksCleared => assert_eq!(map.len(), 1),
        }
    }
});
