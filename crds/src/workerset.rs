//! `InferenceWorkerSet`: a group of identical vLLM workers serving one model, each pod a vLLM
//! engine plus the kvroute sidecar that streams its KV-cache events to the router.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvFromSource, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
    TopologySpreadConstraint, Volume, VolumeMount,
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::gpu::{DEFAULT_GPU_PRODUCT, is_known_product, known_gpu_products};
use crate::validation::{SpecIssue, is_dns_label};

/// vLLM image used when `spec.engine.image` is empty and the engine mode is `vllm`.
pub const DEFAULT_VLLM_IMAGE: &str = "vllm/vllm-openai:v0.33.0";
/// Default HTTP port of the engine (vLLM's own default).
pub const DEFAULT_ENGINE_PORT: i32 = 8000;
/// Default KV-event PUB port (vLLM's default `tcp://*:5557`).
pub const DEFAULT_KV_EVENTS_PORT: i32 = 5557;
/// Default KV-event replay (ROUTER) port; far from the PUB port because data-parallel ranks add
/// their rank to both.
pub const DEFAULT_KV_REPLAY_PORT: i32 = 5657;
/// Default sidecar admin port (`/metrics`, `/healthz`, `/readyz`).
pub const DEFAULT_SIDECAR_ADMIN_PORT: i32 = 9090;
/// Default KV block size in tokens (vLLM's CUDA default).
pub const DEFAULT_BLOCK_SIZE: i32 = 16;

/// Desired state of an InferenceWorkerSet: which model to serve, on how many workers, on which
/// GPUs, and how the kvroute sidecar next to each engine is configured.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "kvroute.dev",
    version = "v1alpha1",
    kind = "InferenceWorkerSet",
    plural = "inferenceworkersets",
    namespaced,
    status = "InferenceWorkerSetStatus",
    shortname = "iws",
    category = "kvroute",
    derive = "PartialEq",
    doc = "A set of identical vLLM workers (one GPU pod each) serving one model, each with a kvroute sidecar reporting its KV cache to the router.",
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model.name"),
    printcolumn(name = "Engine", type_ = "string", json_path = ".spec.engine.mode"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.engine.port != self.kvEvents.port && self.engine.port != self.kvEvents.replayPort && self.engine.port != self.sidecar.adminPort", "message": "engine.port must differ from kvEvents.port, kvEvents.replayPort and sidecar.adminPort"},
    {"rule": "self.sidecar.adminPort != self.kvEvents.port && self.sidecar.adminPort != self.kvEvents.replayPort", "message": "sidecar.adminPort must differ from the KV event ports"}
]))]
pub struct InferenceWorkerSetSpec {
    /// The model every worker serves.
    pub model: ModelSpec,
    /// Number of workers (pods). Changed by `kubectl scale` through the scale subresource.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 1024))]
    pub replicas: i32,
    /// The inference engine: real vLLM or the kvroute mock worker.
    #[serde(default)]
    pub engine: EngineSpec,
    /// KV-cache block size in tokens, passed to vLLM as `--block-size`; the router hashes
    /// prompts in blocks of this size.
    #[serde(default = "default_block_size")]
    #[schemars(range(min = 1, max = 4096))]
    pub block_size: i32,
    /// GPUs per worker and their product. Ignored for `engine.mode: mock`.
    #[serde(default)]
    pub gpu: GpuSpec,
    /// Extra CPU/memory requests and limits for the engine container. GPU limits come from
    /// `gpu.count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Tolerations added to the pods. The `nvidia.com/gpu` NoSchedule taint is tolerated
    /// automatically for GPU engines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Extra node selector labels, merged with the GPU product selector.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Environment variables of the engine container, e.g. `HF_TOKEN` from a Secret
    /// (`valueFrom.secretKeyRef`) for a gated model. Names starting with `KVROUTE_` are
    /// reserved (kvroute's own binaries read their settings from them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "env_schema")]
    pub env: Vec<EnvVar>,
    /// Whole ConfigMaps or Secrets exposed as environment variables of the engine container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "env_from_schema")]
    pub env_from: Vec<EnvFromSource>,
    /// Extra pod volumes, e.g. a PersistentVolumeClaim holding the model-weight cache. Names
    /// starting with `kvroute-` and the name `dshm` are reserved for the operator's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "volumes_schema")]
    pub volumes: Vec<Volume>,
    /// Mounts of pod volumes into the engine container, e.g. the weight cache at
    /// `/root/.cache/huggingface`. `/dev/shm` is the operator's on GPU engines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "volume_mounts_schema")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Secrets for pulling the engine and sidecar images from a private registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Node and pod (anti-)affinity of the worker pods, e.g. to spread workers over nodes or
    /// keep them near a cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "affinity_schema")]
    pub affinity: Option<Affinity>,
    /// How worker pods spread over zones or nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "spread_schema")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// PriorityClass of the worker pods (GPU workers often preempt batch jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
    /// The kvroute sidecar next to each engine.
    #[serde(default)]
    pub sidecar: SidecarSpec,
    /// Ports of vLLM's ZMQ KV-event publisher (bound on the pod, read by the sidecar over
    /// localhost).
    #[serde(default)]
    pub kv_events: KvEventsSpec,
}

