//! Secret values from `--secrets-dir`: `<dir>/<secret>/<key>`, as the operator mounts each
//! referenced Secret (read-only, optional volumes). The router never reads Secrets from the
//! API server.
//!
//! ```text
//! read(ref) --path checks--> <dir>/<name>/<key> --ok--> bytes (remembered as the last good value)
//!                                               \-err-> counted; the last good value, if any
//! ```
//!
//! Names and keys must be single path components (no `/`, no `..`), so a spec cannot make the
//! router read outside the directory. A file that is missing or unreadable is a counted error;
//! the last good value stays in use until the file is readable again. In file mode (no
//! Kubernetes) `v1` Secret documents of the static discovery file stand in for a Secret that
//! is not mounted.

use std::collections::HashMap;
use std::path::PathBuf;

use kvroute_crds::backend::SecretKeyRef;
use parking_lot::Mutex;

/// Why a Secret value is not available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The router runs without `--secrets-dir`.
    #[error("the router runs without --secrets-dir, so Secret {0} cannot be read")]
    NoSecretsDir(String),
    /// The name or key is not a plain path component.
    #[error("Secret reference {0} is not a plain name/key")]
    BadReference(String),
    /// The file is missing or unreadable (the Secret is not mounted, or lacks the key).
    #[error("Secret {0} is not mounted into the router (missing or unreadable)")]
    Missing(String),
    /// The file is empty.
    #[error("Secret {0} is empty")]
    Empty(String),
}

impl SecretError {
    /// Metric label and condition reason.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NoSecretsDir(_) => "no_secrets_dir",
            Self::BadReference(_) => "bad_reference",
            Self::Missing(_) => "missing",
            Self::Empty(_) => "empty",
        }
    }
}

fn plain(component: &str) -> bool {
    !component.is_empty()
        && component != "."
        && component != ".."
        && !component.contains(['/', '\\', '\0'])
}

/// Reads Secret files and remembers the last good value of each.
#[derive(Debug, Default)]
pub struct SecretsDir {
    root: Option<PathBuf>,
    last_good: Mutex<HashMap<(String, String), Vec<u8>>>,
    inline: Mutex<HashMap<(String, String), Vec<u8>>>,
}

impl SecretsDir {
    /// Reads from `root` (`None`: no Secrets available).
    pub fn new(root: Option<PathBuf>) -> Self {
        Self {
            root,
            last_good: Mutex::new(HashMap::new()),
            inline: Mutex::new(HashMap::new()),
        }
    }

    /// Replaces the Secrets given inline (file mode: `v1` Secret documents; `data` is already
    /// decoded, `stringData` wins as the API server would merge it).
    pub fn set_inline(&self, secrets: &[k8s_openapi::api::core::v1::Secret]) {
        let mut map = HashMap::new();
        for s in secrets {
            let name = s.metadata.name.clone().unwrap_or_default();
            for (k, v) in s.data.iter().flatten() {
                map.insert((name.clone(), k.clone()), v.0.clone());
            }
            for (k, v) in s.string_data.iter().flatten() {
                map.insert((name.clone(), k.clone()), v.clone().into_bytes());
            }
        }
        *self.inline.lock() = map;
    }

    /// The value now: the file's content, or (when it cannot be read) the last good value.
    /// `Err` only when there never was a good value; `fresh_error` reports a failed read even
    /// when an old value was returned, for counting.
    pub fn read(&self, r: &SecretKeyRef) -> (Result<Vec<u8>, SecretError>, Option<SecretError>) {
        let id = format!("{}/{}", r.name, r.key);
        let fresh = self.read_file(r, &id);
        let key = (r.name.clone(), r.key.clone());
        let mut last = self.last_good.lock();
        match fresh {
            Ok(bytes) => {
                last.insert(key, bytes.clone());
                (Ok(bytes), None)
            }
            Err(e) => match last.get(&key) {
                Some(old) => (Ok(old.clone()), Some(e)),
                None => (Err(e.clone()), Some(e)),
            },
        }
    }

    fn read_file(&self, r: &SecretKeyRef, id: &str) -> Result<Vec<u8>, SecretError> {
        if !plain(&r.name) || !plain(&r.key) {
            return Err(SecretError::BadReference(id.to_string()));
        }
        let inline = || {
            self.inline
                .lock()
                .get(&(r.name.clone(), r.key.clone()))
                .cloned()
        };
        let bytes = match &self.root {
            Some(root) => match std::fs::read(root.join(&r.name).join(&r.key)) {
                Ok(b) => b,
                Err(_) => inline().ok_or_else(|| SecretError::Missing(id.to_string()))?,
            },
            None => inline().ok_or_else(|| SecretError::NoSecretsDir(id.to_string()))?,
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(SecretError::Empty(id.to_string()));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef {
            name: name.into(),
            key: key.into(),
        }
    }

    #[test]
    fn reads_keeps_the_last_good_value_and_refuses_escapes() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("openai")).expect("mkdir");
        let file = dir.path().join("openai").join("apiKey");
        std::fs::write(&file, "sk-1\n").expect("write");
        let s = SecretsDir::new(Some(dir.path().to_path_buf()));
        assert_eq!(
            s.read(&r("openai", "apiKey")),
            (Ok(b"sk-1\n".to_vec()), None)
        );
        std::fs::write(&file, "sk-2").expect("rotate");
        assert_eq!(s.read(&r("openai", "apiKey")).0, Ok(b"sk-2".to_vec()));
        std::fs::remove_file(&file).expect("remove");
        let (value, error) = s.read(&r("openai", "apiKey"));
        assert_eq!(value, Ok(b"sk-2".to_vec()));
        assert_eq!(error.map(|e| e.label()), Some("missing"));
        assert_eq!(
            s.read(&r("..", "apiKey")).0.map_err(|e| e.label()),
            Err("bad_reference")
        );
        assert_eq!(
            s.read(&r("openai", "../x")).0.map_err(|e| e.label()),
            Err("bad_reference")
        );
        std::fs::write(dir.path().join("openai").join("blank"), " \n").expect("write");
        assert_eq!(
            s.read(&r("openai", "blank")).0.map_err(|e| e.label()),
            Err("empty")
        );
        let none = SecretsDir::new(None);
        assert_eq!(
            none.read(&r("a", "b")).0.map_err(|e| e.label()),
            Err("no_secrets_dir")
        );
        // File mode: a Secret document stands in for a mount.
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "a"}, "data": {"b": "c2stMw=="}, "stringData": {"c": "sk-4"}}),
        )
        .expect("secret");
        none.set_inline(&[secret]);
        assert_eq!(none.read(&r("a", "b")).0, Ok(b"sk-3".to_vec()));
        assert_eq!(none.read(&r("a", "c")).0, Ok(b"sk-4".to_vec()));
    }
}
