//! A hand-written scanner for the Qwen2 pre-tokenizer split, the regex
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! and its Llama 3 variant (cl100k's), which differs only in taking up to three digits at a
//! time (`\p{N}{1,3}`), both with `behavior: Isolated`. The o200k-style split of gpt-oss and
//! Mistral Nemo is in `cased.rs`, DeepSeek-V3's three-step split in `deepseek.rs`. Every character starts a match of some alternative (a letter,
//! a number, whitespace or anything else), so the split has no gaps and the pieces are the
//! regex's successive leftmost-first matches. The scanner decides each match with the same
//! preference order a backtracking engine follows, without backtracking.
//!
//! The character classes are taken from `regex-syntax`, the crate that builds the classes for
//! the `tokenizers` crate's `fancy-regex`, so `\p{L}`, `\p{N}`, `\s` and the case folds of the
//! contractions are the same tables (the differential tests in `tests/fast_path.rs` and the
//! `fast_path` fuzz target hold the two to the same output).

use regex_syntax::hir::{Class, HirKind};
use std::sync::OnceLock;

pub(crate) mod cased;
pub(crate) mod deepseek;

/// The pre-tokenizer regex of Qwen2/Qwen3 `tokenizer.json`.
pub(crate) const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer regex of Llama 3.x `tokenizer.json` (OpenAI's cl100k split).
pub(crate) const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A split regex this module implements by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SplitPattern {
    /// [`QWEN2_PATTERN`]: one digit per piece.
    Qwen2,
    /// [`LLAMA3_PATTERN`]: up to three digits per piece.
    Llama3,
    /// [`cased::GPT_OSS_PATTERN`] (o200k): words split at letter case, contractions kept.
    GptOss,
    /// [`cased::MISTRAL_NEMO_PATTERN`]: the same without contractions, one digit per piece.
    MistralNemo,
    /// [`deepseek::DEEPSEEK_V3_PATTERNS`]: three splits in sequence.
    DeepSeekV3,
}

impl SplitPattern {
    /// The scanner for a `Split` pre-tokenizer's regex, if it is one of ours (exact text).
    pub(crate) fn from_regex(regex: &str) -> Option<SplitPattern> {
        match regex {
            QWEN2_PATTERN => Some(SplitPattern::Qwen2),
            LLAMA3_PATTERN => Some(SplitPattern::Llama3),
            cased::GPT_OSS_PATTERN => Some(SplitPattern::GptOss),
            cased::MISTRAL_NEMO_PATTERN => Some(SplitPattern::MistralNemo),
            _ => None,
        }
    }

    /// Splits `text` like the pre-tokenizer: calls `piece` with each piece, in order.
    pub(crate) fn split<'a>(self, text: &'a str, mut piece: impl FnMut(&'a str)) {
        let (max_digits, contractions) = match self {
            SplitPattern::Qwen2 => (1, true),
            SplitPattern::Llama3 => (3, true),
            SplitPattern::GptOss => (3, true),
            SplitPattern::MistralNemo | SplitPattern::DeepSeekV3 => (1, false),
        };
        if self == SplitPattern::DeepSeekV3 {
            deepseek::split(text, piece);
            return;
        }
        if matches!(self, SplitPattern::GptOss | SplitPattern::MistralNemo) {
            cased::split(text, max_digits, contractions, piece);
            return;
        }
        let t = tables();
        let mut pos = 0;
        while pos < text.len() {
            let end = match_end(t, text, pos, max_digits);
            piece(text.get(pos..end).unwrap_or_default());
            pos = end;
        }
    }
}

/// What a character is to the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\r` or `\n` (whitespace, and special to several alternatives).
    Newline,
    /// `\s` other than `\r` and `\n`.
    Space,
    /// Anything else: `[^\s\p{L}\p{N}]`.
    Other,
}

/// What a pre-tokenizer's pattern needs to know of a character, by the regex classes it
/// uses: an array for ASCII, a binary search over sorted disjoint ranges for the rest. Each
/// scanner (Qwen2/Llama 3 here, `cased`, `deepseek`) builds one over its own kinds.
pub(crate) struct ClassTable<K> {
    ascii: [K; 128],
    /// Disjoint, sorted ranges of the non-ASCII members of the classes.
    ranges: Vec<(u32, u32, K)>,
    other: K,
}

impl<K: Copy> ClassTable<K> {
    /// A table where the characters of each regex class in `classes` have its kind, `\r` and
    /// `\n` have `newline`, and everything else `other`. The classes must be disjoint.
    pub(crate) fn new(classes: &[(&str, K)], newline: K, other: K) -> Self {
        let mut ranges: Vec<(u32, u32, K)> = Vec::new();
        for &(pattern, kind) in classes {
            for (lo, hi) in class_ranges(pattern) {
                ranges.push((lo, hi, kind));
            }
        }
        ranges.sort_unstable_by_key(|r| r.0);
        let kind_of = |c: u32| -> K {
            if c == u32::from('\r') || c == u32::from('\n') {
                return newline;
            }
            ranges
                .iter()
                .find(|r| r.0 <= c && c <= r.1)
                .map_or(other, |r| r.2)
        };
        let ascii = std::array::from_fn(|c| kind_of(c as u32));
        let ranges = ranges
            .into_iter()
            .filter(|r| r.1 >= 128)
            .map(|(lo, hi, k)| (lo.max(128), hi, k))
            .collect();
        Self {
            ascii,
            ranges,
            other,
        }
    }

    /// The kind of an ASCII byte (`b < 128`).
    #[inline]
    pub(crate) fn ascii(&self, b: u8) -> K {
        self.ascii
            .get(usize::from(b))
            .copied()
            .unwrap_or(self.other)
    }

    /// The kind of `c`.
    #[inline]
    pub(crate) fn kind(&self, c: char) -> K {
        let u = u32::from(c);
        if let Some(k) = self.ascii.get(u as usize) {
            return *k;
        }
        match self.ranges.binary_search_by(|r| {
            if r.1 < u {
                std::cmp::Ordering::Less
            } else if r.0 > u {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        }) {
            Ok(i) => self.ranges.get(i).map_or(self.other, |r| r.2),
            Err(_) => self.other,
        }
    }
}

/// The Unicode tables, built once per process from `regex-syntax`.
pub(crate) struct Tables {
    /// Letters, numbers, whitespace.
    classes: ClassTable<Kind>,
    /// For each contraction letter (s, t, r, e, v, m, l, d): the characters `(?i:x)` matches.
    folds: [Vec<char>; 8],
}

const FOLD_LETTERS: [char; 8] = ['s', 't', 'r', 'e', 'v', 'm', 'l', 'd'];

pub(crate) fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    let hir = match regex_syntax::parse(pattern) {
        Ok(h) => h,
        // The patterns are constants that regex-syntax accepts; an empty class here would
        // only make the scanner disagree with the tokenizer, which the tests catch.
        Err(_) => return Vec::new(),
    };
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c
            .ranges()
            .iter()
            .map(|r| (u32::from(r.start()), u32::from(r.end())))
            .collect(),
        HirKind::Literal(lit) => std::str::from_utf8(&lit.0)
            .ok()
            .and_then(|s| s.chars().next())
            .map(|c| vec![(u32::from(c), u32::from(c))])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

pub(crate) fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let classes = ClassTable::new(
            &[
                (r"\p{L}", Kind::Letter),
                (r"\p{N}", Kind::Number),
                (r"\s", Kind::Space),
            ],
            Kind::Newline,
            Kind::Other,
        );
        let folds = FOLD_LETTERS.map(|l| {
            let mut chars: Vec<char> = class_ranges(&format!("(?i:{l})"))
                .into_iter()
                .flat_map(|(lo, hi)| (lo..=hi).filter_map(char::from_u32))
                .collect();
            if chars.is_empty() {
                chars.push(l);
            }
            chars
        });
        Tables { classes, folds }
    })
}

