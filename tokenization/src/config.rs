//! Reading a HuggingFace tokenizer directory: which chat templates and special tokens it
//! declares. Pure parsing of file contents; [`crate::Tokenizer::from_dir`] does the reads.

use crate::TokenizeError;
use serde_json::Value;

/// The raw files of a tokenizer directory, as bytes/strings. Only `tokenizer.json` is
/// required.
#[derive(Debug, Clone, Default)]
pub struct TokenizerFiles {
    /// `tokenizer.json` (HuggingFace tokenizers format).
    pub tokenizer_json: Vec<u8>,
    /// `tokenizer_config.json`: chat template(s) and special tokens.
    pub tokenizer_config_json: Option<Vec<u8>>,
    /// `special_tokens_map.json` (legacy): read only when the config has no
    /// `added_tokens_decoder`, and then it overrides the config's special tokens.
    pub special_tokens_map_json: Option<Vec<u8>>,
    /// `chat_template.jinja`: when present, the default template (transformers v5 layout).
    pub chat_template_jinja: Option<String>,
    /// `generation_config.json`: its `eos_token_id` (int or list) adds stop ids.
    pub generation_config_json: Option<Vec<u8>>,
}

/// The named special tokens transformers exposes to templates (`special_tokens_map`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `bos_token`.
    pub bos_token: Option<String>,
    /// `eos_token`.
    pub eos_token: Option<String>,
    /// `unk_token`.
    pub unk_token: Option<String>,
    /// `sep_token`.
    pub sep_token: Option<String>,
    /// `pad_token`.
    pub pad_token: Option<String>,
    /// `cls_token`.
    pub cls_token: Option<String>,
    /// `mask_token`.
    pub mask_token: Option<String>,
}

impl SpecialTokens {
    /// `(name, token)` pairs for the tokens that are set, in transformers' order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("unk_token", &self.unk_token),
            ("sep_token", &self.sep_token),
            ("pad_token", &self.pad_token),
            ("cls_token", &self.cls_token),
            ("mask_token", &self.mask_token),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
    }

    fn slot(&mut self, name: &str) -> Option<&mut Option<String>> {
        Some(match name {
            "bos_token" => &mut self.bos_token,
            "eos_token" => &mut self.eos_token,
            "unk_token" => &mut self.unk_token,
            "sep_token" => &mut self.sep_token,
            "pad_token" => &mut self.pad_token,
            "cls_token" => &mut self.cls_token,
            "mask_token" => &mut self.mask_token,
            _ => return None,
        })
    }
}

/// The chat templates a directory declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DeclaredTemplates {
    /// The single template (string form or `chat_template.jinja`).
    pub single: Option<String>,
    /// Named templates (`[{"name": "default", "template": ...}, {"name": "tool_use", ...}]`).
    pub named: Vec<(String, String)>,
}

/// What the config files say.
#[derive(Debug, Clone, Default)]
pub(crate) struct DirConfig {
    pub templates: DeclaredTemplates,
    pub special: SpecialTokens,
    /// Extra EOS ids from generation_config.json.
    pub generation_eos_ids: Vec<u32>,
}

fn parse_json(what: &str, bytes: &[u8]) -> Result<Value, TokenizeError> {
    serde_json::from_slice(bytes).map_err(|e| TokenizeError::Load(format!("{what}: {e}")))
}

/// A special token is a string or an AddedToken object `{"content": ...}`.
fn token_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

pub(crate) fn parse_dir_config(files: &TokenizerFiles) -> Result<DirConfig, TokenizeError> {
    let mut out = DirConfig::default();
    let mut has_added_tokens_decoder = false;
    if let Some(bytes) = &files.tokenizer_config_json {
        let cfg = parse_json("tokenizer_config.json", bytes)?;
        match cfg.get("chat_template") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => out.templates.single = Some(s.clone()),
            Some(Value::Array(items)) => {
                for item in items {
                    let name = item.get("name").and_then(Value::as_str);
                    let template = item.get("template").and_then(Value::as_str);
                    match (name, template) {
                        (Some(n), Some(t)) => {
                            out.templates.named.push((n.to_string(), t.to_string()))
                        }
                        _ => {
                            return Err(TokenizeError::Load(
                                "tokenizer_config.json: chat_template entries need name and template"
                                    .into(),
                            ));
                        }
                    }
                }
            }
            Some(_) => {
                return Err(TokenizeError::Load(
                    "tokenizer_config.json: chat_template must be a string or a list".into(),
                ));
            }
        }
        has_added_tokens_decoder = cfg.get("added_tokens_decoder").is_some();
        for name in [
            "bos_token",
            "eos_token",
            "unk_token",
            "sep_token",
            "pad_token",
            "cls_token",
            "mask_token",
        ] {
            if let (Some(v), Some(slot)) = (cfg.get(name), out.special.slot(name)) {
                *slot = token_string(v);
            }
        }
    }
    // transformers reads the legacy special_tokens_map.json only when the config has no
    // added_tokens_decoder, and then its values win.
    if let Some(bytes) = files
        .special_tokens_map_json
        .as_ref()
        .filter(|_| !has_added_tokens_decoder)
    {
        let map = parse_json("special_tokens_map.json", bytes)?;
        if let Some(obj) = map.as_object() {
            for (name, v) in obj {
                if let Some(slot) = out.special.slot(name) {
                    *slot = token_string(v);
                }
            }
        }
    }
    if let Some(jinja) = &files.chat_template_jinja {
        out.templates.single = Some(jinja.clone());
        out.templates.named.retain(|(n, _)| n != "default");
    }
    if let Some(bytes) = &files.generation_config_json {
        let cfg = parse_json("generation_config.json", bytes)?;
        match cfg.get("eos_token_id") {
            Some(Value::Number(n)) => out
                .generation_eos_ids
                .extend(n.as_u64().and_then(|n| u32::try_from(n).ok())),
            Some(Value::Array(ids)) => out.generation_eos_ids.extend(
                ids.iter()
                    .filter_map(Value::as_u64)
                    .filter_map(|n| u32::try_from(n).ok()),
            ),
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_named_templates_and_added_token_objects() {
        let files = TokenizerFiles {
            tokenizer_config_json: Some(
                br#"{"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}],
                    "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>", "unk_token": null}"#
                    .to_vec(),
            ),
            special_tokens_map_json: Some(br#"{"unk_token": "<unk>", "eos_token": "<other>"}"#.to_vec()),
            generation_config_json: Some(br#"{"eos_token_id": [2, 7]}"#.to_vec()),
            ..TokenizerFiles::default()
        };
        let cfg = parse_dir_config(&files).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cfg.templates.named.len(), 2);
        assert_eq!(cfg.special.bos_token.as_deref(), Some("<s>"));
        assert_eq!(cfg.special.eos_token.as_deref(), Some("<other>"));
        assert_eq!(cfg.special.unk_token.as_deref(), Some("<unk>"));
        assert_eq!(cfg.generation_eos_ids, vec![2, 7]);
    }

    #[test]
    fn bad_config_is_an_error() {
        let files = TokenizerFiles {
            tokenizer_config_json: Some(b"{\"chat_template\": 5}".to_vec()),
            ..TokenizerFiles::default()
        };
        assert!(parse_dir_config(&files).is_err());
        let files = TokenizerFiles {
            tokenizer_config_json: Some(b"not json".to_vec()),
            ..TokenizerFiles::default()
        };
        assert!(parse_dir_config(&files).is_err());
    }
}
