//! The Helm charts under deploy/helm/, rendered two ways:
//!
//! - without helm, by a small renderer of exactly the template syntax `operator/src/helm.rs`
//!   writes (it refuses anything else, so a generator change that needs more syntax fails
//!   here): with the default values the charts are the plain manifests and the CRDs again,
//!   object by object, and every value reaches its field;
//! - with a real `helm` (`helm lint --strict`, `helm template`), installed by
//!   `bash e2e/k8s/setup.sh` (e2e/k8s/install-helm.sh): same objects as the plain manifests
//!   with the defaults, same objects as the small renderer with other values, and the values
//!   schema refuses unknown or mistyped values.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kvroute_crds::AnyResource;
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

const NAMESPACE: &str = "kvroute-system";

// ---------- a renderer for the template subset the generator writes ----------

/// One open `if`/`with`: whether its current branch is written, whether a branch was taken,
/// and the dot inside it.
struct Frame {
    emit: bool,
    taken: bool,
    dot: Value,
}

/// Splits an action into words, keeping quoted strings whole.
fn words(action: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in action.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ' ' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn term(word: &str, dot: &Value) -> Result<Value, String> {
    if word == "." {
        return Ok(dot.clone());
    }
    if let Some(lit) = word.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
        return Ok(Value::String(lit.to_string()));
    }
    if let Some(path) = word.strip_prefix('.') {
        let mut v = dot;
        for key in path.split('.') {
            v = v
                .get(key)
                .ok_or_else(|| format!("no value at {word} (missing {key})"))?;
        }
        return Ok(v.clone());
    }
    Err(format!("unsupported term {word:?}"))
}

/// Evaluates a pipeline (`.Values.x`, `eq A B`, `ne A B`, `toYaml A`, then `| quote`).
fn eval(action: &str, dot: &Value) -> Result<Value, String> {
    let words = words(action);
    let mut stages = words.split(|w| w == "|");
    let first = stages.next().ok_or("empty action")?;
    let mut v = match first {
        [one] => term(one, dot)?,
        [f, a, b] if f == "eq" || f == "ne" => {
            Value::Bool((term(a, dot)? == term(b, dot)?) == (f == "eq"))
        }
        [f, a] if f == "toYaml" => Value::String(to_yaml(&term(a, dot)?)),
        other => return Err(format!("unsupported command {other:?}")),
    };
    for stage in stages {
        v = match stage {
            [f] if f == "quote" => {
                Value::String(serde_json::to_string(&text(&v)?).expect("a string"))
            }
            [f, n] if f == "nindent" => {
                let n: usize = n.parse().map_err(|_| format!("nindent {n}"))?;
                let pad = " ".repeat(n);
                let s = text(&v)?;
                Value::String(s.lines().map(|l| format!("\n{pad}{l}")).collect())
            }
            other => return Err(format!("unsupported pipe {other:?}")),
        };
    }
    Ok(v)
}

/// Go template truth: false, 0, nil and empty strings, maps and lists are false.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
    }
}

/// How `{{ v }}` prints a value.
fn text(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Bool(_) | Value::Number(_) => Ok(v.to_string()),
        other => Err(format!("cannot print {other}")),
    }
}

/// helm's toYaml: YAML without the final newline.
fn to_yaml(v: &Value) -> String {
    serde_saphyr::to_string(v)
        .expect("yaml")
        .trim_end()
        .to_string()
}

