//! The HTTPS client of one GatewayBackend: its CA bundle (or the platform's roots), SNI
//! override, optional no-verify mode, its credential header, connect and first-byte timeouts.
//!
//! ```text
//! BackendPlan + CA bytes + key bytes --build()--> BackendClient
//! BackendClient::post(path, body) --TCP (connect timeout)--TLS (sni, roots)--> provider
//!                                 <-- response head within the first-byte timeout
//! ```
//!
//! rustls on ring, as the rest of the router; hyper's pooled client (keep-alive per backend).
//! The credential header is marked sensitive (never logged by hyper) and is never echoed to
//! clients; errors carry no URL and no key.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use hyper::body::Incoming;
use hyper_rustls::{
    ConfigBuilderExt, FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder,
};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::config::{AuthPlan, BackendPlan};

/// Upstream timeouts (the router's `--provider-*-timeout-s` flags).
#[derive(Debug, Clone, Copy)]
pub struct ClientTimeouts {
    /// TCP connect.
    pub connect: Duration,
    /// From sending the request to the response head (TLS handshake included).
    pub first_byte: Duration,
    /// Longest silence between two chunks of a response body.
    pub idle: Duration,
}

impl Default for ClientTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            first_byte: Duration::from_secs(60),
            idle: Duration::from_secs(120),
        }
    }
}

/// Why a backend's client could not be built (a condition reason each).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The CA Secret holds no usable PEM certificate.
    #[error("the CA bundle holds no valid PEM certificate")]
    InvalidCaBundle,
    /// The platform has no trusted roots to verify the backend with.
    #[error("no platform CA roots were found; set spec.tls.caSecretRef")]
    NoPlatformRoots,
    /// `spec.tls.sni` is not a DNS name or IP address.
    #[error("spec.tls.sni is not a valid server name")]
    InvalidSni,
    /// The credential cannot be sent as a header value.
    #[error("the credential is not a valid HTTP header value")]
    InvalidCredential,
    /// The URL does not parse.
    #[error("spec.url is not a valid URL")]
    InvalidUrl,
    /// rustls refused the configuration.
    #[error("TLS configuration refused")]
    Tls,
}

impl BuildError {
    /// Condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidCaBundle => "InvalidCaBundle",
            Self::NoPlatformRoots => "NoPlatformRoots",
            Self::InvalidSni => "InvalidSni",
            Self::InvalidCredential => "InvalidCredential",
            Self::InvalidUrl => "InvalidUrl",
            Self::Tls => "TlsConfig",
        }
    }
}

/// How a request to a provider failed before its response head arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// TCP connect failed or timed out.
    Connect,
    /// The TLS handshake failed (certificate not trusted, wrong name, protocol).
    Tls,
    /// No response head within the first-byte timeout.
    Timeout,
    /// Anything else (connection reset after sending, protocol error).
    Other,
}

impl SendError {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Connect => "connect_error",
            Self::Tls => "tls_error",
            Self::Timeout => "timeout",
            Self::Other => "upstream_error",
        }
    }
}

type Https = Client<HttpsConnector<HttpConnector>, Body>;

/// A ready client for one backend.
#[derive(Clone)]
pub struct BackendClient {
    client: Https,
    base: String,
    auth: Option<(HeaderName, HeaderValue)>,
    insecure: bool,
    timeouts: ClientTimeouts,
}

impl std::fmt::Debug for BackendClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The base URL and the credential stay out of logs.
        f.debug_struct("BackendClient")
            .field("insecure", &self.insecure)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any certificate (`insecureSkipVerify`), still checking handshake signatures.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn roots(pem: &[u8]) -> Result<RootCertStore, BuildError> {
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|_| BuildError::InvalidCaBundle)?;
        store.add(cert).map_err(|_| BuildError::InvalidCaBundle)?;
    }
    if store.is_empty() {
        return Err(BuildError::InvalidCaBundle);
    }
    Ok(store)
}

/// The credential header for `auth` with the Secret's value (surrounding whitespace, as in a
/// file written with a trailing newline, is dropped).
fn auth_header(
    auth: Option<&AuthPlan>,
    key: Option<&[u8]>,
) -> Result<Option<(HeaderName, HeaderValue)>, BuildError> {
    let (Some(auth), Some(key)) = (auth, key) else {
        return Ok(None);
    };
    let key = std::str::from_utf8(key)
        .map_err(|_| BuildError::InvalidCredential)?
        .trim();
    let (name, value) = match auth {
        AuthPlan::Bearer(_) => (http::header::AUTHORIZATION, format!("Bearer {key}")),
        AuthPlan::Header { name, .. } => (
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| BuildError::InvalidCredential)?,
            key.to_string(),
        ),
    };
    let mut value = HeaderValue::from_str(&value).map_err(|_| BuildError::InvalidCredential)?;
    value.set_sensitive(true);
    Ok(Some((name, value)))
}

