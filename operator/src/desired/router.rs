//! The router the operator runs: Deployment, client Service, headless ingest Service (sidecars
//! resolve it to stream to every replica), ServiceAccount and read-only RBAC.
//!
//! RBAC scope follows the watch scope: with `--namespace` set the router gets a Role and
//! RoleBinding in that namespace; watching all namespaces it needs the same read rules
//! cluster-wide, so it gets a ClusterRole and ClusterRoleBinding. The rules come from
//! [`crate::permissions::ROUTER_RULES`] either way.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, PodSpec, PodTemplateSpec, Probe, Service, ServiceAccount,
    ServicePort, ServiceSpec, TCPSocketAction,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{OperatorConfig, common_labels};
use crate::permissions::{ROUTER_RULES, policy_rules};

/// Name of the router Deployment, Service, ServiceAccount and RBAC objects.
pub const ROUTER_NAME: &str = "kvroute-router";
/// Headless Service of the router's ingest port.
pub const INGEST_SERVICE: &str = "kvroute-router-ingest";
/// OpenAI/Anthropic HTTP gateway port.
pub const HTTP_PORT: i32 = 8080;
/// The router's one gRPC server: the Ingest service the sidecars stream to, the Pick API
/// for external gateways and grpc.health.v1 (`kvroute-router --grpc-addr`).
pub const INGEST_PORT: i32 = 9000;
/// The Pick API is served by the same gRPC server as ingest.
pub const PICK_PORT: i32 = INGEST_PORT;
/// Admin port (`/metrics`, `/healthz`).
pub const ADMIN_PORT: i32 = 9091;

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
}

fn selector() -> BTreeMap<String, String> {
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

fn svc_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_string()),
        port,
        target_port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".to_string()),
        ..Default::default()
    }
}

/// Cluster-scoped object names carry the router namespace so two installations do not clash.
pub fn cluster_role_name(cfg: &OperatorConfig) -> String {
    format!("{ROUTER_NAME}-{}", cfg.router_namespace)
}

/// Builds every router object.
pub fn desired_router(cfg: &OperatorConfig) -> RouterObjects {
    let ns = cfg.router_namespace.as_str();
    let subject = Subject {
        kind: "ServiceAccount".to_string(),
        name: ROUTER_NAME.to_string(),
        namespace: Some(ns.to_string()),
        ..Default::default()
    };
    let (role, cluster_role) = if cfg.watch_namespace.is_empty() {
        let name = cluster_role_name(cfg);
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
    let container = Container {
        name: "router".to_string(),
        image: Some(cfg.router_image.clone()),
        command: Some(vec!["kvroute-router".to_string()]),
        // Flags of `kvroute-router` (router/src/lib.rs), by their env names.
        env: Some(router_env(cfg)),
        ports: Some(vec![
            port("http", HTTP_PORT),
            port("grpc", INGEST_PORT),
            port("admin", ADMIN_PORT),
        ]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("http".into()),
                ..Default::default()
            }),
            period_seconds: Some(5),
            ..Default::default()
        }),
        liveness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String("http".into()),
                ..Default::default()
            }),
            period_seconds: Some(10),
            failure_threshold: Some(6),
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
                    containers: vec![container],
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
            ports: Some(vec![
                svc_port("http", HTTP_PORT),
                svc_port("grpc", PICK_PORT),
            ]),
            ..Default::default()
        }),
        status: None,
    };
    let ingest_service = Service {
        metadata: meta(INGEST_SERVICE, Some(ns)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(selector()),
            ports: Some(vec![svc_port("grpc", INGEST_PORT)]),
            ..Default::default()
        }),
        status: None,
    };
    RouterObjects {
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
/// when empty), and the ports the Services point at.
fn router_env(cfg: &OperatorConfig) -> Vec<EnvVar> {
    let mut vars = vec![
        env("KVROUTE_ROUTER_KUBERNETES", "true".to_string()),
        env("KVROUTE_ROUTER_HTTP_ADDR", format!("0.0.0.0:{HTTP_PORT}")),
        env("KVROUTE_ROUTER_GRPC_ADDR", format!("0.0.0.0:{INGEST_PORT}")),
        env("KVROUTE_ROUTER_ADMIN_ADDR", format!("0.0.0.0:{ADMIN_PORT}")),
    ];
    if !cfg.watch_namespace.is_empty() {
        vars.push(env("KVROUTE_ROUTER_NAMESPACE", cfg.watch_namespace.clone()));
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
        }
    }

    #[test]
    fn namespaced_watch_gets_a_role_and_cluster_watch_a_cluster_role() {
        let o = desired_router(&cfg("team-a"));
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

        let o = desired_router(&cfg(""));
        assert!(o.role.is_none());
        let (cr, crb) = o.cluster_role.expect("cluster role");
        assert_eq!(
            cr.metadata.name.as_deref(),
            Some("kvroute-router-kvroute-system")
        );
        assert_eq!(crb.role_ref.name, "kvroute-router-kvroute-system");
    }

    #[test]
    fn deployment_uses_replicas_image_and_service_account() {
        let o = desired_router(&cfg(""));
        let spec = o.deployment.spec.expect("spec");
        assert_eq!(spec.replicas, Some(3));
        let pod = spec.template.spec.expect("pod");
        assert_eq!(pod.service_account_name.as_deref(), Some(ROUTER_NAME));
        assert_eq!(pod.containers[0].image.as_deref(), Some("r:1"));
        assert_eq!(
            o.ingest_service.spec.expect("spec").cluster_ip.as_deref(),
            Some("None")
        );
        assert_eq!(
            o.service.metadata.namespace.as_deref(),
            Some("kvroute-system")
        );
    }
}