/// Renders `template` with `values`, the way helm does for the syntax the generator writes:
/// `{{- ... }}` actions alone on their line (control, or `toYaml ... | nindent N`), and
/// `{{ ... }}` inside text lines.
fn render(template: &str, values: &Value) -> Result<String, String> {
    let root = json!({"Values": values, "Release": {"Namespace": NAMESPACE}});
    let mut out = String::new();
    let mut stack: Vec<Frame> = Vec::new();
    let emitting = |stack: &Vec<Frame>| stack.last().is_none_or(|f| f.emit);
    for line in template.lines() {
        let trimmed = line.trim();
        let dot = stack.last().map_or(&root, |f| &f.dot).clone();
        if let Some(action) = trimmed
            .strip_prefix("{{-")
            .and_then(|a| a.strip_suffix("}}"))
        {
            if action.contains("{{") || action.ends_with('-') {
                return Err(format!("unsupported action line {line:?}"));
            }
            let action = action.trim();
            let before = emitting(&stack);
            let trim = |out: &mut String| out.truncate(out.trim_end().len());
            match action.split_once(' ').unwrap_or((action, "")) {
                ("if", cond) | ("with", cond) => {
                    if before {
                        trim(&mut out);
                    }
                    let v = eval(cond, &dot)?;
                    let t = truthy(&v);
                    let dot = if action.starts_with("with") && t {
                        v
                    } else {
                        dot
                    };
                    stack.push(Frame {
                        emit: before && t,
                        taken: t,
                        dot,
                    });
                }
                ("else", "") => {
                    if before {
                        trim(&mut out);
                    }
                    let parent = stack.len() < 2 || stack[stack.len() - 2].emit;
                    let f = stack.last_mut().ok_or("else without if")?;
                    f.emit = parent && !f.taken;
                }
                ("end", "") => {
                    if before {
                        trim(&mut out);
                    }
                    stack.pop().ok_or("end without if")?;
                }
                ("toYaml", _) => {
                    if before {
                        trim(&mut out);
                        out.push_str(&text(&eval(action, &dot)?)?);
                    }
                }
                _ => return Err(format!("unsupported action {action:?}")),
            }
            if emitting(&stack) {
                out.push('\n');
            }
            continue;
        }
        if !emitting(&stack) {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            let end = rest[start..]
                .find("}}")
                .ok_or_else(|| format!("unclosed action in {line:?}"))?;
            let action = &rest[start + 2..start + end];
            if action.starts_with('-') || action.ends_with('-') {
                return Err(format!("whitespace trimming inside a line: {line:?}"));
            }
            out.push_str(&text(&eval(action.trim(), &dot)?)?);
            rest = &rest[start + end + 2..];
        }
        out.push_str(rest);
        out.push('\n');
    }
    if !stack.is_empty() {
        return Err("unclosed if/with".into());
    }
    Ok(out)
}

// ---------- charts, values and objects ----------

fn chart(name: &str) -> PathBuf {
    root().join("deploy/helm").join(name)
}

fn default_values() -> Value {
    serde_saphyr::from_str(&read(&chart("kvroute").join("values.yaml"))).expect("values.yaml")
}

/// helm's merge of user values into the chart's: maps deep, everything else replaced.
fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// The objects of a multi-document YAML stream, keyed by kind and name.
fn objects(yaml: &str) -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for doc in yaml.split("\n---") {
        let v: Value = serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("{e}: {doc}"));
        if v.is_null() {
            continue;
        }
        let key = (
            v["kind"].as_str().expect("kind").to_string(),
            v["metadata"]["name"].as_str().expect("name").to_string(),
        );
        assert!(out.insert(key.clone(), v).is_none(), "{key:?} twice");
    }
    out
}

/// Every template of a chart rendered by the small renderer, as objects.
fn render_chart(name: &str, values: &Value) -> BTreeMap<(String, String), Value> {
    let mut all = String::new();
    let mut entries: Vec<_> = std::fs::read_dir(chart(name).join("templates"))
        .expect("templates")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    entries.sort();
    for path in entries {
        let rendered = render(&read(&path), values)
            .unwrap_or_else(|e| panic!("rendering {}: {e}", path.display()));
        all.push_str("\n---\n");
        all.push_str(&rendered);
    }
    objects(&all)
}

/// The plain manifests less the Namespace (the chart installs into the release namespace).
fn plain() -> BTreeMap<(String, String), Value> {
    let text = kvroute_operator::helm::CHART_SOURCES
        .map(|f| read(&root().join("deploy").join(f)))
        .join("\n---\n");
    let mut all = objects(&text);
    assert!(
        all.remove(&("Namespace".into(), NAMESPACE.into()))
            .is_some(),
        "deploy/operator.yaml has the Namespace"
    );
    all
}

/// The CRDs of crds/, with the annotation the CRD chart adds.
fn crds_with_keep() -> BTreeMap<(String, String), Value> {
    let mut text = String::new();
    for entry in std::fs::read_dir(root().join("crds")).expect("crds") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            text.push_str("\n---\n");
            text.push_str(&read(&path));
        }
    }
    let mut all = objects(&text);
    for crd in all.values_mut() {
        crd["metadata"]["annotations"] = json!({"helm.sh/resource-policy": "keep"});
    }
    assert_eq!(all.len(), 5);
    all
}

