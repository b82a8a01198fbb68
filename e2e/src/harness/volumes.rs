//! Secret volumes for the fake kubelet, as a kubelet materializes them: each Secret volume a
//! container mounts becomes a local directory holding the Secret's keys (or only its `items:`,
//! under their `path`s), laid out like kubelet's atomic writer: the files live in a
//! `..<version>` directory, `..data` links to the current one and every top-level name links
//! through `..data`. When the Secret changes a new version is written and `..data` swapped to
//! it in one rename, so a process that re-reads sees the old set of keys or the new one,
//! never a mix, as after kubelet's periodic sync.
//!
//! Mount paths: each mount's root (its parent directory, e.g. `/var/run/kvroute` for
//! `/var/run/kvroute/tls`) becomes a local directory `<pod dir>/mnt/<n>` with a link per
//! mount below it, and the root is rewritten to that directory in the container's args and
//! env. So a flag naming the parent of several mounts (`--secrets-dir /var/run/kvroute/secrets`
//! with one Secret mounted per name below it) finds them all.
//!
//! ```text
//! Pod spec --secret_volumes()--> [SecretVolume {volume, secret, items, optional, mounts}]
//! SecretVolume + Secret data --files()--> relative path -> bytes (or which key is missing)
//! files --write_dir()--> <pod dir>/volumes/<volume>/{..<v>/, ..data -> ..<v>, key -> ..data/key}
//! mount paths --mount_layout()--> links <pod dir>/mnt/<n>/<rel> -> volume dir, rewrites root -> mnt/<n>
//! ```
//!
//! Other volume kinds (emptyDir, ConfigMap) are not materialized; a path below a rewritten
//! root points into the local root directory, where nothing is mounted.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// The version directories and links of [`write_dir`].
const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// The files under `root` (recursively), by path relative to it.
fn read_tree(root: &Path) -> std::io::Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                dirs.push(path);
            } else if let Ok(rel) = path.strip_prefix(root) {
                out.insert(rel.to_string_lossy().into_owned(), std::fs::read(&path)?);
            }
        }
    }
    Ok(out)
}

/// The top-level names of `files` (the first component of each path).
fn top_level(files: &BTreeMap<String, Vec<u8>>) -> BTreeSet<String> {
    files
        .keys()
        .filter_map(|rel| {
            Path::new(rel).components().find_map(|c| match c {
                Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            })
        })
        .collect()
}

/// Makes `dir` hold exactly `files` the way kubelet's atomic writer does: a fresh
/// `..<version>` directory gets the files, the `..data` link is swapped to it in one rename,
/// every top-level name is a link `name -> ..data/name`, names no longer present are removed,
/// and so is the previous version. Returns whether anything changed.
pub fn write_dir(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> std::io::Result<bool> {
    static VERSION: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir)?;
    let previous = std::fs::read_link(dir.join(DATA)).ok();
    if let Some(prev) = &previous
        && read_tree(&dir.join(prev)).is_ok_and(|old| &old == files)
    {
        return Ok(false);
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let version = format!("..{stamp}_{}", VERSION.fetch_add(1, Ordering::Relaxed));
    let data = dir.join(&version);
    std::fs::create_dir(&data)?;
    for (rel, bytes) in files {
        let path = data.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut f = std::fs::File::create(&path)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    let tmp = dir.join(DATA_TMP);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&version, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA))?;
    let names = top_level(files);
    for name in &names {
        let link = dir.join(name);
        let target = Path::new(DATA).join(name);
        match std::fs::read_link(&link) {
            Ok(t) if t == target => continue,
            Ok(_) => std::fs::remove_file(&link)?,
            Err(_) if std::fs::symlink_metadata(&link).is_ok() => remove_any(&link)?,
            Err(_) => {}
        }
        std::os::unix::fs::symlink(&target, &link)?;
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !names.contains(&name) {
            remove_any(&entry.path())?;
        }
    }
    if let Some(prev) = previous
        && prev != Path::new(&version)
    {
        let _ = std::fs::remove_dir_all(dir.join(prev));
    }
    Ok(true)
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

/// The root of a mount path: its parent directory, or the path itself when the parent is `/`
/// or a top-level directory (`/tls` or `/var/tls` are their own roots, so `/` and `/var` are
/// never rewritten).
pub fn mount_root(path: &str) -> String {
    let p = Path::new(path);
    match p.parent() {
        Some(parent) if parent.components().count() > 2 => parent.display().to_string(),
        _ => p.display().to_string(),
    }
}

/// Where a pod's mounts are found locally.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountLayout {
    /// (link to create, the volume directory it points to).
    pub links: Vec<(PathBuf, PathBuf)>,
    /// (mount root, local directory) rewrites for args and env.
    pub rewrites: Vec<(String, String)>,
}

/// The local layout of `mounts` (mount path, volume directory) under `base` (the pod's
/// directory): each outermost [`mount_root`] becomes `base/mnt/<n>`, each mount a link below
/// it. A root inside another root is served by the outer one.
pub fn mount_layout(mounts: &[(String, PathBuf)], base: &Path) -> MountLayout {
    let below = |path: &str, root: &str| {
        path == root || path.strip_prefix(root).is_some_and(|r| r.starts_with('/'))
    };
    let mut roots: Vec<String> = mounts.iter().map(|(m, _)| mount_root(m)).collect();
    roots.sort();
    roots.dedup();
    let outer: Vec<String> = roots
        .iter()
        .filter(|r| !roots.iter().any(|o| o != *r && below(r, o)))
        .cloned()
        .collect();
    let mut layout = MountLayout::default();
    for (n, root) in outer.iter().enumerate() {
        let local = base.join("mnt").join(n.to_string());
        layout
            .rewrites
            .push((root.clone(), local.display().to_string()));
        for (path, dir) in mounts.iter().filter(|(m, _)| below(m, root)) {
            let rel = path[root.len()..].trim_start_matches('/');
            let link = if rel.is_empty() {
                local.clone()
            } else {
                local.join(rel)
            };
            layout.links.push((link, dir.clone()));
        }
    }
    // Longer roots first, so that no rewrite cuts another's path.
    layout
        .rewrites
        .sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    layout
}

