//! Fetching a model's tokenizer files from where its WorkerSet says they are: the Hugging
//! Face Hub (through the `hf-hub` crate and its on-disk cache), or a directory (a mounted
//! ConfigMap or a path in the router container). One call is one attempt; the retry loop
//! with backoff lives in [`crate::tokenizer_loader`].
//!
//! ```text
//! ResolvedTokenizer::Hub{repo, revision, token}
//!     --token file (<hub-token-dir>/<secret>/<key>, read per attempt)
//!     --hf_hub::api::tokio  GET {HF_ENDPOINT}/{repo}/resolve/{revision}/{file}
//!          (cache: $HF_HOME/hub, shared by every attempt; HF_HUB_OFFLINE=1: cache only)
//! ResolvedTokenizer::ConfigMap(name) --> <config-map-dir>/<name>/
//! ResolvedTokenizer::Path(dir) -------> dir
//!     --> TokenizerFiles (tokenizer.json required; tokenizer_config.json,
//!         special_tokens_map.json, chat_template.jinja, generation_config.json optional)
//! ```
//!
//! The Hub is reached through `HF_ENDPOINT` (a mirror or a test server) and caches under
//! `HF_HOME` exactly as the Python `huggingface_hub` does, so a cache volume filled by one
//! can be read by the other. `hf-hub` itself does not read `HF_HUB_OFFLINE`; [`HubConfig`]
//! does, and then only looks in the cache.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hf_hub::api::tokio::{ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use kvroute_crds::workerset::ResolvedTokenizer;
use kvroute_tokenization::TokenizerFiles;

/// The Hugging Face environment variables [`HubConfig::from_env`] reads.
pub const HUB_ENV: &[&str] = &["HF_ENDPOINT", "HF_HOME", "HF_HUB_OFFLINE"];

/// The file every tokenizer needs.
pub const TOKENIZER_JSON: &str = "tokenizer.json";

/// Files read when present, besides `tokenizer.json`: the tokenizer's configuration (with the
/// chat template of most models), special tokens, the chat template of newer models, and the
/// generation config (extra end-of-sequence ids).
pub const OPTIONAL_FILES: [&str; 4] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
];

/// How the router reaches the Hub and where mounted tokenizers appear.
#[derive(Clone, Debug, Default)]
pub struct HubConfig {
    /// Hub base URL (`HF_ENDPOINT`); `None`: `https://huggingface.co`.
    pub endpoint: Option<String>,
    /// The hub cache directory (`$HF_HOME/hub`); `None`: hf-hub's default.
    pub cache_dir: Option<PathBuf>,
    /// `HF_HUB_OFFLINE`: never touch the network, read the cache only.
    pub offline: bool,
    /// Where the operator mounts the token Secrets: `<dir>/<secret name>/<key>`.
    pub token_dir: PathBuf,
    /// Where the operator mounts tokenizer ConfigMaps: `<dir>/<configmap name>/`.
    pub config_map_dir: PathBuf,
}

impl HubConfig {
    /// Reads `HF_ENDPOINT`, `HF_HOME` and `HF_HUB_OFFLINE` (`1`, `true`, `yes`, `on`).
    pub fn from_env(token_dir: PathBuf, config_map_dir: PathBuf) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            endpoint: var("HF_ENDPOINT").map(|e| e.trim_end_matches('/').to_string()),
            cache_dir: var("HF_HOME").map(|h| PathBuf::from(h).join("hub")),
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| {
                matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
            }),
            token_dir,
            config_map_dir,
        }
    }
}

