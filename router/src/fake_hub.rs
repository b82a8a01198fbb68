//! A stand-in for the Hugging Face Hub on 127.0.0.1 for tests (no test reaches the
//! internet): it serves one directory's tokenizer files the way huggingface.co does, so the
//! router's real download path (`hf-hub`) runs against it.
//!
//! ```text
//! GET /{repo}/resolve/{revision}/{file} --> 200 + ETag + X-Repo-Commit (byte ranges honoured)
//!     tokenizer.json --> 302 to the second server ("CDN") with X-Linked-Etag / X-Linked-Size
//!     unknown repo, revision or file --> 404 (x-error-code); gated repo without token --> 401
//! ```
//!
//! Used by the router's tokenizer tests and by the e2e tier, where the operator's router
//! downloads its tokenizer from it through `HF_ENDPOINT`.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// The commit every revision of the fake Hub resolves to.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Which repositories the fake Hub serves and from where.
#[derive(Clone, Debug)]
pub struct FakeHubConfig {
    /// Directory holding `tokenizer.json` and `tokenizer_config.json` (every repository
    /// serves these files; nothing else is read from disk).
    pub files: PathBuf,
    /// Public repositories; `None` serves any repository id.
    pub public: Option<Vec<String>>,
    /// Gated repositories and the token each needs.
    pub gated: Vec<(String, String)>,
}

/// What the fake Hub saw and how it should misbehave.
#[derive(Debug, Default)]
pub struct HubLog {
    /// (path, had an Authorization header)
    pub requests: Mutex<Vec<(String, bool)>>,
    /// Answer this many `tokenizer.json` requests with 500 first.
    pub fail_tokenizer_json: AtomicU32,
    /// Then never answer this many `tokenizer.json` requests (a stalled connection).
    pub stall_tokenizer_json: AtomicU32,
}

/// A running fake Hub; stopped when dropped.
pub struct FakeHub {
    /// Its base URL (`HF_ENDPOINT`).
    pub endpoint: String,
    /// What it saw.
    pub log: Arc<HubLog>,
    stop: CancellationToken,
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[derive(Clone)]
struct HubState {
    log: Arc<HubLog>,
    cdn: SocketAddr,
    cfg: Arc<FakeHubConfig>,
}

fn etag(bytes: &[u8]) -> String {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    format!("{:016x}{:08x}", h.finish(), bytes.len())
}

/// The repository's files (only these names; nothing else is ever read from disk).
fn repo_file(cfg: &FakeHubConfig, name: &str) -> Option<Vec<u8>> {
    ["tokenizer.json", "tokenizer_config.json"]
        .contains(&name)
        .then(|| std::fs::read(cfg.files.join(name)).ok())
        .flatten()
}

/// 206 for `Range: bytes=a-b` (end clamped), else 200.
fn ranged(headers: &HeaderMap, bytes: &[u8], mut extra: Vec<(&'static str, String)>) -> Response {
    let len = bytes.len();
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
    let mut builder = Response::builder().header(header::ACCEPT_RANGES, "bytes");
    let body = match range {
        Some((a, b)) if a < len => {
            let b = b.min(len - 1);
            extra.push(("content-range", format!("bytes {a}-{b}/{len}")));
            builder = builder.status(StatusCode::PARTIAL_CONTENT);
            bytes[a..=b].to_vec()
        }
        Some(_) => {
            return (StatusCode::RANGE_NOT_SATISFIABLE, "").into_response();
        }
        None => bytes.to_vec(),
    };
    for (k, v) in extra {
        builder = builder.header(k, v);
    }
    builder
        .body(Body::from(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn not_found(code: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        [("x-error-code", code.to_string())],
        "",
    )
        .into_response()
}

/// `/{repo}/resolve/{revision}/{file}`.
async fn hub(State(s): State<HubState>, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path().to_string();
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    s.log.requests.lock().push((path.clone(), auth.is_some()));
    let Some((repo, rest)) = path.trim_start_matches('/').split_once("/resolve/") else {
        return not_found("RepoNotFound");
    };
    let Some((revision, file)) = rest.rsplit_once('/') else {
        return not_found("EntryNotFound");
    };
    if let Some((_, token)) = s.cfg.gated.iter().find(|(r, _)| r == repo) {
        if auth.as_deref() != Some(&format!("Bearer {token}")) {
            return (StatusCode::UNAUTHORIZED, "gated").into_response();
        }
    } else if s
        .cfg
        .public
        .as_ref()
        .is_some_and(|p| !p.iter().any(|r| r == repo))
    {
        return not_found("RepoNotFound");
    }
    if revision != "main" && revision != COMMIT {
        return not_found("RevisionNotFound");
    }
    let Some(bytes) = repo_file(&s.cfg, file) else {
        return not_found("EntryNotFound");
    };
    let tag = etag(&bytes);
    if file == "tokenizer.json" {
        if s.log
            .fail_tokenizer_json
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return (StatusCode::INTERNAL_SERVER_ERROR, "try again").into_response();
        }
        if s.log
            .stall_tokenizer_json
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            std::future::pending::<()>().await;
        }
        // Large files live on the CDN: the Hub answers with a redirect that carries the
        // file's identity (as it does for LFS files).
        let location = format!("http://{}/cdn/{tag}", s.cdn);
        return Response::builder()
            .status(StatusCode::FOUND)
            .header(header::LOCATION, location)
            .header("x-linked-etag", format!("\"{tag}\""))
            .header("x-linked-size", bytes.len().to_string())
            .header("x-repo-commit", COMMIT)
            .body(Body::empty())
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    ranged(
        &headers,
        &bytes,
        vec![
            ("etag", format!("\"{tag}\"")),
            ("x-repo-commit", COMMIT.to_string()),
        ],
    )
}

/// `/cdn/{etag}`: the redirect target.
async fn cdn(State(s): State<HubState>, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path().to_string();
    s.log.requests.lock().push((path.clone(), false));
    let bytes = repo_file(&s.cfg, "tokenizer.json").unwrap_or_default();
    if path != format!("/cdn/{}", etag(&bytes)) {
        return not_found("NoSuchKey");
    }
    ranged(&headers, &bytes, Vec::new())
}

fn serve(listener: tokio::net::TcpListener, app: Router, stop: CancellationToken) {
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    });
}

impl FakeHub {
    /// Starts the Hub and its CDN on 127.0.0.1 (free ports), inside the current tokio
    /// runtime.
    pub async fn start(cfg: FakeHubConfig) -> std::io::Result<FakeHub> {
        let log = Arc::new(HubLog::default());
        let stop = CancellationToken::new();
        // The CDN is a second server: a redirect to another origin, which hf-hub reads the
        // file's size from instead of following blindly.
        let cdn_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let hub_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let hub_addr = hub_listener.local_addr()?;
        let state = HubState {
            log: log.clone(),
            cdn: cdn_listener.local_addr()?,
            cfg: Arc::new(cfg),
        };
        let cdn_app = Router::new().fallback(cdn).with_state(state.clone());
        serve(cdn_listener, cdn_app, stop.clone());
        serve(
            hub_listener,
            Router::new().fallback(hub).with_state(state),
            stop.clone(),
        );
        Ok(FakeHub {
            endpoint: format!("http://{hub_addr}"),
            log,
            stop,
        })
    }
}
