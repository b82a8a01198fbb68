//! Fuzzes the tenant-credential decoders the router reads from Secrets and clients: a JWKS
//! document, API-key Secret lines, and a bearer JWT verified against a fuzzed JWKS. No input
//! may panic; a JWKS that parses stays within its caps; a token is never accepted without a
//! JWKS key (the fuzzer cannot forge RS256/ES256 signatures, so any acceptance is a bug).
#![no_main]

use kvroute_router::tenant::apikeys::parse_key_lines;
use kvroute_router::tenant::jwt::{JwtRules, parse_jwks, verify};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    match which % 3 {
        0 => {
            let _ = parse_jwks(rest);
        }
        1 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = parse_key_lines(text);
            }
        }
        _ => {
            // JWKS bytes, a 0xff separator, then the token.
            let (jwks, token) = match rest.iter().position(|b| *b == 0xff) {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &[][..]),
            };
            let Ok(jwks) = parse_jwks(jwks) else { return };
            let Ok(token) = std::str::from_utf8(token) else { return };
            let rules = JwtRules {
                issuer: "https://issuer.example".into(),
                audiences: vec!["kvroute".into()],
                tenant_claim: "tenant".into(),
            };
            assert!(
                verify(token, &jwks, &rules, 1_800_000_000).is_err(),
                "a token the fuzzer made was accepted"
            );
        }
    }
});