fn deployment(objects: &BTreeMap<(String, String), Value>) -> &Value {
    &objects[&("Deployment".to_string(), "kvroute-operator".to_string())]
}

fn env(deployment: &Value) -> BTreeMap<String, Value> {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().expect("name").to_string(), e.clone()))
        .collect()
}

/// Values that change every field a value controls, and turn the default objects on.
fn other_values() -> Value {
    json!({
        "images": {
            "operator": {"repository": "registry.example.com/k/op", "tag": "1.2.3"},
            "router": {"repository": "registry.example.com/k/router", "tag": "1.2.3"},
            "sidecar": {"repository": "registry.example.com/k/sidecar", "tag": "1.2.3"},
            "mockVllm": {"repository": "registry.example.com/k/mock", "tag": "1.2.3"}
        },
        "operator": {
            "replicas": 5,
            "pullPolicy": "Always",
            "watchNamespace": "team-a",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}
        },
        "router": {"manage": false, "replicas": 4, "gieInferencePool": "llm/chat",
                   "otlpEndpoint": "http://otel-collector.observability:4317",
                   "tokenizerFetchTimeoutSeconds": 900, "tokenizerRetryMaxSeconds": 60},
        "tls": {
            "mode": "cert-manager",
            "issuerRef": {"name": "kvroute-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"},
            "gatewaySecretName": "gateway-tls"
        },
        "workerSet": {
            "enabled": true,
            "tokenizer": {"hub": {"repo": "Qwen/Qwen3-0.6B", "revision": "c1899de",
                                   "tokenSecretRef": {"name": "hf-token", "key": "token"}}},
            "engine": {"mode": "mock", "speedup": 2.5},
            "replicas": 1
        },
        "pool": {"enabled": true, "name": "chat", "auth": {"apiKeySecrets": [{"name": "chat-api-keys"}]}}
    })
}

fn merged(over: &Value) -> Value {
    let mut values = default_values();
    merge(&mut values, over);
    values
}

// ---------- without helm ----------

#[test]
fn default_values_render_the_plain_manifests_object_by_object() {
    let rendered = render_chart("kvroute", &default_values());
    let plain = plain();
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        plain.keys().collect::<Vec<_>>()
    );
    for (key, want) in &plain {
        assert_eq!(&rendered[key], want, "{key:?}");
    }
    let crds = render_chart("kvroute-crds", &json!({}));
    assert_eq!(crds, crds_with_keep());
}

#[test]
fn every_value_reaches_its_field() {
    let objects = render_chart("kvroute", &merged(&other_values()));
    let d = deployment(&objects);
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(d["spec"]["replicas"], 5);
    assert_eq!(c["image"], "registry.example.com/k/op:1.2.3");
    assert_eq!(c["imagePullPolicy"], "Always");
    // Maps merge into the defaults (helm's rule): the default cpu limit stays.
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "100m", "memory": "128Mi"},
               "limits": {"cpu": "500m", "memory": "512Mi"}})
    );
    assert_eq!(
        pod["nodeSelector"],
        other_values()["operator"]["nodeSelector"]
    );
    assert_eq!(
        pod["tolerations"],
        other_values()["operator"]["tolerations"]
    );
    assert_eq!(pod["affinity"], other_values()["operator"]["affinity"]);
    let env = env(d);
    let value = |name: &str| env[name]["value"].clone();
    assert_eq!(
        value("KVROUTE_OPERATOR_ROUTER_IMAGE"),
        "registry.example.com/k/router:1.2.3"
    );
    assert_eq!(
        value("KVROUTE_OPERATOR_SIDECAR_IMAGE"),
        "registry.example.com/k/sidecar:1.2.3"
    );
    assert_eq!(
        value("KVROUTE_OPERATOR_MOCK_IMAGE"),
        "registry.example.com/k/mock:1.2.3"
    );
    assert_eq!(value("KVROUTE_OPERATOR_ROUTER_REPLICAS"), "4");
    assert_eq!(value("KVROUTE_OPERATOR_MANAGE_ROUTER"), "false");
    assert_eq!(value("KVROUTE_OPERATOR_MTLS"), "true");
    assert_eq!(value("KVROUTE_OPERATOR_NAMESPACE"), "team-a");
    assert_eq!(
        value("KVROUTE_OPERATOR_ROUTER_GIE_INFERENCE_POOL"),
        "llm/chat"
    );
    assert_eq!(
        value("KVROUTE_OPERATOR_ROUTER_OTLP_ENDPOINT"),
        "http://otel-collector.observability:4317"
    );
    assert_eq!(
        value("KVROUTE_OPERATOR_ROUTER_TOKENIZER_FETCH_TIMEOUT_SECONDS"),
        "900"
    );
    assert_eq!(
        value("KVROUTE_OPERATOR_ROUTER_TOKENIZER_RETRY_MAX_SECONDS"),
        "60"
    );

    let off = render_chart("kvroute", &merged(&json!({"tls": {"mode": "off"}})));
    assert_eq!(
        crate::env(deployment(&off))["KVROUTE_OPERATOR_MTLS"]["value"],
        "false"
    );
}

