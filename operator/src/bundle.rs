//! The OLM bundle and the plain deploy manifests, generated from the same sources as the CRDs
//! and the operator's RBAC ([`crate::permissions`]), so they cannot drift apart.
//!
//! ```text
//! kvroute_crds::crds() ----------------------> bundle/manifests/<crd>.yaml (= crds/<crd>.yaml)
//! permissions::OPERATOR_*_RULES, operator_deployment()
//!        |--> bundle/manifests/kvroute-operator.clusterserviceversion.yaml (+ examples(), icon)
//!        |--> deploy/rbac.yaml (ClusterRole, Role and their bindings)
//!        '--> deploy/operator.yaml (Namespace, ServiceAccount, Deployment, NetworkPolicy)
//! annotations() --> bundle/metadata/annotations.yaml and the LABELs of bundle/bundle.Dockerfile
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Namespace, ObjectFieldSelector,
    PodSpec, PodTemplateSpec, Probe, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResourceExt;
use kvroute_crds::{
    GatewayBackend, InferencePolicy, InferencePool, InferenceProvider, InferenceWorkerSet,
};
use serde_json::{Value, json};

use crate::desired::hardening::{pod_security, resources, restricted};
use crate::desired::network_policy::operator_policy;
use crate::generated::{GeneratedFile, crd_files, to_yaml, to_yaml_with_note};
use crate::permissions::{OPERATOR_NAMESPACE_RULES, OPERATOR_RULES, policy_rules};

/// OLM package name.
pub const PACKAGE: &str = "kvroute-operator";
/// Bundle channel.
pub const CHANNEL: &str = "alpha";
/// Operator version (the workspace version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Namespace of the plain deploy manifests.
pub const DEPLOY_NAMESPACE: &str = "kvroute-system";
/// Name of the operator's Deployment and ServiceAccount.
pub const OPERATOR_NAME: &str = "kvroute-operator";
/// Admin port of the operator.
pub const ADMIN_PORT: i32 = 8080;
/// Oldest Kubernetes the CRDs install on: their CEL validation rules need 1.25 (docs/crds.md).
/// The operator itself also runs on older servers (the e2e tier uses 1.20, installing the CRDs
/// without their rules), but that is a test arrangement, not a supported install.
pub const MIN_KUBE_VERSION: &str = "1.25.0";

/// The image of kvroute component `name` (`operator`, `router`, `sidecar`, `mock-vllm`) at
/// this version.
pub fn component_image(name: &str) -> String {
    format!("{}/kvroute-{name}:{VERSION}", crate::IMAGE_REPO)
}

/// The operator image of this version.
pub fn operator_image() -> String {
    component_image("operator")
}

/// Router replicas the operator deploys (its `--router-replicas` default), spelled out in the
/// operator's Deployment like the images.
pub const ROUTER_REPLICAS: i32 = 2;

/// The images the operator deploys, each with the operator's environment variable that sets
/// it (`--router-image` and so on): written into the operator's Deployment, and listed as the
/// CSV's `relatedImages` so that mirroring tools (e.g. `oc adm catalog mirror`) copy them to
/// a private registry.
pub const DEPLOYED_IMAGES: [(&str, &str); 3] = [
    ("router", "KVROUTE_OPERATOR_ROUTER_IMAGE"),
    ("sidecar", "KVROUTE_OPERATOR_SIDECAR_IMAGE"),
    ("mock-vllm", "KVROUTE_OPERATOR_MOCK_IMAGE"),
];

/// The CSV's `spec.relatedImages`: the operator and every image it deploys.
pub fn related_images() -> Vec<Value> {
    std::iter::once("operator")
        .chain(DEPLOYED_IMAGES.iter().map(|(name, _)| *name))
        .map(|name| json!({"name": format!("kvroute-{name}"), "image": component_image(name)}))
        .collect()
}

/// A small kvroute logo (SVG).
pub const ICON_SVG: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64"><rect width="64" height="64" rx="12" fill="#1f3a5f"/><path d="M14 16v32M14 32l14-16M14 32l14 16" stroke="#7fd1ff" stroke-width="5" fill="none" stroke-linecap="round"/><circle cx="44" cy="20" r="5" fill="#ffd166"/><circle cx="44" cy="44" r="5" fill="#ffd166"/><path d="M32 32h6l6-12M38 32l6 12" stroke="#ffd166" stroke-width="3" fill="none"/></svg>"##;

/// Standard base64 (RFC 4648, padded).
pub fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The bundle's metadata annotations (also the bundle image's labels).
pub fn annotations() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        (
            "operators.operatorframework.io.bundle.mediatype.v1",
            "registry+v1",
        ),
        (
            "operators.operatorframework.io.bundle.manifests.v1",
            "manifests/",
        ),
        (
            "operators.operatorframework.io.bundle.metadata.v1",
            "metadata/",
        ),
        ("operators.operatorframework.io.bundle.package.v1", PACKAGE),
        ("operators.operatorframework.io.bundle.channels.v1", CHANNEL),
        (
            "operators.operatorframework.io.bundle.channel.default.v1",
            CHANNEL,
        ),
    ])
}

fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The operator's Deployment spec (two replicas: one leads, one stands by). The watch namespace
/// comes from OLM's `olm.targetNamespaces` annotation (empty = all namespaces); the Lease lives
/// in the pod's namespace; the identity is the pod name.
pub fn operator_deployment_spec(image: &str) -> DeploymentSpec {
    let labels = BTreeMap::from([(
        "app.kubernetes.io/name".to_string(),
        OPERATOR_NAME.to_string(),
    )]);
    let probe = |path: &str, period: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String("admin".to_string()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        ..Default::default()
    };
    let container = Container {
        name: "operator".to_string(),
        image: Some(image.to_string()),
        command: Some(vec!["kvroute-operator".to_string()]),
        env: Some(
            vec![
                env_field(
                    "KVROUTE_OPERATOR_NAMESPACE",
                    "metadata.annotations['olm.targetNamespaces']",
                ),
                env_field("KVROUTE_OPERATOR_LEASE_NAMESPACE", "metadata.namespace"),
                env_field("KVROUTE_OPERATOR_IDENTITY", "metadata.name"),
                EnvVar {
                    name: "KVROUTE_OPERATOR_ADMIN_ADDR".to_string(),
                    value: Some(format!("0.0.0.0:{ADMIN_PORT}")),
                    ..Default::default()
                },
            ]
            .into_iter()
            // Spelled out (not left to the flag defaults) so a private registry is one edit here.
            .chain(DEPLOYED_IMAGES.iter().map(|(name, var)| EnvVar {
                name: (*var).to_string(),
                value: Some(component_image(name)),
                ..Default::default()
            }))
            // Likewise the settings the Helm chart's values control (docs/install.md).
            .chain(
                [
                    (
                        "KVROUTE_OPERATOR_ROUTER_REPLICAS",
                        ROUTER_REPLICAS.to_string(),
                    ),
                    ("KVROUTE_OPERATOR_MANAGE_ROUTER", "true".to_string()),
                    ("KVROUTE_OPERATOR_MTLS", "true".to_string()),
                ]
                .into_iter()
                .map(|(name, value)| EnvVar {
                    name: name.to_string(),
                    value: Some(value),
                    ..Default::default()
                }),
            )
            .collect(),
        ),
        ports: Some(vec![ContainerPort {
            name: Some("admin".to_string()),
            container_port: ADMIN_PORT,
            protocol: Some("TCP".to_string()),
            ..Default::default()
        }]),
        readiness_probe: Some(probe("/healthz", 10)),
        liveness_probe: Some(probe("/healthz", 20)),
        resources: Some(resources("50m", "64Mi", Some("500m"), "256Mi")),
        security_context: Some(restricted()),
        ..Default::default()
    };
    DeploymentSpec {
        replicas: Some(2),
        selector: LabelSelector {
            match_labels: Some(labels.clone()),
            ..Default::default()
        },
        template: PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                service_account_name: Some(OPERATOR_NAME.to_string()),
                containers: vec![container],
                security_context: Some(pod_security(true)),
                termination_grace_period_seconds: Some(10),
                ..Default::default()
            }),
        },
        ..Default::default()
    }
}

