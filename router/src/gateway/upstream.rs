//! The connection to the workers: one pooled HTTP client, connect and read timeouts.
//!
//! ```text
//! proxy --post(url, body)--> reqwest pool (keep-alive per worker) --> worker /v1/...
//! ```

use std::time::Duration;

use bytes::Bytes;

/// Timeouts and pool sizes of the upstream client.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Longest silence between two reads of a response (headers or body chunk).
    pub read_timeout: Duration,
    /// Idle keep-alive connections kept per worker.
    pub max_idle_per_worker: usize,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(300),
            max_idle_per_worker: 512,
        }
    }
}

/// How a send failed, for the retry decision.
#[derive(Debug)]
pub enum SendError {
    /// The request never reached the worker (connection refused, unreachable, connect
    /// timeout): safe to retry elsewhere.
    Connect,
    /// The worker closed or reset the connection before any byte of an answer: typically a
    /// pooled keep-alive connection that a worker shutting down gracefully (SIGTERM during a
    /// rollout) closed as the request went out, or a worker that died. The client has seen
    /// nothing yet, so it is retried elsewhere like [`SendError::Connect`] (at worst the
    /// dead worker had started on it: compute spent twice, never an answer cut).
    Reset,
    /// The worker did not answer in time.
    Timeout,
    /// Anything else after the request may have started.
    Other,
}

/// The shared, pooled client.
#[derive(Debug, Clone)]
pub struct Upstream {
    client: reqwest::Client,
}

impl Upstream {
    /// Builds the client.
    pub fn new(cfg: &UpstreamConfig) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout)
            .read_timeout(cfg.read_timeout)
            .pool_max_idle_per_host(cfg.max_idle_per_worker)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .no_proxy()
            .build()?;
        Ok(Self { client })
    }

    /// POSTs a JSON body with `extra` headers (the trace context) and returns once the
    /// response headers arrived.
    pub async fn post_json(
        &self,
        url: &str,
        body: Bytes,
        extra: http::HeaderMap,
    ) -> Result<reqwest::Response, SendError> {
        self.client
            .post(url)
            .headers(extra)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| {
                if e.is_connect() {
                    SendError::Connect
                } else if closed_before_answer(&e) {
                    SendError::Reset
                } else if e.is_timeout() {
                    SendError::Timeout
                } else {
                    SendError::Other
                }
            })
    }
}

/// Did the connection close (or reset) before the worker answered anything? `send()` returns
/// once the response head arrived, so any such error of it means no byte of an answer.
fn closed_before_answer(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled())
        {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_connection_closed_before_any_answer_is_a_reset_and_a_refused_one_a_connect() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Reads the request head, then closes without answering (as a worker that shuts
        // down, or dies, as the request arrives).
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 256];
                let _ = conn.read(&mut buf).await;
                drop(conn);
            }
        });
        let up = Upstream::new(&UpstreamConfig::default()).expect("client");
        let url = format!("http://{addr}/v1/completions");
        let err = up
            .post_json(
                &url,
                Bytes::from_static(b"{}"),
                reqwest::header::HeaderMap::new(),
            )
            .await
            .expect_err("no answer");
        assert!(matches!(err, SendError::Reset), "{err:?}");

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let gone = closed.local_addr().expect("addr");
        drop(closed);
        let err = up
            .post_json(
                &format!("http://{gone}/v1/completions"),
                Bytes::from_static(b"{}"),
                reqwest::header::HeaderMap::new(),
            )
            .await
            .expect_err("refused");
        assert!(matches!(err, SendError::Connect), "{err:?}");
    }
}
