//! Reading a msgpack `KVEventBatch` into [`EventBatch`].
//!
//! ```text
//! payload  [ts, [event, ...], dp_rank?]  or  {"ts":.., "events":.., "data_parallel_rank":..}
//! event    {"type": "BlockStored", ...}  (>= 0.24)  or  ["BlockStored", field, ...]  (<= 0.23)
//!            --EventFields (either form, field by field)--> KvEvent
//! ```
//!
//! It decodes every form vLLM 0.24-0.33 sends, ignores unknown keys and extra array elements,
//! turns unknown event types into [`KvEvent::Unknown`], and returns a typed [`DecodeError`]
//! (never a panic) for anything else. Decoding goes straight from bytes to the event structs,
//! without an intermediate value tree, because it sits on the sidecar's per-block hot path.

use thiserror::Error;

use crate::event::{BlockRemoved, BlockStored, EventBatch, KvEvent, RawExtraKey, placement_skip};
use crate::msgpack::{Int, MAX_SKIP_DEPTH, Reader};

/// Why a frame or payload could not be decoded. Variant names double as metric labels
/// (see [`DecodeError::reason`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The input ended inside a value.
    #[error("payload truncated at byte {0}")]
    Truncated(usize),
    /// A value of another msgpack type than the field needs.
    #[error("expected {expected} at byte {at}")]
    UnexpectedType {
        /// What the decoder needed there.
        expected: &'static str,
        /// Byte offset of the value.
        at: usize,
    },
    /// A string that is not UTF-8.
    #[error("invalid UTF-8 string at byte {0}")]
    InvalidUtf8(usize),
    /// An unknown value nested too deeply to skip.
    #[error("msgpack nesting deeper than {MAX_SKIP_DEPTH}")]
    TooDeep,
    /// The batch is an array of a length vLLM never sends.
    #[error("event batch is neither a 2/3-element array nor a map")]
    BadBatchShape,
    /// An event map without `type`, or an empty tagged array.
    #[error("event without a type")]
    MissingType,
    /// A required field is absent (`events`, `block_hashes`, `token_ids`).
    #[error("event is missing field {0}")]
    MissingField(&'static str),
    /// A token id outside `u32`.
    #[error("token id {0} does not fit in 32 bits")]
    TokenOutOfRange(i128),
    /// A `bin` block hash shorter than 8 bytes.
    #[error("block hash bytes shorter than 8 ({0})")]
    HashTooShort(usize),
    /// An integer outside its field's range.
    #[error("integer out of range at byte {0}")]
    IntOutOfRange(usize),
    /// A ZMQ message with fewer than 2 frames.
    #[error("message has {0} frames, expected at least 2")]
    FrameCount(usize),
    /// A sequence frame shorter than 8 bytes.
    #[error("sequence frame has {0} bytes, expected at least 8")]
    SeqFrame(usize),
}

impl DecodeError {
    /// Bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Truncated(_) => "truncated",
            DecodeError::UnexpectedType { .. } => "unexpected_type",
            DecodeError::InvalidUtf8(_) => "invalid_utf8",
            DecodeError::TooDeep => "too_deep",
            DecodeError::BadBatchShape => "bad_batch_shape",
            DecodeError::MissingType => "missing_type",
            DecodeError::MissingField(_) => "missing_field",
            DecodeError::TokenOutOfRange(_) => "token_out_of_range",
            DecodeError::HashTooShort(_) => "hash_too_short",
            DecodeError::IntOutOfRange(_) => "int_out_of_range",
            DecodeError::FrameCount(_) => "frame_count",
            DecodeError::SeqFrame(_) => "seq_frame",
        }
    }
}

