//! Our own encoder for byte-level BPE tokenizers of the Qwen2 and Llama 3 shapes: the same
//! ids as the `tokenizers` crate, several times faster on text it has not seen.
//!
//! ```text
//!  piece (no added tokens) ─NFC if needed─► pretokenize::SplitPattern::split ─► word
//!      word ─word cache hit──────────────────────────────────────────► ids
//!      word ─ignore_merges and the whole word is in the vocab─────────► id (cached)
//!      word ─miss: bytes → byte-level symbols → merges by (rank, pos)─► ids (cached)
//! ```
//!
//! The `tokenizers` pipeline builds offsets, alignments and strings for every piece and word,
//! which costs far more than the regex or the merges (about 20 ms for an 8k-token prompt);
//! we keep only what ids depend on. [`ByteBpe::from_json`] accepts a `tokenizer.json` only
//! when its normaliser, pre-tokeniser and model are exactly the shape implemented here
//! (NFC or none; Split on the Qwen2 or Llama 3 regex, Isolated, then ByteLevel without regex
//! or prefix space; BPE without dropout, unknown token, affixes or byte fallback, with or
//! without ignore_merges; no truncation or padding); any other tokenizer keeps the
//! `tokenizers` path.
//!
//! The merge loop mirrors `tokenizers`' `Word::merge_all`: a min-heap of (rank, position)
//! with stale entries skipped when the pair at that position no longer yields the same id.
//!
//! [`SpBpe`] is the same merge loop for SentencePiece-style BPE (Gemma 3): spaces become `▁`,
//! nothing splits the piece, symbols are characters with byte fallback (`<0xNN>`). The piece is
//! still merged word by word (cut before a `▁` that follows another character), with a word
//! cache: no vocab entry spans such a cut, so no merge can cross it, except after the few
//! characters that some entry has right before a `▁` (`>` in Gemma's `>▁</`), where we do not
//! cut.
//! [`FastBpe`] is whichever of the two a `tokenizer.json` has the shape of.

