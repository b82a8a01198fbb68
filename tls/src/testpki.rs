//! Certificates for tests (feature `test-pki`): a CA, leaves carrying kvroute identities,
//! and TLS directories written the way a mounted Secret looks. Never used by the binaries.
//!
//! ```text
//! TestCa::new("a") --leaf(identity, dns)--> Leaf { cert_pem, key_pem }
//! write_dir(dir, &leaf, &[&ca, ..]) --> dir/{tls.crt, tls.key, ca.crt} -> ..data/ (swapped at once, as kubelet does)
//! ```

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::identity::Identity;
use crate::material::{CA_FILE, CERT_FILE, KEY_FILE};

/// A test certificate authority.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

/// A leaf certificate and its key, PEM.
#[derive(Clone, Debug)]
pub struct Leaf {
    /// The certificate.
    pub cert_pem: String,
    /// The private key (PKCS#8).
    pub key_pem: String,
}

impl TestCa {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("kvroute test CA {name}"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("generate a key");
        let cert = params.self_signed(&key).expect("self-sign");
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A leaf for client and server use, with `identity` as its URI SAN (if any) and `dns`
    /// names (IP literals become IP SANs).
    pub fn leaf(&self, identity: Option<&Identity>, dns: &[&str]) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params
            .distinguished_name
            .push(DnType::CommonName, "kvroute test leaf");
        for d in dns {
            params.subject_alt_names.push(match d.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*d).try_into().expect("DNS name")),
            });
        }
        if let Some(id) = identity {
            params
                .subject_alt_names
                .push(SanType::URI(id.uri().try_into().expect("URI")));
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("generate a key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// Writes `leaf` and the CA bundle `cas` into `dir` as tls.crt, tls.key, ca.crt, the way
/// kubelet updates a mounted Secret: the files go into a fresh `..<n>` directory, the `..data`
/// symlink is swapped to it in one rename, and `dir/<file>` links through `..data`, so a
/// reader sees the old three files or the new three, never a mix.
pub fn write_dir(dir: &Path, leaf: &Leaf, cas: &[&TestCa]) {
    static VERSION: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir).expect("create the TLS directory");
    let version = format!("..{}", VERSION.fetch_add(1, Ordering::Relaxed));
    let data = dir.join(&version);
    std::fs::create_dir(&data).expect("create a version directory");
    let bundle: String = cas.iter().map(|c| c.pem()).collect();
    for (name, body) in [
        (KEY_FILE, leaf.key_pem.as_str()),
        (CERT_FILE, leaf.cert_pem.as_str()),
        (CA_FILE, bundle.as_str()),
    ] {
        std::fs::write(data.join(name), body).expect("write");
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&version, &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    for name in [KEY_FILE, CERT_FILE, CA_FILE] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).expect("symlink");
        }
    }
}