/// Why one attempt failed. `label()` is the metric label; the message is for logs and the
/// router's debug view, never for clients.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The repository, revision or `tokenizer.json` does not exist (HTTP 404), or a
    /// directory has no `tokenizer.json`.
    #[error("{0}: not found")]
    NotFound(String),
    /// HTTP 401/403: a gated or private repository without a (valid) token. The Hub also
    /// answers 401 for repositories that do not exist.
    #[error(
        "{0}: not authorized (gated or private repository, or it does not exist); set tokenSecretRef"
    )]
    Unauthorized(String),
    /// The token Secret is not mounted (missing Secret or key, or the operator has not yet
    /// rolled out the router with it).
    #[error("token file {0} is missing or empty")]
    TokenMissing(PathBuf),
    /// `HF_HUB_OFFLINE` is set and the cache does not hold the file.
    #[error("{0}: not in the cache and HF_HUB_OFFLINE is set")]
    OfflineMiss(String),
    /// Another HTTP status.
    #[error("{url}: HTTP {status}")]
    Http {
        /// The file's URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// Connection, TLS or timeout.
    #[error("{0}: network error")]
    Network(String),
    /// The server answered without what the Hub protocol needs (ETag, X-Repo-Commit,
    /// Content-Range).
    #[error("{what}: unexpected response: {detail}")]
    Protocol {
        /// The file.
        what: String,
        /// The client's complaint.
        detail: String,
    },
    /// Reading or writing the cache or a directory failed.
    #[error("{what}: {source}")]
    Io {
        /// The file.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The files were fetched but do not make a tokenizer.
    #[error("invalid tokenizer: {0}")]
    Invalid(String),
    /// Fetching the files took longer than `--tokenizer-fetch-timeout-s`.
    #[error("{what}: files not fetched within {after:?} (--tokenizer-fetch-timeout-s)")]
    Timeout {
        /// The source.
        what: String,
        /// How long the attempt ran.
        after: Duration,
    },
}

impl FetchError {
    /// Bounded metric label.
    pub fn label(&self) -> &'static str {
        match self {
            FetchError::NotFound(_) => "not_found",
            FetchError::Unauthorized(_) => "unauthorized",
            FetchError::TokenMissing(_) => "token_missing",
            FetchError::OfflineMiss(_) => "offline_miss",
            FetchError::Http { .. } => "http",
            FetchError::Network(_) => "network",
            FetchError::Protocol { .. } => "protocol",
            FetchError::Io { .. } => "io",
            FetchError::Invalid(_) => "invalid",
            FetchError::Timeout { .. } => "timeout",
        }
    }

    /// True for a 404 (an optional file that is simply absent).
    fn is_not_found(&self) -> bool {
        matches!(self, FetchError::NotFound(_))
    }
}

/// Backoff before attempt `failures + 1`: `base * 2^(failures - 1)`, at most `cap`.
pub fn backoff(failures: u32, base: Duration, cap: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(30);
    base.saturating_mul(1u32 << exp).min(cap)
}

/// Fetches the files of `source`. `origin` in the result says where they came from.
pub async fn fetch(
    cfg: &HubConfig,
    source: &ResolvedTokenizer,
) -> Result<(TokenizerFiles, String), FetchError> {
    match source {
        ResolvedTokenizer::Hub {
            repo,
            revision,
            token,
        } => {
            let token = match token {
                Some((secret, key)) => Some(read_token(&cfg.token_dir, secret, key)?),
                None => None,
            };
            let files = fetch_hub(cfg, repo, revision, token).await?;
            Ok((files, format!("hub {repo}@{revision}")))
        }
        ResolvedTokenizer::ConfigMap(name) => {
            if !is_file_name(name) {
                return Err(FetchError::NotFound(format!("configMap {name}")));
            }
            let dir = cfg.config_map_dir.join(name);
            let files = read_dir_files(&dir).await?;
            Ok((files, format!("configMap {name}")))
        }
        ResolvedTokenizer::Path(p) => {
            let files = read_dir_files(Path::new(p)).await?;
            Ok((files, format!("path {p}")))
        }
    }
}

/// A Secret or key name usable as one path component.
fn is_file_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\0'])
}

/// Reads `<dir>/<secret>/<key>`, trimmed; re-read on every attempt so a rotated Secret is
/// picked up without a restart.
fn read_token(dir: &Path, secret: &str, key: &str) -> Result<String, FetchError> {
    let path = dir.join(secret).join(key);
    if !is_file_name(secret) || !is_file_name(key) {
        return Err(FetchError::TokenMissing(path));
    }
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_string()),
        _ => Err(FetchError::TokenMissing(path)),
    }
}

async fn read_dir_files(dir: &Path) -> Result<TokenizerFiles, FetchError> {
    let read = |name: &'static str| {
        let path = dir.join(name);
        async move {
            match tokio::fs::read(&path).await {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(FetchError::Io {
                    what: path.display().to_string(),
                    source,
                }),
            }
        }
    };
    let Some(tokenizer_json) = read(TOKENIZER_JSON).await? else {
        return Err(FetchError::NotFound(
            dir.join(TOKENIZER_JSON).display().to_string(),
        ));
    };
    let [config, special, template, generation] = OPTIONAL_FILES;
    Ok(TokenizerFiles {
        tokenizer_json,
        tokenizer_config_json: read(config).await?,
        special_tokens_map_json: read(special).await?,
        chat_template_jinja: utf8_template(read(template).await?)?,
        generation_config_json: read(generation).await?,
    })
}

fn utf8_template(bytes: Option<Vec<u8>>) -> Result<Option<String>, FetchError> {
    bytes
        .map(|b| {
            String::from_utf8(b)
                .map_err(|_| FetchError::Invalid("chat_template.jinja is not UTF-8".into()))
        })
        .transpose()
}

