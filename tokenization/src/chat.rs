//! The chat request as vLLM reads it, and the conversation it hands to the template.
//!
//! vLLM 0.33 (`vllm/renderers/chat_utils/chat_message.py`, `vllm/renderers/hf.py`) rebuilds
//! every message before rendering: content parts become one string (or a list of typed parts
//! for templates that loop over content), assistant tool-call arguments become objects, a
//! `developer` message becomes `system` when the template does not mention that role, and
//! the request's knobs are merged into the template variables. This module does the same,
//! without I/O, so the router and the mock worker produce vLLM's exact prompt.

use crate::TokenizeError;
use crate::template::ContentFormat;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The parts of an OpenAI `/v1/chat/completions` (or vLLM `/tokenize` with `messages`) body
/// that decide the prompt. Deserialise it straight from the request body: other fields are
/// ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The messages, as sent (OpenAI shape: role, content string or parts, name, tool_calls,
    /// tool_call_id, reasoning / reasoning_content).
    pub messages: Vec<Value>,
    /// Tool definitions (`[{"type": "function", "function": {...}}]`). Absent means the
    /// template sees `tools = none` (never `[]`); an empty list is treated as absent, as
    /// vLLM's `/tokenize` does (its chat route rejects `[]` with a 400 instead).
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// RAG documents handed to the template as `documents`.
    #[serde(default)]
    pub documents: Option<Vec<Value>>,
    /// Append the assistant header (vLLM default: true).
    #[serde(default = "default_true")]
    pub add_generation_prompt: bool,
    /// Leave the final message open so the model continues it (vLLM default: false; an error
    /// together with `add_generation_prompt`).
    #[serde(default)]
    pub continue_final_message: bool,
    /// Encode with the tokenizer's special tokens (BOS...). vLLM's chat default is false: the
    /// template emits them.
    #[serde(default)]
    pub add_special_tokens: bool,
    /// A template (Jinja source, or the name of one of the tokenizer's named templates) that
    /// replaces the tokenizer's. vLLM accepts it only with `--trust-request-chat-template`;
    /// that policy is the caller's.
    #[serde(default)]
    pub chat_template: Option<String>,
    /// Extra template variables (e.g. `enable_thinking`).
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// OpenAI reasoning effort. vLLM passes it to the template as `reasoning_effort` and, unless
    /// `chat_template_kwargs` sets `enable_thinking`, sets `enable_thinking = effort != "none"`.
    #[serde(default)]
    pub reasoning_effort: Option<String>,
}

fn default_true() -> bool {
    true
}

impl ChatRequest {
    /// A request with these messages and vLLM's defaults for everything else.
    pub fn new(messages: Vec<Value>) -> Self {
        ChatRequest {
            messages,
            tools: None,
            documents: None,
            add_generation_prompt: true,
            continue_final_message: false,
            add_special_tokens: false,
            chat_template: None,
            chat_template_kwargs: None,
            reasoning_effort: None,
        }
    }
}

impl Default for ChatRequest {
    fn default() -> Self {
        ChatRequest::new(Vec::new())
    }
}

/// Parameters of HF's `apply_chat_template`: consumed by it, never template variables.
const HF_PARAMS: &[&str] = &[
    "conversation",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
    "sanitize_control_tokens",
];

/// Everything the template call needs besides the template itself.
#[derive(Debug, Clone)]
pub(crate) struct TemplateInputs {
    /// `tools` after vLLM's normalisation (`None` when absent).
    pub tools: Option<Value>,
    pub documents: Option<Value>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// Template variables from kwargs (HF parameters removed).
    pub extra_vars: Map<String, Value>,
}

