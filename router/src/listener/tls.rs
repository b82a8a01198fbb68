//! TLS termination for a listener (`--gateway-tls-dir`): a certificate and key from a
//! mounted `kubernetes.io/tls` Secret, re-read when the files change, so a rotated
//! certificate is served to new connections while open ones keep theirs.
//!
//! ```text
//! DIR/tls.crt + DIR/tls.key --load--> CertifiedKey --swap--> Resolver (every handshake)
//!        ^ re-read every `interval`; a pair that fails to load keeps the old one (counted)
//! ```
//!
//! ALPN offers `h2` and `http/1.1`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use parking_lot::RwLock;
use prometheus::{IntCounterVec, Opts, Registry};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// File name of the certificate chain in the directory.
pub const CERT_FILE: &str = "tls.crt";
/// File name of the private key in the directory.
pub const KEY_FILE: &str = "tls.key";

/// The certificate in use; swapped when the files change.
#[derive(Debug)]
struct Resolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

/// Accepts TLS connections with the current certificate. Cheap to clone.
#[derive(Clone)]
pub struct Acceptor {
    inner: tokio_rustls::TlsAcceptor,
}

impl Acceptor {
    /// Runs the TLS handshake on `tcp`.
    pub async fn accept(
        &self,
        tcp: TcpStream,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        self.inner.accept(tcp).await
    }
}

/// The files of one directory, as last loaded.
#[derive(PartialEq, Eq)]
struct Pem {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// Watches a directory and keeps the [`Acceptor`]'s certificate current.
pub struct Reloader {
    dir: PathBuf,
    resolver: Arc<Resolver>,
    loaded: Pem,
    reloads: IntCounterVec,
    interval: Duration,
}

/// The provider every TLS object here uses (ring, as kube's client does).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(dir: &Path) -> anyhow::Result<Pem> {
    let cert = std::fs::read(dir.join(CERT_FILE))
        .with_context(|| format!("read {}", dir.join(CERT_FILE).display()))?;
    let key = std::fs::read(dir.join(KEY_FILE))
        .with_context(|| format!("read {}", dir.join(KEY_FILE).display()))?;
    Ok(Pem { cert, key })
}

fn certified_key(pem: &Pem) -> anyhow::Result<CertifiedKey> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem.cert)
        .collect::<Result<_, _>>()
        .context("tls.crt is not PEM certificates")?;
    if chain.is_empty() {
        bail!("tls.crt holds no certificate");
    }
    let key =
        PrivateKeyDer::from_pem_slice(&pem.key).context("tls.key is not a PEM private key")?;
    let signer = provider()
        .key_provider
        .load_private_key(key)
        .context("tls.key: unsupported private key")?;
    let ck = CertifiedKey::new(chain, signer);
    ck.keys_match()
        .context("tls.key does not belong to the certificate in tls.crt")?;
    Ok(ck)
}

/// Loads `dir` (it must hold a valid pair now) and returns the acceptor and the task that
/// reloads it every `interval`.
pub fn load(
    dir: &Path,
    interval: Duration,
    registry: &Registry,
) -> anyhow::Result<(Acceptor, Reloader)> {
    let pem = read(dir)?;
    let ck = certified_key(&pem).with_context(|| format!("TLS pair in {}", dir.display()))?;
    let resolver = Arc::new(Resolver {
        current: RwLock::new(Arc::new(ck)),
    });
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let reloads = IntCounterVec::new(
        Opts::new(
            "kvroute_router_gateway_tls_reloads_total",
            "Gateway TLS certificate reloads after the files changed, by result (ok, error).",
        ),
        &["result"],
    )?;
    // A second load in one registry (tests) keeps its own counter.
    let _ = registry.register(Box::new(reloads.clone()));
    Ok((
        Acceptor {
            inner: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        },
        Reloader {
            dir: dir.to_path_buf(),
            resolver,
            loaded: pem,
            reloads,
            interval,
        },
    ))
}

impl Reloader {
    /// Re-reads the files every interval until `stop`; a changed, valid pair replaces the
    /// served one.
    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
            self.check().await;
        }
    }

    /// One check (public for tests through [`Reloader::run`]).
    async fn check(&mut self) {
        let dir = self.dir.clone();
        let Ok(Ok(pem)) = tokio::task::spawn_blocking(move || read(&dir)).await else {
            // A Secret being re-mounted may be missing for a moment; the next check sees it.
            return;
        };
        if pem == self.loaded {
            return;
        }
        match certified_key(&pem) {
            Ok(ck) => {
                *self.resolver.current.write() = Arc::new(ck);
                self.reloads.with_label_values(&["ok"]).inc();
                tracing::info!(dir = %self.dir.display(), "gateway TLS certificate reloaded");
            }
            Err(e) => {
                self.reloads.with_label_values(&["error"]).inc();
                tracing::warn!(dir = %self.dir.display(), error = format!("{e:#}"), "gateway TLS files changed but do not load; keeping the previous certificate");
            }
        }
        self.loaded = pem;
    }
}
