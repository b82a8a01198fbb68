//! Every pod spec kvroute generates is hardened, and every component has a NetworkPolicy:
//! the operator's Deployment as shipped (deploy/operator.yaml, the CSV), the router (both
//! watch scopes) and worker pods (mock, vLLM on GPUs, the gated example with the user's own
//! resources and volumes), checked with the same rules ([`hardening_issues`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kvroute_crds::workerset::InferenceWorkerSet;
use kvroute_operator::bundle::{cluster_service_version, examples};
use kvroute_operator::desired::OperatorConfig;
use kvroute_operator::desired::hardening::hardening_issues;
use kvroute_operator::desired::router::{TokenizerMounts, desired_router, tokenizer_mounts};
use kvroute_operator::desired::workerset::deployment::desired_deployment;
use kvroute_operator::desired::workerset::network_policy::desired_network_policy;
use kvroute_operator::desired::workerset::{ENGINE_CONTAINER, SIDECAR_CONTAINER};
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cfg(watch: &str) -> OperatorConfig {
    OperatorConfig {
        sidecar_image: "s".into(),
        mock_image: "m".into(),
        router_image: "r".into(),
        router_replicas: 2,
        router_namespace: "kvroute-system".into(),
        watch_namespace: watch.into(),
        mtls: false,
        gie_inference_pool: String::new(),
        otlp_endpoint: String::new(),
        tokenizer_fetch: Default::default(),
    }
}

fn worker_set(name: &str, spec: Value) -> InferenceWorkerSet {
    serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
        "metadata": {"name": name, "namespace": "team-a", "uid": "u-1"},
        "spec": spec,
    }))
    .expect("workerset")
}

/// The WorkerSets whose pods are checked: the mock, vLLM on 1 and 2 GPUs, and every example
/// WorkerSet shipped in deploy/examples.yaml and the CSV.
fn worker_sets() -> Vec<InferenceWorkerSet> {
    let mut sets = vec![
        worker_set(
            "mock",
            json!({"model": {"name": "m"}, "engine": {"mode": "mock"}}),
        ),
        worker_set("one-gpu", json!({"model": {"name": "Qwen/Qwen3-0.6B"}})),
        worker_set(
            "two-gpus",
            json!({"model": {"name": "Qwen/Qwen3-32B"}, "gpu": {"count": 2}}),
        ),
    ];
    for e in examples() {
        if e["kind"] == "InferenceWorkerSet" {
            let name = e["metadata"]["name"].as_str().expect("name").to_string();
            sets.push(worker_set(&name, e["spec"].clone()));
        }
    }
    sets
}

fn pod_of(d: &Deployment) -> PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec")
}

fn assert_hardened(what: &str, pod: &PodSpec, root_allowed: &[&str]) {
    let issues = hardening_issues(pod, root_allowed);
    assert!(issues.is_empty(), "{what}:\n{}", issues.join("\n"));
}

fn selects(policy: &NetworkPolicy, labels: &BTreeMap<String, String>) -> bool {
    let wanted = policy
        .spec
        .as_ref()
        .and_then(|s| s.pod_selector.as_ref())
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn pod_labels(d: &Deployment) -> BTreeMap<String, String> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

#[test]
fn worker_pods_are_hardened_have_no_token_and_a_network_policy() {
    for ws in worker_sets() {
        let name = ws.name_any();
        let d = desired_deployment(&ws, &cfg("")).expect("deployment");
        let pod = pod_of(&d);
        let vllm = ws.spec.engine.mode == kvroute_crds::workerset::EngineMode::Vllm;
        // Only the upstream vLLM image may keep its root user and a writable root filesystem.
        let exempt: &[&str] = if vllm { &[ENGINE_CONTAINER] } else { &[] };
        assert_hardened(&format!("worker {name}"), &pod, exempt);
        assert_eq!(pod.automount_service_account_token, Some(false), "{name}");
        let sidecar = pod
            .containers
            .iter()
            .find(|c| c.name == SIDECAR_CONTAINER)
            .expect("sidecar");
        assert_eq!(
            sidecar
                .security_context
                .as_ref()
                .and_then(|s| s.read_only_root_filesystem),
            Some(true)
        );
        // vLLM's KV-event sockets stay on loopback: no endpoint on another host, no
        // container port for them.
        let engine = pod
            .containers
            .iter()
            .find(|c| c.name == ENGINE_CONTAINER)
            .expect("engine");
        let args = engine.args.clone().unwrap_or_default();
        let kv = args
            .iter()
            .position(|a| a == "--kv-events-config")
            .and_then(|i| args.get(i + 1))
            .expect("kv events config");
        let kv: Value = serde_json::from_str(kv).expect("json");
        for key in ["endpoint", "replay_endpoint"] {
            assert!(
                kv[key]
                    .as_str()
                    .is_some_and(|e| e.starts_with("tcp://127.0.0.1:")),
                "{name}: {key} = {}",
                kv[key]
            );
        }
        let ports: Vec<i32> = engine
            .ports
            .iter()
            .flatten()
            .map(|p| p.container_port)
            .collect();
        assert!(
            !ports.contains(&ws.spec.kv_events.port),
            "{name}: {ports:?}"
        );
        assert!(!ports.contains(&ws.spec.kv_events.replay_port));
        let policy = desired_network_policy(&ws, &cfg("")).expect("policy");
        assert!(
            selects(&policy, &pod_labels(&d)),
            "{name}: policy selects its pods"
        );
    }
}

#[test]
fn router_pods_are_hardened_and_have_a_network_policy() {
    let mounts = tokenizer_mounts(&worker_sets());
    for (watch, mounts) in [("", mounts), ("team-a", TokenizerMounts::default())] {
        let o = desired_router(&cfg(watch), &mounts);
        let pod = pod_of(&o.deployment);
        assert_hardened(&format!("router (watch {watch:?})"), &pod, &[]);
        assert_ne!(
            pod.automount_service_account_token,
            Some(false),
            "it watches"
        );
        assert!(selects(&o.network_policy, &pod_labels(&o.deployment)));
    }
}

#[test]
fn the_operator_as_shipped_is_hardened_and_has_a_network_policy() {
    let text = std::fs::read_to_string(root().join("deploy/operator.yaml")).expect("deploy");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("yaml");
    let d: Deployment = serde_json::from_value(
        docs.iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("Deployment")
            .clone(),
    )
    .expect("typed");
    assert_hardened("deploy/operator.yaml", &pod_of(&d), &[]);
    // The namespace enforces the restricted Pod Security profile, which the operator and the
    // router (the pods created there) meet.
    let ns = docs
        .iter()
        .find(|d| d["kind"] == "Namespace")
        .expect("Namespace");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let policy: NetworkPolicy = serde_json::from_value(
        docs.iter()
            .find(|d| d["kind"] == "NetworkPolicy")
            .expect("NetworkPolicy")
            .clone(),
    )
    .expect("typed");
    assert!(selects(&policy, &pod_labels(&d)));
    let spec = policy.spec.expect("spec");
    assert_eq!(
        spec.policy_types,
        Some(vec!["Ingress".to_string(), "Egress".to_string()])
    );

    let csv = cluster_service_version();
    let spec = csv
        .pointer("/spec/install/spec/deployments/0/spec")
        .expect("CSV deployment")
        .clone();
    let spec: k8s_openapi::api::apps::v1::DeploymentSpec =
        serde_json::from_value(spec).expect("typed");
    let pod = spec.template.spec.expect("pod");
    assert_hardened("CSV", &pod, &[]);
}
