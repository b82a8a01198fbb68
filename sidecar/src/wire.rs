//! vLLM KV-event wire format: ZMQ frames and the msgpack `EventBatch` payload.
//!
//! ```text
//! PUB frames   [topic, seq u64 BE (>= 8 bytes), payload]
//! replay reply ["", topic, seq, payload] ... ["", "", ff x8, ""]   (older: fewer leading frames)
//! payload      [ts, [event, ...], dp_rank?]  or  {"ts":.., "events":.., "data_parallel_rank":..}
//! event        {"type": "BlockStored", ...}  or  ["BlockStored", field, field, ...]
//! ```
//!
//! Pure code with a hand-written msgpack reader: it decodes every form vLLM 0.24-0.33 sends,
//! ignores unknown keys and extra array elements, keeps only the full-attention KV-cache group
//! on the GPU, and returns a typed [`DecodeError`] (never a panic) for anything else. Decoding
//! goes straight from bytes to the event structs, without an intermediate value tree, because
//! it sits on the per-block hot path.

use thiserror::Error;

/// Sequence number of vLLM's replay end marker (`-1` as a signed integer).
pub const END_MARKER_SEQ: u64 = u64::MAX;

/// Nesting limit when skipping values we do not understand.
const MAX_SKIP_DEPTH: usize = 64;

/// Why a frame or payload could not be decoded. Variant names double as metric labels
/// (see [`DecodeError::reason`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The payload ends inside a value that starts at this byte.
    #[error("payload truncated at byte {0}")]
    Truncated(usize),
    /// A value of another msgpack type than the field needs.
    #[error("expected {expected} at byte {at}")]
    UnexpectedType {
        /// What the field needs.
        expected: &'static str,
        /// Where the value starts.
        at: usize,
    },
    /// A string that is not UTF-8.
    #[error("invalid UTF-8 string at byte {0}")]
    InvalidUtf8(usize),
    /// Values nested deeper than the skip limit.
    #[error("msgpack nesting deeper than {MAX_SKIP_DEPTH}")]
    TooDeep,
    /// The batch is not `[ts, events]`, `[ts, events, dp_rank]` or a map.
    #[error("event batch is neither a 2/3-element array nor a map")]
    BadBatchShape,
    /// An event array or map without its type tag.
    #[error("event without a type")]
    MissingType,
    /// An event without a field it needs.
    #[error("event is missing field {0}")]
    MissingField(&'static str),
    /// A token id outside `u32`.
    #[error("token id {0} does not fit in 32 bits")]
    TokenOutOfRange(i128),
    /// A block hash given as bytes, fewer than 8 of them.
    #[error("block hash bytes shorter than 8 ({0})")]
    HashTooShort(usize),
    /// An integer that does not fit the field's type.
    #[error("integer out of range at byte {0}")]
    IntOutOfRange(usize),
    /// A ZMQ message with fewer than the sequence and payload frames.
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

/// One scheduler step's worth of events.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Publisher wall-clock time, seconds since the epoch.
    pub ts: f64,
    /// The events, in the order vLLM produced them.
    pub events: Vec<KvEvent>,
    /// Data-parallel rank of the publishing engine, when sent.
    pub dp_rank: Option<i64>,
}

/// A decoded KV-cache event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks became resident.
    Stored(BlockStored),
    /// Blocks were evicted.
    Removed(BlockRemoved),
    /// The whole prefix cache was reset.
    Cleared,
    /// An event kvroute does not track.
    Skipped(SkipReason),
}

/// Why a well-formed event is not tracked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// A medium other than the GPU (offload tiers: CPU, STORAGE).
    OtherMedium,
    /// A KV-cache group other than the full-attention one (sliding window, mamba, ...).
    OtherGroup,
    /// An event type this version does not know.
    UnknownType,
}

impl SkipReason {
    /// Bounded label for metrics.
    pub fn reason(self) -> &'static str {
        match self {
            SkipReason::OtherMedium => "other_medium",
            SkipReason::OtherGroup => "other_group",
            SkipReason::UnknownType => "unknown_type",
        }
    }
}

/// `BlockStored`: full blocks became resident.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockStored {
    /// vLLM's hashes of the stored blocks, in chain order (as u64, see [`read_hash`]).
    pub block_hashes: Vec<u64>,
    /// vLLM hash of the block before the first stored one; `None` when it is block 0.
    pub parent: Option<u64>,
    /// Tokens of all stored blocks, concatenated.
    pub token_ids: Vec<u32>,
    /// Tokens per block, when the event says.
    pub block_size: Option<u32>,
    /// The LoRA adapter the blocks were computed with, if any.
    pub lora_name: Option<String>,
    /// One entry per block (may be shorter than `block_hashes`; missing = no extra keys).
    pub extra_keys: Vec<Vec<RawExtraKey>>,
}

