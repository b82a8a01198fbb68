//! The worker's resident block set, in kvroute hashes.
//!
//! ```text
//! BlockStored(vLLM hashes, parent, tokens) --re-hash--> kvroute hashes --> Op::Stored
//! BlockRemoved(vLLM hashes) --map vLLM->kvroute--> Op::Removed
//! AllBlocksCleared --> Op::Cleared
//! ```
//!
//! Pure code. vLLM's hashes are only used as keys to find a block again (for removals and
//! as parents); what we report are kvroute hashes computed from the published token ids
//! (hash/SPEC.md). Several vLLM hashes may map to one kvroute hash (vLLM hashes inputs we
//! never see, such as a LoRA path), so resident kvroute hashes are reference-counted.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasherDefault, Hasher};

use kvroute_hash::{BlockHash, ExtraKey, block_hash, encode_extra, root_hash};
use kvroute_vllm_wire::{BlockRemoved, BlockStored, KvEvent, RawExtraKey};

/// Hasher for maps keyed by block hashes, which are already uniformly distributed digests
/// (vLLM's sha256/xxhash, kvroute's xxh3): one multiply instead of SipHash. The keys come
/// from the local vLLM, not from untrusted clients, so flooding is not a concern.
#[derive(Default, Clone, Copy)]
pub struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, x: u64) {
        // Multiply, then fold the high bits down: hashbrown uses both the top 7 bits and the
        // low bits, and small synthetic keys must still spread.
        let m = (x ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = m ^ (m >> 32);
    }
}

type BlockMap<V> = HashMap<u64, V, BuildHasherDefault<BlockHasher>>;

/// A change to the resident set, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// These kvroute blocks became resident.
    Stored(Vec<BlockHash>),
    /// These kvroute blocks stopped being resident.
    Removed(Vec<BlockHash>),
    /// Every block was dropped (vLLM's `AllBlocksCleared`).
    Cleared,
}

/// Appends ops, merging a run of the same kind into one op.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ops(pub Vec<Op>);

impl Ops {
    fn stored(&mut self, h: BlockHash) {
        match self.0.last_mut() {
            Some(Op::Stored(v)) => v.push(h),
            _ => self.0.push(Op::Stored(vec![h])),
        }
    }

    fn removed(&mut self, h: BlockHash) {
        match self.0.last_mut() {
            Some(Op::Removed(v)) => v.push(h),
            _ => self.0.push(Op::Removed(vec![h])),
        }
    }

    fn cleared(&mut self) {
        // Everything before a clear is moot.
        self.0.clear();
        self.0.push(Op::Cleared);
    }

    /// Whether no change was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of blocks named by the ops.
    pub fn blocks(&self) -> usize {
        self.0
            .iter()
            .map(|op| match op {
                Op::Stored(v) | Op::Removed(v) => v.len(),
                Op::Cleared => 0,
            })
            .sum()
    }
}

/// What applying events did, for metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ApplyStats {
    /// Blocks whose kvroute hash became resident.
    pub stored: u64,
    /// Blocks whose kvroute hash stopped being resident.
    pub removed: u64,
    /// Stores of a vLLM hash already known (vLLM re-announces cached blocks).
    pub duplicate_stores: u64,
    /// BlockStored events skipped because their parent was never seen.
    pub unknown_parent: u64,
    /// Removals of a vLLM hash we never stored.
    pub unknown_removed: u64,
    /// BlockStored events whose token count does not match blocks x block size.
    pub bad_token_count: u64,
    /// Blocks refused because the set is at its cap.
    pub over_capacity: u64,
    /// `AllBlocksCleared` events applied.
    pub cleared: u64,
    /// Adapter names of events left out of the adapter list (see [`crate::lora`]).
    pub lora_dropped: u64,
}

/// Identity of the hashed sequences and limits.
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// Served model name (part of every chain's root).
    pub model: String,
    /// LoRA adapter assumed when an event names none.
    pub default_lora: Option<String>,
    /// Block size assumed when an event carries none.
    pub block_size: Option<u32>,
    /// Most vLLM hashes tracked; beyond it stores are refused (vLLM's cache is far smaller).
    pub max_blocks: usize,
}

/// The resident set of one worker.
#[derive(Debug)]
pub struct ResidentSet {
    config: StateConfig,
    /// Block size learned from events (or configured).
    block_size: Option<u32>,
    /// vLLM hash -> kvroute hash.
    by_vllm: BlockMap<BlockHash>,
    /// Resident kvroute hash -> number of vLLM hashes mapping to it.
    refs: BlockMap<u32>,
    /// Root of the chain without a LoRA adapter (the common case), cached.
    base_root: BlockHash,
    /// Reusable buffer for encoded extra keys.
    extra_buf: Vec<u8>,
}