/// vLLM's kwargs merge: `build_chat_params` then `with_defaults` then HF's own parameters.
pub(crate) fn template_inputs(req: &ChatRequest) -> Result<TemplateInputs, TokenizeError> {
    let user = req.chat_template_kwargs.clone().unwrap_or_default();
    for bad in ["chat_template", "tokenize"] {
        if user.contains_key(bad) {
            return Err(TokenizeError::InvalidRequest(format!(
                "Found unexpected chat template kwargs from request: {{'{bad}'}}"
            )));
        }
    }
    // merge_kwargs(defaults, overrides): overrides win unless they are None or "auto".
    fn merge(mut base: Map<String, Value>, overrides: Map<String, Value>) -> Map<String, Value> {
        for (k, v) in overrides {
            if v.is_null() || v.as_str() == Some("auto") {
                continue;
            }
            base.insert(k, v);
        }
        base
    }
    let mut extra = Map::new();
    extra.insert(
        "add_generation_prompt".into(),
        Value::Bool(req.add_generation_prompt),
    );
    extra.insert(
        "continue_final_message".into(),
        Value::Bool(req.continue_final_message),
    );
    extra.insert(
        "documents".into(),
        req.documents
            .clone()
            .map(Value::Array)
            .unwrap_or(Value::Null),
    );
    extra.insert(
        "reasoning_effort".into(),
        req.reasoning_effort
            .clone()
            .map(Value::String)
            .unwrap_or(Value::Null),
    );
    if let Some(effort) = &req.reasoning_effort
        && !user.contains_key("enable_thinking")
    {
        extra.insert("enable_thinking".into(), Value::Bool(effort != "none"));
    }
    let params = merge(user, extra);

    let tools = match &req.tools {
        Some(list) if !list.is_empty() => Value::Array(normalize_tools(list)?),
        _ => Value::Null,
    };
    let mut defaults = Map::new();
    defaults.insert("tools".into(), tools);
    let mut kwargs = merge(defaults, params);

    let tools = kwargs.remove("tools").filter(|v| !v.is_null());
    let documents = kwargs.remove("documents").filter(|v| !v.is_null());
    let add_generation_prompt = kwargs
        .remove("add_generation_prompt")
        .is_some_and(|v| truthy(&v));
    let continue_final_message = kwargs
        .remove("continue_final_message")
        .is_some_and(|v| truthy(&v));
    if continue_final_message && add_generation_prompt {
        return Err(TokenizeError::InvalidRequest(
            "continue_final_message and add_generation_prompt are not compatible. Use \
             continue_final_message when you want the model to continue the final message, and \
             add_generation_prompt when you want to add a header that will prompt it to start a \
             new assistant message instead."
                .into(),
        ));
    }
    kwargs.retain(|k, _| !HF_PARAMS.contains(&k.as_str()));
    Ok(TemplateInputs {
        tools,
        documents,
        add_generation_prompt,
        continue_final_message,
        extra_vars: kwargs,
    })
}

/// Python truthiness of a JSON value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// `ChatCompletionToolsParam.model_dump()`: `{"type": "function", "function": {"name",
/// "description", "parameters", ["strict"], ["defer_loading"]}, ["defer_loading"]}`, unknown
/// fields dropped, missing description/parameters as null.
fn normalize_tools(tools: &[Value]) -> Result<Vec<Value>, TokenizeError> {
    let bad = |i: usize, why: &str| TokenizeError::InvalidRequest(format!("tools[{i}]: {why}"));
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let tool = tool
            .as_object()
            .ok_or_else(|| bad(i, "must be an object"))?;
        match tool.get("type") {
            None => {}
            Some(Value::String(t)) if t == "function" => {}
            Some(_) => return Err(bad(i, "type must be \"function\"")),
        }
        let function = tool
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(i, "function must be an object"))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(i, "function.name must be a string"))?;
        let description = match function.get("description") {
            None | Some(Value::Null) => Value::Null,
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(_) => return Err(bad(i, "function.description must be a string")),
        };
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => Value::Null,
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(bad(i, "function.parameters must be an object")),
        };
        let opt_bool = |v: Option<&Value>, what: &str| -> Result<Option<bool>, TokenizeError> {
            match v {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(_) => Err(bad(i, &format!("{what} must be a boolean"))),
            }
        };
        let strict = opt_bool(function.get("strict"), "function.strict")?;
        let tool_defer = opt_bool(tool.get("defer_loading"), "defer_loading")?;
        let fn_defer =
            opt_bool(function.get("defer_loading"), "function.defer_loading")?.or(tool_defer);

        let mut f = Map::new();
        f.insert("name".into(), Value::String(name.to_string()));
        f.insert("description".into(), description);
        f.insert("parameters".into(), parameters);
        if let Some(s) = strict {
            f.insert("strict".into(), Value::Bool(s));
        }
        if let Some(d) = fn_defer {
            f.insert("defer_loading".into(), Value::Bool(d));
        }
        let mut t = Map::new();
        t.insert("type".into(), Value::String("function".into()));
        t.insert("function".into(), Value::Object(f));
        if let Some(d) = tool_defer {
            t.insert("defer_loading".into(), Value::Bool(d));
        }
        out.push(Value::Object(t));
    }
    Ok(out)
}

