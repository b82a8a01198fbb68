//! kvroute's own chained 64-bit KV-block hash, shared by the sidecar and the router.
//!
//! ```text
//! root(model, lora) --block(tokens[0..B], extra)--> h1 --block(tokens[B..2B])--> h2 --> ...
//! ```
//!
//! The function is specified in `hash/SPEC.md` so that other implementations can reproduce it;
//! it never depends on vLLM's block hashes, hash algorithm or `PYTHONHASHSEED`.
//! Pure code: no I/O, no allocation on the per-block path.

use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_seed};

/// Domain separation prefix of the root hash.
const ROOT_DOMAIN: &[u8] = b"kvroute-block-v1";

/// Tags of the extra-key encodings (see SPEC.md).
const TAG_CACHE_SALT: u8 = 1;
const TAG_MULTIMODAL: u8 = 2;
const TAG_OTHER: u8 = 3;

/// Block sizes up to this many tokens are hashed from a stack buffer in one shot.
const ONE_SHOT_TOKENS: usize = 256;

/// A kvroute block hash.
pub type BlockHash = u64;

/// Hash a sequence's chain starts from: one per (model, LoRA adapter).
pub fn root_hash(model: &str, lora: Option<&str>) -> BlockHash {
    let lora = lora.unwrap_or("");
    let mut h = Xxh3::with_seed(0);
    h.update(ROOT_DOMAIN);
    h.update(&len32(model.len()).to_le_bytes());
    h.update(model.as_bytes());
    h.update(&len32(lora.len()).to_le_bytes());
    h.update(lora.as_bytes());
    h.digest()
}

/// An extra key that vLLM mixes into a block's hash and that kvroute mirrors.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ExtraKey {
    /// A request's `cache_salt`; only on the first block of a sequence.
    CacheSalt(String),
    /// A multimodal item overlapping the block: its identifier and offset in the prompt.
    Multimodal {
        /// The item's identifier, as vLLM publishes it.
        id: String,
        /// Where the item starts in the prompt (token offset), as vLLM publishes it.
        offset: u64,
    },
    /// Any other key vLLM publishes, rendered as a string.
    Other(String),
}

impl ExtraKey {
    /// Appends the key's canonical encoding (SPEC.md) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ExtraKey::CacheSalt(s) => push_tagged(out, TAG_CACHE_SALT, s),
            ExtraKey::Multimodal { id, offset } => {
                push_tagged(out, TAG_MULTIMODAL, id);
                out.extend_from_slice(&offset.to_le_bytes());
            }
            ExtraKey::Other(s) => push_tagged(out, TAG_OTHER, s),
        }
    }
}

/// Encodes a block's extra keys into the bytes `block_hash` takes.
pub fn encode_extra(keys: &[ExtraKey]) -> Vec<u8> {
    let mut out = Vec::new();
    for key in keys {
        key.encode(&mut out);
    }
    out
}

/// Hash of one full block chained to `parent`. `extra` is the output of [`encode_extra`]
/// (empty for a block without extra keys).
pub fn block_hash(parent: BlockHash, tokens: &[u32], extra: &[u8]) -> BlockHash {
    if tokens.len() <= ONE_SHOT_TOKENS && extra.is_empty() {
        let mut buf = [0u8; 4 + 4 * ONE_SHOT_TOKENS];
        buf[..4].copy_from_slice(&len32(tokens.len()).to_le_bytes());
        for (chunk, t) in buf[4..].chunks_exact_mut(4).zip(tokens) {
            chunk.copy_from_slice(&t.to_le_bytes());
        }
        return xxh3_64_with_seed(&buf[..4 + 4 * tokens.len()], parent);
    }
    let mut h = Xxh3::with_seed(parent);
    h.update(&len32(tokens.len()).to_le_bytes());
    let mut buf = [0u8; 4 * 64];
    for group in tokens.chunks(64) {
        for (chunk, t) in buf.chunks_exact_mut(4).zip(group) {
            chunk.copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..4 * group.len()]);
    }
    h.update(extra);
    h.digest()
}

/// Hashes of every full block of `tokens`, chained from `root`. `first_block_extra` carries
/// the encoded extra keys of block 1 (the cache salt); later blocks have none.
///
/// # Panics
/// Never; a `block_size` of 0 yields no hashes.
pub fn chain(
    root: BlockHash,
    tokens: &[u32],
    block_size: usize,
    first_block_extra: &[u8],
) -> Vec<BlockHash> {
    let mut out = Vec::new();
    chain_into(root, tokens, block_size, first_block_extra, &mut out);
    out
}

/// Like [`chain`], writing into a caller-owned buffer (cleared first) to avoid allocating.
pub fn chain_into(
    root: BlockHash,
    tokens: &[u32],
    block_size: usize,
    first_block_extra: &[u8],
    out: &mut Vec<BlockHash>,
) {
    out.clear();
    if block_size == 0 {
        return;
    }
    out.reserve(tokens.len() / block_size);
    let mut parent = root;
    for (i, block) in tokens.chunks_exact(block_size).enumerate() {
        let extra = if i == 0 { first_block_extra } else { &[] };
        parent = block_hash(parent, block, extra);
        out.push(parent);
    }
}

fn push_tagged(out: &mut Vec<u8>, tag: u8, s: &str) {
    out.push(tag);
    out.extend_from_slice(&len32(s.len()).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Lengths are encoded as u32; longer inputs saturate (they cannot occur for token blocks or
/// names, and saturating keeps the function total).
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shot_and_streaming_paths_agree() {
        let tokens: Vec<u32> = (0..300).collect();
        // 300 tokens take the streaming path; recompute by hand with the streaming hasher.
        let mut h = Xxh3::with_seed(7);
        h.update(&300u32.to_le_bytes());
        for t in &tokens {
            h.update(&t.to_le_bytes());
        }
        assert_eq!(block_hash(7, &tokens, &[]), h.digest());
        // 16 tokens take the one-shot path; the streaming hasher must give the same.
        let mut h = Xxh3::with_seed(7);
        h.update(&16u32.to_le_bytes());
        for t in &tokens[..16] {
            h.update(&t.to_le_bytes());
        }
        assert_eq!(block_hash(7, &tokens[..16], &[]), h.digest());
    }

    #[test]
    fn chain_skips_partial_block_and_zero_block_size() {
        let tokens: Vec<u32> = (0..40).collect();
        let root = root_hash("m", None);
        let hashes = chain(root, &tokens, 16, &[]);
        assert_eq!(hashes.len(), 2);
        assert_eq!(hashes[0], block_hash(root, &tokens[..16], &[]));
        assert_eq!(hashes[1], block_hash(hashes[0], &tokens[16..32], &[]));
        assert!(chain(root, &tokens, 0, &[]).is_empty());
    }

    #[test]
    fn seeds_separate_models_loras_and_salts() {
        let tokens: Vec<u32> = (1..=16).collect();
        let a = chain(root_hash("m", None), &tokens, 16, &[]);
        let b = chain(root_hash("m", Some("adapter")), &tokens, 16, &[]);
        let c = chain(root_hash("n", None), &tokens, 16, &[]);
        let salt = encode_extra(&[ExtraKey::CacheSalt("tenant-a".into())]);
        let d = chain(root_hash("m", None), &tokens, 16, &salt);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
        // "m" + lora "" must differ from model "" + lora "m" (length prefixes).
        assert_ne!(root_hash("m", None), root_hash("", Some("m")));
    }
}