impl ResidentSet {
    /// An empty set hashing with `config`'s model, LoRA and block size.
    pub fn new(config: StateConfig) -> Self {
        let base_root = root_hash(&config.model, config.default_lora.as_deref());
        ResidentSet {
            block_size: config.block_size,
            config,
            by_vllm: BlockMap::default(),
            refs: BlockMap::default(),
            base_root,
            extra_buf: Vec::new(),
        }
    }

    /// The block size in use: configured, or learned from the last BlockStored.
    pub fn block_size(&self) -> Option<u32> {
        self.block_size
    }

    /// Sets the block size used for events that carry none.
    pub fn set_block_size(&mut self, block_size: u32) {
        self.block_size = Some(block_size);
        self.config.block_size = Some(block_size);
    }

    /// Number of resident kvroute blocks.
    pub fn len(&self) -> usize {
        self.refs.len()
    }

    /// Whether no block is resident.
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// Resident kvroute hashes (unordered).
    pub fn blocks(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.refs.keys().copied()
    }

    /// Whether kvroute hash `h` is resident.
    pub fn contains(&self, h: BlockHash) -> bool {
        self.refs.contains_key(&h)
    }

    /// The kvroute hash a vLLM hash maps to, if resident.
    pub fn kvroute_hash(&self, vllm: u64) -> Option<BlockHash> {
        self.by_vllm.get(&vllm).copied()
    }

    /// Forgets everything (vLLM restarted or events were lost). Emits no op: the caller
    /// starts a new epoch instead.
    pub fn reset(&mut self) {
        self.by_vllm.clear();
        self.refs.clear();
    }

    /// Applies one event, appending the resulting changes to `ops`. Events about another
    /// tier or KV-cache group, and unknown ones, change nothing ([`KvEvent::skip_reason`]).
    pub fn apply(&mut self, event: &KvEvent, ops: &mut Ops, stats: &mut ApplyStats) {
        if event.skip_reason().is_some() {
            return;
        }
        match event {
            KvEvent::Stored(s) => self.store(s, ops, stats),
            KvEvent::Removed(r) => self.remove(r, ops, stats),
            KvEvent::Cleared => {
                self.reset();
                stats.cleared += 1;
                ops.cleared();
            }
            KvEvent::Unknown(_) => {}
        }
    }

    fn store(&mut self, s: &BlockStored, ops: &mut Ops, stats: &mut ApplyStats) {
        let n = s.block_hashes.len();
        if n == 0 {
            return;
        }
        let inferred = s
            .token_ids
            .len()
            .is_multiple_of(n)
            .then(|| u32::try_from(s.token_ids.len() / n).ok())
            .flatten();
        let Some(bs) = s
            .block_size
            .or(self.config.block_size)
            .or(inferred)
            .filter(|&b| b > 0)
        else {
            stats.bad_token_count += 1;
            return;
        };
        let bs_usize = bs as usize;
        if s.token_ids.len() != n.saturating_mul(bs_usize) {
            stats.bad_token_count += 1;
            return;
        }
        self.block_size = Some(bs);
        let mut parent = match s.parent {
            None => match s.lora_name.as_deref() {
                None => self.base_root,
                Some(lora) => root_hash(&self.config.model, Some(lora)),
            },
            Some(p) => match self.by_vllm.get(&p) {
                Some(&h) => h,
                None => {
                    stats.unknown_parent += 1;
                    return;
                }
            },
        };
        // Owned (rarely set): `self` is borrowed mutably below.
        let lora: Option<String> = s
            .lora_name
            .clone()
            .or_else(|| self.config.default_lora.clone());
        let lora = lora.as_deref();
        for (i, (&vllm, tokens)) in s
            .block_hashes
            .iter()
            .zip(s.token_ids.chunks_exact(bs_usize))
            .enumerate()
        {
            let first_of_sequence = i == 0 && s.parent.is_none();
            let extra = s.extra_keys.get(i).map(Vec::as_slice).unwrap_or(&[]);
            let h = if extra.is_empty() {
                block_hash(parent, tokens, &[])
            } else {
                encode_block_extra(extra, lora, first_of_sequence, &mut self.extra_buf);
                block_hash(parent, tokens, &self.extra_buf)
            };
            self.insert(vllm, h, ops, stats);
            parent = h;
        }
    }