/// An extra key as vLLM publishes it (untagged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawExtraKey {
    /// A bare string: the LoRA name or the cache salt.
    Str(String),
    /// A multimodal item `(identifier, offset)`.
    Multimodal {
        /// The item's identifier.
        id: String,
        /// Where the item starts in the prompt (token offset).
        offset: i64,
    },
    /// Anything else (e.g. a digest), rendered as a string.
    Other(String),
}

/// `BlockRemoved`: blocks were evicted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockRemoved {
    /// vLLM's hashes of the evicted blocks (as u64, see [`read_hash`]).
    pub block_hashes: Vec<u64>,
}

/// A ZMQ message split into its parts (live PUB message or replay reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frames<'a> {
    /// The publisher's sequence number.
    pub seq: u64,
    /// The msgpack `EventBatch`.
    pub payload: &'a [u8],
}

impl Frames<'_> {
    /// True for the replay end marker.
    pub fn is_end_marker(&self) -> bool {
        self.seq == END_MARKER_SEQ
    }
}

/// Splits a live message `[topic, seq, payload]` or a replay reply (`["", topic, seq, payload]`,
/// older `[seq, payload]`, end marker with seq `ff x8`): the sequence number is always the
/// second-to-last frame and the payload the last one.
pub fn split_frames<'a, F: AsRef<[u8]>>(frames: &'a [F]) -> Result<Frames<'a>, DecodeError> {
    let n = frames.len();
    if n < 2 {
        return Err(DecodeError::FrameCount(n));
    }
    let seq = decode_seq(frames[n - 2].as_ref())?;
    Ok(Frames {
        seq,
        payload: frames[n - 1].as_ref(),
    })
}

/// Reads a sequence frame: the first 8 bytes, big-endian (a longer frame may carry a
/// publisher id after them).
pub fn decode_seq(frame: &[u8]) -> Result<u64, DecodeError> {
    let bytes: [u8; 8] = frame
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(DecodeError::SeqFrame(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Decodes one msgpack `EventBatch` payload.
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
            "lora_name" => self.lora_name = r.opt_str()?.map(str::to_owned),
            "medium" => self.medium = r.opt_str()?.map(str::to_owned),
            "group_idx" => self.group_idx = r.opt_int()?,
            "kv_cache_spec_kind" => self.kind = r.opt_str()?.map(str::to_owned),
            "extra_keys" => self.extra_keys = read_extra_keys(r)?,
            _ => r.skip()?,
        }
        Ok(())
    }

    /// The filter: GPU medium (or none given) and the full-attention group.
    fn skip_reason(&self) -> Option<SkipReason> {
        if let Some(m) = &self.medium
            && !m.eq_ignore_ascii_case("GPU")
        {
            return Some(SkipReason::OtherMedium);
        }
        if self.group_idx.is_some_and(|g| g != 0) {
            return Some(SkipReason::OtherGroup);
        }
        match self.kind.as_deref() {
            None | Some("full_attention") | Some("mla_attention") => None,
            Some(_) => Some(SkipReason::OtherGroup),
        }
    }

    fn into_event(self, ty: &str) -> Result<KvEvent, DecodeError> {
        match ty {
            "AllBlocksCleared" => Ok(KvEvent::Cleared),
            "BlockStored" | "BlockRemoved" => {
                if let Some(reason) = self.skip_reason() {
                    return Ok(KvEvent::Skipped(reason));
                }
                let block_hashes = self
                    .block_hashes
                    .ok_or(DecodeError::MissingField("block_hashes"))?;
                if ty == "BlockRemoved" {
                    return Ok(KvEvent::Removed(BlockRemoved { block_hashes }));
                }
                Ok(KvEvent::Stored(BlockStored {
                    block_hashes,
                    parent: self.parent,
                    token_ids: self
                        .token_ids
                        .ok_or(DecodeError::MissingField("token_ids"))?,
                    block_size: self.block_size,
                    lora_name: self.lora_name,
                    extra_keys: self.extra_keys,
                }))
            }
            _ => Ok(KvEvent::Skipped(SkipReason::UnknownType)),
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
pub fn read_hash(r: &mut Reader<'_>) -> Result<u64, DecodeError> {
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
            // (identifier, offset) when it has that shape; anything else is rendered.
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
            render_other(r)
        }
        _ => render_other(r),
    }
}

/// Renders a value we have no dedicated form for as lowercase hex of its msgpack bytes, so it
/// still separates blocks deterministically.
fn render_other(r: &mut Reader<'_>) -> Result<RawExtraKey, DecodeError> {
    let start = r.pos;
    r.skip()?;
    let bytes = r
        .buf
        .get(start..r.pos)
        .ok_or(DecodeError::Truncated(start))?;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    Ok(RawExtraKey::Other(s))
}

/// A msgpack integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int {
    /// An unsigned value (positive fixint, uint 8 to 64).
    U(u64),
    /// A signed value (negative fixint, int 8 to 64).
    I(i64),
}