#[test]
fn default_objects_are_valid_resources_that_carry_tls_and_tokenizer_values() {
    let objects = render_chart("kvroute", &merged(&other_values()));
    let ws = &objects[&("InferenceWorkerSet".into(), "qwen3-0-6b".into())];
    let pool = &objects[&("InferencePool".into(), "chat".into())];
    assert_eq!(
        ws["spec"]["model"]["tokenizer"],
        other_values()["workerSet"]["tokenizer"]
    );
    assert_eq!(ws["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        pool["spec"]["targets"],
        json!([{"workerSet": "qwen3-0-6b"}])
    );
    assert_eq!(
        pool["spec"]["tls"]["issuerRef"],
        other_values()["tls"]["issuerRef"]
    );
    assert_eq!(pool["spec"]["gateway"]["tls"]["secretName"], "gateway-tls");
    assert_eq!(
        pool["spec"]["auth"]["apiKeySecrets"],
        json!([{"name": "chat-api-keys"}])
    );
    // Both parse as the CRD types, keep every field, and pass their validation.
    for object in [ws, pool] {
        let docs = kvroute_crds::parse_documents(&object.to_string()).expect("parses");
        let (issues, typed) = match docs.into_iter().next().expect("one") {
            AnyResource::WorkerSet(w) => (w.spec.validate(), serde_json::to_value(&w)),
            AnyResource::Pool(p) => (p.spec.validate(), serde_json::to_value(&p)),
            other => panic!("unexpected {other:?}"),
        };
        assert!(issues.is_empty(), "{issues:?}");
        let typed = typed.expect("json");
        for key in object["spec"].as_object().expect("spec").keys() {
            assert!(typed["spec"].get(key).is_some(), "{key} kept");
        }
    }
    // Without the pool's TLS values the pool has no tls or gateway.
    let plain_pool = render_chart(
        "kvroute",
        &merged(&json!({"pool": {"enabled": true}, "workerSet": {"enabled": true}})),
    );
    let p = &plain_pool[&("InferencePool".into(), "qwen3-0-6b".into())];
    assert!(p["spec"].get("tls").is_none() && p["spec"].get("gateway").is_none());
    assert!(p["spec"].get("auth").is_none(), "no auth unless asked");
}

#[test]
fn the_renderer_refuses_syntax_it_does_not_know() {
    let v = json!({"a": "x"});
    assert!(render("{{ .Values.a | upper }}", &v).is_err());
    assert!(render("{{ .Values.missing }}", &v).is_err());
    assert!(render("  {{- range .Values.a }}", &v).is_err());
    assert!(render("  {{- if .Values.a }}", &v).is_err(), "unclosed");
    assert_eq!(
        render("a:\n  {{- if eq .Values.a \"x\" }}\n  b: 1\n  {{- else }}\n  b: 2\n  {{- end }}\nc: {{ .Values.a | quote }}\n", &v).as_deref(),
        Ok("a:\n  b: 1\nc: \"x\"\n")
    );
}

// ---------- with helm ----------

/// The helm binary: `$KVROUTE_HELM`, else `helm` in `/opt/k8s-e2e/bin` (where
/// e2e/k8s/install-helm.sh puts it), else on PATH.
fn helm() -> PathBuf {
    if let Some(p) = std::env::var_os("KVROUTE_HELM") {
        return PathBuf::from(p);
    }
    let bin = std::env::var_os("KVROUTE_K8S_BIN")
        .map_or_else(|| PathBuf::from("/opt/k8s-e2e/bin"), PathBuf::from)
        .join("helm");
    if bin.is_file() {
        return bin;
    }
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("helm"))
                .find(|h| h.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "no helm binary: run `bash e2e/k8s/setup.sh` (it runs e2e/k8s/install-helm.sh) \
                 or point KVROUTE_HELM at one"
            )
        })
}