/// Decodes one msgpack `KVEventBatch` payload (the last frame of a message).
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut r = Reader::new(payload);
    let at = r.pos;
    match r.peek()? {
        0x90..=0x9f | 0xdc | 0xdd => {
            let n = r.array_len()?;
            if !(2..=64).contains(&n) {
                return Err(DecodeError::BadBatchShape);
            }
            let ts = r.number()?;
            let events = decode_events(&mut r)?;
            let dp_rank = if n >= 3 { r.opt_int()? } else { None };
            for _ in 3..n {
                r.skip()?;
            }
            Ok(EventBatch {
                ts,
                events,
                dp_rank,
            })
        }
        0x80..=0x8f | 0xde | 0xdf => {
            let n = r.map_len()?;
            let (mut ts, mut events, mut dp_rank) = (None, None, None);
            for _ in 0..n {
                match r.key()? {
                    "ts" => ts = Some(r.number()?),
                    "events" => events = Some(decode_events(&mut r)?),
                    "data_parallel_rank" => dp_rank = r.opt_int()?,
                    _ => r.skip()?,
                }
            }
            let events = events.ok_or(DecodeError::MissingField("events"))?;
            Ok(EventBatch {
                ts: ts.unwrap_or(0.0),
                events,
                dp_rank,
            })
        }
        _ => Err(DecodeError::UnexpectedType {
            expected: "event batch",
            at,
        }),
    }
}

fn decode_events(r: &mut Reader<'_>) -> Result<Vec<KvEvent>, DecodeError> {
    let n = r.array_len()?;
    let mut events = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        events.push(decode_event(r)?);
    }
    Ok(events)
}

/// Field names of the positional (tagged array) forms, in msgspec struct order.
const STORED_FIELDS: &[&str] = &[
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
const REMOVED_FIELDS: &[&str] = &["block_hashes", "medium", "group_idx"];

/// Everything an event may carry; filled field by field from either form.
#[derive(Default)]
struct EventFields {
    block_hashes: Option<Vec<u64>>,
    parent: Option<u64>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    lora_name: Option<String>,
    extra_keys: Vec<Vec<RawExtraKey>>,
    medium: Option<String>,
    group_idx: Option<i64>,
    kind: Option<String>,
}

impl EventFields {
    fn read(&mut self, r: &mut Reader<'_>, key: &str) -> Result<(), DecodeError> {
        match key {
            "block_hashes" => self.block_hashes = Some(read_hashes(r)?),
            "parent_block_hash" => self.parent = if r.nil()? { None } else { Some(read_hash(r)?) },
            "token_ids" => self.token_ids = Some(read_tokens(r)?),
            "block_size" => {
                self.block_size = match r.opt_int()? {
                    Some(v) => {
                        Some(u32::try_from(v).map_err(|_| DecodeError::IntOutOfRange(r.pos))?)
                    }
                    None => None,
                }
            }
            "lora_id" => self.lora_id = r.opt_int()?,
            "lora_name" => self.lora_name = r.opt_str()?.map(str::to_owned),
            "medium" => self.medium = r.opt_str()?.map(str::to_owned),
            "group_idx" => self.group_idx = r.opt_int()?,
            "kv_cache_spec_kind" => self.kind = r.opt_str()?.map(str::to_owned),
            "extra_keys" => self.extra_keys = read_extra_keys(r)?,
            _ => r.skip()?,
        }
        Ok(())
    }

    /// A required field; an event about another tier or group may lack it (it is not
    /// tracked, so it must not fail the whole batch).
    fn required<T: Default>(
        value: Option<T>,
        name: &'static str,
        untracked: bool,
    ) -> Result<T, DecodeError> {
        match value {
            Some(v) => Ok(v),
            None if untracked => Ok(T::default()),
            None => Err(DecodeError::MissingField(name)),
        }
    }

    fn into_event(self, ty: &str) -> Result<KvEvent, DecodeError> {
        match ty {
            "AllBlocksCleared" => Ok(KvEvent::Cleared),
            "BlockRemoved" => {
                let untracked =
                    placement_skip(self.medium.as_deref(), self.group_idx, None).is_some();
                Ok(KvEvent::Removed(BlockRemoved {
                    block_hashes: Self::required(self.block_hashes, "block_hashes", untracked)?,
                    medium: self.medium,
                    group_idx: self.group_idx,
                }))
            }
            "BlockStored" => {
                let untracked =
                    placement_skip(self.medium.as_deref(), self.group_idx, self.kind.as_deref())
                        .is_some();
                Ok(KvEvent::Stored(BlockStored {
                    block_hashes: Self::required(self.block_hashes, "block_hashes", untracked)?,
                    parent: self.parent,
                    token_ids: Self::required(self.token_ids, "token_ids", untracked)?,
                    block_size: self.block_size,
                    lora_id: self.lora_id,
                    medium: self.medium,
                    lora_name: self.lora_name,
                    extra_keys: self.extra_keys,
                    group_idx: self.group_idx,
                    kv_cache_spec_kind: self.kind,
                }))
            }
            other => Ok(KvEvent::Unknown(other.to_owned())),
        }
    }
}

fn decode_event(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let at = r.pos;
    let mut f = EventFields::default();
    match r.peek()? {
        0x80..=0x8f | 0xde | 0xdf => {
            let n = r.map_len()?;
            let mut ty: Option<&str> = None;
            for _ in 0..n {
                let key = r.key()?;
                if key == "type" {
                    ty = r.opt_str()?;
                } else {
                    f.read(r, key)?;
                }
            }
            f.into_event(ty.ok_or(DecodeError::MissingType)?)
        }
        0x90..=0x9f | 0xdc | 0xdd => {
            let n = r.array_len()?;
            if n == 0 {
                return Err(DecodeError::MissingType);
            }
            let ty = r.str()?;
            let names = match ty {
                "BlockStored" => STORED_FIELDS,
                "BlockRemoved" => REMOVED_FIELDS,
                _ => &[],
            };
            for i in 1..n {
                match names.get(i - 1) {
                    Some(name) => f.read(r, name)?,
                    None => r.skip()?,
                }
            }
            f.into_event(ty)
        }
        _ => Err(DecodeError::UnexpectedType {
            expected: "event map or array",
            at,
        }),
    }
}

fn read_hashes(r: &mut Reader<'_>) -> Result<Vec<u64>, DecodeError> {
    let n = r.array_len()?;
    let mut out = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        out.push(read_hash(r)?);
    }
    Ok(out)
}

