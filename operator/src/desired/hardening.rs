//! The security settings every pod the operator writes carries, and the check the manifest
//! tests run over them.
//!
//! ```text
//! pod:        seccompProfile RuntimeDefault
//! container:  allowPrivilegeEscalation false, capabilities drop ALL,
//!             kvroute images: runAsNonRoot, runAsUser/Group 65532, readOnlyRootFilesystem
//!             (writes go to emptyDir volumes: /tmp, the tokenizer cache)
//!             requests cpu+memory and a memory limit (defaults below, overridable where the
//!             CRD has a field: the engine's `spec.resources`)
//! ```
//!
//! The one exception is the vLLM engine container: the upstream image runs as root and
//! writes its caches under `/root/.cache`, `/tmp` and Triton/torch.compile directories, so it
//! keeps its user and a writable root filesystem; it still has no capabilities, no privilege
//! escalation and the RuntimeDefault seccomp profile. See docs/security.md, "Hardened pods".

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The non-root user of kvroute's images (distroless `nonroot`, `USER 65532:65532`).
pub const NONROOT_UID: i64 = 65532;
/// Name of the `/tmp` emptyDir volume of read-only containers.
pub const TMP_VOLUME: &str = "tmp";
/// Size limit of the `/tmp` volume.
pub const TMP_SIZE: &str = "64Mi";

/// Pod-level settings: the RuntimeDefault seccomp profile; `non_root` also refuses to start
/// any container as root (false only for pods running the upstream vLLM image).
pub fn pod_security(non_root: bool) -> PodSecurityContext {
    PodSecurityContext {
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            ..Default::default()
        }),
        run_as_non_root: non_root.then_some(true),
        ..Default::default()
    }
}

/// A kvroute container: non-root (65532), read-only root filesystem, no capabilities, no
/// privilege escalation.
pub fn restricted() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(NONROOT_UID),
        run_as_group: Some(NONROOT_UID),
        read_only_root_filesystem: Some(true),
        ..unprivileged()
    }
}

/// A container that keeps its image's user and a writable root filesystem (the vLLM engine)
/// but gets no capabilities, no privilege escalation and the RuntimeDefault seccomp profile.
pub fn unprivileged() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            ..Default::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Requests `cpu`/`memory` and limits `memory` (and `cpu` when given).
pub fn resources(
    cpu: &str,
    memory: &str,
    cpu_limit: Option<&str>,
    memory_limit: &str,
) -> ResourceRequirements {
    let q = |s: &str| Quantity(s.to_string());
    let mut limits = BTreeMap::from([("memory".to_string(), q(memory_limit))]);
    if let Some(c) = cpu_limit {
        limits.insert("cpu".to_string(), q(c));
    }
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), q(cpu)),
            ("memory".to_string(), q(memory)),
        ])),
        limits: Some(limits),
        ..Default::default()
    }
}

/// Fills in `defaults` for every request and limit `given` leaves out; the user's values win.
/// A missing limit takes the user's request for that resource when there is one (and a
/// missing request the user's limit), so a default never contradicts what the user set.
pub fn with_defaults(
    given: Option<ResourceRequirements>,
    defaults: ResourceRequirements,
) -> ResourceRequirements {
    let mut r = given.unwrap_or_default();
    let user_requests = r.requests.clone().unwrap_or_default();
    let user_limits = r.limits.clone().unwrap_or_default();
    let requests = r.requests.get_or_insert_with(BTreeMap::new);
    for (k, v) in defaults.requests.into_iter().flatten() {
        let v = user_limits.get(&k).cloned().unwrap_or(v);
        requests.entry(k).or_insert(v);
    }
    let limits = r.limits.get_or_insert_with(BTreeMap::new);
    for (k, v) in defaults.limits.into_iter().flatten() {
        let v = user_requests.get(&k).cloned().unwrap_or(v);
        limits.entry(k).or_insert(v);
    }
    r
}

/// The `/tmp` emptyDir volume and its mount, for read-only containers that need scratch space.
pub fn tmp_volume() -> (Volume, VolumeMount) {
    (
        Volume {
            name: TMP_VOLUME.to_string(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(Quantity(TMP_SIZE.to_string())),
                ..Default::default()
            }),
            ..Default::default()
        },
        VolumeMount {
            name: TMP_VOLUME.to_string(),
            mount_path: "/tmp".to_string(),
            ..Default::default()
        },
    )
}

