//! Who is calling: the tenant a request's credentials prove, under its pool's `auth` block.
//!
//! ```text
//! headers + peer IP (+ "trusted caller": the pool's mTLS picker on the Pick API) --> Credentials
//! PoolAuth (the model's pool; None = no auth block)
//!   None                                   --> anonymous (as before tenants existed)
//!   x-kvroute-tenant from a trusted peer    --> that tenant      (from anyone else: 403)
//!   Authorization: Bearer <JWT>, jwt set    --> jwt::verify      (401 when it fails)
//!   Authorization: Bearer <key> | x-api-key --> KeyTable lookup  (401 when unknown)
//!   nothing                                 --> anonymous if allowAnonymous, else 401
//! ```
//!
//! The error a client sees says which credential failed in general terms (no key, a bad key,
//! a bad token, an untrusted tenant header); the detailed reason is a metric label.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use kvroute_crds::pool::{PoolAuthSpec, parse_cidr};

use super::jwks::{JwksSource, JwksStore};
use super::jwt::{self, JwtError, JwtRules};
use super::metrics::TenantMetrics;
use super::secrets::SecretFiles;

/// The tenant header (believed from trusted peers only).
pub const TENANT_HEADER: &str = "x-kvroute-tenant";

/// An IP network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `addr` or `addr/prefix`.
    pub fn parse(s: &str) -> Option<Self> {
        parse_cidr(s).map(|(addr, prefix)| Cidr { addr, prefix })
    }

    /// Does the network hold `ip` (IPv4-mapped IPv6 addresses count as IPv4)?
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr.to_canonical(), ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// JWT settings of a pool.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JwtAuth {
    /// Issuer, audiences, tenant claim.
    pub rules: JwtRules,
    /// Where the keys come from.
    pub jwks: JwksSource,
}

/// A pool's `auth` block as the router uses it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolAuth {
    /// API-key Secrets.
    pub api_key_secrets: Vec<String>,
    /// JWT verification.
    pub jwt: Option<JwtAuth>,
    /// Peers whose tenant header is believed.
    pub trusted_peers: Vec<Cidr>,
    /// Requests without credentials are served, as anonymous.
    pub allow_anonymous: bool,
}

impl PoolAuth {
    /// From the CRD. Entries that do not parse are dropped (the operator reports them on the
    /// pool): trusting fewer peers or verifying fewer tokens fails closed.
    pub fn from_spec(spec: &PoolAuthSpec) -> Self {
        Self {
            api_key_secrets: spec
                .api_key_secrets
                .iter()
                .map(|s| s.name.clone())
                .collect(),
            jwt: spec.jwt.as_ref().and_then(|j| {
                let jwks = match (&j.jwks_url, &j.jwks_secret_ref) {
                    (Some(u), None) => JwksSource::Url(u.clone()),
                    (None, Some(r)) => JwksSource::Secret {
                        name: r.name.clone(),
                        key: r.key.clone(),
                    },
                    _ => return None,
                };
                Some(JwtAuth {
                    rules: JwtRules {
                        issuer: j.issuer.clone(),
                        audiences: j.audiences.clone(),
                        tenant_claim: j.tenant_claim.clone(),
                    },
                    jwks,
                })
            }),
            trusted_peers: spec
                .trusted_peers
                .iter()
                .filter_map(|p| Cidr::parse(p))
                .collect(),
            allow_anonymous: spec.allow_anonymous,
        }
    }
}

/// The credentials a request carries.
#[derive(Clone, Copy, Debug, Default)]
pub struct Credentials<'a> {
    /// `Authorization: Bearer <token>`.
    pub bearer: Option<&'a str>,
    /// `x-api-key: <key>` (Anthropic clients).
    pub api_key: Option<&'a str>,
    /// `x-kvroute-tenant`.
    pub tenant_header: Option<&'a str>,
    /// The TCP peer.
    pub peer: Option<IpAddr>,
    /// The caller is trusted to name the tenant (the pool's mTLS picker on the Pick API).
    pub trusted_caller: bool,
}

impl<'a> Credentials<'a> {
    /// Reads the credential headers.
    pub fn from_headers(
        headers: &'a HeaderMap,
        peer: Option<IpAddr>,
        trusted_caller: bool,
    ) -> Self {
        let text = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
        };
        let bearer = text("authorization").and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
        Self {
            bearer,
            api_key: text("x-api-key"),
            tenant_header: text(TENANT_HEADER),
            peer,
            trusted_caller,
        }
    }

    /// Carries any credential at all.
    pub fn present(&self) -> bool {
        self.bearer.is_some() || self.api_key.is_some() || self.tenant_header.is_some()
    }
}