/// Reads a vLLM block hash: an unsigned int, a negative int (older releases; reinterpreted as
/// u64), or raw digest bytes (the last 8 bytes big-endian, which is what vLLM's int form is).
fn read_hash(r: &mut Reader<'_>) -> Result<u64, DecodeError> {
    let at = r.pos;
    match r.peek()? {
        0xc4..=0xc6 => {
            let b = r.bin()?;
            let tail: [u8; 8] = b
                .get(b.len().saturating_sub(8)..)
                .and_then(|t| t.try_into().ok())
                .ok_or(DecodeError::HashTooShort(b.len()))?;
            Ok(u64::from_be_bytes(tail))
        }
        _ => match r.int().map_err(|_| DecodeError::UnexpectedType {
            expected: "block hash",
            at,
        })? {
            Int::U(v) => Ok(v),
            Int::I(v) => Ok(v as u64),
        },
    }
}

fn read_tokens(r: &mut Reader<'_>) -> Result<Vec<u32>, DecodeError> {
    let n = r.array_len()?;
    let mut out = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        // Fast path for the forms token ids take in practice.
        let t = match r.peek()? {
            b @ 0x00..=0x7f => {
                r.pos += 1;
                u32::from(b)
            }
            _ => match r.int()? {
                Int::U(v) => {
                    u32::try_from(v).map_err(|_| DecodeError::TokenOutOfRange(v.into()))?
                }
                Int::I(v) => {
                    u32::try_from(v).map_err(|_| DecodeError::TokenOutOfRange(v.into()))?
                }
            },
        };
        out.push(t);
    }
    Ok(out)
}

fn read_extra_keys(r: &mut Reader<'_>) -> Result<Vec<Vec<RawExtraKey>>, DecodeError> {
    if r.nil()? {
        return Ok(Vec::new());
    }
    let n = r.array_len()?;
    let mut out = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        let mut keys = Vec::new();
        if !r.nil()? {
            let at = r.pos;
            match r.peek()? {
                0x90..=0x9f | 0xdc | 0xdd => {
                    let m = r.array_len()?;
                    for _ in 0..m {
                        keys.push(read_extra_key(r)?);
                    }
                }
                // A single key not wrapped in a tuple.
                0xa0..=0xbf | 0xd9..=0xdb => keys.push(read_extra_key(r)?),
                _ => {
                    return Err(DecodeError::UnexpectedType {
                        expected: "extra keys",
                        at,
                    });
                }
            }
        }
        out.push(keys);
    }
    Ok(out)
}

