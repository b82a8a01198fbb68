//! The Deployment running a WorkerSet's workers: the engine (vLLM or the mock) and the kvroute
//! sidecar in one pod, GPU requests, node selector and tolerations, the user's pod settings
//! (env, volumes, pull secrets, affinity, spread, priority) passed through, and a template hash
//! that rolls the pods on any change that affects them.
//!
//! Hardening ([`crate::desired::hardening`]): no service-account token (neither container
//! calls the API), RuntimeDefault seccomp, no capabilities or privilege escalation anywhere;
//! the sidecar and the mock engine run non-root on a read-only root filesystem (the upstream
//! vLLM image keeps its root user and writable caches). vLLM's KV-event sockets stay inside
//! the pod: the PUB socket connects to the sidecar's SUB bound on 127.0.0.1 and the replay
//! ROUTER binds 127.0.0.1 ([`kv_events_config`]).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvroute_crds::gpu::{GPU_PRODUCT_LABEL, GPU_RESOURCE};
use kvroute_crds::workerset::{
    DEFAULT_VLLM_IMAGE, EngineMode, InferenceWorkerSet, InferenceWorkerSetSpec, SHM_MOUNT_PATH,
    SHM_VOLUME,
};

use super::{ENGINE_CONTAINER, Meta, SIDECAR_CONTAINER, labels, meta, selector_labels};
use crate::desired::hardening::{
    pod_security, resources as resources_of, restricted, unprivileged, with_defaults,
};
use crate::desired::{
    DesiredError, MODEL_ANNOTATION, OperatorConfig, TEMPLATE_HASH_ANNOTATION, owner_ref,
};

/// Default CPU request of a vLLM engine container (`spec.resources` overrides each value).
pub const VLLM_CPU: &str = "4";
/// Default memory request of a vLLM engine container.
pub const VLLM_MEMORY: &str = "16Gi";
/// Default memory limit of a vLLM engine container (no CPU limit: throttling the engine's
/// scheduler and tokenizer threads costs latency).
pub const VLLM_MEMORY_LIMIT: &str = "64Gi";
/// Default CPU request of a mock engine container.
pub const MOCK_CPU: &str = "100m";
/// Default memory request of a mock engine container.
pub const MOCK_MEMORY: &str = "64Mi";
/// Default memory limit of a mock engine container.
pub const MOCK_MEMORY_LIMIT: &str = "512Mi";
/// CPU request of the sidecar.
pub const SIDECAR_CPU: &str = "100m";
/// Memory request of the sidecar.
pub const SIDECAR_MEMORY: &str = "128Mi";
/// Memory limit of the sidecar.
pub const SIDECAR_MEMORY_LIMIT: &str = "1Gi";

/// vLLM's `--kv-events-config`, loopback only: no other pod may read the prompts' token ids.
/// vLLM binds its PUB endpoint only when the host is `*` or `::` and connects otherwise, so
/// with `tcp://127.0.0.1:<port>` it connects to the sidecar, which binds its SUB socket there
/// (`KVROUTE_SIDECAR_ZMQ_BIND`); the replay ROUTER socket is always bound, here on
/// 127.0.0.1. Empty topic, as the sidecar expects.
pub fn kv_events_config(spec: &InferenceWorkerSetSpec) -> String {
    serde_json::json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": format!("tcp://127.0.0.1:{}", spec.kv_events.port),
        "replay_endpoint": format!("tcp://127.0.0.1:{}", spec.kv_events.replay_port),
        "topic": "",
    })
    .to_string()
}

