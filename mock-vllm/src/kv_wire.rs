//! vLLM 0.33's KV-event wire format, written byte for byte as msgspec does it.
//!
//! ```text
//! PUB message     [topic, seq: u64 BE (8 bytes), payload]
//! payload         fixarray(3) [ts: f64 (cb), events: array, data_parallel_rank: int]
//! BlockStored     map16 (de 00 0b): type, block_hashes, parent_block_hash, token_ids,
//!                 block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//!                 kv_cache_spec_kind
//! BlockRemoved    fixmap(4): type, block_hashes, medium, group_idx
//! AllBlocksCleared fixmap(1): type
//! replay request  DEALER ["", seq: u64 BE]; reply per batch ["", topic, seq, payload],
//!                 end marker ["", "", ff x8, ""]
//! ```
//!
//! msgspec writes non-negative integers in the smallest unsigned form and a map16 header for
//! BlockStored because the 0.33 struct has 16 fields (more than a fixmap holds) even though
//! fields equal to their default are omitted. Pure code.

use crate::engine::KvEvent;

/// The replay end marker's sequence frame (-1 as a signed 64-bit integer).
pub const END_MARKER_SEQ: [u8; 8] = [0xff; 8];

/// Encodes one event batch: `[ts, events, data_parallel_rank]`.
pub fn encode_batch(ts: f64, events: &[KvEvent], dp_rank: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 96);
    array_header(&mut out, 3);
    out.push(0xcb);
    out.extend_from_slice(&ts.to_be_bytes());
    array_header(&mut out, events.len());
    for ev in events {
        encode_event(&mut out, ev);
    }
    uint(&mut out, u64::from(dp_rank));
    out
}

/// Appends one event as a msgspec map.
pub fn encode_event(out: &mut Vec<u8>, ev: &KvEvent) {
    match ev {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_name,
            extra_keys,
        } => {
            out.extend_from_slice(&[0xde, 0x00, 0x0b]);
            str(out, "type");
            str(out, "BlockStored");
            str(out, "block_hashes");
            array_header(out, block_hashes.len());
            for &h in block_hashes {
                uint(out, h);
            }
            str(out, "parent_block_hash");
            match parent_block_hash {
                Some(h) => uint(out, *h),
                None => nil(out),
            }
            str(out, "token_ids");
            array_header(out, token_ids.len());
            for &t in token_ids {
                uint(out, u64::from(t));
            }
            str(out, "block_size");
            uint(out, *block_size as u64);
            str(out, "lora_id");
            nil(out);
            str(out, "medium");
            str(out, "GPU");
            str(out, "lora_name");
            match lora_name {
                Some(n) => str(out, n),
                None => nil(out),
            }
            str(out, "extra_keys");
            array_header(out, extra_keys.len());
            for keys in extra_keys {
                match keys {
                    None => nil(out),
                    Some(keys) => {
                        array_header(out, keys.len());
                        for k in keys {
                            str(out, k);
                        }
                    }
                }
            }
            str(out, "group_idx");
            uint(out, 0);
            str(out, "kv_cache_spec_kind");
            str(out, "full_attention");
        }
        KvEvent::BlockRemoved { block_hashes } => {
            out.push(0x84);
            str(out, "type");
            str(out, "BlockRemoved");
            str(out, "block_hashes");
            array_header(out, block_hashes.len());
            for &h in block_hashes {
                uint(out, h);
            }
            str(out, "medium");
            str(out, "GPU");
            str(out, "group_idx");
            uint(out, 0);
        }
        KvEvent::AllBlocksCleared => {
            out.push(0x81);
            str(out, "type");
            str(out, "AllBlocksCleared");
        }
    }
}

fn nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

fn uint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
    } else if v < 0x100 {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v < 0x1_0000 {
        out.push(0xcd);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v < 0x1_0000_0000 {
        out.push(0xce);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

fn str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n < 0x100 {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n < 0x1_0000 {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

fn array_header(out: &mut Vec<u8>, n: usize) {
    if n < 16 {
        out.push(0x90 | n as u8);
    } else if n < 0x1_0000 {
        out.push(0xdc);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// Why a replay request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayRequestError {
    /// Every frame after the identity is empty.
    #[error("replay request has no sequence frame")]
    Missing,
    /// The sequence frame is not a big-endian u64.
    #[error("replay sequence frame has {0} bytes, expected 8")]
    BadLength(usize),
}

/// Parses the start sequence of a replay request from its frames after the ROUTER identity:
/// `["", seq8]` from a DEALER, or `[seq8]` from a peer that sends no delimiter.
pub fn parse_replay_request<B: AsRef<[u8]>>(frames: &[B]) -> Result<u64, ReplayRequestError> {
    let last = frames
        .iter()
        .rev()
        .map(AsRef::as_ref)
        .find(|f| !f.is_empty())
        .ok_or(ReplayRequestError::Missing)?;
    let bytes: [u8; 8] = last
        .get(..8)
        .filter(|_| last.len() == 8)
        .and_then(|b| b.try_into().ok())
        .ok_or(ReplayRequestError::BadLength(last.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn the_reference_example_byte_for_byte() {
        let ev = KvEvent::BlockStored {
            block_hashes: vec![8866452693264111234],
            parent_block_hash: None,
            token_ids: (1..=16).collect(),
            block_size: 16,
            lora_name: None,
            extra_keys: vec![None],
        };
        let bytes = encode_batch(1700000000.5, &[ev], 0);
        assert_eq!(bytes.len(), 204);
        let h = hex(&bytes);
        assert!(h.starts_with("93cb41d954fc4020000091de000ba474797065ab426c6f636b53746f726564"));
        assert!(h.contains("ac626c6f636b5f68617368657391cf7b0bf7bf7fd01682"));
        assert!(h.contains("a9746f6b656e5f696473dc0010010203"));
        assert!(
            h.ends_with("b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00")
        );
    }

    #[test]
    fn removed_and_cleared_use_fixmaps() {
        let mut out = Vec::new();
        encode_event(
            &mut out,
            &KvEvent::BlockRemoved {
                block_hashes: vec![1 << 63],
            },
        );
        assert_eq!(
            hex(&out),
            "84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf8000000000000000a66d656469756da3475055a967726f75705f696478\
             00"
                .replace(' ', "")
        );
        out.clear();
        encode_event(&mut out, &KvEvent::AllBlocksCleared);
        assert_eq!(hex(&out), "81a474797065b0416c6c426c6f636b73436c6561726564");
    }

    #[test]
    fn replay_requests() {
        let seq = 5u64.to_be_bytes();
        assert_eq!(parse_replay_request(&[&b""[..], &seq[..]]), Ok(5));
        assert_eq!(parse_replay_request(&[&seq[..]]), Ok(5));
        assert_eq!(
            parse_replay_request(&[&b""[..], &b"abc"[..]]),
            Err(ReplayRequestError::BadLength(3))
        );
        assert_eq!(
            parse_replay_request::<&[u8]>(&[]),
            Err(ReplayRequestError::Missing)
        );
    }
}