/// Example resources (CSV `alm-examples`, and a working start for users): a vLLM WorkerSet on
/// L40S; a pool whose tenants authenticate with API keys and that overflows to a provider; a
/// policy with a PII local-only rule, a rejected tenant, a tenant's limits and an overflow
/// rule; the provider and its GatewayBackend with an API key from a Secret; and a gated model
/// with its Hub token from a Secret and a weight cache on a PersistentVolumeClaim. What must
/// exist first (the Secrets) is said by [`example_note`].
///
/// ISSUE-13 SHAPES (merge: check against the final CRD types). The fields listed in
/// [`PENDING_EXAMPLE_FIELDS`] are written in the shapes the issue's parts agreed on (pool
/// `auth` from part B; policy, provider and backend fields as they are today) before their
/// types were merged; `examples_use_only_fields_the_crd_types_know` fails until each one is
/// known, and then tells to remove it from that list.
pub fn examples() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": kvroute_crds::API_VERSION, "kind": "InferenceWorkerSet",
            "metadata": {"name": "qwen3-0-6b"},
            "spec": {
                "model": {"name": "Qwen/Qwen3-0.6B", "servedName": "qwen3-0.6b"},
                "replicas": 2,
                "blockSize": 16,
                "engine": {"mode": "vllm", "args": ["--max-model-len", "8192"]},
                "gpu": {"count": 1, "product": "NVIDIA-L40S"}
            }
        }),
        json!({
            "apiVersion": kvroute_crds::API_VERSION, "kind": "InferencePool",
            "metadata": {"name": "chat"},
            "spec": {
                "targets": [{"workerSet": "qwen3-0-6b"}, {"provider": "openai", "role": "overflow"}],
                "modelAliases": [{"name": "chat", "model": "qwen3-0.6b"}],
                // ISSUE-13 SHAPE (part B): tenants from hashed API keys; no anonymous requests.
                "auth": {"apiKeySecrets": [{"name": API_KEY_SECRET}], "allowAnonymous": false}
            }
        }),
        json!({
            "apiVersion": kvroute_crds::API_VERSION, "kind": "InferencePolicy",
            "metadata": {"name": "default"},
            "spec": {
                "pool": "chat",
                "rules": [
                    {"name": "pii-stays-local", "match": {"labels": ["pii"]},
                     "actions": {"route": {"localOnly": true}}},
                    {"name": "suspended", "match": {"tenants": ["team-suspended"]},
                     "actions": {"reject": {"status": 403, "message": "this tenant is suspended"}}},
                    {"name": "team-a", "match": {"tenants": ["team-a"]},
                     "actions": {"limits": {"requestsPerMinute": 600, "tokensPerMinute": 200000},
                                 "overflow": {"provider": "openai", "ttftThresholdMs": 2000, "queueThreshold": 8}}},
                    {"name": "burst-to-openai",
                     "actions": {"overflow": {"provider": "openai", "ttftThresholdMs": 2000, "queueThreshold": 8}}}
                ]
            }
        }),
        json!({
            "apiVersion": kvroute_crds::API_VERSION, "kind": "InferenceProvider",
            "metadata": {"name": "openai"},
            "spec": {"kind": "openai", "models": ["qwen3-0.6b"], "limits": {"requestsPerMinute": 600},
                     "gatewayBackendRef": {"name": "openai"}}
        }),
        json!({
            "apiVersion": kvroute_crds::API_VERSION, "kind": "GatewayBackend",
            "metadata": {"name": "openai"},
            "spec": {"url": "https://api.openai.com", "tls": {"sni": "api.openai.com"},
                     "auth": {"secretRef": {"name": PROVIDER_KEY_SECRET, "key": "apiKey"}, "type": "bearer"}}
        }),
        json!({
            "apiVersion": kvroute_crds::API_VERSION, "kind": "InferenceWorkerSet",
            "metadata": {"name": GATED_EXAMPLE},
            "spec": {
                "model": {
                    "name": "meta-llama/Llama-3.1-8B-Instruct",
                    "servedName": "llama-3.1-8b",
                    "tokenizer": {"hub": {"tokenSecretRef": {"name": "hf-token", "key": "token"}}}
                },
                "replicas": 2,
                "engine": {"mode": "vllm", "args": ["--max-model-len", "16384"]},
                "gpu": {"count": 1, "product": "NVIDIA-L40S"},
                "resources": {"requests": {"cpu": "8", "memory": "48Gi"}, "limits": {"memory": "64Gi"}},
                "env": [
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
                ],
                "volumes": [
                    {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}}
                ],
                "volumeMounts": [
                    {"name": "model-cache", "mountPath": HF_CACHE_PATH}
                ]
            }
        }),
    ]
}

/// ISSUE-13 SHAPES: example fields (kind, JSON pointer) written before their CRD types were
/// merged. Each must be unknown to the current types (so it is visibly pending) until its
/// part merges; then remove it here.
pub const PENDING_EXAMPLE_FIELDS: &[(&str, &str)] = &[];

/// The API-key Secret of the example pool (router namespace).
const API_KEY_SECRET: &str = "chat-api-keys";
/// The provider's API-key Secret of the example backend (router namespace).
const PROVIDER_KEY_SECRET: &str = "openai-credentials";

/// Name of the gated-model example WorkerSet.
const GATED_EXAMPLE: &str = "llama-3-1-8b";
/// The Hugging Face cache of the vLLM image (it runs as root; `HF_HOME` unset).
const HF_CACHE_PATH: &str = "/root/.cache/huggingface";

