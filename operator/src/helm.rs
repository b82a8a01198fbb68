//! The two Helm charts (`deploy/helm/kvroute-crds`, `deploy/helm/kvroute`), generated from the
//! plain manifests so that the three ways to install (OLM bundle, Helm, `kubectl apply`) cannot
//! drift apart. The chart's templates are the plain manifests' objects with `{{ .Values... }}`
//! written at the fields that values control; rendered with the default values they are the
//! plain manifests again, object by object (checked by `operator/tests/helm.rs`, with and
//! without a real `helm`).
//!
//! ```text
//! kvroute_crds::crds() --(+ helm.sh/resource-policy: keep)--> kvroute-crds/templates/<crd>.yaml
//! bundle::deploy_files() (operator.yaml, rbac.yaml, less the Namespace)
//!        '--slots: image, replicas, resources, env, namespace--> kvroute/templates/*.yaml
//! ChartValues::default() (images, resources, replicas from the same sources)
//!        |--> kvroute/values.yaml (comments from the field docs)
//!        '--> kvroute/values.schema.json (schemars; helm rejects unknown or mistyped values)
//! bundle::examples()[0] --> the optional WorkerSet and Pool (off by default)
//! ```
//!
//! A slot is a placeholder string put into the object's JSON before it is written as YAML;
//! each placeholder line is then replaced by template text. The template syntax used is small
//! on purpose (values, `.Release.Namespace`, `quote`, `eq`/`ne`, `if`/`with`/`else`/`end` on
//! lines of their own, `toYaml ... | nindent N`), so that the test's renderer can stay small.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use kvroute_crds::pool::{IssuerRef, PoolAuthSpec};
use kvroute_crds::workerset::TokenizerSpec;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};

use crate::bundle::{
    DEPLOY_NAMESPACE, MIN_KUBE_VERSION, OPERATOR_NAME, VERSION, deploy_files, examples,
    operator_deployment_spec, operator_image,
};
use crate::generated::{GeneratedFile, HEADER, to_yaml};

/// Directory name of the CRD chart under `deploy/helm/`.
pub const CRDS_CHART: &str = "kvroute-crds";
/// Directory name of the operator chart under `deploy/helm/`.
pub const OPERATOR_CHART: &str = "kvroute";
/// The plain manifests (`deploy/`) whose objects, less the Namespace, are the `kvroute` chart.
pub const CHART_SOURCES: [&str; 2] = ["operator.yaml", "rbac.yaml"];
/// Annotation that keeps the CRDs (and so every custom resource) when the CRD chart is
/// uninstalled: deleting a CRD deletes all its objects.
pub const KEEP_ANNOTATION: (&str, &str) = ("helm.sh/resource-policy", "keep");

/// Values of the `kvroute` chart. The defaults render the plain manifests (`deploy/`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChartValues {
    /// Images of kvroute's components: the operator runs its own and deploys the others.
    pub images: ValuesImages,
    /// The operator's Deployment.
    pub operator: ValuesOperator,
    /// The router the operator deploys (one per installation, in the release namespace).
    pub router: ValuesRouter,
    /// mTLS between sidecars, pickers and the router, and TLS of the router's HTTP gateway.
    pub tls: ValuesTls,
    /// An optional InferenceWorkerSet (the first example of deploy/examples.yaml).
    pub worker_set: ValuesWorkerSet,
    /// An optional InferencePool over that WorkerSet.
    pub pool: ValuesPool,
}

/// The four images.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValuesImages {
    /// The operator's image.
    pub operator: ValuesImage,
    /// The router's image (the operator's KVROUTE_OPERATOR_ROUTER_IMAGE).
    pub router: ValuesImage,
    /// The sidecar's image, next to every worker (KVROUTE_OPERATOR_SIDECAR_IMAGE).
    pub sidecar: ValuesImage,
    /// The mock worker's image for `engine.mode: mock` (KVROUTE_OPERATOR_MOCK_IMAGE).
    pub mock_vllm: ValuesImage,
}

