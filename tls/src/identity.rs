//! kvroute identities: SPIFFE URIs in a certificate's subject alternative names. Pure.
//!
//! ```text
//! spiffe://kvroute.dev/ns/<namespace>/workerset/<name>     a sidecar of that WorkerSet
//! spiffe://kvroute.dev/ns/<namespace>/pool/<pool>/router   a router replica of that pool
//! spiffe://kvroute.dev/ns/<namespace>/pool/<pool>/picker   an external Pick API caller
//! ```
//!
//! URIs of other trust domains are ignored; a certificate with no kvroute URI, or with two
//! different ones, has no identity.

use std::fmt;

use rustls_pki_types::CertificateDer;

/// The SPIFFE trust domain of every kvroute identity.
pub const TRUST_DOMAIN: &str = "kvroute.dev";

/// Who a certificate says its holder is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identity {
    /// The sidecars of one InferenceWorkerSet.
    WorkerSet {
        /// Namespace.
        namespace: String,
        /// WorkerSet name.
        name: String,
    },
    /// The router replicas of one InferencePool.
    Router {
        /// Namespace.
        namespace: String,
        /// Pool name.
        pool: String,
    },
    /// An external gateway calling the Pick API for one InferencePool.
    Picker {
        /// Namespace.
        namespace: String,
        /// Pool name.
        pool: String,
    },
}

/// Why a certificate or URI carries no identity.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    /// The certificate could not be parsed.
    #[error("certificate cannot be parsed")]
    BadCertificate,
    /// No `spiffe://kvroute.dev/...` URI SAN.
    #[error("certificate has no spiffe://{TRUST_DOMAIN}/ URI")]
    Missing,
    /// Two different kvroute identities in one certificate.
    #[error("certificate names more than one kvroute identity")]
    Ambiguous,
    /// A kvroute URI of an unknown shape.
    #[error("`{0}` is not a kvroute identity")]
    Malformed(String),
}

/// Kubernetes object names: DNS-1123 subdomain characters, at most 253 of them.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

impl Identity {
    /// Parses a URI; `Ok(None)` for a URI of another trust domain (or not SPIFFE at all).
    pub fn parse(uri: &str) -> Result<Option<Self>, IdentityError> {
        let Some(path) = uri
            .strip_prefix("spiffe://")
            .and_then(|rest| rest.strip_prefix(TRUST_DOMAIN))
            .and_then(|rest| rest.strip_prefix('/'))
        else {
            return Ok(None);
        };
        let bad = || IdentityError::Malformed(uri.chars().take(200).collect());
        let parts: Vec<&str> = path.split('/').collect();
        let id = match parts.as_slice() {
            ["ns", ns, "workerset", name] => Identity::WorkerSet {
                namespace: (*ns).into(),
                name: (*name).into(),
            },
            ["ns", ns, "pool", pool, "router"] => Identity::Router {
                namespace: (*ns).into(),
                pool: (*pool).into(),
            },
            ["ns", ns, "pool", pool, "picker"] => Identity::Picker {
                namespace: (*ns).into(),
                pool: (*pool).into(),
            },
            _ => return Err(bad()),
        };
        let (a, b) = id.parts();
        if valid_name(a) && valid_name(b) {
            Ok(Some(id))
        } else {
            Err(bad())
        }
    }

    /// The identity in a (leaf) certificate's URI SANs.
    pub fn from_cert(der: &CertificateDer<'_>) -> Result<Self, IdentityError> {
        let cert =
            webpki::EndEntityCert::try_from(der).map_err(|_| IdentityError::BadCertificate)?;
        let mut found: Option<Identity> = None;
        for uri in cert.valid_uri_names() {
            let Some(id) = Identity::parse(uri)? else {
                continue;
            };
            match &found {
                Some(f) if *f != id => return Err(IdentityError::Ambiguous),
                _ => found = Some(id),
            }
        }
        found.ok_or(IdentityError::Missing)
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        self.parts().0
    }

    fn parts(&self) -> (&str, &str) {
        match self {
            Identity::WorkerSet { namespace, name } => (namespace, name),
            Identity::Router { namespace, pool } | Identity::Picker { namespace, pool } => {
                (namespace, pool)
            }
        }
    }

    /// The SPIFFE URI.
    pub fn uri(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::WorkerSet { namespace, name } => {
                write!(f, "spiffe://{TRUST_DOMAIN}/ns/{namespace}/workerset/{name}")
            }
            Identity::Router { namespace, pool } => {
                write!(
                    f,
                    "spiffe://{TRUST_DOMAIN}/ns/{namespace}/pool/{pool}/router"
                )
            }
            Identity::Picker { namespace, pool } => {
                write!(
                    f,
                    "spiffe://{TRUST_DOMAIN}/ns/{namespace}/pool/{pool}/picker"
                )
            }
        }
    }
}