/// A comment put above an example in `deploy/examples.yaml`: what must exist first (the
/// Secrets, in the router's namespace, where the router mounts them from) and what the
/// status says.
pub fn example_note(example: &Value) -> Option<&'static str> {
    if example["metadata"]["name"] == GATED_EXAMPLE {
        return Some(
            "# A gated model. Create first, in this WorkerSet's namespace:\n\
             #   kubectl create secret generic hf-token --from-literal=token=hf_...\n\
             #   a PersistentVolumeClaim `model-cache` for the weights (ReadWriteMany when the\n\
             #   replicas may land on different nodes; ReadWriteOnce pins them to one node).\n\
             # The router downloads the tokenizer with the same Secret from its own namespace\n\
             # (kvroute-system): create `hf-token` there too.\n",
        );
    }
    match example["kind"].as_str().unwrap_or_default() {
        "InferencePool" => Some(
            "# Tenants authenticate with API keys: make one per tenant with\n\
             #   kvroute tenant-key new --tenant team-a\n\
             # and put the printed `sha256:...` line in the Secret, in the router's namespace:\n\
             #   kubectl -n kvroute-system create secret generic chat-api-keys \\\n\
             #     --from-literal=team-a=sha256:...\n\
             # The operator mounts it into the router (status: SecretsMounted, TenantIdentity).\n\
             # The provider target takes what the policy's overflow rules send it.\n",
        ),
        "InferencePolicy" => Some(
            "# First match wins: PII stays on local workers (503 when none can take it), a\n\
             # suspended tenant gets 403, team-a has its limits (429 + Retry-After) and overflows\n\
             # like everyone else when the local queue or predicted TTFT is too high. Enforced by\n\
             # the router on every request; status Ready=True with reason Enforced.\n",
        ),
        "InferenceProvider" => Some(
            "# The router relays overflow to this provider when a policy's overflow action says so.\n\
             # Status: Ready=True with reason Enforced once its GatewayBackend is Ready.\n",
        ),
        "GatewayBackend" => Some(
            "# The provider's API key, in the router's namespace (the router mounts it):\n\
             #   kubectl -n kvroute-system create secret generic openai-credentials \\\n\
             #     --from-literal=apiKey=sk-...\n\
             # Status: Ready=True with reason Enforced once the Secret and key exist.\n",
        ),
        _ => None,
    }
}

fn descriptor(path: &str, name: &str, description: &str, x: &[&str]) -> Value {
    json!({"path": path, "displayName": name, "description": description, "x-descriptors": x})
}

const CONDITIONS: &str = "urn:alm:descriptor:io.kubernetes.conditions";
const TEXT: &str = "urn:alm:descriptor:com.tectonic.ui:text";
const NUMBER: &str = "urn:alm:descriptor:com.tectonic.ui:number";

/// Owned CRD entries of the CSV.
fn owned_crds() -> Vec<Value> {
    let describe = |crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
                    display: &str,
                    spec: Vec<Value>,
                    status: Vec<Value>,
                    resources: Value| {
        let description = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| s.description.clone())
            .unwrap_or_default();
        json!({
            "name": crd.metadata.name,
            "version": kvroute_crds::VERSION,
            "kind": crd.spec.names.kind,
            "displayName": display,
            "description": description,
            "specDescriptors": spec,
            "statusDescriptors": status,
            "resources": resources,
        })
    };
    let ready = |what: &str| descriptor("conditions", "Conditions", what, &[CONDITIONS]);
    vec![
        describe(
            InferenceWorkerSet::crd(),
            "Inference Worker Set",
            vec![
                descriptor(
                    "model.name",
                    "Model",
                    "Model to serve, e.g. a Hugging Face repository.",
                    &[TEXT],
                ),
                descriptor(
                    "replicas",
                    "Workers",
                    "Number of worker pods.",
                    &["urn:alm:descriptor:com.tectonic.ui:podCount"],
                ),
                descriptor(
                    "engine.mode",
                    "Engine",
                    "vllm or mock.",
                    &[
                        "urn:alm:descriptor:com.tectonic.ui:select:vllm",
                        "urn:alm:descriptor:com.tectonic.ui:select:mock",
                    ],
                ),
                descriptor(
                    "gpu.product",
                    "GPU product",
                    "Value of the nvidia.com/gpu.product node label.",
                    &[TEXT],
                ),
                descriptor(
                    "gpu.count",
                    "GPUs per worker",
                    "nvidia.com/gpu per pod.",
                    &[NUMBER],
                ),
                descriptor(
                    "blockSize",
                    "Block size",
                    "KV-cache block size in tokens.",
                    &[NUMBER],
                ),
                descriptor(
                    "resources",
                    "Resources",
                    "Engine container resources.",
                    &["urn:alm:descriptor:com.tectonic.ui:resourceRequirements"],
                ),
            ],
            vec![
                descriptor(
                    "readyReplicas",
                    "Ready workers",
                    "Worker pods that are ready.",
                    &["urn:alm:descriptor:com.tectonic.ui:podCount"],
                ),
                descriptor(
                    "workers",
                    "Workers",
                    "Worker pods with address and readiness.",
                    &[],
                ),
                ready("Ready, Progressing and Degraded."),
            ],
            json!([
                {"kind": "Deployment", "version": "v1"},
                {"kind": "Service", "version": "v1"},
                {"kind": "Pod", "version": "v1"}
            ]),
        ),
        describe(
            InferencePool::crd(),
            "Inference Pool",
            vec![
                descriptor(
                    "targets",
                    "Targets",
                    "WorkerSets and providers serving the pool's models.",
                    &[],
                ),
                descriptor(
                    "modelAliases",
                    "Model aliases",
                    "Client-facing names for backend models.",
                    &[],
                ),
            ],
            vec![
                descriptor("models", "Models", "Ready targets per model.", &[]),
                ready("Accepted, ResolvedRefs and Ready."),
            ],
            json!([{"kind": "InferenceWorkerSet", "version": kvroute_crds::VERSION}]),
        ),
        describe(
            InferencePolicy::crd(),
            "Inference Policy",
            vec![
                descriptor("pool", "Pool", "InferencePool the rules apply to.", &[TEXT]),
                descriptor(
                    "rules",
                    "Rules",
                    "Ordered rules; the first match applies (enforced by the router).",
                    &[],
                ),
            ],
            vec![ready(
                "Accepted and ResolvedRefs; Ready=True with reason Enforced once the router's compiler accepts the rules and every reference resolves",
            )],
            json!([]),
        ),
        describe(
            InferenceProvider::crd(),
            "Inference Provider",
            vec![
                descriptor("kind", "API", "openai or anthropic.", &[TEXT]),
                descriptor(
                    "gatewayBackendRef.name",
                    "Gateway backend",
                    "GatewayBackend used to reach the provider.",
                    &[TEXT],
                ),
            ],
            vec![ready(
                "Accepted, ResolvedRefs, Ready (True, reason Enforced: the router relays overflow to \
                 the provider once its GatewayBackend is Ready) and, for Anthropic providers, \
                 OpenAIClients=False (OpenAI-API requests are not translated to them).",
            )],
            json!([{"kind": "GatewayBackend", "version": kvroute_crds::VERSION}]),
        ),
        describe(
            GatewayBackend::crd(),
            "Gateway Backend",
            vec![
                descriptor("url", "URL", "Base URL of the backend.", &[TEXT]),
                descriptor(
                    "auth.secretRef.name",
                    "Credentials Secret",
                    "Secret holding the credential.",
                    &["urn:alm:descriptor:io.kubernetes:Secret"],
                ),
            ],
            vec![ready(
                "Accepted, ResolvedRefs (its Secrets exist in the router's namespace), Ready (True, \
                 reason Enforced: the router relays through it) and TLSVerified=False with \
                 insecureSkipVerify.",
            )],
            json!([{"kind": "Secret", "version": "v1"}]),
        ),
    ]
}

