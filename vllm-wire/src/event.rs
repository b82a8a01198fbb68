//! The decoded form of vLLM's `KVEventBatch`: one type that the decoder fills, the encoder
//! writes and every component passes around.
//!
//! ```text
//! EventBatch { ts, dp_rank, events: [KvEvent] }
//! KvEvent = Stored(BlockStored) | Removed(BlockRemoved) | Cleared | Unknown(type name)
//!           --skip_reason()--> None (track it) | Some(OtherMedium | OtherGroup | UnknownType)
//! ```
//!
//! Events keep the fields that say where the blocks live (`medium`, `group_idx`,
//! `kv_cache_spec_kind`) instead of being filtered while decoding, so that what was read can be
//! written again unchanged; [`KvEvent::skip_reason`] says which ones a prefix-cache tracker
//! should ignore.

/// `medium` of blocks in GPU memory (offload connectors publish "CPU" or "STORAGE").
pub const MEDIUM_GPU: &str = "GPU";

/// `kv_cache_spec_kind` of the full-attention KV-cache group.
pub const FULL_ATTENTION: &str = "full_attention";

/// One scheduler step's worth of events (vLLM's `KVEventBatch`).
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Publisher wall-clock time, seconds since the epoch.
    pub ts: f64,
    /// The events, in the order the engine produced them.
    pub events: Vec<KvEvent>,
    /// Data-parallel rank of the publishing engine, when sent.
    pub dp_rank: Option<i64>,
}

/// A KV-cache event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// `BlockStored`: full blocks became cached.
    Stored(BlockStored),
    /// `BlockRemoved`: cached blocks were evicted (vLLM sends one hash per event).
    Removed(BlockRemoved),
    /// `AllBlocksCleared`: the whole prefix cache was reset.
    Cleared,
    /// An event type this crate does not know, by its type name (never one of the three
    /// above); its fields were skipped, and it is written back as `{"type": name}`.
    Unknown(String),
}

/// Why a well-formed event does not describe the GPU prefix cache a router can use.
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

impl KvEvent {
    /// `None` for an event about the GPU's full-attention prefix cache (a medium, group and
    /// kind that are absent count as such: older releases do not send them).
    pub fn skip_reason(&self) -> Option<SkipReason> {
        match self {
            KvEvent::Stored(s) => placement_skip(
                s.medium.as_deref(),
                s.group_idx,
                s.kv_cache_spec_kind.as_deref(),
            ),
            KvEvent::Removed(r) => placement_skip(r.medium.as_deref(), r.group_idx, None),
            KvEvent::Cleared => None,
            KvEvent::Unknown(_) => Some(SkipReason::UnknownType),
        }
    }

    /// The vLLM type name (`"BlockStored"`, ...), as the `type` key carries it.
    pub fn type_name(&self) -> &str {
        match self {
            KvEvent::Stored(_) => "BlockStored",
            KvEvent::Removed(_) => "BlockRemoved",
            KvEvent::Cleared => "AllBlocksCleared",
            KvEvent::Unknown(name) => name,
        }
    }
}

pub(crate) fn placement_skip(
    medium: Option<&str>,
    group_idx: Option<i64>,
    kind: Option<&str>,
) -> Option<SkipReason> {
    if medium.is_some_and(|m| !m.eq_ignore_ascii_case(MEDIUM_GPU)) {
        return Some(SkipReason::OtherMedium);
    }
    if group_idx.is_some_and(|g| g != 0) {
        return Some(SkipReason::OtherGroup);
    }
    match kind {
        None | Some(FULL_ATTENTION) | Some("mla_attention") => None,
        Some(_) => Some(SkipReason::OtherGroup),
    }
}

