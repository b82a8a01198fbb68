//! Transport security as desired state: which identities exist, where their key pairs come
//! from (the operator's CA or cert-manager), how pods mount them and which flags tell the
//! router and the sidecars to use them, and the pool conditions that report it.
//!
//! ```text
//! all Pools in scope --transport()--> Transport { mode, gateway Secret in use }
//! WorkerSets + Pools --identities()--> namespace -> [Identity]   (crate::pki issues them,
//!                                                                  or desired_certificate())
//! router Deployment   --secure_router()-->  + tls/admin-token/gateway volumes and flags
//! worker Deployment   --secure_workerset()--> sidecar + tls volume and flags
//! Pool + TransportFacts --transport_condition()/gateway_condition()--> Pool conditions
//! ```
//!
//! Everything here is applied only when the operator runs with `--mtls`: the router and
//! sidecar flags it passes exist only in builds with mTLS support.
//!
//! Secret layout seen by a pod: a directory with `tls.crt`, `tls.key` and `ca.crt`. With the
//! operator's CA the three are `items:` of the namespace's one `kvroute-mtls` Secret (the
//! pod sees only its own pair). cert-manager writes one Secret per Certificate with those
//! very key names, so in that mode the pod mounts its identity's Secret
//! (`kvroute-mtls-<identity>`) whole, through the same `items:` list.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{KeyToPath, SecretVolumeSource, Volume, VolumeMount};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kvroute_crds::InferenceWorkerSet;
use kvroute_crds::condition::{self, Condition, ConditionStatus, Reason, Time};
use kvroute_crds::pool::{InferencePool, InferencePoolSpec, IssuerRef};
use serde_json::json;

use super::refs::selector_matches;
use super::router::{INGEST_SERVICE, ROUTER_NAME};
use super::workerset::SIDECAR_CONTAINER;
use super::workerset::deployment::template_hash;
use super::{OperatorConfig, TEMPLATE_HASH_ANNOTATION, common_labels};
use crate::pki::{
    ADMIN_TOKEN_KEY, CA_BUNDLE_KEY, Identity, MTLS_SECRET, cert_key, picker_identity,
    private_key_key, sidecar_identity,
};

/// Where a pod's own key pair and bundle are mounted (router: `--grpc-tls-dir`; sidecar:
/// `--router-tls-dir`).
pub const TLS_DIR: &str = "/var/run/kvroute/tls";
/// Where the router's admin token is mounted.
pub const ADMIN_TOKEN_DIR: &str = "/var/run/kvroute/admin";
/// Where the gateway's TLS Secret is mounted (`--gateway-tls-dir`).
pub const GATEWAY_TLS_DIR: &str = "/var/run/kvroute/gateway-tls";
/// Router flag: mTLS for the Ingest and Picker gRPC services.
pub const FLAG_GRPC_TLS_DIR: &str = "--grpc-tls-dir";
/// Router flag: bearer token file for the admin port.
pub const FLAG_ADMIN_TOKEN_FILE: &str = "--admin-token-file";
/// Router flag: TLS termination of the HTTP gateway.
pub const FLAG_GATEWAY_TLS_DIR: &str = "--gateway-tls-dir";
/// Sidecar flag: client pair and the CA bundle that verifies routers.
pub const FLAG_ROUTER_TLS_DIR: &str = "--router-tls-dir";
/// Sidecar flag: the name the router's certificate must carry.
pub const FLAG_ROUTER_TLS_SERVER_NAME: &str = "--router-tls-server-name";
/// Volume name of a pod's own key pair.
pub const TLS_VOLUME: &str = "kvroute-tls";
/// Volume name of the admin token.
pub const ADMIN_TOKEN_VOLUME: &str = "kvroute-admin-token";
/// Volume name of the gateway's TLS Secret.
pub const GATEWAY_TLS_VOLUME: &str = "kvroute-gateway-tls";
/// Pool condition: are the pool's identities' certificates in place, and from where.
pub const TRANSPORT_SECURITY: &str = "TransportSecurity";
/// Pool condition: is the gateway TLS Secret the pool names mounted by the router.
pub const GATEWAY_TLS: &str = "GatewayTLS";
/// cert-manager's shortest certificate duration.
pub const CERT_MANAGER_MIN_DURATION: Duration = Duration::from_secs(3600);