/// Engine command and arguments: `vllm serve <model> ...` or `kvroute-mock-vllm ...` with the
/// vLLM-style flags the mock accepts.
pub fn engine_command(spec: &InferenceWorkerSetSpec) -> (Vec<String>, Vec<String>) {
    let mut args = Vec::new();
    let command = match spec.engine.mode {
        EngineMode::Vllm => {
            args.push(spec.model.load_from().to_string());
            vec!["vllm".to_string(), "serve".to_string()]
        }
        EngineMode::Mock => {
            // The mock takes vLLM's deprecated `--model` flag rather than a positional.
            args.push("--model".to_string());
            args.push(spec.model.load_from().to_string());
            vec!["kvroute-mock-vllm".to_string()]
        }
    };
    let flag = |args: &mut Vec<String>, k: &str, v: String| {
        args.push(k.to_string());
        args.push(v);
    };
    flag(
        &mut args,
        "--served-model-name",
        spec.model.served().to_string(),
    );
    flag(&mut args, "--host", "0.0.0.0".to_string());
    flag(&mut args, "--port", spec.engine.port.to_string());
    flag(&mut args, "--block-size", spec.block_size.to_string());
    args.push("--enable-prefix-caching".to_string());
    flag(&mut args, "--kv-events-config", kv_events_config(spec));
    args.push("--enable-prompt-tokens-details".to_string());
    match spec.engine.mode {
        EngineMode::Vllm if spec.gpu.count > 1 => {
            flag(
                &mut args,
                "--tensor-parallel-size",
                spec.gpu.count.to_string(),
            );
        }
        EngineMode::Mock => {
            if let Some(speedup) = spec.engine.speedup {
                flag(&mut args, "--speedup", speedup.to_string());
            }
        }
        EngineMode::Vllm => {}
    }
    args.extend(spec.engine.args.iter().cloned());
    (command, args)
}

fn http_probe(path: &str, port: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String(port.to_string()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(5),
        ..Default::default()
    }
}

fn port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_string()),
        container_port: port,
        protocol: Some("TCP".to_string()),
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

