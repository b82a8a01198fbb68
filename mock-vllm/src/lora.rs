//! LoRA adapters as vLLM serves them: `--lora-modules` (both spellings), the adapters' cards
//! in `/v1/models`, and the set that `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`
//! change at runtime. The mock has no weights: an adapter is a name (which separates its KV
//! cache from the base model's and other adapters') and a path it only reports. Pure.
//!
//! ```text
//! --lora-modules name=path | {"name","path","base_model_name"} --parse_module--> LoraModule
//!   --> Adapters { name -> module } --cards--> /v1/models entries (id = name, parent = base)
//!   request `model` --resolve--> Served::{Base, Adapter(name)} --> engine lora_name
//! ```

use serde::Deserialize;
use serde_json::{Value, json};

/// One adapter: what `--lora-modules` or `/v1/load_lora_adapter` named.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct LoraModule {
    /// The name clients send as `model` (vLLM's `lora_name`).
    pub name: String,
    /// Where the weights are (reported as the card's `root`; never read).
    pub path: String,
    /// The base model named in the JSON form; `None`: the first served model name.
    #[serde(default)]
    pub base_model_name: Option<String>,
}

/// Parses one `--lora-modules` value as vLLM does: `name=path`, or a JSON object with
/// `name`, `path` and optionally `base_model_name`.
pub fn parse_module(value: &str) -> Result<LoraModule, String> {
    let value = value.trim();
    if value.starts_with('{') {
        let m: LoraModule = serde_json::from_str(value)
            .map_err(|e| format!("invalid JSON for --lora-modules: {e}"))?;
        if m.name.is_empty() || m.path.is_empty() {
            return Err("--lora-modules JSON needs a non-empty `name` and `path`".into());
        }
        return Ok(m);
    }
    match value.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => Ok(LoraModule {
            name: name.to_string(),
            path: path.to_string(),
            base_model_name: None,
        }),
        _ => Err(format!(
            "invalid --lora-modules value `{value}`: expected name=path or a JSON object"
        )),
    }
}

/// What a request's `model` names on this server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Served {
    /// A base model name (or no `model` at all).
    Base,
    /// This adapter: the engine hashes and publishes its blocks under its name.
    Adapter(String),
}

/// Why loading or unloading an adapter failed, with vLLM's status and message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// The request body lacks a field.
    #[error("{0}")]
    BadRequest(String),
    /// An adapter of that name is loaded already.
    #[error("The lora adapter '{0}' has already been loaded.")]
    AlreadyLoaded(String),
    /// No adapter of that name is loaded.
    #[error("The lora adapter '{0}' cannot be found.")]
    NotFound(String),
}

impl AdapterError {
    /// The HTTP status vLLM answers with.
    pub fn status(&self) -> u16 {
        match self {
            AdapterError::BadRequest(_) | AdapterError::AlreadyLoaded(_) => 400,
            AdapterError::NotFound(_) => 404,
        }
    }
}

/// The adapters a server has loaded, in load order.
#[derive(Clone, Debug, Default)]
pub struct Adapters {
    modules: Vec<LoraModule>,
}

impl Adapters {
    /// The adapters of `--lora-modules`; a repeated name keeps its last definition.
    pub fn new(modules: Vec<LoraModule>) -> Self {
        let mut out = Adapters::default();
        for m in modules {
            out.modules.retain(|x| x.name != m.name);
            out.modules.push(m);
        }
        out
    }

