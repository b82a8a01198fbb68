//! Secret volumes for the fake kubelet, as a kubelet materializes them: each Secret volume a
//! container mounts becomes a local directory holding the Secret's keys (or only its `items:`,
//! under their `path`s), and the mount path in the container's args and env is rewritten to
//! that directory. When the Secret changes the files are replaced in place (write to a
//! temporary file, then rename), so a process that re-reads them sees the new content, as it
//! would after kubelet's periodic sync.
//!
//! ```text
//! Pod spec --secret_volumes()--> [SecretVolume {volume, secret, items, optional, mounts}]
//! SecretVolume + Secret data --files()--> relative path -> bytes (or which key is missing)
//! files --write_dir()--> <pod dir>/volumes/<volume>/..., only what changed
//! ```
//!
//! Other volume kinds (emptyDir, ConfigMap) are not materialized; their paths are left as
//! they are.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Component, Path};

use k8s_openapi::api::core::v1::Pod;

/// One Secret volume of a pod and where its containers mount it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretVolume {
    /// Volume name.
    pub volume: String,
    /// Secret name (in the pod's namespace).
    pub secret: String,
    /// `items:` as (key, relative path); `None` projects every key under its own name.
    pub items: Option<Vec<(String, String)>>,
    /// A missing Secret (or item key) is not an error.
    pub optional: bool,
    /// Mount paths in the containers that mount it.
    pub mount_paths: Vec<String>,
}

/// Why a Secret volume cannot be materialized yet (kubelet keeps the pod in
/// ContainerCreating and retries).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// The Secret does not exist.
    #[error("volume {volume:?}: Secret {secret:?} not found")]
    NoSecret {
        /// Volume name.
        volume: String,
        /// Secret name.
        secret: String,
    },
    /// An item names a key the Secret does not have.
    #[error("volume {volume:?}: Secret {secret:?} has no key {key:?}")]
    NoKey {
        /// Volume name.
        volume: String,
        /// Secret name.
        secret: String,
        /// The key.
        key: String,
    },
    /// An item path leaves the volume (absolute or `..`).
    #[error("volume {volume:?}: item path {path:?} is not a relative path inside the volume")]
    BadPath {
        /// Volume name.
        volume: String,
        /// The path.
        path: String,
    },
}

/// The Secret volumes that at least one container mounts.
pub fn secret_volumes(pod: &Pod) -> Vec<SecretVolume> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for v in spec.volumes.iter().flatten() {
        let Some(s) = &v.secret else {
            continue;
        };
        let mount_paths: Vec<String> = spec
            .containers
            .iter()
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .filter(|m| m.name == v.name)
            .map(|m| m.mount_path.clone())
            .collect();
        if mount_paths.is_empty() {
            continue;
        }
        out.push(SecretVolume {
            volume: v.name.clone(),
            secret: s.secret_name.clone().unwrap_or_default(),
            items: s.items.as_ref().map(|items| {
                items
                    .iter()
                    .map(|i| (i.key.clone(), i.path.clone()))
                    .collect()
            }),
            optional: s.optional.unwrap_or(false),
            mount_paths,
        });
    }
    out
}

