//! vLLM's own prefix-cache block hash (`--prefix-caching-hash-algo sha256_cbor` or `sha256`),
//! so that the mock publishes the same `block_hashes` a real vLLM 0.33 would.
//!
//! ```text
//! NONE_HASH = sha256(enc("vllm-none-hash"))
//! digest_i  = sha256(enc((digest_{i-1} | NONE_HASH, tuple(block_tokens), extra_keys | None)))
//! event int = last 8 bytes of digest_i, big-endian
//! ```
//!
//! `enc` is canonical CBOR (`sha256_cbor`) or pickle protocol 5 (`sha256`, vLLM's default). Extra
//! keys are hashed tagged (`(("cache_salt", salt),)`) while events carry them bare. Pure code.

use sha2::{Digest, Sha256};

/// A full vLLM block digest (32 bytes); the parent input of the next block.
pub type BlockDigest = [u8; 32];

/// The hash function vLLM was started with (`--prefix-caching-hash-algo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HashAlgo {
    /// `sha256_cbor`: reproducible across Python versions.
    #[default]
    Sha256Cbor,
    /// `sha256`: pickle protocol 5 (vLLM's default algorithm).
    Sha256Pickle,
}

impl HashAlgo {
    /// Parses vLLM's flag value; the xxhash variants are not reproducible and are refused.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "sha256_cbor" => Some(Self::Sha256Cbor),
            "sha256" => Some(Self::Sha256Pickle),
            _ => None,
        }
    }

    /// The name vLLM uses (label `prefix_caching_hash_algo` of `vllm:cache_config_info`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256Cbor => "sha256_cbor",
            Self::Sha256Pickle => "sha256",
        }
    }
}

/// The seed digest a chain starts from when `PYTHONHASHSEED` is unset (vLLM >= 0.29).
pub fn none_hash(algo: HashAlgo) -> BlockDigest {
    let mut buf = Vec::with_capacity(32);
    match algo {
        HashAlgo::Sha256Cbor => cbor_text(&mut buf, "vllm-none-hash"),
        HashAlgo::Sha256Pickle => {
            // PROTO 5, FRAME, SHORT_BINUNICODE, MEMOIZE, STOP.
            let s = b"vllm-none-hash";
            let body_len = 2 + s.len() + 2;
            buf.extend_from_slice(&[0x80, 0x05, 0x95]);
            buf.extend_from_slice(&(body_len as u64).to_le_bytes());
            buf.push(0x8c);
            buf.push(s.len() as u8);
            buf.extend_from_slice(s);
            buf.extend_from_slice(&[0x94, 0x2e]);
        }
    }
    Sha256::digest(&buf).into()
}

/// The extra keys of one block, in vLLM's hashing order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtraKeys<'a> {
    /// A LoRA adapter name. vLLM hashes `("lora", name, path)`; the mock has no path and hashes
    /// `("lora", name)`, which keeps adapters apart but is not byte-equal to vLLM.
    pub lora_name: Option<&'a str>,
    /// The request's `cache_salt`; vLLM only applies it to the first block.
    pub cache_salt: Option<&'a str>,
}

impl ExtraKeys<'_> {
    fn is_empty(&self) -> bool {
        self.cache_salt.is_none() && self.lora_name.is_none()
    }
}

/// Digest of one full block.
pub fn block_digest(
    algo: HashAlgo,
    parent: &BlockDigest,
    tokens: &[u32],
    extra: &ExtraKeys<'_>,
    scratch: &mut Vec<u8>,
) -> BlockDigest {
    scratch.clear();
    match algo {
        HashAlgo::Sha256Cbor => encode_cbor(scratch, parent, tokens, extra),
        HashAlgo::Sha256Pickle => encode_pickle(scratch, parent, tokens, extra),
    }
    Sha256::digest(&scratch[..]).into()
}

/// The integer form published in events: the digest's last 8 bytes read big-endian.
pub fn digest_to_u64(d: &BlockDigest) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[24..]);
    u64::from_be_bytes(b)
}

