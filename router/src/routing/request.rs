//! A request's kvroute block hashes, computed once per distinct block size among the
//! candidates (workers of one model normally share a block size; a mixed pool costs one
//! extra chain per size).

use kvroute_hash::{BlockHash, ExtraKey, chain_into, encode_extra, root_hash};

/// The token ids and hash seeds of one request, with a cache of its hash chains.
#[derive(Clone, Debug)]
pub struct PromptHashes<'a> {
    tokens: &'a [u32],
    root: BlockHash,
    first_block_extra: Vec<u8>,
    chains: Vec<(usize, Vec<BlockHash>)>,
}

impl<'a> PromptHashes<'a> {
    /// `model` is the served model name the workers report, `lora` the adapter name,
    /// `cache_salt` the request's `cache_salt` (hash/SPEC.md).
    pub fn new(
        tokens: &'a [u32],
        model: &str,
        lora: Option<&str>,
        cache_salt: Option<&str>,
    ) -> Self {
        let first_block_extra = match cache_salt {
            Some(s) => encode_extra(&[ExtraKey::CacheSalt(s.to_owned())]),
            None => Vec::new(),
        };
        Self {
            tokens,
            root: root_hash(model, lora),
            first_block_extra,
            chains: Vec::new(),
        }
    }

    /// The token ids.
    pub fn tokens(&self) -> &'a [u32] {
        self.tokens
    }

    /// The chain for `block_size` (computed on first use; empty for block size 0).
    pub fn chain(&mut self, block_size: usize) -> &[BlockHash] {
        let pos = match self.chains.iter().position(|(bs, _)| *bs == block_size) {
            Some(p) => p,
            None => {
                let mut out = Vec::new();
                chain_into(
                    self.root,
                    self.tokens,
                    block_size,
                    &self.first_block_extra,
                    &mut out,
                );
                self.chains.push((block_size, out));
                self.chains.len() - 1
            }
        };
        &self.chains[pos].1
    }

    /// Every chain computed so far, by block size.
    pub fn chains(&self) -> impl Iterator<Item = (usize, &[BlockHash])> {
        self.chains.iter().map(|(bs, c)| (*bs, c.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_match_the_shared_hash_and_are_cached_per_size() {
        let tokens: Vec<u32> = (1..=64).collect();
        let mut p = PromptHashes::new(&tokens, "m", None, Some("salt"));
        let salt = encode_extra(&[ExtraKey::CacheSalt("salt".into())]);
        let want16 = kvroute_hash::chain(root_hash("m", None), &tokens, 16, &salt);
        assert_eq!(p.chain(16), want16.as_slice());
        assert_eq!(p.chain(32).len(), 2);
        assert_eq!(p.chain(16).len(), 4);
        assert_eq!(p.chains().count(), 2);
        assert!(p.chain(0).is_empty());
        let unsalted = PromptHashes::new(&tokens, "m", None, None)
            .chain(16)
            .to_vec();
        assert_ne!(unsalted, want16);
    }
}
