//! A hand-written scanner for the o200k-style split of gpt-oss and Mistral Nemo, which cuts
//! words where a lower-case letter is followed by an upper-case one (`camelCase` -> `camel`,
//! `Case`; `HTTPServer` stays whole):
//!
//! ```text
//! [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//! |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//! |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! (gpt-oss; Mistral Nemo's has no contraction suffixes and `\p{N}` alone). Each alternative is
//! decided the way a backtracking engine would, leftmost-first: the upper-case run `X*` gives
//! back characters until the lower-case run `Y+` can start, so the match ends after the run of
//! `Y` characters that follows `X`'s longest run, or, when none follows, right after the last
//! character of that run that is in both classes (`Lm`, `Lo`, `M`). Marks (`\p{M}`) are not
//! letters, so they may also be the optional first character and part of punctuation runs.
//! Classes come from `regex-syntax` like the `tokenizers` crate's; the differential tests in
//! `tests/fast_path.rs` hold the scanner to the regex.

use super::{ClassTable, Tables, char_at, tables};
use std::sync::OnceLock;

/// The pre-tokenizer regex of gpt-oss `tokenizer.json` (OpenAI's o200k split).
pub(crate) const GPT_OSS_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer regex of Mistral Nemo `tokenizer.json` (Tekken).
pub(crate) const MISTRAL_NEMO_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// What a character is to the cased pattern (the Unicode general categories are disjoint, and
/// no whitespace character is a letter, mark or number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `Lu`, `Lt`: only in the upper-case class.
    Upper,
    /// `Ll`: only in the lower-case class.
    Lower,
    /// `Lm`, `Lo`: letters in both classes.
    Both,
    /// `M`: in both classes, yet not a letter (so also in `[^\s\p{L}\p{N}]`).
    Mark,
    /// `\p{N}`.
    Number,
    /// `\r`, `\n`.
    Newline,
    /// `\s` other than `\r`, `\n`.
    Space,
    /// Anything else.
    Other,
}

impl Kind {
    fn upper_class(self) -> bool {
        matches!(self, Kind::Upper | Kind::Both | Kind::Mark)
    }
    fn lower_class(self) -> bool {
        matches!(self, Kind::Lower | Kind::Both | Kind::Mark)
    }
    /// `[^\r\n\p{L}\p{N}]`.
    fn prefix(self) -> bool {
        matches!(self, Kind::Mark | Kind::Space | Kind::Other)
    }
    /// `[^\s\p{L}\p{N}]`.
    fn punct(self) -> bool {
        matches!(self, Kind::Mark | Kind::Other)
    }
    fn space(self) -> bool {
        matches!(self, Kind::Space | Kind::Newline)
    }
}

/// Letter case, marks, numbers and whitespace of the cased pattern.
struct CasedTables(ClassTable<Kind>);

fn cased_tables() -> &'static CasedTables {
    static T: OnceLock<CasedTables> = OnceLock::new();
    T.get_or_init(|| {
        CasedTables(ClassTable::new(
            &[
                (r"[\p{Lu}\p{Lt}]", Kind::Upper),
                (r"\p{Ll}", Kind::Lower),
                (r"[\p{Lm}\p{Lo}]", Kind::Both),
                (r"\p{M}", Kind::Mark),
                (r"\p{N}", Kind::Number),
                (r"\s", Kind::Space),
            ],
            Kind::Newline,
            Kind::Other,
        ))
    })
}

impl CasedTables {
    #[inline]
    fn kind(&self, c: char) -> Kind {
        self.0.kind(c)
    }

    #[inline]
    fn kind_at(&self, text: &str, i: usize) -> Option<(Kind, usize)> {
        let b = *text.as_bytes().get(i)?;
        if b < 0x80 {
            return Some((self.0.ascii(b), 1));
        }
        char_at(text, i).map(|(c, n)| (self.kind(c), n))
    }

    /// End of the run of characters whose kind passes `keep`, from `i`.
    #[inline]
    fn run_end(&self, text: &str, mut i: usize, keep: impl Fn(Kind) -> bool) -> usize {
        while let Some((k, n)) = self.kind_at(text, i) {
            if !keep(k) {
                break;
            }
            i += n;
        }
        i
    }
}

