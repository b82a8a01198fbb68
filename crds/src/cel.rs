//! Static checks of the CEL rules (`x-kubernetes-validations`) in the generated CRD schemas,
//! against what makes API servers from 1.25 on refuse a CRD: a rule's estimated cost grows with
//! the size of every list, map and string it walks, and an unbounded one is estimated from the
//! largest request the server accepts (about 3 MB), which puts even one `all()` over a list of
//! strings in the millions. So every list, map or string that a rule walks must carry
//! `maxItems`, `maxProperties` or `maxLength` (an `enum` bounds a string too), and a rule inside
//! a list is evaluated once per item, so that list must be bounded as well. The worst-case cost
//! of each rule is worked out in `docs/crds.md`.
//!
//! ```text
//! openAPIV3Schema --walk--> node with rules --tokens--> member chains (self.a.b, t.c)
//!   --resolve against the node (macro variables bind to list items)--> schema of each chain
//!   --walked? (all/exists/exists_one/map/filter, size(), in, string functions, comparisons)
//!   --bounded? --> Finding
//! ```
//!
//! This is not a CEL parser: it reads member chains, the calls right after them and the
//! operators right next to them, which is all the shapes kvroute's rules use. A macro
//! variable stays bound to the rest of the rule (names are not reused across macros here).

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

/// A rule that the API server's cost estimate would treat as unbounded, or that refers to a
/// field the schema lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Schema location of the rule, e.g. `spec.targets[]`.
    pub location: String,
    /// The rule's expression.
    pub rule: String,
    /// What is unbounded (or unknown) and why it matters.
    pub problem: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: `{}`: {}", self.location, self.rule, self.problem)
    }
}

/// Macros that evaluate their body once per list item (or map key).
const ITERATING: &[&str] = &["all", "exists", "exists_one", "map", "filter"];
/// Functions whose cost grows with the length of their receiver (a string or a list).
const TRAVERSING: &[&str] = &[
    "size",
    "startsWith",
    "endsWith",
    "contains",
    "matches",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "substring",
    "trim",
    "join",
    "charAt",
];
/// Binary operators that compare whole values (strings and lists compare item by item).
const COMPARISONS: &[&str] = &["==", "!=", "<", "<=", ">", ">="];

/// Checks every rule of an `openAPIV3Schema` (a CRD version's schema root).
pub fn check_schema(root: &Value) -> Vec<Finding> {
    let mut findings = Vec::new();
    walk(root, "", None, &mut findings);
    findings
}

/// Every rule of a schema with its location, in schema order (for documentation and tests).
pub fn rules(root: &Value) -> Vec<(String, String)> {
    fn collect(node: &Value, at: &str, out: &mut Vec<(String, String)>) {
        for rule in node_rules(node) {
            out.push((at.to_string(), rule.to_string()));
        }
        children(node, at, &mut |child, path, _| collect(child, &path, out));
    }
    let mut out = Vec::new();
    collect(root, "", &mut out);
    out
}

fn node_rules(node: &Value) -> impl Iterator<Item = &str> {
    node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["rule"].as_str())
}

/// Calls `f(child, path, unbounded_container)` for each property, list item and map value;
/// the flag says the child repeats without a bound.
fn children(node: &Value, at: &str, f: &mut dyn FnMut(&Value, String, bool)) {
    let join = |name: &str| {
        if at.is_empty() {
            name.to_string()
        } else {
            format!("{at}.{name}")
        }
    };
    if let Some(props) = node["properties"].as_object() {
        for (name, child) in props {
            f(child, join(name), false);
        }
    }
    if node["items"].is_object() {
        f(
            &node["items"],
            format!("{at}[]"),
            node.get("maxItems").is_none(),
        );
    }
    if node["additionalProperties"].is_object() {
        f(
            &node["additionalProperties"],
            format!("{at}{{}}"),
            node.get("maxProperties").is_none(),
        );
    }
}

fn walk(node: &Value, at: &str, repeated_by: Option<&str>, out: &mut Vec<Finding>) {
    for rule in node_rules(node) {
        if let Some(list) = repeated_by {
            out.push(Finding {
                location: at.to_string(),
                rule: rule.to_string(),
                problem: format!(
                    "runs once per item of `{list}`, which has no maxItems/maxProperties"
                ),
            });
        }
        check_rule(rule, node, at, out);
    }
    children(node, at, &mut |child, path, unbounded| {
        let repeated = if unbounded {
            Some(at.to_string())
        } else {
            repeated_by.map(str::to_string)
        };
        walk(child, &path, repeated.as_deref(), out);
    });
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Op(String),
    Literal,
}