use crate::TokenizeError;
use crate::pipeline;
use crate::pretokenize::SplitPattern;
use crate::pretokenize::deepseek::DEEPSEEK_V3_PATTERNS;
use parking_lot::RwLock;
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Words longer than this are encoded every time (like `tokenizers`' cache limit).
const MAX_CACHED_WORD_BYTES: usize = 256;
/// Entries in the word cache before it is cleared and refilled.
const WORD_CACHE_ENTRIES: usize = 1 << 17;

/// Words up to this many symbols are merged by scanning for the best pair (no heap).
const MAX_SCANNED_WORD_BYTES: usize = 48;

/// A hasher for merge keys (one `u64`) and short words (one-shot xxh3): no per-call state to
/// set up, unlike a streaming hasher.
#[derive(Default)]
struct FastHasher(u64);

const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0 = (self.0 ^ xxhash_rust::xxh3::xxh3_64(bytes)).wrapping_mul(MIX);
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        let x = (self.0 ^ v ^ (v >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        self.0 = x ^ (x >> 32);
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;
type MergeMap = FastMap<u64, (u32, u32)>;
type WordMap = FastMap<Box<[u8]>, WordIds>;

/// A cached word's ids, inline when short (most words are one to three tokens).
enum WordIds {
    Inline { len: u8, ids: [u32; 3] },
    Heap(Box<[u32]>),
}

impl WordIds {
    fn new(ids: &[u32]) -> WordIds {
        match ids {
            [a] => WordIds::Inline {
                len: 1,
                ids: [*a, 0, 0],
            },
            [a, b] => WordIds::Inline {
                len: 2,
                ids: [*a, *b, 0],
            },
            [a, b, c] => WordIds::Inline {
                len: 3,
                ids: [*a, *b, *c],
            },
            _ => WordIds::Heap(ids.into()),
        }
    }

    fn as_slice(&self) -> &[u32] {
        match self {
            WordIds::Inline { len, ids } => ids.get(..usize::from(*len)).unwrap_or_default(),
            WordIds::Heap(ids) => ids,
        }
    }
}

#[inline]
fn pair_key(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

/// How the normaliser treats a piece before pre-tokenising.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Normalizer {
    None,
    Nfc,
}

/// The byte-level BPE fast path of one tokenizer.
pub(crate) struct ByteBpe {
    normalizer: Normalizer,
    split: SplitPattern,
    /// With `ignore_merges`, a word that is itself in the vocab is that one token (the vocab
    /// keyed by the bytes each entry stands for); `None` without it.
    whole_words: Option<FastMap<Box<[u8]>, u32>>,
    /// Id of the one-byte symbol for each byte.
    byte_ids: [u32; 256],
    merges: MergeMap,
    /// No two merges make the same id, so the best pair can be found by a scan (the heap's
    /// stale-entry rule then never changes the order).
    unique_merge_ids: bool,
}

/// Ids of words seen before, shared by all threads (a lookup pass holds the read lock for a
/// whole piece; misses are inserted afterwards under one write lock).
#[derive(Default)]
pub(crate) struct WordCache {
    map: RwLock<WordMap>,
}

impl std::fmt::Debug for ByteBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteBpe")
            .field("normalizer", &self.normalizer)
            .field("merges", &self.merges.len())
            .finish_non_exhaustive()
    }
}

/// SentencePiece's visible space, `▁`.
const SP_SPACE: char = '\u{2581}';

/// Our encoder for a tokenizer of one of the shapes implemented here.
pub(crate) enum FastBpe {
    /// Byte-level BPE behind a hand-written split (Qwen2, Llama 3, gpt-oss, Mistral Nemo).
    Byte(ByteBpe),
    /// SentencePiece-style BPE with byte fallback (Gemma 3).
    Sp(SpBpe),
}

impl FastBpe {
    /// The fast path for this `tokenizer.json`, or why there is none.
    pub(crate) fn from_json(tokenizer_json: &[u8]) -> Result<FastBpe, String> {
        match ByteBpe::from_json(tokenizer_json) {
            Ok(b) => Ok(FastBpe::Byte(b)),
            Err(byte_level) => SpBpe::from_json(tokenizer_json)
                .map(FastBpe::Sp)
                .map_err(|sp| format!("{byte_level}; {sp}")),
        }
    }

    /// Whether this is the byte-level BPE behind one of our split patterns, for which
    /// [`crate::segments::cut_points`] is exact (not the SentencePiece style, whose words
    /// carry the space before them differently).
    pub(crate) fn is_byte_level(&self) -> bool {
        matches!(self, FastBpe::Byte(_))
    }

    /// Appends the ids of `piece` (text that contains no added token) to `out`.
    pub(crate) fn encode_piece(
        &self,
        hf: &tokenizers::Tokenizer,
        words: &WordCache,
        piece: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        match self {
            FastBpe::Byte(b) => b.encode_piece(hf, words, piece, out),
            FastBpe::Sp(sp) => {
                sp.encode_piece(words, piece, out);
                Ok(())
            }
        }
    }
}

impl std::fmt::Debug for FastBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FastBpe::Byte(b) => b.fmt(f),
            FastBpe::Sp(sp) => f
                .debug_struct("SpBpe")
                .field("merges", &sp.merges.len())
                .finish_non_exhaustive(),
        }
    }
}

/// SentencePiece-style BPE: `Replace(" ", "▁")` normaliser, a `Split(" ")` pre-tokeniser
/// that then never splits, BPE over characters with byte fallback, no unknown token needed.
pub(crate) struct SpBpe {
    /// Ids of single-character vocab entries.
    chars: FastMap<char, u32>,
    /// Id of `<0xNN>` for each byte.
    byte_ids: [u32; 256],
    merges: MergeMap,
    /// Characters that some vocab entry has right before a `▁`: no word cut after them.
    glued_before_space: Vec<char>,
}

