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
                } else if e.is_timeout() {
                    SendError::Timeout
                } else {
                    SendError::Other
                }
            })
    }
}
