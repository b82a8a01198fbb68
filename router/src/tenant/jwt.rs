//! JWT verification (pure): RS256 and ES256 against a JWKS, with `iss`, `aud`, `exp` and `nbf`
//! checked and the tenant read from a claim. Signatures are checked with `ring`.
//!
//! ```text
//! JWKS JSON --parse_jwks (≤ 64 KiB, ≤ 32 keys; RSA and EC P-256 signing keys)--> Jwks
//! token "h.p.s" --header: alg RS256|ES256 (none, HS*, others refused), kid
//!     --key by kid (or each key of the alg's type without one)--> signature over "h.p"
//!     --claims: iss == issuer, aud ∋ an audience, exp/nbf ± leeway--> tenant claim
//! ```
//!
//! Every refusal is a [`JwtError`] whose label is a fixed metric label; clients only learn
//! that the token is not valid.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::Value;

/// Largest JWKS document read.
pub const MAX_JWKS_BYTES: usize = 64 << 10;
/// Keys kept from one JWKS.
pub const MAX_JWKS_KEYS: usize = 32;
/// Largest token accepted.
pub const MAX_TOKEN_BYTES: usize = 16 << 10;
/// Clock skew allowed on `exp` and `nbf`, seconds.
pub const LEEWAY_S: u64 = 30;

/// A public signing key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum KeyMaterial {
    /// RSA modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// An uncompressed P-256 point (0x04 || x || y).
    P256 { point: Vec<u8> },
}

/// One usable key of a JWKS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Jwk {
    kid: Option<String>,
    key: KeyMaterial,
}

/// The usable keys of a JWKS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Jwks {
    keys: Vec<Jwk>,
}

impl Jwks {
    /// Number of usable keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// No usable key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Why a JWKS document was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JwksError {
    /// Over [`MAX_JWKS_BYTES`].
    #[error("the JWKS is larger than {MAX_JWKS_BYTES} bytes")]
    TooLarge,
    /// Not a JSON object with a `keys` array.
    #[error("the JWKS is not a JSON object with a `keys` array")]
    Malformed,
    /// No RS256 or ES256 signing key in it.
    #[error("the JWKS has no RSA or P-256 signing key")]
    NoUsableKey,
}

impl JwksError {
    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            JwksError::TooLarge => "jwks_too_large",
            JwksError::Malformed => "jwks_malformed",
            JwksError::NoUsableKey => "jwks_no_usable_key",
        }
    }
}

fn b64(v: Option<&Value>) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD
        .decode(v?.as_str()?.trim_end_matches('='))
        .ok()
}

fn parse_key(k: &Value) -> Option<Jwk> {
    let str_field = |name: &str| k.get(name).and_then(Value::as_str);
    if str_field("use").is_some_and(|u| u != "sig") {
        return None;
    }
    let key = match (str_field("kty")?, str_field("alg")) {
        ("RSA", None | Some("RS256")) => KeyMaterial::Rsa {
            n: b64(k.get("n")).filter(|n| !n.is_empty())?,
            e: b64(k.get("e")).filter(|e| !e.is_empty())?,
        },
        ("EC", None | Some("ES256")) if str_field("crv") == Some("P-256") => {
            let (x, y) = (b64(k.get("x"))?, b64(k.get("y"))?);
            if x.len() != 32 || y.len() != 32 {
                return None;
            }
            let mut point = Vec::with_capacity(65);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            KeyMaterial::P256 { point }
        }
        _ => return None,
    };
    Some(Jwk {
        kid: str_field("kid").map(str::to_owned),
        key,
    })
}

/// Parses a JWKS, keeping its RSA and P-256 signing keys (at most [`MAX_JWKS_KEYS`]; other
/// keys are skipped).
pub fn parse_jwks(bytes: &[u8]) -> Result<Jwks, JwksError> {
    if bytes.len() > MAX_JWKS_BYTES {
        return Err(JwksError::TooLarge);
    }
    let doc: Value = serde_json::from_slice(bytes).map_err(|_| JwksError::Malformed)?;
    let keys = doc
        .get("keys")
        .and_then(Value::as_array)
        .ok_or(JwksError::Malformed)?;
    let keys: Vec<Jwk> = keys
        .iter()
        .filter_map(parse_key)
        .take(MAX_JWKS_KEYS)
        .collect();
    if keys.is_empty() {
        return Err(JwksError::NoUsableKey);
    }
    Ok(Jwks { keys })
}