/// Why a request was not authenticated. `label()` is the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential, and the pool does not allow anonymous requests.
    #[error(
        "authentication required: send an API key (Authorization: Bearer or x-api-key) or a bearer token"
    )]
    MissingCredentials,
    /// The API key is not one of the pool's.
    #[error("the API key is not valid")]
    InvalidApiKey,
    /// The bearer token failed verification.
    #[error("the bearer token is not valid or has expired")]
    InvalidToken(JwtError),
    /// The JWKS of the pool is not loaded (yet).
    #[error("the bearer token cannot be verified now; retry later")]
    KeysUnavailable,
    /// `x-kvroute-tenant` from a peer that may not set it.
    #[error("this client may not set the x-kvroute-tenant header")]
    UntrustedTenantHeader,
    /// `x-kvroute-tenant` from a trusted peer, but not a tenant name.
    #[error("the x-kvroute-tenant header is not a valid tenant name")]
    InvalidTenantHeader,
}

impl AuthError {
    /// HTTP status: 401, or 403 for a tenant header the peer may not send.
    pub fn status(&self) -> u16 {
        match self {
            AuthError::UntrustedTenantHeader => 403,
            _ => 401,
        }
    }

    /// Metric label (a fixed set).
    pub fn label(&self) -> &'static str {
        match self {
            AuthError::MissingCredentials => "missing_credentials",
            AuthError::InvalidApiKey => "invalid_api_key",
            AuthError::InvalidToken(e) => match e {
                JwtError::Expired => "token_expired",
                JwtError::UnsupportedAlg => "token_bad_alg",
                JwtError::UnknownKid => "token_unknown_kid",
                JwtError::BadSignature => "token_bad_signature",
                JwtError::WrongIssuer | JwtError::WrongAudience => "token_wrong_iss_aud",
                JwtError::Malformed | JwtError::NotYetValid | JwtError::BadTenant => {
                    "token_invalid"
                }
            },
            AuthError::KeysUnavailable => "keys_unavailable",
            AuthError::UntrustedTenantHeader => "untrusted_tenant_header",
            AuthError::InvalidTenantHeader => "invalid_tenant_header",
        }
    }

    /// The OpenAI `code` of the error body.
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::MissingCredentials => "missing_api_key",
            AuthError::InvalidApiKey => "invalid_api_key",
            AuthError::InvalidToken(_) | AuthError::KeysUnavailable => "invalid_token",
            AuthError::UntrustedTenantHeader | AuthError::InvalidTenantHeader => {
                "tenant_header_not_allowed"
            }
        }
    }
}

/// Verifies credentials against a pool's auth block.
pub struct Authenticator {
    secrets: Arc<SecretFiles>,
    jwks: JwksStore,
    metrics: TenantMetrics,
}

impl Authenticator {
    /// Reads Secrets from `secrets_dir`.
    pub fn new(secrets_dir: Option<std::path::PathBuf>, metrics: TenantMetrics) -> Self {
        let secrets = Arc::new(SecretFiles::new(secrets_dir, metrics.clone()));
        Self {
            jwks: JwksStore::new(secrets.clone(), metrics.clone()),
            secrets,
            metrics,
        }
    }

    /// The Secret files (for the refresh task).
    pub fn secrets(&self) -> &SecretFiles {
        &self.secrets
    }

    /// The JWKS cache (for the refresh task).
    pub fn jwks(&self) -> &JwksStore {
        &self.jwks
    }

    /// The tenant `creds` prove under `auth` (`Ok(None)`: anonymous), at `now`. Counts
    /// nothing: the front door counts the outcome once with [`Authenticator::count`].
    pub fn authenticate(
        &self,
        auth: Option<&PoolAuth>,
        creds: &Credentials<'_>,
        now: SystemTime,
    ) -> Result<Option<String>, AuthError> {
        let Some(auth) = auth else {
            return Ok(None);
        };
        if let Some(t) = creds.tenant_header {
            let trusted = creds.trusted_caller
                || creds
                    .peer
                    .is_some_and(|ip| auth.trusted_peers.iter().any(|c| c.contains(ip)));
            if !trusted {
                return Err(AuthError::UntrustedTenantHeader);
            }
            return if super::valid_tenant(t) {
                Ok(Some(t.to_string()))
            } else {
                Err(AuthError::InvalidTenantHeader)
            };
        }
        if let (Some(token), Some(j)) = (creds.bearer, &auth.jwt)
            && jwt::looks_like_jwt(token)
        {
            let keys = self.jwks.get(&j.jwks).ok_or(AuthError::KeysUnavailable)?;
            let now_unix = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            return match jwt::verify(token, &keys, &j.rules, now_unix) {
                Ok(t) => Ok(Some(t)),
                Err(e) => {
                    if e == JwtError::UnknownKid {
                        self.jwks.unknown_kid(&j.jwks, Instant::now());
                    }
                    Err(AuthError::InvalidToken(e))
                }
            };
        }
        if let Some(key) = creds.bearer.or(creds.api_key) {
            for secret in &auth.api_key_secrets {
                if let Some(t) = self.secrets.key_table(secret).lookup(key) {
                    return Ok(Some(t.to_string()));
                }
            }
            return Err(AuthError::InvalidApiKey);
        }
        if auth.allow_anonymous {
            Ok(None)
        } else {
            Err(AuthError::MissingCredentials)
        }
    }

