//! The Secrets the router reads while it serves: API-key and JWKS Secrets a pool (or policy)
//! names for tenant identity, and a GatewayBackend's credential and CA bundle. The router
//! never reads Secrets from the API server (its RBAC has no Secret rights); the operator
//! mounts each referenced Secret, read-only and optional, into the router pods at
//! `SECRETS_DIR/<secret>/<key>` and passes `--secrets-dir`, and reports on the resource that
//! names it whether that mount is in place ([`SECRETS_MOUNTED`]).
//!
//! ```text
//! Pools, Policies, GatewayBackends --*_secret_uses()--> [SecretUse {field, name, key}]
//!     --router_secrets()--> names (reserved ones left out) --mount_secrets()--> router Deployment:
//!        one optional Secret volume per name at SECRETS_DIR/<name>, env KVROUTE_ROUTER_SECRETS_DIR
//! resource's uses + key names of those Secrets in the router's namespace + the Secrets the
//!     router Deployment mounts --secrets_mounted()--> condition SecretsMounted
//! ```
//!
//! Where the Secrets live: in the router's namespace, whatever namespace the resource is in,
//! because a pod can mount only Secrets of its own namespace. So a Secret name means the same
//! Secret to every pool, policy and backend of the installation; whoever may write those
//! resources may make the router send any mountable Secret of the router's namespace to a
//! backend's URL. The operator's own Secrets ([`RESERVED`]: the CA and the router's mTLS key
//! and admin token) are never mounted, and a reference to one is a False condition; keep
//! other Secrets out of the router's namespace (docs/control-plane.md, "Operator").
//!
//! Why optional volumes: a missing Secret must not keep the router from starting (every other
//! pool keeps working); the router counts the missing file and keeps the last good value, and
//! the condition names what is missing. A Secret created later appears in the mounted
//! directory at the kubelet's next sync without a restart, and so does a rotated key.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{EnvVar, SecretVolumeSource, Volume, VolumeMount};
use kvroute_crds::backend::GatewayBackendSpec;
use kvroute_crds::condition::{self, Condition, ConditionStatus, Reason, Time};
use kvroute_crds::policy::InferencePolicySpec;
use kvroute_crds::pool::InferencePoolSpec;

use crate::permissions::{CA_SECRET, MTLS_SECRET};

/// Where the router pods find the Secrets: `SECRETS_DIR/<secret>/<key>`
/// (`kvroute-router --secrets-dir`).
pub const SECRETS_DIR: &str = "/var/run/kvroute/secrets";
/// The router's environment variable for `--secrets-dir`.
pub const SECRETS_DIR_ENV: &str = "KVROUTE_ROUTER_SECRETS_DIR";
/// Prefix of the router pod's volume names for these Secrets (`request-secret-<n>`).
pub const VOLUME_PREFIX: &str = "request-secret-";
/// Condition type on pools, policies and backends that name Secrets: each one exists in the
/// router's namespace with the named key, and the router Deployment mounts it.
pub const SECRETS_MOUNTED: &str = "SecretsMounted";
/// Secrets of the operator that no resource may make the router mount.
pub const RESERVED: &[&str] = &[CA_SECRET, MTLS_SECRET];

/// One Secret a resource names for the router to read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SecretUse {
    /// The field naming it, e.g. `spec.auth.secretRef` (for messages).
    pub field: String,
    /// Secret name (in the router's namespace).
    pub name: String,
    /// The key the router reads; `None` when it reads every key (e.g. one key per tenant).
    pub key: Option<String>,
}

impl SecretUse {
    /// A use of `name` (and `key`, when the router reads one key) by `field`.
    pub fn new(field: impl Into<String>, name: &str, key: Option<&str>) -> Self {
        Self {
            field: field.into(),
            name: name.to_string(),
            key: key.map(str::to_string),
        }
    }
}