/// What a token must satisfy.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JwtRules {
    /// Required `iss`.
    pub issuer: String,
    /// Accepted `aud` values.
    pub audiences: Vec<String>,
    /// The claim naming the tenant.
    pub tenant_claim: String,
}

/// Why a token was refused. `label()` is the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Not three base64url parts with JSON header and claims.
    #[error("malformed token")]
    Malformed,
    /// `alg` is not RS256 or ES256 (`none` and HS* included).
    #[error("unsupported algorithm")]
    UnsupportedAlg,
    /// No key with the token's `kid` (or of its type).
    #[error("unknown key id")]
    UnknownKid,
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// `exp` is past (or missing).
    #[error("expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("not yet valid")]
    NotYetValid,
    /// `iss` differs.
    #[error("wrong issuer")]
    WrongIssuer,
    /// `aud` names none of the audiences.
    #[error("wrong audience")]
    WrongAudience,
    /// The tenant claim is missing or not a tenant name.
    #[error("no valid tenant claim")]
    BadTenant,
}

impl JwtError {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            JwtError::Malformed => "malformed",
            JwtError::UnsupportedAlg => "unsupported_alg",
            JwtError::UnknownKid => "unknown_kid",
            JwtError::BadSignature => "bad_signature",
            JwtError::Expired => "expired",
            JwtError::NotYetValid => "not_yet_valid",
            JwtError::WrongIssuer => "wrong_issuer",
            JwtError::WrongAudience => "wrong_audience",
            JwtError::BadTenant => "bad_tenant",
        }
    }
}

/// Does `token` look like a JWT (three dot-separated parts)? Used to tell a bearer JWT from
/// a bearer API key.
pub fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3 && token.starts_with("ey")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Alg {
    Rs256,
    Es256,
}

fn decode_json(part: &str) -> Result<Value, JwtError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| JwtError::Malformed)?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| JwtError::Malformed)?;
    if v.is_object() {
        Ok(v)
    } else {
        Err(JwtError::Malformed)
    }
}

fn check_signature(alg: Alg, key: &KeyMaterial, msg: &[u8], sig: &[u8]) -> bool {
    match (alg, key) {
        (Alg::Rs256, KeyMaterial::Rsa { n, e }) => RsaPublicKeyComponents { n, e }
            .verify(&signature::RSA_PKCS1_2048_8192_SHA256, msg, sig)
            .is_ok(),
        (Alg::Es256, KeyMaterial::P256 { point }) => {
            UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(msg, sig)
                .is_ok()
        }
        _ => false,
    }
}

fn fits(alg: Alg, key: &KeyMaterial) -> bool {
    matches!(
        (alg, key),
        (Alg::Rs256, KeyMaterial::Rsa { .. }) | (Alg::Es256, KeyMaterial::P256 { .. })
    )
}

