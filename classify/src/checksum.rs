//! Check digits and structural rules of the identifiers the PII labeller recognises. Each
//! function takes the identifier's characters already stripped of separators (`digits` are
//! values 0-9, not ASCII) and answers whether it is well formed; none allocates.
//!
//! ```text
//! card      Luhn (ISO/IEC 7812) + issuer prefix and length
//! IBAN      ISO 13616 / ISO 7064 MOD 97-10 == 1 + per-country length
//! US SSN    area 001-899 except 666, group 01-99, serial 0001-9999
//! NL BSN    "11-proof": 9*d1 + 8*d2 + ... + 2*d8 - d9 == 0 (mod 11)
//! ES DNI    letter = "TRWAGMYFPDXBNJZSQVHLCKE"[number mod 23]; NIE: X/Y/Z -> 0/1/2 first
//! GB NINO   letter pairs and suffix (no check digit exists)
//! FR NIR    key = 97 - (first 13 digits mod 97), sex and month fields
//! DE IdNr   ISO 7064 MOD 11,10 + the digit-repetition rule (one digit twice or thrice)
//! ```

/// Luhn (mod 10) over digit values, the last one being the check digit.
pub fn luhn(digits: &[u8]) -> bool {
    let mut sum = 0u32;
    for (k, &d) in digits.iter().rev().enumerate() {
        let mut v = u32::from(d);
        if k % 2 == 1 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    !digits.is_empty() && sum.is_multiple_of(10)
}

/// The leading `n` digits as a number (n <= 9).
fn prefix(digits: &[u8], n: usize) -> u32 {
    digits
        .iter()
        .take(n)
        .fold(0u32, |acc, &d| acc * 10 + u32::from(d))
}

/// Whether a card number of this length starts with a prefix some network issues at that
/// length (Visa, Mastercard, American Express, Discover, JCB, Diners Club, UnionPay, Maestro).
pub fn card_issuer(digits: &[u8]) -> bool {
    let len = digits.len();
    if !(13..=19).contains(&len) {
        return false;
    }
    let p1 = prefix(digits, 1);
    let p2 = prefix(digits, 2);
    let p3 = prefix(digits, 3);
    let p4 = prefix(digits, 4);
    match p1 {
        4 => matches!(len, 13 | 16 | 19),
        2 => (2221..=2720).contains(&p4) && len == 16,
        5 => match p2 {
            51..=55 => len == 16,
            50 | 56..=58 => true, // Maestro
            _ => false,
        },
        3 => match p2 {
            34 | 37 => len == 15,
            36 | 38 | 39 => len >= 14,
            30 => (300..=305).contains(&p3) && len >= 14,
            35 => (3528..=3589).contains(&p4) && len >= 16,
            _ => false,
        },
        6 => {
            (p4 == 6011 || p2 == 65 || (644..=649).contains(&p3) || p2 == 62 || p2 == 67)
                && len >= 16
        }
        _ => false,
    }
}

/// ISO 13616 IBAN length for a country code (upper-case ASCII), or `None` for a country
/// without IBANs in the registry.
pub fn iban_length(cc: [u8; 2]) -> Option<usize> {
    let len = match &cc {
        b"AD" => 24,
        b"AE" => 23,
        b"AL" => 28,
        b"AT" => 20,
        b"AZ" => 28,
        b"BA" => 20,
        b"BE" => 16,
        b"BG" => 22,
        b"BH" => 22,
        b"BR" => 29,
        b"BY" => 28,
        b"CH" => 21,
        b"CR" => 22,
        b"CY" => 28,
        b"CZ" => 24,
        b"DE" => 22,
        b"DK" => 18,
        b"DO" => 28,
        b"EE" => 20,
        b"EG" => 29,
        b"ES" => 24,
        b"FI" => 18,
        b"FO" => 18,
        b"FR" => 27,
        b"GB" => 22,
        b"GE" => 22,
        b"GI" => 23,
        b"GL" => 18,
        b"GR" => 27,
        b"GT" => 28,
        b"HR" => 21,
        b"HU" => 28,
        b"IE" => 22,
        b"IL" => 23,
        b"IQ" => 23,
        b"IS" => 26,
        b"IT" => 27,
        b"JO" => 30,
        b"KW" => 30,
        b"KZ" => 20,
        b"LB" => 28,
        b"LC" => 32,
        b"LI" => 21,
        b"LT" => 20,
        b"LU" => 20,
        b"LV" => 21,
        b"MC" => 27,
        b"MD" => 24,
        b"ME" => 22,
        b"MK" => 19,
        b"MR" => 27,
        b"MT" => 31,
        b"MU" => 30,
        b"NL" => 18,
        b"NO" => 15,
        b"PK" => 24,
        b"PL" => 28,
        b"PS" => 29,
        b"PT" => 25,
        b"QA" => 29,
        b"RO" => 24,
        b"RS" => 22,
        b"SA" => 24,
        b"SC" => 31,
        b"SE" => 24,
        b"SI" => 19,
        b"SK" => 24,
        b"SM" => 27,
        b"ST" => 25,
        b"SV" => 28,
        b"TL" => 23,
        b"TN" => 24,
        b"TR" => 26,
        b"UA" => 29,
        b"VA" => 22,
        b"VG" => 24,
        b"XK" => 20,
        _ => return None,
    };
    Some(len)
}

/// Value of an IBAN character (0-9, A-Z as 10-35), for upper-case ASCII alphanumerics.
fn iban_value(c: u8) -> u32 {
    if c.is_ascii_digit() {
        u32::from(c - b'0')
    } else {
        u32::from(c - b'A') + 10
    }
}

/// ISO 7064 MOD 97-10 over an IBAN's characters (upper-case ASCII alphanumerics, country
/// code first): valid when the rearranged number is 1 mod 97.
pub fn iban_mod97(chars: &[u8]) -> bool {
    if chars.len() < 5
        || !chars
            .iter()
            .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
    {
        return false;
    }
    let mut r = 0u32;
    for &c in chars[4..].iter().chain(&chars[..4]) {
        let v = iban_value(c);
        r = if v >= 10 {
            (r * 100 + v) % 97
        } else {
            (r * 10 + v) % 97
        };
    }
    r == 1
}

/// US Social Security Number rules over 9 digit values: area 001-899 except 666, group
/// 01-99, serial 0001-9999.
pub fn us_ssn(d: &[u8]) -> bool {
    if d.len() != 9 {
        return false;
    }
    let area = prefix(d, 3);
    let group = prefix(&d[3..], 2);
    let serial = prefix(&d[5..], 4);
    area != 0 && area != 666 && area < 900 && group != 0 && serial != 0
}

/// Dutch BSN 11-proof over 9 digit values (not all zero).
pub fn nl_bsn(d: &[u8]) -> bool {
    if d.len() != 9 || d.iter().all(|&x| x == 0) {
        return false;
    }
    let mut sum = 0i32;
    for (k, &x) in d.iter().enumerate() {
        let w = if k == 8 { -1 } else { 9 - k as i32 };
        sum += w * i32::from(x);
    }
    sum.rem_euclid(11) == 0
}

/// The DNI/NIE control letters, indexed by number mod 23.
const DNI_LETTERS: &[u8; 23] = b"TRWAGMYFPDXBNJZSQVHLCKE";

/// Spanish DNI (8 digit values) or NIE (`nie_prefix` 0/1/2 for X/Y/Z and 7 digit values):
/// whether `letter` (upper-case ASCII) is the control letter.
pub fn es_dni(nie_prefix: Option<u8>, d: &[u8], letter: u8) -> bool {
    let expected_len = if nie_prefix.is_some() { 7 } else { 8 };
    if d.len() != expected_len {
        return false;
    }
    let mut n = u32::from(nie_prefix.unwrap_or(0));
    for &x in d {
        n = n * 10 + u32::from(x);
    }
    DNI_LETTERS[(n % 23) as usize] == letter
}

/// UK National Insurance number letters: the two prefix letters and the suffix (all
/// upper-case ASCII) follow HMRC's allocation rules.
pub fn gb_nino(p1: u8, p2: u8, suffix: u8) -> bool {
    let first_ok = p1.is_ascii_uppercase() && !b"DFIQUV".contains(&p1);
    let second_ok = p2.is_ascii_uppercase() && !b"DFIOQUV".contains(&p2);
    let pair_ok = !matches!(
        &[p1, p2],
        b"BG" | b"GB" | b"KN" | b"NK" | b"NT" | b"TN" | b"ZZ"
    );
    first_ok && second_ok && pair_ok && (b'A'..=b'D').contains(&suffix)
}

/// French NIR (numéro de sécurité sociale) over 15 digit values: sex 1/2 (7/8 provisional),
/// month 01-12 or 20-42 / 50-99 (unknown-month codes), key = 97 - (first 13 mod 97).
/// Corsican departments (2A/2B) are not digits and are not recognised.
pub fn fr_nir(d: &[u8]) -> bool {
    if d.len() != 15 || !matches!(d[0], 1 | 2 | 7 | 8) {
        return false;
    }
    let month = prefix(&d[3..], 2);
    if !(matches!(month, 1..=12 | 20..=42 | 50..=99)) {
        return false;
    }
    let mut r = 0u64;
    for &x in &d[..13] {
        r = (r * 10 + u64::from(x)) % 97;
    }
    let key = u64::from(prefix(&d[13..], 2));
    key == 97 - r
}

/// German tax identification number (Steuer-IdNr) over 11 digit values: no leading zero;
/// in the first ten digits exactly one digit occurs twice or three times (three never all
/// adjacent) and the rest at most once; ISO 7064 MOD 11,10 check digit.
pub fn de_steuer_id(d: &[u8]) -> bool {
    if d.len() != 11 || d[0] == 0 {
        return false;
    }
    let mut count = [0u8; 10];
    for &x in &d[..10] {
        count[usize::from(x)] += 1;
    }
    let repeated = count.iter().filter(|&&c| c >= 2).count();
    let most = count.iter().copied().max().unwrap_or(0);
    if repeated != 1 || most > 3 {
        return false;
    }
    if most == 3 && d[..10].windows(3).any(|w| w[0] == w[1] && w[1] == w[2]) {
        return false;
    }
    let mut product = 10u32;
    for &x in &d[..10] {
        let mut sum = (u32::from(x) + product) % 10;
        if sum == 0 {
            sum = 10;
        }
        product = (sum * 2) % 11;
    }
    let check = (11 - product) % 10;
    check == u32::from(d[10])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digits(s: &str) -> Vec<u8> {
        s.bytes()
            .filter(u8::is_ascii_digit)
            .map(|c| c - b'0')
            .collect()
    }

    #[test]
    fn luhn_and_issuers() {
        assert!(luhn(&digits("4111111111111111")));
        assert!(!luhn(&digits("4111111111111112")));
        assert!(luhn(&digits("378282246310005")));
        assert!(card_issuer(&digits("378282246310005")));
        assert!(card_issuer(&digits("5555555555554444")));
        assert!(card_issuer(&digits("2223003122003222")));
        assert!(card_issuer(&digits("6011111111111117")));
        assert!(card_issuer(&digits("3530111333300000")));
        assert!(!card_issuer(&digits("9780306406157000")));
        assert!(!card_issuer(&digits("1234567812345670")));
        // Amex prefix at a Visa length.
        assert!(!card_issuer(&digits("3782822463100051")));
    }

    #[test]
    fn iban() {
        assert!(iban_mod97(b"GB82WEST12345698765432"));
        assert!(iban_mod97(b"DE89370400440532013000"));
        assert!(iban_mod97(b"NL91ABNA0417164300"));
        assert!(!iban_mod97(b"NL91ABNA0417164301"));
        assert!(!iban_mod97(b"GB82west12345698765432"));
        assert_eq!(iban_length(*b"NL"), Some(18));
        assert_eq!(iban_length(*b"US"), None);
    }

    #[test]
    fn national_ids() {
        assert!(us_ssn(&digits("123-45-6789")));
        assert!(!us_ssn(&digits("666-45-6789")));
        assert!(!us_ssn(&digits("912-45-6789")));
        assert!(!us_ssn(&digits("123-00-6789")));
        assert!(!us_ssn(&digits("123-45-0000")));
        assert!(nl_bsn(&digits("111222333")));
        assert!(nl_bsn(&digits("123456782")));
        assert!(!nl_bsn(&digits("123456789")));
        assert!(es_dni(None, &digits("12345678"), b'Z'));
        assert!(!es_dni(None, &digits("12345678"), b'A'));
        assert!(es_dni(Some(0), &digits("1234567"), b'L'));
        assert!(gb_nino(b'A', b'B', b'C'));
        assert!(!gb_nino(b'G', b'B', b'A'));
        assert!(!gb_nino(b'A', b'B', b'E'));
        assert!(!gb_nino(b'D', b'A', b'A'));
        // Key 97 - (1850578006084 mod 97) = 91.
        assert!(fr_nir(&digits("1 85 05 78 006 084 91")));
        assert!(!fr_nir(&digits("1 85 05 78 006 084 92")));
        assert!(!fr_nir(&digits("3 85 05 78 006 084 91")));
        assert!(de_steuer_id(&digits("86095742719")));
        assert!(!de_steuer_id(&digits("86095742718")));
        // Every first-ten digit distinct: not an IdNr.
        assert!(!de_steuer_id(&digits("12345678903")));
    }
}