impl Tables {
    #[inline]
    fn kind(&self, c: char) -> Kind {
        self.classes.kind(c)
    }

    /// Whether `c` matches `(?i:letter)` (`letter` one of the contraction letters).
    pub(crate) fn folds(&self, letter: char, c: char) -> bool {
        FOLD_LETTERS
            .iter()
            .position(|&l| l == letter)
            .and_then(|i| self.folds.get(i))
            .is_some_and(|set| set.contains(&c))
    }
}

/// The char at byte `i` and its byte length (`None` at the end).
#[inline]
pub(crate) fn char_at(text: &str, i: usize) -> Option<(char, usize)> {
    let b = *text.as_bytes().get(i)?;
    if b < 0x80 {
        return Some((char::from(b), 1));
    }
    let c = text.get(i..)?.chars().next()?;
    Some((c, c.len_utf8()))
}

/// End of the run of characters of kinds accepted by `keep` starting at `i`.
#[inline]
fn run_end(t: &Tables, text: &str, mut i: usize, keep: impl Fn(Kind) -> bool) -> usize {
    let bytes = text.as_bytes();
    while let Some(&b) = bytes.get(i) {
        if b < 0x80 {
            if !keep(t.classes.ascii(b)) {
                break;
            }
            i += 1;
        } else {
            match char_at(text, i) {
                Some((c, n)) if keep(t.kind(c)) => i += n,
                _ => break,
            }
        }
    }
    i
}

