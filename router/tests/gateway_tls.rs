//! TLS termination of a listener over real HTTPS on loopback, with certificates made by
//! rcgen: HTTP/1.1 and h2 by ALPN, a rotated certificate served to new connections while an
//! open one keeps working, and a broken pair that keeps the old certificate.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kvroute_router::listener::{self, ListenerConfig, ListenerMetrics};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(30);

/// A self-signed certificate for `localhost` (its own trust anchor) written as the pair.
fn write_pair(dir: &std::path::Path, name: &str) -> CertificateDer<'static> {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("cert");
    // Key first: a reload that sees only one new file fails to load and is retried.
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).expect("key");
    std::fs::write(dir.join("tls.crt"), cert.pem()).expect("cert");
    cert.der().clone()
}

fn connector(trusted: &[CertificateDer<'static>], alpn: &[u8]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in trusted {
        roots.add(c.clone()).expect("root");
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// A TLS connection; returns the stream, the negotiated ALPN and the server's certificate.
async fn dial(
    addr: std::net::SocketAddr,
    trusted: &[CertificateDer<'static>],
    alpn: &[u8],
) -> std::io::Result<(
    tokio_rustls::client::TlsStream<TcpStream>,
    Option<Vec<u8>>,
    CertificateDer<'static>,
)> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").expect("name");
    let tls = connector(trusted, alpn).connect(name, tcp).await?;
    let (_, conn) = tls.get_ref();
    let alpn = conn.alpn_protocol().map(<[u8]>::to_vec);
    let cert = conn
        .peer_certificates()
        .and_then(|c| c.first().cloned())
        .expect("server certificate");
    Ok((tls, alpn, cert))
}

async fn body_text(resp: http::Response<hyper::body::Incoming>) -> String {
    let bytes = axum::body::to_bytes(Body::new(resp.into_body()), 1 << 16)
        .await
        .expect("body");
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test]
async fn https_h1_and_h2_and_rotation_without_dropping_connections() {
    let dir = tempfile::tempdir().expect("dir");
    let first = write_pair(dir.path(), "first");
    let registry = prometheus::Registry::new();
    let (acceptor, reloader) =
        listener::tls::load(dir.path(), Duration::from_millis(50), &registry).expect("load");
    let stop = CancellationToken::new();
    tokio::spawn(reloader.run(stop.clone()));
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = tcp.local_addr().expect("addr");
    let app = Router::new().route("/hello", get(|| async { "hello over tls" }));
    let metrics = ListenerMetrics::unregistered().expect("metrics");
    tokio::spawn(listener::serve(
        tcp,
        app,
        ListenerConfig::defaults("gateway"),
        Some(acceptor),
        metrics.clone(),
        stop.clone(),
    ));

    // HTTP/1.1.
    let (tls, alpn, cert) = dial(addr, std::slice::from_ref(&first), b"http/1.1")
        .await
        .expect("h1 handshake");
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert_eq!(cert, first);
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("h1");
    tokio::spawn(conn);
    let resp = h1
        .send_request(
            http::Request::get("/hello")
                .body(Body::empty())
                .expect("req"),
        )
        .await
        .expect("h1 response");
    assert_eq!(resp.status(), 200);
    assert_eq!(body_text(resp).await, "hello over tls");

    // h2, kept open across the rotation.
    let (tls, alpn, _) = dial(addr, std::slice::from_ref(&first), b"h2")
        .await
        .expect("h2 handshake");
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2");
    tokio::spawn(conn);
    let resp = h2
        .send_request(
            http::Request::get("https://localhost/hello")
                .body(Body::empty())
                .expect("req"),
        )
        .await
        .expect("h2 response");
    assert_eq!(resp.status(), 200);
    assert_eq!(body_text(resp).await, "hello over tls");

    // A client that trusts nothing of ours fails its handshake, counted.
    let stranger = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .self_signed(&rcgen::KeyPair::generate().expect("key"))
        .expect("cert");
    assert!(dial(addr, &[stranger.der().clone()], b"h2").await.is_err());

    // Rotate: new connections get the new certificate.
    let second = write_pair(dir.path(), "second");
    let end = Instant::now() + DEADLINE;
    loop {
        if let Ok((_, _, cert)) = dial(addr, &[first.clone(), second.clone()], b"h2").await
            && cert == second
        {
            break;
        }
        assert!(Instant::now() < end, "the new certificate was never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The connections opened before the rotation still work.
    for _ in 0..2 {
        let resp = h2
            .send_request(
                http::Request::get("https://localhost/hello")
                    .body(Body::empty())
                    .expect("req"),
            )
            .await
            .expect("h2 after rotation");
        assert_eq!(resp.status(), 200);
    }
    let resp = h1
        .send_request(
            http::Request::get("/hello")
                .body(Body::empty())
                .expect("req"),
        )
        .await
        .expect("h1 after rotation");
    assert_eq!(resp.status(), 200);

    // A broken pair (a key that is not the certificate's) keeps the served one.
    let errors = |r: &prometheus::Registry| {
        r.gather()
            .iter()
            .filter(|f| f.name() == "kvroute_router_gateway_tls_reloads_total")
            .flat_map(|f| f.get_metric().to_vec())
            .filter(|m| m.get_label().iter().any(|l| l.value() == "error"))
            .map(|m| m.get_counter().get_value())
            .sum::<f64>()
    };
    let before = errors(&registry);
    let other_key = rcgen::KeyPair::generate().expect("key");
    std::fs::write(dir.path().join("tls.key"), other_key.serialize_pem()).expect("key");
    let end = Instant::now() + DEADLINE;
    while errors(&registry) <= before {
        assert!(Instant::now() < end, "the broken pair was never noticed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, _, cert) = dial(addr, std::slice::from_ref(&second), b"h2")
        .await
        .expect("still serving the rotated pair");
    assert_eq!(cert, second);
    assert_eq!(
        metrics.refused("gateway", listener::Refusal::TlsHandshake),
        1
    );
    stop.cancel();
}

#[test]
fn a_directory_without_a_valid_pair_fails_to_load() {
    let dir = tempfile::tempdir().expect("dir");
    let registry = prometheus::Registry::new();
    let err = listener::tls::load(dir.path(), Duration::from_secs(1), &registry)
        .err()
        .expect("no files");
    assert!(format!("{err:#}").contains("tls.crt"), "{err:#}");
    std::fs::write(dir.path().join("tls.crt"), "not pem").expect("crt");
    std::fs::write(dir.path().join("tls.key"), "not pem").expect("key");
    assert!(listener::tls::load(dir.path(), Duration::from_secs(1), &registry).is_err());
}