/// What a pod spec lacks of the hardening above; `root_allowed` names the containers allowed
/// to keep their image's user and a writable root filesystem. Empty when all is in place.
pub fn hardening_issues(pod: &PodSpec, root_allowed: &[&str]) -> Vec<String> {
    let mut issues = Vec::new();
    let psc = pod.security_context.clone().unwrap_or_default();
    if psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()) != Some("RuntimeDefault") {
        issues.push("pod: seccompProfile is not RuntimeDefault".to_string());
    }
    let containers = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten());
    for c in containers {
        let sc = c.security_context.clone().unwrap_or_default();
        let mut miss = |what: &str| issues.push(format!("container {}: {what}", c.name));
        if sc.allow_privilege_escalation != Some(false) {
            miss("allowPrivilegeEscalation is not false");
        }
        let drops_all = sc
            .capabilities
            .as_ref()
            .and_then(|cap| cap.drop.as_ref())
            .is_some_and(|d| d.iter().any(|x| x == "ALL"));
        let adds = sc
            .capabilities
            .as_ref()
            .and_then(|cap| cap.add.as_ref())
            .is_some_and(|a| !a.is_empty());
        if !drops_all || adds {
            miss("capabilities do not drop ALL (or add some)");
        }
        if sc.privileged == Some(true) {
            miss("privileged");
        }
        if !root_allowed.contains(&c.name.as_str()) {
            let non_root = sc.run_as_non_root.or(psc.run_as_non_root) == Some(true)
                && sc.run_as_user.or(psc.run_as_user) != Some(0);
            if !non_root {
                miss("runAsNonRoot is not true");
            }
            if sc.read_only_root_filesystem != Some(true) {
                miss("readOnlyRootFilesystem is not true");
            }
        }
        issues.extend(resource_issues(c));
    }
    if pod.automount_service_account_token == Some(true) {
        issues.push("automountServiceAccountToken is true".to_string());
    }
    issues
}

fn resource_issues(c: &Container) -> Vec<String> {
    let r = c.resources.clone().unwrap_or_default();
    let has = |m: &Option<BTreeMap<String, Quantity>>, k: &str| {
        m.as_ref().is_some_and(|m| m.contains_key(k))
    };
    let mut out = Vec::new();
    for k in ["cpu", "memory"] {
        if !has(&r.requests, k) {
            out.push(format!("container {}: no {k} request", c.name));
        }
    }
    if !has(&r.limits, "memory") {
        out.push(format!("container {}: no memory limit", c.name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(c: Container) -> PodSpec {
        PodSpec {
            containers: vec![c],
            security_context: Some(pod_security(true)),
            ..Default::default()
        }
    }

    fn good() -> Container {
        Container {
            name: "c".into(),
            security_context: Some(restricted()),
            resources: Some(resources("10m", "16Mi", None, "64Mi")),
            ..Default::default()
        }
    }

    #[test]
    fn a_restricted_container_passes_and_each_gap_is_named() {
        assert_eq!(hardening_issues(&pod(good()), &[]), Vec::<String>::new());

        let mut c = good();
        c.security_context = Some(unprivileged());
        let issues = hardening_issues(&pod(c.clone()), &[]);
        assert_eq!(
            issues,
            vec!["container c: readOnlyRootFilesystem is not true"]
        );
        // Pod-level runAsNonRoot counts; the writable root needs the exemption.
        assert!(hardening_issues(&pod(c), &["c"]).is_empty());

        let mut c = good();
        c.resources = None;
        assert_eq!(hardening_issues(&pod(c), &[]).len(), 3);

        let mut c = good();
        if let Some(sc) = c.security_context.as_mut() {
            sc.capabilities = Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into()]),
                drop: Some(vec!["ALL".into()]),
            });
        }
        assert_eq!(hardening_issues(&pod(c), &[]).len(), 1);

        let mut p = pod(good());
        p.security_context = None;
        p.automount_service_account_token = Some(true);
        let issues = hardening_issues(&p, &[]);
        assert!(
            issues.iter().any(|i| i.contains("seccompProfile")),
            "{issues:?}"
        );
        assert!(issues.iter().any(|i| i.contains("automount")), "{issues:?}");
    }

    #[test]
    fn user_resources_win_over_defaults() {
        let user = ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".to_string(), Quantity("8".into()))])),
            ..Default::default()
        };
        let r = with_defaults(Some(user), resources("1", "1Gi", None, "4Gi"));
        let req = r.requests.expect("requests");
        assert_eq!(req["cpu"], Quantity("8".into()));
        assert_eq!(req["memory"], Quantity("1Gi".into()));
        assert_eq!(r.limits.expect("limits")["memory"], Quantity("4Gi".into()));

        // A request above the default limit becomes the limit; a limit below the default
        // request becomes the request.
        let user = ResourceRequirements {
            requests: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("96Gi".into()),
            )])),
            limits: Some(BTreeMap::from([(
                "cpu".to_string(),
                Quantity("500m".into()),
            )])),
            ..Default::default()
        };
        let r = with_defaults(Some(user), resources("1", "1Gi", None, "4Gi"));
        assert_eq!(
            r.limits.as_ref().expect("limits")["memory"],
            Quantity("96Gi".into())
        );
        assert_eq!(
            r.requests.as_ref().expect("requests")["cpu"],
            Quantity("500m".into())
        );
    }
}
