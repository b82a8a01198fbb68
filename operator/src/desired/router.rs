//! The router the operator runs: Deployment, client Service, headless ingest Service (sidecars
//! resolve it to stream to every replica), ServiceAccount, read-only RBAC and NetworkPolicy.
//!
//! Tokenizers: the router downloads each WorkerSet's tokenizer itself (`--tokenizer-fetch`).
//! Its pods get an `emptyDir` Hugging Face cache (`HF_HOME`), and every Secret or ConfigMap a
//! WorkerSet names as a tokenizer source (`spec.model.tokenizer`) is mounted read-only:
//! Secrets at `HUB_TOKEN_DIR/<name>/<key>`, ConfigMaps at `TOKENIZER_CONFIG_MAP_DIR/<name>/`.
//! Mounting (optional volumes, in the router's namespace) means the router needs no extra
//! Secret rights for tokens, and a missing Secret only delays that one model's tokenizer.
//!
//! Readiness: the Deployment's readiness probe is the router's `/readyz` on the admin port
//! (ready = discovery synced, tokenizers loaded or failed, a listed worker streaming to it;
//! see `kvroute_router::readiness`), so the client Service only sends to ready replicas. The
//! headless ingest Service publishes not-ready addresses: sidecars must reach a replica that
//! is not ready yet, since its readiness waits for their streams. Shutdown: a preStop
//! `httpGet /drain` (the distroless image has no `sleep`) makes the replica unready while it
//! keeps serving for [`DRAIN_DELAY_S`], so endpoints update before the listeners close; then
//! SIGTERM, and `--shutdown-grace-s` for in-flight requests, all within
//! [`TERMINATION_GRACE_S`].
//!
//! RBAC scope follows the watch scope: with `--namespace` set the router gets a Role and
//! RoleBinding in that namespace; watching all namespaces it needs the same read rules
//! cluster-wide, so it gets a ClusterRole and ClusterRoleBinding. The rules come from
//! [`crate::permissions::ROUTER_RULES`] either way, and every object is named
//! [`ROUTER_NAME`], the one name the operator's own RBAC lets it write.
//!
//! Hardening ([`super::hardening`]): non-root, read-only root filesystem (the tokenizer cache
//! and `/tmp` are emptyDirs), no capabilities, RuntimeDefault seccomp, requests and limits
//! ([`ROUTER_CPU`], [`ROUTER_MEMORY`], [`ROUTER_MEMORY_LIMIT`]); a NetworkPolicy admits only
//! the router's own ports.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, Lifecycle, LifecycleHandler, ObjectFieldSelector, PodSpec, PodTemplateSpec,
    Probe, SecretVolumeSource, Service, ServiceAccount, ServicePort, ServiceSpec, Volume,
    VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvroute_crds::InferenceWorkerSet;
use kvroute_crds::workerset::ResolvedTokenizer;

use k8s_openapi::api::networking::v1::NetworkPolicy;

use super::hardening::{pod_security, resources, restricted, tmp_volume};
use super::network_policy::{allow, ingress_policy, tcp};
use super::{OperatorConfig, TokenizerFetch, common_labels};
pub use crate::permissions::ROUTER_NAME;
use crate::permissions::{ROUTER_RULES, policy_rules};