/// The ClusterServiceVersion.
pub fn cluster_service_version() -> Value {
    let image = operator_image();
    let alm = serde_json::to_string_pretty(&examples()).unwrap_or_else(|_| "[]".to_string());
    json!({
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {
            "name": format!("{PACKAGE}.v{VERSION}"),
            "namespace": "placeholder",
            "annotations": {
                "alm-examples": alm,
                "capabilities": "Basic Install",
                "categories": "AI/Machine Learning, Networking",
                "containerImage": image,
                "description": "KV-cache-aware routing of LLM requests to vLLM workers on Kubernetes.",
                "operators.operatorframework.io/suggested-namespace": DEPLOY_NAMESPACE,
                "repository": "https://github.com/kvroute/kvroute",
                "support": "kvroute"
            }
        },
        "spec": {
            "displayName": "kvroute",
            "description": "kvroute runs vLLM workers for your models and a router that sends every request to the worker \
                            predicted to return its first token soonest, using what each worker holds in its KV cache \
                            and how busy it is.\n\n\
                            * **InferenceWorkerSet**: vLLM pods on GPUs (or a mock engine), each with a sidecar streaming \
                            KV-cache events to the router.\n\
                            * **InferencePool**: what a model name resolves to (local workers, remote providers).\n\
                            * **InferencePolicy**: ordered rules: route, reject, overflow, limits.\n\
                            * **InferenceProvider** and **GatewayBackend**: remote OpenAI/Anthropic-compatible APIs.",
            "version": VERSION,
            "minKubeVersion": MIN_KUBE_VERSION,
            "maturity": "alpha",
            "provider": {"name": "kvroute", "url": "https://github.com/kvroute/kvroute"},
            "maintainers": [{"name": "kvroute maintainers", "email": "maintainers@kvroute.dev"}],
            "links": [
                {"name": "Source", "url": "https://github.com/kvroute/kvroute"},
                {"name": "Documentation", "url": "https://github.com/kvroute/kvroute#readme"}
            ],
            "keywords": ["llm", "inference", "vllm", "kv-cache", "routing", "gpu"],
            "icon": [{"base64data": base64_encode(ICON_SVG.as_bytes()), "mediatype": "image/svg+xml"}],
            "installModes": [
                {"type": "OwnNamespace", "supported": true},
                {"type": "SingleNamespace", "supported": true},
                {"type": "MultiNamespace", "supported": false},
                {"type": "AllNamespaces", "supported": true}
            ],
            "install": {
                "strategy": "deployment",
                "spec": {
                    "clusterPermissions": [{"serviceAccountName": OPERATOR_NAME, "rules": policy_rules(OPERATOR_RULES)}],
                    "permissions": [{"serviceAccountName": OPERATOR_NAME, "rules": policy_rules(OPERATOR_NAMESPACE_RULES)}],
                    "deployments": [{
                        "name": OPERATOR_NAME,
                        "label": {"app.kubernetes.io/name": OPERATOR_NAME},
                        "spec": operator_deployment_spec(&image)
                    }]
                }
            },
            "customresourcedefinitions": {"owned": owned_crds()},
            "relatedImages": related_images()
        }
    })
}