/// Whether a (leaf) certificate is valid for the DNS name `name` (its DNS SANs, wildcards as
/// TLS clients match them). False for a certificate that cannot be parsed or a `name` that
/// is not a DNS name.
pub fn cert_valid_for_dns_name(der: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(cert) = webpki::EndEntityCert::try_from(der) else {
        return false;
    };
    let Ok(name) = rustls_pki_types::ServerName::try_from(name) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_valid_only_for_its_dns_names() {
        use rustls_pki_types::pem::PemObject;
        let ca = crate::testpki::TestCa::new("names");
        let leaf = ca.leaf(None, &["kvroute-router-ingest.ml.svc", "*.peers.ml"]);
        let der = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).expect("pem");
        assert!(cert_valid_for_dns_name(
            &der,
            "kvroute-router-ingest.ml.svc"
        ));
        assert!(cert_valid_for_dns_name(&der, "a.peers.ml"));
        assert!(!cert_valid_for_dns_name(
            &der,
            "kvroute-router-ingest.other.svc"
        ));
        assert!(!cert_valid_for_dns_name(&der, "not a name"));
        let uri_only = ca.leaf(
            Some(&Identity::WorkerSet {
                namespace: "ml".into(),
                name: "qwen".into(),
            }),
            &[],
        );
        let der = CertificateDer::from_pem_slice(uri_only.cert_pem.as_bytes()).expect("pem");
        assert!(!cert_valid_for_dns_name(
            &der,
            "kvroute-router-ingest.ml.svc"
        ));
        assert!(!cert_valid_for_dns_name(
            &CertificateDer::from(vec![1, 2, 3]),
            "x.y"
        ));
    }

    #[test]
    fn parses_the_three_shapes_and_round_trips() {
        for uri in [
            "spiffe://kvroute.dev/ns/ml/workerset/qwen",
            "spiffe://kvroute.dev/ns/ml/pool/chat/router",
            "spiffe://kvroute.dev/ns/ml/pool/chat/picker",
        ] {
            let id = Identity::parse(uri).expect("parse").expect("ours");
            assert_eq!(id.uri(), uri);
            assert_eq!(id.namespace(), "ml");
        }
    }

    #[test]
    fn other_domains_are_ignored_and_bad_shapes_refused() {
        assert_eq!(
            Identity::parse("spiffe://example.org/ns/a/workerset/b"),
            Ok(None)
        );
        assert_eq!(Identity::parse("https://kvroute.dev/x"), Ok(None));
        // A look-alike domain is not ours.
        assert_eq!(
            Identity::parse("spiffe://kvroute.dev.evil/ns/a/workerset/b"),
            Ok(None)
        );
        for bad in [
            "spiffe://kvroute.dev/ns/a/workerset",
            "spiffe://kvroute.dev/ns/a/workerset/b/c",
            "spiffe://kvroute.dev/ns/A/workerset/b",
            "spiffe://kvroute.dev/ns//workerset/b",
            "spiffe://kvroute.dev/ns/a/pool/p/admin",
            "spiffe://kvroute.dev/ns/a/workerset/b%2Fc",
        ] {
            assert!(
                matches!(Identity::parse(bad), Err(IdentityError::Malformed(_))),
                "{bad}"
            );
        }
    }

    fn cert_with(uris: &[&str]) -> CertificateDer<'static> {
        let mut params =
            rcgen::CertificateParams::new(vec!["x.example".to_string()]).expect("params");
        for u in uris {
            params
                .subject_alt_names
                .push(rcgen::SanType::URI((*u).try_into().expect("ia5")));
        }
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("sign").der().clone()
    }

    #[test]
    fn from_cert_finds_exactly_one_identity() {
        let ws = "spiffe://kvroute.dev/ns/ml/workerset/qwen";
        assert_eq!(
            Identity::from_cert(&cert_with(&["spiffe://other.org/x", ws])),
            Ok(Identity::WorkerSet {
                namespace: "ml".into(),
                name: "qwen".into()
            })
        );
        assert_eq!(
            Identity::from_cert(&cert_with(&[])),
            Err(IdentityError::Missing)
        );
        assert_eq!(
            Identity::from_cert(&cert_with(&[
                ws,
                "spiffe://kvroute.dev/ns/ml/pool/p/picker"
            ])),
            Err(IdentityError::Ambiguous)
        );
        assert_eq!(
            Identity::from_cert(&CertificateDer::from(vec![1u8, 2, 3])),
            Err(IdentityError::BadCertificate)
        );
    }
}
