//! The CRD reference (`docs/reference/crds.md`), written from the generated schemas so it
//! cannot say anything the API server would not enforce. `kvroute crdgen` writes it beside the
//! YAML and `kvroute crdgen --check` (the golden test) fails when it drifts.
//!
//! ```text
//! crds() --openAPIV3Schema--> walk (path, type, default, validation, description) --> markdown
//! ```
//!
//! Every field gets a row. The Kubernetes types a WorkerSet embeds (volumes, affinity, ...)
//! would bury kvroute's own fields under hundreds of upstream rows, so their subfields go into
//! a folded `<details>` table after the CRD's own table ([`EMBEDDED`] names them).

use std::fmt::Write as _;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

/// Fields whose value is a Kubernetes API type, by CRD kind and field path, with the
/// upstream type's name: their subfields are listed in a folded table.
pub const EMBEDDED: &[(&str, &str, &str)] = &[
    ("InferenceWorkerSet", "spec.affinity", "core/v1 Affinity"),
    ("InferenceWorkerSet", "spec.env[]", "core/v1 EnvVar"),
    (
        "InferenceWorkerSet",
        "spec.envFrom[]",
        "core/v1 EnvFromSource",
    ),
    (
        "InferenceWorkerSet",
        "spec.imagePullSecrets[]",
        "core/v1 LocalObjectReference",
    ),
    (
        "InferenceWorkerSet",
        "spec.resources",
        "core/v1 ResourceRequirements",
    ),
    (
        "InferenceWorkerSet",
        "spec.tolerations[]",
        "core/v1 Toleration",
    ),
    (
        "InferenceWorkerSet",
        "spec.topologySpreadConstraints[]",
        "core/v1 TopologySpreadConstraint",
    ),
    (
        "InferenceWorkerSet",
        "spec.volumeMounts[]",
        "core/v1 VolumeMount",
    ),
    ("InferenceWorkerSet", "spec.volumes[]", "core/v1 Volume"),
];

/// One documented field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRow {
    /// Dotted path from the object's root: `spec.targets[].role`; `[]` is a list item,
    /// `.*` a map value.
    pub path: String,
    /// The OpenAPI type, with its format, `required` when its parent requires it.
    pub ty: String,
    /// The default as compact JSON, empty when none.
    pub default: String,
    /// Bounds, enums, patterns and CEL rules, `; `-separated.
    pub validation: String,
    /// The doc comment the schema carries.
    pub description: String,
}

/// The rows of one schema (the CRD's `openAPIV3Schema`), depth first, properties in
/// schema order; `apiVersion`, `kind` and `metadata` are left out.
pub fn rows(root: &Value) -> Vec<FieldRow> {
    let mut out = Vec::new();
    if let Some(props) = root.get("properties").and_then(Value::as_object) {
        let required = required_of(root);
        for (name, child) in props {
            if matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            walk(child, name, required.contains(&name.as_str()), &mut out);
        }
    }
    out
}

fn required_of(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn walk(schema: &Value, path: &str, required: bool, out: &mut Vec<FieldRow>) {
    out.push(FieldRow {
        path: path.to_string(),
        ty: type_of(schema, required),
        default: schema
            .get("default")
            .map(|d| d.to_string())
            .unwrap_or_default(),
        validation: validation_of(schema),
        description: schema
            .get("description")
            .and_then(Value::as_str)
            .map(one_line)
            .unwrap_or_default(),
    });
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        let req = required_of(schema);
        for (name, child) in props {
            walk(
                child,
                &format!("{path}.{name}"),
                req.contains(&name.as_str()),
                out,
            );
        }
    }
    if let Some(items) = schema.get("items")
        && (items.get("properties").is_some() || items.get("items").is_some())
    {
        walk(items, &format!("{path}[]"), false, out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object())
        && values.get("properties").is_some()
    {
        walk(values, &format!("{path}.*"), false, out);
    }
}

fn scalar_type(schema: &Value) -> String {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "int or string".to_string();
    }
    let ty = schema.get("type").and_then(Value::as_str).unwrap_or("any");
    match schema.get("format").and_then(Value::as_str) {
        Some(f) => format!("{ty} ({f})"),
        None => ty.to_string(),
    }
}