/// The Secrets a pool names for tenant identity (API keys, JWKS).
///
/// Plug-in point of the pool's `spec.auth` block (part B of issue 13): until it exists a pool
/// names no Secret the router reads (the gateway TLS Secret is mounted by
/// [`super::tls::secure_router`] at its own path).
pub fn pool_secret_uses(spec: &InferencePoolSpec) -> Vec<SecretUse> {
    let Some(auth) = &spec.auth else {
        return Vec::new();
    };
    let mut uses: Vec<SecretUse> = auth
        .api_key_secrets
        .iter()
        .enumerate()
        .map(|(i, s)| SecretUse::new(format!("spec.auth.apiKeySecrets[{i}]"), &s.name, None))
        .collect();
    if let Some(r) = auth.jwt.as_ref().and_then(|j| j.jwks_secret_ref.as_ref()) {
        uses.push(SecretUse::new(
            "spec.auth.jwt.jwksSecretRef",
            &r.name,
            Some(&r.key),
        ));
    }
    uses
}

/// The Secrets a policy names (API-key Secrets referenced from a policy, once policies can
/// name any; none today).
pub fn policy_secret_uses(_spec: &InferencePolicySpec) -> Vec<SecretUse> {
    Vec::new()
}

/// The Secrets a GatewayBackend names: its credential and its CA bundle.
pub fn backend_secret_uses(spec: &GatewayBackendSpec) -> Vec<SecretUse> {
    spec.secret_refs()
        .into_iter()
        .map(|(field, r)| SecretUse::new(field, &r.name, Some(&r.key)))
        .collect()
}

/// Whether the operator mounts a Secret of this name into the router.
pub fn mountable(name: &str) -> bool {
    !RESERVED.contains(&name) && !name.is_empty()
}

/// The Secret names to mount into the router: every one that `uses` name, reserved ones left
/// out, sorted (so the pod template does not change while the set does not).
pub fn router_secrets<'a>(uses: impl IntoIterator<Item = &'a SecretUse>) -> BTreeSet<String> {
    uses.into_iter()
        .filter(|u| mountable(&u.name))
        .map(|u| u.name.clone())
        .collect()
}

/// Adds one optional, read-only Secret volume per name of `secrets` to the router
/// Deployment, mounted at `SECRETS_DIR/<name>`, and sets `--secrets-dir` (always, so the
/// router's reading is on with or without Secrets yet).
pub fn mount_secrets(d: &mut Deployment, secrets: &BTreeSet<String>) {
    let Some(pod) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) else {
        return;
    };
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    let mut mounts = Vec::with_capacity(secrets.len());
    for (i, name) in secrets.iter().enumerate() {
        let volume = format!("{VOLUME_PREFIX}{i}");
        volumes.push(Volume {
            name: volume.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(name.clone()),
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: volume,
            mount_path: format!("{SECRETS_DIR}/{name}"),
            read_only: Some(true),
            ..Default::default()
        });
    }
    if let Some(c) = pod.containers.first_mut() {
        c.volume_mounts.get_or_insert_with(Vec::new).extend(mounts);
        let env = c.env.get_or_insert_with(Vec::new);
        env.retain(|e| e.name != SECRETS_DIR_ENV);
        env.push(EnvVar {
            name: SECRETS_DIR_ENV.to_string(),
            value: Some(SECRETS_DIR.to_string()),
            ..Default::default()
        });
    }
}

/// The Secret names the router Deployment mounts under [`SECRETS_DIR`] (as
/// [`mount_secrets`] writes them), read back to tell whether a mount is in place yet.
pub fn mounted_secrets(d: &Deployment) -> BTreeSet<String> {
    let Some(pod) = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()) else {
        return BTreeSet::new();
    };
    let by_volume: BTreeMap<&str, &str> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| Some((v.name.as_str(), v.secret.as_ref()?.secret_name.as_deref()?)))
        .collect();
    pod.containers
        .iter()
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .filter(|m| m.mount_path.starts_with(&format!("{SECRETS_DIR}/")))
        .filter_map(|m| by_volume.get(m.name.as_str()).map(|s| s.to_string()))
        .collect()
}

/// What [`secrets_mounted`] reads, besides the resource's uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretFacts {
    /// The router's namespace (for messages).
    pub router_namespace: String,
    /// Key names of the used Secrets that exist there (values are never kept).
    pub keys: BTreeMap<String, BTreeSet<String>>,
    /// Secrets the router Deployment mounts ([`mounted_secrets`]); `None`: no router
    /// Deployment (the router is not managed by this operator, or not created yet).
    pub mounted: Option<BTreeSet<String>>,
}