/// Verifies `token` against `jwks` and `rules` at `now_unix` (seconds); returns the tenant.
pub fn verify(
    token: &str,
    jwks: &Jwks,
    rules: &JwtRules,
    now_unix: u64,
) -> Result<String, JwtError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(JwtError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed);
    };
    let header = decode_json(h)?;
    let alg = match header.get("alg").and_then(Value::as_str) {
        Some("RS256") => Alg::Rs256,
        Some("ES256") => Alg::Es256,
        Some(_) => return Err(JwtError::UnsupportedAlg),
        None => return Err(JwtError::Malformed),
    };
    let sig = URL_SAFE_NO_PAD.decode(s).map_err(|_| JwtError::Malformed)?;
    let msg = &token.as_bytes()[..h.len() + 1 + p.len()];
    let kid = header.get("kid").and_then(Value::as_str);
    let mut candidates = jwks
        .keys
        .iter()
        .filter(|k| fits(alg, &k.key))
        .filter(|k| kid.is_none() || k.kid.as_deref() == kid)
        .peekable();
    if candidates.peek().is_none() {
        return Err(JwtError::UnknownKid);
    }
    if !candidates.any(|k| check_signature(alg, &k.key, msg, &sig)) {
        return Err(JwtError::BadSignature);
    }
    let claims = decode_json(p)?;
    let num = |name: &str| claims.get(name).and_then(Value::as_u64);
    match num("exp") {
        Some(exp) if exp.saturating_add(LEEWAY_S) > now_unix => {}
        _ => return Err(JwtError::Expired),
    }
    if num("nbf").is_some_and(|nbf| nbf > now_unix.saturating_add(LEEWAY_S)) {
        return Err(JwtError::NotYetValid);
    }
    if claims.get("iss").and_then(Value::as_str) != Some(rules.issuer.as_str()) {
        return Err(JwtError::WrongIssuer);
    }
    let aud_ok = match claims.get("aud") {
        Some(Value::String(a)) => rules.audiences.iter().any(|x| x == a),
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(Value::as_str)
            .any(|a| rules.audiences.iter().any(|x| x == a)),
        _ => false,
    };
    if !aud_ok {
        return Err(JwtError::WrongAudience);
    }
    claims
        .get(&rules.tenant_claim)
        .and_then(Value::as_str)
        .filter(|t| super::valid_tenant(t))
        .map(str::to_owned)
        .ok_or(JwtError::BadTenant)
}

/// Test keys and token signing, shared with the integration tests (router/tests/support/).
#[cfg(test)]
#[path = "../../tests/support/jwt_keys.rs"]
pub mod testing;

#[cfg(test)]
mod tests {
    use super::testing::{TestKey, jwks_of};
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use serde_json::json;

    const NOW: u64 = 1_800_000_000;

    fn rules() -> JwtRules {
        JwtRules {
            issuer: "https://idp.example".into(),
            audiences: vec!["kvroute".into(), "other".into()],
            tenant_claim: "tenant".into(),
        }
    }

    fn claims() -> Value {
        json!({"iss": "https://idp.example", "aud": "kvroute", "exp": NOW + 60, "nbf": NOW - 5, "tenant": "team-a"})
    }

    fn with(mut c: Value, k: &str, v: Value) -> Value {
        c[k] = v;
        c
    }

    #[test]
    fn good_tokens_of_both_algorithms() {
        let (rsa, ec) = (TestKey::rsa("r1"), TestKey::ec("e1"));
        let jwks = parse_jwks(jwks_of(&[&rsa, &ec]).as_bytes()).expect("jwks");
        assert_eq!(jwks.len(), 2);
        for key in [&rsa, &ec] {
            let t = key.sign(json!({"typ": "JWT"}), &claims());
            assert!(looks_like_jwt(&t));
            assert_eq!(verify(&t, &jwks, &rules(), NOW), Ok("team-a".into()));
        }
        // `aud` as a list naming one accepted audience; no kid: every key of the type is tried.
        let t = ec.sign(
            json!({"kid": null}),
            &with(claims(), "aud", json!(["x", "other"])),
        );
        assert_eq!(verify(&t, &jwks, &rules(), NOW), Ok("team-a".into()));
    }

