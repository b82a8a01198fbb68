//! Encoding by segments, with a cache.
//!
//! The HuggingFace tokenizer first cuts the text at added tokens (`<|im_start|>`, ...), then
//! normalises, pre-tokenises and runs BPE on each piece separately. So when every added token
//! is matched verbatim (not normalised, no lstrip/rstrip/single-word rules), the ids of a text
//! are the ids of its pieces, concatenated. A chat prompt's pieces are its messages, and the
//! router sees the same system prompt and conversation history again and again: caching a
//! piece's ids turns re-tokenising a long multi-turn chat into hashing it.
//!
//! The cache is bounded (two generations, bytes of keys + ids counted) and shared by all
//! threads; a lookup holds the lock only to clone `Arc`s. Entries are keyed by the 128-bit
//! XXH3 of the text they stand for, not the text itself (a collision, about 2^-65 likely
//! with 2^32 entries, would only send one request's cache lookup astray).
//!
//! With our byte-level BPE, a long piece is cached in chunks of about [`CHUNK_BYTES`], cut
//! where the pre-tokenizer cuts anyway ([`cut_points`]), each keyed by the XXH3 of the piece
//! *up to its end*. A prompt that repeats a long text and then goes on differently (a shared
//! document or system prompt followed by a new question, sent as one completions prompt or
//! one message) finds the chunks it shares and encodes only the rest: the cost of a new
//! suffix, not of the whole prompt.
//!
//! A piece that misses (or is short) is encoded by our byte-level BPE (`bpe.rs`) when the
//! tokenizer has its shape, else by the `tokenizers` pipeline.

use crate::TokenizeError;
use crate::bpe::{FastBpe, WordCache};
use crate::pipeline;
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use xxhash_rust::xxh3::{Xxh3, Xxh3DefaultBuilder};

/// Pieces shorter than this are encoded directly: caching them costs more than it saves.
const MIN_CACHED_BYTES: usize = 256;

/// A long piece is cached in chunks of at least this many bytes (byte-level BPE only).
pub(crate) const CHUNK_BYTES: usize = 1024;

/// How far past a chunk's nominal end [`cut_points`] looks for a cut before giving up on it.
const CUT_SEARCH_BYTES: usize = 256;

type Map = HashMap<u128, Arc<[u32]>, Xxh3DefaultBuilder>;

/// Hit and miss counts of the segment cache (for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentCacheStats {
    /// Pieces (or chunks of long pieces) found in the cache.
    pub hits: u64,
    /// Pieces (or chunks) encoded and inserted.
    pub misses: u64,
    /// Bytes currently held (keys + ids + a fixed overhead per entry), both generations.
    pub bytes: usize,
}

#[derive(Default)]
struct Generations {
    current: Map,
    previous: Map,
    current_bytes: usize,
    previous_bytes: usize,
}