fn env_field(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `None` for an empty list, so that a spec without the field renders (and hashes) as before.
fn non_empty<T>(items: Vec<T>) -> Option<Vec<T>> {
    (!items.is_empty()).then_some(items)
}

fn engine_container(spec: &InferenceWorkerSetSpec, cfg: &OperatorConfig) -> Container {
    let (command, args) = engine_command(spec);
    let gpu = spec.engine.mode == EngineMode::Vllm;
    let image = spec
        .engine
        .image
        .clone()
        .unwrap_or_else(|| match spec.engine.mode {
            EngineMode::Vllm => DEFAULT_VLLM_IMAGE.to_string(),
            EngineMode::Mock => cfg.mock_image.clone(),
        });
    let mut resources = spec.resources.clone().unwrap_or_default();
    if gpu {
        let count = Quantity(spec.gpu.count.to_string());
        resources
            .limits
            .get_or_insert_with(BTreeMap::new)
            .insert(GPU_RESOURCE.to_string(), count.clone());
        resources
            .requests
            .get_or_insert_with(BTreeMap::new)
            .insert(GPU_RESOURCE.to_string(), count);
    }
    let defaults = match spec.engine.mode {
        EngineMode::Vllm => resources_of(VLLM_CPU, VLLM_MEMORY, None, VLLM_MEMORY_LIMIT),
        EngineMode::Mock => resources_of(MOCK_CPU, MOCK_MEMORY, Some("1"), MOCK_MEMORY_LIMIT),
    };
    let resources = with_defaults(Some(resources), defaults);
    // Model loading takes minutes on a real GPU: the startup probe allows 30 minutes before the
    // liveness probe starts counting, so a slow download never ends in a restart loop.
    let startup_failures = if gpu { 180 } else { 60 };
    Container {
        name: ENGINE_CONTAINER.to_string(),
        image: Some(image),
        command: Some(command),
        args: Some(args),
        // The KV-event ports are loopback-only inside the pod: not container ports.
        ports: Some(vec![port("http", spec.engine.port)]),
        resources: Some(resources),
        security_context: Some(match spec.engine.mode {
            EngineMode::Vllm => unprivileged(),
            EngineMode::Mock => restricted(),
        }),
        startup_probe: Some(http_probe("/health", "http", 10, startup_failures)),
        readiness_probe: Some(http_probe("/health", "http", 5, 3)),
        liveness_probe: Some(http_probe("/health", "http", 10, 6)),
        env: non_empty(spec.env.clone()),
        env_from: non_empty(spec.env_from.clone()),
        volume_mounts: non_empty(
            gpu.then(|| VolumeMount {
                name: SHM_VOLUME.to_string(),
                mount_path: SHM_MOUNT_PATH.to_string(),
                ..Default::default()
            })
            .into_iter()
            .chain(spec.volume_mounts.iter().cloned())
            .collect(),
        ),
        ..Default::default()
    }
}

fn sidecar_container(
    ws_name: &str,
    spec: &InferenceWorkerSetSpec,
    cfg: &OperatorConfig,
) -> Container {
    let mut envs = vec![
        env_field("KVROUTE_SIDECAR_POD_NAME", "metadata.name"),
        env_field("KVROUTE_SIDECAR_POD_NAMESPACE", "metadata.namespace"),
        env_field("KVROUTE_SIDECAR_POD_IP", "status.podIP"),
        env(
            "KVROUTE_SIDECAR_WORKER_ADDRESS",
            format!("$(KVROUTE_SIDECAR_POD_IP):{}", spec.engine.port),
        ),
        env("KVROUTE_SIDECAR_WORKER_SET", ws_name),
        env("KVROUTE_SIDECAR_MODEL", spec.model.served()),
        env("KVROUTE_SIDECAR_BLOCK_SIZE", spec.block_size.to_string()),
        env(
            "KVROUTE_SIDECAR_VLLM_URL",
            format!("http://127.0.0.1:{}", spec.engine.port),
        ),
        env(
            "KVROUTE_SIDECAR_ZMQ_ENDPOINT",
            format!("tcp://127.0.0.1:{}", spec.kv_events.port),
        ),
        env(
            "KVROUTE_SIDECAR_REPLAY_ENDPOINT",
            format!("tcp://127.0.0.1:{}", spec.kv_events.replay_port),
        ),
        env("KVROUTE_SIDECAR_ZMQ_BIND", "true"),
        env("KVROUTE_SIDECAR_TOPIC", ""),
        env(
            "KVROUTE_SIDECAR_ADMIN_ADDR",
            format!("0.0.0.0:{}", spec.sidecar.admin_port),
        ),
    ];
    match &spec.sidecar.router_address {
        Some(addr) => envs.push(env("KVROUTE_SIDECAR_ROUTER", addr.clone())),
        None => envs.push(env("KVROUTE_SIDECAR_ROUTER_DNS", cfg.router_ingest_dns())),
    }
    Container {
        name: SIDECAR_CONTAINER.to_string(),
        image: Some(
            spec.sidecar
                .image
                .clone()
                .unwrap_or_else(|| cfg.sidecar_image.clone()),
        ),
        command: Some(vec!["kvroute-sidecar".to_string()]),
        env: Some(envs),
        ports: Some(vec![port("admin", spec.sidecar.admin_port)]),
        readiness_probe: Some(http_probe("/healthz", "admin", 5, 3)),
        liveness_probe: Some(http_probe("/healthz", "admin", 10, 6)),
        resources: Some(resources_of(
            SIDECAR_CPU,
            SIDECAR_MEMORY,
            Some("1"),
            SIDECAR_MEMORY_LIMIT,
        )),
        security_context: Some(restricted()),
        ..Default::default()
    }
}

fn pod_spec(name: &str, spec: &InferenceWorkerSetSpec, cfg: &OperatorConfig) -> PodSpec {
    let gpu = spec.engine.mode == EngineMode::Vllm;
    let mut node_selector = spec.node_selector.clone();
    let mut tolerations = spec.tolerations.clone();
    if gpu {
        node_selector.insert(GPU_PRODUCT_LABEL.to_string(), spec.gpu.product.clone());
        let gpu_taint = |t: &Toleration| t.key.as_deref() == Some(GPU_RESOURCE);
        if !tolerations.iter().any(gpu_taint) {
            tolerations.push(Toleration {
                key: Some(GPU_RESOURCE.to_string()),
                operator: Some("Exists".to_string()),
                effect: Some("NoSchedule".to_string()),
                ..Default::default()
            });
        }
    }
    let mut pod = PodSpec {
        containers: vec![
            engine_container(spec, cfg),
            sidecar_container(name, spec, cfg),
        ],
        node_selector: (!node_selector.is_empty()).then_some(node_selector),
        tolerations: (!tolerations.is_empty()).then_some(tolerations),
        // vLLM needs a large /dev/shm for tensor-parallel workers. The user's volumes come
        // after the operator's; `validate()` keeps their names apart.
        volumes: non_empty(
            gpu.then(|| Volume {
                name: SHM_VOLUME.to_string(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .into_iter()
            .chain(spec.volumes.iter().cloned())
            .collect(),
        ),
        image_pull_secrets: non_empty(spec.image_pull_secrets.clone()),
        affinity: spec.affinity.clone(),
        topology_spread_constraints: non_empty(spec.topology_spread_constraints.clone()),
        priority_class_name: spec.priority_class_name.clone(),
        termination_grace_period_seconds: Some(30),
        // Neither the engine nor the sidecar calls the Kubernetes API.
        automount_service_account_token: Some(false),
        // The upstream vLLM image runs as root; the mock and the sidecar are non-root anyway.
        security_context: Some(pod_security(!gpu)),
        ..Default::default()
    };
    if gpu {
        super::gpu_stats::expose_engine_gpus(&mut pod);
    }
    pod
}

/// Stable 64-bit hash (xxh3) of a pod template, hex encoded.
pub fn template_hash(template: &PodTemplateSpec) -> String {
    let bytes = serde_json::to_vec(template).unwrap_or_default();
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
}

/// The Deployment running the workers.
pub fn desired_deployment(
    ws: &InferenceWorkerSet,
    cfg: &OperatorConfig,
) -> Result<Deployment, DesiredError> {
    let Meta { name, namespace } = meta(ws)?;
    let spec = &ws.spec;
    let mut template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(&name)),
            annotations: Some(BTreeMap::from([(
                MODEL_ANNOTATION.to_string(),
                spec.model.served().to_string(),
            )])),
            ..Default::default()
        }),
        spec: Some(pod_spec(&name, spec, cfg)),
    };
    let hash = template_hash(&template);
    if let Some(annotations) = template
        .metadata
        .as_mut()
        .and_then(|m| m.annotations.as_mut())
    {
        annotations.insert(TEMPLATE_HASH_ANNOTATION.to_string(), hash);
    }
    // Spare GPUs are rare: a GPU rollout replaces one pod at a time without surging; mock
    // workers surge like any stateless app.
    let (surge, unavailable) = match spec.engine.mode {
        EngineMode::Vllm => (IntOrString::Int(0), IntOrString::Int(1)),
        EngineMode::Mock => (IntOrString::String("25%".to_string()), IntOrString::Int(0)),
    };
    Ok(Deployment {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace),
            labels: Some(labels(&name)),
            annotations: Some(BTreeMap::from([(
                MODEL_ANNOTATION.to_string(),
                spec.model.served().to_string(),
            )])),
            owner_references: Some(vec![owner_ref(ws)?]),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(spec.replicas),
            selector: LabelSelector {
                match_labels: Some(selector_labels(&name)),
                ..Default::default()
            },
            template,
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(surge),
                    max_unavailable: Some(unavailable),
                }),
            }),
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{cfg, ws};
    use super::*;

    fn containers(d: &Deployment) -> Vec<Container> {
        d.spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .map(|s| s.containers.clone())
            .unwrap_or_default()
    }

    fn env_of(c: &Container, name: &str) -> Option<String> {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    }

    #[test]
    fn gpu_worker_set_gets_vllm_flags_gpus_selector_and_tolerations() {
        let w = ws(
            "model: {name: Qwen/Qwen3-32B-FP8, servedName: qwen3}\nreplicas: 3\nblockSize: 32\nengine: {args: [--max-model-len, '8192']}\n",
        );
        let d = desired_deployment(&w, &cfg()).expect("builds");
        let spec = d.spec.as_ref().expect("spec");
        assert_eq!(spec.replicas, Some(3));
        let c = containers(&d);
        assert_eq!(c.len(), 2);
        let engine = &c[0];
        assert_eq!(engine.image.as_deref(), Some(DEFAULT_VLLM_IMAGE));
        // Wrapped by gpu_stats.rs: `/bin/sh -c <list GPUs> <name> vllm serve`.
        let command = engine.command.clone().expect("command");
        assert_eq!(command[4..], ["vllm".to_string(), "serve".to_string()]);
        let args = engine.args.clone().expect("args");
        assert_eq!(args[0], "Qwen/Qwen3-32B-FP8");
        let after = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        assert_eq!(after("--served-model-name").as_deref(), Some("qwen3"));
        assert_eq!(after("--block-size").as_deref(), Some("32"));
        assert_eq!(after("--port").as_deref(), Some("8000"));
        assert!(args.contains(&"--enable-prefix-caching".to_string()));
        assert!(args.contains(&"--enable-prompt-tokens-details".to_string()));
        assert_eq!(
            args[args.len() - 2..],
            ["--max-model-len".to_string(), "8192".to_string()]
        );
        let kv: serde_json::Value =
            serde_json::from_str(&after("--kv-events-config").expect("kv config")).expect("json");
        assert_eq!(
            kv,
            serde_json::json!({"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557",
                               "replay_endpoint": "tcp://127.0.0.1:5657", "topic": ""})
        );
        let limits = engine
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits.get(GPU_RESOURCE), Some(&Quantity("1".into())));
        let pod = spec.template.spec.as_ref().expect("pod spec");
        assert_eq!(
            pod.node_selector
                .as_ref()
                .and_then(|n| n.get(GPU_PRODUCT_LABEL))
                .map(String::as_str),
            Some("NVIDIA-L40S")
        );
        let tol = &pod.tolerations.as_ref().expect("tolerations")[0];
        assert_eq!(
            (tol.key.as_deref(), tol.effect.as_deref()),
            (Some(GPU_RESOURCE), Some("NoSchedule"))
        );
        assert!(engine.readiness_probe.is_some() && engine.startup_probe.is_some());
        let owner = &d.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("InferenceWorkerSet", Some(true))
        );
    }

    #[test]
    fn sidecar_is_told_identity_model_ports_and_router() {
        let w = ws(
            "model: {name: m}\nengine: {mode: mock, port: 8100}\nkvEvents: {port: 6001, replayPort: 6002}\n",
        );
        let d = desired_deployment(&w, &cfg()).expect("builds");
        let sidecar = &containers(&d)[1];
        assert_eq!(
            sidecar.command.as_deref(),
            Some(&["kvroute-sidecar".to_string()][..])
        );
        assert_eq!(
            sidecar.image.as_deref(),
            Some("ghcr.io/kvroute/sidecar:test")
        );
        let pod_name = sidecar
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "KVROUTE_SIDECAR_POD_NAME")
            .expect("pod name");
        assert_eq!(
            pod_name
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str()),
            Some("metadata.name")
        );
        assert_eq!(
            env_of(sidecar, "KVROUTE_SIDECAR_MODEL").as_deref(),
            Some("m")
        );
        assert_eq!(
            env_of(sidecar, "KVROUTE_SIDECAR_ZMQ_ENDPOINT").as_deref(),
            Some("tcp://127.0.0.1:6001")
        );
        assert_eq!(
            env_of(sidecar, "KVROUTE_SIDECAR_REPLAY_ENDPOINT").as_deref(),
            Some("tcp://127.0.0.1:6002")
        );
        assert_eq!(
            env_of(sidecar, "KVROUTE_SIDECAR_VLLM_URL").as_deref(),
            Some("http://127.0.0.1:8100")
        );
        assert_eq!(
            env_of(sidecar, "KVROUTE_SIDECAR_WORKER_ADDRESS").as_deref(),
            Some("$(KVROUTE_SIDECAR_POD_IP):8100")
        );
        assert_eq!(
            env_of(sidecar, "KVROUTE_SIDECAR_ROUTER_DNS").as_deref(),
            Some("kvroute-router-ingest.kvroute-system.svc:9000")
        );
        let w = ws("model: {name: m}\nsidecar: {routerAddress: 'http://10.0.0.1:9000'}\n");
        let sidecar = &containers(&desired_deployment(&w, &cfg()).expect("builds"))[1];
        assert_eq!(
            env_of(sidecar, "KVROUTE_SIDECAR_ROUTER").as_deref(),
            Some("http://10.0.0.1:9000")
        );
        assert_eq!(env_of(sidecar, "KVROUTE_SIDECAR_ROUTER_DNS"), None);
    }

    #[test]
    fn mock_engine_has_no_gpu_requests_or_selector_and_gets_speedup() {
        let w =
            ws("model: {name: m}\nengine: {mode: mock, speedup: 20}\nnodeSelector: {pool: cpu}\n");
        let d = desired_deployment(&w, &cfg()).expect("builds");
        let engine = &containers(&d)[0];
        assert_eq!(
            engine.image.as_deref(),
            Some("ghcr.io/kvroute/mock-vllm:test")
        );
        assert_eq!(
            engine.command.as_deref(),
            Some(&["kvroute-mock-vllm".to_string()][..])
        );
        let args = engine.args.clone().expect("args");
        assert_eq!(
            args.iter()
                .position(|a| a == "--speedup")
                .map(|i| args[i + 1].as_str()),
            Some("20")
        );
        assert!(args.contains(&"--enable-prefix-caching".to_string()));
        assert_eq!(args[..2], ["--model".to_string(), "m".to_string()]);
        // No GPU, only the mock's small defaults.
        let r = engine.resources.clone().expect("resources");
        assert!(
            !r.limits
                .clone()
                .unwrap_or_default()
                .contains_key(GPU_RESOURCE)
        );
        assert_eq!(
            r.limits.unwrap_or_default().get("memory"),
            Some(&Quantity(MOCK_MEMORY_LIMIT.into()))
        );
        let pod = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod");
        assert_eq!(
            pod.node_selector,
            Some(BTreeMap::from([("pool".to_string(), "cpu".to_string())]))
        );
        assert!(pod.tolerations.is_none());
        assert!(pod.volumes.is_none());
    }

    #[test]
    fn user_toleration_for_gpu_taint_is_not_duplicated_and_tp_follows_gpu_count() {
        let w = ws(
            "model: {name: m}\ngpu: {count: 4, product: NVIDIA-H100-80GB-HBM3}\ntolerations: [{key: nvidia.com/gpu, operator: Exists}]\n",
        );
        let d = desired_deployment(&w, &cfg()).expect("builds");
        let pod = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("pod");
        assert_eq!(pod.tolerations.as_ref().map(Vec::len), Some(1));
        let args = containers(&d)[0].args.clone().expect("args");
        assert_eq!(
            args.iter()
                .position(|a| a == "--tensor-parallel-size")
                .map(|i| args[i + 1].as_str()),
            Some("4")
        );
    }

    #[test]
    fn spec_changes_change_the_template_hash_but_scaling_does_not() {
        let hash = |yaml: &str| {
            let d = desired_deployment(&ws(yaml), &cfg()).expect("builds");
            d.spec
                .and_then(|s| s.template.metadata)
                .and_then(|m| m.annotations)
                .and_then(|a| a.get(TEMPLATE_HASH_ANNOTATION).cloned())
                .expect("hash annotation")
        };
        let base = hash("model: {name: m}\n");
        assert_eq!(base, hash("model: {name: m}\nreplicas: 7\n"));
        assert_ne!(base, hash("model: {name: m}\nblockSize: 32\n"));
        assert_ne!(base, hash("model: {name: m}\nengine: {args: [--x]}\n"));
        assert_ne!(base, hash("model: {name: m}\npriorityClassName: high\n"));
        assert_ne!(base, hash("model: {name: m}\nenv: [{name: A, value: b}]\n"));
    }

    const POD_SETTINGS: &str = r#"
