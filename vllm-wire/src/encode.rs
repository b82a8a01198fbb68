//! Writing [`EventBatch`]es as vLLM 0.33 does (msgspec), byte for byte.
//!
//! ```text
//! payload           fixarray(3) [ts: f64 (cb), events: array, data_parallel_rank: int|nil]
//! BlockStored       map16 (de 00 0b): type, block_hashes, parent_block_hash, token_ids,
//!                   block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//!                   kv_cache_spec_kind
//! BlockRemoved      fixmap(4): type, block_hashes, medium, group_idx
//! AllBlocksCleared  fixmap(1): type
//! ```
//!
//! msgspec writes non-negative integers in the smallest unsigned form and a map16 header for
//! BlockStored because the 0.33 struct has 16 fields (more than a fixmap holds), even though
//! the newer optional fields it leaves at their default are omitted. Absent values are written
//! as nil, so whatever [`decode_batch`](crate::decode_batch) returns encodes to bytes that
//! decode to the same value.

use crate::event::{BlockRemoved, BlockStored, EventBatch, KvEvent, RawExtraKey};
use crate::msgpack::{write_array_len, write_f64, write_int, write_nil, write_str, write_uint};

impl EventBatch {
    /// This batch as a msgpack payload (see [`encode_batch`]).
    pub fn encode(&self) -> Vec<u8> {
        encode_batch(self.ts, &self.events, self.dp_rank)
    }
}

/// Encodes one event batch: `[ts, events, data_parallel_rank]`.
pub fn encode_batch(ts: f64, events: &[KvEvent], dp_rank: Option<i64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 96);
    write_array_len(&mut out, 3);
    write_f64(&mut out, ts);
    write_array_len(&mut out, events.len());
    for ev in events {
        encode_event(&mut out, ev);
    }
    write_opt_int(&mut out, dp_rank);
    out
}

/// Appends one event as a msgspec map.
pub fn encode_event(out: &mut Vec<u8>, ev: &KvEvent) {
    match ev {
        KvEvent::Stored(s) => encode_stored(out, s),
        KvEvent::Removed(r) => encode_removed(out, r),
        KvEvent::Cleared | KvEvent::Unknown(_) => {
            out.push(0x81);
            write_str(out, "type");
            write_str(out, ev.type_name());
        }
    }
}

fn encode_stored(out: &mut Vec<u8>, s: &BlockStored) {
    out.extend_from_slice(&[0xde, 0x00, 0x0b]);
    write_str(out, "type");
    write_str(out, "BlockStored");
    write_str(out, "block_hashes");
    write_hashes(out, &s.block_hashes);
    write_str(out, "parent_block_hash");
    match s.parent {
        Some(h) => write_uint(out, h),
        None => write_nil(out),
    }
    write_str(out, "token_ids");
    write_array_len(out, s.token_ids.len());
    for &t in &s.token_ids {
        write_uint(out, u64::from(t));
    }
    write_str(out, "block_size");
    write_opt_int(out, s.block_size.map(i64::from));
    write_str(out, "lora_id");
    write_opt_int(out, s.lora_id);
    write_str(out, "medium");
    write_opt_str(out, s.medium.as_deref());
    write_str(out, "lora_name");
    write_opt_str(out, s.lora_name.as_deref());
    write_str(out, "extra_keys");
    write_array_len(out, s.extra_keys.len());
    for keys in &s.extra_keys {
        if keys.is_empty() {
            write_nil(out);
            continue;
        }
        write_array_len(out, keys.len());
        for k in keys {
            match k {
                RawExtraKey::Str(v) => write_str(out, v),
                RawExtraKey::Multimodal { id, offset } => {
                    write_array_len(out, 2);
                    write_str(out, id);
                    write_int(out, *offset);
                }
                RawExtraKey::Other(raw) => out.extend_from_slice(raw),
            }
        }
    }
    write_str(out, "group_idx");
    write_opt_int(out, s.group_idx);
    write_str(out, "kv_cache_spec_kind");
    write_opt_str(out, s.kv_cache_spec_kind.as_deref());
}

fn encode_removed(out: &mut Vec<u8>, r: &BlockRemoved) {
    out.push(0x84);
    write_str(out, "type");
    write_str(out, "BlockRemoved");
    write_str(out, "block_hashes");
    write_hashes(out, &r.block_hashes);
    write_str(out, "medium");
    write_opt_str(out, r.medium.as_deref());
    write_str(out, "group_idx");
    write_opt_int(out, r.group_idx);
}

fn write_hashes(out: &mut Vec<u8>, hashes: &[u64]) {
    write_array_len(out, hashes.len());
    for &h in hashes {
        write_uint(out, h);
    }
}

fn write_opt_int(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => write_int(out, v),
        None => write_nil(out),
    }
}

fn write_opt_str(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(v) => write_str(out, v),
        None => write_nil(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn the_reference_example_byte_for_byte() {
        let ev = KvEvent::Stored(BlockStored {
            block_hashes: vec![8866452693264111234],
            token_ids: (1..=16).collect(),
            block_size: Some(16),
            extra_keys: vec![vec![]],
            ..BlockStored::on_gpu()
        });
        let bytes = encode_batch(1700000000.5, &[ev], Some(0));
        assert_eq!(bytes.len(), 204);
        let h = hex(&bytes);
        assert!(h.starts_with("93cb41d954fc4020000091de000ba474797065ab426c6f636b53746f726564"));
        assert!(h.contains("ac626c6f636b5f68617368657391cf7b0bf7bf7fd01682"));
        assert!(h.contains("b1706172656e745f626c6f636b5f68617368c0"));
        assert!(h.contains("a9746f6b656e5f696473dc0010010203"));
        assert!(h.contains("aa65787472615f6b65797391c0"));
        assert!(
            h.ends_with("b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00")
        );
    }

    #[test]
    fn removed_and_cleared_use_fixmaps() {
        let mut out = Vec::new();
        encode_event(
            &mut out,
            &KvEvent::Removed(BlockRemoved::on_gpu(vec![1 << 63])),
        );
        assert_eq!(
            hex(&out),
            "84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf8000000000000000\
             a66d656469756da3475055a967726f75705f69647800"
        );
        out.clear();
        encode_event(&mut out, &KvEvent::Cleared);
        assert_eq!(hex(&out), "81a474797065b0416c6c426c6f636b73436c6561726564");
    }

    #[test]
    fn absent_values_are_nil_and_extra_keys_keep_their_shape() {
        let ev = KvEvent::Stored(BlockStored {
            block_hashes: vec![1],
            token_ids: vec![2],
            lora_id: Some(-1),
            extra_keys: vec![vec![
                RawExtraKey::Str("s".into()),
                RawExtraKey::Multimodal {
                    id: "m".into(),
                    offset: 300,
                },
                RawExtraKey::Other(vec![0xc4, 0x01, 0xaa]),
            ]],
            ..BlockStored::default()
        });
        let mut out = Vec::new();
        encode_event(&mut out, &ev);
        let h = hex(&out);
        assert!(
            h.contains("aa626c6f636b5f73697a65c0"),
            "block_size nil: {h}"
        );
        assert!(h.contains("a76c6f72615f6964ff"), "lora_id -1: {h}");
        assert!(h.contains("a66d656469756dc0"), "medium nil: {h}");
        assert!(
            h.contains("9193a1739 2a16dcd012cc401aa".replace(' ', "").as_str()),
            "{h}"
        );
        assert!(h.ends_with("a967726f75705f696478c0b26b765f63616368655f737065635f6b696e64c0"));
    }
}
