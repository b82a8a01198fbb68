//! API keys, stored hashed: a Secret's data key names a tenant, its value holds one line
//! `sha256:<64 hex>` per accepted key (two lines while a key rotates).
//!
//! ```text
//! Secret file text --parse_key_lines--> [digest]   (a bad line: the whole file is refused)
//! files of the pool's Secrets --KeyTable::insert(tenant, digests)
//! presented key --sha256--> KeyTable::lookup (constant time per entry, every entry compared)
//!     --> Some(tenant) | None
//! ```
//!
//! Keys are compared by digest so the router never holds them in clear, and with
//! [`subtle::ConstantTimeEq`] over every entry so timing tells nothing about how much of a
//! guess matched.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A SHA-256 digest of a key.
pub type KeyDigest = [u8; 32];

/// The prefix of keys made by `kvroute tenant-key new` (any key string works).
pub const KEY_PREFIX: &str = "kvr_";

/// The digest of a presented key.
pub fn digest(key: &str) -> KeyDigest {
    Sha256::digest(key.as_bytes()).into()
}

/// The Secret line for `key`: `sha256:<64 lowercase hex>`.
pub fn secret_line(key: &str) -> String {
    format!("sha256:{}", hex(&digest(key)))
}

/// A fresh random key: [`KEY_PREFIX`] and 64 hex characters (256 bits).
pub fn new_key() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("{KEY_PREFIX}{}", hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Why a key file was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyFileError {
    /// A line is not `sha256:<64 hex>`.
    #[error("line {0} is not `sha256:<64 hex>`")]
    BadLine(usize),
    /// No key at all.
    #[error("no key")]
    Empty,
    /// Too many lines.
    #[error("more than {MAX_KEYS_PER_TENANT} keys")]
    TooMany,
}

/// Keys one tenant may hold at once (rotation overlap).
pub const MAX_KEYS_PER_TENANT: usize = 16;

/// Parses a Secret value: one `sha256:<64 hex>` per line, blank lines ignored.
pub fn parse_key_lines(text: &str) -> Result<Vec<KeyDigest>, KeyFileError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let d = line
            .strip_prefix("sha256:")
            .and_then(parse_hex32)
            .ok_or(KeyFileError::BadLine(i + 1))?;
        if out.len() == MAX_KEYS_PER_TENANT {
            return Err(KeyFileError::TooMany);
        }
        out.push(d);
    }
    if out.is_empty() {
        return Err(KeyFileError::Empty);
    }
    Ok(out)
}

fn parse_hex32(s: &str) -> Option<KeyDigest> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in s.as_bytes().chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}

/// The keys of some Secrets: (tenant, digest) entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyTable {
    entries: Vec<(String, KeyDigest)>,
}

impl KeyTable {
    /// Adds `tenant`'s keys.
    pub fn insert(&mut self, tenant: &str, digests: &[KeyDigest]) {
        for d in digests {
            self.entries.push((tenant.to_string(), *d));
        }
    }

    /// Adds every entry of `other`.
    pub fn extend(&mut self, other: &KeyTable) {
        self.entries.extend(other.entries.iter().cloned());
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tenant holding `key`. Every entry is compared in constant time, and the loop
    /// does not stop at a match.
    pub fn lookup(&self, key: &str) -> Option<&str> {
        let d = digest(key);
        let mut found: Option<&str> = None;
        for (tenant, e) in &self.entries {
            if bool::from(e.ct_eq(&d)) && found.is_none() {
                found = Some(tenant);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_lines_round_trip() {
        let key = new_key();
        assert!(key.starts_with(KEY_PREFIX) && key.len() == KEY_PREFIX.len() + 64);
        let line = secret_line(&key);
        assert_eq!(parse_key_lines(&line), Ok(vec![digest(&key)]));
        // Known answer: sha256("abc").
        assert_eq!(
            secret_line("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn bad_files_are_refused() {
        assert_eq!(parse_key_lines("\n  \n"), Err(KeyFileError::Empty));
        assert_eq!(
            parse_key_lines(&format!("{}\nplain-key\n", secret_line("a"))),
            Err(KeyFileError::BadLine(2))
        );
        assert_eq!(parse_key_lines("sha256:zz"), Err(KeyFileError::BadLine(1)));
        let many = (0..17)
            .map(|i| secret_line(&i.to_string()))
            .collect::<Vec<_>>();
        assert_eq!(
            parse_key_lines(&many.join("\n")),
            Err(KeyFileError::TooMany)
        );
    }

    #[test]
    fn lookup_matches_only_the_right_key_and_both_keys_during_rotation() {
        let mut t = KeyTable::default();
        let (old, new, other) = (new_key(), new_key(), new_key());
        let text = format!("{}\n\n{}\n", secret_line(&old), secret_line(&new));
        t.insert("team-a", &parse_key_lines(&text).expect("parses"));
        t.insert("team-b", &[digest(&other)]);
        assert_eq!(t.lookup(&old), Some("team-a"));
        assert_eq!(t.lookup(&new), Some("team-a"));
        assert_eq!(t.lookup(&other), Some("team-b"));
        assert_eq!(t.lookup("kvr_guess"), None);
        assert_eq!(t.lookup(""), None);
        // A digest line is not a key.
        assert_eq!(t.lookup(&secret_line(&old)), None);
    }
}