/// Why a Secret use is not served yet; the first in this order names the condition's reason.
fn problem(u: &SecretUse, facts: &SecretFacts) -> Option<(Reason, String)> {
    let ns = &facts.router_namespace;
    if !mountable(&u.name) {
        return Some((
            Reason::ReservedSecret,
            format!(
                "{}: Secret {:?} is the operator's own and is never mounted into the router",
                u.field, u.name
            ),
        ));
    }
    let Some(keys) = facts.keys.get(&u.name) else {
        return Some((
            Reason::SecretNotFound,
            format!(
                "{}: Secret {:?} not found in the router's namespace {ns:?}",
                u.field, u.name
            ),
        ));
    };
    if let Some(key) = &u.key
        && !keys.contains(key)
    {
        return Some((
            Reason::KeyNotFound,
            format!("{}: Secret {ns}/{} has no key {key:?}", u.field, u.name),
        ));
    }
    match &facts.mounted {
        None => Some((
            Reason::MountPending,
            format!("no router Deployment in {ns:?} mounts Secret {:?}", u.name),
        )),
        Some(m) if !m.contains(&u.name) => Some((
            Reason::MountPending,
            format!(
                "the router Deployment does not mount Secret {:?} yet",
                u.name
            ),
        )),
        Some(_) => None,
    }
}