/// The end of the match starting at `p` (`p < text.len()`, always `> p`); `max_digits` is the
/// `n` of `\p{N}{1,n}`.
fn match_end(t: &Tables, text: &str, p: usize, max_digits: usize) -> usize {
    let Some((c0, n0)) = char_at(text, p) else {
        return text.len();
    };
    let k0 = t.kind(c0);
    let next = char_at(text, p + n0);
    let k1 = next.map(|(c, _)| t.kind(c));

    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if c0 == '\''
        && let Some((c1, n1)) = next
    {
        if ['s', 't', 'm', 'd'].iter().any(|&l| t.folds(l, c1)) {
            return p + n0 + n1;
        }
        let two = |a: char, b: char| -> Option<usize> {
            if !t.folds(a, c1) {
                return None;
            }
            let (c2, n2) = char_at(text, p + n0 + n1)?;
            t.folds(b, c2).then_some(p + n0 + n1 + n2)
        };
        if let Some(end) = two('r', 'e')
            .or_else(|| two('v', 'e'))
            .or_else(|| two('l', 'l'))
        {
            return end;
        }
    }
    let is_letter = |k: Kind| k == Kind::Letter;
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if k0 == Kind::Letter {
        return run_end(t, text, p + n0, is_letter);
    }
    if matches!(k0, Kind::Other | Kind::Space) && k1 == Some(Kind::Letter) {
        return run_end(t, text, p + n0, is_letter);
    }
    // \p{N}{1,max_digits}
    if k0 == Kind::Number {
        let mut end = p + n0;
        for _ in 1..max_digits {
            match char_at(text, end) {
                Some((c, n)) if t.kind(c) == Kind::Number => end += n,
                _ => break,
            }
        }
        return end;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let other_run = |start: usize| -> usize {
        let e = run_end(t, text, start, |k| k == Kind::Other);
        run_end(t, text, e, |k| k == Kind::Newline)
    };
    if c0 == ' ' && k1 == Some(Kind::Other) {
        return other_run(p + n0);
    }
    if k0 == Kind::Other {
        return other_run(p);
    }
    // Whitespace from here on: `\s*[\r\n]+` ends after the run's last newline.
    let q = run_end(t, text, p, |k| matches!(k, Kind::Space | Kind::Newline));
    let run = text.get(p..q).unwrap_or_default();
    if let Some(last_nl) = run.rfind(['\r', '\n']) {
        return p + last_nl + 1;
    }
    // `\s+(?!\S)`: all of it at the end of the text, else all but its last char.
    if q == text.len() {
        return q;
    }
    match run.char_indices().next_back() {
        Some((last, _)) if last > 0 => p + last,
        // `\s+`: a single whitespace char before a non-space.
        _ => q,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        SplitPattern::Qwen2.split(text, |p| out.push(p));
        out
    }

    #[test]
    fn llama3_takes_up_to_three_digits() {
        let mut out = Vec::new();
        SplitPattern::Llama3.split("a 1234567 x\u{b2}\u{b3}9", |p| out.push(p));
        assert_eq!(out, ["a", " ", "123", "456", "7", " x", "\u{b2}\u{b3}9"]);
        assert_eq!(
            SplitPattern::from_regex(LLAMA3_PATTERN),
            Some(SplitPattern::Llama3)
        );
        assert_eq!(
            SplitPattern::from_regex(QWEN2_PATTERN),
            Some(SplitPattern::Qwen2)
        );
        assert_eq!(SplitPattern::from_regex(r"\p{N}"), None);
    }

    #[test]
    fn words_spaces_and_contractions() {
        assert_eq!(
            split("Hello world's  end\n\n  x"),
            ["Hello", " world", "'s", " ", " end", "\n\n", " ", " x"]
        );
        assert_eq!(split("I'LL go"), ["I", "'LL", " go"]);
        assert_eq!(split("'sample"), ["'s", "ample"]);
        assert_eq!(split("'xyz"), ["'xyz"]);
    }

    #[test]
    fn numbers_punctuation_and_trailing_space() {
        assert_eq!(split("a 123!? \n"), ["a", " ", "1", "2", "3", "!?", " \n"]);
        assert_eq!(split(" ...\r\nb"), [" ...\r\n", "b"]);
        assert_eq!(split("end   "), ["end", "   "]);
        assert_eq!(split("\tword"), ["\tword"]);
    }

    #[test]
    fn unicode_classes_come_from_regex_syntax() {
        // U+3000 is whitespace, U+00B2 (superscript two) a number, U+017F folds to 's'.
        assert_eq!(split("\u{3000}x\u{b2}"), ["\u{3000}x", "\u{b2}"]);
        assert_eq!(split("'\u{17f}"), ["'\u{17f}"]);
    }
}
