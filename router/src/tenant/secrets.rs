//! Secrets mounted under `--secrets-dir` as `<dir>/<secret>/<key>`, read when first needed and
//! re-read by [`crate::tenant::refresh`] every 2 s, so a rotated Secret takes effect without a
//! restart. A file that is missing, unreadable or invalid is counted and the last good value
//! stays in force.
//!
//! ```text
//! <dir>/<secret>/<tenant> --read (≤ 1 MiB, ≤ 1024 files)--> parse_key_lines --> KeyTable per Secret
//! <dir>/<secret>/<key>    --read--> bytes (a JWKS)
//!         refresh(): every loaded Secret again; a bad file keeps its last good entry
//! ```
//!
//! Kubernetes mounts a Secret as a directory of files plus `..data`-style hidden entries;
//! names starting with `.` are skipped. The router never reads Secrets from the API server.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use super::apikeys::{KeyTable, parse_key_lines};
use super::metrics::TenantMetrics;

/// Largest Secret file read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Files read from one Secret directory.
pub const MAX_FILES: usize = 1024;

/// One API-key Secret as last read: each tenant's file and its last good keys.
#[derive(Clone, Debug, Default)]
struct KeySecret {
    /// tenant -> last good parsed file.
    files: HashMap<String, KeyTable>,
    /// All of them.
    table: Arc<KeyTable>,
}

/// The Secret files the tenant code reads.
pub struct SecretFiles {
    dir: Option<PathBuf>,
    key_secrets: RwLock<HashMap<String, KeySecret>>,
    metrics: TenantMetrics,
    /// (secret, key, reason) already logged: a file that stays bad is counted on every read
    /// but logged once (bounded: cleared when it grows past 1024).
    logged: parking_lot::Mutex<std::collections::HashSet<(String, String, &'static str)>>,
}

/// Why a Secret file could not be used (metric label: `label()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretError {
    /// No `--secrets-dir`.
    NoSecretsDir,
    /// The Secret's directory or key is missing or unreadable.
    Missing,
    /// Over [`MAX_FILE_BYTES`].
    TooLarge,
    /// Its content is invalid (a bad key line, a bad tenant name).
    Invalid,
}

impl SecretError {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            SecretError::NoSecretsDir => "no_secrets_dir",
            SecretError::Missing => "missing",
            SecretError::TooLarge => "too_large",
            SecretError::Invalid => "invalid",
        }
    }
}

fn read_small(path: &Path) -> Result<Vec<u8>, SecretError> {
    let meta = std::fs::metadata(path).map_err(|_| SecretError::Missing)?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(SecretError::TooLarge);
    }
    std::fs::read(path).map_err(|_| SecretError::Missing)
}

impl SecretFiles {
    /// Reads Secrets under `dir` (none when `None`).
    pub fn new(dir: Option<PathBuf>, metrics: TenantMetrics) -> Self {
        Self {
            dir,
            key_secrets: RwLock::new(HashMap::new()),
            metrics,
            logged: parking_lot::Mutex::new(std::collections::HashSet::new()),
        }
    }

    fn error(&self, secret: &str, key: &str, e: SecretError) {
        self.metrics
            .secret_errors
            .with_label_values(&[e.label()])
            .inc();
        let mut logged = self.logged.lock();
        if logged.len() > 1024 {
            logged.clear();
        }
        if logged.insert((secret.to_string(), key.to_string(), e.label())) {
            tracing::warn!(
                secret,
                key,
                reason = e.label(),
                "cannot use a Secret file; keeping the last good value"
            );
        }
    }

    fn secret_dir(&self, secret: &str) -> Result<PathBuf, SecretError> {
        let dir = self.dir.as_ref().ok_or(SecretError::NoSecretsDir)?;
        // A Secret name is a DNS subdomain: no separators, never `..`.
        if secret.is_empty() || secret.contains(['/', '\\']) || secret.starts_with('.') {
            return Err(SecretError::Invalid);
        }
        Ok(dir.join(secret))
    }

    /// The bytes of `<dir>/<secret>/<key>`, read now (a JWKS Secret; callers keep the last good
    /// parsed value).
    pub fn read(&self, secret: &str, key: &str) -> Result<Vec<u8>, SecretError> {
        if key.is_empty() || key.contains(['/', '\\']) || key.starts_with('.') {
            return Err(SecretError::Invalid);
        }
        let out = self
            .secret_dir(secret)
            .and_then(|d| read_small(&d.join(key)));
        if let Err(e) = out {
            self.error(secret, key, e);
        }
        out
    }

    /// The API keys of `secret`, loaded on first use.
    pub fn key_table(&self, secret: &str) -> Arc<KeyTable> {
        if let Some(s) = self.key_secrets.read().get(secret) {
            return s.table.clone();
        }
        let loaded = self.load_keys(secret, &KeySecret::default());
        let table = loaded.table.clone();
        self.key_secrets.write().insert(secret.to_string(), loaded);
        table
    }