model: {name: meta-llama/Llama-3.1-8B-Instruct}
engine: {args: [--max-model-len, '8192']}
resources:
  requests: {cpu: '8', memory: 64Gi}
  limits: {memory: 96Gi}
env:
- name: HF_TOKEN
  valueFrom: {secretKeyRef: {name: hf-token, key: token}}
- {name: VLLM_LOGGING_LEVEL, value: DEBUG}
envFrom: [{configMapRef: {name: engine-env}}]
volumes:
- name: model-cache
  persistentVolumeClaim: {claimName: model-cache}
volumeMounts:
- {name: model-cache, mountPath: /root/.cache/huggingface}
imagePullSecrets: [{name: registry}]
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector: {matchLabels: {app: x}}
topologySpreadConstraints:
- {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
priorityClassName: inference-high
"#;

    #[test]
    fn pod_settings_pass_through_to_the_engine_and_the_pod() {
        let w = ws(POD_SETTINGS);
        assert!(w.spec.validate().is_empty(), "{:?}", w.spec.validate());
        let d = desired_deployment(&w, &cfg()).expect("builds");
        let pod = d
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.clone())
            .expect("pod");
        let engine = &pod.containers[0];
        let env = engine.env.clone().expect("env");
        assert_eq!(env, w.spec.env);
        let token = env[0]
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("secret ref");
        assert_eq!(
            (token.name.as_str(), token.key.as_str()),
            ("hf-token", "token")
        );
        assert_eq!(engine.env_from.as_ref(), Some(&w.spec.env_from));
        // The operator's /dev/shm first, then the user's mounts and volumes, then the GPU
        // list the sidecar reads (docs/gpu.md).
        let mounts: Vec<_> = engine
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.as_str(), m.mount_path.as_str()))
            .collect();
        assert_eq!(
            mounts,
            [
                ("dshm", "/dev/shm"),
                ("model-cache", "/root/.cache/huggingface"),
                ("kvroute-gpu", "/run/kvroute/gpu")
            ]
        );
        let volumes = pod.volumes.clone().expect("volumes");
        assert_eq!(volumes.len(), 3);
        assert_eq!(volumes[1], w.spec.volumes[0]);
        assert_eq!(
            volumes[1]
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str()),
            Some("model-cache")
        );
        assert_eq!(
            pod.image_pull_secrets.as_ref(),
            Some(&w.spec.image_pull_secrets)
        );
        assert_eq!(pod.affinity, w.spec.affinity);
        assert!(pod.affinity.is_some());
        assert_eq!(
            pod.topology_spread_constraints.as_ref(),
            Some(&w.spec.topology_spread_constraints)
        );
        assert_eq!(pod.priority_class_name.as_deref(), Some("inference-high"));
        // CPU and memory pass through next to the GPU the operator adds.
        let resources = engine.resources.clone().expect("resources");
        let requests = resources.requests.expect("requests");
        assert_eq!(requests.get("cpu"), Some(&Quantity("8".into())));
        assert_eq!(requests.get("memory"), Some(&Quantity("64Gi".into())));
        assert_eq!(requests.get(GPU_RESOURCE), Some(&Quantity("1".into())));
        let limits = resources.limits.expect("limits");
        assert_eq!(limits.get("memory"), Some(&Quantity("96Gi".into())));
        assert_eq!(limits.get(GPU_RESOURCE), Some(&Quantity("1".into())));
        let args = engine.args.clone().expect("args");
        assert_eq!(args[args.len() - 2..], ["--max-model-len", "8192"]);
        // The sidecar gets none of the engine's env or mounts, only the GPU list.
        let sidecar = &pod.containers[1];
        assert!(sidecar.env.iter().flatten().all(|e| e.name != "HF_TOKEN"));
        let sidecar_mounts: Vec<_> = sidecar
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(sidecar_mounts, ["kvroute-gpu"]);
    }

    #[test]
    fn mock_engine_gets_user_volumes_without_the_shm_volume() {
        let w = ws(
            "model: {name: m}\nengine: {mode: mock}\nvolumes: [{name: cache, emptyDir: {}}]\nvolumeMounts: [{name: cache, mountPath: /cache}]\n",
        );
        let d = desired_deployment(&w, &cfg()).expect("builds");
        let pod = d.spec.and_then(|s| s.template.spec).expect("pod");
        let names: Vec<_> = pod
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(names, ["cache"]);
        let mounts = pod.containers[0].volume_mounts.clone().expect("mounts");
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].mount_path, "/cache");
    }

    #[test]
    fn missing_uid_is_an_error_not_a_panic() {
        let mut w = ws("model: {name: m}\n");
        w.metadata.uid = None;
        assert_eq!(
            desired_deployment(&w, &cfg()).unwrap_err(),
            DesiredError::MissingMetadata("name or uid")
        );
    }
}
