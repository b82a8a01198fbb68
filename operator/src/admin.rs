//! Admin HTTP server: `/metrics` (Prometheus text) and `/healthz`.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;

async fn metrics(State(registry): State<Registry>) -> impl IntoResponse {
    let mut buf = Vec::new();
    match TextEncoder::new().encode(&registry.gather(), &mut buf) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
            buf,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The admin routes.
pub fn router(registry: Registry) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(registry)
}

/// Binds `addr` (port 0 picks a free port) and returns the bound address and the server future.
pub async fn bind(
    addr: SocketAddr,
    registry: Registry,
) -> std::io::Result<(SocketAddr, impl Future<Output = std::io::Result<()>>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((local, async move {
        axum::serve(listener, router(registry)).await
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_healthz_and_metrics_on_a_real_socket() {
        let registry = Registry::new();
        let m = crate::metrics::OperatorMetrics::register(&registry).expect("register");
        m.leader.set(1);
        let (addr, server) = bind("127.0.0.1:0".parse().expect("addr"), registry)
            .await
            .expect("bind");
        let task = tokio::spawn(server);
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .expect("write");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/metrics").await.contains("kvroute_operator_leader 1"));
        task.abort();
    }
}
