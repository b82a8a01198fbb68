//! A hand-written scanner for DeepSeek-V3's pre-tokenizer: three `Split(Isolated)` steps in
//! sequence, each applied to every piece of the one before,
//!
//! ```text
//! 1. \p{N}{1,3}
//! 2. [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+
//! 3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! With `Isolated`, text between two matches is a piece of its own (step 3 matches no digit,
//! so step 1's digit runs pass through whole), and each step's `(?!\S)` sees the end of the
//! piece it runs on as the end of the text. Classes come from `regex-syntax`, like the
//! `tokenizers` crate's; `tests/fast_path.rs` holds the scanner to the regexes.

use super::{ClassTable, char_at};
use std::sync::OnceLock;

/// The three regexes of DeepSeek-V3 `tokenizer.json`, in order.
pub(crate) const DEEPSEEK_V3_PATTERNS: [&str; 3] = [
    r"\p{N}{1,3}",
    "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Letter,
    Mark,
    Number,
    /// `\p{P}` or `\p{S}`.
    Punct,
    Newline,
    Space,
    Other,
}

/// Letters, marks, numbers, punctuation/symbols and whitespace of DeepSeek-V3's patterns.
struct Tables(ClassTable<Kind>);

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        Tables(ClassTable::new(
            &[
                (r"\p{L}", Kind::Letter),
                (r"\p{M}", Kind::Mark),
                (r"\p{N}", Kind::Number),
                (r"[\p{P}\p{S}]", Kind::Punct),
                (r"\s", Kind::Space),
            ],
            Kind::Newline,
            Kind::Other,
        ))
    })
}

impl Tables {
    fn kind(&self, c: char) -> Kind {
        self.0.kind(c)
    }

    fn kind_at(&self, text: &str, i: usize) -> Option<(char, Kind, usize)> {
        char_at(text, i).map(|(c, n)| (c, self.kind(c), n))
    }

    fn run_end(&self, text: &str, mut i: usize, keep: impl Fn(char, Kind) -> bool) -> usize {
        while let Some((c, k, n)) = self.kind_at(text, i) {
            if !keep(c, k) {
                break;
            }
            i += n;
        }
        i
    }
}

fn is_cjk(c: char) -> bool {
    matches!(c, '\u{4e00}'..='\u{9fa5}' | '\u{3040}'..='\u{309f}' | '\u{30a0}'..='\u{30ff}')
}

/// Runs an `Isolated` split of `text` whose matches `at(text, pos)` finds (the end of the
/// match starting at `pos`, if any): matches and the gaps between them, in order.
fn isolated<'a>(
    text: &'a str,
    at: impl Fn(&str, usize) -> Option<usize>,
    mut piece: impl FnMut(&'a str),
) {
    let mut gap = 0;
    let mut pos = 0;
    while let Some((_, n)) = char_at(text, pos) {
        match at(text, pos) {
            Some(end) if end > pos => {
                if gap < pos {
                    piece(text.get(gap..pos).unwrap_or_default());
                }
                piece(text.get(pos..end).unwrap_or_default());
                pos = end;
                gap = end;
            }
            _ => pos += n,
        }
    }
    if gap < text.len() {
        piece(text.get(gap..).unwrap_or_default());
    }
}

/// Splits `text` like DeepSeek-V3's pre-tokenizer: calls `piece` with each piece, in order.
pub(crate) fn split<'a>(text: &'a str, mut piece: impl FnMut(&'a str)) {
    let t = tables();
    let digits = |s: &str, p: usize| -> Option<usize> {
        let mut end = p;
        for _ in 0..3 {
            match t.kind_at(s, end) {
                Some((_, Kind::Number, n)) => end += n,
                _ => break,
            }
        }
        (end > p).then_some(end)
    };
    let cjk = |s: &str, p: usize| -> Option<usize> {
        let end = t.run_end(s, p, |c, _| is_cjk(c));
        (end > p).then_some(end)
    };
    isolated(text, digits, |a| {
        isolated(a, cjk, |b| {
            isolated(b, |s, p| last_step(t, s, p), &mut piece)
        })
    });
}

/// The third regex at `p` of `s`.
fn last_step(t: &Tables, s: &str, p: usize) -> Option<usize> {
    let (c0, k0, n0) = t.kind_at(s, p)?;
    let next = t.kind_at(s, p + n0);
    // [ascii punct][A-Za-z]+
    if c0.is_ascii_punctuation()
        && let Some((c1, _, _)) = next
        && c1.is_ascii_alphabetic()
    {
        return Some(t.run_end(s, p + n0, |c, _| c.is_ascii_alphabetic()));
    }
    // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
    let letters = |k: Kind| matches!(k, Kind::Letter | Kind::Mark);
    if matches!(k0, Kind::Mark | Kind::Number | Kind::Space | Kind::Other)
        && let Some((_, k1, _)) = next
        && letters(k1)
    {
        return Some(t.run_end(s, p + n0, |_, k| letters(k)));
    }
    if letters(k0) {
        return Some(t.run_end(s, p, |_, k| letters(k)));
    }
    // ` ?[\p{P}\p{S}]+[\r\n]*`
    let punct_run = |start: usize| -> usize {
        let e = t.run_end(s, start, |_, k| k == Kind::Punct);
        t.run_end(s, e, |_, k| k == Kind::Newline)
    };
    if c0 == ' '
        && let Some((_, Kind::Punct, _)) = next
    {
        return Some(punct_run(p + n0));
    }
    if k0 == Kind::Punct {
        return Some(punct_run(p));
    }
    if !matches!(k0, Kind::Space | Kind::Newline) {
        return None;
    }
    let q = t.run_end(s, p, |_, k| matches!(k, Kind::Space | Kind::Newline));
    let run = s.get(p..q).unwrap_or_default();
    if let Some(last_nl) = run.rfind(['\r', '\n']) {
        return Some(p + last_nl + 1);
    }
    if q == s.len() {
        return Some(q);
    }
    match run.char_indices().next_back() {
        Some((last, _)) if last > 0 => Some(p + last),
        _ => Some(q),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_steps() {
        let mut out = Vec::new();
        split("Hello world 12345 中文abc.def\n\n x", |p| out.push(p));
        assert_eq!(
            out,
            [
                "Hello", " world", " ", "123", "45", " ", "中文", "abc", ".def", "\n\n", " x"
            ]
        );
    }
}
