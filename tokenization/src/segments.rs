//! Encoding by segments, with a cache.
//!
//! The HuggingFace tokenizer first cuts the text at added tokens (`<|im_start|>`, ...), then
//! normalises, pre-tokenises and runs BPE on each piece separately. So when every added token
//! is matched verbatim (not normalised, no lstrip/rstrip/single-word rules), the ids of a text
//! are the ids of its pieces, concatenated. A chat prompt's pieces are its messages, and the
//! router sees the same system prompt and conversation history again and again: caching a
//! piece's ids turns re-tokenising a long multi-turn chat into hashing it.
//!
//! The cache is bounded (two generations, bytes of text + ids counted) and shared by all
//! threads; a lookup holds the lock only to clone an `Arc`.
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
use xxhash_rust::xxh3::Xxh3DefaultBuilder;

/// Pieces shorter than this are encoded directly: caching them costs more than it saves.
const MIN_CACHED_BYTES: usize = 256;

type Map = HashMap<Box<str>, Arc<[u32]>, Xxh3DefaultBuilder>;

/// Hit and miss counts of the segment cache (for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentCacheStats {
    /// Pieces found in the cache.
    pub hits: u64,
    /// Pieces encoded and inserted.
    pub misses: u64,
    /// Bytes currently held (text + ids), both generations.
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
    words: WordCache,
    cache: Mutex<Generations>,
    capacity_bytes: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

fn entry_bytes(piece: &str, ids: &[u32]) -> usize {
    piece.len() + ids.len() * 4 + 64
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
        SegmentEncoder {
            matcher,
            fast,
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
        if let Some(ids) = self.lookup(piece) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            out.extend_from_slice(&ids);
            return Ok(());
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let start = out.len();
        self.encode_direct(hf, piece, out)?;
        if let Some(ids) = out.get(start..) {
            self.insert(piece, ids.into());
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

    fn lookup(&self, piece: &str) -> Option<Arc<[u32]>> {
        let mut g = self.cache.lock();
        if let Some(ids) = g.current.get(piece) {
            return Some(ids.clone());
        }
        let (key, ids) = g.previous.remove_entry(piece)?;
        let bytes = entry_bytes(&key, &ids);
        g.previous_bytes = g.previous_bytes.saturating_sub(bytes);
        g.current_bytes += bytes;
        g.current.insert(key, ids.clone());
        Some(ids)
    }

    fn insert(&self, piece: &str, ids: Arc<[u32]>) {
        let bytes = entry_bytes(piece, &ids);
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
        if g.current.insert(piece.into(), ids).is_none() {
            g.current_bytes += bytes;
        }
    }
}