fn cbor_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    if n < 24 {
        out.push(m | n as u8);
    } else if n < 0x100 {
        out.extend_from_slice(&[m | 24, n as u8]);
    } else if n < 0x1_0000 {
        out.push(m | 25);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n < 0x1_0000_0000 {
        out.push(m | 26);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

fn cbor_text(out: &mut Vec<u8>, s: &str) {
    cbor_head(out, 3, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn encode_cbor(out: &mut Vec<u8>, parent: &BlockDigest, tokens: &[u32], extra: &ExtraKeys<'_>) {
    cbor_head(out, 4, 3);
    cbor_head(out, 2, 32);
    out.extend_from_slice(parent);
    cbor_head(out, 4, tokens.len() as u64);
    for &t in tokens {
        cbor_head(out, 0, u64::from(t));
    }
    if extra.is_empty() {
        out.push(0xf6);
        return;
    }
    // (("lora", name), ("cache_salt", salt)) with absent keys left out.
    let n = u64::from(extra.lora_name.is_some()) + u64::from(extra.cache_salt.is_some());
    cbor_head(out, 4, n);
    for (tag, v) in [("lora", extra.lora_name), ("cache_salt", extra.cache_salt)] {
        if let Some(v) = v {
            cbor_head(out, 4, 2);
            cbor_text(out, tag);
            cbor_text(out, v);
        }
    }
}

fn pickle_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    if b.len() < 256 {
        out.push(0x8c); // SHORT_BINUNICODE
        out.push(b.len() as u8);
    } else {
        out.push(0x8d); // BINUNICODE8
        out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    }
    out.extend_from_slice(b);
    out.push(0x94); // MEMOIZE
}

fn encode_pickle(out: &mut Vec<u8>, parent: &BlockDigest, tokens: &[u32], extra: &ExtraKeys<'_>) {
    let mut body = Vec::with_capacity(48 + tokens.len() * 3);
    body.extend_from_slice(&[0x43, 0x20]); // SHORT_BINBYTES 32
    body.extend_from_slice(parent);
    body.extend_from_slice(&[0x94, 0x28]); // MEMOIZE, MARK
    for &t in tokens {
        if t < 0x100 {
            body.extend_from_slice(&[0x4b, t as u8]);
        } else if t < 0x1_0000 {
            body.push(0x4d);
            body.extend_from_slice(&(t as u16).to_le_bytes());
        } else {
            body.push(0x4a);
            body.extend_from_slice(&(t as i32).to_le_bytes());
        }
    }
    body.extend_from_slice(&[0x74, 0x94]); // TUPLE, MEMOIZE
    if extra.is_empty() {
        body.push(0x4e); // NONE
    } else {
        let mut inner = Vec::new();
        let mut n = 0;
        for (tag, v) in [("lora", extra.lora_name), ("cache_salt", extra.cache_salt)] {
            if let Some(v) = v {
                pickle_str(&mut inner, tag);
                pickle_str(&mut inner, v);
                inner.extend_from_slice(&[0x86, 0x94]); // TUPLE2, MEMOIZE
                n += 1;
            }
        }
        if n == 1 {
            body.extend_from_slice(&inner);
            body.extend_from_slice(&[0x85, 0x94]); // TUPLE1, MEMOIZE
        } else {
            body.push(0x28); // MARK
            body.extend_from_slice(&inner);
            body.extend_from_slice(&[0x74, 0x94]); // TUPLE, MEMOIZE
        }
    }
    body.extend_from_slice(&[0x87, 0x94]); // TUPLE3, MEMOIZE
    out.extend_from_slice(&[0x80, 0x05, 0x95]);
    out.extend_from_slice(&((body.len() + 1) as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out.push(0x2e); // STOP
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(algo: HashAlgo, blocks: &[&[u32]], salt: Option<&str>) -> Vec<u64> {
        let mut parent = none_hash(algo);
        let mut scratch = Vec::new();
        let mut out = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            let extra = ExtraKeys {
                lora_name: None,
                cache_salt: if i == 0 { salt } else { None },
            };
            parent = block_digest(algo, &parent, b, &extra, &mut scratch);
            out.push(digest_to_u64(&parent));
        }
        out
    }

    const QWEN_BLOCK: [u32; 16] = [
        151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 3838,
        374,
    ];

    #[test]
    fn sha256_cbor_golden_values_from_vllm() {
        let a: Vec<u32> = (1..=16).collect();
        let b: Vec<u32> = (17..=32).collect();
        assert_eq!(
            chain(HashAlgo::Sha256Cbor, &[&a, &b], None),
            vec![8866452693264111234, 807986237951177663]
        );
        assert_eq!(
            chain(HashAlgo::Sha256Cbor, &[&QWEN_BLOCK], None),
            vec![13502871417970210615]
        );
        assert_eq!(
            chain(HashAlgo::Sha256Cbor, &[&QWEN_BLOCK], Some("tenant-a")),
            vec![6790731964024935453]
        );
    }

    #[test]
    fn sha256_pickle_golden_values_from_vllm() {
        assert_eq!(
            chain(HashAlgo::Sha256Pickle, &[&QWEN_BLOCK], None),
            vec![16779036554551648730]
        );
        assert_eq!(
            hex(&none_hash(HashAlgo::Sha256Pickle)),
            "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
        );
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