    /// Counts one request's outcome in `kvroute_router_tenant_auth_total{result}`. `open`:
    /// the pool has no auth block.
    pub fn count(&self, result: &Result<Option<String>, AuthError>, open: bool) {
        let label = match result {
            Ok(_) if open => "open_pool",
            Ok(Some(_)) => "tenant",
            Ok(None) => "anonymous",
            Err(e) => e.label(),
        };
        self.metrics.auth.with_label_values(&[label]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::apikeys::{new_key, secret_line};
    use crate::tenant::jwt::testing::{TestKey, jwks_of};
    use serde_json::json;

    struct Fixture {
        _tmp: tempfile::TempDir,
        auth: Authenticator,
        pool: PoolAuth,
        key: String,
        rsa: TestKey,
        ec: TestKey,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().expect("tmp");
        let key = new_key();
        std::fs::create_dir(tmp.path().join("keys")).expect("mkdir");
        std::fs::write(tmp.path().join("keys/team-a"), secret_line(&key)).expect("write");
        let (rsa, ec) = (TestKey::rsa("r1"), TestKey::ec("e1"));
        std::fs::create_dir(tmp.path().join("idp")).expect("mkdir");
        std::fs::write(tmp.path().join("idp/jwks.json"), jwks_of(&[&rsa, &ec])).expect("write");
        let metrics = TenantMetrics::register(&prometheus::Registry::new(), &[]).expect("m");
        let spec: PoolAuthSpec = serde_json::from_value(json!({
            "apiKeySecrets": [{"name": "keys"}],
            "jwt": {"issuer": "https://idp", "audiences": ["kvroute"], "jwksSecretRef": {"name": "idp", "key": "jwks.json"}},
            "trustedPeers": ["10.1.0.0/16", "::1"],
        }))
        .expect("spec");
        Fixture {
            auth: Authenticator::new(Some(tmp.path().to_path_buf()), metrics),
            pool: PoolAuth::from_spec(&spec),
            _tmp: tmp,
            key,
            rsa,
            ec,
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header value"));
        }
        h
    }

    fn check(f: &Fixture, h: &HeaderMap, peer: Option<&str>) -> Result<Option<String>, AuthError> {
        let peer = peer.map(|p| p.parse().expect("ip"));
        f.auth.authenticate(
            Some(&f.pool),
            &Credentials::from_headers(h, peer, false),
            SystemTime::now(),
        )
    }

    #[test]
    fn api_keys_in_either_header() {
        let f = fixture();
        let ok = Ok(Some("team-a".to_string()));
        assert_eq!(
            check(
                &f,
                &headers(&[("authorization", &format!("Bearer {}", f.key))]),
                None
            ),
            ok
        );
        assert_eq!(
            check(
                &f,
                &headers(&[("authorization", &format!("bearer  {}", f.key))]),
                None
            ),
            ok
        );
        assert_eq!(check(&f, &headers(&[("x-api-key", &f.key)]), None), ok);
        assert_eq!(
            check(&f, &headers(&[("x-api-key", "kvr_nope")]), None),
            Err(AuthError::InvalidApiKey)
        );
        assert_eq!(
            check(
                &f,
                &headers(&[("authorization", "Basic dXNlcjpwYXNz")]),
                None
            ),
            Err(AuthError::MissingCredentials)
        );
        assert_eq!(
            check(&f, &HeaderMap::new(), None),
            Err(AuthError::MissingCredentials)
        );
        let open = PoolAuth {
            allow_anonymous: true,
            ..f.pool.clone()
        };
        let creds = Credentials::default();
        assert_eq!(
            f.auth.authenticate(Some(&open), &creds, SystemTime::now()),
            Ok(None)
        );
        // No auth block: anonymous whatever is sent.
        let h = headers(&[(TENANT_HEADER, "team-z")]);
        let creds = Credentials::from_headers(&h, None, false);
        assert_eq!(
            f.auth.authenticate(None, &creds, SystemTime::now()),
            Ok(None)
        );
    }

    #[test]
    fn jwts_of_both_algorithms_and_their_failures() {
        let f = fixture();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("time")
            .as_secs();
        let claims =
            json!({"iss": "https://idp", "aud": "kvroute", "exp": now + 300, "tenant": "team-j"});
        for key in [&f.rsa, &f.ec] {
            let t = key.sign(json!({}), &claims);
            let h = headers(&[("authorization", &format!("Bearer {t}"))]);
            assert_eq!(check(&f, &h, None), Ok(Some("team-j".into())));
        }
        let mut expired = claims.clone();
        expired["exp"] = json!(now - 3600);
        let t = f.ec.sign(json!({}), &expired);
        let e = check(
            &f,
            &headers(&[("authorization", &format!("Bearer {t}"))]),
            None,
        )
        .expect_err("expired");
        assert_eq!((e.label(), e.status()), ("token_expired", 401));
        let t = f.ec.sign(json!({"kid": "nope"}), &claims);
        let e = check(
            &f,
            &headers(&[("authorization", &format!("Bearer {t}"))]),
            None,
        )
        .expect_err("kid");
        assert_eq!(e, AuthError::InvalidToken(JwtError::UnknownKid));
    }

    #[test]
    fn tenant_header_only_from_trusted_peers() {
        let f = fixture();
        let h = headers(&[(TENANT_HEADER, "team-h")]);
        assert_eq!(check(&f, &h, Some("10.1.2.3")), Ok(Some("team-h".into())));
        assert_eq!(check(&f, &h, Some("::1")), Ok(Some("team-h".into())));
        assert_eq!(
            check(&f, &h, Some("::ffff:10.1.0.9")),
            Ok(Some("team-h".into()))
        );
        let e = check(&f, &h, Some("10.2.0.1")).expect_err("untrusted");
        assert_eq!((e, e.status()), (AuthError::UntrustedTenantHeader, 403));
        assert_eq!(check(&f, &h, None), Err(AuthError::UntrustedTenantHeader));
        let bad = headers(&[(TENANT_HEADER, "Team H")]);
        assert_eq!(
            check(&f, &bad, Some("10.1.0.1")),
            Err(AuthError::InvalidTenantHeader)
        );
        // The Pick API's mTLS picker is trusted without a CIDR.
        let creds = Credentials::from_headers(&h, None, true);
        assert_eq!(
            f.auth
                .authenticate(Some(&f.pool), &creds, SystemTime::now()),
            Ok(Some("team-h".into()))
        );
    }

    #[test]
    fn allow_anonymous_still_refuses_a_bad_credential_and_jwks_urls_start_empty() {
        let f = fixture();
        let open = PoolAuth {
            allow_anonymous: true,
            ..f.pool.clone()
        };
        let h = headers(&[("x-api-key", "kvr_wrong")]);
        let creds = Credentials::from_headers(&h, None, false);
        assert_eq!(
            f.auth.authenticate(Some(&open), &creds, SystemTime::now()),
            Err(AuthError::InvalidApiKey)
        );
        // A JWKS URL nobody fetched yet: tokens cannot be verified (401), nothing is fetched
        // on the request path.
        let mut by_url = f.pool.clone();
        if let Some(j) = by_url.jwt.as_mut() {
            j.jwks = JwksSource::Url("https://idp.invalid/jwks".into());
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("time")
            .as_secs();
        let t = f.ec.sign(
            json!({}),
            &json!({"iss": "https://idp", "aud": "kvroute", "exp": now + 60, "tenant": "team-j"}),
        );
        let h = headers(&[("authorization", &format!("Bearer {t}"))]);
        let creds = Credentials::from_headers(&h, None, false);
        assert_eq!(
            f.auth
                .authenticate(Some(&by_url), &creds, SystemTime::now()),
            Err(AuthError::KeysUnavailable)
        );
    }

    #[test]
    fn cidrs() {
        let c = Cidr::parse("192.168.0.0/16").expect("cidr");
        assert!(c.contains("192.168.255.1".parse().expect("ip")));
        assert!(!c.contains("192.169.0.1".parse().expect("ip")));
        assert!(!c.contains("::1".parse().expect("ip")));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .expect("all")
                .contains("8.8.8.8".parse().expect("ip"))
        );
        let v6 = Cidr::parse("fd00::/8").expect("cidr");
        assert!(v6.contains("fd12::1".parse().expect("ip")));
        assert!(Cidr::parse("10.0.0.0/40").is_none());
    }
}