/// Content-part types vLLM reads as text, with the field holding the text.
fn text_field(part_type: &str) -> Option<&'static str> {
    match part_type {
        "text" | "input_text" | "output_text" => Some("text"),
        "refusal" => Some("refusal"),
        "thinking" => Some("thinking"),
        _ => None,
    }
}

/// Media part types and the modality vLLM gives them.
fn media_modality(part_type: &str) -> Option<&'static str> {
    match part_type {
        "image_url" | "input_image" | "image_embeds" | "image_pil" => Some("image"),
        "audio_url" | "input_audio" | "audio_embeds" => Some("audio"),
        "video_url" | "video_embeds" => Some("video"),
        _ => None,
    }
}

/// Keys vLLM knows on content parts; other keys ride along in "openai" format.
const KNOWN_PART_FIELDS: &[&str] = &[
    "type",
    "text",
    "refusal",
    "thinking",
    "image_url",
    "input_audio",
    "audio_url",
    "video_url",
    "image_embeds",
    "audio_embeds",
    "video_embeds",
    "image_pil",
    "uuid",
    "data",
    "name",
    "detail",
    "file",
    "file_id",
    "signature",
];

/// One parsed content part.
enum Part {
    Text(String, Map<String, Value>),
    Media(&'static str, Map<String, Value>),
    ToolReference(String),
}

fn extra_fields(part: &Map<String, Value>) -> Map<String, Value> {
    part.iter()
        .filter(|(k, _)| !KNOWN_PART_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn parse_part(index: usize, part: &Value) -> Result<Option<Part>, TokenizeError> {
    let bad = |reason: String| TokenizeError::InvalidMessage { index, reason };
    let part = match part {
        Value::String(s) => return Ok(Some(Part::Text(s.clone(), Map::new()))),
        Value::Object(o) => o,
        _ => return Err(bad("content parts must be strings or objects".into())),
    };
    let uuid = part.get("uuid").filter(|v| !v.is_null());
    match part.get("type") {
        Some(Value::String(t)) if uuid.is_none() => {
            if let Some(field) = text_field(t) {
                return match part.get(field) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(Part::Text(s.clone(), extra_fields(part)))),
                    Some(_) => Err(bad(format!("content part '{t}': {field} must be a string"))),
                };
            }
            if let Some(modality) = media_modality(t) {
                return Ok(Some(Part::Media(modality, extra_fields(part))));
            }
            if t == "tool_reference" {
                let name = part.get("name").and_then(Value::as_str).unwrap_or_default();
                return Ok(Some(Part::ToolReference(name.to_string())));
            }
            Err(bad(format!("Unsupported chat content part type: '{t}'")))
        }
        Some(Value::Null) | None | Some(Value::String(_)) => {
            // No type (or a uuid): vLLM looks for a direct media key.
            for key in [
                "image_url",
                "image_pil",
                "image_embeds",
                "audio_embeds",
                "video_embeds",
                "audio_url",
                "input_audio",
                "video_url",
            ] {
                if part.contains_key(key)
                    && let Some(modality) = media_modality(key)
                {
                    return Ok(Some(Part::Media(modality, extra_fields(part))));
                }
            }
            if part.contains_key("tool_reference") {
                let name = part.get("name").and_then(Value::as_str).unwrap_or_default();
                return Ok(Some(Part::ToolReference(name.to_string())));
            }
            Err(bad("Missing 'type' field in multimodal part.".into()))
        }
        Some(_) => Err(bad("Invalid 'type' field in multimodal part.".into())),
    }
}

/// Claude Code puts a per-request billing line at the head of system text; vLLM drops it so
/// the prefix stays cacheable.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

fn strip_billing_header(parts: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        let text = match &part {
            Value::String(s) => Some(s.as_str()),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("text") => {
                o.get("text").and_then(Value::as_str)
            }
            _ => None,
        };
        match text {
            Some(t) if t.starts_with(BILLING_HEADER) => {
                let rest = t.split_once('\n').map(|(_, r)| r).unwrap_or("");
                if rest.is_empty() {
                    continue;
                }
                let rest = rest.to_string();
                out.push(match part {
                    Value::Object(mut o) => {
                        o.insert("text".into(), Value::String(rest));
                        Value::Object(o)
                    }
                    _ => Value::String(rest),
                });
            }
            _ => out.push(part),
        }
    }
    out
}

