//! The hasher of the routing core's maps keyed by block hash (the pending overlay and its
//! released-block order): one multiply-fold of the key XOR a per-process seed, the mixing
//! the KV index's table uses. Block hashes are already hashes of the prompt's tokens, so
//! SipHash, the standard maps' default, only added cost: it was most of a decision's time
//! on a busy pool where every worker had prompts of the same prefix pending (the decision
//! benchmark's `busy` rows; bench/README.md, "The pending overlay's hasher"). The seed is
//! drawn once per process, so crafted prompts cannot aim at a map's buckets.

use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use super::index::fold;

/// A seed drawn once per process (from the standard library's random hasher keys).
pub(super) fn process_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0x6b76_u64))
}

/// Builds [`BlockKeyHasher`]s with the process seed.
#[derive(Clone, Copy, Debug)]
pub(super) struct BlockKeys(u64);

impl Default for BlockKeys {
    fn default() -> Self {
        Self(process_seed())
    }
}

impl BuildHasher for BlockKeys {
    type Hasher = BlockKeyHasher;
    fn build_hasher(&self) -> BlockKeyHasher {
        BlockKeyHasher {
            seed: self.0,
            state: 0,
        }
    }
}

/// See the module docs. A `u64` key (a block hash) costs one multiply.
#[derive(Clone, Copy, Debug)]
pub(super) struct BlockKeyHasher {
    seed: u64,
    state: u64,
}

impl Hasher for BlockKeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.state = fold(self.state ^ v ^ self.seed);
    }

    fn finish(&self) -> u64 {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_hashes_alike_within_a_process_and_apart_from_its_neighbours() {
        let keys = BlockKeys::default();
        assert_eq!(keys.hash_one(42_u64), BlockKeys::default().hash_one(42_u64));
        // Neighbouring keys land in different low bits (the buckets of a small map).
        let low: std::collections::HashSet<u64> =
            (0..64_u64).map(|k| keys.hash_one(k) & 0xff).collect();
        assert!(low.len() > 40, "{}", low.len());
        // Another seed, other positions.
        assert_ne!(BlockKeys(1).hash_one(42_u64), BlockKeys(2).hash_one(42_u64));
        // Byte input (not used by block keys) still hashes every byte.
        let mut a = keys.build_hasher();
        a.write(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let mut b = keys.build_hasher();
        b.write(&[1, 2, 3, 4, 5, 6, 7, 8, 10]);
        assert_ne!(a.finish(), b.finish());
    }
}
