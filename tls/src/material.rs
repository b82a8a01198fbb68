//! Reading a TLS directory and building rustls configurations from it.
//!
//! ```text
//! DIR/tls.crt (leaf first, then intermediates)  --+
//! DIR/tls.key (PKCS#8, PKCS#1 or SEC1)           --+--> Material --server_config--> client cert REQUIRED, verified against ca.crt
//! DIR/ca.crt  (one or more CAs: both during a     --+             --client_config--> presents tls.crt, verifies the server against ca.crt
//!              rotation)
//! ```
//!
//! Both configurations speak only HTTP/2 (ALPN `h2`), as gRPC needs, and use the ring
//! provider explicitly, so no process-wide default provider has to be installed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::identity::{Identity, IdentityError};

/// The certificate chain file in a TLS directory.
pub const CERT_FILE: &str = "tls.crt";
/// The private key file in a TLS directory.
pub const KEY_FILE: &str = "tls.key";
/// The CA bundle file in a TLS directory.
pub const CA_FILE: &str = "ca.crt";

/// Why a TLS directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM object of the kind expected.
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },
    /// The certificates, key or CAs do not make a valid configuration (e.g. the key does
    /// not match the certificate).
    #[error("{0}")]
    Config(String),
}

/// The parsed contents of a TLS directory.
#[derive(Debug)]
pub struct Material {
    /// `tls.crt`: the leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// `tls.key`.
    pub key: PrivateKeyDer<'static>,
    /// `ca.crt`: every CA that verifies the peer.
    pub roots: Vec<CertificateDer<'static>>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads the three files' bytes (cert, key, CA), as they are now.
pub fn read_files(dir: &Path) -> Result<[Vec<u8>; 3], TlsError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| TlsError::Read { path, source })
    };
    Ok([read(CERT_FILE)?, read(KEY_FILE)?, read(CA_FILE)?])
}

impl Material {
    /// Parses the three files' bytes (as [`read_files`] returns them) from `dir`.
    pub fn parse(dir: &Path, files: &[Vec<u8>; 3]) -> Result<Self, TlsError> {
        let [cert, key, ca] = files;
        let certs = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            let list = CertificateDer::pem_slice_iter(bytes)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsError::Pem {
                    path: path.clone(),
                    what: e.to_string(),
                })?;
            if list.is_empty() {
                return Err(TlsError::Pem {
                    path,
                    what: "no CERTIFICATE block".into(),
                });
            }
            Ok(list)
        };
        let chain = certs(CERT_FILE, cert)?;
        let roots = certs(CA_FILE, ca)?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Pem {
            path: dir.join(KEY_FILE),
            what: e.to_string(),
        })?;
        Ok(Self { chain, key, roots })
    }

    /// Reads and parses `dir`.
    pub fn load(dir: &Path) -> Result<Self, TlsError> {
        Self::parse(dir, &read_files(dir)?)
    }

    /// The identity in this side's own leaf certificate.
    pub fn identity(&self) -> Result<Identity, IdentityError> {
        let leaf = self.chain.first().ok_or(IdentityError::Missing)?;
        Identity::from_cert(leaf)
    }

    fn root_store(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let mut store = RootCertStore::empty();
        for ca in &self.roots {
            store
                .add(ca.clone())
                .map_err(|e| TlsError::Config(format!("{CA_FILE}: {e}")))?;
        }
        Ok(Arc::new(store))
    }

    /// A server configuration: presents `tls.crt`, requires a client certificate that
    /// `ca.crt` verifies.
    pub fn server_config(&self) -> Result<ServerConfig, TlsError> {
        let provider = provider();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(self.root_store()?, provider.clone())
                .build()
                .map_err(|e| TlsError::Config(format!("client verifier: {e}")))?;
        let mut cfg = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(format!("{CERT_FILE}/{KEY_FILE}: {e}")))?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(cfg)
    }

    /// A client configuration: presents `tls.crt`, verifies the server against `ca.crt`
    /// (and, at connect time, the server name).
    pub fn client_config(&self) -> Result<ClientConfig, TlsError> {
        let mut cfg = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(self.root_store()?)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(format!("{CERT_FILE}/{KEY_FILE}: {e}")))?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(cfg)
    }
}