impl SpBpe {
    /// The SentencePiece fast path for this `tokenizer.json`, or why there is none.
    pub(crate) fn from_json(tokenizer_json: &[u8]) -> Result<SpBpe, String> {
        let json: TokenizerJson<'_> =
            serde_json::from_slice(tokenizer_json).map_err(|e| format!("tokenizer.json: {e}"))?;
        let replace: Value = serde_json::json!({
            "type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"
        });
        if json.normalizer != replace {
            return Err("normalizer is not Replace(' ', '\u{2581}')".into());
        }
        let split: Value = serde_json::json!({
            "type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
            "invert": false
        });
        if json.pre_tokenizer != split {
            return Err("pre-tokenizer is not Split(' ')".into());
        }
        if !json.truncation.is_null() || !json.padding.is_null() {
            return Err("truncation or padding configured".into());
        }
        let m = json.model;
        let empty = |s: &Option<String>| s.as_deref().is_none_or(str::is_empty);
        if m.kind.as_deref().is_some_and(|k| k != "BPE")
            || m.dropout.is_some()
            || !empty(&m.continuing_subword_prefix)
            || !empty(&m.end_of_word_suffix)
            || !m.byte_fallback
            || m.ignore_merges
        {
            return Err("BPE options the SentencePiece fast path does not implement".into());
        }
        let mut byte_ids = [0u32; 256];
        for (b, slot) in (0u8..=255).zip(byte_ids.iter_mut()) {
            *slot = *m
                .vocab
                .get(format!("<0x{b:02X}>").as_str())
                .ok_or_else(|| format!("byte token <0x{b:02X}> missing from the vocab"))?;
        }
        let mut chars = FastMap::default();
        let mut glued_before_space: Vec<char> = Vec::new();
        for (token, &id) in &m.vocab {
            let mut it = token.chars();
            if let (Some(c), None) = (it.next(), it.next()) {
                chars.insert(c, id);
            }
            let mut prev: Option<char> = None;
            for c in token.chars() {
                if c == SP_SPACE
                    && let Some(p) = prev.filter(|&p| p != SP_SPACE)
                    && !glued_before_space.contains(&p)
                {
                    glued_before_space.push(p);
                }
                prev = Some(c);
            }
        }
        Ok(SpBpe {
            chars,
            byte_ids,
            merges: merge_map(&m)?,
            glued_before_space,
        })
    }

    /// Appends the ids of `piece` (no added tokens): characters (or their bytes when not in
    /// the vocab) merged by `merge_all`, word by word (see the module docs for why the cuts
    /// change nothing), through the word cache.
    fn encode_piece(&self, words: &WordCache, piece: &str, out: &mut Vec<u32>) {
        let text = piece.replace(' ', "\u{2581}");
        let mut misses: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> = Vec::new();
        let mut scratch = Scratch::default();
        let mut ids: Vec<u32> = Vec::new();
        {
            let cache = words.map.read();
            let mut start = 0;
            let mut prev: Option<char> = None;
            let mut word = |range: std::ops::Range<usize>, out: &mut Vec<u32>| {
                let Some(w) = text.get(range.clone()) else {
                    return;
                };
                if let Some(hit) = cache.get(w.as_bytes()) {
                    out.extend_from_slice(hit.as_slice());
                    return;
                }
                ids.clear();
                for c in w.chars() {
                    match self.chars.get(&c) {
                        Some(&id) => ids.push(id),
                        None => {
                            let mut buf = [0u8; 4];
                            ids.extend(
                                c.encode_utf8(&mut buf)
                                    .bytes()
                                    .map(|b| self.byte_ids[usize::from(b)]),
                            );
                        }
                    }
                }
                let at = out.len();
                merge_ids_heap(&self.merges, ids.drain(..), &mut scratch, out);
                if w.len() <= MAX_CACHED_WORD_BYTES {
                    misses.push((range, at..out.len()));
                }
            };
            for (i, c) in text.char_indices() {
                if c == SP_SPACE
                    && i > start
                    && prev.is_some_and(|p| p != SP_SPACE && !self.glued_before_space.contains(&p))
                {
                    word(start..i, out);
                    start = i;
                }
                prev = Some(c);
            }
            word(start..text.len(), out);
        }
        if misses.is_empty() {
            return;
        }
        let mut cache = words.map.write();
        if cache.len() + misses.len() > WORD_CACHE_ENTRIES {
            cache.clear();
        }
        for (word, range) in misses {
            if let (Some(w), Some(ids)) = (text.get(word), out.get(range)) {
                cache.insert(w.as_bytes().into(), WordIds::new(ids));
            }
        }
    }
}

