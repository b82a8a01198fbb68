//! Who may call the admin port's `/debug/*` views: callers on the loopback interface (a
//! `kubectl port-forward`, `kvroute explain` in the pod), and callers that present
//! `Authorization: Bearer <token>` matching `--admin-token-file`. `/metrics`, `/healthz` and
//! `/readyz` stay open for scrapers and probes. `/drain` (it makes the replica unready, so
//! an open one would let any pod take the router out of its Service) is for the same callers
//! plus the node's own address (`--drain-from-ip`, the downward API's `status.hostIP`):
//! the kubelet runs the preStop hook's `httpGet` from there.
//!
//! ```text
//! request --peer loopback?--> allowed
//!         --/drain and peer == --drain-from-ip?--> allowed
//!         --bearer token == file's (SHA-256 digests, constant-time compare)--> allowed
//!         --else--> 401 (nothing about the router), unauthorized_total{reason}
//! ```
//!
//! The file is re-read when its modification time or size changes (a mounted Secret is
//! updated in place), so the token rotates without a restart.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use prometheus::{IntCounterVec, Opts, Registry};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Why a `/debug/*` call was refused (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unauthorized {
    /// No `Authorization: Bearer` header.
    MissingToken,
    /// A token that does not match.
    WrongToken,
    /// A remote caller, and no `--admin-token-file` (or it is empty or unreadable).
    NoTokenConfigured,
}

impl Unauthorized {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Unauthorized::MissingToken => "missing_token",
            Unauthorized::WrongToken => "wrong_token",
            Unauthorized::NoTokenConfigured => "no_token_configured",
        }
    }
}

/// The token file as last read: (modified, length) and the token's digest.
type Cached = Option<((Option<SystemTime>, u64), Option<[u8; 32]>)>;

/// The admin port's caller check. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AdminAuth {
    file: Option<PathBuf>,
    /// The node's address, allowed to call `/drain` (the kubelet's preStop `httpGet`).
    drain_from: Option<IpAddr>,
    cached: Arc<Mutex<Cached>>,
    refused: IntCounterVec,
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl AdminAuth {
    /// Checks against `file` (None: loopback callers only); counts refusals in `registry`.
    pub fn new(file: Option<PathBuf>, registry: &Registry) -> prometheus::Result<Self> {
        let auth = Self::unregistered(file)?;
        registry.register(Box::new(auth.refused.clone()))?;
        Ok(auth)
    }

    /// Without exported metrics (tests).
    pub fn unregistered(file: Option<PathBuf>) -> prometheus::Result<Self> {
        Ok(Self {
            file,
            drain_from: None,
            cached: Arc::new(Mutex::new(None)),
            refused: IntCounterVec::new(
                Opts::new(
                    "kvroute_router_admin_unauthorized_total",
                    "Calls to the admin port's /debug/* and /drain refused with 401, by reason.",
                ),
                &["reason"],
            )?,
        })
    }

    /// Also lets `ip` (the node's address, where the kubelet's preStop hook comes from) call
    /// `/drain`.
    pub fn with_drain_from(mut self, ip: Option<IpAddr>) -> Self {
        self.drain_from = ip;
        self
    }

    /// Whether a caller from `peer` with `headers` may call `/drain`: as for `/debug/*`, or
    /// from the node's address.
    pub async fn check_drain(
        &self,
        peer: Option<SocketAddr>,
        headers: &http::HeaderMap,
    ) -> Result<(), Unauthorized> {
        if let (Some(p), Some(node)) = (peer, self.drain_from)
            && p.ip().to_canonical() == node.to_canonical()
        {
            return Ok(());
        }
        self.check(peer, headers).await
    }

    /// Refusals so far for `why`.
    pub fn refused(&self, why: Unauthorized) -> u64 {
        self.refused.with_label_values(&[why.label()]).get()
    }

    /// The token's digest, re-read when the file changed; None when unset or unreadable.
    async fn token(&self) -> Option<[u8; 32]> {
        let file = self.file.as_ref()?;
        let Ok(meta) = tokio::fs::metadata(file).await else {
            tracing::warn!(file = %file.display(), "admin token file unreadable");
            return None;
        };
        let stamp = (meta.modified().ok(), meta.len());
        if let Some((seen, token)) = *self.cached.lock()
            && seen == stamp
        {
            return token;
        }
        let token = match tokio::fs::read(file).await {
            Ok(bytes) => {
                let t = bytes.trim_ascii();
                (!t.is_empty()).then(|| digest(t))
            }
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "admin token file unreadable");
                None
            }
        };
        *self.cached.lock() = Some((stamp, token));
        token
    }

    /// Whether a caller from `peer` with `headers` may use `/debug/*`.
    pub async fn check(
        &self,
        peer: Option<SocketAddr>,
        headers: &http::HeaderMap,
    ) -> Result<(), Unauthorized> {
        if peer.is_some_and(|p| p.ip().to_canonical().is_loopback()) {
            return Ok(());
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .map(<[u8]>::trim_ascii);
        let Some(expected) = self.token().await else {
            return Err(Unauthorized::NoTokenConfigured);
        };
        let Some(presented) = presented.filter(|p| !p.is_empty()) else {
            return Err(Unauthorized::MissingToken);
        };
        if bool::from(digest(presented).ct_eq(&expected)) {
            Ok(())
        } else {
            Err(Unauthorized::WrongToken)
        }
    }
}

