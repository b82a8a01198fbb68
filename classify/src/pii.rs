//! The PII labeller: one forward pass over a text's bytes that stops only at anchors (an
//! ASCII digit, `@`, or a backtick for the size classifier's code-fence count) and validates
//! the candidate around each anchor locally. Between anchors it tests 32 bytes at a time
//! with a branch-free fold the compiler vectorises, so clean prose runs at memory speed and
//! the cost grows with the number of digit runs, not with the number of kinds.
//!
//! ```text
//! text ──► next_anchor ──'@'──► email: local part left (<= 64), domain right (labels, TLD)
//!                      ──digit─► letters before? IBAN (CC + check digits), NINO, NIE
//!                                groups of digits and separators (" -./()", "+" prefix)
//!                                ──► card | SSN | BSN | Steuer-IdNr | NIR | DNI | phone
//!                      ──'`'──► "```" counted as a code fence
//! ```
//!
//! Every candidate is ASCII, so every span starts and ends on a char boundary. Matched text
//! is never stored or logged: a [`Finding`] holds the kind, the scheme and the byte span.

use std::ops::Range;

use crate::checksum;

/// The kind of personal data a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PiiKind {
    /// E-mail address.
    Email,
    /// Phone number.
    Phone,
    /// IBAN.
    Iban,
    /// Payment card number.
    Card,
    /// National identity or tax number.
    NationalId,
}

impl PiiKind {
    /// Every kind, in label order.
    pub const ALL: [PiiKind; 5] = [
        PiiKind::Email,
        PiiKind::Phone,
        PiiKind::Iban,
        PiiKind::Card,
        PiiKind::NationalId,
    ];

    /// The kind's label (`pii:email`, ...).
    pub const fn label(self) -> crate::Label {
        match self {
            PiiKind::Email => crate::Label::PiiEmail,
            PiiKind::Phone => crate::Label::PiiPhone,
            PiiKind::Iban => crate::Label::PiiIban,
            PiiKind::Card => crate::Label::PiiCard,
            PiiKind::NationalId => crate::Label::PiiNationalId,
        }
    }
}

/// One piece of personal data found in a text: what it is, by which rule, and where (byte
/// offsets into the text, on char boundaries). For tests and explain only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The kind.
    pub kind: PiiKind,
    /// The rule that matched: `email`, `phone-e164`, `phone-nanp`, `phone-national`,
    /// `phone-context`, `iban`, `card`, `us-ssn`, `nl-bsn`, `es-dni`, `es-nie`, `gb-nino`,
    /// `fr-nir`, `de-steuer-id`.
    pub scheme: &'static str,
    /// Byte range in the text.
    pub span: Range<usize>,
}

/// Per-kind counts of findings, indexed like [`PiiKind::ALL`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PiiCounts(pub [u32; 5]);

impl PiiCounts {
    /// Findings of one kind.
    pub fn get(&self, kind: PiiKind) -> u32 {
        self.0[kind as usize]
    }

    /// Findings of every kind.
    pub fn total(&self) -> u32 {
        self.0.iter().sum()
    }
}

const DIGIT: u8 = 1;
const UPPER: u8 = 2;
const LOWER: u8 = 4;
/// A character allowed in an e-mail local part (besides letters and digits).
const LOCAL: u8 = 8;
const ALNUM: u8 = DIGIT | UPPER | LOWER;
/// Where the scan stops: a digit, `@` or a backtick.
const ANCHOR: u8 = 16;

const fn class_table() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = if b.is_ascii_digit() {
            DIGIT | ANCHOR
        } else if b == b'@' || b == b'`' {
            ANCHOR
        } else if b.is_ascii_uppercase() {
            UPPER
        } else if b.is_ascii_lowercase() {
            LOWER
        } else if matches!(b, b'.' | b'_' | b'%' | b'+' | b'-') {
            LOCAL
        } else {
            0
        };
        c += 1;
    }
    t
}

static CLASS: [u8; 256] = class_table();