/// Builds vLLM's `ConversationMessage` list from the request's messages.
pub(crate) fn build_conversation(
    messages: &[Value],
    format: ContentFormat,
    supports_developer: bool,
) -> Result<Vec<Value>, TokenizeError> {
    if messages.is_empty() {
        return Err(TokenizeError::InvalidRequest(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
                .into(),
        ));
    }
    let mut conversation = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        conversation.push(build_message(index, message, format)?);
    }
    postprocess_tool_calls(&mut conversation)?;
    let has_developer = conversation
        .iter()
        .any(|m| m.get("role").and_then(Value::as_str) == Some("developer"));
    if has_developer && !supports_developer {
        for m in conversation.iter_mut() {
            if let Some(obj) = m.as_object_mut()
                && obj.get("role").and_then(Value::as_str) == Some("developer")
            {
                obj.insert("role".into(), Value::String("system".into()));
                obj.remove("tools");
            }
        }
        conversation = consolidate_system_messages(conversation);
    }
    Ok(conversation)
}

fn build_message(
    index: usize,
    message: &Value,
    format: ContentFormat,
) -> Result<Value, TokenizeError> {
    let bad = |reason: &str| TokenizeError::InvalidMessage {
        index,
        reason: reason.to_string(),
    };
    let msg = message
        .as_object()
        .ok_or_else(|| bad("a message must be an object"))?;
    let role = msg
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("role must be a string"))?;
    // The request validator renames the deprecated reasoning_content to reasoning.
    let reasoning = msg
        .get("reasoning")
        .filter(|v| !v.is_null())
        .or_else(|| msg.get("reasoning_content").filter(|v| !v.is_null()));

    let mut parts = match msg.get("content") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(bad("content must be a string or a list of parts")),
    };
    if role == "system" {
        parts = strip_billing_header(parts);
    }
    let mut parsed = Vec::with_capacity(parts.len());
    for part in &parts {
        if let Some(p) = parse_part(index, part)? {
            parsed.push(p);
        }
    }
    let content = match format {
        ContentFormat::String => {
            // Media parts: vLLM inserts the model's placeholder (e.g. <image>) here; we keep
            // text only, so multimodal prompts are not byte-exact.
            let texts: Vec<&str> = parsed
                .iter()
                .filter_map(|p| match p {
                    Part::Text(t, _) => Some(t.as_str()),
                    Part::ToolReference(n) => Some(n.as_str()),
                    Part::Media(..) => None,
                })
                .collect();
            Value::String(texts.join("\n"))
        }
        ContentFormat::OpenAi => Value::Array(
            parsed
                .into_iter()
                .map(|p| match p {
                    Part::Text(t, extra) => {
                        let mut o = Map::new();
                        o.insert("type".into(), Value::String("text".into()));
                        o.insert("text".into(), Value::String(t));
                        o.extend(extra);
                        Value::Object(o)
                    }
                    Part::Media(modality, extra) => {
                        let mut o = Map::new();
                        o.insert("type".into(), Value::String(modality.into()));
                        o.extend(extra);
                        Value::Object(o)
                    }
                    Part::ToolReference(name) => json!({"type": "tool_reference", "name": name}),
                })
                .collect(),
        ),
    };

    let mut out = Map::new();
    out.insert("role".into(), Value::String(role.to_string()));
    out.insert("content".into(), content);
    match role {
        "assistant" => {
            if let Some(calls) = msg.get("tool_calls").filter(|v| !v.is_null()) {
                out.insert("tool_calls".into(), calls.clone());
            }
            if let Some(r) = reasoning {
                out.insert("reasoning".into(), r.clone());
                out.insert("reasoning_content".into(), r.clone());
            }
        }
        "tool" => {
            if let Some(id) = msg.get("tool_call_id") {
                out.insert("tool_call_id".into(), id.clone());
            }
            // Text-only part lists become one string for tool results.
            let joined = match out.get("content") {
                Some(Value::Array(items))
                    if items
                        .iter()
                        .all(|i| i.get("type").and_then(Value::as_str) == Some("text")) =>
                {
                    Some(
                        items
                            .iter()
                            .map(|i| i.get("text").and_then(Value::as_str).unwrap_or_default())
                            .collect::<Vec<_>>()
                            .join("\n"),
                    )
                }
                _ => None,
            };
            if let Some(j) = joined {
                out.insert("content".into(), Value::String(j));
            }
        }
        _ => {}
    }
    if let Some(Value::String(name)) = msg.get("name") {
        out.insert("name".into(), Value::String(name.clone()));
    }
    if let Some(Value::String(task)) = msg.get("task") {
        out.insert("task".into(), Value::String(task.clone()));
    }
    if role == "developer" {
        out.insert(
            "tools".into(),
            msg.get("tools").cloned().unwrap_or(Value::Null),
        );
    }
    Ok(Value::Object(out))
}