/// One image.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValuesImage {
    /// Registry and repository, e.g. `registry.example.com/kvroute/kvroute-router`.
    #[schemars(length(min = 1))]
    pub repository: String,
    /// Tag.
    #[schemars(length(min = 1))]
    pub tag: String,
}

/// The operator's Deployment.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValuesOperator {
    /// Replicas: one leads (a Lease), the others stand by.
    #[schemars(range(min = 1))]
    pub replicas: i32,
    /// `imagePullPolicy` of the operator container; empty: the Kubernetes default.
    pub pull_policy: PullPolicy,
    /// Namespace whose resources the operator reconciles; empty: all namespaces.
    pub watch_namespace: String,
    /// The operator container's requests and limits.
    pub resources: ResourceRequirements,
    /// Node labels the operator pods must match.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the operator pods.
    pub tolerations: Vec<Toleration>,
    /// Affinity of the operator pods.
    pub affinity: Affinity,
}

/// `imagePullPolicy`, or empty for the Kubernetes default.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
pub enum PullPolicy {
    /// Leave the field out (Kubernetes: `IfNotPresent` for a tag other than `latest`).
    #[serde(rename = "")]
    Default,
    /// Always pull.
    Always,
    /// Pull when not on the node.
    IfNotPresent,
    /// Never pull.
    Never,
}

/// The router's settings the operator takes.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValuesRouter {
    /// Deploy and manage the router (false: run it yourself).
    pub manage: bool,
    /// Router replicas (KVROUTE_OPERATOR_ROUTER_REPLICAS).
    #[schemars(range(min = 1))]
    pub replicas: i32,
    /// GIE InferencePools the router discovers workers from and picks endpoints for
    /// (KVROUTE_OPERATOR_ROUTER_GIE_INFERENCE_POOL: `NAME`, `NS/NAME` or `*`, comma-separated;
    /// empty: off). docs/gateway-api.md.
    pub gie_inference_pool: String,
    /// OTLP/gRPC collector the router sends its routing-decision traces to
    /// (KVROUTE_OPERATOR_ROUTER_OTLP_ENDPOINT, e.g. `http://otel-collector:4317`; empty:
    /// off). docs/tracing.md.
    pub otlp_endpoint: String,
    /// Longest one attempt to fetch a model's tokenizer may take, seconds
    /// (KVROUTE_OPERATOR_ROUTER_TOKENIZER_FETCH_TIMEOUT_SECONDS; 0: the operator's default,
    /// 300). docs/tokenizers.md.
    #[schemars(range(min = 0, max = 86_400))]
    pub tokenizer_fetch_timeout_seconds: u64,
    /// Longest wait between attempts to fetch a tokenizer, seconds
    /// (KVROUTE_OPERATOR_ROUTER_TOKENIZER_RETRY_MAX_SECONDS; 0: the operator's default, 300).
    #[schemars(range(min = 0, max = 86_400))]
    pub tokenizer_retry_max_seconds: u64,
}

/// Where certificates come from.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
pub enum TlsMode {
    /// The operator's own CA (Secrets `kvroute-ca`, `kvroute-mtls`).
    #[serde(rename = "operator")]
    Operator,
    /// cert-manager Certificates from `tls.issuerRef` (the operator creates them).
    #[serde(rename = "cert-manager")]
    CertManager,
    /// No mTLS: the router's gRPC listener is unauthenticated (it says so in
    /// `kvroute_router_grpc_unauthenticated`).
    #[serde(rename = "off")]
    Off,
}

/// TLS settings.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValuesTls {
    /// `operator` (own CA), `cert-manager` (issuer below) or `off`.
    pub mode: TlsMode,
    /// The cert-manager issuer with `mode: cert-manager` (e.g. `{name: my-ca, kind:
    /// ClusterIssuer}`), written on the chart's pool; every pool that names an issuer must
    /// name this one (docs/security.md).
    pub issuer_ref: Option<IssuerRef>,
    /// A `kubernetes.io/tls` Secret in the release namespace: the router terminates the HTTP
    /// gateway's TLS with it (set on the chart's pool); empty: plain HTTP.
    pub gateway_secret_name: String,
}