fn is(b: &[u8], i: usize, class: u8) -> bool {
    b.get(i)
        .is_some_and(|&c| CLASS[usize::from(c)] & class != 0)
}

fn is_digit(b: &[u8], i: usize) -> bool {
    is(b, i, DIGIT)
}

fn is_alnum(b: &[u8], i: usize) -> bool {
    is(b, i, ALNUM)
}

/// Whether position `i` (which may be before the start, `None`) holds an alphanumeric.
fn alnum_before(b: &[u8], i: Option<usize>) -> bool {
    i.is_some_and(|i| is_alnum(b, i))
}

fn is_anchor(c: u8) -> bool {
    CLASS[usize::from(c)] & ANCHOR != 0
}

/// The first anchor at or after `i`.
fn next_anchor(b: &[u8], mut i: usize) -> Option<usize> {
    const W: usize = 32;
    // Anchors cluster (digits in code and tables): look at the next bytes one by one first.
    let near = b.len().min(i + 16);
    while i < near {
        if is_anchor(b[i]) {
            return Some(i);
        }
        i += 1;
    }
    while let Some(chunk) = b.get(i..i + W) {
        // Branch-free over the chunk so it vectorises; the exact position only on a hit.
        let hit = chunk.iter().fold(0u8, |acc, &c| {
            acc | u8::from(c.wrapping_sub(b'0') < 10) | u8::from(c == b'@') | u8::from(c == b'`')
        });
        if hit != 0
            && let Some(k) = chunk.iter().position(|&c| is_anchor(c))
        {
            return Some(i + k);
        }
        i += W;
    }
    b.get(i..)?
        .iter()
        .position(|&c| is_anchor(c))
        .map(|k| i + k)
}

/// Which kinds to report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PiiConfig {
    /// E-mail addresses.
    pub email: bool,
    /// Phone numbers.
    pub phone: bool,
    /// IBANs.
    pub iban: bool,
    /// Payment cards.
    pub card: bool,
    /// National ids.
    pub national_id: bool,
}

impl Default for PiiConfig {
    fn default() -> Self {
        PiiConfig {
            email: true,
            phone: true,
            iban: true,
            card: true,
            national_id: true,
        }
    }
}

impl PiiConfig {
    fn wants(&self, kind: PiiKind) -> bool {
        match kind {
            PiiKind::Email => self.email,
            PiiKind::Phone => self.phone,
            PiiKind::Iban => self.iban,
            PiiKind::Card => self.card,
            PiiKind::NationalId => self.national_id,
        }
    }
}

/// What one pass over a text found besides the findings themselves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ScanStats {
    /// "```" occurrences (two per fenced code block).
    pub fences: usize,
}