/// `bundle.Dockerfile` (labels = annotations).
pub fn bundle_dockerfile() -> String {
    let mut out = String::from(
        "# Generated by `kvroute crdgen`; do not edit.\n# Build: docker build -f bundle/bundle.Dockerfile -t ghcr.io/kvroute/kvroute-operator-bundle:",
    );
    out.push_str(VERSION);
    out.push_str(" bundle/\nFROM scratch\n");
    for (k, v) in annotations() {
        out.push_str(&format!("LABEL {k}={v}\n"));
    }
    out.push_str("COPY manifests /manifests/\nCOPY metadata /metadata/\n");
    out
}

/// Every bundle file under `dir`.
pub fn bundle_files(dir: &Path) -> anyhow::Result<Vec<GeneratedFile>> {
    let manifests = dir.join("manifests");
    let mut files = crd_files(&manifests)?;
    files.push(GeneratedFile {
        path: manifests.join(format!("{PACKAGE}.clusterserviceversion.yaml")),
        content: to_yaml(&cluster_service_version())?,
    });
    files.push(GeneratedFile {
        path: dir.join("metadata").join("annotations.yaml"),
        content: to_yaml(&json!({ "annotations": annotations() }))?,
    });
    files.push(GeneratedFile {
        path: dir.join("bundle.Dockerfile"),
        content: bundle_dockerfile(),
    });
    Ok(files)
}

fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: ns.map(str::to_string),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/name".to_string(),
            OPERATOR_NAME.to_string(),
        )])),
        ..Default::default()
    }
}

/// Pod Security admission level enforced in the operator's namespace: the operator and the
/// router meet the `restricted` profile (docs/security.md, "Hardened pods").
pub const POD_SECURITY_LEVEL: &str = "restricted";

/// The operator's namespace, with Pod Security admission enforcing [`POD_SECURITY_LEVEL`].
fn namespace_meta() -> ObjectMeta {
    let mut m = meta(DEPLOY_NAMESPACE, None);
    if let Some(labels) = m.labels.as_mut() {
        for mode in ["enforce", "warn", "audit"] {
            labels.insert(
                format!("pod-security.kubernetes.io/{mode}"),
                POD_SECURITY_LEVEL.to_string(),
            );
        }
    }
    m
}