fn read_extra_key(r: &mut Reader<'_>) -> Result<RawExtraKey, DecodeError> {
    match r.peek()? {
        0xa0..=0xbf | 0xd9..=0xdb => Ok(RawExtraKey::Str(r.str()?.to_owned())),
        0x92 => {
            // (identifier, offset) when it has that shape; anything else is kept raw.
            let start = r.pos;
            r.pos += 1;
            if let (Ok(id), Ok(offset)) = (r.str(), r.int()) {
                let offset = match offset {
                    Int::U(v) => i64::try_from(v).map_err(|_| DecodeError::IntOutOfRange(start))?,
                    Int::I(v) => v,
                };
                return Ok(RawExtraKey::Multimodal {
                    id: id.to_owned(),
                    offset,
                });
            }
            r.pos = start;
            Ok(RawExtraKey::Other(r.raw_value()?.to_vec()))
        }
        _ => Ok(RawExtraKey::Other(r.raw_value()?.to_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::SkipReason;

    /// The 204-byte example from the vLLM interface notes (tokens 1..16, one block), built
    /// by hand here (the encoder's own test compares its output with the same bytes).
    fn example_stored() -> Vec<u8> {
        let mut b = vec![
            0x93, 0xcb, 0x41, 0xd9, 0x54, 0xfc, 0x40, 0x20, 0x00, 0x00, 0x91, 0xde, 0x00, 0x0b,
        ];
        let kv = |b: &mut Vec<u8>, k: &str| {
            b.push(0xa0 | k.len() as u8);
            b.extend_from_slice(k.as_bytes());
        };
        kv(&mut b, "type");
        kv(&mut b, "BlockStored");
        kv(&mut b, "block_hashes");
        b.extend_from_slice(&[0x91, 0xcf, 0x7b, 0x0b, 0xf7, 0xbf, 0x7f, 0xd0, 0x16, 0x82]);
        kv(&mut b, "parent_block_hash");
        b.push(0xc0);
        kv(&mut b, "token_ids");
        b.extend_from_slice(&[0xdc, 0x00, 0x10]);
        b.extend(1u8..=16);
        kv(&mut b, "block_size");
        b.push(0x10);
        kv(&mut b, "lora_id");
        b.push(0xc0);
        kv(&mut b, "medium");
        kv(&mut b, "GPU");
        kv(&mut b, "lora_name");
        b.push(0xc0);
        kv(&mut b, "extra_keys");
        b.extend_from_slice(&[0x91, 0xc0]);
        kv(&mut b, "group_idx");
        b.push(0x00);
        kv(&mut b, "kv_cache_spec_kind");
        kv(&mut b, "full_attention");
        b.push(0x00);
        b
    }

    #[test]
    fn decodes_reference_example() {
        let bytes = example_stored();
        assert_eq!(bytes.len(), 204);
        let batch = decode_batch(&bytes).unwrap();
        assert_eq!(batch.ts, 1_700_000_000.5);
        assert_eq!(batch.dp_rank, Some(0));
        assert_eq!(
            batch.events,
            vec![KvEvent::Stored(BlockStored {
                block_hashes: vec![8866452693264111234],
                parent: None,
                token_ids: (1..=16).collect(),
                block_size: Some(16),
                extra_keys: vec![vec![]],
                ..BlockStored::on_gpu()
            })]
        );
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = example_stored();
        for n in 0..bytes.len() {
            assert!(decode_batch(&bytes[..n]).is_err(), "prefix {n} decoded");
        }
    }

    #[test]
    fn tagged_array_events_and_map_batch() {
        // {"ts": 1, "events": [["BlockRemoved", [-1], "GPU"], ["AllBlocksCleared"], ["Future", 1]]}
        let mut b = vec![0x82, 0xa2, b't', b's', 0x01, 0xa6];
        b.extend_from_slice(b"events");
        b.push(0x93);
        b.extend_from_slice(&[0x93, 0xac]);
        b.extend_from_slice(b"BlockRemoved");
        b.extend_from_slice(&[0x91, 0xff, 0xa3]);
        b.extend_from_slice(b"GPU");
        b.extend_from_slice(&[0x91, 0xb0]);
        b.extend_from_slice(b"AllBlocksCleared");
        b.extend_from_slice(&[0x92, 0xa6]);
        b.extend_from_slice(b"Future");
        b.push(0x01);
        let batch = decode_batch(&b).unwrap();
        assert_eq!((batch.ts, batch.dp_rank), (1.0, None));
        assert_eq!(
            batch.events,
            vec![
                KvEvent::Removed(BlockRemoved {
                    block_hashes: vec![u64::MAX],
                    medium: Some("GPU".into()),
                    group_idx: None,
                }),
                KvEvent::Cleared,
                KvEvent::Unknown("Future".into()),
            ]
        );
        assert_eq!(batch.events[2].skip_reason(), Some(SkipReason::UnknownType));
    }

    #[test]
    fn extra_keys_forms() {
        // [0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [],
        //       "extra_keys": ["salt", [["img", -3], 7, ["a", "b"]], nil]}]]
        let mut b = vec![0x92, 0x00, 0x91, 0x84, 0xa4];
        b.extend_from_slice(b"type");
        b.push(0xab);
        b.extend_from_slice(b"BlockStored");
        b.push(0xac);
        b.extend_from_slice(b"block_hashes");
        b.extend_from_slice(&[0x91, 0x01, 0xa9]);
        b.extend_from_slice(b"token_ids");
        b.extend_from_slice(&[0x90, 0xaa]);
        b.extend_from_slice(b"extra_keys");
        b.extend_from_slice(&[0x93, 0xa4]);
        b.extend_from_slice(b"salt");
        b.extend_from_slice(&[0x93, 0x92, 0xa3]);
        b.extend_from_slice(b"img");
        b.extend_from_slice(&[0xfd, 0x07, 0x92, 0xa1, b'a', 0xa1, b'b', 0xc0]);
        let batch = decode_batch(&b).unwrap();
        let KvEvent::Stored(s) = &batch.events[0] else {
            panic!("not stored: {:?}", batch.events)
        };
        assert_eq!(
            s.extra_keys,
            vec![
                vec![RawExtraKey::Str("salt".into())],
                vec![
                    RawExtraKey::Multimodal {
                        id: "img".into(),
                        offset: -3
                    },
                    RawExtraKey::Other(vec![0x07]),
                    RawExtraKey::Other(vec![0x92, 0xa1, b'a', 0xa1, b'b']),
                ],
                vec![],
            ]
        );
        assert_eq!((s.medium.as_deref(), s.group_idx), (None, None));
    }

    #[test]
    fn skip_rejects_deep_nesting_and_huge_counts() {
        let mut deep = vec![0x82, 0xa2, b't', b's', 0x01, 0xa1, b'x'];
        deep.extend(std::iter::repeat_n(0x91, 10_000));
        deep.push(0x00);
        assert_eq!(decode_batch(&deep), Err(DecodeError::TooDeep));
        let huge = [0x82, 0xa1, b'x', 0xdd, 0xff, 0xff, 0xff, 0xff];
        assert!(decode_batch(&huge).is_err());
    }

    #[test]
    fn typed_errors() {
        assert_eq!(decode_batch(&[]), Err(DecodeError::Truncated(0)));
        assert_eq!(decode_batch(&[0x91, 0x00]), Err(DecodeError::BadBatchShape));
        assert_eq!(
            decode_batch(&[0x81, 0xa2, b't', b's', 0x00]),
            Err(DecodeError::MissingField("events"))
        );
        // [0, [{}]]: an event without a type.
        assert_eq!(
            decode_batch(&[0x92, 0x00, 0x91, 0x80]),
            Err(DecodeError::MissingType)
        );
        // [0, [["BlockRemoved"]]]: no hashes.
        let mut b = vec![0x92, 0x00, 0x91, 0x91, 0xac];
        b.extend_from_slice(b"BlockRemoved");
        assert_eq!(
            decode_batch(&b),
            Err(DecodeError::MissingField("block_hashes"))
        );
        assert_eq!(
            decode_batch(&[0xc1]).map_err(|e| e.reason()),
            Err("unexpected_type")
        );
        // [0, [{"type": "BlockRemoved", "medium": "CPU"}]]: an offload-tier event may lack them.
        let mut b = vec![0x92, 0x00, 0x91, 0x82, 0xa4];
        b.extend_from_slice(b"type");
        b.push(0xac);
        b.extend_from_slice(b"BlockRemoved");
        b.push(0xa6);
        b.extend_from_slice(b"medium");
        b.push(0xa3);
        b.extend_from_slice(b"CPU");
        let removed = decode_batch(&b).unwrap();
        assert_eq!(
            removed.events[0].skip_reason(),
            Some(SkipReason::OtherMedium)
        );
    }
}
