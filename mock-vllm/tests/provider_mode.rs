//! The mock as a stand-in cloud provider: `--api-key` checked on `/v1/*` (Bearer or
//! `x-api-key`), and HTTPS with `--ssl-keyfile`/`--ssl-certfile` (a test CA's certificate),
//! spoken to over real TLS.

#![allow(clippy::unwrap_used)] // test helpers: a panic is the failure report

use std::sync::Arc;

use kvroute_mock_vllm::{Args, start};
use kvroute_tls::testpki::TestCa;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn api_key_is_required_on_v1_only() {
    let s = start(Args {
        served_model_name: vec!["m".into()],
        profile: "tiny".into(),
        api_key: Some("sk-mock".into()),
        ..Args::default()
    })
    .await
    .unwrap();
    let base = format!("http://{}", s.http_addr);
    let c = reqwest::Client::new();
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(
        status(c.get(format!("{base}/v1/models")).send().await.unwrap()),
        401
    );
    let wrong = c
        .get(format!("{base}/v1/models"))
        .bearer_auth("sk-other")
        .send()
        .await
        .unwrap();
    assert_eq!(status(wrong), 401);
    let bearer = c
        .get(format!("{base}/v1/models"))
        .bearer_auth("sk-mock")
        .send()
        .await
        .unwrap();
    assert_eq!(status(bearer), 200);
    let header = c
        .get(format!("{base}/v1/models"))
        .header("x-api-key", "sk-mock")
        .send()
        .await
        .unwrap();
    assert_eq!(status(header), 200);
    // Probes stay open, as with vLLM.
    assert_eq!(
        status(c.get(format!("{base}/health")).send().await.unwrap()),
        200
    );
}

/// One HTTP/1.1 request over TLS, trusting `ca`; returns the raw response.
async fn https_request(addr: std::net::SocketAddr, ca: &TestCa, request: &str) -> String {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn serves_https_with_the_given_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("mock-provider");
    let leaf = ca.leaf(None, &["127.0.0.1"]);
    let (key, cert) = (dir.path().join("tls.key"), dir.path().join("tls.crt"));
    std::fs::write(&key, &leaf.key_pem).unwrap();
    std::fs::write(&cert, &leaf.cert_pem).unwrap();
    let s = start(Args {
        served_model_name: vec!["m".into()],
        profile: "tiny".into(),
        speedup: 100.0,
        api_key: Some("sk-mock".into()),
        ssl_keyfile: Some(key),
        ssl_certfile: Some(cert),
        ..Args::default()
    })
    .await
    .unwrap();
    let body = r#"{"model":"m","prompt":"hi","max_tokens":2}"#;
    let req = |auth: &str| {
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let denied = https_request(s.http_addr, &ca, &req("")).await;
    assert!(denied.starts_with("HTTP/1.1 401"), "{denied}");
    let ok = https_request(s.http_addr, &ca, &req("Authorization: Bearer sk-mock\r\n")).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("\"usage\""), "{ok}");
}