/// The model served by the workers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Model identifier, e.g. the Hugging Face repository `Qwen/Qwen3-0.6B`. It selects the
    /// tokenizer and is the name clients ask for unless `servedName` is set.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Name exposed by the OpenAI API (`--served-model-name`); defaults to `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub served_name: Option<String>,
    /// Where the engine loads weights from (a local path or a repository id) when it differs
    /// from `name`; passed as the positional model argument of `vllm serve`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub source: Option<String>,
    /// Where the router loads the model's tokenizer from (tokenizer.json, tokenizer_config.json
    /// and the chat template). Default: the Hugging Face repository `source` (when it is a
    /// repository id, not a path or URL), else `name`, at revision `main`, without a token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerSpec>,
}

/// Prefix of environment variable names reserved for kvroute's binaries (`KVROUTE_<COMPONENT>_`
/// flags of the mock engine and the sidecar).
pub const RESERVED_ENV_PREFIX: &str = "KVROUTE_";
/// Prefix of volume names reserved for volumes the operator adds to worker pods.
pub const RESERVED_VOLUME_PREFIX: &str = "kvroute-";
/// The operator's shared-memory volume on GPU engines (vLLM's tensor-parallel workers need a
/// large `/dev/shm`).
pub const SHM_VOLUME: &str = "dshm";
/// Where [`SHM_VOLUME`] is mounted in the engine container.
pub const SHM_MOUNT_PATH: &str = "/dev/shm";
/// Engine flags the operator sets from the spec, with the field to use instead.
pub const RESERVED_ENGINE_FLAGS: &[(&str, &str)] = &[
    ("--model", "set from model.source"),
    ("--served-model-name", "set from model.servedName"),
    ("--host", "the engine listens on 0.0.0.0"),
    ("--port", "set from engine.port"),
    (
        "--block-size",
        "set from blockSize, which the router hashes with",
    ),
    ("--kv-events-config", "set from kvEvents"),
    (
        "--no-enable-prefix-caching",
        "the router routes on prefix caching",
    ),
    ("--tensor-parallel-size", "set from gpu.count"),
    ("-tp", "set from gpu.count"),
    ("--speedup", "set from engine.speedup"),
];

/// Most environment variables a WorkerSet may add to its engine.
pub const MAX_ENV: u32 = 128;
/// Most `envFrom` sources a WorkerSet may add to its engine.
pub const MAX_ENV_FROM: u32 = 16;
/// Most extra volumes (and volume mounts) a WorkerSet may add.
pub const MAX_VOLUMES: u32 = 32;

/// `T`'s schema without descriptions, for the Kubernetes types that the WorkerSet passes
/// through to its pods. Their descriptions are long (the `Volume` schema alone would add over
/// 100 kB to the CRD) and documented upstream (`kubectl explain pod.spec`); the types, required
/// fields and enums stay, so the API server still refuses what the operator could not read
/// back.
fn compact_schema<T: JsonSchema>(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                if map
                    .get("description")
                    .is_some_and(serde_json::Value::is_string)
                {
                    map.remove("description");
                }
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = T::json_schema(generator).to_value();
    strip(&mut value);
    schemars::Schema::try_from(value).unwrap_or_default()
}

/// A list of compact `T` items, at most `max`.
fn compact_list<T: JsonSchema>(
    generator: &mut schemars::SchemaGenerator,
    max: u32,
) -> schemars::Schema {
    let items = compact_schema::<T>(generator);
    schemars::json_schema!({"type": "array", "maxItems": max, "items": items})
}

fn env_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    compact_list::<EnvVar>(generator, MAX_ENV)
}