    /// Names of the loaded adapters.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.modules.iter().map(|m| m.name.as_str())
    }

    /// What `model` names: a base name in `served`, a loaded adapter, or nothing (`None`).
    /// A request without `model` uses the base.
    pub fn resolve(&self, model: Option<&str>, served: &[String]) -> Option<Served> {
        let Some(model) = model else {
            return Some(Served::Base);
        };
        if served.iter().any(|s| s == model) {
            return Some(Served::Base);
        }
        self.modules
            .iter()
            .any(|m| m.name == model)
            .then(|| Served::Adapter(model.to_string()))
    }

    /// `/v1/load_lora_adapter` with body `{"lora_name", "lora_path"}`.
    pub fn load(&mut self, body: &Value) -> Result<String, AdapterError> {
        let field = |k: &str| {
            body.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let (Some(name), Some(path)) = (field("lora_name"), field("lora_path")) else {
            return Err(AdapterError::BadRequest(
                "Both 'lora_name' and 'lora_path' must be provided.".into(),
            ));
        };
        if self.modules.iter().any(|m| m.name == name) {
            return Err(AdapterError::AlreadyLoaded(name));
        }
        self.modules.push(LoraModule {
            name: name.clone(),
            path,
            base_model_name: None,
        });
        Ok(format!(
            "Success: LoRA adapter '{name}' added successfully."
        ))
    }

    /// `/v1/unload_lora_adapter` with body `{"lora_name"}`.
    pub fn unload(&mut self, body: &Value) -> Result<String, AdapterError> {
        let Some(name) = body.get("lora_name").and_then(Value::as_str) else {
            return Err(AdapterError::BadRequest(
                "'lora_name' needs to be provided to unload a LoRA adapter.".into(),
            ));
        };
        let before = self.modules.len();
        self.modules.retain(|m| m.name != name);
        if self.modules.len() == before {
            return Err(AdapterError::NotFound(name.to_string()));
        }
        Ok(format!(
            "Success: LoRA adapter '{name}' removed successfully."
        ))
    }

    /// The adapters' `/v1/models` cards, as vLLM writes them: `id` the adapter's name, `root`
    /// its path, `parent` its base model (the JSON form's `base_model_name`, else `base`, the
    /// first served name); no `max_model_len`.
    pub fn cards(&self, base: &str, created: u64) -> Vec<Value> {
        self.modules
            .iter()
            .map(|m| {
                json!({
                    "id": m.name, "object": "model", "created": created, "owned_by": "vllm",
                    "root": m.path,
                    "parent": m.base_model_name.as_deref().unwrap_or(base),
                    "max_model_len": null,
                    "permission": [permission(&m.name, created)]
                })
            })
            .collect()
    }
}

/// A model card's permission entry, as vLLM writes it.
pub fn permission(name: &str, created: u64) -> Value {
    json!({
        "id": format!("modelperm-{name}"), "object": "model_permission",
        "created": created, "allow_create_engine": false, "allow_sampling": true,
        "allow_logprobs": true, "allow_search_indices": false, "allow_view": true,
        "allow_fine_tuning": false, "organization": "*", "group": null,
        "is_blocking": false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_of_lora_modules_parse() {
        assert_eq!(
            parse_module("sql=/adapters/sql").unwrap(),
            LoraModule {
                name: "sql".into(),
                path: "/adapters/sql".into(),
                base_model_name: None
            }
        );
        // A path may itself contain '='.
        assert_eq!(parse_module("a=/p=q").unwrap().path, "/p=q");
        let m =
            parse_module(r#"{"name": "de", "path": "/a/de", "base_model_name": "qwen3"}"#).unwrap();
        assert_eq!(
            (m.name.as_str(), m.base_model_name.as_deref()),
            ("de", Some("qwen3"))
        );
        for bad in ["sql", "=p", "n=", r#"{"name": "x"}"#, "{not json"] {
            assert!(parse_module(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn resolve_cards_load_and_unload() {
        let served = vec!["base".to_string()];
        let mut a = Adapters::new(vec![
            parse_module("sql=/old").unwrap(),
            parse_module(r#"{"name":"de","path":"/de","base_model_name":"other"}"#).unwrap(),
            parse_module("sql=/new").unwrap(),
        ]);
        assert_eq!(a.names().collect::<Vec<_>>(), ["de", "sql"]);
        assert_eq!(a.resolve(Some("base"), &served), Some(Served::Base));
        assert_eq!(a.resolve(None, &served), Some(Served::Base));
        assert_eq!(
            a.resolve(Some("sql"), &served),
            Some(Served::Adapter("sql".into()))
        );
        assert_eq!(a.resolve(Some("nope"), &served), None);
        let cards = a.cards("base", 7);
        assert_eq!(cards[0]["parent"], "other");
        assert_eq!(
            (&cards[1]["root"], &cards[1]["parent"]),
            (&json!("/new"), &json!("base"))
        );

        let load = json!({"lora_name": "fr", "lora_path": "/fr"});
        assert!(a.load(&load).unwrap().contains("'fr' added"));
        assert_eq!(a.load(&load), Err(AdapterError::AlreadyLoaded("fr".into())));
        assert_eq!(
            a.load(&json!({"lora_name": "x"})).unwrap_err().status(),
            400
        );
        assert!(a.unload(&json!({"lora_name": "fr"})).is_ok());
        let gone = a.unload(&json!({"lora_name": "fr"})).unwrap_err();
        assert_eq!(gone.status(), 404);
        assert_eq!(a.resolve(Some("fr"), &served), None);
    }
}