/// Plain manifests for clusters without OLM: `kubectl apply -f crds/ -f deploy/`.
pub fn deploy_files(dir: &Path) -> anyhow::Result<Vec<GeneratedFile>> {
    let ns = Some(DEPLOY_NAMESPACE);
    let subject = || Subject {
        kind: "ServiceAccount".into(),
        name: OPERATOR_NAME.into(),
        namespace: Some(DEPLOY_NAMESPACE.into()),
        ..Default::default()
    };
    let mut spec = operator_deployment_spec(&operator_image());
    // Without OLM there is no olm.targetNamespaces annotation: watch all namespaces.
    if let Some(c) = spec
        .template
        .spec
        .as_mut()
        .and_then(|p| p.containers.first_mut())
        && let Some(env) = c.env.as_mut()
    {
        env.retain(|e| e.name != "KVROUTE_OPERATOR_NAMESPACE");
    }
    let labels = BTreeMap::from([(
        "app.kubernetes.io/name".to_string(),
        OPERATOR_NAME.to_string(),
    )]);
    let docs = [
        to_yaml(&Namespace {
            metadata: namespace_meta(),
            ..Default::default()
        })?,
        to_yaml(&ServiceAccount {
            metadata: meta(OPERATOR_NAME, ns),
            ..Default::default()
        })?,
        to_yaml(&Deployment {
            metadata: meta(OPERATOR_NAME, ns),
            spec: Some(spec),
            status: None,
        })?,
        to_yaml(&operator_policy(
            meta(OPERATOR_NAME, ns),
            labels,
            ADMIN_PORT,
        ))?,
    ];
    let rbac = [
        to_yaml(&ClusterRole {
            metadata: meta(OPERATOR_NAME, None),
            rules: Some(policy_rules(OPERATOR_RULES)),
            ..Default::default()
        })?,
        to_yaml(&ClusterRoleBinding {
            metadata: meta(OPERATOR_NAME, None),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: OPERATOR_NAME.into(),
            },
            subjects: Some(vec![subject()]),
        })?,
        to_yaml(&Role {
            metadata: meta(OPERATOR_NAME, ns),
            rules: Some(policy_rules(OPERATOR_NAMESPACE_RULES)),
        })?,
        to_yaml(&RoleBinding {
            metadata: meta(OPERATOR_NAME, ns),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: OPERATOR_NAME.into(),
            },
            subjects: Some(vec![subject()]),
        })?,
    ];
    let examples: Vec<String> = examples()
        .iter()
        .map(|e| {
            let note = example_note(e);
            to_yaml_with_note(e, note.unwrap_or_default())
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(vec![
        GeneratedFile {
            path: dir.join("operator.yaml"),
            content: docs.join("---\n"),
        },
        GeneratedFile {
            path: dir.join("rbac.yaml"),
            content: rbac.join("---\n"),
        },
        GeneratedFile {
            path: dir.join("examples.yaml"),
            content: examples.join("---\n"),
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_lists_every_image_and_the_operator_deployment_sets_them_by_flag_env() {
        let csv = cluster_service_version();
        let related: Vec<&str> = csv["spec"]["relatedImages"]
            .as_array()
            .expect("relatedImages")
            .iter()
            .filter_map(|i| i["image"].as_str())
            .collect();
        assert_eq!(
            related,
            ["operator", "router", "sidecar", "mock-vllm"]
                .map(|c| format!("ghcr.io/kvroute/kvroute-{c}:{VERSION}"))
        );
        // The operator's own flags: env name -> default.
        let cmd = <crate::Args as clap::Args>::augment_args(clap::Command::new("kvroute-operator"));
        let flags: BTreeMap<String, String> = cmd
            .get_arguments()
            .filter_map(|a| {
                let env = a.get_env()?.to_string_lossy().into_owned();
                let default = a
                    .get_default_values()
                    .first()?
                    .to_string_lossy()
                    .into_owned();
                Some((env, default))
            })
            .collect();
        let spec = operator_deployment_spec(&operator_image());
        let pod = spec.template.spec.expect("pod");
        let env: BTreeMap<&str, &str> = pod.containers[0]
            .env
            .iter()
            .flatten()
            .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
            .collect();
        for (name, var) in DEPLOYED_IMAGES {
            let image = component_image(name);
            assert_eq!(env.get(var).copied(), Some(image.as_str()), "{var}");
            assert_eq!(
                flags.get(var),
                Some(&image),
                "{var} is a flag with that default"
            );
            assert!(related.contains(&image.as_str()));
        }
        for var in [
            "KVROUTE_OPERATOR_ROUTER_REPLICAS",
            "KVROUTE_OPERATOR_MANAGE_ROUTER",
            "KVROUTE_OPERATOR_MTLS",
        ] {
            assert_eq!(
                env.get(var).copied(),
                flags.get(var).map(String::as_str),
                "{var} is spelled out with the flag's default"
            );
        }
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn gated_example_gets_its_token_from_a_secret_and_a_weight_cache() {
        use crate::desired::workerset::deployment::desired_deployment;
        use crate::desired::workerset::fixtures::{cfg, ws};
        let example = examples()
            .into_iter()
            .find(|e| e["metadata"]["name"] == GATED_EXAMPLE)
            .expect("gated example");
        let d = desired_deployment(&ws(&example["spec"].to_string()), &cfg()).expect("builds");
        let pod = d.spec.and_then(|s| s.template.spec).expect("pod");
        let engine = &pod.containers[0];
        let token = engine
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "HF_TOKEN")
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("HF_TOKEN from a Secret");
        assert_eq!(
            (token.name.as_str(), token.key.as_str()),
            ("hf-token", "token")
        );
        let mount = engine
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == HF_CACHE_PATH)
            .expect("cache mount");
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .expect("cache volume");
        assert_eq!(
            volume
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str()),
            Some("model-cache")
        );
        assert!(example_note(&example).is_some_and(|n| n.contains("hf-token")));
    }

    /// Every leaf of `example` under `at`, as (JSON pointer, value).
    fn leaves(v: &Value, at: String, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, x) in m {
                    leaves(x, format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) if !a.is_empty() => {
                for (i, x) in a.iter().enumerate() {
                    leaves(x, format!("{at}/{i}"), out);
                }
            }
            _ => out.push((at, v.clone())),
        }
    }

    /// The typed round trip of an example: what the current CRD types keep of it.
    fn round_trip(example: &Value) -> Value {
        let kind = example["kind"].as_str().unwrap_or_default();
        let text = serde_json::to_string(example).expect("json");
        let doc = kvroute_crds::parse_documents(&text)
            .expect("parses")
            .pop()
            .expect("one document");
        let typed = match doc {
            kvroute_crds::AnyResource::WorkerSet(w) => serde_json::to_value(w),
            kvroute_crds::AnyResource::Pool(p) => serde_json::to_value(p),
            kvroute_crds::AnyResource::Policy(p) => serde_json::to_value(p),
            kvroute_crds::AnyResource::Provider(p) => serde_json::to_value(p),
            kvroute_crds::AnyResource::GatewayBackend(b) => serde_json::to_value(b),
            kvroute_crds::AnyResource::Secret(s) => serde_json::to_value(s),
            kvroute_crds::AnyResource::GiePool(p) => serde_json::to_value(p),
            kvroute_crds::AnyResource::Pod(p) => serde_json::to_value(p),
        };
        let typed = typed.expect("serializes");
        assert_eq!(typed["kind"], kind);
        typed
    }

    #[test]
    fn examples_use_only_fields_the_crd_types_know() {
        // Unknown fields are ignored when parsing, so "it parses" proves nothing: every field
        // an example sets must survive the typed round trip with its value, except the
        // pending ones, which must not (yet).
        for example in examples() {
            let kind = example["kind"].as_str().unwrap_or_default().to_string();
            let typed = round_trip(&example);
            let mut all = Vec::new();
            leaves(&example, String::new(), &mut all);
            for (pointer, value) in all {
                let pending = PENDING_EXAMPLE_FIELDS
                    .iter()
                    .any(|(k, p)| *k == kind && pointer.starts_with(p));
                let kept = typed.pointer(&pointer) == Some(&value);
                if pending {
                    assert!(
                        !kept,
                        "{kind} {pointer} is known to the CRD types now: remove it from \
                         PENDING_EXAMPLE_FIELDS"
                    );
                } else {
                    assert!(
                        kept,
                        "{kind} {pointer} = {value} is not kept by the CRD types (got {:?})",
                        typed.pointer(&pointer)
                    );
                }
            }
        }
        // Each pending field is set by some example.
        for (kind, pointer) in PENDING_EXAMPLE_FIELDS {
            assert!(
                examples()
                    .iter()
                    .any(|e| e["kind"] == *kind && e.pointer(pointer).is_some()),
                "{kind} {pointer}"
            );
        }
    }

    #[test]
    fn examples_show_each_issue_13_feature_and_name_their_secrets() {
        let all = examples();
        let policy = all
            .iter()
            .find(|e| e["kind"] == "InferencePolicy")
            .expect("policy");
        let actions: Vec<&Value> = policy["spec"]["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .map(|r| &r["actions"])
            .collect();
        assert!(actions.iter().any(|a| a["route"]["localOnly"] == true));
        assert!(actions.iter().any(|a| a["reject"]["status"] == 403));
        assert!(
            actions
                .iter()
                .any(|a| a["limits"]["requestsPerMinute"].is_number())
        );
        assert!(
            actions
                .iter()
                .any(|a| a["overflow"]["provider"] == "openai")
        );
        // The Secrets the examples name are the ones the notes tell to create.
        for e in &all {
            let uses: Vec<String> = match e["kind"].as_str() {
                Some("GatewayBackend") => vec![PROVIDER_KEY_SECRET.to_string()],
                Some("InferencePool") => vec![API_KEY_SECRET.to_string()],
                _ => continue,
            };
            let note = example_note(e).unwrap_or_default();
            for name in uses {
                assert!(
                    note.contains(&format!("create secret generic {name}")),
                    "{note}"
                );
                assert!(e.to_string().contains(&name));
            }
        }
    }

    #[test]
    fn examples_parse_as_typed_resources_and_validate() {
        let yaml: Vec<String> = examples()
            .iter()
            .map(|e| serde_json::to_string(e).expect("json"))
            .collect();
        let docs = kvroute_crds::parse_documents(&yaml.join("\n---\n")).expect("parse");
        assert_eq!(docs.len(), 6);
        for d in docs {
            let issues = match d {
                kvroute_crds::AnyResource::WorkerSet(w) => w.spec.validate(),
                kvroute_crds::AnyResource::Pool(p) => p.spec.validate(),
                kvroute_crds::AnyResource::Policy(p) => p.spec.validate(),
                kvroute_crds::AnyResource::Provider(p) => p.spec.validate(),
                kvroute_crds::AnyResource::GatewayBackend(b) => b.spec.validate(),
                kvroute_crds::AnyResource::Secret(_)
                | kvroute_crds::AnyResource::GiePool(_)
                | kvroute_crds::AnyResource::Pod(_) => Vec::new(),
            };
            assert!(issues.is_empty(), "{issues:?}");
        }
    }
}