/// Splits `text` like the cased pre-tokenizer: calls `piece` with each piece, in order.
pub(crate) fn split<'a>(
    text: &'a str,
    max_digits: usize,
    contractions: bool,
    mut piece: impl FnMut(&'a str),
) {
    let ct = cased_tables();
    let ft = tables();
    let mut pos = 0;
    while pos < text.len() {
        let end = match_end(ct, ft, text, pos, max_digits, contractions).max(pos + 1);
        // `max` above only guards against a scanner bug looping forever; `get` keeps the
        // piece on a char boundary or empty.
        piece(text.get(pos..end).unwrap_or_default());
        pos = end;
    }
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at `i`: its end, if it matches.
fn contraction_end(ft: &Tables, text: &str, i: usize) -> Option<usize> {
    let (c0, n0) = char_at(text, i)?;
    if c0 != '\'' {
        return None;
    }
    let (c1, n1) = char_at(text, i + n0)?;
    if ['s', 't'].iter().any(|&l| ft.folds(l, c1)) {
        return Some(i + n0 + n1);
    }
    let two = |a: char, b: char| -> Option<usize> {
        if !ft.folds(a, c1) {
            return None;
        }
        let (c2, n2) = char_at(text, i + n0 + n1)?;
        ft.folds(b, c2).then_some(i + n0 + n1 + n2)
    };
    if let Some(end) = two('r', 'e').or_else(|| two('v', 'e')) {
        return Some(end);
    }
    if ft.folds('m', c1) {
        return Some(i + n0 + n1);
    }
    if let Some(end) = two('l', 'l') {
        return Some(end);
    }
    ft.folds('d', c1).then_some(i + n0 + n1)
}

/// `[X]*[Y]+` from `s` (first alternative's body): its end, if it matches.
fn upper_then_lower(ct: &CasedTables, text: &str, s: usize) -> Option<usize> {
    let x_end = ct.run_end(text, s, Kind::upper_class);
    if let Some((k, _)) = ct.kind_at(text, x_end)
        && k.lower_class()
    {
        return Some(ct.run_end(text, x_end, Kind::lower_class));
    }
    // Give back characters of the X run until Y can start: at its last Both/Mark character.
    let run = text.get(s..x_end)?;
    let (last, c) = run
        .char_indices()
        .rev()
        .find(|&(_, c)| ct.kind(c).lower_class())?;
    Some(s + last + c.len_utf8())
}

/// `[X]+[Y]*` from `s` (second alternative's body): its end, if it matches.
fn upper_run(ct: &CasedTables, text: &str, s: usize) -> Option<usize> {
    let x_end = ct.run_end(text, s, Kind::upper_class);
    (x_end > s).then(|| ct.run_end(text, x_end, Kind::lower_class))
}

/// The end of the match starting at `p` (`p < text.len()`).
fn match_end(
    ct: &CasedTables,
    ft: &Tables,
    text: &str,
    p: usize,
    max_digits: usize,
    contractions: bool,
) -> usize {
    let Some((k0, n0)) = ct.kind_at(text, p) else {
        return text.len();
    };
    let with_suffix = |end: usize| -> usize {
        if contractions {
            contraction_end(ft, text, end).unwrap_or(end)
        } else {
            end
        }
    };
    // The two word alternatives, each first with the optional leading character.
    for body in [upper_then_lower, upper_run] {
        if k0.prefix()
            && let Some(end) = body(ct, text, p + n0)
        {
            return with_suffix(end);
        }
        if let Some(end) = body(ct, text, p) {
            return with_suffix(end);
        }
    }
    // \p{N}{1,max_digits}
    if k0 == Kind::Number {
        let mut end = p + n0;
        for _ in 1..max_digits {
            match ct.kind_at(text, end) {
                Some((Kind::Number, n)) => end += n,
                _ => break,
            }
        }
        return end;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
    let punct_run = |start: usize| -> usize {
        let e = ct.run_end(text, start, Kind::punct);
        let mut i = e;
        while let Some(&b) = text.as_bytes().get(i) {
            if b == b'\r' || b == b'\n' || b == b'/' {
                i += 1;
            } else {
                break;
            }
        }
        i
    };
    if text.as_bytes().get(p) == Some(&b' ')
        && let Some((k1, _)) = ct.kind_at(text, p + 1)
        && k1.punct()
    {
        return punct_run(p + 1);
    }
    if k0.punct() {
        return punct_run(p);
    }
    // Whitespace: `\s*[\r\n]+` ends after the run's last newline.
    let q = ct.run_end(text, p, Kind::space);
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
        _ => q,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str, max_digits: usize, contractions: bool) -> Vec<&str> {
        let mut out = Vec::new();
        split(text, max_digits, contractions, |p| out.push(p));
        out
    }

    #[test]
    fn words_split_at_case() {
        assert_eq!(
            pieces("Hello HTTPServer's 12345 x/y\n/", 3, true),
            [
                "Hello",
                " HTTPServer's",
                " ",
                "123",
                "45",
                " x",
                "/y",
                "\n",
                "/"
            ]
        );
        assert_eq!(pieces("a+=\n/b", 3, true), ["a", "+=\n/", "b"]);
        assert_eq!(
            pieces("Hello HTTPServer's 12", 1, false),
            ["Hello", " HTTPServer", "'s", " ", "1", "2"]
        );
    }

    #[test]
    fn case_boundaries_inside_words() {
        // `[X]*[Y]+`: "camelCase" is "camel" then "Case"; capitals followed by lower-case
        // letters are one word.
        assert_eq!(
            pieces("camelCase ABCdef", 3, true),
            ["camel", "Case", " ABCdef"]
        );
        assert_eq!(pieces("ABC", 3, true), ["ABC"]);
    }
}