/// `BlockStored`: full blocks became resident.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockStored {
    /// vLLM's hashes of the stored blocks, in chain order. A digest sent as `bin` is read as
    /// its last 8 bytes big-endian (what vLLM's int form is); a negative int (older releases)
    /// is reinterpreted as u64.
    pub block_hashes: Vec<u64>,
    /// vLLM hash of the block before the first stored one; `None` when it is block 0.
    pub parent: Option<u64>,
    /// Tokens of all stored blocks, concatenated.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: Option<u32>,
    /// Deprecated by vLLM; kept so that a written event says what was read.
    pub lora_id: Option<i64>,
    /// Where the blocks live ("GPU" for the prefix cache; see [`MEDIUM_GPU`]).
    pub medium: Option<String>,
    /// The LoRA adapter the blocks were computed with.
    pub lora_name: Option<String>,
    /// One entry per block (may be shorter than `block_hashes`); an empty entry is vLLM's
    /// `None` (no extra keys) and is written as nil.
    pub extra_keys: Vec<Vec<RawExtraKey>>,
    /// KV-cache group (0 is the full-attention group of a single-group model).
    pub group_idx: Option<i64>,
    /// The group's kind ("full_attention", "sliding_window", ...; see [`FULL_ATTENTION`]).
    pub kv_cache_spec_kind: Option<String>,
}

impl BlockStored {
    /// An event with vLLM 0.33's placement of a single-group model's blocks: GPU, group 0,
    /// full attention. Fill the other fields with struct update syntax.
    pub fn on_gpu() -> Self {
        BlockStored {
            medium: Some(MEDIUM_GPU.to_owned()),
            group_idx: Some(0),
            kv_cache_spec_kind: Some(FULL_ATTENTION.to_owned()),
            ..BlockStored::default()
        }
    }
}

/// An extra key as vLLM publishes it (untagged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawExtraKey {
    /// A bare string: the LoRA name or the cache salt.
    Str(String),
    /// A multimodal item `(identifier, offset)`.
    Multimodal {
        /// The item's identifier (a content hash).
        id: String,
        /// Where the item starts, relative to the block.
        offset: i64,
    },
    /// Any other value (e.g. a digest), as its complete msgpack encoding. The encoder writes
    /// these bytes unchanged, so they must hold exactly one msgpack value that is neither a
    /// string nor a `(string, int)` pair.
    Other(Vec<u8>),
}

/// `BlockRemoved`: blocks were evicted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockRemoved {
    /// vLLM's hashes of the evicted blocks (read like [`BlockStored::block_hashes`]).
    pub block_hashes: Vec<u64>,
    /// Where the blocks lived (see [`BlockStored::medium`]).
    pub medium: Option<String>,
    /// KV-cache group (see [`BlockStored::group_idx`]).
    pub group_idx: Option<i64>,
}

impl BlockRemoved {
    /// Removal of GPU blocks of group 0, as vLLM 0.33 publishes it for a single-group model.
    pub fn on_gpu(block_hashes: Vec<u64>) -> Self {
        BlockRemoved {
            block_hashes,
            medium: Some(MEDIUM_GPU.to_owned()),
            group_idx: Some(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_reasons_follow_medium_group_and_kind() {
        let stored = |medium: Option<&str>, group: Option<i64>, kind: Option<&str>| {
            KvEvent::Stored(BlockStored {
                medium: medium.map(str::to_owned),
                group_idx: group,
                kv_cache_spec_kind: kind.map(str::to_owned),
                ..BlockStored::default()
            })
            .skip_reason()
        };
        assert_eq!(stored(None, None, None), None);
        assert_eq!(KvEvent::Stored(BlockStored::on_gpu()).skip_reason(), None);
        assert_eq!(stored(Some("gpu"), Some(0), Some("mla_attention")), None);
        assert_eq!(
            stored(Some("CPU"), Some(0), None),
            Some(SkipReason::OtherMedium)
        );
        assert_eq!(
            stored(Some("GPU"), Some(1), None),
            Some(SkipReason::OtherGroup)
        );
        assert_eq!(
            stored(None, Some(0), Some("sliding_window")),
            Some(SkipReason::OtherGroup)
        );
        assert_eq!(
            KvEvent::Removed(BlockRemoved {
                block_hashes: vec![1],
                medium: Some("STORAGE".into()),
                group_idx: None,
            })
            .skip_reason(),
            Some(SkipReason::OtherMedium)
        );
        assert_eq!(
            KvEvent::Removed(BlockRemoved::on_gpu(vec![1])).skip_reason(),
            None
        );
        assert_eq!(KvEvent::Cleared.skip_reason(), None);
        assert_eq!(
            KvEvent::Unknown("Future".into()).skip_reason(),
            Some(SkipReason::UnknownType)
        );
        assert_eq!(KvEvent::Unknown("Future".into()).type_name(), "Future");
    }
}
