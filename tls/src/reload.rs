//! A TLS configuration that follows its directory: [`Watched::watch`] polls the files and
//! swaps in a configuration built from them when they changed and are valid.
//!
//! ```text
//! every period: read DIR's three files --same bytes as last time--> nothing
//!                                      --changed--> build --ok--> swap (new handshakes use it)
//!                                                         \--err--> keep the current one, report
//! ```
//!
//! Kubelet updates a mounted Secret by swapping a symlink, so the three files change
//! together; a half-written update (a key that does not match its certificate) fails to
//! build and is retried when the files change again. Polling (not inotify) because symlink swaps in
//! projected volumes are not reliably seen by file watches, and the files are tiny.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rustls::{ClientConfig, ServerConfig};
use tokio_util::sync::CancellationToken;

use crate::identity::Identity;
use crate::material::{Material, TlsError, read_files};

/// What one poll found.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// The files are unchanged.
    Unchanged,
    /// The files changed and the new configuration is in use.
    Reloaded,
    /// The files changed but do not build; the previous configuration stays in use.
    Failed(TlsError),
}

impl ReloadOutcome {
    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            ReloadOutcome::Unchanged => "unchanged",
            ReloadOutcome::Reloaded => "reloaded",
            ReloadOutcome::Failed(_) => "failed",
        }
    }
}

type Build<T> = fn(&Material) -> Result<T, TlsError>;

/// A configuration built from a TLS directory, replaced when the directory changes.
pub struct Watched<T> {
    dir: PathBuf,
    build: Build<T>,
    current: RwLock<Arc<T>>,
    identity: RwLock<Option<Identity>>,
    seen: Mutex<[Vec<u8>; 3]>,
}

/// The router's gRPC server configuration.
pub type WatchedServer = Watched<ServerConfig>;
/// A client configuration (sidecar, Pick API caller).
pub type WatchedClient = Watched<ClientConfig>;

fn build_server(m: &Material) -> Result<ServerConfig, TlsError> {
    m.server_config()
}

fn build_client(m: &Material) -> Result<ClientConfig, TlsError> {
    m.client_config()
}

impl Watched<ServerConfig> {
    /// Loads a server configuration from `dir` (fails when it cannot be built).
    pub fn server(dir: impl Into<PathBuf>) -> Result<Arc<Self>, TlsError> {
        Self::load(dir.into(), build_server)
    }
}

impl Watched<ClientConfig> {
    /// Loads a client configuration from `dir` (fails when it cannot be built).
    pub fn client(dir: impl Into<PathBuf>) -> Result<Arc<Self>, TlsError> {
        Self::load(dir.into(), build_client)
    }
}