#[derive(Deserialize)]
struct TokenizerJson<'a> {
    #[serde(default)]
    normalizer: Value,
    #[serde(default)]
    pre_tokenizer: Value,
    #[serde(default)]
    truncation: Value,
    #[serde(default)]
    padding: Value,
    #[serde(borrow)]
    model: ModelJson<'a>,
}

/// Strings borrow from the file where they have no escapes (most of a 151k-entry vocab).
#[derive(Deserialize)]
struct ModelJson<'a> {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    dropout: Option<f64>,
    #[serde(default)]
    unk_token: Option<String>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    #[serde(borrow)]
    vocab: FastMap<Cow<'a, str>, u32>,
    #[serde(borrow)]
    merges: Vec<MergeJson<'a>>,
}

/// A merge as `["a", "b"]` or (older files) `"a b"`.
enum MergeJson<'a> {
    Pair(Cow<'a, str>, Cow<'a, str>),
    Line(Cow<'a, str>),
}

/// By hand rather than `#[serde(untagged)]`, which buffers every one of 151k merges.
impl<'de: 'a, 'a> Deserialize<'de> for MergeJson<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = MergeJson<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a merge: [left, right] or \"left right\"")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(MergeJson::Line(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(MergeJson::Line(Cow::Owned(v.to_owned())))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let a: Option<Cow<'a, str>> = seq.next_element::<BorrowedStr<'a>>()?.map(|s| s.0);
                let b: Option<Cow<'a, str>> = seq.next_element::<BorrowedStr<'a>>()?.map(|s| s.0);
                match (a, b, seq.next_element::<serde::de::IgnoredAny>()?) {
                    (Some(a), Some(b), None) => Ok(MergeJson::Pair(a, b)),
                    _ => Err(serde::de::Error::custom(
                        "a merge pair needs exactly two strings",
                    )),
                }
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A string borrowed from the file when it has no escapes.
#[derive(Deserialize)]
struct BorrowedStr<'a>(#[serde(borrow)] Cow<'a, str>);

/// GPT-2's byte-to-character table: printable Latin-1 bytes map to themselves, the others to
/// U+0100 onwards, in byte order.
fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in (0u32..).zip(table.iter_mut()) {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let code = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// The split of a `Sequence[Split(regex, Isolated), ByteLevel(no regex, no prefix space)]`
/// pre-tokenizer whose regex we implement.
fn split_pattern(v: &Value) -> Option<SplitPattern> {
    let steps = v
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| *t == "Sequence")
        .and_then(|_| v.get("pretokenizers"))
        .and_then(Value::as_array)?;
    let isolated_regex = |split: &Value| -> Option<String> {
        let ok = split.get("type").and_then(Value::as_str) == Some("Split")
            && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
            && split.get("invert").and_then(Value::as_bool) == Some(false);
        ok.then(|| {
            split
                .get("pattern")?
                .get("Regex")?
                .as_str()
                .map(str::to_string)
        })
        .flatten()
    };
    let byte_level_ok = |byte_level: &Value| {
        byte_level.get("type").and_then(Value::as_str) == Some("ByteLevel")
            && byte_level.get("add_prefix_space").and_then(Value::as_bool) == Some(false)
            && byte_level.get("use_regex").and_then(Value::as_bool) == Some(false)
    };
    if let [a, b, c, byte_level] = steps.as_slice() {
        let regexes = [isolated_regex(a)?, isolated_regex(b)?, isolated_regex(c)?];
        return (regexes == DEEPSEEK_V3_PATTERNS && byte_level_ok(byte_level))
            .then_some(SplitPattern::DeepSeekV3);
    }
    let [split, byte_level] = steps.as_slice() else {
        return None;
    };
    let pattern = split
        .get("pattern")
        .and_then(|p| p.get("Regex"))
        .and_then(Value::as_str)
        .and_then(SplitPattern::from_regex)?;
    let split_ok = split.get("type").and_then(Value::as_str) == Some("Split")
        && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
        && split.get("invert").and_then(Value::as_bool) == Some(false);
    let byte_level_ok = byte_level.get("type").and_then(Value::as_str) == Some("ByteLevel")
        && byte_level.get("add_prefix_space").and_then(Value::as_bool) == Some(false)
        && byte_level.get("use_regex").and_then(Value::as_bool) == Some(false);
    (split_ok && byte_level_ok).then_some(pattern)
}

/// The merges as `(left id, right id) -> (rank, merged id)`.
fn merge_map(m: &ModelJson<'_>) -> Result<MergeMap, String> {
    let mut merges = MergeMap::with_capacity_and_hasher(m.merges.len(), Default::default());
    let mut joined = String::new();
    for (rank, merge) in m.merges.iter().enumerate() {
        let (a, b) = match merge {
            MergeJson::Pair(a, b) => (a.as_ref(), b.as_ref()),
            MergeJson::Line(line) => {
                let mut parts = line.split(' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(a), Some(b), None) => (a, b),
                    _ => return Err(format!("merge {line:?}")),
                }
            }
        };
        let id = |s: &str| {
            m.vocab
                .get(s)
                .copied()
                .ok_or_else(|| format!("merge token {s:?} missing from the vocab"))
        };
        let rank = u32::try_from(rank).map_err(|_| "too many merges".to_string())?;
        // Later duplicates win, as when `tokenizers` collects its merge map.
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        merges.insert(pair_key(id(a)?, id(b)?), (rank, id(&joined)?));
    }
    Ok(merges)
}

impl ByteBpe {
    /// The fast path for this `tokenizer.json`, or why there is none.
    pub(crate) fn from_json(tokenizer_json: &[u8]) -> Result<ByteBpe, String> {
        let json: TokenizerJson<'_> =
            serde_json::from_slice(tokenizer_json).map_err(|e| format!("tokenizer.json: {e}"))?;
        let no_normalizers = serde_json::json!({"type": "Sequence", "normalizers": []});
        let normalizer = match &json.normalizer {
            Value::Null => Normalizer::None,
            v if *v == no_normalizers => Normalizer::None,
            v if v.get("type").and_then(Value::as_str) == Some("NFC")
                && v.as_object().is_some_and(|o| o.len() == 1) =>
            {
                Normalizer::Nfc
            }
            other => return Err(format!("normalizer {other}")),
        };
        let Some(split) = split_pattern(&json.pre_tokenizer) else {
            return Err("pre-tokenizer is not a Qwen2/Llama 3 split + byte level".into());
        };
        if !json.truncation.is_null() || !json.padding.is_null() {
            return Err("truncation or padding configured".into());
        }
        let m = json.model;
        let empty = |s: &Option<String>| s.as_deref().is_none_or(str::is_empty);
        if m.kind.as_deref().is_some_and(|k| k != "BPE")
            || m.dropout.is_some()
            || m.unk_token.is_some()
            || !empty(&m.continuing_subword_prefix)
            || !empty(&m.end_of_word_suffix)
            || m.byte_fallback
        {
            return Err("BPE options the fast path does not implement".into());
        }
        let chars = byte_chars();
        let mut byte_ids = [0u32; 256];
        for (slot, c) in byte_ids.iter_mut().zip(chars) {
            *slot = *m
                .vocab
                .get(c.encode_utf8(&mut [0; 4]) as &str)
                .ok_or_else(|| format!("byte symbol {c:?} missing from the vocab"))?;
        }
        let merges = merge_map(&m)?;
        let distinct: std::collections::HashSet<u32> = merges.values().map(|m| m.1).collect();
        let unique_merge_ids = distinct.len() == merges.len();
        let whole_words = m.ignore_merges.then(|| {
            let mut byte_of: FastMap<char, u8> = FastMap::default();
            for (b, c) in (0u8..=255).zip(chars) {
                byte_of.insert(c, b);
            }
            let mut words = FastMap::with_capacity_and_hasher(m.vocab.len(), Default::default());
            for (token, &id) in &m.vocab {
                // An entry with a char outside the byte table never equals a word's symbols.
                let bytes: Option<Box<[u8]>> =
                    token.chars().map(|c| byte_of.get(&c).copied()).collect();
                if let Some(bytes) = bytes {
                    words.insert(bytes, id);
                }
            }
            words
        });
        Ok(ByteBpe {
            normalizer,
            split,
            whole_words,
            byte_ids,
            merges,
            unique_merge_ids,
        })
    }

    /// Appends the ids of `piece` (text that contains no added token) to `out`. `hf` supplies
    /// the normaliser for the rare piece that is not already NFC.
    pub(crate) fn encode_piece(
        &self,
        hf: &tokenizers::Tokenizer,
        words: &WordCache,
        piece: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        if self.normalizer == Normalizer::Nfc && !is_nfc(piece) {
            let mut ns = tokenizers::NormalizedString::from(piece);
            match hf.get_normalizer() {
                Some(n) if tokenizers::Normalizer::normalize(n, &mut ns).is_ok() => {
                    self.encode_normalized(words, ns.get(), out);
                }
                // Not reachable for the NFC normaliser; the full pipeline is always exact.
                _ => out.extend(pipeline::encode(hf, piece, false)?),
            }
            return Ok(());
        }
        self.encode_normalized(words, piece, out);
        Ok(())
    }

    fn encode_normalized(&self, cache: &WordCache, text: &str, out: &mut Vec<u32>) {
        let mut misses: Vec<(&str, std::ops::Range<usize>)> = Vec::new();
        let mut pending: FastMap<&str, (usize, usize)> = FastMap::default();
        let mut scratch = Scratch::default();
        {
            let words = cache.map.read();
            self.split.split(text, |word| {
                if let Some(ids) = words.get(word.as_bytes()) {
                    out.extend_from_slice(ids.as_slice());
                    return;
                }
                if let Some(&(start, end)) = pending.get(word) {
                    out.extend_from_within(start..end);
                    return;
                }
                let start = out.len();
                self.merge_word(word.as_bytes(), &mut scratch, out);
                if word.len() <= MAX_CACHED_WORD_BYTES {
                    pending.insert(word, (start, out.len()));
                    misses.push((word, start..out.len()));
                }
            });
        }
        if misses.is_empty() {
            return;
        }
        let mut words = cache.map.write();
        if words.len() + misses.len() > WORD_CACHE_ENTRIES {
            words.clear();
        }
        for (word, range) in misses {
            if let Some(ids) = out.get(range) {
                words.insert(word.as_bytes().into(), WordIds::new(ids));
            }
        }
    }

    /// BPE on one word, with the result of `tokenizers`' `Word::merge_all` (or, with
    /// `ignore_merges`, its whole-word lookup first).
    fn merge_word(&self, word: &[u8], s: &mut Scratch, out: &mut Vec<u32>) {
        if let [b] = word {
            out.push(self.byte_ids[usize::from(*b)]);
            return;
        }
        if let Some(&id) = self.whole_words.as_ref().and_then(|w| w.get(word)) {
            out.push(id);
            return;
        }
        if self.unique_merge_ids && word.len() <= MAX_SCANNED_WORD_BYTES {
            self.merge_word_scan(word, s, out);
        } else {
            self.merge_word_heap(word, s, out);
        }
    }

    /// The rank and id of the merge of `a` and `b` (`u32::MAX` rank when none).
    #[inline]
    fn merge_of(&self, a: u32, b: u32) -> (u32, u32) {
        self.merges
            .get(&pair_key(a, b))
            .copied()
            .unwrap_or((u32::MAX, 0))
    }

    /// Repeatedly merges the lowest-ranked adjacent pair, leftmost first: what the heap in
    /// `merge_all` pops when no two merges share an id.
    fn merge_word_scan(&self, word: &[u8], s: &mut Scratch, out: &mut Vec<u32>) {
        s.ids.clear();
        s.ids
            .extend(word.iter().map(|&b| self.byte_ids[usize::from(b)]));
        s.ranks.clear();
        for w in s.ids.windows(2) {
            if let [a, b] = w {
                s.ranks.push(self.merge_of(*a, *b));
            }
        }
        loop {
            let mut best = u32::MAX;
            let mut at = 0;
            for (i, r) in s.ranks.iter().enumerate() {
                if r.0 < best {
                    best = r.0;
                    at = i;
                }
            }
            if best == u32::MAX {
                break;
            }
            let Some(&(_, new_id)) = s.ranks.get(at) else {
                break;
            };
            if let Some(slot) = s.ids.get_mut(at) {
                *slot = new_id;
            }
            s.ids.remove(at + 1);
            s.ranks.remove(at);
            if at > 0
                && let (Some(&a), Some(r)) = (s.ids.get(at - 1), s.ranks.get_mut(at - 1))
            {
                *r = self.merge_of(a, new_id);
            }
            if let (Some(&b), Some(r)) = (s.ids.get(at + 1), s.ranks.get_mut(at)) {
                *r = self.merge_of(new_id, b);
            }
        }
        out.extend_from_slice(&s.ids);
    }

    /// `merge_all` on the word's byte symbols.
    fn merge_word_heap(&self, word: &[u8], s: &mut Scratch, out: &mut Vec<u32>) {
        let ids = word.iter().map(|&b| self.byte_ids[usize::from(b)]);
        merge_ids_heap(&self.merges, ids, s, out);
    }
}

/// `merge_all`'s own algorithm: a min-heap of (rank, position), stale entries skipped.
fn merge_ids_heap(
    merges: &MergeMap,
    ids: impl ExactSizeIterator<Item = u32>,
    s: &mut Scratch,
    out: &mut Vec<u32>,
) {
    s.symbols.clear();
    s.heap.clear();
    let n = ids.len();
    for (i, id) in ids.enumerate() {
        s.symbols.push(Symbol {
            id,
            prev: i.wrapping_sub(1),
            next: if i + 1 < n { i + 1 } else { NONE },
            live: true,
        });
    }
    for (pos, w) in s.symbols.windows(2).enumerate() {
        if let [l, r] = w
            && let Some(&(rank, new_id)) = merges.get(&pair_key(l.id, r.id))
        {
            s.heap.push(Reverse((rank, pos, new_id)));
        }
    }
    while let Some(Reverse((_, pos, new_id))) = s.heap.pop() {
        let Some(&cur) = s.symbols.get(pos) else {
            continue;
        };
        if !cur.live || cur.next == NONE {
            continue;
        }
        let Some(&right) = s.symbols.get(cur.next) else {
            continue;
        };
        if merges.get(&pair_key(cur.id, right.id)).map(|m| m.1) != Some(new_id) {
            continue;
        }
        let right_pos = cur.next;
        if let Some(r) = s.symbols.get_mut(right_pos) {
            r.live = false;
        }
        if let Some(after) = s.symbols.get_mut(right.next) {
            after.prev = pos;
        }
        let merged = Symbol {
            id: new_id,
            prev: cur.prev,
            next: right.next,
            live: true,
        };
        if let Some(c) = s.symbols.get_mut(pos) {
            *c = merged;
        }
        if let Some(prev) = s.symbols.get(merged.prev)
            && let Some(&(rank, id)) = merges.get(&pair_key(prev.id, new_id))
        {
            s.heap.push(Reverse((rank, merged.prev, id)));
        }
        if let Some(next) = s.symbols.get(merged.next)
            && let Some(&(rank, id)) = merges.get(&pair_key(new_id, next.id))
        {
            s.heap.push(Reverse((rank, pos, id)));
        }
    }
    out.extend(s.symbols.iter().filter(|s| s.live).map(|s| s.id));
}

const NONE: usize = usize::MAX;

#[derive(Debug, Clone, Copy)]
struct Symbol {
    id: u32,
    /// Index of the previous live symbol (`NONE` for the first).
    prev: usize,
    /// Index of the next live symbol (`NONE` for the last).
    next: usize,
    live: bool,
}

#[derive(Default)]
struct Scratch {
    ids: Vec<u32>,
    ranks: Vec<(u32, u32)>,
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Reverse<(u32, usize, u32)>>,
}

/// Whether `text` is certainly NFC by the normaliser's own quick check (Unicode 9 tables, as
/// `tokenizers` uses). Characters below U+0300 are all NFC-stable, which covers ASCII and
/// Latin-1 without decoding.
fn is_nfc(text: &str) -> bool {
    if text.bytes().all(|b| b < 0xCC) {
        return true;
    }
    matches!(
        unicode_normalization_alignments::is_nfc_quick(text.chars()),
        unicode_normalization_alignments::IsNormalized::Yes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_match_gpt2() {
        let t = byte_chars();
        assert_eq!(t[usize::from(b'a')], 'a');
        assert_eq!(t[usize::from(b' ')], '\u{120}');
        assert_eq!(t[usize::from(b'\n')], '\u{10a}');
        assert_eq!(t[0], '\u{100}');
        assert_eq!(t[173], '\u{143}');
    }

    #[test]
    fn scan_and_heap_merges_agree() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/tokenizers/qwen3/tokenizer.json"
        );
        let bpe = match std::fs::read(path).map(|j| ByteBpe::from_json(&j)) {
            Ok(Ok(b)) => b,
            other => panic!("{path}: {:?}", other.map(|r| r.err())),
        };
        assert!(bpe.unique_merge_ids);
        let pieces: [&[u8]; 12] = [
            b"a",
            b"e",
            b"s",
            b" ",
            b"th",
            b"ing",
            b"\n",
            b"0",
            b"--",
            b"\xe4\xb8",
            b"\xad",
            b"'",
        ];
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let (mut scratch, mut a, mut b) = (Scratch::default(), Vec::new(), Vec::new());
        for _ in 0..20_000 {
            let mut word = Vec::new();
            while word.len() < MAX_SCANNED_WORD_BYTES - 3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                word.extend_from_slice(pieces[(x % pieces.len() as u64) as usize]);
                if x.is_multiple_of(5) {
                    break;
                }
            }
            a.clear();
            b.clear();
            bpe.merge_word_scan(&word, &mut scratch, &mut a);
            bpe.merge_word_heap(&word, &mut scratch, &mut b);
            assert_eq!(a, b, "{word:?}");
        }
    }

    #[test]
    fn refuses_other_shapes() {
        let gpt2 = br#"{"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},"model":{"type":"BPE","vocab":{},"merges":[]}}"#;
        assert!(ByteBpe::from_json(gpt2).is_err());
        let lowercase = br#"{"normalizer":{"type":"Lowercase"},"pre_tokenizer":null,"model":{"type":"BPE","vocab":{},"merges":[]}}"#;
        assert!(ByteBpe::from_json(lowercase).is_err());
    }
}