pub(crate) struct SegmentEncoder {
    /// Added tokens, matched like the tokenizer does (leftmost-longest); `None` when some added
    /// token has matching rules that make piecewise encoding unsafe.
    matcher: Option<(AhoCorasick, Vec<u32>)>,
    /// Our byte-level BPE, when the tokenizer has the shape it implements; else pieces go
    /// through the `tokenizers` pipeline.
    fast: Option<Arc<FastBpe>>,
    /// Long pieces are cached in chunks ([`cut_points`] is exact for our byte-level BPE).
    chunked: bool,
    words: WordCache,
    cache: Mutex<Generations>,
    capacity_bytes: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

fn entry_bytes(ids: &[u32]) -> usize {
    16 + ids.len() * 4 + 64
}

/// Where a long piece may be cut without changing its ids: before a space that has an ASCII
/// lowercase letter on each side, the first such space at or after every [`CHUNK_BYTES`]
/// from the previous cut (none where [`CUT_SEARCH_BYTES`] hold none; then the next window).
///
/// Exact for every split our byte-level BPE implements (Qwen2, Llama 3, o200k, Mistral Nemo,
/// DeepSeek-V3): the word holding the letter before the space ends there (a letter run, or a
/// contraction, stops at a space), the next word starts with the space (`[^\r\n\p{L}\p{N}]?
/// \p{L}+` and its cased and DeepSeek forms), and no match or lookahead reads across a letter
/// (the `\s+(?!\S)` lookahead sees only whitespace runs, which end before the letter). NFC
/// leaves ASCII as it is and composes nothing onto a space, so normalising the parts apart is
/// normalising the whole. The cuts depend only on the text up to each cut plus one window, so
/// two texts that share a long beginning share its cuts. `tests/fast_path.rs` checks chunked
/// encoding against the `tokenizers` pipeline for every family.
pub(crate) fn cut_points(text: &str) -> Vec<usize> {
    let b = text.as_bytes();
    let mut cuts = Vec::new();
    let mut from = CHUNK_BYTES;
    while from + 1 < b.len() {
        let end = (from + CUT_SEARCH_BYTES).min(b.len() - 1);
        let cut = (from..end).find(|&p| match b.get(p - 1..=p + 1) {
            Some(&[before, b' ', after]) => {
                before.is_ascii_lowercase() && after.is_ascii_lowercase()
            }
            _ => false,
        });
        match cut {
            Some(p) => {
                cuts.push(p);
                from = p + CHUNK_BYTES;
            }
            None => from = end + CHUNK_BYTES,
        }
    }
    cuts
}

impl SegmentEncoder {
    pub(crate) fn new(
        hf: &tokenizers::Tokenizer,
        capacity_bytes: usize,
        fast: Option<Arc<FastBpe>>,
    ) -> Self {
        let decoder = hf.get_added_tokens_decoder();
        let mut tokens: Vec<(u32, String)> = Vec::with_capacity(decoder.len());
        let mut safe = true;
        // A `normalized` added token is matched in the normalised text: the same text when the
        // normaliser changes nothing (none, or an empty sequence as in DeepSeek-V3).
        let identity_normalizer = hf.get_normalizer().is_none_or(|n| {
            serde_json::to_value(n).ok()
                == Some(serde_json::json!({"type": "Sequence", "normalizers": []}))
        });
        for (id, token) in decoder.iter() {
            if (token.normalized && !identity_normalizer)
                || token.lstrip
                || token.rstrip
                || token.single_word
            {
                safe = false;
            }
            tokens.push((*id, token.content.clone()));
        }
        tokens.sort();
        let matcher = if safe {
            AhoCorasickBuilder::new()
                .match_kind(MatchKind::LeftmostLongest)
                .build(tokens.iter().map(|(_, c)| c.as_str()))
                .ok()
                .map(|ac| (ac, tokens.iter().map(|(id, _)| *id).collect()))
        } else {
            None
        };
        let chunked = fast.as_deref().is_some_and(FastBpe::is_byte_level);
        SegmentEncoder {
            matcher,
            fast,
            chunked,
            words: WordCache::default(),
            cache: Mutex::new(Generations::default()),
            capacity_bytes,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Whether piecewise encoding is exact for this tokenizer and worth doing (a segment
    /// cache or our fast path).
    pub(crate) fn enabled(&self) -> bool {
        self.matcher.is_some() && (self.capacity_bytes > 0 || self.fast.is_some())
    }

    /// Whether pieces go through our byte-level BPE rather than the `tokenizers` pipeline.
    pub(crate) fn fast_path(&self) -> bool {
        self.matcher.is_some() && self.fast.is_some()
    }

    pub(crate) fn stats(&self) -> SegmentCacheStats {
        let g = self.cache.lock();
        SegmentCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes: g.current_bytes + g.previous_bytes,
        }
    }

    /// Encodes `text` piece by piece (callers check [`Self::enabled`] and that the
    /// post-processor adds no ids).
    pub(crate) fn encode(
        &self,
        hf: &tokenizers::Tokenizer,
        text: &str,
    ) -> Result<Vec<u32>, TokenizeError> {
        let Some((matcher, ids)) = &self.matcher else {
            return pipeline::encode(hf, text, false);
        };
        let mut out = Vec::with_capacity(text.len() / 3);
        let mut last = 0;
        for m in matcher.find_iter(text) {
            self.encode_piece(hf, &text[last..m.start()], &mut out)?;
            if let Some(id) = ids.get(m.pattern().as_usize()) {
                out.push(*id);
            }
            last = m.end();
        }
        self.encode_piece(hf, &text[last..], &mut out)?;
        Ok(out)
    }

    fn encode_piece(
        &self,
        hf: &tokenizers::Tokenizer,
        piece: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        if piece.is_empty() {
            return Ok(());
        }
        if piece.len() < MIN_CACHED_BYTES || self.capacity_bytes == 0 {
            return self.encode_direct(hf, piece, out);
        }
        // The piece's chunks: their ends and the XXH3 of the piece up to each end (one
        // chunk, the whole piece, unless chunked).
        let mut ends = if self.chunked {
            cut_points(piece)
        } else {
            Vec::new()
        };
        ends.push(piece.len());
        let mut hasher = Xxh3::new();
        let mut start = 0;
        let keys: Vec<u128> = ends
            .iter()
            .map(|&end| {
                hasher.update(piece.as_bytes().get(start..end).unwrap_or_default());
                start = end;
                hasher.digest128()
            })
            .collect();
        // The chunks seen before, from the start, then the rest encoded chunk by chunk.
        let known = self.lookup(&keys, out);
        self.hits.fetch_add(known as u64, Ordering::Relaxed);
        let mut start = known
            .checked_sub(1)
            .and_then(|i| ends.get(i))
            .copied()
            .unwrap_or(0);
        for (&end, &key) in ends.iter().zip(&keys).skip(known) {
            self.misses.fetch_add(1, Ordering::Relaxed);
            let from = out.len();
            self.encode_direct(hf, piece.get(start..end).unwrap_or_default(), out)?;
            if let Some(ids) = out.get(from..) {
                self.insert(key, ids.into());
            }
            start = end;
        }
        Ok(())
    }

    /// Encodes a piece without the segment cache.
    fn encode_direct(
        &self,
        hf: &tokenizers::Tokenizer,
        piece: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        match &self.fast {
            Some(fast) => fast.encode_piece(hf, &self.words, piece, out),
            None => {
                out.extend(pipeline::encode(hf, piece, false)?);
                Ok(())
            }
        }
    }

    /// Appends the ids of the leading chunks found under `keys`, in order, up to the first
    /// one missing; returns how many were found.
    fn lookup(&self, keys: &[u128], out: &mut Vec<u32>) -> usize {
        let mut g = self.cache.lock();
        let mut found = 0;
        for key in keys {
            let ids = match g.current.get(key) {
                Some(ids) => ids.clone(),
                None => {
                    let Some(ids) = g.previous.remove(key) else {
                        break;
                    };
                    let bytes = entry_bytes(&ids);
                    g.previous_bytes = g.previous_bytes.saturating_sub(bytes);
                    g.current_bytes += bytes;
                    g.current.insert(*key, ids.clone());
                    ids
                }
            };
            out.extend_from_slice(&ids);
            found += 1;
        }
        found
    }

    fn insert(&self, key: u128, ids: Arc<[u32]>) {
        let bytes = entry_bytes(&ids);
        let half = self.capacity_bytes / 2;
        if bytes > half {
            return;
        }
        let mut g = self.cache.lock();
        if g.current_bytes + bytes > half {
            let current = std::mem::take(&mut g.current);
            g.previous = current;
            g.previous_bytes = g.current_bytes;
            g.current_bytes = 0;
        }
        if g.current.insert(key, ids).is_none() {
            g.current_bytes += bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text() -> String {
        let words = [
            "route", "prefix", "cache", "Block", "42", "worker's", "\n\n", "x",
        ];
        (0..3000)
            .map(|i| words[(i * 7 + i / 5) % words.len()])
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn cuts_fall_before_a_space_between_lowercase_letters_at_least_a_chunk_apart() {
        let t = text();
        let cuts = cut_points(&t);
        assert!(cuts.len() > 5, "{} cuts in {} bytes", cuts.len(), t.len());
        let b = t.as_bytes();
        let mut last = 0;
        for &p in &cuts {
            assert!(p >= last + CHUNK_BYTES, "cut {p} after {last}");
            assert_eq!(b[p], b' ');
            assert!(b[p - 1].is_ascii_lowercase() && b[p + 1].is_ascii_lowercase());
            last = p;
        }
        assert!(last + 1 < t.len());
    }

    #[test]
    fn texts_sharing_a_beginning_share_its_cuts() {
        let t = text();
        let whole = cut_points(&t);
        for n in [1500, 4000, 4001, 9999] {
            let mut other = t[..n].to_string();
            other.push_str(
                " something else entirely, and longer than a chunk "
                    .repeat(40)
                    .as_str(),
            );
            let cuts = cut_points(&other);
            // Every cut whose window lies in the shared part is the same.
            let shared: Vec<usize> = whole
                .iter()
                .copied()
                .filter(|&p| p + CUT_SEARCH_BYTES + 1 < n)
                .collect();
            assert_eq!(&cuts[..shared.len()], &shared[..], "shared {n} bytes");
        }
    }

    #[test]
    fn short_text_and_text_without_lowercase_spaces_have_no_cuts() {
        assert!(cut_points("short text").is_empty());
        assert!(cut_points(&"ABC DEF 123 ".repeat(500)).is_empty());
        assert!(cut_points("").is_empty());
    }
}
