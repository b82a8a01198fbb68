//! Test signing keys for tenant JWTs: the committed RS256 key and fresh ES256 keys.
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair};
use serde_json::{Value, json};

/// The committed RS256 test key (PKCS#8 PEM, made with `openssl genpkey`) and its JWK.
const RSA_PEM: &str = include_str!("../data/tenant/rs256.pk8.pem");
const RSA_JWK: &str = include_str!("../data/tenant/rs256.jwk.json");

/// A signing key and its public JWK.
pub enum TestKey {
    /// RS256.
    Rsa(RsaKeyPair, Value),
    /// ES256, generated fresh.
    Ec(EcdsaKeyPair, Value),
}

impl TestKey {
    /// The committed RSA key, with `kid`.
    pub fn rsa(kid: &str) -> Self {
        let b64: String = RSA_PEM
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let der = STANDARD.decode(b64).expect("test key is base64");
        let pair = RsaKeyPair::from_pkcs8(&der).expect("test key parses");
        let mut jwk: Value = serde_json::from_str(RSA_JWK).expect("jwk parses");
        jwk["kid"] = json!(kid);
        TestKey::Rsa(pair, jwk)
    }

    /// A new P-256 key, with `kid`.
    pub fn ec(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pk8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("generate");
        let pair = EcdsaKeyPair::from_pkcs8(alg, pk8.as_ref(), &rng).expect("parse");
        let point = pair.public_key().as_ref().to_vec();
        let jwk = json!({"kty": "EC", "crv": "P-256", "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])});
        TestKey::Ec(pair, jwk)
    }

    /// The public JWK.
    pub fn jwk(&self) -> &Value {
        match self {
            TestKey::Rsa(_, j) | TestKey::Ec(_, j) => j,
        }
    }

    /// A signed token with `header` (alg and kid filled in unless given) and `claims`.
    pub fn sign(&self, mut header: Value, claims: &Value) -> String {
        let (alg, kid) = match self {
            TestKey::Rsa(_, j) => ("RS256", j["kid"].clone()),
            TestKey::Ec(_, j) => ("ES256", j["kid"].clone()),
        };
        if header.get("alg").is_none() {
            header["alg"] = json!(alg);
        }
        if header.get("kid").is_none() {
            header["kid"] = kid;
        }
        let msg = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let sig = match self {
            TestKey::Rsa(pair, _) => {
                let mut sig = vec![0; pair.public().modulus_len()];
                pair.sign(&signature::RSA_PKCS1_SHA256, &rng, msg.as_bytes(), &mut sig)
                    .expect("sign");
                sig
            }
            TestKey::Ec(pair, _) => pair
                .sign(&rng, msg.as_bytes())
                .expect("sign")
                .as_ref()
                .to_vec(),
        };
        format!("{msg}.{}", URL_SAFE_NO_PAD.encode(sig))
    }
}

/// A JWKS document of `keys`.
pub fn jwks_of(keys: &[&TestKey]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk().clone()).collect::<Vec<_>>()}).to_string()
}