impl<T: Send + Sync + 'static> Watched<T> {
    fn load(dir: PathBuf, build: Build<T>) -> Result<Arc<Self>, TlsError> {
        let files = read_files(&dir)?;
        let material = Material::parse(&dir, &files)?;
        let config = build(&material)?;
        Ok(Arc::new(Self {
            identity: RwLock::new(material.identity().ok()),
            current: RwLock::new(Arc::new(config)),
            seen: Mutex::new(files),
            build,
            dir,
        }))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The configuration new connections use now.
    pub fn current(&self) -> Arc<T> {
        self.current.read().clone()
    }

    /// The kvroute identity in this side's own certificate, if it has one.
    pub fn identity(&self) -> Option<Identity> {
        self.identity.read().clone()
    }

    /// Re-reads the directory once.
    pub fn reload(&self) -> ReloadOutcome {
        let files = match read_files(&self.dir) {
            Ok(f) => f,
            Err(e) => return ReloadOutcome::Failed(e),
        };
        let mut seen = self.seen.lock();
        if *seen == files {
            return ReloadOutcome::Unchanged;
        }
        let built = Material::parse(&self.dir, &files)
            .and_then(|m| Ok(((self.build)(&m)?, m.identity().ok())));
        match built {
            Ok((config, identity)) => {
                *self.current.write() = Arc::new(config);
                *self.identity.write() = identity;
                *seen = files;
                ReloadOutcome::Reloaded
            }
            Err(e) => {
                // The same bad bytes would fail again: wait for the next change.
                *seen = files;
                ReloadOutcome::Failed(e)
            }
        }
    }

    /// Polls the directory every `period` until `shutdown`, calling `on_poll` with each
    /// outcome other than [`ReloadOutcome::Unchanged`] (for a counter and a log line).
    pub async fn watch(
        self: Arc<Self>,
        period: Duration,
        shutdown: CancellationToken,
        mut on_poll: impl FnMut(&ReloadOutcome) + Send,
    ) {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let this = self.clone();
            // File reads and key parsing are blocking work.
            let outcome = match tokio::task::spawn_blocking(move || this.reload()).await {
                Ok(o) => o,
                Err(e) => ReloadOutcome::Failed(TlsError::Config(format!("reload task: {e}"))),
            };
            match &outcome {
                ReloadOutcome::Unchanged => continue,
                ReloadOutcome::Reloaded => {
                    tracing::info!(dir = %self.dir.display(), identity = ?self.identity().map(|i| i.uri()), "TLS files changed; new connections use them");
                }
                ReloadOutcome::Failed(e) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "TLS files unusable; keeping the previous ones");
                }
            }
            on_poll(&outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testpki::{TestCa, write_dir};

    #[test]
    fn reload_swaps_valid_changes_and_keeps_the_old_config_otherwise() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("tls");
        let ca = TestCa::new("a");
        let ws = Identity::WorkerSet {
            namespace: "ns".into(),
            name: "ws".into(),
        };
        write_dir(&dir, &ca.leaf(Some(&ws), &["localhost"]), &[&ca]);
        let w = WatchedServer::server(&dir).expect("load");
        assert_eq!(w.identity(), Some(ws.clone()));
        let first = w.current();
        assert!(matches!(w.reload(), ReloadOutcome::Unchanged));
        assert!(Arc::ptr_eq(&first, &w.current()));

        // A new leaf with another identity, and a two-CA bundle: swapped in.
        let ca2 = TestCa::new("b");
        let picker = Identity::Picker {
            namespace: "ns".into(),
            pool: "p".into(),
        };
        write_dir(&dir, &ca2.leaf(Some(&picker), &["localhost"]), &[&ca, &ca2]);
        assert!(matches!(w.reload(), ReloadOutcome::Reloaded));
        assert!(!Arc::ptr_eq(&first, &w.current()));
        assert_eq!(w.identity(), Some(picker.clone()));

        // A key that does not match the certificate: refused once, the config stays.
        let second = w.current();
        std::fs::write(dir.join(crate::KEY_FILE), ca2.leaf(None, &["x"]).key_pem).expect("write");
        assert!(matches!(
            w.reload(),
            ReloadOutcome::Failed(TlsError::Config(_))
        ));
        assert!(
            matches!(w.reload(), ReloadOutcome::Unchanged),
            "same bad bytes: not retried"
        );
        assert!(Arc::ptr_eq(&second, &w.current()));
        assert_eq!(w.identity(), Some(picker));

        // A missing file fails without touching the config; garbage PEM names its file.
        std::fs::remove_file(dir.join(crate::CA_FILE)).expect("remove");
        assert!(matches!(
            w.reload(),
            ReloadOutcome::Failed(TlsError::Read { .. })
        ));
        std::fs::write(dir.join(crate::CA_FILE), "not pem").expect("write");
        match w.reload() {
            ReloadOutcome::Failed(TlsError::Pem { path, .. }) => {
                assert!(path.ends_with(crate::CA_FILE), "{}", path.display())
            }
            other => panic!("expected a PEM error, got {other:?}"),
        }
        assert!(Arc::ptr_eq(&second, &w.current()));
        // A fresh load of unusable files fails outright.
        assert!(WatchedClient::client(&dir).is_err());
    }
}