/// The optional InferenceWorkerSet.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValuesWorkerSet {
    /// Create it.
    pub enabled: bool,
    /// Its name.
    pub name: String,
    /// `spec.model.name`: the Hugging Face repository (or path) vLLM serves.
    pub model: String,
    /// `spec.model.servedName`: the model name clients use.
    pub served_name: String,
    /// Where the router gets the model's tokenizer (`spec.model.tokenizer`: `hub` with
    /// `repo`, `revision`, `tokenSecretRef`; `configMap`; or `path`); empty: the model's
    /// own Hub repository.
    pub tokenizer: TokenizerSpec,
    /// Worker pods.
    pub replicas: i32,
    /// KV-cache block size in tokens.
    pub block_size: u32,
    /// `spec.engine` (mode `vllm` or `mock`, image, args, port, mock speedup).
    #[schemars(with = "kvroute_crds::workerset::EngineSpec")]
    pub engine: Value,
    /// `spec.gpu` (count, product).
    #[schemars(with = "kvroute_crds::workerset::GpuSpec")]
    pub gpu: Value,
}

/// The optional InferencePool.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValuesPool {
    /// Create it, with the WorkerSet above as its target.
    pub enabled: bool,
    /// Its name.
    pub name: String,
    /// `spec.auth`: API keys, JWT, trusted peers; empty: anonymous requests are served.
    #[schemars(with = "PoolAuthSpec")]
    pub auth: Value,
}