/// Where key pairs come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsMode {
    /// The operator's CA (`kvroute-ca`), pairs in `kvroute-mtls`.
    OperatorCa,
    /// cert-manager `Certificate`s with this issuer, one Secret each.
    CertManager(IssuerRef),
    /// Pools name different issuers: the operator keeps issuing from its own CA and those
    /// pools say so.
    Conflict(Vec<IssuerRef>),
}

impl TlsMode {
    /// True when the operator issues the pairs itself.
    pub fn operator_issues(&self) -> bool {
        !matches!(self, TlsMode::CertManager(_))
    }
}

/// The installation-wide TLS decisions, from every Pool in scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    /// Certificate source.
    pub mode: TlsMode,
    /// Gateway TLS Secret the router mounts: the first pool (by namespace, name) naming one.
    pub gateway_secret: Option<String>,
    /// Every pool as (namespace, name), sorted: the router's URI SANs.
    pub pools: Vec<(String, String)>,
}

fn ns_name(p: &InferencePool) -> (String, String) {
    (
        p.metadata.namespace.clone().unwrap_or_default(),
        p.metadata.name.clone().unwrap_or_default(),
    )
}

/// Decides the certificate source and the gateway Secret from all pools in scope. The router
/// is shared by every pool, so one issuer serves all identities: cert-manager is used when
/// the pools that name an issuer all name the same one.
pub fn transport(pools: &[InferencePool]) -> Transport {
    let mut sorted: Vec<&InferencePool> = pools.iter().collect();
    sorted.sort_by_key(|p| ns_name(p));
    let issuers: BTreeSet<IssuerRef> = sorted
        .iter()
        .filter_map(|p| p.spec.tls.as_ref()?.issuer_ref.clone())
        .collect();
    let mut issuers = issuers.into_iter();
    let mode = match (issuers.next(), issuers.next()) {
        (None, _) => TlsMode::OperatorCa,
        (Some(one), None) => TlsMode::CertManager(one),
        (Some(a), Some(b)) => TlsMode::Conflict([a, b].into_iter().chain(issuers).collect()),
    };
    let gateway_secret = sorted
        .iter()
        .find_map(|p| Some(p.spec.gateway.as_ref()?.tls.as_ref()?.secret_name.clone()));
    Transport {
        mode,
        gateway_secret,
        pools: sorted.iter().map(|p| ns_name(p)).collect(),
    }
}

/// Every identity, by the namespace of the Secret that holds it: a sidecar pair per
/// WorkerSet, a picker pair per Pool, and the router's pair in the router's namespace.
pub fn identities(
    cfg: &OperatorConfig,
    sets: &[InferenceWorkerSet],
    transport: &Transport,
) -> BTreeMap<String, Vec<Identity>> {
    let mut out: BTreeMap<String, Vec<Identity>> = BTreeMap::new();
    out.entry(cfg.router_namespace.clone())
        .or_default()
        .push(Identity::router(
            &cfg.router_namespace,
            &transport.pools,
            &[ROUTER_NAME, INGEST_SERVICE],
        ));
    for s in sets {
        let (Some(ns), Some(name)) = (&s.metadata.namespace, &s.metadata.name) else {
            continue;
        };
        out.entry(ns.clone())
            .or_default()
            .push(Identity::sidecar(ns, name));
    }
    // A GIE InferencePool's gateway presents the picker identity of the pool's namespace
    // and name, as a kvroute Pool's does (one pair when both kinds share the name).
    let gie = cfg.gie_picker_pools();
    let pickers: BTreeSet<&(String, String)> = transport.pools.iter().chain(&gie).collect();
    for (ns, pool) in pickers {
        out.entry(ns.clone())
            .or_default()
            .push(Identity::picker(ns, pool));
    }
    out
}

/// Name of the cert-manager Certificate (and of the Secret it writes) of an identity.
pub fn certificate_name(stem: &str) -> String {
    format!("{MTLS_SECRET}-{stem}")
}

/// The cert-manager `Certificate` resource (cert-manager.io/v1).
pub fn certificate_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"),
        "certificates",
    )
}