    fn insert(&mut self, vllm: u64, h: BlockHash, ops: &mut Ops, stats: &mut ApplyStats) {
        match self.by_vllm.entry(vllm) {
            Entry::Occupied(mut e) => {
                let old = *e.get();
                if old == h {
                    stats.duplicate_stores += 1;
                    return;
                }
                // Same vLLM hash, different content: vLLM's hash collided or the inputs we
                // hash changed; the newest announcement wins.
                e.insert(h);
                self.release(old, ops, stats);
            }
            Entry::Vacant(e) => {
                if self.refs.len() >= self.config.max_blocks {
                    stats.over_capacity += 1;
                    return;
                }
                e.insert(h);
            }
        }
        let count = self.refs.entry(h).or_insert(0);
        *count += 1;
        if *count == 1 {
            stats.stored += 1;
            ops.stored(h);
        }
    }

    fn release(&mut self, h: BlockHash, ops: &mut Ops, stats: &mut ApplyStats) {
        if let Entry::Occupied(mut e) = self.refs.entry(h) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
                stats.removed += 1;
                ops.removed(h);
            }
        }
    }

    fn remove(&mut self, r: &BlockRemoved, ops: &mut Ops, stats: &mut ApplyStats) {
        for vllm in &r.block_hashes {
            match self.by_vllm.remove(vllm) {
                Some(h) => self.release(h, ops, stats),
                None => stats.unknown_removed += 1,
            }
        }
    }
}

