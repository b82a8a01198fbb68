//! HTTPS for the mock (vLLM's `--ssl-keyfile` / `--ssl-certfile`), so it can stand in for a
//! cloud provider reached over TLS (the router's overflow tests).
//!
//! ```text
//! TcpListener --accept--> rustls handshake --> hyper (HTTP/1.1, h2) --> the axum app
//!   drain: stop accepting; connections already open finish on their own
//! ```

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// The acceptor for the PEM `key` and certificate chain `cert`.
pub fn acceptor(key: &Path, cert: &Path) -> anyhow::Result<TlsAcceptor> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("read {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parse {}", cert.display()))?;
    anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", cert.display());
    let key =
        PrivateKeyDer::from_pem_file(key).with_context(|| format!("read {}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS versions")?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .context("certificate and key do not match")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `app` over TLS until `draining` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    mut draining: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    loop {
        let (tcp, _) = tokio::select! {
            biased;
            _ = draining.wait_for(|d| *d) => return Ok(()),
            accepted = listener.accept() => accepted?,
        };
        // As vLLM's server does (see the plain-HTTP listener in lib.rs).
        let _ = tcp.set_nodelay(true);
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            // A client that does not trust the certificate just ends its connection.
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                .await;
        });
    }
}