impl Default for ChartValues {
    fn default() -> Self {
        let image = |name: &str| ValuesImage {
            repository: format!("{}/kvroute-{name}", crate::IMAGE_REPO),
            tag: VERSION.to_string(),
        };
        let spec = operator_deployment_spec(&operator_image());
        let example = examples().into_iter().next().unwrap_or_default();
        let text = |pointer: &str| {
            example
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let name = text("/metadata/name");
        Self {
            images: ValuesImages {
                operator: image("operator"),
                router: image("router"),
                sidecar: image("sidecar"),
                mock_vllm: image("mock-vllm"),
            },
            operator: ValuesOperator {
                replicas: spec.replicas.unwrap_or(1),
                pull_policy: PullPolicy::Default,
                watch_namespace: String::new(),
                resources: spec
                    .template
                    .spec
                    .and_then(|p| p.containers.into_iter().next())
                    .and_then(|c| c.resources)
                    .unwrap_or_default(),
                node_selector: BTreeMap::new(),
                tolerations: Vec::new(),
                affinity: Affinity::default(),
            },
            router: ValuesRouter {
                manage: true,
                replicas: crate::bundle::ROUTER_REPLICAS,
                gie_inference_pool: String::new(),
                otlp_endpoint: String::new(),
                tokenizer_fetch_timeout_seconds: 0,
                tokenizer_retry_max_seconds: 0,
            },
            tls: ValuesTls {
                mode: TlsMode::Operator,
                issuer_ref: None,
                gateway_secret_name: String::new(),
            },
            worker_set: ValuesWorkerSet {
                enabled: false,
                name: name.clone(),
                model: text("/spec/model/name"),
                served_name: text("/spec/model/servedName"),
                tokenizer: TokenizerSpec::default(),
                replicas: example["spec"]["replicas"]
                    .as_i64()
                    .and_then(|r| i32::try_from(r).ok())
                    .unwrap_or(1),
                block_size: example["spec"]["blockSize"]
                    .as_u64()
                    .and_then(|b| u32::try_from(b).ok())
                    .unwrap_or(16),
                engine: example["spec"]["engine"].clone(),
                gpu: example["spec"]["gpu"].clone(),
            },
            pool: ValuesPool {
                enabled: false,
                name,
                auth: json!({}),
            },
        }
    }
}

/// What replaces a placeholder line.
enum Slot {
    /// The value, as template text, on the same line.
    Scalar(String),
    /// `key:` and `toYaml <expr>` below it.
    Block(&'static str),
    /// `key:` and `toYaml` of the value, only when the value is not empty.
    OptionalBlock(&'static str),
    /// `key: <value>` only when the value is not empty.
    OptionalScalar(&'static str),
    /// Lines written at the placeholder's indentation (for a list item: from its `- `).
    Lines(Vec<String>),
}

/// Placeholders put into an object and their replacements.
#[derive(Default)]
struct Slots(Vec<Slot>);

impl Slots {
    /// A placeholder for `slot`: a plain YAML scalar that no manifest contains.
    fn put(&mut self, slot: Slot) -> Value {
        self.0.push(slot);
        Value::String(format!("HELMSLOT{:03}", self.0.len() - 1))
    }

    /// The YAML of `value` with every placeholder line replaced.
    fn template(&self, value: &Value) -> anyhow::Result<String> {
        let yaml = to_yaml(value)?;
        let mut out = String::new();
        let mut used = vec![false; self.0.len()];
        for line in yaml.lines() {
            let Some(at) = line.find("HELMSLOT") else {
                out.push_str(line);
                out.push('\n');
                continue;
            };
            let index: usize = line[at + "HELMSLOT".len()..]
                .parse()
                .with_context(|| format!("a placeholder alone at the end of a line: {line}"))?;
            let slot = self
                .0
                .get(index)
                .with_context(|| format!("no slot {index}"))?;
            used[index] = true;
            let head = &line[..at];
            let indent = head.len() - head.trim_start().len();
            let pad = " ".repeat(indent);
            let key = head.trim();
            let list_item = key.starts_with("- ");
            if list_item && !matches!(slot, Slot::Lines(_)) {
                bail!("slot {index} is the first key of a list item: {line}");
            }
            match slot {
                Slot::Scalar(text) => out.push_str(&format!("{head}{text}\n")),
                Slot::Block(expr) => out.push_str(&format!(
                    "{pad}{key}\n{pad}  {{{{- toYaml {expr} | nindent {} }}}}\n",
                    indent + 2
                )),
                Slot::OptionalBlock(expr) => out.push_str(&format!(
                    "{pad}{{{{- with {expr} }}}}\n{pad}{key}\n{pad}  {{{{- toYaml . | nindent {} }}}}\n{pad}{{{{- end }}}}\n",
                    indent + 2
                )),
                Slot::OptionalScalar(expr) => out.push_str(&format!(
                    "{pad}{{{{- with {expr} }}}}\n{pad}{key} {{{{ . }}}}\n{pad}{{{{- end }}}}\n"
                )),
                Slot::Lines(lines) => {
                    for l in lines {
                        out.push_str(&format!("{pad}{l}\n"));
                    }
                }
            }
        }
        if let Some(unused) = used.iter().position(|u| !u) {
            bail!("slot {unused} was not written");
        }
        Ok(out)
    }
}

/// The value at `pointer` in `doc`, which must exist.
fn at<'a>(doc: &'a mut Value, pointer: &str) -> anyhow::Result<&'a mut Value> {
    let kind = doc["kind"].as_str().unwrap_or_default().to_string();
    doc.pointer_mut(pointer)
        .with_context(|| format!("{kind} has no {pointer}"))
}

/// The object of a plain manifest as a template: the release namespace, and for the
/// Deployment every field values control.
fn operator_template(mut doc: Value) -> anyhow::Result<String> {
    let mut slots = Slots::default();
    let namespace = "{{ .Release.Namespace }}";
    if doc.pointer("/metadata/namespace").is_some() {
        *at(&mut doc, "/metadata/namespace")? = slots.put(Slot::Scalar(namespace.into()));
    }
    let subjects = doc.get_mut("subjects").and_then(Value::as_array_mut);
    for subject in subjects.into_iter().flatten() {
        subject["namespace"] = slots.put(Slot::Scalar(namespace.into()));
    }
    if doc["kind"] == "Deployment" && doc["metadata"]["name"] == OPERATOR_NAME {
        *at(&mut doc, "/spec/replicas")? =
            slots.put(Slot::Scalar("{{ .Values.operator.replicas }}".into()));
        let pod = at(&mut doc, "/spec/template/spec")?;
        pod["nodeSelector"] = slots.put(Slot::OptionalBlock(".Values.operator.nodeSelector"));
        pod["tolerations"] = slots.put(Slot::OptionalBlock(".Values.operator.tolerations"));
        pod["affinity"] = slots.put(Slot::OptionalBlock(".Values.operator.affinity"));
        let container = at(&mut doc, "/spec/template/spec/containers/0")?;
        container["image"] = slots.put(Slot::Scalar(
            "\"{{ .Values.images.operator.repository }}:{{ .Values.images.operator.tag }}\"".into(),
        ));
        container["imagePullPolicy"] =
            slots.put(Slot::OptionalScalar(".Values.operator.pullPolicy"));
        container["resources"] = slots.put(Slot::Block(".Values.operator.resources"));
        let env = container["env"]
            .as_array_mut()
            .context("the operator container has env")?;
        let mut set = BTreeMap::from([
            (
                "KVROUTE_OPERATOR_ROUTER_REPLICAS",
                "{{ .Values.router.replicas | quote }}".to_string(),
            ),
            (
                "KVROUTE_OPERATOR_MANAGE_ROUTER",
                "{{ .Values.router.manage | quote }}".to_string(),
            ),
            (
                "KVROUTE_OPERATOR_MTLS",
                "{{ ne .Values.tls.mode \"off\" | quote }}".to_string(),
            ),
        ]);
        for (name, var) in crate::bundle::DEPLOYED_IMAGES {
            let key = match name {
                "mock-vllm" => "mockVllm",
                other => other,
            };
            set.insert(
                var,
                format!(
                    "\"{{{{ .Values.images.{key}.repository }}}}:{{{{ .Values.images.{key}.tag }}}}\""
                ),
            );
        }
        for e in env.iter_mut() {
            let name = e["name"].as_str().unwrap_or_default().to_string();
            if let Some(text) = set.remove(name.as_str()) {
                e["value"] = slots.put(Slot::Scalar(text));
            }
        }
        if let Some(missing) = set.keys().next() {
            bail!("the operator's Deployment does not set {missing}");
        }
        // Settings the plain Deployment leaves unset: set only when the value is not empty
        // (or zero), so the defaults render the plain manifests.
        for (value, var) in [
            ("operator.watchNamespace", "KVROUTE_OPERATOR_NAMESPACE"),
            (
                "router.gieInferencePool",
                "KVROUTE_OPERATOR_ROUTER_GIE_INFERENCE_POOL",
            ),
            (
                "router.otlpEndpoint",
                "KVROUTE_OPERATOR_ROUTER_OTLP_ENDPOINT",
            ),
            (
                "router.tokenizerFetchTimeoutSeconds",
                "KVROUTE_OPERATOR_ROUTER_TOKENIZER_FETCH_TIMEOUT_SECONDS",
            ),
            (
                "router.tokenizerRetryMaxSeconds",
                "KVROUTE_OPERATOR_ROUTER_TOKENIZER_RETRY_MAX_SECONDS",
            ),
        ] {
            env.push(slots.put(Slot::Lines(vec![
                format!("{{{{- with .Values.{value} }}}}"),
                format!("- name: {var}"),
                "  value: {{ . | quote }}".into(),
                "{{- end }}".into(),
            ])));
        }
    }
    slots.template(&doc)
}

/// The optional default objects: a WorkerSet and a Pool, each behind its `enabled`.
fn default_objects_template() -> String {
    let api = kvroute_crds::API_VERSION;
    format!(
        "{HEADER}\
{{{{- if .Values.workerSet.enabled }}}}
apiVersion: {api}
kind: InferenceWorkerSet
metadata:
  name: {{{{ .Values.workerSet.name }}}}
  namespace: {{{{ .Release.Namespace }}}}
spec:
  model:
    name: {{{{ .Values.workerSet.model | quote }}}}
    servedName: {{{{ .Values.workerSet.servedName | quote }}}}
    {{{{- with .Values.workerSet.tokenizer }}}}
    tokenizer:
      {{{{- toYaml . | nindent 6 }}}}
    {{{{- end }}}}
  replicas: {{{{ .Values.workerSet.replicas }}}}
  blockSize: {{{{ .Values.workerSet.blockSize }}}}
  engine:
    {{{{- toYaml .Values.workerSet.engine | nindent 4 }}}}
  gpu:
    {{{{- toYaml .Values.workerSet.gpu | nindent 4 }}}}
{{{{- end }}}}
{{{{- if .Values.pool.enabled }}}}
---
apiVersion: {api}
kind: InferencePool
metadata:
  name: {{{{ .Values.pool.name }}}}
  namespace: {{{{ .Release.Namespace }}}}
spec:
  targets:
  - workerSet: {{{{ .Values.workerSet.name }}}}
  {{{{- if eq .Values.tls.mode \"cert-manager\" }}}}
  tls:
    issuerRef:
      {{{{- toYaml .Values.tls.issuerRef | nindent 6 }}}}
  {{{{- end }}}}
  {{{{- with .Values.tls.gatewaySecretName }}}}
  gateway:
    tls:
      secretName: {{{{ . | quote }}}}
  {{{{- end }}}}
  {{{{- with .Values.pool.auth }}}}
  auth:
    {{{{- toYaml . | nindent 4 }}}}
  {{{{- end }}}}
{{{{- end }}}}
"
    )
}

/// `Chart.yaml` of a chart.
fn chart_yaml(name: &str, description: &str) -> anyhow::Result<String> {
    to_yaml(&json!({
        "apiVersion": "v2",
        "name": name,
        "description": description,
        "type": "application",
        "version": VERSION,
        "appVersion": VERSION,
        "kubeVersion": format!(">={MIN_KUBE_VERSION}-0"),
        "home": "https://github.com/kvroute/kvroute",
        "sources": ["https://github.com/kvroute/kvroute"],
        "keywords": ["llm", "inference", "vllm", "kv-cache", "routing"],
    }))
}

/// The values file: the defaults with each field's doc as a comment above it.
pub fn values_yaml(values: &ChartValues) -> anyhow::Result<String> {
    let schema = values_schema()?;
    let value = serde_json::to_value(values).context("values as JSON")?;
    let mut out = format!(
        "{HEADER}# Values of the kvroute chart. The defaults render deploy/operator.yaml and\n\
         # deploy/rbac.yaml (less the Namespace); docs/install.md has the table.\n"
    );
    write_values(&value, &schema, &schema, 0, &mut out)?;
    Ok(out)
}

/// The schema of a property: follows `$ref` (also inside `allOf`) into `definitions`.
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    let reference = schema["$ref"]
        .as_str()
        .or_else(|| schema["allOf"][0]["$ref"].as_str());
    reference
        .and_then(|r| r.strip_prefix("#/definitions/"))
        .and_then(|name| root["definitions"].get(name))
        .unwrap_or(schema)
}

fn write_values(
    value: &Value,
    schema: &Value,
    root: &Value,
    depth: usize,
    out: &mut String,
) -> anyhow::Result<()> {
    let pad = "  ".repeat(depth);
    let object = value.as_object().context("values are an object")?;
    for (key, v) in object {
        let property = &schema["properties"][key];
        let resolved = resolve(root, property);
        let doc = property["description"]
            .as_str()
            .or_else(|| resolved["description"].as_str())
            .unwrap_or_default();
        for line in doc.lines() {
            out.push_str(&format!("{pad}# {line}\n"));
        }
        // Recurse into the chart's own structs only; Kubernetes and CRD types are leaves.
        let own = property["$ref"]
            .as_str()
            .or_else(|| property["allOf"][0]["$ref"].as_str())
            .is_some_and(|r| r.starts_with("#/definitions/Values"));
        if own {
            out.push_str(&format!("{pad}{key}:\n"));
            write_values(v, resolved, root, depth + 1, out)?;
            continue;
        }
        let text = serde_saphyr::to_string(v).context("a value as YAML")?;
        let text = text.trim_end();
        let empty_collection = v.as_object().is_some_and(|m| m.is_empty())
            || v.as_array().is_some_and(|a| a.is_empty());
        if empty_collection {
            let inline = if v.is_array() { "[]" } else { "{}" };
            out.push_str(&format!("{pad}{key}: {inline}\n"));
        } else if v.is_object() || v.is_array() {
            out.push_str(&format!("{pad}{key}:\n"));
            for line in text.lines() {
                out.push_str(&format!("{pad}  {line}\n"));
            }
        } else {
            out.push_str(&format!("{pad}{key}: {text}\n"));
        }
    }
    Ok(())
}

/// The JSON schema of the values (draft-07, which helm's validator reads).
pub fn values_schema() -> anyhow::Result<Value> {
    let generator = schemars::generate::SchemaSettings::draft07().into_generator();
    let schema = generator.into_root_schema_for::<ChartValues>();
    serde_json::to_value(schema).context("the values schema as JSON")
}

/// Every file of both charts under `dir` (`deploy/helm`).
pub fn helm_files(dir: &Path) -> anyhow::Result<Vec<GeneratedFile>> {
    let crds_dir = dir.join(CRDS_CHART);
    let mut files = vec![GeneratedFile {
        path: crds_dir.join("Chart.yaml"),
        content: chart_yaml(
            CRDS_CHART,
            "The five kvroute CRDs (kvroute.dev/v1alpha1), kept on uninstall. Install before the kvroute chart.",
        )?,
    }];
    for crd in kvroute_crds::crds() {
        let mut crd = serde_json::to_value(&crd).context("CRD as JSON")?;
        crd["metadata"]["annotations"] = json!({KEEP_ANNOTATION.0: KEEP_ANNOTATION.1});
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        files.push(GeneratedFile {
            path: crds_dir.join("templates").join(format!("{name}.yaml")),
            content: to_yaml(&crd)?,
        });
    }

    let chart = dir.join(OPERATOR_CHART);
    let values = ChartValues::default();
    files.push(GeneratedFile {
        path: chart.join("Chart.yaml"),
        content: chart_yaml(
            OPERATOR_CHART,
            "The kvroute operator (KV-cache-aware LLM routing): Deployment, RBAC, NetworkPolicy, and optionally a WorkerSet and a Pool. Needs the kvroute-crds chart.",
        )?,
    });
    files.push(GeneratedFile {
        path: chart.join("values.yaml"),
        content: values_yaml(&values)?,
    });
    let schema = serde_json::to_string_pretty(&values_schema()?).context("schema")?;
    files.push(GeneratedFile {
        path: chart.join("values.schema.json"),
        content: format!("{schema}\n"),
    });
    let plain = deploy_files(Path::new(""))?;
    for file in CHART_SOURCES {
        let content = plain
            .iter()
            .find(|f| f.path == Path::new(file))
            .map(|f| f.content.as_str())
            .with_context(|| format!("deploy_files writes {file}"))?;
        for doc in content.split("---\n") {
            let doc: Value = serde_saphyr::from_str(doc).context("reading a plain manifest")?;
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            if kind == "Namespace" {
                // The release namespace: `helm install -n NS --create-namespace`, labelled
                // for Pod Security as docs/install.md says.
                continue;
            }
            let name = doc["metadata"]["name"].as_str().unwrap_or_default();
            let file = if name == OPERATOR_NAME {
                format!("{}.yaml", kind.to_lowercase())
            } else {
                format!("{}-{name}.yaml", kind.to_lowercase())
            };
            files.push(GeneratedFile {
                path: chart.join("templates").join(file),
                content: operator_template(doc)?,
            });
        }
    }
    files.push(GeneratedFile {
        path: chart.join("templates").join("defaults.yaml"),
        content: default_objects_template(),
    });
    files.push(GeneratedFile {
        path: chart.join("templates").join("NOTES.txt"),
        content: format!(
            "kvroute {VERSION}: the operator runs in {{{{ .Release.Namespace }}}} and deploys the router there.\n\
             Check it:  kubectl -n {{{{ .Release.Namespace }}}} get deploy {OPERATOR_NAME}\n\
             Then add an InferenceWorkerSet and an InferencePool (deploy/examples.yaml, docs/install.md).\n\
             Label the namespace for Pod Security (restricted) as {DEPLOY_NAMESPACE} is in deploy/operator.yaml.\n"
        ),
    });
    Ok(files)
}