fn go_duration(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

/// The Certificate that makes cert-manager issue `id`'s pair into `kvroute-mtls-<stem>`:
/// ECDSA P-256, a new key on every renewal, renewed a third of its life before expiry
/// (cert-manager needs at least an hour of life, so shorter lifetimes are raised to that).
pub fn desired_certificate(id: &Identity, issuer: &IssuerRef, leaf: Duration) -> DynamicObject {
    let name = certificate_name(&id.stem);
    let life = leaf.max(CERT_MANAGER_MIN_DURATION);
    let mut usages = vec!["digital signature", "client auth"];
    if id.server {
        usages.push("server auth");
    }
    let mut spec = json!({
        "secretName": name,
        "issuerRef": {"name": issuer.name, "kind": issuer.kind, "group": issuer.group},
        "commonName": format!("{}.{}", id.stem, id.namespace),
        "uris": id.uris,
        "duration": go_duration(life),
        "renewBefore": go_duration(life / 3),
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        "usages": usages,
        "secretTemplate": {"labels": common_labels("pki", &name)},
    });
    if !id.dns.is_empty() {
        spec["dnsNames"] = json!(id.dns);
    }
    let mut obj = DynamicObject::new(&name, &certificate_resource()).within(&id.namespace);
    obj.metadata.labels = Some(common_labels("pki", &name));
    obj.data = json!({ "spec": spec });
    obj
}

/// The volume of a pod's own pair, projected as `tls.crt`, `tls.key`, `ca.crt`.
pub fn identity_volume(mode: &TlsMode, stem: &str) -> Volume {
    let item = |key: String, path: &str| KeyToPath {
        key,
        path: path.to_string(),
        mode: None,
    };
    let (secret, items) = if mode.operator_issues() {
        (
            MTLS_SECRET.to_string(),
            vec![
                item(cert_key(stem), "tls.crt"),
                item(private_key_key(stem), "tls.key"),
                item(CA_BUNDLE_KEY.to_string(), "ca.crt"),
            ],
        )
    } else {
        (
            certificate_name(stem),
            vec![
                item("tls.crt".into(), "tls.crt"),
                item("tls.key".into(), "tls.key"),
                item("ca.crt".into(), "ca.crt"),
            ],
        )
    };
    Volume {
        name: TLS_VOLUME.to_string(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            items: Some(items),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn read_only(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: Some(true),
        ..Default::default()
    }
}

fn flag(args: &mut Vec<String>, name: &str, value: impl Into<String>) {
    args.push(name.to_string());
    args.push(value.into());
}

/// Adds `volumes` to the pod, `mounts` and `args` to the container named `container`, and
/// refreshes the template hash.
fn patch_pod(
    d: &mut Deployment,
    container: &str,
    volumes: Vec<Volume>,
    mounts: Vec<VolumeMount>,
    args: Vec<String>,
) {
    let Some(template) = d.spec.as_mut().map(|s| &mut s.template) else {
        return;
    };
    if let Some(pod) = template.spec.as_mut() {
        pod.volumes.get_or_insert_with(Vec::new).extend(volumes);
        if let Some(c) = pod.containers.iter_mut().find(|c| c.name == container) {
            c.volume_mounts.get_or_insert_with(Vec::new).extend(mounts);
            c.args.get_or_insert_with(Vec::new).extend(args);
        }
    }
    if let Some(a) = template
        .metadata
        .as_mut()
        .and_then(|m| m.annotations.as_mut())
    {
        a.remove(TEMPLATE_HASH_ANNOTATION);
    }
    let hash = template_hash(template);
    template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(TEMPLATE_HASH_ANNOTATION.to_string(), hash);
}

/// Router pods: their own pair for the gRPC services (`--grpc-tls-dir`), the admin token
/// (`--admin-token-file`) and, when a pool names one, the gateway's TLS Secret
/// (`--gateway-tls-dir`).
pub fn secure_router(d: &mut Deployment, transport: &Transport) {
    let mut volumes = vec![
        identity_volume(&transport.mode, crate::pki::ROUTER_IDENTITY),
        Volume {
            name: ADMIN_TOKEN_VOLUME.to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(MTLS_SECRET.to_string()),
                items: Some(vec![KeyToPath {
                    key: ADMIN_TOKEN_KEY.to_string(),
                    path: ADMIN_TOKEN_KEY.to_string(),
                    mode: None,
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let mut mounts = vec![
        read_only(TLS_VOLUME, TLS_DIR),
        read_only(ADMIN_TOKEN_VOLUME, ADMIN_TOKEN_DIR),
    ];
    let mut args = Vec::new();
    flag(&mut args, FLAG_GRPC_TLS_DIR, TLS_DIR);
    flag(
        &mut args,
        FLAG_ADMIN_TOKEN_FILE,
        format!("{ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}"),
    );
    if let Some(secret) = &transport.gateway_secret {
        volumes.push(Volume {
            name: GATEWAY_TLS_VOLUME.to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                items: Some(vec![
                    KeyToPath {
                        key: "tls.crt".into(),
                        path: "tls.crt".into(),
                        mode: None,
                    },
                    KeyToPath {
                        key: "tls.key".into(),
                        path: "tls.key".into(),
                        mode: None,
                    },
                ]),
                // One pool's missing Secret must not keep every router pod from starting:
                // the router waits for the files, and the pool's GatewayTLS condition says why.
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(read_only(GATEWAY_TLS_VOLUME, GATEWAY_TLS_DIR));
        flag(&mut args, FLAG_GATEWAY_TLS_DIR, GATEWAY_TLS_DIR);
    }
    patch_pod(d, "router", volumes, mounts, args);
}

/// The name sidecars check in the router's certificate: the ingest Service they dial.
pub fn router_server_name(cfg: &OperatorConfig) -> String {
    format!("{INGEST_SERVICE}.{}.svc", cfg.router_namespace)
}

/// Worker pods: the sidecar gets its WorkerSet's pair (`--router-tls-dir`) and the router's
/// name (`--router-tls-server-name`, unless the WorkerSet names its own router address); the
/// engine container sees neither.
pub fn secure_workerset(
    d: &mut Deployment,
    ws: &InferenceWorkerSet,
    cfg: &OperatorConfig,
    mode: &TlsMode,
) {
    let name = ws.metadata.name.clone().unwrap_or_default();
    let mut args = Vec::new();
    flag(&mut args, FLAG_ROUTER_TLS_DIR, TLS_DIR);
    // A WorkerSet that names its own router address verifies that address's host name.
    if ws.spec.sidecar.router_address.is_none() {
        flag(
            &mut args,
            FLAG_ROUTER_TLS_SERVER_NAME,
            router_server_name(cfg),
        );
    }
    patch_pod(
        d,
        SIDECAR_CONTAINER,
        vec![identity_volume(mode, &sidecar_identity(&name))],
        vec![read_only(TLS_VOLUME, TLS_DIR)],
        args,
    );
}

/// What the Pool conditions read, fetched by the controller only with `--mtls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportFacts {
    /// The installation's mode and gateway Secret ([`transport`] over every pool in scope).
    pub transport: Transport,
    /// Key stems of the pool's own identities ([`pool_stems`]).
    pub stems: Vec<String>,
    /// The router's namespace (where the gateway Secret must be).
    pub router_namespace: String,
    /// Key names of the pool namespace's `kvroute-mtls` (`None`: no such Secret).
    pub mtls_keys: Option<BTreeSet<String>>,
    /// cert-manager Certificates of the pool's identities: name -> Ready (absent: not found).
    pub certificates: BTreeMap<String, bool>,
    /// Key names of the gateway Secret the pool names, in the router's namespace (`None`:
    /// not found, or the pool names none).
    pub gateway_keys: Option<BTreeSet<String>>,
}

/// The key stems of a pool's own identities: its picker and the sidecars of its WorkerSet
/// targets that exist.
pub fn pool_stems(
    name: &str,
    spec: &InferencePoolSpec,
    sets: &[InferenceWorkerSet],
) -> Vec<String> {
    let mut stems = BTreeSet::from([picker_identity(name)]);
    for t in &spec.targets {
        for s in sets {
            let sname = s.metadata.name.as_deref().unwrap_or_default();
            let by_name = t.worker_set.as_deref() == Some(sname);
            let by_selector = t.worker_set_selector.as_ref().is_some_and(|sel| {
                selector_matches(sel, s.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
            });
            if by_name || by_selector {
                stems.insert(sidecar_identity(sname));
            }
        }
    }
    stems.into_iter().collect()
}

/// The pool's [`TRANSPORT_SECURITY`] condition: True with reason `OperatorCA` or
/// `CertManager` when every pair of the pool's identities is in place.
pub fn transport_condition(
    spec: &InferencePoolSpec,
    facts: &TransportFacts,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let cond = |ok: bool, reason: Reason, msg: String| {
        condition::condition(
            TRANSPORT_SECURITY,
            ConditionStatus::from_bool(ok),
            reason,
            msg,
            generation,
            now,
        )
    };
    let stems = &facts.stems;
    let asked = spec.tls.as_ref().and_then(|t| t.issuer_ref.as_ref());
    match &facts.transport.mode {
        TlsMode::Conflict(issuers) if asked.is_some() => cond(
            false,
            Reason::IssuerConflict,
            format!(
                "pools name {} different cert-manager issuers; the router is shared, so the operator issues from its own CA until they agree",
                issuers.len()
            ),
        ),
        TlsMode::OperatorCa | TlsMode::Conflict(_) => {
            let keys = facts.mtls_keys.clone().unwrap_or_default();
            let mut missing: Vec<String> = stems
                .iter()
                .flat_map(|s| [cert_key(s), private_key_key(s)])
                .chain([CA_BUNDLE_KEY.to_string()])
                .filter(|k| !keys.contains(k))
                .collect();
            missing.sort();
            if missing.is_empty() {
                cond(
                    true,
                    Reason::OperatorCA,
                    format!(
                        "{} key pairs issued by the operator's CA in Secret {MTLS_SECRET}",
                        stems.len()
                    ),
                )
            } else {
                cond(
                    false,
                    Reason::CertificatesPending,
                    format!("Secret {MTLS_SECRET} lacks {}", missing.join(", ")),
                )
            }
        }
        TlsMode::CertManager(issuer) => {
            let not_ready: Vec<String> = stems
                .iter()
                .map(|s| certificate_name(s))
                .filter_map(|n| match facts.certificates.get(&n) {
                    Some(true) => None,
                    Some(false) => Some(format!("{n} (not Ready)")),
                    None => Some(format!("{n} (not found)")),
                })
                .collect();
            if not_ready.is_empty() {
                cond(
                    true,
                    Reason::CertManager,
                    format!(
                        "{} Certificates issued by {:?} {}",
                        stems.len(),
                        issuer.kind,
                        issuer.name
                    ),
                )
            } else {
                cond(
                    false,
                    Reason::CertificatesNotReady,
                    format!("cert-manager Certificates: {}", not_ready.join(", ")),
                )
            }
        }
    }
}

/// The pool's [`GATEWAY_TLS`] condition, only when it names a gateway Secret.
pub fn gateway_condition(
    spec: &InferencePoolSpec,
    facts: Option<&TransportFacts>,
    generation: Option<i64>,
    now: &Time,
) -> Option<Condition> {
    let secret = &spec.gateway.as_ref()?.tls.as_ref()?.secret_name;
    let cond = |ok: bool, reason: Reason, msg: String| {
        condition::condition(
            GATEWAY_TLS,
            ConditionStatus::from_bool(ok),
            reason,
            msg,
            generation,
            now,
        )
    };
    let Some(facts) = facts else {
        return Some(cond(
            false,
            Reason::NotEnabled,
            "the operator runs without --mtls, so the router terminates no TLS".to_string(),
        ));
    };
    let ns = &facts.router_namespace;
    Some(
        match (&facts.gateway_keys, &facts.transport.gateway_secret) {
            (None, _) => cond(
                false,
                Reason::SecretNotFound,
                format!("Secret {secret:?} not found in namespace {ns}"),
            ),
            (Some(keys), _) if !(keys.contains("tls.crt") && keys.contains("tls.key")) => cond(
                false,
                Reason::SecretKeysMissing,
                format!("Secret {secret:?} in {ns} needs tls.crt and tls.key"),
            ),
            (Some(_), Some(used)) if used != secret => cond(
                false,
                Reason::ConflictingSecret,
                format!(
                    "the router terminates TLS with Secret {used:?}, named by another pool first"
                ),
            ),
            _ => cond(
                true,
                Reason::Mounted,
                format!("the router terminates TLS with Secret {secret:?} from {ns}"),
            ),
        },
    )
}

/// Ready state of a cert-manager Certificate object.
pub fn certificate_ready(obj: &DynamicObject) -> bool {
    obj.data
        .get("status")
        .and_then(|s| s.get("conditions"))
        .and_then(|c| c.as_array())
        .is_some_and(|conds| {
            conds.iter().any(|c| {
                c.get("type").and_then(|t| t.as_str()) == Some("Ready")
                    && c.get("status").and_then(|s| s.as_str()) == Some("True")
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::router::{TokenizerMounts, desired_router};
    use crate::desired::workerset::deployment::desired_deployment;
    use crate::desired::workerset::fixtures;

    fn pool(ns: &str, name: &str, extra: &str) -> InferencePool {
        let spec: InferencePoolSpec =
            serde_saphyr::from_str(&format!("targets: [{{workerSet: qwen}}]\n{extra}"))
                .expect("spec");
        let mut p = InferencePool::new(name, spec);
        p.metadata.namespace = Some(ns.into());
        p
    }

    fn args_of(d: &Deployment, container: &str) -> Vec<String> {
        let pod = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod");
        pod.containers
            .iter()
            .find(|c| c.name == container)
            .and_then(|c| c.args.clone())
            .unwrap_or_default()
    }

    fn flag_value(args: &[String], name: &str) -> Option<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    }

    #[test]
    fn one_issuer_means_cert_manager_two_mean_conflict_and_none_the_operator_ca() {
        let a = pool("team-a", "chat", "");
        let b = pool(
            "team-b",
            "code",
            "tls: {issuerRef: {name: ca, kind: ClusterIssuer}}\ngateway: {tls: {secretName: gw-b}}\n",
        );
        let c = pool("team-c", "docs", "tls: {issuerRef: {name: other}}\n");
        assert_eq!(
            transport(std::slice::from_ref(&a)).mode,
            TlsMode::OperatorCa
        );
        let t = transport(&[b.clone(), a.clone()]);
        assert!(matches!(&t.mode, TlsMode::CertManager(i) if i.name == "ca"));
        assert_eq!(t.gateway_secret.as_deref(), Some("gw-b"));
        assert_eq!(t.pools[0], ("team-a".to_string(), "chat".to_string()));
        let t = transport(&[a, b, c]);
        assert!(matches!(&t.mode, TlsMode::Conflict(v) if v.len() == 2));
        assert!(t.mode.operator_issues());
    }

    #[test]
    fn router_gets_its_pair_token_and_gateway_secret_with_the_flags() {
        let cfg = fixtures::cfg();
        let t = transport(&[pool("team-a", "chat", "gateway: {tls: {secretName: gw}}\n")]);
        let mut d = desired_router(&cfg, &TokenizerMounts::default()).deployment;
        let before = d.clone();
        secure_router(&mut d, &t);
        let args = args_of(&d, "router");
        assert_eq!(
            flag_value(&args, "--grpc-tls-dir").as_deref(),
            Some(TLS_DIR)
        );
        assert_eq!(
            flag_value(&args, "--admin-token-file").as_deref(),
            Some("/var/run/kvroute/admin/admin-token")
        );
        assert_eq!(
            flag_value(&args, "--gateway-tls-dir").as_deref(),
            Some(GATEWAY_TLS_DIR)
        );
        let pod = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.clone())
            .expect("pod");
        let tls = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == TLS_VOLUME)
            .and_then(|v| v.secret.clone())
            .expect("tls volume");
        assert_eq!(tls.secret_name.as_deref(), Some("kvroute-mtls"));
        let items: Vec<(String, String)> = tls
            .items
            .into_iter()
            .flatten()
            .map(|i| (i.key, i.path))
            .collect();
        assert_eq!(
            items,
            [
                ("router.crt".to_string(), "tls.crt".to_string()),
                ("router.key".into(), "tls.key".into()),
                ("ca.crt".into(), "ca.crt".into()),
            ]
        );
        // The template changed, so the hash did.
        let hash = |d: &Deployment| {
            d.spec
                .as_ref()
                .and_then(|s| s.template.metadata.as_ref())
                .and_then(|m| {
                    m.annotations
                        .as_ref()?
                        .get(TEMPLATE_HASH_ANNOTATION)
                        .cloned()
                })
        };
        assert!(hash(&d).is_some());
        assert_ne!(hash(&d), hash(&before));
    }

    #[test]
    fn only_the_sidecar_gets_its_workersets_pair_and_the_router_name() {
        let cfg = fixtures::cfg();
        let ws = fixtures::ws("model: {name: m}\nengine: {mode: mock}\n");
        let mut d = desired_deployment(&ws, &cfg).expect("deployment");
        secure_workerset(&mut d, &ws, &cfg, &TlsMode::OperatorCa);
        let args = args_of(&d, SIDECAR_CONTAINER);
        assert_eq!(
            flag_value(&args, "--router-tls-dir").as_deref(),
            Some(TLS_DIR)
        );
        assert_eq!(
            flag_value(&args, "--router-tls-server-name").as_deref(),
            Some("kvroute-router-ingest.kvroute-system.svc")
        );
        let pod = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.clone())
            .expect("pod");
        let engine = pod
            .containers
            .iter()
            .find(|c| c.name != SIDECAR_CONTAINER)
            .expect("engine");
        assert!(
            engine
                .volume_mounts
                .iter()
                .flatten()
                .all(|m| m.name != TLS_VOLUME)
        );
        let v = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == TLS_VOLUME)
            .expect("volume");
        let keys: Vec<String> = v
            .secret
            .iter()
            .flat_map(|s| s.items.iter().flatten())
            .map(|i| i.key.clone())
            .collect();
        assert_eq!(keys, ["workerset-qwen.crt", "workerset-qwen.key", "ca.crt"]);
        // A WorkerSet with its own router address: the sidecar checks that host instead.
        let own = fixtures::ws(
            "model: {name: m}\nengine: {mode: mock}\nsidecar: {routerAddress: 'r.example:9000'}\n",
        );
        let mut d = desired_deployment(&own, &cfg).expect("deployment");
        secure_workerset(&mut d, &own, &cfg, &TlsMode::OperatorCa);
        let args = args_of(&d, SIDECAR_CONTAINER);
        assert!(flag_value(&args, "--router-tls-server-name").is_none());
        assert!(flag_value(&args, "--router-tls-dir").is_some());
        // cert-manager: the identity's own Secret, same file names.
        let issuer = IssuerRef {
            name: "ca".into(),
            kind: Default::default(),
            group: "cert-manager.io".into(),
        };
        let v = identity_volume(&TlsMode::CertManager(issuer), "workerset-qwen");
        let s = v.secret.expect("secret");
        assert_eq!(
            s.secret_name.as_deref(),
            Some("kvroute-mtls-workerset-qwen")
        );
        let paths: Vec<String> = s.items.into_iter().flatten().map(|i| i.path).collect();
        assert_eq!(paths, ["tls.crt", "tls.key", "ca.crt"]);
    }

    #[test]
    fn certificates_carry_the_identity_the_issuer_and_a_renewal_window() {
        let issuer = IssuerRef {
            name: "ca".into(),
            kind: kvroute_crds::pool::IssuerKind::ClusterIssuer,
            group: "cert-manager.io".into(),
        };
        let id = Identity::router(
            "kvroute-system",
            &[("a".into(), "p".into())],
            &[ROUTER_NAME],
        );
        let c = desired_certificate(&id, &issuer, Duration::from_secs(60));
        assert_eq!(c.metadata.name.as_deref(), Some("kvroute-mtls-router"));
        assert_eq!(c.metadata.namespace.as_deref(), Some("kvroute-system"));
        let spec = &c.data["spec"];
        assert_eq!(spec["secretName"], "kvroute-mtls-router");
        assert_eq!(spec["issuerRef"]["kind"], "ClusterIssuer");
        assert_eq!(spec["uris"][0], "spiffe://kvroute.dev/ns/a/pool/p/router");
        assert_eq!(spec["dnsNames"].as_array().map(Vec::len), Some(4));
        assert_eq!(spec["duration"], "3600s");
        assert_eq!(spec["renewBefore"], "1200s");
        assert!(
            spec["usages"]
                .as_array()
                .expect("usages")
                .contains(&json!("server auth"))
        );
    }

    #[test]
    fn transport_condition_says_where_pairs_come_from_and_what_is_missing() {
        let now = fixtures::now();
        let p = pool("team-a", "chat", "");
        let mut facts = TransportFacts {
            transport: transport(std::slice::from_ref(&p)),
            stems: vec!["picker-chat".to_string(), "workerset-qwen".to_string()],
            router_namespace: "kvroute-system".into(),
            mtls_keys: Some(
                [
                    "ca.crt",
                    "picker-chat.crt",
                    "picker-chat.key",
                    "workerset-qwen.crt",
                ]
                .map(String::from)
                .into(),
            ),
            certificates: BTreeMap::new(),
            gateway_keys: None,
        };
        let c = transport_condition(&p.spec, &facts, None, &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "CertificatesPending")
        );
        assert!(c.message.contains("workerset-qwen.key"), "{}", c.message);
        facts
            .mtls_keys
            .as_mut()
            .expect("keys")
            .insert("workerset-qwen.key".into());
        let c = transport_condition(&p.spec, &facts, None, &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "OperatorCA")
        );

        let p = pool("team-a", "chat", "tls: {issuerRef: {name: ca}}\n");
        facts.transport = transport(std::slice::from_ref(&p));
        facts.certificates = BTreeMap::from([
            ("kvroute-mtls-picker-chat".to_string(), true),
            ("kvroute-mtls-workerset-qwen".to_string(), false),
        ]);
        let c = transport_condition(&p.spec, &facts, None, &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "CertificatesNotReady")
        );
        facts
            .certificates
            .insert("kvroute-mtls-workerset-qwen".into(), true);
        let c = transport_condition(&p.spec, &facts, None, &now);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "CertManager")
        );
    }

    #[test]
    fn gateway_condition_reports_missing_incomplete_conflicting_and_mounted() {
        let now = fixtures::now();
        let p = pool("team-a", "chat", "gateway: {tls: {secretName: gw}}\n");
        assert!(gateway_condition(&pool("a", "b", "").spec, None, None, &now).is_none());
        let off = gateway_condition(&p.spec, None, None, &now).expect("condition");
        assert_eq!(
            (off.status.as_str(), off.reason.as_str()),
            ("False", "NotEnabled")
        );
        let mut facts = TransportFacts {
            transport: transport(std::slice::from_ref(&p)),
            stems: Vec::new(),
            router_namespace: "kvroute-system".into(),
            mtls_keys: None,
            certificates: BTreeMap::new(),
            gateway_keys: None,
        };
        let reason = |f: &TransportFacts| {
            gateway_condition(&p.spec, Some(f), None, &now)
                .map(|c| (c.status, c.reason))
                .expect("condition")
        };
        assert_eq!(reason(&facts), ("False".into(), "SecretNotFound".into()));
        facts.gateway_keys = Some(BTreeSet::from(["tls.crt".to_string()]));
        assert_eq!(reason(&facts), ("False".into(), "SecretKeysMissing".into()));
        facts.gateway_keys = Some(["tls.crt", "tls.key"].map(String::from).into());
        assert_eq!(reason(&facts), ("True".into(), "Mounted".into()));
        facts.transport.gateway_secret = Some("other".into());
        assert_eq!(reason(&facts), ("False".into(), "ConflictingSecret".into()));
    }

    #[test]
    fn identities_cover_router_sidecars_and_pickers_by_namespace() {
        let cfg = fixtures::cfg();
        let ws = fixtures::ws("model: {name: m}\n");
        let t = transport(&[pool("team-a", "chat", "")]);
        let ids = identities(&cfg, &[ws], &t);
        let stems: BTreeMap<&str, Vec<&str>> = ids
            .iter()
            .map(|(ns, v)| (ns.as_str(), v.iter().map(|i| i.stem.as_str()).collect()))
            .collect();
        assert_eq!(
            stems,
            BTreeMap::from([
                ("kvroute-system", vec!["router"]),
                ("team-a", vec!["workerset-qwen", "picker-chat"]),
            ])
        );
        let router = &ids["kvroute-system"][0];
        assert!(
            router
                .dns
                .contains("kvroute-router-ingest.kvroute-system.svc")
        );
        assert!(
            router
                .uris
                .contains("spiffe://kvroute.dev/ns/team-a/pool/chat/router")
        );
    }

    #[test]
    fn gie_pools_get_picker_pairs_where_a_namespace_is_known() {
        let mut cfg = fixtures::cfg();
        // `chat` is also a kvroute Pool in team-a: one pair. `*` names no namespace.
        cfg.gie_inference_pool = "team-a/chat, ml/llama,*".into();
        let t = transport(&[pool("team-a", "chat", "")]);
        let pickers = |cfg: &OperatorConfig| -> BTreeMap<String, Vec<String>> {
            identities(cfg, &[], &t)
                .into_iter()
                .map(|(ns, v)| {
                    let uris = v
                        .iter()
                        .filter(|i| i.stem.starts_with("picker-"))
                        .flat_map(|i| i.uris.iter().cloned())
                        .collect();
                    (ns, uris)
                })
                .filter(|(_, v): &(String, Vec<String>)| !v.is_empty())
                .collect()
        };
        assert_eq!(
            pickers(&cfg),
            BTreeMap::from([
                (
                    "ml".to_string(),
                    vec!["spiffe://kvroute.dev/ns/ml/pool/llama/picker".to_string()]
                ),
                (
                    "team-a".to_string(),
                    vec!["spiffe://kvroute.dev/ns/team-a/pool/chat/picker".to_string()]
                ),
            ])
        );
        // A bare name: in the router's namespace, where the pool's picker Service is.
        cfg.gie_inference_pool = "llama".into();
        cfg.router_namespace = "ml".into();
        let ids = identities(&cfg, &[], &t);
        assert!(
            ids["ml"].iter().any(|i| i.stem == "picker-llama"),
            "{ids:?}"
        );
    }
}