fn run_helm(args: &[&str]) -> Result<String, String> {
    let home = tempfile::tempdir().expect("tempdir");
    let out = Command::new(helm())
        .args(args)
        // helm keeps caches and config under $HOME; keep them out of the machine's.
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .expect("running helm");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

fn helm_template(chart_name: &str, values: Option<&Path>) -> Result<String, String> {
    let path = chart(chart_name);
    let mut args = vec![
        "template".to_string(),
        "kvroute".to_string(),
        path.display().to_string(),
        "--namespace".to_string(),
        NAMESPACE.to_string(),
        // helm template has no cluster to ask; the charts need 1.25 (CEL rules).
        "--kube-version".to_string(),
        "1.25.0".to_string(),
    ];
    if let Some(v) = values {
        args.push("--values".into());
        args.push(v.display().to_string());
    }
    run_helm(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn real_helm_lints_both_charts_and_renders_what_the_small_renderer_does() {
    let version = run_helm(&["version", "--short"]).expect("helm version");
    assert!(version.starts_with("v3."), "{version}");
    for name in ["kvroute-crds", "kvroute"] {
        let path = chart(name).display().to_string();
        let lint = run_helm(&["lint", "--strict", &path]).unwrap_or_else(|e| panic!("{e}"));
        assert!(lint.contains("0 chart(s) failed"), "{lint}");
    }
    // Defaults: the plain manifests and the CRDs.
    let rendered = objects(&helm_template("kvroute", None).unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(rendered, plain());
    let crds = objects(&helm_template("kvroute-crds", None).unwrap_or_else(|e| panic!("{e}")));
    assert_eq!(crds, crds_with_keep());
    // Other values: the same objects as the small renderer.
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, over) in [other_values(), json!({"tls": {"mode": "off"}})]
        .iter()
        .enumerate()
    {
        let file = dir.path().join(format!("values-{i}.yaml"));
        std::fs::write(&file, serde_saphyr::to_string(over).expect("yaml")).expect("write");
        let by_helm =
            objects(&helm_template("kvroute", Some(&file)).unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(
            by_helm,
            render_chart("kvroute", &merged(over)),
            "values {over}"
        );
    }
    // The values schema refuses what the operator would not understand.
    for (bad, why) in [
        ("tls:\n  mode: on\n", "mode"),
        ("operator:\n  replica: 3\n", "replica"),
        ("router:\n  replicas: two\n", "replicas"),
        (
            "workerSet:\n  tokenizer:\n    hub:\n      repo: 'not a repo!'\n",
            "repo",
        ),
    ] {
        let file = dir.path().join("bad.yaml");
        std::fs::write(&file, bad).expect("write");
        let err = helm_template("kvroute", Some(&file)).expect_err(bad);
        assert!(
            err.contains("values don't meet the specifications of the schema"),
            "{err}"
        );
        assert!(err.contains(why), "{why}: {err}");
    }
}

/// Dotted paths of every value, down to the first field that is not the chart's own struct.
fn value_paths(schema: &Value, root: &Value, prefix: &str, out: &mut Vec<String>) {
    for (key, property) in schema["properties"].as_object().expect("properties") {
        let path = format!("{prefix}{key}");
        let own = property["allOf"][0]["$ref"]
            .as_str()
            .or_else(|| property["$ref"].as_str())
            .and_then(|r| r.strip_prefix("#/definitions/"))
            .filter(|name| name.starts_with("Values"));
        match own {
            Some(name) => value_paths(&root["definitions"][name], root, &format!("{path}."), out),
            None => out.push(path),
        }
    }
}

#[test]
fn docs_install_md_lists_every_value() {
    let schema: Value =
        serde_json::from_str(&read(&chart("kvroute").join("values.schema.json"))).expect("schema");
    let mut paths = Vec::new();
    value_paths(&schema, &schema, "", &mut paths);
    assert!(paths.len() > 25, "{paths:?}");
    let docs = read(&root().join("docs/install.md"));
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !docs.contains(&format!("`{p}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/install.md does not list {missing:?}"
    );
}