    /// Re-reads every API-key Secret in `wanted` (one not loaded yet is loaded now, so a
    /// missing Secret is counted before a request needs it), forgetting the others.
    pub fn refresh(&self, wanted: &[String]) {
        for name in wanted {
            if !self.key_secrets.read().contains_key(name) {
                self.key_table(name);
            }
        }
        let loaded: Vec<(String, KeySecret)> = self
            .key_secrets
            .read()
            .iter()
            .filter(|(k, _)| wanted.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut fresh = HashMap::new();
        for (name, old) in loaded {
            let new = self.load_keys(&name, &old);
            fresh.insert(name, new);
        }
        *self.key_secrets.write() = fresh;
    }

    /// Reads `secret`'s directory: each regular file is a tenant's keys. A file that fails
    /// keeps `old`'s entry for that tenant; a tenant whose file is gone is dropped.
    fn load_keys(&self, secret: &str, old: &KeySecret) -> KeySecret {
        let dir = match self.secret_dir(secret) {
            Ok(d) => d,
            Err(e) => {
                self.error(secret, "", e);
                return old.clone();
            }
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(_) => {
                self.error(secret, "", SecretError::Missing);
                return old.clone();
            }
        };
        let mut files = HashMap::new();
        for entry in entries.flatten().take(MAX_FILES) {
            let Some(tenant) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            // `..data`, `..2026_12_01...`: the atomic-update machinery of a Secret volume.
            if tenant.starts_with('.') || entry.path().is_dir() {
                continue;
            }
            if !super::valid_tenant(&tenant) {
                self.error(secret, &tenant, SecretError::Invalid);
                continue;
            }
            let parsed = read_small(&entry.path()).and_then(|bytes| {
                let text = String::from_utf8(bytes).map_err(|_| SecretError::Invalid)?;
                parse_key_lines(&text).map_err(|_| SecretError::Invalid)
            });
            match parsed {
                Ok(digests) => {
                    let mut t = KeyTable::default();
                    t.insert(&tenant, &digests);
                    files.insert(tenant, t);
                }
                Err(e) => {
                    self.error(secret, &tenant, e);
                    if let Some(t) = old.files.get(&tenant) {
                        files.insert(tenant, t.clone());
                    }
                }
            }
        }
        if files.is_empty() && old.files.is_empty() {
            // An optional Secret volume of a Secret that does not exist is an empty directory
            // (kubelet): as missing as no directory at all.
            self.error(secret, "", SecretError::Missing);
        }
        let mut table = KeyTable::default();
        let mut names: Vec<&String> = files.keys().collect();
        names.sort();
        for n in names {
            table.extend(&files[n]);
        }
        KeySecret {
            files,
            table: Arc::new(table),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::apikeys::{new_key, secret_line};

    fn files(dir: &Path) -> (SecretFiles, TenantMetrics) {
        let m = TenantMetrics::register(&prometheus::Registry::new(), &[]).expect("metrics");
        (SecretFiles::new(Some(dir.to_path_buf()), m.clone()), m)
    }

    fn errors(m: &TenantMetrics, label: &str) -> u64 {
        m.secret_errors.with_label_values(&[label]).get()
    }

    #[test]
    fn keys_rotate_without_a_restart_and_a_bad_file_keeps_the_last_good() {
        let tmp = tempfile::tempdir().expect("tmp");
        let secret = tmp.path().join("team-keys");
        std::fs::create_dir(&secret).expect("mkdir");
        std::fs::create_dir(secret.join("..data")).expect("mkdir");
        let (k1, k2, kb) = (new_key(), new_key(), new_key());
        std::fs::write(secret.join("team-a"), secret_line(&k1)).expect("write");
        std::fs::write(secret.join("team-b"), secret_line(&kb)).expect("write");
        std::fs::write(secret.join("Bad_Name"), secret_line(&kb)).expect("write");
        let (f, m) = files(tmp.path());
        let t = f.key_table("team-keys");
        assert_eq!(
            (t.lookup(&k1), t.lookup(&kb)),
            (Some("team-a"), Some("team-b"))
        );
        assert_eq!(errors(&m, "invalid"), 1, "the bad tenant name is counted");

        // Rotation: both keys for a while, then only the new one.
        std::fs::write(
            secret.join("team-a"),
            format!("{}\n{}\n", secret_line(&k1), secret_line(&k2)),
        )
        .expect("write");
        f.refresh(&["team-keys".into()]);
        let t = f.key_table("team-keys");
        assert_eq!(
            (t.lookup(&k1), t.lookup(&k2)),
            (Some("team-a"), Some("team-a"))
        );
        std::fs::write(secret.join("team-a"), secret_line(&k2)).expect("write");
        f.refresh(&["team-keys".into()]);
        assert_eq!(f.key_table("team-keys").lookup(&k1), None);

        // A broken file: the last good keys stay, the error is counted.
        std::fs::write(secret.join("team-a"), "not a digest").expect("write");
        f.refresh(&["team-keys".into()]);
        assert_eq!(f.key_table("team-keys").lookup(&k2), Some("team-a"));
        // Counted on every read: the bad tenant name 4 times so far, the bad file once.
        assert_eq!(errors(&m, "invalid"), 5);
        // A removed tenant is gone; an unreferenced Secret is forgotten.
        std::fs::remove_file(secret.join("team-b")).expect("rm");
        f.refresh(&["team-keys".into()]);
        assert_eq!(f.key_table("team-keys").lookup(&kb), None);
    }

    #[test]
    fn missing_dirs_and_bad_names_are_counted_not_fatal() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (f, m) = files(tmp.path());
        assert!(f.key_table("absent").is_empty());
        assert_eq!(errors(&m, "missing"), 1);
        assert!(f.key_table("../etc").is_empty());
        assert_eq!(f.read("jwks", "../x"), Err(SecretError::Invalid));
        let none = SecretFiles::new(None, m.clone());
        assert!(none.key_table("x").is_empty());
        assert_eq!(errors(&m, "no_secrets_dir"), 1);
    }
}