fn env_from_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    compact_list::<EnvFromSource>(generator, MAX_ENV_FROM)
}

fn volumes_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    compact_list::<Volume>(generator, MAX_VOLUMES)
}

fn volume_mounts_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    compact_list::<VolumeMount>(generator, MAX_VOLUMES)
}

fn spread_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    compact_list::<TopologySpreadConstraint>(generator, 8)
}

/// Schema of `spec.affinity`: a compact `Affinity`.
fn affinity_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    compact_schema::<Affinity>(generator)
}

/// Longest repository id accepted (`owner/name`; the Hub allows 96 characters per part).
pub const MAX_REPO_ID_LEN: usize = 200;

/// Where the router gets a model's tokenizer: exactly one of `hub`, `configMap`, `path`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(has(self.hub) ? 1 : 0) + (has(self.configMap) ? 1 : 0) + (has(self.path) ? 1 : 0) == 1", "message": "set exactly one of hub, configMap, path"},
    {"rule": "!has(self.path) || self.path.startsWith('/')", "message": "path must be absolute"}
]))]
pub struct TokenizerSpec {
    /// A Hugging Face Hub repository (or a mirror: the router's `HF_ENDPOINT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<HubTokenizer>,
    /// A ConfigMap in the router's namespace whose keys are the tokenizer files
    /// (`tokenizer.json`, ...); the operator mounts it into the router pods. ConfigMaps hold
    /// at most 1 MiB, so this suits small vocabularies only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapTokenizer>,
    /// A directory inside the router container that holds the tokenizer files (baked into
    /// the image or mounted by other means).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub path: Option<String>,
}

/// A tokenizer on the Hugging Face Hub.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HubTokenizer {
    /// Repository id, e.g. `Qwen/Qwen3-0.6B`; defaults to the model's repository (see
    /// `model.tokenizer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 200),
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
    )]
    pub repo: Option<String>,
    /// Branch, tag or commit; defaults to `main`. Pin a commit so that every router replica
    /// tokenizes with the same files the engine loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 255),
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    )]
    pub revision: Option<String>,
    /// The Hub token of a gated or private repository: a key of a Secret in the router's
    /// namespace (pods can mount Secrets of their own namespace only). The operator mounts
    /// it into the router pods; the router reads it on every download attempt, so rotating
    /// the Secret needs no restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<TokenSecretRef>,
}

/// A key of a Secret in the router's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenSecretRef {
    /// Secret name.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Key inside the Secret's data.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// A ConfigMap in the router's namespace holding tokenizer files.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapTokenizer {
    /// ConfigMap name.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub name: String,
}

/// Where a model's tokenizer comes from, with every default applied.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResolvedTokenizer {
    /// A Hugging Face Hub repository.
    Hub {
        /// Repository id.
        repo: String,
        /// Branch, tag or commit.
        revision: String,
        /// Secret key holding the token, if any.
        token: Option<(String, String)>,
    },
    /// A ConfigMap (router namespace), by name.
    ConfigMap(String),
    /// A directory in the router container.
    Path(String),
}

/// Revision used when none is set.
pub const DEFAULT_REVISION: &str = "main";

impl ModelSpec {
    /// The name clients use: `servedName`, or `name`.
    pub fn served(&self) -> &str {
        self.served_name.as_deref().unwrap_or(&self.name)
    }

    /// The positional argument of `vllm serve`: `source`, or `name`.
    pub fn load_from(&self) -> &str {
        self.source.as_deref().unwrap_or(&self.name)
    }

    /// The repository the tokenizer defaults to: `source` when it looks like a Hub
    /// repository id (not an absolute or relative path, not a URL), else `name`.
    pub fn default_tokenizer_repo(&self) -> &str {
        match self.source.as_deref() {
            Some(s) if looks_like_repo_id(s) => s,
            _ => &self.name,
        }
    }

    /// The tokenizer source with defaults applied (see [`ModelSpec::tokenizer`]).
    pub fn tokenizer_source(&self) -> ResolvedTokenizer {
        let spec = self.tokenizer.clone().unwrap_or_default();
        if let Some(cm) = spec.config_map {
            return ResolvedTokenizer::ConfigMap(cm.name);
        }
        if let Some(path) = spec.path {
            return ResolvedTokenizer::Path(path);
        }
        let hub = spec.hub.unwrap_or_default();
        ResolvedTokenizer::Hub {
            repo: hub
                .repo
                .unwrap_or_else(|| self.default_tokenizer_repo().to_string()),
            revision: hub.revision.unwrap_or_else(|| DEFAULT_REVISION.to_string()),
            token: hub.token_secret_ref.map(|r| (r.name, r.key)),
        }
    }
}

