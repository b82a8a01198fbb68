//! Encode -> decode -> equal, for every event kind and every field at the edges of its
//! msgpack forms, then for many batches drawn from a seeded generator.

use kvroute_vllm_wire::{
    BlockRemoved, BlockStored, EventBatch, KvEvent, RawExtraKey, decode_batch, encode_batch,
};

fn round_trip(batch: &EventBatch) {
    let bytes = batch.encode();
    let back = decode_batch(&bytes).unwrap_or_else(|e| panic!("{e}: {batch:?}"));
    assert_eq!(back.ts.to_bits(), batch.ts.to_bits(), "ts");
    assert_eq!(back.dp_rank, batch.dp_rank, "dp rank");
    assert_eq!(back.events, batch.events);
    // Encoding is a function of the value: the decoded batch writes the same bytes.
    assert_eq!(back.encode(), bytes);
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        ts: 1_764_500_000.25,
        events,
        dp_rank: Some(0),
    }
}

#[test]
fn block_stored_round_trips() {
    let full = BlockStored {
        block_hashes: vec![0, 127, 128, u64::from(u32::MAX) + 1, u64::MAX],
        parent: Some(1 << 63),
        token_ids: (0..5 * 4).map(|t| t * 9_000_001).collect(),
        block_size: Some(4),
        lora_id: Some(7),
        medium: Some("GPU".into()),
        lora_name: Some("sql-adapter".into()),
        extra_keys: vec![
            vec![RawExtraKey::Str("sql-adapter".into())],
            vec![],
            vec![
                RawExtraKey::Multimodal {
                    id: "x".repeat(40),
                    offset: -27,
                },
                RawExtraKey::Multimodal {
                    id: String::new(),
                    offset: i64::MAX,
                },
                RawExtraKey::Str("tenant-a".into()),
                // A digest (bin 4), an int, a float, a nested array, a map.
                RawExtraKey::Other(vec![0xc4, 0x04, 1, 2, 3, 4]),
                RawExtraKey::Other(vec![0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0]),
                RawExtraKey::Other(vec![0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0]),
                RawExtraKey::Other(vec![0x93, 0xa1, b'a', 0x01, 0xc0]),
                RawExtraKey::Other(vec![0x81, 0xa1, b'k', 0xc3]),
            ],
        ],
        group_idx: Some(0),
        kv_cache_spec_kind: Some("full_attention".into()),
    };
    round_trip(&batch(vec![KvEvent::Stored(full.clone())]));
    // Every optional field absent.
    round_trip(&batch(vec![KvEvent::Stored(BlockStored::default())]));
    // Offload tier, other group, negative lora id: carried, not filtered.
    round_trip(&batch(vec![KvEvent::Stored(BlockStored {
        medium: Some("CPU".into()),
        group_idx: Some(-3),
        lora_id: Some(-1),
        kv_cache_spec_kind: Some("sliding_window".into()),
        ..full.clone()
    })]));
    // Arrays past 16 and 65535 elements, strings past 31, 255 and 65535 bytes.
    round_trip(&batch(vec![KvEvent::Stored(BlockStored {
        block_hashes: (0..70_000).collect(),
        token_ids: (0..70_000).collect(),
        block_size: Some(1),
        lora_name: Some("n".repeat(70_000)),
        extra_keys: vec![vec![RawExtraKey::Str("s".repeat(300))]; 17],
        ..BlockStored::on_gpu()
    })]));
}

#[test]
fn block_removed_cleared_and_unknown_round_trip() {
    round_trip(&batch(vec![
        KvEvent::Removed(BlockRemoved::on_gpu(vec![u64::MAX])),
        KvEvent::Removed(BlockRemoved {
            block_hashes: vec![],
            medium: None,
            group_idx: None,
        }),
        KvEvent::Removed(BlockRemoved {
            block_hashes: (0..20).collect(),
            medium: Some("STORAGE".into()),
            group_idx: Some(2),
        }),
        KvEvent::Cleared,
        KvEvent::Unknown("BlockMoved".into()),
        KvEvent::Unknown(String::new()),
    ]));
}

#[test]
fn batch_fields_round_trip() {
    for dp_rank in [
        None,
        Some(0),
        Some(1),
        Some(-1),
        Some(i64::MAX),
        Some(i64::MIN),
    ] {
        for ts in [0.0, -0.0, 1.5e-300, f64::MAX, f64::INFINITY, f64::NAN] {
            round_trip(&EventBatch {
                ts,
                events: vec![],
                dp_rank,
            });
        }
    }
    assert_eq!(
        encode_batch(0.0, &[], None),
        [0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0xc0]
    );
}

/// xorshift64*: a few lines, no dependency, same sequence everywhere.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn maybe<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> Option<T> {
        (self.below(2) == 0).then(|| f(self))
    }
    fn string(&mut self) -> String {
        let n = self.below(40);
        (0..n)
            .map(|_| char::from(b'a' + self.below(26) as u8))
            .collect()
    }
    fn int(&mut self) -> i64 {
        // Small and large, both signs.
        let v = self.next() as i64;
        if self.below(2) == 0 {
            v >> self.below(64)
        } else {
            v
        }
    }
    fn extra_key(&mut self) -> RawExtraKey {
        match self.below(3) {
            0 => RawExtraKey::Str(self.string()),
            1 => RawExtraKey::Multimodal {
                id: self.string(),
                offset: self.int(),
            },
            _ => {
                let n = self.below(40) as u8;
                let mut raw = vec![0xc4, n];
                raw.extend((0..n).map(|_| self.next() as u8));
                RawExtraKey::Other(raw)
            }
        }
    }
    fn event(&mut self) -> KvEvent {
        match self.below(4) {
            0 => {
                let n = self.below(5) as usize;
                let bs = 1 + self.below(20) as usize;
                KvEvent::Stored(BlockStored {
                    block_hashes: (0..n).map(|_| self.next()).collect(),
                    parent: self.maybe(Self::next),
                    token_ids: (0..n * bs).map(|_| self.next() as u32).collect(),
                    block_size: self.maybe(|g| g.next() as u32),
                    lora_id: self.maybe(Self::int),
                    medium: self.maybe(Self::string),
                    lora_name: self.maybe(Self::string),
                    extra_keys: (0..self.below(5))
                        .map(|_| (0..self.below(4)).map(|_| self.extra_key()).collect())
                        .collect(),
                    group_idx: self.maybe(Self::int),
                    kv_cache_spec_kind: self.maybe(Self::string),
                })
            }
            1 => KvEvent::Removed(BlockRemoved {
                block_hashes: (0..self.below(4)).map(|_| self.next()).collect(),
                medium: self.maybe(Self::string),
                group_idx: self.maybe(Self::int),
            }),
            2 => KvEvent::Cleared,
            _ => KvEvent::Unknown(format!("Future{}", self.string())),
        }
    }
}

#[test]
fn generated_batches_round_trip() {
    let mut g = Gen(0x9e37_79b9_7f4a_7c15);
    for _ in 0..2_000 {
        let events = (0..g.below(8)).map(|_| g.event()).collect();
        let dp_rank = g.maybe(Gen::int);
        round_trip(&EventBatch {
            ts: f64::from_bits(g.next()),
            events,
            dp_rank,
        });
    }
}