/// Creates the links of `layout` (replacing what was there).
pub fn make_links(layout: &MountLayout) -> std::io::Result<()> {
    for (link, target) in &layout.links {
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if std::fs::symlink_metadata(link).is_ok() {
            remove_any(link)?;
        }
        std::os::unix::fs::symlink(target, link)?;
    }
    Ok(())
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
    fn write_dir_swaps_a_new_version_in_like_kubelet() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join("tls");
        let one = BTreeMap::from([
            ("tls.crt".to_string(), b"1".to_vec()),
            ("ca.crt".to_string(), b"ca".to_vec()),
        ]);
        assert!(write_dir(&d, &one).expect("write"));
        let first = std::fs::read_link(d.join(DATA)).expect("..data links a version");
        assert_eq!(
            std::fs::read_link(d.join("tls.crt")).expect("key links through ..data"),
            Path::new("..data/tls.crt")
        );
        assert!(!write_dir(&d, &one).expect("rewrite"));
        assert_eq!(std::fs::read_link(d.join(DATA)).expect("same"), first);

        let two = BTreeMap::from([("tls.crt".to_string(), b"2".to_vec())]);
        assert!(write_dir(&d, &two).expect("update"));
        assert_eq!(std::fs::read(d.join("tls.crt")).expect("read"), b"2");
        assert!(std::fs::symlink_metadata(d.join("ca.crt")).is_err());
        let second = std::fs::read_link(d.join(DATA)).expect("..data");
        assert_ne!(second, first);
        assert!(!d.join(&first).exists(), "the old version is removed");
        let names: BTreeSet<String> = std::fs::read_dir(&d)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            BTreeSet::from([
                "..data".to_string(),
                second.display().to_string(),
                "tls.crt".to_string()
            ])
        );

        // A reader holding the old version's file keeps reading it whole; a new open sees
        // the new content (no torn mix across keys).
        let nested = BTreeMap::from([("sub/x".to_string(), b"x".to_vec())]);
        assert!(write_dir(&d, &nested).expect("nested"));
        assert_eq!(std::fs::read(d.join("sub/x")).expect("nested read"), b"x");
        assert!(write_dir(&d, &BTreeMap::new()).expect("emptied"));
        assert!(std::fs::symlink_metadata(d.join("sub")).is_err());
    }

    #[test]
    fn mounts_under_one_root_share_its_local_directory() {
        let base = Path::new("/pods/p");
        let mounts = vec![
            (
                "/var/run/kvroute/secrets/api-keys".to_string(),
                PathBuf::from("/pods/p/volumes/a"),
            ),
            (
                "/var/run/kvroute/secrets/ca".to_string(),
                PathBuf::from("/pods/p/volumes/b"),
            ),
            (
                "/var/run/kvroute/tls".to_string(),
                PathBuf::from("/pods/p/volumes/c"),
            ),
            ("/tls".to_string(), PathBuf::from("/pods/p/volumes/d")),
        ];
        assert_eq!(mount_root("/var/run/kvroute/tls"), "/var/run/kvroute");
        assert_eq!(mount_root("/var/tls"), "/var/tls");
        assert_eq!(mount_root("/tls"), "/tls");
        let layout = mount_layout(&mounts, base);
        assert_eq!(
            layout.rewrites,
            vec![
                ("/var/run/kvroute".to_string(), "/pods/p/mnt/1".to_string()),
                ("/tls".to_string(), "/pods/p/mnt/0".to_string()),
            ]
        );
        assert_eq!(
            layout.links,
            vec![
                (
                    PathBuf::from("/pods/p/mnt/0"),
                    PathBuf::from("/pods/p/volumes/d")
                ),
                (
                    PathBuf::from("/pods/p/mnt/1/secrets/api-keys"),
                    PathBuf::from("/pods/p/volumes/a")
                ),
                (
                    PathBuf::from("/pods/p/mnt/1/secrets/ca"),
                    PathBuf::from("/pods/p/volumes/b")
                ),
                (
                    PathBuf::from("/pods/p/mnt/1/tls"),
                    PathBuf::from("/pods/p/volumes/c")
                ),
            ]
        );
    }

    #[test]
    fn a_flag_naming_the_parent_of_mounts_reads_every_secret_through_the_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path();
        let vol = base.join("volumes").join("k");
        write_dir(&vol, &BTreeMap::from([("key".to_string(), b"v1".to_vec())])).expect("write");
        let layout = mount_layout(
            &[("/var/run/kvroute/secrets/keys".to_string(), vol.clone())],
            base,
        );
        make_links(&layout).expect("links");
        let (from, to) = &layout.rewrites[0];
        let flag = "/var/run/kvroute/secrets".replace(from.as_str(), to);
        let read = || std::fs::read(Path::new(&flag).join("keys").join("key")).expect("read");
        assert_eq!(read(), b"v1");
        write_dir(&vol, &BTreeMap::from([("key".to_string(), b"v2".to_vec())])).expect("rotate");
        assert_eq!(read(), b"v2");
    }
}
