//! Who may call the admin port's `/debug/*` views: callers on the loopback interface (a
//! `kubectl port-forward`, `kvroute explain` in the pod), and callers that present
//! `Authorization: Bearer <token>` matching `--admin-token-file`. `/metrics`, `/healthz`,
//! `/readyz` and `/drain` stay open for scrapers, probes and the preStop hook.
//!
//! ```text
//! request --peer loopback?--> allowed
//!         --bearer token == file's (SHA-256 digests, constant-time compare)--> allowed
//!         --else--> 401 (nothing about the router), unauthorized_total{reason}
//! ```
//!
//! The file is re-read when its modification time or size changes (a mounted Secret is
//! updated in place), so the token rotates without a restart.

use std::net::SocketAddr;
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
            cached: Arc::new(Mutex::new(None)),
            refused: IntCounterVec::new(
                Opts::new(
                    "kvroute_router_admin_unauthorized_total",
                    "Calls to the admin port's /debug/* refused with 401, by reason.",
                ),
                &["reason"],
            )?,
        })
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
    match auth.check(peer, req.headers()).await {
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