/// Maps a block's published extra keys to kvroute's (hash/SPEC.md): the LoRA name is dropped
/// (it is in the root), a bare string on a sequence's first block is the cache salt, a
/// `(id, offset)` pair a multimodal item (a negative offset is reinterpreted as u64), anything
/// else is kept as an opaque string: the lowercase hex of its msgpack bytes.
pub fn map_extra_keys(
    raw: &[RawExtraKey],
    lora: Option<&str>,
    first_of_sequence: bool,
) -> Vec<ExtraKey> {
    raw.iter()
        .filter_map(|k| match k {
            RawExtraKey::Str(s) if Some(s.as_str()) == lora => None,
            RawExtraKey::Str(s) if first_of_sequence => Some(ExtraKey::CacheSalt(s.clone())),
            RawExtraKey::Str(s) => Some(ExtraKey::Other(s.clone())),
            RawExtraKey::Other(raw) => Some(ExtraKey::Other(hex(raw))),
            RawExtraKey::Multimodal { id, offset } => Some(ExtraKey::Multimodal {
                id: id.clone(),
                offset: *offset as u64,
            }),
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn encode_block_extra(
    raw: &[RawExtraKey],
    lora: Option<&str>,
    first_of_sequence: bool,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.extend_from_slice(&encode_extra(&map_extra_keys(raw, lora, first_of_sequence)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_hash::chain;

    fn set() -> ResidentSet {
        ResidentSet::new(StateConfig {
            model: "m".into(),
            default_lora: None,
            block_size: None,
            max_blocks: 1000,
        })
    }

    fn stored(hashes: &[u64], parent: Option<u64>, first_token: u32, bs: u32) -> KvEvent {
        let n = hashes.len() as u32;
        KvEvent::Stored(BlockStored {
            block_hashes: hashes.to_vec(),
            parent,
            token_ids: (first_token..first_token + n * bs).collect(),
            block_size: Some(bs),
            ..Default::default()
        })
    }

    #[test]
    fn chain_placement_matches_router_side_chain() {
        let mut s = set();
        let (mut ops, mut st) = (Ops::default(), ApplyStats::default());
        s.apply(&stored(&[11, 12], None, 0, 4), &mut ops, &mut st);
        s.apply(&stored(&[13], Some(12), 8, 4), &mut ops, &mut st);
        let expect = chain(root_hash("m", None), &(0..12).collect::<Vec<_>>(), 4, &[]);
        assert_eq!(ops, Ops(vec![Op::Stored(expect.clone())]));
        assert_eq!(s.kvroute_hash(13), Some(expect[2]));
        assert_eq!(s.block_size(), Some(4));
    }

    #[test]
    fn unknown_parent_is_counted_and_skipped() {
        let mut s = set();
        let (mut ops, mut st) = (Ops::default(), ApplyStats::default());
        s.apply(&stored(&[13], Some(99), 8, 4), &mut ops, &mut st);
        assert!(ops.is_empty());
        assert_eq!(st.unknown_parent, 1);
        assert!(s.is_empty());
    }

    #[test]
    fn stores_are_idempotent_and_removals_apply() {
        let mut s = set();
        let (mut ops, mut st) = (Ops::default(), ApplyStats::default());
        s.apply(&stored(&[11, 12], None, 0, 4), &mut ops, &mut st);
        s.apply(&stored(&[11, 12], None, 0, 4), &mut ops, &mut st);
        assert_eq!(st.duplicate_stores, 2);
        assert_eq!(s.len(), 2);
        let h12 = s.kvroute_hash(12).unwrap();
        s.apply(
            &KvEvent::Removed(BlockRemoved {
                block_hashes: vec![12, 77],
                ..Default::default()
            }),
            &mut ops,
            &mut st,
        );
        assert_eq!(ops.0.last(), Some(&Op::Removed(vec![h12])));
        assert_eq!(st.unknown_removed, 1);
        s.apply(&KvEvent::Cleared, &mut ops, &mut st);
        assert_eq!(ops, Ops(vec![Op::Cleared]));
        assert!(s.is_empty());
    }

    #[test]
    fn two_vllm_hashes_one_kvroute_hash_are_refcounted() {
        let mut s = set();
        let (mut ops, mut st) = (Ops::default(), ApplyStats::default());
        s.apply(&stored(&[1], None, 0, 4), &mut ops, &mut st);
        s.apply(&stored(&[2], None, 0, 4), &mut ops, &mut st);
        assert_eq!(s.len(), 1);
        s.apply(
            &KvEvent::Removed(BlockRemoved {
                block_hashes: vec![1],
                ..Default::default()
            }),
            &mut ops,
            &mut st,
        );
        assert_eq!(s.len(), 1);
        s.apply(
            &KvEvent::Removed(BlockRemoved {
                block_hashes: vec![2],
                ..Default::default()
            }),
            &mut ops,
            &mut st,
        );
        assert!(s.is_empty());
    }

    #[test]
    fn token_count_mismatch_and_capacity() {
        let mut s = ResidentSet::new(StateConfig {
            model: "m".into(),
            default_lora: None,
            block_size: None,
            max_blocks: 1,
        });
        let (mut ops, mut st) = (Ops::default(), ApplyStats::default());
        let mut bad = stored(&[1], None, 0, 4);
        if let KvEvent::Stored(b) = &mut bad {
            b.token_ids.pop();
        }
        s.apply(&bad, &mut ops, &mut st);
        assert_eq!(st.bad_token_count, 1);
        s.apply(&stored(&[1, 2], None, 0, 4), &mut ops, &mut st);
        assert_eq!((s.len(), st.over_capacity), (1, 1));
    }

    #[test]
    fn extra_keys_mapping() {
        let raw = vec![
            RawExtraKey::Str("sql".into()),
            RawExtraKey::Multimodal {
                id: "img".into(),
                offset: -27,
            },
            RawExtraKey::Str("tenant".into()),
        ];
        assert_eq!(
            map_extra_keys(&raw, Some("sql"), true),
            vec![
                ExtraKey::Multimodal {
                    id: "img".into(),
                    offset: (-27i64) as u64
                },
                ExtraKey::CacheSalt("tenant".into())
            ]
        );
        assert_eq!(
            map_extra_keys(&raw[2..], None, false),
            vec![ExtraKey::Other("tenant".into())]
        );
        // Any other value: the hex of its msgpack bytes (a 1-byte bin here).
        assert_eq!(
            map_extra_keys(&[RawExtraKey::Other(vec![0xc4, 0x01, 0xaa])], None, true),
            vec![ExtraKey::Other("c401aa".into())]
        );
    }

    #[test]
    fn other_tiers_groups_and_unknown_events_change_nothing() {
        let mut s = set();
        let (mut ops, mut st) = (Ops::default(), ApplyStats::default());
        s.apply(&stored(&[11], None, 0, 4), &mut ops, &mut st);
        let mut on_cpu = stored(&[12], None, 0, 4);
        let mut other_group = stored(&[13], None, 4, 4);
        if let (KvEvent::Stored(c), KvEvent::Stored(g)) = (&mut on_cpu, &mut other_group) {
            c.medium = Some("CPU".into());
            g.group_idx = Some(1);
        }
        let cpu_removal = KvEvent::Removed(BlockRemoved {
            block_hashes: vec![11],
            medium: Some("CPU".into()),
            group_idx: None,
        });
        for ev in [
            on_cpu,
            other_group,
            cpu_removal,
            KvEvent::Unknown("Future".into()),
        ] {
            s.apply(&ev, &mut ops, &mut st);
        }
        assert_eq!(s.len(), 1);
        assert!(s.kvroute_hash(11).is_some());
        assert_eq!((st.stored, st.removed, st.unknown_removed), (1, 0, 0));
    }
}