fn type_of(schema: &Value, required: bool) -> String {
    let mut ty = match schema.get("type").and_then(Value::as_str) {
        Some("array") => match schema.get("items") {
            Some(items) => format!("list of {}", scalar_type(items)),
            None => "list".to_string(),
        },
        Some("object") => match schema.get("additionalProperties").filter(|v| v.is_object()) {
            Some(values) => format!("map of {}", scalar_type(values)),
            None if schema.get("x-kubernetes-preserve-unknown-fields")
                == Some(&Value::Bool(true)) =>
            {
                "object (free-form)".to_string()
            }
            None => "object".to_string(),
        },
        _ => scalar_type(schema),
    };
    if required {
        ty.push_str(", required");
    }
    ty
}

fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => v.to_string(),
    }
}

fn validation_of(schema: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
        parts.push(format!("one of {}", values.join(", ")));
    }
    for (key, label) in [
        ("minimum", "min"),
        ("maximum", "max"),
        ("minLength", "minLength"),
        ("maxLength", "maxLength"),
        ("minItems", "minItems"),
        ("maxItems", "maxItems"),
        ("minProperties", "minProperties"),
        ("maxProperties", "maxProperties"),
    ] {
        if let Some(v) = schema.get(key) {
            parts.push(format!("{label} {}", number(v)));
        }
    }
    if let Some(items) = schema.get("items") {
        for (key, label) in [
            ("minLength", "item minLength"),
            ("maxLength", "item maxLength"),
        ] {
            if let Some(v) = items.get(key) {
                parts.push(format!("{label} {}", number(v)));
            }
        }
        if let Some(p) = items.get("pattern").and_then(Value::as_str) {
            parts.push(format!("item pattern `{p}`"));
        }
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        parts.push(format!("pattern `{p}`"));
    }
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for r in rules {
            let rule = r.get("rule").and_then(Value::as_str).unwrap_or_default();
            match r.get("message").and_then(Value::as_str) {
                Some(m) => parts.push(format!("CEL `{rule}` (\"{m}\")")),
                None => parts.push(format!("CEL `{rule}`")),
            }
        }
    }
    parts.join("; ")
}

/// Joins a multi-line doc comment into one table cell.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Escapes a table cell: `|` would end the cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

fn table(out: &mut String, rows: &[&FieldRow]) {
    out.push_str("| field | type | default | validation | description |\n");
    out.push_str("|---|---|---|---|---|\n");
    for r in rows {
        let default = if r.default.is_empty() {
            String::new()
        } else {
            format!("`{}`", r.default)
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} |",
            r.path,
            cell(&r.ty),
            cell(&default),
            cell(&r.validation),
            cell(&r.description)
        );
    }
}

fn anchor(kind: &str) -> String {
    kind.to_lowercase()
}

/// The markdown of one CRD's section.
pub fn crd_section(crd: &CustomResourceDefinition) -> String {
    let kind = &crd.spec.names.kind;
    let mut out = String::new();
    let _ = writeln!(out, "## {kind}\n");
    let v = &crd.spec.versions[0];
    let short = crd.spec.names.short_names.clone().unwrap_or_default();
    let _ = writeln!(
        out,
        "`{}/{}`, kind `{kind}`, plural `{}`, short name{} {}, scope {}.",
        crd.spec.group,
        v.name,
        crd.spec.names.plural,
        if short.len() == 1 { "" } else { "s" },
        short
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", "),
        crd.spec.scope
    );
    let mut subs = Vec::new();
    if let Some(s) = &v.subresources {
        if s.status.is_some() {
            subs.push("status".to_string());
        }
        if let Some(scale) = &s.scale {
            subs.push(format!(
                "scale (`{}` / `{}`)",
                scale.spec_replicas_path, scale.status_replicas_path
            ));
        }
    }
    if !subs.is_empty() {
        let _ = writeln!(out, "Subresources: {}.", subs.join(", "));
    }
    if let Some(cols) = &v.additional_printer_columns {
        let cols: Vec<String> = cols
            .iter()
            .map(|c| format!("{} (`{}`)", c.name, c.json_path))
            .collect();
        let _ = writeln!(out, "`kubectl get` columns: {}.", cols.join(", "));
    }
    let Some(schema) = v
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
    else {
        out.push_str("\nNo schema.\n");
        return out;
    };
    if let Some(d) = schema.get("description").and_then(Value::as_str) {
        let _ = writeln!(out, "\n{}", one_line(d));
    }
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for r in rules {
            let _ = writeln!(
                out,
                "Object rule: `{}`.",
                r.get("rule").and_then(Value::as_str).unwrap_or_default()
            );
        }
    }
    let all = rows(&schema);
    let embedded: Vec<(&str, &str)> = EMBEDDED
        .iter()
        .filter(|(k, _, _)| k == kind)
        .map(|(_, p, t)| (*p, *t))
        .collect();
    let inside = |path: &str| {
        embedded.iter().find(|(p, _)| {
            path.strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
        })
    };
    let own: Vec<&FieldRow> = all.iter().filter(|r| inside(&r.path).is_none()).collect();
    out.push('\n');
    table(&mut out, &own);
    for (path, ty) in &embedded {
        let sub: Vec<&FieldRow> = all
            .iter()
            .filter(|r| inside(&r.path).is_some_and(|(p, _)| p == path))
            .collect();
        if sub.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "\n<details><summary><code>{path}</code>: Kubernetes {ty} ({} fields)</summary>\n",
            sub.len()
        );
        table(&mut out, &sub);
        out.push_str("\n</details>\n");
    }
    out
}

