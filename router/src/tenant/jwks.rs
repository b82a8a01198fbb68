//! Where JWT verification keys come from: a key of a Secret under `--secrets-dir`, or an
//! `https://` URL fetched with the router's HTTP client (rustls, the Mozilla roots). Each
//! source's last good [`Jwks`] is cached; a failed load keeps it and is counted.
//!
//! ```text
//! JwksSource::Secret --first use: read now; refresh task: every 2 s--> parse_jwks --> cache
//! JwksSource::Url    --refresh task: every 5 min, sooner on an unknown kid (≤ 1 per 30 s),
//!                      after a failure 1 s, 2 s, ... ≤ 5 min; ≤ 64 KiB, 10 s timeout--> cache
//! verify: cache only (never a fetch on the request path; no keys yet = 401)
//! ```
//!
//! Plain `http://` is refused except to a loopback address (tests, a local sidecar).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use super::jwt::{Jwks, JwksError, MAX_JWKS_BYTES, parse_jwks};
use super::metrics::TenantMetrics;
use super::secrets::SecretFiles;

/// Re-fetch period of a JWKS URL.
pub const URL_REFRESH: Duration = Duration::from_secs(300);
/// An unknown `kid` triggers a fetch at most this often per URL.
pub const FORCED_REFRESH_MIN: Duration = Duration::from_secs(30);
/// A whole JWKS fetch (connect, TLS, request, body) takes at most this long.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// URL sources held (one per pool at most; bounded all the same).
const MAX_SOURCES: usize = 256;

/// A JWKS source.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum JwksSource {
    /// `https://` URL.
    Url(String),
    /// A key of a Secret in the router's namespace.
    Secret {
        /// Secret name.
        name: String,
        /// Data key.
        key: String,
    },
}

#[derive(Debug)]
struct Slot {
    jwks: Option<Arc<Jwks>>,
    /// The Secret file's bytes last parsed (Secret sources).
    raw: Option<Vec<u8>>,
    next_fetch: Instant,
    last_forced: Option<Instant>,
    failures: u32,
}

/// The cached JWKS of every source in use.
pub struct JwksStore {
    secrets: Arc<SecretFiles>,
    slots: RwLock<HashMap<JwksSource, Slot>>,
    metrics: TenantMetrics,
    tls: Option<tokio_rustls::TlsConnector>,
}

/// Why a URL fetch failed (metric label).
fn fetch_error_label(e: &FetchError) -> &'static str {
    match e {
        FetchError::Insecure => "insecure_url",
        FetchError::Http => "fetch_failed",
        FetchError::Status => "bad_status",
        FetchError::Jwks(j) => j.label(),
    }
}

#[derive(Debug)]
enum FetchError {
    Insecure,
    Http,
    Status,
    Jwks(JwksError),
}

fn tls_connector(roots: rustls::RootCertStore) -> Option<tokio_rustls::TlsConnector> {
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| tracing::warn!(error = %e, "no TLS for JWKS URLs"))
    .ok()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Some(tokio_rustls::TlsConnector::from(Arc::new(tls)))
}

/// One GET over HTTP/1.1 on `io`; the body, at most [`MAX_JWKS_BYTES`].
async fn get_on<T>(io: T, uri: &http::Uri) -> Result<Vec<u8>, FetchError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use http_body::Body as _;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|_| FetchError::Http)?;
    tokio::spawn(conn);
    let host = uri
        .authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or_default();
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let req = http::Request::get(path)
        .header(http::header::HOST, host)
        .header(http::header::ACCEPT, "application/json")
        .body(http_body_util_empty())
        .map_err(|_| FetchError::Http)?;
    let resp = send.send_request(req).await.map_err(|_| FetchError::Http)?;
    if !resp.status().is_success() {
        return Err(FetchError::Status);
    }
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        let frame = frame.map_err(|_| FetchError::Http)?;
        if let Some(data) = frame.data_ref() {
            if out.len() + data.len() > MAX_JWKS_BYTES {
                return Err(FetchError::Jwks(JwksError::TooLarge));
            }
            out.extend_from_slice(data);
        }
    }
    Ok(out)
}

/// An empty request body.
fn http_body_util_empty() -> EmptyBody {
    EmptyBody
}

/// A request body with no bytes.
struct EmptyBody;

impl http_body::Body for EmptyBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        true
    }
}