impl BackendClient {
    /// Builds the client. `ca_pem` is the CA Secret's value (when `plan.ca` is set), `key` the
    /// credential's (when `plan.auth` is set).
    pub fn build(
        plan: &BackendPlan,
        ca_pem: Option<&[u8]>,
        key: Option<&[u8]>,
        timeouts: ClientTimeouts,
    ) -> Result<Self, BuildError> {
        let uri: http::Uri = plan.url.parse().map_err(|_| BuildError::InvalidUrl)?;
        if uri.host().is_none() {
            return Err(BuildError::InvalidUrl);
        }
        let https = uri.scheme_str() == Some("https");
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|_| BuildError::Tls)?;
        let tls = if plan.insecure_skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider())))
                .with_no_client_auth()
        } else if let (true, Some(pem)) = (https, ca_pem) {
            builder
                .with_root_certificates(roots(pem)?)
                .with_no_client_auth()
        } else if https {
            builder
                .with_native_roots()
                .map_err(|_| BuildError::NoPlatformRoots)?
                .with_no_client_auth()
        } else {
            // Plain http:// backends (development): no TLS is ever used.
            builder
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth()
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeouts.connect));
        http.set_nodelay(true);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let connector = match &plan.sni {
            Some(sni) => {
                let name = ServerName::try_from(sni.clone()).map_err(|_| BuildError::InvalidSni)?;
                connector.with_server_name_resolver(FixedServerNameResolver::new(name))
            }
            None => connector,
        };
        let connector = connector.enable_http1().wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(Self {
            client,
            base: plan.url.clone(),
            auth: auth_header(plan.auth.as_ref(), key)?,
            insecure: plan.insecure_skip_verify,
            timeouts,
        })
    }

    /// Certificate verification is off.
    pub fn insecure(&self) -> bool {
        self.insecure
    }

    /// The configured timeouts.
    pub fn timeouts(&self) -> ClientTimeouts {
        self.timeouts
    }

    /// POSTs a JSON body to `path` (below the backend URL) with the credential and `headers`,
    /// returning once the response head arrived.
    pub async fn post(
        &self,
        path: &str,
        body: Bytes,
        headers: &[(HeaderName, HeaderValue)],
    ) -> Result<http::Response<Incoming>, SendError> {
        let mut req = http::Request::post(format!("{}{path}", self.base))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .map_err(|_| SendError::Other)?;
        let h = req.headers_mut();
        for (name, value) in headers {
            h.insert(name.clone(), value.clone());
        }
        if let Some((name, value)) = &self.auth {
            h.insert(name.clone(), value.clone());
        }
        match tokio::time::timeout(self.timeouts.first_byte, self.client.request(req)).await {
            Err(_) => Err(SendError::Timeout),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => {
                let kind = classify(&e);
                tracing::debug!(error = %error_chain(&e), kind = kind.label(), "provider request failed");
                Err(kind)
            }
        }
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// A rustls error somewhere in `e`, looking through io::Errors wrapping io::Errors (as the
/// TLS connector nests them).
fn is_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    if e.downcast_ref::<rustls::Error>().is_some() {
        return true;
    }
    match e
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        Some(inner) => is_tls(inner),
        None => false,
    }
}

fn classify(e: &hyper_util::client::legacy::Error) -> SendError {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = next {
        if is_tls(s) {
            return SendError::Tls;
        }
        next = s.source();
    }
    if e.is_connect() {
        SendError::Connect
    } else {
        SendError::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_crds::backend::SecretKeyRef;

    fn secret() -> SecretKeyRef {
        SecretKeyRef {
            name: "s".into(),
            key: "k".into(),
        }
    }

    #[test]
    fn credential_headers() {
        let (name, value) = auth_header(Some(&AuthPlan::Bearer(secret())), Some(b"sk-1\n"))
            .expect("valid")
            .expect("some");
        assert_eq!(name, http::header::AUTHORIZATION);
        assert_eq!(value, "Bearer sk-1");
        assert!(value.is_sensitive());
        let header = AuthPlan::Header {
            name: "x-api-key".into(),
            secret: secret(),
        };
        let (name, value) = auth_header(Some(&header), Some(b" k2 "))
            .expect("valid")
            .expect("some");
        assert_eq!(
            (name.as_str(), value.to_str().ok()),
            ("x-api-key", Some("k2"))
        );
        assert_eq!(
            auth_header(Some(&header), Some(b"a\nb")),
            Err(BuildError::InvalidCredential)
        );
        assert_eq!(auth_header(None, Some(b"k")), Ok(None));
    }

    #[test]
    fn ca_bundles_and_sni_are_checked() {
        assert_eq!(roots(b"not pem").err(), Some(BuildError::InvalidCaBundle));
        let ca = kvroute_tls::testpki::TestCa::new("provider-ca");
        assert_eq!(roots(ca.pem().as_bytes()).map(|r| r.len()), Ok(1));
        let plan = BackendPlan {
            name: "b".into(),
            url: "https://127.0.0.1:1".into(),
            ca: Some(secret()),
            sni: Some("not a name!".into()),
            insecure_skip_verify: false,
            auth: None,
        };
        let e = BackendClient::build(
            &plan,
            Some(ca.pem().as_bytes()),
            None,
            ClientTimeouts::default(),
        )
        .err();
        assert_eq!(e, Some(BuildError::InvalidSni));
    }
}