    #[test]
    fn claims_are_checked() {
        let key = TestKey::ec("e1");
        let jwks = parse_jwks(jwks_of(&[&key]).as_bytes()).expect("jwks");
        let cases = [
            (
                with(claims(), "exp", json!(NOW - LEEWAY_S - 1)),
                JwtError::Expired,
            ),
            (with(claims(), "exp", Value::Null), JwtError::Expired),
            (
                with(claims(), "nbf", json!(NOW + LEEWAY_S + 60)),
                JwtError::NotYetValid,
            ),
            (
                with(claims(), "iss", json!("https://evil")),
                JwtError::WrongIssuer,
            ),
            (
                with(claims(), "aud", json!("nobody")),
                JwtError::WrongAudience,
            ),
            (
                with(claims(), "aud", json!(["a", "b"])),
                JwtError::WrongAudience,
            ),
            (
                with(claims(), "tenant", json!("Team A")),
                JwtError::BadTenant,
            ),
            (with(claims(), "tenant", json!(7)), JwtError::BadTenant),
        ];
        for (c, want) in cases {
            let t = key.sign(json!({}), &c);
            assert_eq!(verify(&t, &jwks, &rules(), NOW), Err(want), "{c}");
        }
        // Within the leeway.
        let t = key.sign(json!({}), &with(claims(), "exp", json!(NOW - 5)));
        assert!(verify(&t, &jwks, &rules(), NOW).is_ok());
    }

    #[test]
    fn algorithms_keys_and_signatures() {
        let (rsa, ec) = (TestKey::rsa("r1"), TestKey::ec("e1"));
        let jwks = parse_jwks(jwks_of(&[&rsa]).as_bytes()).expect("jwks");
        // alg none: unsigned.
        let unsigned = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(claims().to_string())
        );
        assert_eq!(
            verify(&unsigned, &jwks, &rules(), NOW),
            Err(JwtError::UnsupportedAlg)
        );
        // HS256 signed with the public key as the secret: refused before any key is used.
        let hs = rsa.sign(json!({"alg": "HS256"}), &claims());
        assert_eq!(
            verify(&hs, &jwks, &rules(), NOW),
            Err(JwtError::UnsupportedAlg)
        );
        // Unknown kid, and an ES256 token against a JWKS with RSA keys only.
        let t = rsa.sign(json!({"kid": "r2"}), &claims());
        assert_eq!(verify(&t, &jwks, &rules(), NOW), Err(JwtError::UnknownKid));
        let t = ec.sign(json!({}), &claims());
        assert_eq!(verify(&t, &jwks, &rules(), NOW), Err(JwtError::UnknownKid));
        // Another EC key under the same kid: bad signature.
        let impostor = TestKey::ec("e1");
        let both = parse_jwks(jwks_of(&[&rsa, &ec]).as_bytes()).expect("jwks");
        let t = impostor.sign(json!({}), &claims());
        assert_eq!(
            verify(&t, &both, &rules(), NOW),
            Err(JwtError::BadSignature)
        );
        // Claims changed after signing.
        let good = rsa.sign(json!({}), &claims());
        let mut parts: Vec<&str> = good.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(with(claims(), "tenant", json!("team-b")).to_string());
        parts[1] = &forged;
        assert_eq!(
            verify(&parts.join("."), &jwks, &rules(), NOW),
            Err(JwtError::BadSignature)
        );
        for junk in ["", "a.b", "a.b.c.d", "!!.!!.!!", "eyJ.eyJ.x"] {
            assert_eq!(
                verify(junk, &jwks, &rules(), NOW),
                Err(JwtError::Malformed),
                "{junk}"
            );
        }
    }

    #[test]
    fn jwks_documents() {
        assert_eq!(parse_jwks(b"[]"), Err(JwksError::Malformed));
        assert_eq!(parse_jwks(b"{\"keys\": 1}"), Err(JwksError::Malformed));
        assert_eq!(
            parse_jwks(br#"{"keys":[{"kty":"oct","k":"c2VjcmV0"},{"kty":"RSA","use":"enc","n":"AQ","e":"AQAB"}]}"#),
            Err(JwksError::NoUsableKey)
        );
        assert_eq!(
            parse_jwks(&vec![b' '; MAX_JWKS_BYTES + 1]),
            Err(JwksError::TooLarge)
        );
        let keys: Vec<Value> = (0..40)
            .map(|i| TestKey::ec(&i.to_string()).jwk().clone())
            .collect();
        let doc = json!({"keys": keys}).to_string();
        assert_eq!(
            parse_jwks(doc.as_bytes()).map(|j| j.len()),
            Ok(MAX_JWKS_KEYS)
        );
    }
}