/// Which engine runs in each worker pod.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EngineMode {
    /// vLLM on GPUs.
    #[default]
    Vllm,
    /// The kvroute mock worker: vLLM's HTTP and KV-event interfaces without a GPU (tests, demos).
    Mock,
}

/// Engine container settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.mode == 'mock' || !has(self.speedup)", "message": "speedup only applies to engine.mode mock"}
]))]
pub struct EngineSpec {
    /// `vllm` (default) or `mock`.
    #[serde(default)]
    pub mode: EngineMode,
    /// Container image; defaults to the vLLM OpenAI image for `vllm` and to the operator's
    /// `--mock-image` for `mock`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// Extra engine arguments appended after the ones kvroute sets. Flags that kvroute sets
    /// from other fields ([`RESERVED_ENGINE_FLAGS`], e.g. `--block-size`) are rejected: vLLM
    /// takes the last occurrence, so a repeat would silently override the spec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub args: Vec<String>,
    /// HTTP port of the engine's OpenAI API.
    #[serde(default = "default_engine_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Mock only: how many times faster than an L40S the mock worker runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.001, max = 1000000.0))]
    pub speedup: Option<f64>,
}

impl Default for EngineSpec {
    fn default() -> Self {
        Self {
            mode: EngineMode::Vllm,
            image: None,
            args: Vec::new(),
            port: DEFAULT_ENGINE_PORT,
            speedup: None,
        }
    }
}

/// GPU request per worker.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuSpec {
    /// GPUs per worker (`nvidia.com/gpu` limit); vLLM gets `--tensor-parallel-size` when > 1.
    #[serde(default = "default_gpu_count")]
    #[schemars(range(min = 1, max = 16))]
    pub count: i32,
    /// GPU product, matched against the `nvidia.com/gpu.product` node label
    /// (e.g. NVIDIA-L40S, NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3, NVIDIA-L4).
    #[serde(default = "default_gpu_product")]
    #[schemars(length(min = 1, max = 63))]
    pub product: String,
}

impl Default for GpuSpec {
    fn default() -> Self {
        Self {
            count: default_gpu_count(),
            product: default_gpu_product(),
        }
    }
}

/// kvroute sidecar settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSpec {
    /// Sidecar image; defaults to the operator's `--sidecar-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// Port of the sidecar's `/metrics`, `/healthz` and `/readyz`.
    #[serde(default = "default_sidecar_admin_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub admin_port: i32,
    /// gRPC address of the router's ingest endpoint; defaults to the operator-managed router
    /// Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub router_address: Option<String>,
}

impl Default for SidecarSpec {
    fn default() -> Self {
        Self {
            image: None,
            admin_port: DEFAULT_SIDECAR_ADMIN_PORT,
            router_address: None,
        }
    }
}

/// vLLM KV-event publisher ports.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.port != self.replayPort", "message": "kvEvents.port and kvEvents.replayPort must differ"}
]))]
pub struct KvEventsSpec {
    /// ZMQ PUB port for live events.
    #[serde(default = "default_kv_events_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// ZMQ ROUTER port for replaying missed events.
    #[serde(default = "default_kv_replay_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub replay_port: i32,
}

impl Default for KvEventsSpec {
    fn default() -> Self {
        Self {
            port: DEFAULT_KV_EVENTS_PORT,
            replay_port: DEFAULT_KV_REPLAY_PORT,
        }
    }
}

/// Observed state of an InferenceWorkerSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceWorkerSetStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Worker pods that exist (scale subresource `statusReplicasPath`).
    #[serde(default)]
    pub replicas: i32,
    /// Worker pods that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Label selector of the worker pods, as a string (scale subresource `labelSelectorPath`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// One entry per worker pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerStatus>,
    /// `Ready`, `Progressing` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One worker pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerStatus {
    /// Pod name (the worker identity the sidecar reports).
    pub pod: String,
    /// `podIP:enginePort`; absent until the pod has an IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The engine container is ready.
    #[serde(default)]
    pub ready: bool,
    /// The sidecar container is ready (its readiness follows its router connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar_connected: Option<bool>,
}