/// vLLM's `_postprocess_messages`: tool-call arguments become objects (bad JSON and non-objects
/// become `{}`), empty `tool_calls` lists are dropped.
fn postprocess_tool_calls(conversation: &mut [Value]) -> Result<(), TokenizeError> {
    for (index, message) in conversation.iter_mut().enumerate() {
        let Some(msg) = message.as_object_mut() else {
            continue;
        };
        if msg.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let Some(Value::Array(calls)) = msg.get_mut("tool_calls") else {
            continue;
        };
        if calls.is_empty() {
            msg.remove("tool_calls");
            continue;
        }
        for call in calls.iter_mut() {
            let bad = |reason: &str| TokenizeError::InvalidMessage {
                index,
                reason: reason.to_string(),
            };
            let call = call
                .as_object_mut()
                .ok_or_else(|| bad("assistant tool_calls entries must be objects."))?;
            let is_function = match call.get("type") {
                None => true,
                Some(Value::String(t)) => t == "function",
                Some(_) => false,
            };
            let function = match call.get_mut("function") {
                Some(Value::Object(f)) if is_function => f,
                _ => {
                    return Err(bad(
                        "chat completions only support assistant tool_calls of type 'function'.",
                    ));
                }
            };
            let arguments = match function.get("arguments") {
                Some(args) if truthy(args) => match args {
                    Value::Object(_) => args.clone(),
                    Value::String(s) => match serde_json::from_str::<Value>(s) {
                        Ok(v @ Value::Object(_)) => v,
                        _ => Value::Object(Map::new()),
                    },
                    _ => Value::Object(Map::new()),
                },
                _ => Value::Object(Map::new()),
            };
            function.insert("arguments".into(), arguments);
        }
    }
    Ok(())
}