/// The whole reference page.
pub fn markdown(crds: &[CustomResourceDefinition]) -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated by `kvroute crdgen` from the Rust types in crds/src; do not edit. -->\n",
    );
    out.push_str("# CRD reference\n\n");
    out.push_str(
        "Every field of kvroute's custom resources, as the API server validates them: the \
         path (`[]` is a list item, `.*` a map value), the OpenAPI type, the default the server \
         fills in, the validation (bounds, enums, patterns and CEL rules with their messages) \
         and the description from the Rust doc comments. The guide to the CRDs, the \
         supported Kubernetes versions and the cost of the CEL rules is \
         [../crds.md](../crds.md). Fields a `validate()` in the operator checks beyond the \
         schema report `InvalidSpec` ([../troubleshooting.md](../troubleshooting.md)).\n\n",
    );
    for crd in crds {
        let kind = &crd.spec.names.kind;
        let _ = writeln!(out, "- [{kind}](#{})", anchor(kind));
    }
    for crd in crds {
        out.push('\n');
        out.push_str(&crd_section(crd));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(kind: &str) -> Value {
        let crd = crate::crds()
            .into_iter()
            .find(|c| c.spec.names.kind == kind)
            .expect("kind");
        serde_json::to_value(&crd.spec.versions[0].schema)
            .expect("serializes")
            .get("openAPIV3Schema")
            .cloned()
            .expect("schema")
    }

    #[test]
    fn every_leaf_of_every_schema_has_a_row_in_the_page() {
        let page = markdown(&crate::crds());
        for crd in crate::crds() {
            for r in rows(&schema(&crd.spec.names.kind)) {
                assert!(
                    page.contains(&format!("| `{}` |", r.path)),
                    "{} {}",
                    crd.spec.names.kind,
                    r.path
                );
            }
        }
    }

    #[test]
    fn rows_carry_type_default_validation_and_description() {
        let rows = rows(&schema("InferenceWorkerSet"));
        let block = rows
            .iter()
            .find(|r| r.path == "spec.blockSize")
            .expect("blockSize");
        assert_eq!(block.ty, "integer (int32)");
        assert_eq!(block.default, "16");
        assert_eq!(block.validation, "min 1; max 4096");
        assert!(block.description.starts_with("KV-cache block size"));
        let name = rows
            .iter()
            .find(|r| r.path == "spec.model.name")
            .expect("model.name");
        assert!(name.ty.ends_with(", required"), "{}", name.ty);
        let mode = rows
            .iter()
            .find(|r| r.path == "spec.engine.mode")
            .expect("mode");
        assert!(
            mode.validation.contains("one of `\"vllm\"`, `\"mock\"`"),
            "{}",
            mode.validation
        );
        let tokenizer = rows
            .iter()
            .find(|r| r.path == "spec.model.tokenizer")
            .expect("tokenizer");
        assert!(
            tokenizer.validation.contains("CEL `!has(self.path)"),
            "{}",
            tokenizer.validation
        );
    }

    #[test]
    fn every_embedded_path_exists_and_has_subfields() {
        for (kind, path, _) in EMBEDDED {
            let rows = rows(&schema(kind));
            assert!(rows.iter().any(|r| r.path == *path), "{kind} {path}");
            assert!(
                rows.iter().any(|r| r.path.starts_with(&format!("{path}."))),
                "{kind} {path} has no subfields"
            );
        }
    }

    #[test]
    fn pipes_in_rules_are_escaped_so_tables_keep_their_columns() {
        let page = markdown(&crate::crds());
        for line in page.lines().filter(|l| l.starts_with("| `")) {
            let cells = line.replace("\\|", "").matches('|').count();
            assert_eq!(cells, 6, "{line}");
        }
    }
}