/// The [`SECRETS_MOUNTED`] condition of a resource whose Secret uses are `uses`; `None` when
/// it names no Secret.
///
/// True (reason `Mounted`): every Secret exists in the router's namespace with its key and the
/// router Deployment mounts it at `SECRETS_DIR/<name>` (the pods have it once they rolled).
/// False: `ReservedSecret`, `SecretNotFound`, `KeyNotFound` or `MountPending` (the message lists
/// every problem). The router serves meanwhile: a missing file is its counted error, and what
/// depends on it (a backend's credential, a pool's keys) keeps its last good value.
pub fn secrets_mounted(
    uses: &[SecretUse],
    facts: &SecretFacts,
    generation: Option<i64>,
    now: &Time,
) -> Option<Condition> {
    if uses.is_empty() {
        return None;
    }
    let problems: Vec<(Reason, String)> = uses.iter().filter_map(|u| problem(u, facts)).collect();
    let (status, reason, message) = match problems.first() {
        Some((reason, _)) => (
            ConditionStatus::False,
            *reason,
            problems
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
        None => {
            let names: BTreeSet<&str> = uses.iter().map(|u| u.name.as_str()).collect();
            (
                ConditionStatus::True,
                Reason::Mounted,
                format!(
                    "Secrets {} of namespace {:?} are mounted read-only into the router at {SECRETS_DIR}/<name>/",
                    names.into_iter().collect::<Vec<_>>().join(", "),
                    facts.router_namespace
                ),
            )
        }
    };
    Some(condition::condition(
        SECRETS_MOUNTED,
        status,
        reason,
        message,
        generation,
        now,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::OperatorConfig;
    use crate::desired::router::{TokenizerMounts, desired_router};
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::from_second(1_700_000_000).expect("valid"))
    }

    fn router() -> Deployment {
        let cfg = OperatorConfig {
            sidecar_image: "s".into(),
            mock_image: "m".into(),
            router_image: "r".into(),
            router_replicas: 1,
            router_namespace: "kvroute-system".into(),
            watch_namespace: String::new(),
            mtls: false,
            gie_inference_pool: String::new(),
            otlp_endpoint: String::new(),
            tokenizer_fetch: Default::default(),
        };
        desired_router(&cfg, &TokenizerMounts::default()).deployment
    }

    fn backend(yaml: &str) -> GatewayBackendSpec {
        serde_saphyr::from_str(yaml).expect("backend")
    }

    #[test]
    fn backend_secrets_become_optional_read_only_mounts_and_the_env() {
        let a = backend(
            "url: https://api.example.com\nauth: {secretRef: {name: api-key, key: token}}\ntls: {caSecretRef: {name: ca, key: ca.crt}}\n",
        );
        let b = backend(
            "url: https://other.example.com\nauth: {secretRef: {name: api-key, key: other}}\n",
        );
        let reserved = backend(
            "url: https://evil.example.com\nauth: {secretRef: {name: kvroute-mtls, key: tls.key}}\n",
        );
        let uses: Vec<SecretUse> = [a, b, reserved]
            .iter()
            .flat_map(backend_secret_uses)
            .collect();
        assert_eq!(uses[0].field, "spec.auth.secretRef");
        let names = router_secrets(&uses);
        assert_eq!(
            names,
            BTreeSet::from(["api-key".to_string(), "ca".to_string()])
        );

        let mut d = router();
        mount_secrets(&mut d, &names);
        assert_eq!(mounted_secrets(&d), names);
        let pod = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod");
        let vols: Vec<(&str, Option<bool>)> = pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.secret.as_ref())
            .map(|s| (s.secret_name.as_deref().unwrap_or_default(), s.optional))
            .collect();
        assert_eq!(vols, vec![("api-key", Some(true)), ("ca", Some(true))]);
        let c = &pod.containers[0];
        let mounts: Vec<(&str, Option<bool>)> = c
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| m.name.starts_with(VOLUME_PREFIX))
            .map(|m| (m.mount_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            vec![
                ("/var/run/kvroute/secrets/api-key", Some(true)),
                ("/var/run/kvroute/secrets/ca", Some(true))
            ]
        );
        let env: Vec<(&str, Option<&str>)> = c
            .env
            .iter()
            .flatten()
            .filter(|e| e.name == SECRETS_DIR_ENV)
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect();
        assert_eq!(env, vec![(SECRETS_DIR_ENV, Some(SECRETS_DIR))]);
        // Applying twice adds nothing twice to the env.
        mount_secrets(&mut d, &BTreeSet::new());
        let c = &d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod")
            .containers[0];
        assert_eq!(
            c.env
                .iter()
                .flatten()
                .filter(|e| e.name == SECRETS_DIR_ENV)
                .count(),
            1
        );
    }

    #[test]
    fn the_condition_names_every_missing_secret_key_and_mount() {
        let uses = vec![
            SecretUse::new("spec.auth.secretRef", "api-key", Some("token")),
            SecretUse::new("spec.tls.caSecretRef", "ca", Some("ca.crt")),
        ];
        let mut facts = SecretFacts {
            router_namespace: "kvroute-system".into(),
            keys: BTreeMap::from([("api-key".to_string(), BTreeSet::from(["token".to_string()]))]),
            mounted: Some(BTreeSet::from(["api-key".to_string()])),
        };
        let c = secrets_mounted(&uses, &facts, Some(3), &now()).expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "SecretNotFound")
        );
        assert!(
            c.message
                .contains("\"ca\" not found in the router's namespace"),
            "{}",
            c.message
        );

        facts
            .keys
            .insert("ca".into(), BTreeSet::from(["other".to_string()]));
        let c = secrets_mounted(&uses, &facts, Some(3), &now()).expect("condition");
        assert_eq!(c.reason, "KeyNotFound");

        facts
            .keys
            .insert("ca".into(), BTreeSet::from(["ca.crt".to_string()]));
        let c = secrets_mounted(&uses, &facts, Some(3), &now()).expect("condition");
        assert_eq!(c.reason, "MountPending");
        facts.mounted = None;
        assert_eq!(
            secrets_mounted(&uses, &facts, Some(3), &now())
                .expect("condition")
                .reason,
            "MountPending"
        );

        facts.mounted = Some(BTreeSet::from(["api-key".to_string(), "ca".to_string()]));
        let c = secrets_mounted(&uses, &facts, Some(3), &now()).expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Mounted"));
        assert_eq!(c.observed_generation, Some(3));

        let reserved = vec![SecretUse::new(
            "spec.auth.secretRef",
            MTLS_SECRET,
            Some("tls.key"),
        )];
        facts
            .keys
            .insert(MTLS_SECRET.into(), BTreeSet::from(["tls.key".to_string()]));
        let c = secrets_mounted(&reserved, &facts, None, &now()).expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "ReservedSecret")
        );
        assert!(secrets_mounted(&[], &facts, None, &now()).is_none());
    }

    #[test]
    fn a_secret_read_whole_needs_only_to_exist() {
        let uses = vec![SecretUse::new("spec.auth.apiKeys.secretRef", "keys", None)];
        let facts = SecretFacts {
            router_namespace: "ns".into(),
            keys: BTreeMap::from([("keys".to_string(), BTreeSet::new())]),
            mounted: Some(BTreeSet::from(["keys".to_string()])),
        };
        let c = secrets_mounted(&uses, &facts, None, &now()).expect("condition");
        assert_eq!(c.status, "True");
    }
}