/// Scans `text`, calling `found` for each finding (in text order; spans never overlap).
pub(crate) fn scan(
    text: &str,
    config: &PiiConfig,
    mut found: impl FnMut(PiiKind, &'static str, Range<usize>),
) -> ScanStats {
    let b = text.as_bytes();
    let mut stats = ScanStats::default();
    let mut i = 0;
    // End of the last finding: the next one may not start before it.
    let mut last_end = 0;
    while let Some(a) = next_anchor(b, i) {
        i = match b[a] {
            b'@' => match email(b, a, last_end) {
                Some(span) => {
                    let end = span.end;
                    if config.email {
                        found(PiiKind::Email, "email", span);
                    }
                    last_end = end;
                    end
                }
                None => a + 1,
            },
            b'`' => {
                if b.get(a..a + 3) == Some(b"```") {
                    stats.fences += 1;
                    a + 3
                } else {
                    a + 1
                }
            }
            _ => {
                if let Some(next) = dismiss(b, a) {
                    i = next;
                    continue;
                }
                let (next, hit) = numeric(b, a);
                if let Some((kind, scheme, span)) = hit
                    && span.start >= last_end
                {
                    last_end = span.end;
                    if config.wants(kind) {
                        found(kind, scheme, span);
                    }
                }
                next
            }
        };
    }
    stats
}

/// File extensions that follow `name@2x`-style asset names and are no top-level domain.
/// Extensions that are country domains (`.rs` Serbia, `.py` Paraguay, `.md` Moldova) stay
/// addresses.
const FILE_EXTENSIONS: &[&[u8]] = &[
    b"png", b"jpg", b"jpeg", b"gif", b"svg", b"webp", b"ico", b"js", b"ts", b"css", b"json",
    b"txt", b"html", b"yaml", b"yml", b"toml", b"lock", b"zip", b"gz",
];

/// The e-mail address around the `@` at `at`, if any; its local part starts at `floor` or
/// later (the end of the previous finding).
fn email(b: &[u8], at: usize, floor: usize) -> Option<Range<usize>> {
    // Local part: up to 64 characters to the left.
    let mut start = at;
    while start > floor && at - start < 64 && is(b, start - 1, ALNUM | LOCAL) {
        start -= 1;
    }
    if start > floor && is(b, start - 1, ALNUM | LOCAL) {
        return None; // longer than 64: not an address
    }
    while start < at && b[start] == b'.' {
        start += 1;
    }
    if start == at || b[at - 1] == b'.' {
        return None;
    }
    // Domain: labels of [A-Za-z0-9-] separated by single dots.
    let mut i = at + 1;
    let mut labels = 0;
    let mut last = at + 1..at + 1;
    loop {
        let ls = i;
        while i < b.len() && i - ls < 63 && (is_alnum(b, i) || b[i] == b'-') {
            i += 1;
        }
        if i == ls || b[ls] == b'-' || b[i - 1] == b'-' {
            // An empty or hyphen-edged label ends the domain before it.
            if labels == 0 {
                return None;
            }
            i = last.end;
            break;
        }
        labels += 1;
        last = ls..i;
        if b.get(i) == Some(&b'.') && is_alnum(b, i + 1) {
            i += 1;
        } else {
            break;
        }
    }
    let tld = &b[last.clone()];
    let tld_ok = labels >= 2
        && (2..=24).contains(&tld.len())
        && tld.iter().all(u8::is_ascii_alphabetic)
        && !FILE_EXTENSIONS
            .iter()
            .any(|ext| ext.eq_ignore_ascii_case(tld));
    if !tld_ok || i - at > 254 || is_alnum(b, i) || b.get(i) == Some(&b'@') {
        return None;
    }
    Some(start..i)
}

/// Keywords that, just before a bare number, say what it is.
const PHONE_WORDS: &[&[u8]] = &[
    b"phone",
    b"tel",
    b"call",
    b"mobile",
    b"cell",
    b"fax",
    b"whatsapp",
    b"telefoon",
    b"telefon",
    b"telephone",
    b"t\xc3\xa9l\xc3\xa9phone",
    b"telefono",
    b"tel\xc3\xa9fono",
    b"m\xc3\xb3vil",
    b"movil",
    b"handy",
    b"mobiel",
    b"portable",
];
const SSN_WORDS: &[&[u8]] = &[b"ssn", b"social security"];
const BSN_WORDS: &[&[u8]] = &[
    b"bsn",
    b"burgerservicenummer",
    b"sofinummer",
    b"sofi-nummer",
];
const STEUER_WORDS: &[&[u8]] = &[
    b"steuer",
    b"idnr",
    b"identifikationsnummer",
    b"tax id",
    b"tin",
];

/// Whether one of `words` (lower case) starts a word within the 40 bytes before `start`.
fn keyword_before(b: &[u8], start: usize, words: &[&[u8]]) -> bool {
    let from = start.saturating_sub(40);
    let window = &b[from..start];
    words.iter().any(|w| {
        window.windows(w.len()).enumerate().any(|(k, cand)| {
            cand.eq_ignore_ascii_case(w) && (k + from == 0 || !is(b, k + from - 1, UPPER | LOWER))
        })
    })
}

const SEP_SPACE: u8 = 1;
const SEP_DASH: u8 = 2;
const SEP_DOT: u8 = 4;
const SEP_SLASH: u8 = 8;
const SEP_PAREN: u8 = 16;
const MAX_DIGITS: usize = 24;
const MAX_GROUPS: usize = 12;

/// A run of digit groups and the separators between them.
struct Groups {
    digits: [u8; MAX_DIGITS],
    n: usize,
    lens: [u8; MAX_GROUPS],
    g: usize,
    seps: u8,
    end: usize,
    overflow: bool,
    unbalanced: bool,
}

impl Groups {
    fn digits(&self) -> &[u8] {
        &self.digits[..self.n]
    }
    fn lens(&self) -> &[u8] {
        &self.lens[..self.g]
    }
    /// One separator kind at most, ignoring parentheses around an area code.
    fn single_sep(&self) -> bool {
        (self.seps & !SEP_PAREN).count_ones() <= 1
    }
    fn min_group(&self) -> u8 {
        self.lens().iter().copied().min().unwrap_or(0)
    }
}

/// Reads digit groups from `i` (a digit), `open` when a '(' precedes it.
fn groups(b: &[u8], i: usize, mut open: bool) -> Groups {
    let mut gr = Groups {
        digits: [0; MAX_DIGITS],
        n: 0,
        lens: [0; MAX_GROUPS],
        g: 0,
        seps: 0,
        end: i,
        overflow: false,
        unbalanced: false,
    };
    let mut j = i;
    loop {
        let gs = j;
        while is_digit(b, j) {
            if gr.n < MAX_DIGITS {
                gr.digits[gr.n] = b[j] - b'0';
            } else {
                gr.overflow = true;
            }
            gr.n += 1;
            j += 1;
        }
        if gr.g < MAX_GROUPS {
            gr.lens[gr.g] = u8::try_from(j - gs).unwrap_or(u8::MAX);
        } else {
            gr.overflow = true;
        }
        gr.g += 1;
        gr.end = j;
        // A separator, then the next group's first digit.
        let (next, kind, opens, closes) = match b.get(j) {
            Some(b')') if open => match b.get(j + 1) {
                Some(b' ' | b'-') => (j + 2, SEP_PAREN, false, true),
                _ => (j + 1, SEP_PAREN, false, true),
            },
            Some(b'(') if !open => (j + 1, SEP_PAREN, true, false),
            Some(&c @ (b' ' | b'-' | b'.' | b'/')) => {
                let kind = match c {
                    b' ' => SEP_SPACE,
                    b'-' => SEP_DASH,
                    b'.' => SEP_DOT,
                    _ => SEP_SLASH,
                };
                if b.get(j + 1) == Some(&b'(') && !open {
                    (j + 2, kind | SEP_PAREN, true, false)
                } else {
                    (j + 1, kind, false, false)
                }
            }
            _ => break,
        };
        if !is_digit(b, next) {
            break;
        }
        open = (open || opens) && !closes;
        gr.seps |= kind;
        j = next;
    }
    gr.unbalanced = open;
    gr
}

type Hit = (PiiKind, &'static str, Range<usize>);

/// The end of the alphanumeric run at `i`.
fn skip_alnum(b: &[u8], mut i: usize) -> usize {
    while is_alnum(b, i) {
        i += 1;
    }
    i
}

/// Where scanning resumes when the digit run at `i` cannot be part of any finding: the
/// common short number ("buf[12]", "2048,", "v2"). Every kind needs six digits in a row or a
/// separator and more digits, except an IBAN's two check digits after the country code.
/// Kept small and inlined so the hot loop does not pay for `numeric`'s frame.
#[inline(always)]
fn dismiss(b: &[u8], i: usize) -> Option<usize> {
    let mut r = i;
    while is_digit(b, r) {
        r += 1;
    }
    if r - i >= 6 {
        return None;
    }
    let continues = match b.get(r) {
        Some(b' ' | b'-' | b'.' | b'/') => is_digit(b, r + 1) || b.get(r + 1) == Some(&b'('),
        Some(b'(' | b')') => true,
        _ => false,
    };
    let iban_like = i >= 2 && is(b, i - 1, UPPER | LOWER) && is(b, i - 2, UPPER | LOWER);
    (!continues && !iban_like).then(|| skip_alnum(b, r))
}

/// Validates the candidate at digit `i`; returns where scanning resumes (past the digit
/// run, always > `i`) and the finding, if any.
#[inline(never)]
fn numeric(b: &[u8], i: usize) -> (usize, Option<Hit>) {
    let before = |k: usize| i.checked_sub(k);
    // Letters glued to the digits: IBAN, NINO, NIE, or a word/hash with digits in it.
    if alnum_before(b, before(1)) {
        match iban(b, i) {
            Some(Ok(hit)) => return (hit.2.end, Some(hit)),
            // IBAN-shaped with a wrong checksum: skip it whole, its digit groups are no phone.
            Some(Err(end)) => return (end.max(i + 1), None),
            None => {}
        }
        if let Some(hit) = nino(b, i).or_else(|| nie(b, i)) {
            return (hit.2.end, Some(hit));
        }
        return (skip_alnum(b, i).max(i + 1), None);
    }
    if let Some(hit) = nino(b, i).or_else(|| nie(b, i)) {
        return (hit.2.end, Some(hit));
    }
    let plus = b.get(i.wrapping_sub(1)) == Some(&b'+') && !alnum_before(b, before(2));
    let paren = i > 0 && b[i - 1] == b'(';
    let plus_paren = paren && i > 1 && b[i - 2] == b'+' && !alnum_before(b, before(3));
    let gr = groups(b, i, paren);
    let start = if plus_paren {
        i - 2
    } else if plus || paren {
        i - 1
    } else {
        i
    };
    let end = gr.end;
    // DNI: eight digits and the control letter.
    if gr.g == 1 && gr.n == 8 {
        let (letter_at, after) = match b.get(end) {
            Some(b'-' | b' ') => (end + 1, end + 2),
            _ => (end, end + 1),
        };
        if let Some(&letter) = b.get(letter_at)
            && letter.is_ascii_uppercase()
            && !is_alnum(b, after)
            && checksum::es_dni(None, gr.digits(), letter)
        {
            return (after, Some((PiiKind::NationalId, "es-dni", i..after)));
        }
    }
    if is_alnum(b, end) || b.get(end) == Some(&b'@') || gr.overflow {
        // Glued to a word ("12px", a hex hash) or part of an address or a long number.
        return (skip_alnum(b, end).max(i + 1), None);
    }
    let hit = classify_groups(b, &gr, start, i, plus || plus_paren);
    (end.max(i + 1), hit)
}

fn classify_groups(b: &[u8], gr: &Groups, start: usize, i: usize, plus: bool) -> Option<Hit> {
    let d = gr.digits();
    let n = gr.n;
    let lens = gr.lens();
    let end = gr.end;
    let bare = !plus && start == i;
    // Cards: 13-19 digits, one separator kind (space or dash) between groups of 3+.
    if bare
        && (13..=19).contains(&n)
        && gr.seps & !(SEP_SPACE | SEP_DASH) == 0
        && gr.single_sep()
        && (gr.g == 1 || gr.min_group() >= 3)
        && checksum::card_issuer(d)
        && checksum::luhn(d)
    {
        return Some((PiiKind::Card, "card", i..end));
    }
    if bare && n == 9 {
        // US SSN: 3-2-4 with dashes or spaces, or nine bare digits after "SSN".
        let formatted =
            lens == [3, 2, 4] && gr.single_sep() && gr.seps & !(SEP_SPACE | SEP_DASH) == 0;
        if checksum::us_ssn(d) && (formatted || (gr.g == 1 && keyword_before(b, i, SSN_WORDS))) {
            return Some((PiiKind::NationalId, "us-ssn", i..end));
        }
        // NL BSN: nine digits (or 4.2.3) after "BSN" or similar.
        let shaped = gr.g == 1 || (lens == [4, 2, 3] && gr.seps == SEP_DOT);
        if shaped && checksum::nl_bsn(d) && keyword_before(b, i, BSN_WORDS) {
            return Some((PiiKind::NationalId, "nl-bsn", i..end));
        }
    }
    // DE Steuer-IdNr: "12 345 678 901", or eleven bare digits after "Steuer-ID" and the like.
    if bare
        && n == 11
        && ((lens == [2, 3, 3, 3] && gr.seps == SEP_SPACE)
            || (gr.g == 1 && keyword_before(b, i, STEUER_WORDS)))
        && checksum::de_steuer_id(d)
    {
        return Some((PiiKind::NationalId, "de-steuer-id", i..end));
    }
    // FR NIR: 15 digits, bare, "1 85 05 78 006 084 91" or key apart.
    if bare
        && n == 15
        && (gr.g == 1
            || (gr.seps == SEP_SPACE && (lens == [1, 2, 2, 2, 3, 3, 2] || lens == [13, 2])))
        && checksum::fr_nir(d)
    {
        return Some((PiiKind::NationalId, "fr-nir", i..end));
    }
    phone(b, gr, start, plus).map(|scheme| (PiiKind::Phone, scheme, start..end))
}

/// Whether the groups read as a date, or a date and a time (`01.02.2024 10`: a second
/// separator kind); five groups of two with dots are a French phone number, not a date.
fn date_like(gr: &Groups) -> bool {
    let lens = gr.lens();
    gr.g >= 3
        && (gr.g == 3 || !gr.single_sep())
        && gr.seps & (SEP_DOT | SEP_SLASH | SEP_DASH) != 0
        && (matches!(lens[..3], [1 | 2, 1 | 2, 2 | 4] | [4, 1 | 2, 1 | 2]))
}

fn phone(b: &[u8], gr: &Groups, start: usize, plus: bool) -> Option<&'static str> {
    let d = gr.digits();
    let n = gr.n;
    let lens = gr.lens();
    if gr.unbalanced {
        return None;
    }
    if plus {
        return ((8..=15).contains(&n) && d[0] != 0).then_some("phone-e164");
    }
    // "00" international prefix and a country code, grouped.
    if d[0] == 0 && d.get(1) == Some(&0) {
        return ((10..=17).contains(&n) && d[2] != 0 && gr.g >= 2).then_some("phone-e164");
    }
    // North American: (NXX) NXX-XXXX, NXX-NXX-XXXX, NXX.NXX.XXXX, 1 NXX NXX XXXX.
    let nanp = |off: usize| d[off] >= 2 && d[off + 3] >= 2;
    if gr.seps & SEP_SLASH == 0
        && ((lens == [3, 3, 4] && nanp(0)) || (lens == [1, 3, 3, 4] && d[0] == 1 && nanp(1)))
        && (gr.single_sep() || gr.seps & SEP_PAREN != 0)
    {
        return Some("phone-nanp");
    }
    if date_like(gr) {
        return None;
    }
    // Trunk-prefixed national numbers (UK, DE, FR, NL, ...): 0 then 8-11 digits in groups.
    if d[0] == 0
        && (9..=12).contains(&n)
        && gr.g >= 2
        && gr.min_group() >= 2
        && (gr.single_sep() || gr.seps & SEP_PAREN != 0)
    {
        return Some("phone-national");
    }
    // Spanish-style nine digits without a trunk prefix: "612 34 56 78", "91 123 45 67".
    if n == 9 && d[0] >= 6 && gr.g >= 3 && gr.min_group() >= 2 && gr.seps == SEP_SPACE {
        return Some("phone-national");
    }
    // Any other 7-15 digits right after "phone", "tel", "call", ...
    if (7..=15).contains(&n)
        && (gr.g == 1 || gr.min_group() >= 2)
        && gr.single_sep()
        && keyword_before(b, start, PHONE_WORDS)
    {
        return Some("phone-context");
    }
    None
}

/// IBAN whose check digits start at `i` (the country code is the two letters before):
/// `Ok` when valid, `Err(end)` when IBAN-shaped (country, length) but the checksum fails.
fn iban(b: &[u8], i: usize) -> Option<Result<Hit, usize>> {
    let start = i.checked_sub(2)?;
    if alnum_before(b, start.checked_sub(1)) || !is_digit(b, i + 1) {
        return None;
    }
    let cc = [
        b[start].to_ascii_uppercase(),
        b[start + 1].to_ascii_uppercase(),
    ];
    if !is(b, start, UPPER | LOWER) || !is(b, start + 1, UPPER | LOWER) {
        return None;
    }
    let len = checksum::iban_length(cc)?;
    let mut chars = [0u8; 34];
    let mut n = 0;
    let mut j = start;
    while n < len {
        if is_alnum(b, j) {
            chars[n] = b[j].to_ascii_uppercase();
            n += 1;
            j += 1;
        } else if b.get(j) == Some(&b' ') && n > 0 && is_alnum(b, j + 1) {
            j += 1;
        } else {
            return None;
        }
    }
    if is_alnum(b, j) {
        return None;
    }
    if !checksum::iban_mod97(&chars[..n]) {
        return Some(Err(j));
    }
    Some(Ok((PiiKind::Iban, "iban", start..j)))
}

/// UK National Insurance number whose digits start at `i`: "AB123456C", "AB 12 34 56 C".
fn nino(b: &[u8], i: usize) -> Option<Hit> {
    let q = if b.get(i.wrapping_sub(1)) == Some(&b' ') {
        i - 1
    } else {
        i
    };
    let start = q.checked_sub(2)?;
    if !is(b, start, UPPER) || !is(b, start + 1, UPPER) || alnum_before(b, start.checked_sub(1)) {
        return None;
    }
    // Six digits, contiguous or in pairs.
    let mut j = i;
    let mut count = 0;
    while count < 6 {
        if is_digit(b, j) {
            count += 1;
            j += 1;
        } else if b.get(j) == Some(&b' ') && count % 2 == 0 && count > 0 && is_digit(b, j + 1) {
            j += 1;
        } else {
            return None;
        }
    }
    if b.get(j) == Some(&b' ') {
        j += 1;
    }
    let suffix = *b.get(j)?;
    j += 1;
    if is_alnum(b, j) || !checksum::gb_nino(b[start], b[start + 1], suffix) {
        return None;
    }
    Some((PiiKind::NationalId, "gb-nino", start..j))
}

/// Spanish NIE whose digits start at `i`: "X1234567L", "X-1234567-L".
fn nie(b: &[u8], i: usize) -> Option<Hit> {
    let p = if b.get(i.wrapping_sub(1)) == Some(&b'-') {
        i.checked_sub(2)?
    } else {
        i.checked_sub(1)?
    };
    let prefix = match b.get(p)? {
        b'X' => 0,
        b'Y' => 1,
        b'Z' => 2,
        _ => return None,
    };
    if alnum_before(b, p.checked_sub(1)) {
        return None;
    }
    let mut j = i;
    let mut d = [0u8; 7];
    while j - i < 7 {
        if !is_digit(b, j) {
            return None;
        }
        d[j - i] = b[j] - b'0';
        j += 1;
    }
    if matches!(b.get(j), Some(b'-' | b' ')) {
        j += 1;
    }
    let letter = *b.get(j)?;
    j += 1;
    if is_alnum(b, j) || !checksum::es_dni(Some(prefix), &d, letter) {
        return None;
    }
    Some((PiiKind::NationalId, "es-nie", p..j))
}

/// Every finding in `text`, in order: for tests and `kvroute explain`. Never log the text
/// behind a span.
pub fn pii_findings(text: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    scan(text, &PiiConfig::default(), |kind, scheme, span| {
        out.push(Finding { kind, scheme, span })
    });
    out
}