impl InferenceWorkerSetSpec {
    /// Checks what the schema cannot (or what an old API server does not enforce): the CEL
    /// rules above, a non-blank model name and a known GPU product.
    pub fn validate(&self) -> Vec<SpecIssue> {
        let mut issues = Vec::new();
        if self.model.name.trim().is_empty() {
            issues.push(SpecIssue::new(
                "spec.model.name",
                "model name must not be empty",
            ));
        }
        if self
            .model
            .served_name
            .as_deref()
            .is_some_and(|s| s.trim().is_empty())
        {
            issues.push(SpecIssue::new(
                "spec.model.servedName",
                "served name must not be empty when set",
            ));
        }
        issues.extend(self.model.validate_tokenizer());
        if self.replicas < 0 {
            issues.push(SpecIssue::new("spec.replicas", "replicas must be >= 0"));
        }
        if self.block_size < 1 {
            issues.push(SpecIssue::new("spec.blockSize", "blockSize must be >= 1"));
        }
        let ports = [
            ("spec.engine.port", self.engine.port),
            ("spec.kvEvents.port", self.kv_events.port),
            ("spec.kvEvents.replayPort", self.kv_events.replay_port),
            ("spec.sidecar.adminPort", self.sidecar.admin_port),
        ];
        for (i, (field, port)) in ports.iter().enumerate() {
            if !(1..=65535).contains(port) {
                issues.push(SpecIssue::new(
                    *field,
                    format!("port {port} is outside 1-65535"),
                ));
            }
            if let Some((other, _)) = ports[..i].iter().find(|(_, p)| p == port) {
                issues.push(SpecIssue::new(
                    *field,
                    format!("port {port} is already used by {other}"),
                ));
            }
        }
        issues.extend(self.validate_pod());
        if self.engine.speedup.is_some() && self.engine.mode != EngineMode::Mock {
            issues.push(SpecIssue::new(
                "spec.engine.speedup",
                "speedup only applies to engine.mode mock",
            ));
        }
        if self
            .engine
            .speedup
            .is_some_and(|s| !(s.is_finite() && s > 0.0))
        {
            issues.push(SpecIssue::new(
                "spec.engine.speedup",
                "speedup must be a positive number",
            ));
        }
        if self.engine.mode == EngineMode::Vllm {
            if self.gpu.count < 1 {
                issues.push(SpecIssue::new(
                    "spec.gpu.count",
                    "a vllm engine needs at least one GPU",
                ));
            }
            if !is_known_product(&self.gpu.product) {
                issues.push(SpecIssue::new(
                    "spec.gpu.product",
                    format!(
                        "unknown GPU product {:?}; known products: {}",
                        self.gpu.product,
                        known_gpu_products().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        issues
    }
}

impl InferenceWorkerSetSpec {
    /// What users add to the worker pods must not collide with what the operator sets there:
    /// reserved or repeated env names, reserved or repeated volume names, mounts of volumes
    /// that do not exist or over `/dev/shm` on GPU engines, and engine flags the operator
    /// owns.
    fn validate_pod(&self) -> Vec<SpecIssue> {
        let mut issues = Vec::new();
        for (i, e) in self.env.iter().enumerate() {
            let f = format!("spec.env[{i}].name");
            if e.name.is_empty() {
                issues.push(SpecIssue::new(f, "env name must not be empty"));
            } else if e.name.starts_with(RESERVED_ENV_PREFIX) {
                issues.push(SpecIssue::new(
                    f,
                    format!(
                        "env {:?} is reserved: names starting with {RESERVED_ENV_PREFIX} configure kvroute's own binaries",
                        e.name
                    ),
                ));
            } else if self.env[..i].iter().any(|o| o.name == e.name) {
                issues.push(SpecIssue::new(f, format!("duplicate env {:?}", e.name)));
            }
        }
        for (i, v) in self.volumes.iter().enumerate() {
            let f = format!("spec.volumes[{i}].name");
            if v.name == SHM_VOLUME || v.name.starts_with(RESERVED_VOLUME_PREFIX) {
                issues.push(SpecIssue::new(
                    f,
                    format!(
                        "volume name {:?} is reserved for the operator ({SHM_VOLUME:?} and names starting with {RESERVED_VOLUME_PREFIX:?})",
                        v.name
                    ),
                ));
            } else if !is_dns_label(&v.name) {
                issues.push(SpecIssue::new(
                    f,
                    format!("volume name {:?} is not a DNS-1123 label", v.name),
                ));
            } else if self.volumes[..i].iter().any(|o| o.name == v.name) {
                issues.push(SpecIssue::new(f, format!("duplicate volume {:?}", v.name)));
            }
        }
        let gpu = self.engine.mode == EngineMode::Vllm;
        for (i, m) in self.volume_mounts.iter().enumerate() {
            let at = |f: &str| format!("spec.volumeMounts[{i}].{f}");
            if !self.volumes.iter().any(|v| v.name == m.name) {
                issues.push(SpecIssue::new(
                    at("name"),
                    format!("volume {:?} is not in spec.volumes", m.name),
                ));
            }
            let path = m.mount_path.trim_end_matches('/');
            if !m.mount_path.starts_with('/') {
                issues.push(SpecIssue::new(
                    at("mountPath"),
                    "mountPath must be absolute",
                ));
            } else if gpu && path == SHM_MOUNT_PATH {
                issues.push(SpecIssue::new(
                    at("mountPath"),
                    format!(
                        "{SHM_MOUNT_PATH} is the operator's shared-memory mount on GPU engines"
                    ),
                ));
            } else if self.volume_mounts[..i]
                .iter()
                .any(|o| o.mount_path.trim_end_matches('/') == path)
            {
                issues.push(SpecIssue::new(
                    at("mountPath"),
                    format!("duplicate mountPath {:?}", m.mount_path),
                ));
            }
        }
        for (i, arg) in self.engine.args.iter().enumerate() {
            let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
            if let Some((_, why)) = RESERVED_ENGINE_FLAGS.iter().find(|(r, _)| *r == flag) {
                issues.push(SpecIssue::new(
                    format!("spec.engine.args[{i}]"),
                    format!("{flag} is owned by the operator: {why}"),
                ));
            }
        }
        issues
    }
}

impl ModelSpec {
    /// The CEL twins of [`TokenizerSpec`] and the checks of its patterns.
    fn validate_tokenizer(&self) -> Vec<SpecIssue> {
        let mut issues = Vec::new();
        let Some(t) = &self.tokenizer else {
            return issues;
        };
        let f = "spec.model.tokenizer";
        let set = [t.hub.is_some(), t.config_map.is_some(), t.path.is_some()];
        if set.iter().filter(|s| **s).count() != 1 {
            issues.push(SpecIssue::new(f, "set exactly one of hub, configMap, path"));
        }
        if t.path.as_deref().is_some_and(|p| !p.starts_with('/')) {
            issues.push(SpecIssue::new(format!("{f}.path"), "path must be absolute"));
        }
        if let Some(hub) = &t.hub {
            if hub.repo.as_deref().is_some_and(|r| !looks_like_repo_id(r)) {
                issues.push(SpecIssue::new(
                    format!("{f}.hub.repo"),
                    "repo must be a Hugging Face repository id such as Qwen/Qwen3-0.6B",
                ));
            }
            if hub.revision.as_deref().is_some_and(|r| !is_revision(r)) {
                issues.push(SpecIssue::new(
                    format!("{f}.hub.revision"),
                    "revision must be a branch, tag or commit (letters, digits, . _ - /; no ..)",
                ));
            }
        }
        issues
    }
}

/// A Hub revision safe to put in a URL and a cache path: starts alphanumeric, then
/// alphanumerics and `._-/`, no `..`, at most 255 characters.
pub fn is_revision(s: &str) -> bool {
    s.len() <= 255
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
        && !s.contains("..")
}

/// `owner/name` or `name`, each part starting alphanumeric and made of alphanumerics, `.`, `_`
/// and `-` (what the Hub accepts); never `.`/`..` parts, so it is safe in a URL path.
pub fn looks_like_repo_id(s: &str) -> bool {
    let part = |p: &str| {
        p.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    s.len() <= MAX_REPO_ID_LEN
        && match s.split_once('/') {
            Some((owner, name)) => part(owner) && part(name),
            None => part(s),
        }
        && !s.contains("..")
}

fn default_replicas() -> i32 {
    1
}
fn default_block_size() -> i32 {
    DEFAULT_BLOCK_SIZE
}
fn default_engine_port() -> i32 {
    DEFAULT_ENGINE_PORT
}
fn default_gpu_count() -> i32 {
    1
}
fn default_gpu_product() -> String {
    DEFAULT_GPU_PRODUCT.to_string()
}
fn default_sidecar_admin_port() -> i32 {
    DEFAULT_SIDECAR_ADMIN_PORT
}
fn default_kv_events_port() -> i32 {
    DEFAULT_KV_EVENTS_PORT
}
fn default_kv_replay_port() -> i32 {
    DEFAULT_KV_REPLAY_PORT
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn spec(yaml: &str) -> InferenceWorkerSetSpec {
        serde_saphyr::from_str(yaml).expect("spec parses")
    }

    #[test]
    fn minimal_spec_gets_defaults() {
        let s = spec("model:\n  name: Qwen/Qwen3-0.6B\n");
        assert_eq!(s.replicas, 1);
        assert_eq!(s.block_size, 16);
        assert_eq!(s.engine.mode, EngineMode::Vllm);
        assert_eq!(s.engine.port, 8000);
        assert_eq!(s.gpu.product, "NVIDIA-L40S");
        assert_eq!(s.gpu.count, 1);
        assert_eq!(s.kv_events.port, 5557);
        assert_eq!(s.kv_events.replay_port, 5657);
        assert_eq!(s.model.served(), "Qwen/Qwen3-0.6B");
        assert!(s.validate().is_empty(), "{:?}", s.validate());
    }

    #[test]
    fn unknown_gpu_product_is_an_issue_that_lists_known_ones() {
        let s = spec("model: {name: m}\ngpu: {product: NVIDIA-L40X}\n");
        let issues = s.validate();
        assert_eq!(issues.len(), 1);
        assert_eq!(issues[0].field, "spec.gpu.product");
        assert!(issues[0].message.contains("NVIDIA-L40S"));
    }

    #[test]
    fn mock_engine_ignores_gpu_product() {
        let s =
            spec("model: {name: m}\nengine: {mode: mock, speedup: 10}\ngpu: {product: whatever}\n");
        assert!(s.validate().is_empty());
    }

    #[test]
    fn blank_model_name_is_an_issue() {
        let s = spec("model: {name: '  '}\nengine: {mode: mock}\n");
        assert_eq!(s.validate()[0].field, "spec.model.name");
    }

    #[test]
    fn tokenizer_defaults_to_the_models_repository() {
        let hub = |repo: &str| ResolvedTokenizer::Hub {
            repo: repo.into(),
            revision: "main".into(),
            token: None,
        };
        let s = spec("model: {name: Qwen/Qwen3-0.6B, servedName: qwen3}\n");
        assert_eq!(s.model.tokenizer_source(), hub("Qwen/Qwen3-0.6B"));
        let s = spec("model: {name: qwen3, source: Qwen/Qwen3-8B-FP8}\n");
        assert_eq!(s.model.tokenizer_source(), hub("Qwen/Qwen3-8B-FP8"));
        let s = spec("model: {name: Qwen/Qwen3-8B, source: /models/qwen3-8b}\n");
        assert_eq!(s.model.tokenizer_source(), hub("Qwen/Qwen3-8B"));
        let s = spec("model: {name: Qwen/Qwen3-8B, source: 's3://bucket/qwen'}\n");
        assert_eq!(s.model.tokenizer_source(), hub("Qwen/Qwen3-8B"));
        let s = spec(
            "model:\n  name: meta-llama/Llama-3.1-8B-Instruct\n  tokenizer:\n    hub:\n      revision: 0e9e39f\n      tokenSecretRef: {name: hf-token, key: token}\n",
        );
        assert!(s.validate().is_empty(), "{:?}", s.validate());
        assert_eq!(
            s.model.tokenizer_source(),
            ResolvedTokenizer::Hub {
                repo: "meta-llama/Llama-3.1-8B-Instruct".into(),
                revision: "0e9e39f".into(),
                token: Some(("hf-token".into(), "token".into())),
            }
        );
        let s = spec("model: {name: m, tokenizer: {configMap: {name: tok}}}\n");
        assert_eq!(
            s.model.tokenizer_source(),
            ResolvedTokenizer::ConfigMap("tok".into())
        );
        let s = spec("model: {name: m, tokenizer: {path: /opt/tok}}\n");
        assert_eq!(
            s.model.tokenizer_source(),
            ResolvedTokenizer::Path("/opt/tok".into())
        );
    }

    #[test]
    fn tokenizer_cel_twins() {
        let fields = |yaml: &str| -> Vec<String> {
            spec(yaml).validate().into_iter().map(|i| i.field).collect()
        };
        assert_eq!(
            fields("model: {name: m, tokenizer: {}}\n"),
            vec!["spec.model.tokenizer"]
        );
        assert_eq!(
            fields("model: {name: m, tokenizer: {path: /a, configMap: {name: c}}}\n"),
            vec!["spec.model.tokenizer"]
        );
        assert_eq!(
            fields("model: {name: m, tokenizer: {path: rel/dir}}\n"),
            vec!["spec.model.tokenizer.path"]
        );
        assert_eq!(
            fields("model: {name: m, tokenizer: {hub: {repo: '../etc', revision: 'a/../b'}}}\n"),
            vec![
                "spec.model.tokenizer.hub.repo",
                "spec.model.tokenizer.hub.revision"
            ]
        );
        assert!(looks_like_repo_id("gpt2"));
        assert!(!looks_like_repo_id("a/b/c"));
        assert!(!looks_like_repo_id("/models/x"));
        assert!(is_revision("refs/pr/1"));
        assert!(!is_revision("/main"));
    }

    #[test]
    fn pod_settings_that_clash_with_the_operators_are_issues() {
        let fields = |yaml: &str| -> Vec<String> {
            spec(yaml).validate().into_iter().map(|i| i.field).collect()
        };
        let good = "model: {name: m}\nenv: [{name: HF_TOKEN, valueFrom: {secretKeyRef: {name: s, key: k}}}]\nvolumes: [{name: cache, persistentVolumeClaim: {claimName: c}}]\nvolumeMounts: [{name: cache, mountPath: /root/.cache/huggingface}]\n";
        assert!(fields(good).is_empty(), "{:?}", spec(good).validate());
        assert_eq!(
            fields(
                "model: {name: m}\nenv: [{name: KVROUTE_SIDECAR_MODEL, value: x}, {name: A, value: '1'}, {name: A, value: '2'}]\n"
            ),
            ["spec.env[0].name", "spec.env[2].name"]
        );
        let s = spec(
            "model: {name: m}\nvolumes: [{name: dshm, emptyDir: {}}, {name: kvroute-tokenizer, emptyDir: {}}, {name: Bad_Name, emptyDir: {}}, {name: c, emptyDir: {}}, {name: c, emptyDir: {}}]\n",
        );
        let issues = s.validate();
        let f: Vec<_> = issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(
            f,
            [
                "spec.volumes[0].name",
                "spec.volumes[1].name",
                "spec.volumes[2].name",
                "spec.volumes[4].name"
            ]
        );
        assert!(
            issues[0].message.contains("reserved for the operator"),
            "{}",
            issues[0]
        );
        // /dev/shm is the operator's on GPU engines only; mounts need a declared volume.
        let clash = "volumes: [{name: shm, emptyDir: {}}]\nvolumeMounts: [{name: shm, mountPath: /dev/shm/}, {name: nope, mountPath: /x}, {name: shm, mountPath: rel}]\n";
        assert_eq!(
            fields(&format!("model: {{name: m}}\n{clash}")),
            [
                "spec.volumeMounts[0].mountPath",
                "spec.volumeMounts[1].name",
                "spec.volumeMounts[2].mountPath"
            ]
        );
        assert_eq!(
            fields(&format!(
                "model: {{name: m}}\nengine: {{mode: mock}}\n{clash}"
            )),
            [
                "spec.volumeMounts[1].name",
                "spec.volumeMounts[2].mountPath"
            ]
        );
        let s = spec(
            "model: {name: m}\nengine: {args: [--max-model-len, '8192', '--block-size=32', --port, '9000', --enforce-eager]}\n",
        );
        let issues = s.validate();
        let f: Vec<_> = issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(f, ["spec.engine.args[2]", "spec.engine.args[3]"]);
        assert!(issues[0].message.contains("blockSize"), "{}", issues[0]);
    }

    #[test]
    fn cel_twins_port_clash_and_speedup_without_mock() {
        let s = spec("model: {name: m}\nengine: {port: 5557, speedup: 2}\n");
        let fields: Vec<_> = s.validate().into_iter().map(|i| i.field).collect();
        assert!(
            fields.contains(&"spec.kvEvents.port".to_string()),
            "{fields:?}"
        );
        assert!(
            fields.contains(&"spec.engine.speedup".to_string()),
            "{fields:?}"
        );
        let s = spec("model: {name: m}\nkvEvents: {port: 6000, replayPort: 6000}\n");
        assert_eq!(s.validate()[0].field, "spec.kvEvents.replayPort");
    }
}