/// Minimal msgpack cursor over a byte slice. Every read is bounds-checked.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A cursor at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn peek(&self) -> Result<u8, DecodeError> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or(DecodeError::Truncated(self.pos))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(DecodeError::Truncated(self.pos))?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(DecodeError::Truncated(self.pos))?;
        self.pos = end;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let at = self.pos;
        self.take(N)?
            .try_into()
            .map_err(|_| DecodeError::Truncated(at))
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    fn len_u16(&mut self) -> Result<usize, DecodeError> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }

    fn len_u32(&mut self) -> Result<usize, DecodeError> {
        usize::try_from(u32::from_be_bytes(self.be()?))
            .map_err(|_| DecodeError::IntOutOfRange(self.pos))
    }

    fn nil(&mut self) -> Result<bool, DecodeError> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    fn array_len(&mut self) -> Result<usize, DecodeError> {
        let at = self.pos;
        match self.u8()? {
            b @ 0x90..=0x9f => Ok(usize::from(b & 0x0f)),
            0xdc => self.len_u16(),
            0xdd => self.len_u32(),
            _ => Err(DecodeError::UnexpectedType {
                expected: "array",
                at,
            }),
        }
    }

    fn map_len(&mut self) -> Result<usize, DecodeError> {
        let at = self.pos;
        match self.u8()? {
            b @ 0x80..=0x8f => Ok(usize::from(b & 0x0f)),
            0xde => self.len_u16(),
            0xdf => self.len_u32(),
            _ => Err(DecodeError::UnexpectedType {
                expected: "map",
                at,
            }),
        }
    }

    fn str(&mut self) -> Result<&'a str, DecodeError> {
        let at = self.pos;
        let n = match self.u8()? {
            b @ 0xa0..=0xbf => usize::from(b & 0x1f),
            0xd9 => usize::from(self.u8()?),
            0xda => self.len_u16()?,
            0xdb => self.len_u32()?,
            _ => {
                return Err(DecodeError::UnexpectedType {
                    expected: "string",
                    at,
                });
            }
        };
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::InvalidUtf8(at))
    }

    /// A map key: a string (other key types are not produced by vLLM).
    fn key(&mut self) -> Result<&'a str, DecodeError> {
        self.str()
    }

    fn opt_str(&mut self) -> Result<Option<&'a str>, DecodeError> {
        if self.nil()? {
            Ok(None)
        } else {
            self.str().map(Some)
        }
    }

    fn bin(&mut self) -> Result<&'a [u8], DecodeError> {
        let at = self.pos;
        let n = match self.u8()? {
            0xc4 => usize::from(self.u8()?),
            0xc5 => self.len_u16()?,
            0xc6 => self.len_u32()?,
            _ => {
                return Err(DecodeError::UnexpectedType {
                    expected: "bin",
                    at,
                });
            }
        };
        self.take(n)
    }

    fn int(&mut self) -> Result<Int, DecodeError> {
        let at = self.pos;
        Ok(match self.u8()? {
            b @ 0x00..=0x7f => Int::U(u64::from(b)),
            b @ 0xe0..=0xff => Int::I(i64::from(b as i8)),
            0xcc => Int::U(u64::from(self.u8()?)),
            0xcd => Int::U(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Int::U(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Int::U(u64::from_be_bytes(self.be()?)),
            0xd0 => Int::I(i64::from(i8::from_be_bytes(self.be()?))),
            0xd1 => Int::I(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => Int::I(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => Int::I(i64::from_be_bytes(self.be()?)),
            _ => {
                return Err(DecodeError::UnexpectedType {
                    expected: "integer",
                    at,
                });
            }
        })
    }

    fn opt_int(&mut self) -> Result<Option<i64>, DecodeError> {
        if self.nil()? {
            return Ok(None);
        }
        let at = self.pos;
        match self.int()? {
            Int::U(v) => i64::try_from(v)
                .map(Some)
                .map_err(|_| DecodeError::IntOutOfRange(at)),
            Int::I(v) => Ok(Some(v)),
        }
    }

    /// A float or an integer, as f64.
    fn number(&mut self) -> Result<f64, DecodeError> {
        match self.peek()? {
            0xcb => {
                self.pos += 1;
                Ok(f64::from_be_bytes(self.be()?))
            }
            0xca => {
                self.pos += 1;
                Ok(f64::from(f32::from_be_bytes(self.be()?)))
            }
            _ => Ok(match self.int()? {
                Int::U(v) => v as f64,
                Int::I(v) => v as f64,
            }),
        }
    }

    /// Skips one complete value of any type, iteratively (bounded depth, no recursion).
    fn skip(&mut self) -> Result<(), DecodeError> {
        // Number of values still to skip at each open nesting level.
        let mut pending: Vec<usize> = vec![1];
        while let Some(top) = pending.last_mut() {
            if *top == 0 {
                pending.pop();
                continue;
            }
            *top -= 1;
            let at = self.pos;
            let children = match self.u8()? {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
                b @ 0x80..=0x8f => 2 * usize::from(b & 0x0f),
                b @ 0x90..=0x9f => usize::from(b & 0x0f),
                b @ 0xa0..=0xbf => {
                    self.take(usize::from(b & 0x1f))?;
                    0
                }
                0xc4 | 0xd9 => {
                    let n = usize::from(self.u8()?);
                    self.take(n)?;
                    0
                }
                0xc5 | 0xda => {
                    let n = self.len_u16()?;
                    self.take(n)?;
                    0
                }
                0xc6 | 0xdb => {
                    let n = self.len_u32()?;
                    self.take(n)?;
                    0
                }
                0xc7 => {
                    let n = usize::from(self.u8()?);
                    self.take(n + 1)?;
                    0
                }
                0xc8 => {
                    let n = self.len_u16()?;
                    self.take(n + 1)?;
                    0
                }
                0xc9 => {
                    let n = self.len_u32()?;
                    self.take(n.saturating_add(1))?;
                    0
                }
                0xca => {
                    self.take(4)?;
                    0
                }
                0xcb => {
                    self.take(8)?;
                    0
                }
                0xcc | 0xd0 => {
                    self.take(1)?;
                    0
                }
                0xcd | 0xd1 => {
                    self.take(2)?;
                    0
                }
                0xce | 0xd2 => {
                    self.take(4)?;
                    0
                }
                0xcf | 0xd3 => {
                    self.take(8)?;
                    0
                }
                0xd4 => {
                    self.take(2)?;
                    0
                }
                0xd5 => {
                    self.take(3)?;
                    0
                }
                0xd6 => {
                    self.take(5)?;
                    0
                }
                0xd7 => {
                    self.take(9)?;
                    0
                }
                0xd8 => {
                    self.take(17)?;
                    0
                }
                0xdc => self.len_u16()?,
                0xdd => self.len_u32()?,
                0xde => 2 * self.len_u16()?,
                0xdf => self.len_u32()?.saturating_mul(2),
                0xc1 => {
                    return Err(DecodeError::UnexpectedType {
                        expected: "msgpack value",
                        at,
                    });
                }
            };
            if children > 0 {
                if pending.len() >= MAX_SKIP_DEPTH {
                    return Err(DecodeError::TooDeep);
                }
                // Every child needs at least one byte: reject impossible counts early.
                if children > self.remaining() {
                    return Err(DecodeError::Truncated(self.pos));
                }
                pending.push(children);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 204-byte example from the vLLM interface notes (tokens 1..16, one block).
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
        let KvEvent::Stored(s) = &batch.events[0] else {
            panic!("not stored")
        };
        assert_eq!(s.block_hashes, vec![8866452693264111234]);
        assert_eq!(s.parent, None);
        assert_eq!(s.token_ids, (1..=16).collect::<Vec<u32>>());
        assert_eq!(s.block_size, Some(16));
        assert_eq!(s.extra_keys, vec![Vec::<RawExtraKey>::new()]);
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
        assert_eq!(batch.ts, 1.0);
        assert_eq!(
            batch.events,
            vec![
                KvEvent::Removed(BlockRemoved {
                    block_hashes: vec![u64::MAX]
                }),
                KvEvent::Cleared,
                KvEvent::Skipped(SkipReason::UnknownType),
            ]
        );
    }

    #[test]
    fn frames_and_end_marker() {
        let seq = 5u64.to_be_bytes();
        let live: [&[u8]; 3] = [b"", &seq, b"\x90"];
        let f = split_frames(&live).unwrap();
        assert_eq!((f.seq, f.payload), (5, &b"\x90"[..]));
        let end: [&[u8]; 4] = [b"", b"", &[0xff; 8], b""];
        assert!(split_frames(&end).unwrap().is_end_marker());
        assert_eq!(split_frames(&[b"x"]), Err(DecodeError::FrameCount(1)));
        let short: [&[u8]; 2] = [b"1234", b""];
        assert_eq!(split_frames(&short), Err(DecodeError::SeqFrame(4)));
        // A 24-byte seq frame (seq + publisher id) reads the first 8 bytes.
        let mut long = 7u64.to_be_bytes().to_vec();
        long.extend_from_slice(&[9; 16]);
        assert_eq!(decode_seq(&long), Ok(7));
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
}