/// CPU request of a router container (tokenization and the HTTP gateway).
pub const ROUTER_CPU: &str = "500m";
/// Memory request of a router container.
pub const ROUTER_MEMORY: &str = "512Mi";
/// Memory limit of a router container (the KV index is bounded per worker and per model).
pub const ROUTER_MEMORY_LIMIT: &str = "2Gi";
/// CPU limit of a router container.
pub const ROUTER_CPU_LIMIT: &str = "4";
/// Headless Service of the router's ingest port.
pub const INGEST_SERVICE: &str = "kvroute-router-ingest";
/// OpenAI/Anthropic HTTP gateway port.
pub const HTTP_PORT: i32 = 8080;
/// The router's one gRPC server: the Ingest service the sidecars stream to, the Pick API
/// for external gateways and grpc.health.v1 (`kvroute-router --grpc-addr`).
pub const INGEST_PORT: i32 = 9000;
/// The Pick API is served by the same gRPC server as ingest.
pub const PICK_PORT: i32 = INGEST_PORT;
/// Admin port (`/metrics`, `/healthz`, `/readyz`, `/drain`).
pub const ADMIN_PORT: i32 = 9091;
/// The endpoint picker's gRPC port (Envoy ext_proc, `kvroute-router --epp-listen`), named
/// `epp` on the container and the Service; only with
/// [`OperatorConfig::gie_inference_pool`]. 9002 is the port GIE's InferencePool
/// `endpointPickerRef` defaults to.
pub const EPP_PORT: i32 = 9002;
/// Name of the endpoint picker's port on the router's container and Service.
pub const EPP_PORT_NAME: &str = "epp";
/// Seconds a terminating router stays unready but serving before its listeners close
/// (`kvroute-router --drain-delay-s`, run by the preStop hook): time for the endpoint
/// removal to reach kube-proxy and other load balancers.
pub const DRAIN_DELAY_S: i64 = 5;
/// Seconds in-flight requests get once the listeners closed (`--shutdown-grace-s`).
pub const SHUTDOWN_GRACE_S: i64 = 15;
/// The pod's termination grace: the drain, the shutdown grace and a margin before SIGKILL.
pub const TERMINATION_GRACE_S: i64 = DRAIN_DELAY_S + SHUTDOWN_GRACE_S + 10;
/// `HF_HOME` of the router pods: an `emptyDir` that caches downloaded tokenizer files.
pub const HF_HOME: &str = "/var/cache/kvroute/huggingface";
/// Size limit of the tokenizer cache volume (tokenizer files are megabytes per model).
pub const HF_CACHE_SIZE: &str = "2Gi";
/// Where tokenizer token Secrets are mounted (`kvroute-router --hub-token-dir`).
pub const HUB_TOKEN_DIR: &str = "/var/run/kvroute/hub-tokens";
/// Where tokenizer ConfigMaps are mounted (`kvroute-router --tokenizer-config-map-dir`).
pub const TOKENIZER_CONFIG_MAP_DIR: &str = "/var/run/kvroute/tokenizer-configmaps";

/// The Secrets and ConfigMaps the WorkerSets name as tokenizer sources, to mount into the
/// router pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerMounts {
    /// Token Secrets (router namespace).
    pub secrets: BTreeSet<String>,
    /// Tokenizer ConfigMaps (router namespace).
    pub config_maps: BTreeSet<String>,
}

/// Collects the Secrets and ConfigMaps named by `sets`' tokenizer sources.
pub fn tokenizer_mounts(sets: &[InferenceWorkerSet]) -> TokenizerMounts {
    let mut m = TokenizerMounts::default();
    for set in sets {
        match set.spec.model.tokenizer_source() {
            ResolvedTokenizer::Hub {
                token: Some((secret, _)),
                ..
            } => {
                m.secrets.insert(secret);
            }
            ResolvedTokenizer::ConfigMap(name) => {
                m.config_maps.insert(name);
            }
            _ => {}
        }
    }
    m
}

/// All router objects.
#[derive(Debug, Clone)]
pub struct RouterObjects {
    /// Its identity.
    pub service_account: ServiceAccount,
    /// Read rules, namespaced (when watching one namespace).
    pub role: Option<(Role, RoleBinding)>,
    /// Read rules, cluster-wide (when watching all namespaces).
    pub cluster_role: Option<(ClusterRole, ClusterRoleBinding)>,
    /// The router pods.
    pub deployment: Deployment,
    /// Clients' entry point: HTTP gateway and Pick API.
    pub service: Service,
    /// Headless: one address per router replica for the sidecars.
    pub ingest_service: Service,
    /// Who may connect to the router pods.
    pub network_policy: NetworkPolicy,
}

/// Labels selecting the router pods (also the workers' NetworkPolicy peer).
pub fn selector() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "app.kubernetes.io/name".to_string(),
        ROUTER_NAME.to_string(),
    )])
}

fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: ns.map(str::to_string),
        labels: Some(common_labels("router", ROUTER_NAME)),
        ..Default::default()
    }
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn admin_get(path: &str) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.to_string()),
        port: IntOrString::String("admin".into()),
        ..Default::default()
    }
}

fn svc_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_string()),
        port,
        target_port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".to_string()),
        ..Default::default()
    }
}

/// Volumes and mounts of the router container: the tokenizer cache and every tokenizer
/// Secret and ConfigMap (optional, read-only).
fn tokenizer_volumes(mounts: &TokenizerMounts) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = vec![Volume {
        name: "hf-cache".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(HF_CACHE_SIZE.into())),
            ..Default::default()
        }),
        ..Default::default()
    }];
    let mut vmounts = vec![VolumeMount {
        name: "hf-cache".into(),
        mount_path: HF_HOME.into(),
        ..Default::default()
    }];
    let mount = |name: String, path: String| VolumeMount {
        name,
        mount_path: path,
        read_only: Some(true),
        ..Default::default()
    };
    for (i, secret) in mounts.secrets.iter().enumerate() {
        let name = format!("hub-token-{i}");
        volumes.push(Volume {
            name: name.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
        vmounts.push(mount(name, format!("{HUB_TOKEN_DIR}/{secret}")));
    }
    for (i, cm) in mounts.config_maps.iter().enumerate() {
        let name = format!("tokenizer-cm-{i}");
        volumes.push(Volume {
            name: name.clone(),
            config_map: Some(ConfigMapVolumeSource {
                name: cm.clone(),
                optional: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
        vmounts.push(mount(name, format!("{TOKENIZER_CONFIG_MAP_DIR}/{cm}")));
    }
    (volumes, vmounts)
}

/// Builds every router object; `mounts` are the tokenizer Secrets and ConfigMaps of the
/// WorkerSets ([`tokenizer_mounts`]).
pub fn desired_router(cfg: &OperatorConfig, mounts: &TokenizerMounts) -> RouterObjects {
    let ns = cfg.router_namespace.as_str();
    let subject = Subject {
        kind: "ServiceAccount".to_string(),
        name: ROUTER_NAME.to_string(),
        namespace: Some(ns.to_string()),
        ..Default::default()
    };
    let (role, cluster_role) = if cfg.watch_namespace.is_empty() {
        let name = ROUTER_NAME.to_string();
        let cr = ClusterRole {
            metadata: meta(&name, None),
            rules: Some(policy_rules(ROUTER_RULES)),
            ..Default::default()
        };
        let crb = ClusterRoleBinding {
            metadata: meta(&name, None),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name,
            },
            subjects: Some(vec![subject]),
        };
        (None, Some((cr, crb)))
    } else {
        let wns = Some(cfg.watch_namespace.as_str());
        let r = Role {
            metadata: meta(ROUTER_NAME, wns),
            rules: Some(policy_rules(ROUTER_RULES)),
        };
        let rb = RoleBinding {
            metadata: meta(ROUTER_NAME, wns),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: ROUTER_NAME.into(),
            },
            subjects: Some(vec![subject]),
        };
        (Some((r, rb)), None)
    };
    let mut pod_labels = common_labels("router", ROUTER_NAME);
    pod_labels.extend(selector());
    let port = |name: &str, p: i32| ContainerPort {
        name: Some(name.to_string()),
        container_port: p,
        protocol: Some("TCP".to_string()),
        ..Default::default()
    };
    let gie = !cfg.gie_inference_pool.is_empty();
    let (mut volumes, mut volume_mounts) = tokenizer_volumes(mounts);
    let (tmp, tmp_mount) = tmp_volume();
    volumes.push(tmp);
    volume_mounts.push(tmp_mount);
    let container = Container {
        name: "router".to_string(),
        volume_mounts: Some(volume_mounts),
        security_context: Some(restricted()),
        resources: Some(resources(
            ROUTER_CPU,
            ROUTER_MEMORY,
            Some(ROUTER_CPU_LIMIT),
            ROUTER_MEMORY_LIMIT,
        )),
        image: Some(cfg.router_image.clone()),
        command: Some(vec!["kvroute-router".to_string()]),
        // Flags of `kvroute-router` (router/src/lib.rs), by their env names.
        env: Some(router_env(cfg)),
        ports: Some({
            let mut ports = vec![
                port("http", HTTP_PORT),
                port("grpc", INGEST_PORT),
                port("admin", ADMIN_PORT),
            ];
            if gie {
                ports.push(port(EPP_PORT_NAME, EPP_PORT));
            }
            ports
        }),
        readiness_probe: Some(Probe {
            http_get: Some(admin_get("/readyz")),
            period_seconds: Some(2),
            failure_threshold: Some(1),
            ..Default::default()
        }),
        liveness_probe: Some(Probe {
            http_get: Some(admin_get("/healthz")),
            period_seconds: Some(10),
            failure_threshold: Some(6),
            ..Default::default()
        }),
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                http_get: Some(admin_get("/drain")),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let deployment = Deployment {
        metadata: meta(ROUTER_NAME, Some(ns)),
        spec: Some(DeploymentSpec {
            replicas: Some(cfg.router_replicas),
            selector: LabelSelector {
                match_labels: Some(selector()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(ROUTER_NAME.to_string()),
                    security_context: Some(pod_security(true)),
                    termination_grace_period_seconds: Some(TERMINATION_GRACE_S),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    };
    let service = Service {
        metadata: meta(ROUTER_NAME, Some(ns)),
        spec: Some(ServiceSpec {
            selector: Some(selector()),
            ports: Some({
                let mut ports = vec![svc_port("http", HTTP_PORT), svc_port("grpc", PICK_PORT)];
                if gie {
                    // What a GIE InferencePool's `endpointPickerRef.port.number` names.
                    ports.push(svc_port(EPP_PORT_NAME, EPP_PORT));
                }
                ports
            }),
            ..Default::default()
        }),
        status: None,
    };
    let ingest_service = Service {
        metadata: meta(INGEST_SERVICE, Some(ns)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            // A starting replica is not ready until sidecars stream to it.
            publish_not_ready_addresses: Some(true),
            selector: Some(selector()),
            ports: Some(vec![svc_port("grpc", INGEST_PORT)]),
            ..Default::default()
        }),
        status: None,
    };
    // All ports serve callers the operator cannot name (clients, external gateways and
    // their endpoint-picker calls, sidecars in any namespace, Prometheus); mTLS and the
    // admin token authenticate them.
    let mut open_ports = vec![tcp(HTTP_PORT), tcp(INGEST_PORT), tcp(ADMIN_PORT)];
    if gie {
        open_ports.push(tcp(EPP_PORT));
    }
    let network_policy = ingress_policy(
        meta(ROUTER_NAME, Some(ns)),
        selector(),
        vec![allow(open_ports, Vec::new())],
    );
    RouterObjects {
        network_policy,
        service_account: ServiceAccount {
            metadata: meta(ROUTER_NAME, Some(ns)),
            ..Default::default()
        },
        role,
        cluster_role,
        deployment,
        service,
        ingest_service,
    }
}

/// The router's settings: discover workers from Kubernetes (in the watched namespace, all
/// when empty), the ports the Services point at, and where tokenizers come from and are
/// cached.
fn router_env(cfg: &OperatorConfig) -> Vec<EnvVar> {
    let mut vars = vec![
        env("KVROUTE_ROUTER_KUBERNETES", "true".to_string()),
        env("KVROUTE_ROUTER_TOKENIZER_FETCH", "true"),
        env("KVROUTE_ROUTER_HUB_TOKEN_DIR", HUB_TOKEN_DIR),
        env(
            "KVROUTE_ROUTER_TOKENIZER_CONFIG_MAP_DIR",
            TOKENIZER_CONFIG_MAP_DIR,
        ),
        env("HF_HOME", HF_HOME),
        env("KVROUTE_ROUTER_HTTP_ADDR", format!("0.0.0.0:{HTTP_PORT}")),
        env("KVROUTE_ROUTER_GRPC_ADDR", format!("0.0.0.0:{INGEST_PORT}")),
        env("KVROUTE_ROUTER_ADMIN_ADDR", format!("0.0.0.0:{ADMIN_PORT}")),
        env("KVROUTE_ROUTER_DRAIN_DELAY_S", DRAIN_DELAY_S.to_string()),
        // The kubelet runs the preStop `httpGet /drain` from the node's address; only it
        // (and loopback, and the admin token) may drain the replica.
        EnvVar {
            name: "KVROUTE_ROUTER_DRAIN_FROM_IP".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.hostIP".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        env(
            "KVROUTE_ROUTER_SHUTDOWN_GRACE_S",
            SHUTDOWN_GRACE_S.to_string(),
        ),
        // Each replica enforces 1/N of a tenant's limits (docs/control-plane.md, "Limits").
        env("KVROUTE_ROUTER_REPLICAS", cfg.router_replicas.to_string()),
    ];
    if cfg.router_replicas > 1 {
        // Active-active replicas find each other through the headless ingest Service (every
        // replica's address, ready or not) and share placements on the gRPC port; under mTLS
        // they verify each other as the name sidecars verify (docs/replicas.md).
        vars.push(env(
            "KVROUTE_ROUTER_PEER_SERVICE",
            format!(
                "{INGEST_SERVICE}.{}.svc:{INGEST_PORT}",
                cfg.router_namespace
            ),
        ));
        vars.push(env(
            "KVROUTE_ROUTER_PEER_TLS_SERVER_NAME",
            super::tls::router_server_name(cfg),
        ));
    }
    if !cfg.watch_namespace.is_empty() {
        vars.push(env("KVROUTE_ROUTER_NAMESPACE", cfg.watch_namespace.clone()));
    }
    if !cfg.otlp_endpoint.is_empty() {
        vars.push(env(
            "KVROUTE_ROUTER_OTLP_ENDPOINT",
            cfg.otlp_endpoint.clone(),
        ));
    }
    let fetch = cfg.tokenizer_fetch;
    for (name, secs) in [
        ("KVROUTE_ROUTER_TOKENIZER_FETCH_TIMEOUT_S", fetch.timeout_s),
        ("KVROUTE_ROUTER_TOKENIZER_RETRY_MAX_S", fetch.retry_max_s),
    ] {
        if secs != TokenizerFetch::DEFAULT_S {
            vars.push(env(name, secs.to_string()));
        }
    }
    if !cfg.gie_inference_pool.is_empty() {
        // Workers from GIE InferencePools, and the endpoint picker their gateway calls.
        vars.push(env(
            "KVROUTE_ROUTER_GIE_INFERENCE_POOL",
            cfg.gie_inference_pool.clone(),
        ));
        vars.push(env(
            "KVROUTE_ROUTER_EPP_LISTEN",
            format!("0.0.0.0:{EPP_PORT}"),
        ));
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(watch: &str) -> OperatorConfig {
        OperatorConfig {
            sidecar_image: "s".into(),
            mock_image: "m".into(),
            router_image: "r:1".into(),
            router_replicas: 3,
            router_namespace: "kvroute-system".into(),
            watch_namespace: watch.into(),
            mtls: false,
            gie_inference_pool: String::new(),
            otlp_endpoint: String::new(),
            tokenizer_fetch: Default::default(),
        }
    }

    #[test]
    fn gie_mode_adds_the_epp_port_and_the_router_flags() {
        let off = desired_router(&cfg(""), &TokenizerMounts::default());
        let mut on_cfg = cfg("");
        on_cfg.gie_inference_pool = "ml/llama".into();
        let on = desired_router(&on_cfg, &TokenizerMounts::default());
        let svc_ports = |o: &RouterObjects| -> Vec<(String, i32)> {
            o.service
                .spec
                .clone()
                .and_then(|s| s.ports)
                .unwrap_or_default()
                .into_iter()
                .map(|p| (p.name.unwrap_or_default(), p.port))
                .collect()
        };
        assert!(!svc_ports(&off).iter().any(|(n, _)| n == EPP_PORT_NAME));
        assert!(svc_ports(&on).contains(&("epp".to_string(), 9002)));
        let container = |o: &RouterObjects| {
            o.deployment
                .spec
                .clone()
                .and_then(|s| s.template.spec)
                .map(|p| p.containers[0].clone())
                .expect("container")
        };
        let env_of = |o: &RouterObjects, name: &str| {
            container(o)
                .env
                .unwrap_or_default()
                .into_iter()
                .find(|e| e.name == name)
                .and_then(|e| e.value)
        };
        assert_eq!(env_of(&off, "KVROUTE_ROUTER_GIE_INFERENCE_POOL"), None);
        assert_eq!(env_of(&off, "KVROUTE_ROUTER_EPP_LISTEN"), None);
        assert_eq!(
            env_of(&on, "KVROUTE_ROUTER_GIE_INFERENCE_POOL").as_deref(),
            Some("ml/llama")
        );
        assert_eq!(
            env_of(&on, "KVROUTE_ROUTER_EPP_LISTEN").as_deref(),
            Some("0.0.0.0:9002")
        );
        let named = container(&on)
            .ports
            .unwrap_or_default()
            .into_iter()
            .any(|p| p.name.as_deref() == Some("epp") && p.container_port == EPP_PORT);
        assert!(named, "the container names the epp port");
        let policy = serde_json::to_string(&on.network_policy).expect("json");
        assert!(policy.contains("9002"), "{policy}");
        let policy = serde_json::to_string(&off.network_policy).expect("json");
        assert!(!policy.contains("9002"), "{policy}");
    }

    /// The literal value of the router container's env var `name`, if it is set.
    fn router_var(cfg: &OperatorConfig, name: &str) -> Option<String> {
        desired_router(cfg, &TokenizerMounts::default())
            .deployment
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|p| p.containers[0].env.clone())
            .unwrap_or_default()
            .into_iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value)
    }

    #[test]
    fn an_otlp_endpoint_reaches_the_router_only_when_set() {
        let otlp = |cfg: &OperatorConfig| router_var(cfg, "KVROUTE_ROUTER_OTLP_ENDPOINT");
        let mut c = cfg("");
        assert_eq!(otlp(&c), None);
        c.otlp_endpoint = "http://collector.obs:4317".into();
        assert_eq!(otlp(&c).as_deref(), Some("http://collector.obs:4317"));
    }

    #[test]
    fn tokenizer_fetch_settings_reach_the_router_only_when_not_its_defaults() {
        const TIMEOUT: &str = "KVROUTE_ROUTER_TOKENIZER_FETCH_TIMEOUT_S";
        const RETRY: &str = "KVROUTE_ROUTER_TOKENIZER_RETRY_MAX_S";
        let mut c = cfg("");
        assert_eq!(
            (router_var(&c, TIMEOUT), router_var(&c, RETRY)),
            (None, None)
        );
        c.tokenizer_fetch.timeout_s = 900;
        assert_eq!(
            (router_var(&c, TIMEOUT), router_var(&c, RETRY)),
            (Some("900".into()), None)
        );
        c.tokenizer_fetch = TokenizerFetch {
            timeout_s: TokenizerFetch::DEFAULT_S,
            retry_max_s: 60,
        };
        assert_eq!(
            (router_var(&c, TIMEOUT), router_var(&c, RETRY)),
            (None, Some("60".into()))
        );
    }

    #[test]
    fn namespaced_watch_gets_a_role_and_cluster_watch_a_cluster_role() {
        let o = desired_router(&cfg("team-a"), &TokenizerMounts::default());
        let (role, binding) = o.role.expect("role");
        assert!(o.cluster_role.is_none());
        assert_eq!(role.metadata.namespace.as_deref(), Some("team-a"));
        let subject = &binding.subjects.expect("subjects")[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            (ROUTER_NAME, Some("kvroute-system"))
        );
        let verbs: Vec<String> = role
            .rules
            .expect("rules")
            .into_iter()
            .flat_map(|r| r.verbs)
            .collect();
        assert!(
            verbs
                .iter()
                .all(|v| ["get", "list", "watch"].contains(&v.as_str())),
            "{verbs:?}"
        );

        let o = desired_router(&cfg(""), &TokenizerMounts::default());
        assert!(o.role.is_none());
        let (cr, crb) = o.cluster_role.expect("cluster role");
        // One fixed name: the operator's RBAC may write only that one.
        assert_eq!(cr.metadata.name.as_deref(), Some(ROUTER_NAME));
        assert_eq!(crb.role_ref.name, ROUTER_NAME);
    }

    #[test]
    fn tokenizer_sources_become_a_cache_env_and_read_only_mounts() {
        let set =
            |yaml: &str| -> InferenceWorkerSet { serde_saphyr::from_str(yaml).expect("workerset") };
        let head = "apiVersion: kvroute.dev/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {name: a}\nspec:\n";
        let sets = vec![
            set(&format!("{head}  model: {{name: Qwen/Qwen3-0.6B}}\n")),
            set(&format!(
                "{head}  model: {{name: m, tokenizer: {{hub: {{tokenSecretRef: {{name: hf, key: token}}}}}}}}\n"
            )),
            set(&format!(
                "{head}  model: {{name: n, tokenizer: {{hub: {{tokenSecretRef: {{name: hf, key: other}}}}}}}}\n"
            )),
            set(&format!(
                "{head}  model: {{name: c, tokenizer: {{configMap: {{name: tok}}}}}}\n"
            )),
        ];
        let mounts = tokenizer_mounts(&sets);
        assert_eq!(mounts.secrets, BTreeSet::from(["hf".to_string()]));
        assert_eq!(mounts.config_maps, BTreeSet::from(["tok".to_string()]));

        let o = desired_router(&cfg(""), &mounts);
        let pod = o.deployment.spec.expect("spec").template.spec.expect("pod");
        let volumes = pod.volumes.expect("volumes");
        let secret = volumes
            .iter()
            .find_map(|v| v.secret.as_ref())
            .expect("secret volume");
        assert_eq!(secret.secret_name.as_deref(), Some("hf"));
        assert_eq!(secret.optional, Some(true));
        assert!(volumes.iter().any(|v| v.empty_dir.is_some()));
        assert!(
            volumes
                .iter()
                .any(|v| v.config_map.as_ref().is_some_and(|c| c.name == "tok"))
        );
        let c = &pod.containers[0];
        let mounts: Vec<(&str, Option<bool>)> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.mount_path.as_str(), m.read_only))
            .collect();
        assert_eq!(
            mounts,
            vec![
                (HF_HOME, None),
                ("/var/run/kvroute/hub-tokens/hf", Some(true)),
                ("/var/run/kvroute/tokenizer-configmaps/tok", Some(true)),
                ("/tmp", None),
            ]
        );
        let env: BTreeMap<&str, &str> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()))
            .collect();
        assert_eq!(env.get("HF_HOME"), Some(&HF_HOME));
        assert_eq!(env.get("KVROUTE_ROUTER_TOKENIZER_FETCH"), Some(&"true"));
        // The token is mounted, never put in the environment.
        assert!(!env.contains_key("HF_TOKEN"));
    }

    #[test]
    fn clients_reach_ready_routers_and_sidecars_reach_every_router() {
        let o = desired_router(&cfg(""), &TokenizerMounts::default());
        let pod = o.deployment.spec.expect("spec").template.spec.expect("pod");
        let c = &pod.containers[0];
        let get = |h: Option<&HTTPGetAction>| {
            let h = h.expect("httpGet");
            (h.path.clone().unwrap_or_default(), h.port.clone())
        };
        let admin = IntOrString::String("admin".into());
        let readiness = c.readiness_probe.as_ref().expect("readiness");
        assert_eq!(
            get(readiness.http_get.as_ref()),
            ("/readyz".into(), admin.clone())
        );
        assert!(readiness.tcp_socket.is_none());
        let pre_stop = c
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
            .expect("preStop");
        assert_eq!(get(pre_stop.http_get.as_ref()), ("/drain".into(), admin));
        // The admin port the probes name is the port the router listens on.
        let env: BTreeMap<&str, &str> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()))
            .collect();
        let admin_port = c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("admin"))
            .expect("admin port")
            .container_port;
        assert_eq!(
            env.get("KVROUTE_ROUTER_ADMIN_ADDR").copied(),
            Some(format!("0.0.0.0:{admin_port}").as_str())
        );
        // Only the node (the kubelet's preStop hook), loopback and the token may drain.
        let drain_from = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "KVROUTE_ROUTER_DRAIN_FROM_IP")
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        assert_eq!(drain_from, Some("status.hostIP"));
        // Drain and grace both fit before the kubelet's SIGKILL.
        let drain: i64 = env["KVROUTE_ROUTER_DRAIN_DELAY_S"].parse().expect("drain");
        let grace: i64 = env["KVROUTE_ROUTER_SHUTDOWN_GRACE_S"]
            .parse()
            .expect("grace");
        assert!(drain > 0);
        assert!(
            drain + grace < pod.termination_grace_period_seconds.expect("grace period"),
            "{drain} + {grace}"
        );
        // Clients: ready replicas only. Sidecars: every replica, ready or not.
        assert_ne!(
            o.service.spec.expect("spec").publish_not_ready_addresses,
            Some(true)
        );
        assert_eq!(
            o.ingest_service
                .spec
                .expect("spec")
                .publish_not_ready_addresses,
            Some(true)
        );
    }

    #[test]
    fn deployment_uses_replicas_image_and_service_account() {
        let o = desired_router(&cfg(""), &TokenizerMounts::default());
        let spec = o.deployment.spec.expect("spec");
        assert_eq!(spec.replicas, Some(3));
        let pod = spec.template.spec.expect("pod");
        // The replicas share tenant limits: each is told how many there are.
        assert!(
            pod.containers[0].env.iter().flatten().any(|e| {
                e.name == "KVROUTE_ROUTER_REPLICAS" && e.value.as_deref() == Some("3")
            })
        );
        assert_eq!(pod.service_account_name.as_deref(), Some(ROUTER_NAME));
        assert_eq!(pod.containers[0].image.as_deref(), Some("r:1"));
        // The replicas find each other through the headless ingest Service.
        let env_of = |name: &str| {
            pod.containers[0]
                .env
                .iter()
                .flatten()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            env_of("KVROUTE_ROUTER_PEER_SERVICE").as_deref(),
            Some("kvroute-router-ingest.kvroute-system.svc:9000")
        );
        assert_eq!(
            env_of("KVROUTE_ROUTER_PEER_TLS_SERVER_NAME").as_deref(),
            Some("kvroute-router-ingest.kvroute-system.svc")
        );
        assert_eq!(
            o.ingest_service.spec.expect("spec").cluster_ip.as_deref(),
            Some("None")
        );
        assert_eq!(
            o.service.metadata.namespace.as_deref(),
            Some("kvroute-system")
        );
    }

    #[test]
    fn the_router_keeps_its_routing_headers_to_itself() {
        // x-kvroute-worker and the predicted TTFT tell any client which worker caches which
        // prefix: the operator's router never turns them on (issue 14).
        let o = desired_router(&cfg(""), &TokenizerMounts::default());
        let pod = o.deployment.spec.expect("spec").template.spec.expect("pod");
        let c = &pod.containers[0];
        let env = c.env.clone().unwrap_or_default();
        assert!(
            env.iter()
                .all(|e| e.name != "KVROUTE_ROUTER_EXPOSE_ROUTING_HEADERS"),
            "{env:?}"
        );
        let args = c.args.clone().unwrap_or_default();
        assert!(
            args.iter().all(|a| !a.contains("expose-routing-headers")),
            "{args:?}"
        );
    }
}