/// Middleware for the `/debug/*` routes.
pub async fn require(State(auth): State<AdminAuth>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let checked = auth.check(peer, req.headers()).await;
    answer(&auth, peer, checked, req, next).await
}

/// Middleware for `/drain`: as [`require`], plus the node's address.
pub async fn require_drain(State(auth): State<AdminAuth>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let checked = auth.check_drain(peer, req.headers()).await;
    answer(&auth, peer, checked, req, next).await
}

async fn answer(
    auth: &AdminAuth,
    peer: Option<SocketAddr>,
    checked: Result<(), Unauthorized>,
    req: Request,
    next: Next,
) -> Response {
    match checked {
        Ok(()) => next.run(req).await,
        Err(why) => {
            auth.refused.with_label_values(&[why.label()]).inc();
            tracing::debug!(reason = why.label(), ?peer, "admin call refused");
            let mut resp = (
                StatusCode::UNAUTHORIZED,
                axum::Json(serde_json::json!({"error": {
                    "message": "authentication required: call from loopback or send Authorization: Bearer <admin token>",
                    "type": "authentication_error"}})),
            )
                .into_response();
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            resp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, a.parse().expect("header"));
        }
        h
    }

    #[tokio::test]
    async fn drain_is_open_to_loopback_the_node_and_the_token_only() {
        let auth = AdminAuth::unregistered(None)
            .expect("auth")
            .with_drain_from(Some("10.0.0.7".parse().expect("ip")));
        let peer = |ip: &str| Some(SocketAddr::new(ip.parse().expect("ip"), 40000));
        assert_eq!(
            auth.check_drain(peer("127.0.0.1"), &headers(None)).await,
            Ok(())
        );
        assert_eq!(
            auth.check_drain(peer("10.0.0.7"), &headers(None)).await,
            Ok(())
        );
        assert_eq!(
            auth.check_drain(peer("10.0.0.8"), &headers(None)).await,
            Err(Unauthorized::NoTokenConfigured)
        );
        // The node's address is no key to /debug/*.
        assert_eq!(
            auth.check(peer("10.0.0.7"), &headers(None)).await,
            Err(Unauthorized::NoTokenConfigured)
        );
    }

    #[tokio::test]
    async fn loopback_passes_remote_needs_the_token_and_rotation_is_seen() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret\n").expect("write");
        let auth = AdminAuth::unregistered(Some(file.clone())).expect("auth");
        let local: SocketAddr = "127.0.0.1:5000".parse().expect("addr");
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5000".parse().expect("addr");
        let remote: SocketAddr = "10.1.2.3:5000".parse().expect("addr");
        assert_eq!(auth.check(Some(local), &headers(None)).await, Ok(()));
        assert_eq!(auth.check(Some(mapped), &headers(None)).await, Ok(()));
        assert_eq!(
            auth.check(Some(remote), &headers(None)).await,
            Err(Unauthorized::MissingToken)
        );
        assert_eq!(
            auth.check(None, &headers(Some("Bearer wrong"))).await,
            Err(Unauthorized::WrongToken)
        );
        assert_eq!(
            auth.check(Some(remote), &headers(Some("Basic s3cret")))
                .await,
            Err(Unauthorized::MissingToken)
        );
        assert_eq!(
            auth.check(Some(remote), &headers(Some("Bearer s3cret")))
                .await,
            Ok(())
        );
        // Rotation: a new token (another length, so the change is seen whatever the
        // file system's timestamp resolution).
        std::fs::write(&file, "rotated-token").expect("rewrite");
        assert_eq!(
            auth.check(Some(remote), &headers(Some("Bearer s3cret")))
                .await,
            Err(Unauthorized::WrongToken)
        );
        assert_eq!(
            auth.check(Some(remote), &headers(Some("Bearer rotated-token")))
                .await,
            Ok(())
        );
        std::fs::write(&file, "  \n").expect("empty");
        assert_eq!(
            auth.check(Some(remote), &headers(Some("Bearer rotated-token")))
                .await,
            Err(Unauthorized::NoTokenConfigured)
        );
    }

    #[tokio::test]
    async fn without_a_token_file_only_loopback_passes() {
        let auth = AdminAuth::unregistered(None).expect("auth");
        let remote: SocketAddr = "192.0.2.1:1".parse().expect("addr");
        assert_eq!(
            auth.check(Some(remote), &headers(Some("Bearer x"))).await,
            Err(Unauthorized::NoTokenConfigured)
        );
        assert_eq!(
            auth.check(None, &headers(None)).await,
            Err(Unauthorized::NoTokenConfigured)
        );
    }
}