async fn fetch_hub(
    cfg: &HubConfig,
    repo: &str,
    revision: &str,
    token: Option<String>,
) -> Result<TokenizerFiles, FetchError> {
    let cache = match &cfg.cache_dir {
        Some(dir) => Cache::new(dir.clone()),
        None => Cache::from_env(),
    };
    let id = Repo::with_revision(repo.to_string(), RepoType::Model, revision.to_string());
    let get = |file: &'static str| {
        let cached = cache.repo(id.clone()).get(file);
        let (cache, id) = (cache.clone(), id.clone());
        let token = token.clone();
        async move {
            let what = format!("{repo}@{revision}/{file}");
            let path = match cached {
                Some(p) => p,
                None if cfg.offline => return Err(FetchError::OfflineMiss(what)),
                None => {
                    // An explicit token replaces the one `hf-hub` would read from $HF_HOME/token.
                    let mut builder = ApiBuilder::from_cache(cache).with_progress(false);
                    if let Some(endpoint) = &cfg.endpoint {
                        builder = builder.with_endpoint(endpoint.clone());
                    }
                    if token.is_some() {
                        builder = builder.with_token(token);
                    }
                    let api = builder.build().map_err(|e| api_error(&what, e))?;
                    api.repo(id)
                        .download(file)
                        .await
                        .map_err(|e| api_error(&what, e))?
                }
            };
            tokio::fs::read(&path)
                .await
                .map_err(|source| FetchError::Io { what, source })
        }
    };
    let tokenizer_json = get(TOKENIZER_JSON).await?;
    let optional = |r: Result<Vec<u8>, FetchError>| match r {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.is_not_found() || matches!(e, FetchError::OfflineMiss(_)) => Ok(None),
        Err(e) => Err(e),
    };
    let [config, special, template, generation] = OPTIONAL_FILES;
    Ok(TokenizerFiles {
        tokenizer_json,
        tokenizer_config_json: optional(get(config).await)?,
        special_tokens_map_json: optional(get(special).await)?,
        chat_template_jinja: utf8_template(optional(get(template).await)?)?,
        generation_config_json: optional(get(generation).await)?,
    })
}

/// Maps `hf-hub`'s error to ours (its HTTP errors carry the status).
fn api_error(what: &str, e: ApiError) -> FetchError {
    let what = what.to_string();
    match e {
        ApiError::RequestError(e) => match e.status().map(|s| s.as_u16()) {
            Some(404) => FetchError::NotFound(what),
            Some(401 | 403) => FetchError::Unauthorized(what),
            Some(status) => FetchError::Http { url: what, status },
            None if e.is_decode() || e.is_body() => FetchError::Protocol {
                what,
                detail: e.to_string(),
            },
            None => FetchError::Network(what),
        },
        ApiError::IoError(source) => FetchError::Io { what, source },
        ApiError::TooManyRetries(inner) => api_error(&what, *inner),
        other => FetchError::Protocol {
            what,
            detail: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let (base, cap) = (Duration::from_secs(1), Duration::from_secs(60));
        let waits: Vec<u64> = (1..=9).map(|n| backoff(n, base, cap).as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(u32::MAX, base, cap), cap);
    }

    #[test]
    fn token_file_names_cannot_escape_the_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("hf")).expect("mkdir");
        std::fs::write(dir.path().join("hf/token"), "hf_abc\n").expect("write");
        assert_eq!(
            read_token(dir.path(), "hf", "token").expect("token"),
            "hf_abc"
        );
        for (s, k) in [("..", "token"), ("hf", "../hf/token"), ("hf", "missing")] {
            assert_eq!(
                read_token(dir.path(), s, k).expect_err("refused").label(),
                "token_missing"
            );
        }
    }

    #[tokio::test]
    async fn directory_sources_need_tokenizer_json_only() {
        let cfg = HubConfig {
            config_map_dir: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata")),
            ..HubConfig::default()
        };
        let (files, origin) = fetch(&cfg, &ResolvedTokenizer::ConfigMap("tokenizers".into()))
            .await
            .map(|(f, o)| (Some(f), o))
            .unwrap_or_else(|e| (None, e.label().to_string()));
        assert!(
            files.is_none(),
            "no tokenizer.json directly in testdata/tokenizers"
        );
        assert_eq!(origin, "not_found");
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizers/qwen3");
        let (files, origin) = fetch(&cfg, &ResolvedTokenizer::Path(dir.into()))
            .await
            .expect("qwen3 dir");
        assert!(files.tokenizer_config_json.is_some());
        assert!(files.chat_template_jinja.is_none());
        assert_eq!(origin, format!("path {dir}"));
        let e = fetch(&cfg, &ResolvedTokenizer::ConfigMap("../x".into()))
            .await
            .expect_err("refused");
        assert_eq!(e.label(), "not_found");
    }
}