fn tokens(rule: &str) -> Vec<Token> {
    let chars: Vec<char> = rule.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '\'' || c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Token::Literal);
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            out.push(Token::Literal);
        } else {
            let two: String = chars[i..chars.len().min(i + 2)].iter().collect();
            if ["==", "!=", "<=", ">=", "&&", "||"].contains(&two.as_str()) {
                out.push(Token::Op(two));
                i += 2;
            } else {
                out.push(Token::Op(c.to_string()));
                i += 1;
            }
        }
    }
    out
}

fn is_op(t: Option<&Token>, ops: &[&str]) -> bool {
    matches!(t, Some(Token::Op(o)) if ops.contains(&o.as_str()))
}

fn is_ident(t: Option<&Token>, name: &str) -> bool {
    matches!(t, Some(Token::Ident(i)) if i == name)
}

/// `Some(kind)` when walking `schema` has no bound: "list", "map" or "string".
fn unbounded(schema: &Value) -> Option<&'static str> {
    match schema["type"].as_str() {
        Some("array") if schema.get("maxItems").is_none() => Some("list"),
        Some("string") if schema.get("maxLength").is_none() && schema.get("enum").is_none() => {
            Some("string")
        }
        Some("object")
            if schema["additionalProperties"].is_object()
                && schema.get("maxProperties").is_none() =>
        {
            Some("map")
        }
        _ => None,
    }
}