/// Is `url` fetchable: `https://`, or `http://` to a loopback address.
pub fn allowed_url(url: &str) -> bool {
    if url.starts_with("https://") {
        return true;
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?']).next().unwrap_or_default();
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl JwksStore {
    /// A store reading Secrets through `secrets`; URLs are verified against the Mozilla roots
    /// (`webpki-roots`).
    pub fn new(secrets: Arc<SecretFiles>, metrics: TenantMetrics) -> Self {
        Self::with_roots(
            secrets,
            metrics,
            rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
        )
    }

    /// The same, verifying `https://` URLs against `roots` instead.
    pub fn with_roots(
        secrets: Arc<SecretFiles>,
        metrics: TenantMetrics,
        roots: rustls::RootCertStore,
    ) -> Self {
        Self {
            secrets,
            slots: RwLock::new(HashMap::new()),
            metrics,
            tls: tls_connector(roots),
        }
    }

    /// The cached keys of `src`. A Secret source is read on first use; a URL source is
    /// registered for the refresh task and has no keys until its first fetch.
    pub fn get(&self, src: &JwksSource) -> Option<Arc<Jwks>> {
        if let Some(s) = self.slots.read().get(src) {
            return s.jwks.clone();
        }
        let now = Instant::now();
        let jwks = match src {
            JwksSource::Secret { name, key } => self.load_secret(name, key),
            JwksSource::Url(_) => None,
        };
        let mut slots = self.slots.write();
        if slots.len() >= MAX_SOURCES {
            return jwks;
        }
        slots.entry(src.clone()).or_insert(Slot {
            jwks: jwks.clone(),
            raw: None,
            next_fetch: now,
            last_forced: None,
            failures: 0,
        });
        jwks
    }

    /// A token named a `kid` the cached keys lack: fetch the URL soon (at most once per
    /// [`FORCED_REFRESH_MIN`]), in case the issuer rotated.
    pub fn unknown_kid(&self, src: &JwksSource, now: Instant) {
        if let (JwksSource::Url(_), Some(slot)) = (src, self.slots.write().get_mut(src))
            && slot
                .last_forced
                .is_none_or(|t| now.saturating_duration_since(t) >= FORCED_REFRESH_MIN)
        {
            slot.last_forced = Some(now);
            slot.next_fetch = slot.next_fetch.min(now);
        }
    }

    fn load_secret(&self, name: &str, key: &str) -> Option<Arc<Jwks>> {
        let bytes = self.secrets.read(name, key).ok()?;
        self.parse_secret(name, key, &bytes)
    }

    fn parse_secret(&self, name: &str, key: &str, bytes: &[u8]) -> Option<Arc<Jwks>> {
        match parse_jwks(bytes) {
            Ok(j) => Some(Arc::new(j)),
            Err(e) => {
                self.metrics
                    .jwks_errors
                    .with_label_values(&[e.label()])
                    .inc();
                tracing::warn!(secret = name, key, error = %e, "bad JWKS in a Secret; keeping the last good one");
                None
            }
        }
    }

    /// Re-reads the Secret sources, forgets sources not in `wanted`. A wanted Secret source
    /// never used yet is read now, so a missing or bad JWKS is counted (and the operator's
    /// condition matched by a router counter) before the first token needs it.
    pub fn refresh_secrets(&self, wanted: &[JwksSource]) {
        for src in wanted {
            let fresh =
                matches!(src, JwksSource::Secret { .. }) && !self.slots.read().contains_key(src);
            if fresh {
                self.get(src);
            }
        }
        let sources: Vec<JwksSource> = self.slots.read().keys().cloned().collect();
        for src in sources {
            if !wanted.contains(&src) {
                self.slots.write().remove(&src);
                continue;
            }
            let JwksSource::Secret { name, key } = &src else {
                continue;
            };
            let Ok(bytes) = self.secrets.read(name, key) else {
                continue;
            };
            // Parsed (and a bad document counted and logged) only when the file changed.
            let changed = self
                .slots
                .read()
                .get(&src)
                .is_some_and(|s| s.raw.as_deref() != Some(bytes.as_slice()));
            if !changed {
                continue;
            }
            let parsed = self.parse_secret(name, key, &bytes);
            if let Some(slot) = self.slots.write().get_mut(&src) {
                slot.raw = Some(bytes);
                if parsed.is_some() {
                    slot.jwks = parsed;
                }
            }
        }
    }

    /// Fetches every URL source that is due.
    pub async fn refresh_urls(&self, now: Instant) {
        let due: Vec<String> = self
            .slots
            .read()
            .iter()
            .filter_map(|(k, s)| match k {
                JwksSource::Url(u) if s.next_fetch <= now => Some(u.clone()),
                _ => None,
            })
            .collect();
        for url in due {
            let fetched = self.fetch(&url).await;
            let mut slots = self.slots.write();
            let Some(slot) = slots.get_mut(&JwksSource::Url(url.clone())) else {
                continue;
            };
            match fetched {
                Ok(j) => {
                    slot.jwks = Some(Arc::new(j));
                    slot.failures = 0;
                    slot.next_fetch = now + URL_REFRESH;
                }
                Err(e) => {
                    slot.failures = slot.failures.saturating_add(1);
                    let backoff = Duration::from_secs(1 << slot.failures.min(9)).min(URL_REFRESH);
                    slot.next_fetch = now + backoff;
                    self.metrics
                        .jwks_errors
                        .with_label_values(&[fetch_error_label(&e)])
                        .inc();
                    tracing::warn!(
                        url,
                        reason = fetch_error_label(&e),
                        retry_s = backoff.as_secs(),
                        "cannot load a JWKS; keeping the last good one"
                    );
                }
            }
        }
    }

    async fn fetch(&self, url: &str) -> Result<Jwks, FetchError> {
        if !allowed_url(url) {
            return Err(FetchError::Insecure);
        }
        let uri: http::Uri = url.parse().map_err(|_| FetchError::Insecure)?;
        let host = uri
            .host()
            .ok_or(FetchError::Insecure)?
            .trim_matches(['[', ']'])
            .to_string();
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let work = async {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|_| FetchError::Http)?;
            if https {
                let tls = self.tls.as_ref().ok_or(FetchError::Http)?;
                let name = rustls_pki_types::ServerName::try_from(host.clone())
                    .map_err(|_| FetchError::Insecure)?;
                let stream = tls.connect(name, tcp).await.map_err(|_| FetchError::Http)?;
                get_on(stream, &uri).await
            } else {
                get_on(tcp, &uri).await
            }
        };
        let body = tokio::time::timeout(FETCH_TIMEOUT, work)
            .await
            .map_err(|_| FetchError::Http)??;
        parse_jwks(&body).map_err(FetchError::Jwks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::jwt::testing::{TestKey, jwks_of};

    #[test]
    fn urls() {
        assert!(allowed_url("https://idp.example/jwks"));
        assert!(allowed_url("http://127.0.0.1:8080/jwks"));
        assert!(allowed_url("http://[::1]:80/x"));
        assert!(allowed_url("http://localhost/x"));
        assert!(!allowed_url("http://idp.example/jwks"));
        assert!(!allowed_url("http://10.0.0.1/jwks"));
        assert!(!allowed_url("ftp://x"));
    }

    #[test]
    fn secret_source_rotates_and_keeps_the_last_good() {
        let tmp = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(tmp.path().join("idp")).expect("mkdir");
        let file = tmp.path().join("idp/jwks.json");
        let (k1, k2) = (TestKey::ec("k1"), TestKey::ec("k2"));
        std::fs::write(&file, jwks_of(&[&k1])).expect("write");
        let metrics = TenantMetrics::register(&prometheus::Registry::new(), &[]).expect("m");
        let secrets = Arc::new(SecretFiles::new(
            Some(tmp.path().to_path_buf()),
            metrics.clone(),
        ));
        let store = JwksStore::new(secrets, metrics.clone());
        let src = JwksSource::Secret {
            name: "idp".into(),
            key: "jwks.json".into(),
        };
        assert_eq!(store.get(&src).map(|j| j.len()), Some(1));
        std::fs::write(&file, jwks_of(&[&k1, &k2])).expect("rotate");
        store.refresh_secrets(std::slice::from_ref(&src));
        assert_eq!(store.get(&src).map(|j| j.len()), Some(2));
        std::fs::write(&file, "{}").expect("break");
        for _ in 0..3 {
            store.refresh_secrets(std::slice::from_ref(&src));
        }
        assert_eq!(store.get(&src).map(|j| j.len()), Some(2), "last good kept");
        let bad = metrics
            .jwks_errors
            .with_label_values(&["jwks_malformed"])
            .get();
        assert_eq!(bad, 1, "an unchanged bad file is counted once");
        // A source no pool references any more is forgotten.
        store.refresh_secrets(&[]);
        assert!(store.slots.read().is_empty());
    }

    #[tokio::test]
    async fn url_source_is_fetched_cached_and_kept_on_failure() {
        let key = TestKey::ec("k1");
        let doc = Arc::new(parking_lot::Mutex::new(jwks_of(&[&key])));
        let served = doc.clone();
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let d = served.lock().clone();
                async move { d }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });

        let metrics = TenantMetrics::register(&prometheus::Registry::new(), &[]).expect("m");
        let secrets = Arc::new(SecretFiles::new(None, metrics.clone()));
        let store = JwksStore::new(secrets, metrics.clone());
        let src = JwksSource::Url(format!("http://{addr}/jwks"));
        assert!(store.get(&src).is_none(), "nothing before the first fetch");
        let t0 = Instant::now();
        store.refresh_urls(t0).await;
        assert_eq!(store.get(&src).map(|j| j.len()), Some(1));

        // A broken document later: the good keys stay, the failure is counted, backoff.
        *doc.lock() = "{not json".into();
        store.refresh_urls(t0 + URL_REFRESH).await;
        assert_eq!(store.get(&src).map(|j| j.len()), Some(1));
        assert_eq!(
            metrics
                .jwks_errors
                .with_label_values(&["jwks_malformed"])
                .get(),
            1
        );
        // Not due yet (the first failure backs off 2 s): nothing fetched.
        store.refresh_urls(t0 + URL_REFRESH).await;
        assert_eq!(
            metrics
                .jwks_errors
                .with_label_values(&["jwks_malformed"])
                .get(),
            1
        );

        // Rotation with an unknown kid: an early fetch picks up the new key.
        let key2 = TestKey::ec("k2");
        *doc.lock() = jwks_of(&[&key, &key2]);
        let later = t0 + URL_REFRESH + Duration::from_secs(10);
        store.unknown_kid(&src, later);
        store.refresh_urls(later).await;
        assert_eq!(store.get(&src).map(|j| j.len()), Some(2));
    }

    /// A one-connection-at-a-time HTTPS server on 127.0.0.1 answering every request with
    /// `body`, its certificate for `localhost` signed by `ca`.
    async fn https_server(ca: &kvroute_tls::testpki::TestCa, body: String) -> u16 {
        use rustls_pki_types::pem::PemObject as _;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let leaf = ca.leaf(None, &["localhost"]);
        let certs: Vec<_> =
            rustls_pki_types::CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .expect("leaf PEM");
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes())
            .expect("key PEM");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    continue;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(resp.as_bytes()).await;
                let _ = tls.shutdown().await;
            }
        });
        port
    }

    #[tokio::test]
    async fn https_url_is_fetched_over_tls_and_an_unknown_ca_is_refused() {
        let key = TestKey::ec("k1");
        let ca = kvroute_tls::testpki::TestCa::new("idp");
        let port = https_server(&ca, jwks_of(&[&key])).await;
        let src = JwksSource::Url(format!("https://localhost:{port}/jwks"));

        // The IdP's CA trusted: keys fetched over TLS (SNI localhost, certificate checked).
        use rustls_pki_types::pem::PemObject as _;
        let metrics = TenantMetrics::register(&prometheus::Registry::new(), &[]).expect("m");
        let secrets = Arc::new(SecretFiles::new(None, metrics.clone()));
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
            roots.add(c.expect("CA PEM")).expect("add root");
        }
        let store = JwksStore::with_roots(secrets, metrics.clone(), roots);
        assert!(store.get(&src).is_none(), "nothing before the first fetch");
        store.refresh_urls(Instant::now()).await;
        assert_eq!(store.get(&src).map(|j| j.len()), Some(1));

        // The Mozilla roots (the router's default) do not know that CA: refused, counted,
        // no keys.
        let metrics = TenantMetrics::register(&prometheus::Registry::new(), &[]).expect("m");
        let secrets = Arc::new(SecretFiles::new(None, metrics.clone()));
        let store = JwksStore::new(secrets, metrics.clone());
        assert!(store.get(&src).is_none(), "nothing before the first fetch");
        store.refresh_urls(Instant::now()).await;
        assert!(store.get(&src).is_none(), "an unverified server gave keys");
        assert_eq!(
            metrics
                .jwks_errors
                .with_label_values(&["fetch_failed"])
                .get(),
            1
        );
    }
}