fn inside(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// The files of `vol` given the Secret's data (`None`: no such Secret).
pub fn files(
    vol: &SecretVolume,
    data: Option<&BTreeMap<String, Vec<u8>>>,
) -> Result<BTreeMap<String, Vec<u8>>, VolumeError> {
    let Some(data) = data else {
        return if vol.optional {
            Ok(BTreeMap::new())
        } else {
            Err(VolumeError::NoSecret {
                volume: vol.volume.clone(),
                secret: vol.secret.clone(),
            })
        };
    };
    let pairs: Vec<(String, String)> = match &vol.items {
        Some(items) => items.clone(),
        None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
    };
    let mut out = BTreeMap::new();
    for (key, path) in pairs {
        if !inside(&path) {
            return Err(VolumeError::BadPath {
                volume: vol.volume.clone(),
                path,
            });
        }
        match data.get(&key) {
            Some(v) => {
                out.insert(path, v.clone());
            }
            None if vol.optional => {}
            None => {
                return Err(VolumeError::NoKey {
                    volume: vol.volume.clone(),
                    secret: vol.secret.clone(),
                    key,
                });
            }
        }
    }
    Ok(out)
}

/// Makes `dir` hold exactly `files`: changed files are replaced atomically, files no longer
/// present are removed. Returns whether anything changed.
pub fn write_dir(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> std::io::Result<bool> {
    std::fs::create_dir_all(dir)?;
    let mut changed = false;
    for (rel, bytes) in files {
        let path = dir.join(rel);
        if std::fs::read(&path).is_ok_and(|old| &old == bytes) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = path.with_extension("kvroute-tmp");
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        changed = true;
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_file() && !files.contains_key(&name) {
            std::fs::remove_file(entry.path())?;
            changed = true;
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).expect("pod")
    }

    const POD: &str = "metadata: {name: p}
spec:
  containers:
  - name: a
    volumeMounts: [{name: tls, mountPath: /var/run/tls}]
  - name: b
  volumes:
  - name: tls
    secret:
      secretName: mtls
      items: [{key: x.crt, path: tls.crt}, {key: ca.crt, path: ca.crt}]
  - name: unused
    secret: {secretName: other}
  - name: cache
    emptyDir: {}
";

    #[test]
    fn only_mounted_secret_volumes_with_their_items_and_paths() {
        let vols = secret_volumes(&pod(POD));
        assert_eq!(
            vols,
            vec![SecretVolume {
                volume: "tls".into(),
                secret: "mtls".into(),
                items: Some(vec![
                    ("x.crt".into(), "tls.crt".into()),
                    ("ca.crt".into(), "ca.crt".into())
                ]),
                optional: false,
                mount_paths: vec!["/var/run/tls".into()],
            }]
        );
    }

    #[test]
    fn items_project_and_rename_keys_and_missing_ones_wait() {
        let vol = &secret_volumes(&pod(POD))[0];
        let data = BTreeMap::from([
            ("x.crt".to_string(), b"X".to_vec()),
            ("y.crt".to_string(), b"Y".to_vec()),
            ("ca.crt".to_string(), b"CA".to_vec()),
        ]);
        let f = files(vol, Some(&data)).expect("files");
        assert_eq!(
            f,
            BTreeMap::from([
                ("tls.crt".to_string(), b"X".to_vec()),
                ("ca.crt".to_string(), b"CA".to_vec())
            ])
        );
        let mut partial = data.clone();
        partial.remove("x.crt");
        assert!(
            matches!(files(vol, Some(&partial)), Err(VolumeError::NoKey { key, .. }) if key == "x.crt")
        );
        assert!(matches!(
            files(vol, None),
            Err(VolumeError::NoSecret { .. })
        ));
        let mut optional = vol.clone();
        optional.optional = true;
        assert_eq!(files(&optional, None).expect("empty"), BTreeMap::new());
        let mut escape = vol.clone();
        escape.items = Some(vec![("x.crt".into(), "../x".into())]);
        assert!(matches!(
            files(&escape, Some(&data)),
            Err(VolumeError::BadPath { .. })
        ));
    }

    #[test]
    fn write_dir_replaces_changed_files_and_removes_stale_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join("tls");
        let one = BTreeMap::from([
            ("tls.crt".to_string(), b"1".to_vec()),
            ("ca.crt".to_string(), b"ca".to_vec()),
        ]);
        assert!(write_dir(&d, &one).expect("write"));
        assert!(!write_dir(&d, &one).expect("rewrite"));
        let two = BTreeMap::from([("tls.crt".to_string(), b"2".to_vec())]);
        assert!(write_dir(&d, &two).expect("update"));
        assert_eq!(std::fs::read(d.join("tls.crt")).expect("read"), b"2");
        assert!(!d.join("ca.crt").exists());
    }
}