/// After developer -> system, vLLM merges every system message into one at the front
/// (joined with a blank line) when there is more than one or one is not first.
fn consolidate_system_messages(conversation: Vec<Value>) -> Vec<Value> {
    let mut system_contents: Vec<String> = Vec::new();
    let mut non_system = Vec::new();
    let mut needs = false;
    for (i, msg) in conversation.iter().enumerate() {
        if msg.get("role").and_then(Value::as_str) == Some("system") {
            if i > 0 || !system_contents.is_empty() {
                needs = true;
            }
            let content = match msg.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| match p {
                        Value::String(s) => Some(s.clone()),
                        Value::Object(o) => {
                            o.get("text").and_then(Value::as_str).map(str::to_string)
                        }
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => String::new(),
            };
            if !content.is_empty() {
                system_contents.push(content);
            }
        } else {
            non_system.push(msg.clone());
        }
    }
    if !needs {
        return conversation;
    }
    let mut out = Vec::with_capacity(non_system.len() + 1);
    out.push(json!({"role": "system", "content": system_contents.join("\n\n")}));
    out.extend(non_system);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_joined_and_media_dropped() {
        let msgs = vec![json!({"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "http://x"}},
            "b",
            {"type": "text", "text": null}
        ]})];
        let conv = build_conversation(&msgs, ContentFormat::String, false).unwrap_or_default();
        assert_eq!(conv, vec![json!({"role": "user", "content": "a\nb"})]);
    }

    #[test]
    fn openai_format_keeps_typed_parts() {
        let msgs = vec![json!({"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "http://x"}}
        ]})];
        let conv = build_conversation(&msgs, ContentFormat::OpenAi, false).unwrap_or_default();
        assert_eq!(
            conv,
            vec![
                json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]})
            ]
        );
    }

    #[test]
    fn tool_call_arguments_become_objects() {
        let msgs = vec![json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
            {"id": "3", "type": "function", "function": {"name": "h", "arguments": ""}}
        ]})];
        let conv = build_conversation(&msgs, ContentFormat::String, false).unwrap_or_default();
        let calls = &conv[0]["tool_calls"];
        assert_eq!(calls[0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(calls[1]["function"]["arguments"], json!({}));
        assert_eq!(calls[2]["function"]["arguments"], json!({}));
        assert_eq!(conv[0]["content"], json!(""));
    }

    #[test]
    fn developer_becomes_system_and_merges() {
        let msgs = vec![
            json!({"role": "system", "content": "s"}),
            json!({"role": "developer", "content": "d"}),
            json!({"role": "user", "content": "u"}),
        ];
        let conv = build_conversation(&msgs, ContentFormat::String, false).unwrap_or_default();
        assert_eq!(
            conv,
            vec![
                json!({"role": "system", "content": "s\n\nd"}),
                json!({"role": "user", "content": "u"})
            ]
        );
        let kept = build_conversation(&msgs, ContentFormat::String, true).unwrap_or_default();
        assert_eq!(kept[1]["role"], json!("developer"));
    }

    #[test]
    fn bad_messages_are_errors_not_panics() {
        for bad in [
            json!(1),
            json!({"content": "x"}),
            json!({"role": "user", "content": 5}),
            json!({"role": "user", "content": [{"foo": 1}]}),
            json!({"role": "assistant", "tool_calls": [1]}),
        ] {
            assert!(build_conversation(&[bad], ContentFormat::String, false).is_err());
        }
    }

    #[test]
    fn reasoning_effort_sets_enable_thinking_unless_given() {
        let mut req = ChatRequest::new(vec![]);
        req.reasoning_effort = Some("none".into());
        let inputs = template_inputs(&req).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            inputs.extra_vars.get("enable_thinking"),
            Some(&json!(false))
        );
        assert_eq!(
            inputs.extra_vars.get("reasoning_effort"),
            Some(&json!("none"))
        );
        let mut kwargs = Map::new();
        kwargs.insert("enable_thinking".into(), json!(true));
        req.chat_template_kwargs = Some(kwargs);
        let inputs = template_inputs(&req).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inputs.extra_vars.get("enable_thinking"), Some(&json!(true)));
    }

    #[test]
    fn tools_are_normalised_like_pydantic() {
        let mut req = ChatRequest::new(vec![]);
        req.tools = Some(vec![
            json!({"function": {"parameters": {"type": "object"}, "name": "f", "x": 1}}),
        ]);
        let inputs = template_inputs(&req).unwrap_or_else(|e| panic!("{e}"));
        let tools = serde_json::to_string(&inputs.tools).unwrap_or_default();
        assert_eq!(
            tools,
            r#"[{"type":"function","function":{"name":"f","description":null,"parameters":{"type":"object"}}}]"#
        );
        req.tools = Some(vec![]);
        assert!(
            template_inputs(&req)
                .map(|i| i.tools.is_none())
                .unwrap_or(false)
        );
    }
}