fn check_rule(rule: &str, node: &Value, at: &str, out: &mut Vec<Finding>) {
    let toks = tokens(rule);
    let mut vars: HashMap<String, Value> = HashMap::from([("self".to_string(), node.clone())]);
    let mut report = |problem: String| {
        let f = Finding {
            location: at.to_string(),
            rule: rule.to_string(),
            problem,
        };
        if !out.contains(&f) {
            out.push(f);
        }
    };
    let mut i = 0;
    while i < toks.len() {
        let starts_chain = matches!(&toks[i], Token::Ident(_))
            && !is_op(i.checked_sub(1).and_then(|p| toks.get(p)), &["."]);
        if !starts_chain {
            i += 1;
            continue;
        }
        let start = i;
        let mut names = Vec::new();
        let mut j = i;
        while let Some(Token::Ident(name)) = toks.get(j) {
            names.push(name.clone());
            if is_op(toks.get(j + 1), &["."]) && matches!(toks.get(j + 2), Some(Token::Ident(_))) {
                j += 2;
            } else {
                break;
            }
        }
        let end = j + 1; // first token after the chain
        i = end;
        let Some(root) = vars.get(&names[0]).cloned() else {
            continue; // a function name, keyword or literal, not a variable
        };
        let call = is_op(toks.get(end), &["("]);
        let (fields, method) = if call && names.len() > 1 {
            (&names[..names.len() - 1], names.last().map(String::as_str))
        } else {
            (&names[..], None)
        };
        let chain = fields.join(".");
        let mut schema = root;
        let mut resolved = true;
        for field in &fields[1..] {
            let next = if schema["properties"][field].is_object() {
                schema["properties"][field].clone()
            } else if schema["additionalProperties"].is_object() {
                schema["additionalProperties"].clone()
            } else {
                resolved = false;
                break;
            };
            schema = next;
        }
        if !resolved {
            report(format!("`{chain}` is not a field of the schema"));
            continue;
        }
        let before = start.checked_sub(1).and_then(|p| toks.get(p));
        let after = toks.get(end);
        let mut walked_by = None;
        if let Some(m) = method {
            if ITERATING.contains(&m) {
                walked_by = Some(format!("{m}()"));
                if schema["type"] == "array"
                    && let Some(Token::Ident(var)) = toks.get(end + 1)
                    && is_op(toks.get(end + 2), &[","])
                {
                    vars.insert(var.clone(), schema["items"].clone());
                }
            } else if TRAVERSING.contains(&m) {
                walked_by = Some(format!("{m}()"));
            }
        } else if is_ident(before, "in") {
            walked_by = Some("`in`".to_string());
            if let Some(kind) = unbounded(&schema["items"]) {
                report(format!(
                    "the items of `{chain}` are compared by `in` but are an unbounded {kind}"
                ));
            }
        } else if is_op(before, &["("])
            && is_ident(start.checked_sub(2).and_then(|p| toks.get(p)), "size")
            && is_op(after, &[")"])
        {
            walked_by = Some("size()".to_string());
        } else if matches!(schema["type"].as_str(), Some("string" | "array"))
            && (is_op(before, COMPARISONS) || is_op(after, COMPARISONS) || is_ident(after, "in"))
        {
            walked_by = Some("a comparison".to_string());
        }
        if let Some(by) = walked_by
            && let Some(kind) = unbounded(&schema)
        {
            report(format!(
                "`{chain}` is walked by {by} but is an unbounded {kind} (add {})",
                match kind {
                    "list" => "maxItems",
                    "map" => "maxProperties",
                    _ => "maxLength or an enum",
                }
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problems(schema: Value) -> Vec<String> {
        check_schema(&schema)
            .into_iter()
            .map(|f| f.problem)
            .collect()
    }

    /// A hand-made schema with the InferencePolicy rule that API servers refused: two lists
    /// of strings without bounds, one walked by `all()`, the other by `in`.
    fn subset_rule(list: Value) -> Value {
        json!({
            "type": "object",
            "properties": {"route": {
                "type": "object",
                "properties": {"allowed": list.clone(), "preferred": list},
                "x-kubernetes-validations": [{"rule": "self.preferred.all(t, t in self.allowed)"}]
            }}
        })
    }

    #[test]
    fn unbounded_lists_and_their_strings_are_found() {
        let found = problems(subset_rule(
            json!({"type": "array", "items": {"type": "string"}}),
        ));
        assert_eq!(
            found,
            [
                "`self.preferred` is walked by all() but is an unbounded list (add maxItems)",
                "`t` is walked by a comparison but is an unbounded string (add maxLength or an enum)",
                "the items of `self.allowed` are compared by `in` but are an unbounded string",
                "`self.allowed` is walked by `in` but is an unbounded list (add maxItems)",
            ]
        );
        let bounded =
            json!({"type": "array", "maxItems": 64, "items": {"type": "string", "maxLength": 253}});
        assert_eq!(problems(subset_rule(bounded)), Vec::<String>::new());
    }

    #[test]
    fn nested_fields_size_and_string_functions_are_resolved() {
        let schema = |url: Value| {
            json!({
                "type": "object",
                "properties": {"backend": {"type": "object", "properties": {"url": url,
                    "kind": {"type": "string", "enum": ["a", "bb"]}}}},
                "x-kubernetes-validations": [
                    {"rule": "size(self.backend.url) < 2048 && self.backend.kind == 'a'"},
                    {"rule": "self.backend.url.startsWith('https://')"},
                    {"rule": "has(self.backend.urls)"}
                ]
            })
        };
        assert_eq!(
            problems(schema(json!({"type": "string"}))),
            [
                "`self.backend.url` is walked by size() but is an unbounded string (add maxLength or an enum)",
                "`self.backend.url` is walked by startsWith() but is an unbounded string (add maxLength or an enum)",
                "`self.backend.urls` is not a field of the schema",
            ]
        );
        assert_eq!(
            problems(schema(json!({"type": "string", "maxLength": 2048}))),
            ["`self.backend.urls` is not a field of the schema"]
        );
    }

    #[test]
    fn a_rule_inside_an_unbounded_list_is_found_and_scalars_pass() {
        let schema = json!({
            "type": "object",
            "properties": {"targets": {"type": "array", "items": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "x-kubernetes-validations": [{"rule": "self.a != self.b"}]
            }}}
        });
        assert_eq!(
            problems(schema),
            ["runs once per item of `targets`, which has no maxItems/maxProperties"]
        );
    }

    #[test]
    fn rules_are_listed_with_their_location() {
        let r = rules(&subset_rule(json!({"type": "array"})));
        assert_eq!(
            r,
            [(
                "route".to_string(),
                "self.preferred.all(t, t in self.allowed)".to_string()
            )]
        );
    }
}
