//! Anthropic Messages API <-> the worker's OpenAI chat API (pure).
//!
//! ```text
//! POST /v1/messages body --decode_request()--> AnthropicRequest { model, stream, chat body }
//! worker chat JSON       --message_from_chat()--> Anthropic `message`
//! worker chat chunks     --StreamTranslator::on_chunk()/finish()-->
//!     message_start, ping, content_block_start/delta/stop ..., message_delta, message_stop
//! ```
//!
//! Mapping: `system` becomes the first `system` message; `text` and `image` blocks become
//! content parts; `tool_use` blocks become assistant `tool_calls` (input serialised to the
//! arguments string) and `tool_result` blocks become `tool` messages placed before the rest of
//! their user turn; tools, tool_choice, stop_sequences, max_tokens, sampling knobs and
//! `thinking` (as `chat_template_kwargs.enable_thinking`) are translated; unknown top-level
//! fields pass through to the worker untouched. Back: finish_reason `stop`/`length`/
//! `tool_calls` map to `end_turn` (or `stop_sequence` when vLLM reports the matched string)/
//! `max_tokens`/`tool_use`; usage `input_tokens` excludes the cached prefix, which is reported
//! as `cache_read_input_tokens`.

use serde_json::{Map, Value, json};

use super::error::GatewayError;
use super::openai::{Usage, optional_bool, parse_object, required_str, usage_of};
use super::sse::SseEvent;

/// A decoded Messages request, already translated to an OpenAI chat body.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicRequest {
    /// The model name the client asked for.
    pub model: String,
    /// `stream: true`.
    pub stream: bool,
    /// The equivalent OpenAI chat completion body (model still the client's name).
    pub chat: Map<String, Value>,
}

/// Top-level fields this module translates or deliberately drops; anything else passes through.
const KNOWN_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "metadata",
    "thinking",
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
];

fn invalid(field: impl Into<String>, reason: &str) -> GatewayError {
    GatewayError::InvalidField {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Decodes a Messages body and translates it.
pub fn decode_request(bytes: &[u8]) -> Result<AnthropicRequest, GatewayError> {
    let body = parse_object(bytes)?;
    let model = required_str(&body, "model")?.to_owned();
    let max_tokens = match body.get("max_tokens") {
        None | Some(Value::Null) => return Err(GatewayError::MissingField("max_tokens")),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| invalid("max_tokens", "must be a non-negative integer"))?,
    };
    let messages = match body.get("messages") {
        None | Some(Value::Null) => return Err(GatewayError::MissingField("messages")),
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(_) => return Err(invalid("messages", "must be a non-empty array")),
    };
    let stream = optional_bool(&body, "stream")?;

    let mut chat = Map::new();
    chat.insert("model".into(), Value::from(model.clone()));
    let mut out_messages = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = body.get("system").filter(|v| !v.is_null()) {
        let text = blocks_text(system, "system")?;
        out_messages.push(json!({"role": "system", "content": text}));
    }
    for (i, m) in messages.iter().enumerate() {
        translate_message(m, i, &mut out_messages)?;
    }
    if out_messages.is_empty() {
        return Err(invalid(
            "messages",
            "must contain at least one text, image or tool block",
        ));
    }
    chat.insert("messages".into(), Value::Array(out_messages));
    chat.insert("max_tokens".into(), Value::from(max_tokens));
    match body.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(s)) if s.iter().all(Value::is_string) => {
            chat.insert("stop".into(), Value::Array(s.clone()));
        }
        Some(_) => return Err(invalid("stop_sequences", "must be an array of strings")),
    }
    for knob in ["temperature", "top_p", "top_k"] {
        match body.get(knob) {
            None | Some(Value::Null) => {}
            Some(v @ Value::Number(_)) => {
                chat.insert(knob.into(), v.clone());
            }
            Some(_) => return Err(invalid(knob, "must be a number")),
        }
    }
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), translate_tools(tools)?);
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        translate_tool_choice(choice, &mut chat)?;
    }
    if let Some(user) = body
        .get("metadata")
        .and_then(|m| m.get("user_id"))
        .and_then(Value::as_str)
    {
        chat.insert("user".into(), Value::from(user));
    }
    if let Some(kind) = body
        .get("thinking")
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
    {
        let kwargs = chat
            .entry("chat_template_kwargs")
            .or_insert_with(|| json!({}));
        if let Value::Object(k) = kwargs {
            k.insert("enable_thinking".into(), Value::Bool(kind == "enabled"));
        }
    }
    // No Messages field, but it passes through to the worker like any unknown key: one that is
    // not an object would be refused there (and by the chat decoder), so refuse it here.
    match body.get("stream_options") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(_) => return Err(invalid("stream_options", "must be an object")),
    }
    if stream {
        chat.insert("stream".into(), Value::Bool(true));
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    for (k, v) in &body {
        if !KNOWN_FIELDS.contains(&k.as_str()) && !chat.contains_key(k) {
            chat.insert(k.clone(), v.clone());
        }
    }
    Ok(AnthropicRequest {
        model,
        stream,
        chat,
    })
}

/// A string, or an array of `text` blocks joined with `\n` (other block types are skipped).
fn blocks_text(v: &Value, field: &str) -> Result<String, GatewayError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let texts: Vec<&str> = blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            Ok(texts.join("\n"))
        }
        _ => Err(invalid(
            field,
            "must be a string or an array of content blocks",
        )),
    }
}

fn image_part(block: &Value) -> Option<Value> {
    let source = block.get("source")?;
    let url = match source.get("type").and_then(Value::as_str)? {
        "base64" => {
            let media = source.get("media_type").and_then(Value::as_str)?;
            let data = source.get("data").and_then(Value::as_str)?;
            format!("data:{media};base64,{data}")
        }
        "url" => source.get("url").and_then(Value::as_str)?.to_owned(),
        _ => return None,
    };
    Some(json!({"type": "image_url", "image_url": {"url": url}}))
}

fn translate_message(m: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), GatewayError> {
    let field = || format!("messages[{i}]");
    let Some(obj) = m.as_object() else {
        return Err(invalid(field(), "must be an object"));
    };
    let role = match obj.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        Some(_) => {
            return Err(invalid(
                format!("{}.role", field()),
                "must be `user` or `assistant`",
            ));
        }
        None => return Err(invalid(format!("{}.role", field()), "is required")),
    };
    let blocks: Vec<Value> = match obj.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b.clone(),
        _ => {
            return Err(invalid(
                format!("{}.content", field()),
                "must be a string or an array of content blocks",
            ));
        }
    };
    let mut parts = Vec::new();
    let mut tool_calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => {
                let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                parts.push(json!({"type": "text", "text": text}));
            }
            "image" => {
                let part = image_part(block).ok_or_else(|| {
                    invalid(
                        format!("{}.content[{j}].source", field()),
                        "unsupported image source",
                    )
                })?;
                parts.push(part);
            }
            "tool_use" if role == "assistant" => {
                let id = block.get("id").and_then(Value::as_str).unwrap_or("");
                let name = block.get("name").and_then(Value::as_str).unwrap_or("");
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                tool_calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            "tool_result" if role == "user" => {
                let id = block
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let content = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => blocks_text(c, &format!("{}.content[{j}].content", field()))?,
                };
                // A tool message must directly follow the assistant turn that called the tool.
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            // thinking, redacted_thinking, documents, server tool blocks: nothing the worker's
            // chat template can use.
            _ => {}
        }
    }
    if role == "assistant" {
        let content = match parts.as_slice() {
            [] => Value::Null,
            [one] if one.get("type").and_then(Value::as_str) == Some("text") => one["text"].clone(),
            _ => Value::Array(parts),
        };
        let mut msg = json!({"role": "assistant", "content": content});
        if !tool_calls.is_empty() {
            msg["tool_calls"] = Value::Array(tool_calls);
        }
        out.push(msg);
    } else if !parts.is_empty() {
        let content = match parts.as_slice() {
            [one] if one.get("type").and_then(Value::as_str) == Some("text") => one["text"].clone(),
            _ => Value::Array(parts),
        };
        out.push(json!({"role": "user", "content": content}));
    }
    Ok(())
}

fn translate_tools(tools: &Value) -> Result<Value, GatewayError> {
    let Some(list) = tools.as_array() else {
        return Err(invalid("tools", "must be an array"));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        // Server tools (web search, code execution, ...) carry a versioned `type` and no schema.
        if t.get("type")
            .and_then(Value::as_str)
            .is_some_and(|ty| ty != "custom")
        {
            continue;
        }
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("tools[{i}].name"), "is required"))?;
        let mut function = json!({"name": name});
        if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
            function["description"] = d.clone();
        }
        function["parameters"] = t
            .get("input_schema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

fn translate_tool_choice(
    choice: &Value,
    chat: &mut Map<String, Value>,
) -> Result<(), GatewayError> {
    let kind = choice
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("tool_choice.type", "is required"))?;
    let mapped = match kind {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => {
            let name = choice
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tool_choice.name", "is required"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(invalid(
                "tool_choice.type",
                "must be auto, any, tool or none",
            ));
        }
    };
    chat.insert("tool_choice".into(), mapped);
    if choice
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        == Some(true)
    {
        chat.insert("parallel_tool_calls".into(), Value::Bool(false));
    }
    Ok(())
}

/// Anthropic `stop_reason` and `stop_sequence` for an OpenAI `finish_reason` and vLLM's
/// `stop_reason` (the matched stop string, or a stop token id).
pub fn map_stop_reason(finish_reason: Option<&str>, vllm_stop: Option<&Value>) -> (Value, Value) {
    match finish_reason {
        None => (Value::Null, Value::Null),
        Some("stop") => match vllm_stop.and_then(Value::as_str) {
            Some(seq) => (json!("stop_sequence"), json!(seq)),
            None => (json!("end_turn"), Value::Null),
        },
        Some("length") => (json!("max_tokens"), Value::Null),
        Some("tool_calls" | "function_call") => (json!("tool_use"), Value::Null),
        Some("content_filter") => (json!("refusal"), Value::Null),
        Some(_) => (json!("end_turn"), Value::Null),
    }
}

/// Anthropic `usage` from OpenAI usage: input excludes the cached prefix.
pub fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    })
}

fn message_id(openai_id: Option<&str>) -> String {
    let raw = openai_id.unwrap_or("");
    let raw = raw.strip_prefix("chatcmpl-").unwrap_or(raw);
    format!("msg_{raw}")
}

/// Translates a non-streaming chat completion into an Anthropic `message`. `model` is the name
/// the client asked for.
pub fn message_from_chat(chat: &Value, model: &str) -> Value {
    let choice = chat.get("choices").and_then(|c| c.get(0));
    let msg = choice.and_then(|c| c.get("message"));
    let mut content = Vec::new();
    if let Some(thinking) = msg
        .and_then(|m| m.get("reasoning_content").or_else(|| m.get("reasoning")))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if let Some(text) = msg
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in msg
        .and_then(|m| m.get("tool_calls"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let f = call.get("function");
        let args = f
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("{}");
        content.push(json!({
            "type": "tool_use",
            "id": call.get("id").and_then(Value::as_str).unwrap_or(""),
            "name": f.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or(""),
            "input": parse_arguments(args),
        }));
    }
    let finish = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str);
    let (stop_reason, stop_sequence) =
        map_stop_reason(finish, choice.and_then(|c| c.get("stop_reason")));
    json!({
        "id": message_id(chat.get("id").and_then(Value::as_str)),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage_json(usage_of(chat).unwrap_or_default()),
    })
}

/// Tool-call arguments as a JSON object (models sometimes emit invalid JSON: keep it visible).
fn parse_arguments(args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        Ok(other) => json!({"value": other}),
        Err(_) => json!({"raw_arguments": args}),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Block {
    Text,
    Thinking,
    Tool { openai_index: u64 },
}

/// Turns a worker's chat-completion chunk stream into Anthropic streaming events.
#[derive(Debug)]
pub struct StreamTranslator {
    model: String,
    started: bool,
    open: Option<Block>,
    next_index: u64,
    finish_reason: Option<String>,
    vllm_stop: Option<Value>,
    usage: Usage,
    finished: bool,
}

impl StreamTranslator {
    /// A translator that reports `model` (the client's name) in `message_start`.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            started: false,
            open: None,
            next_index: 0,
            finish_reason: None,
            vllm_stop: None,
            usage: Usage::default(),
            finished: false,
        }
    }

    fn event(name: &str, data: Value) -> SseEvent {
        SseEvent::named(name, data.to_string())
    }

    fn start(&mut self, id: Option<&str>, out: &mut Vec<SseEvent>) {
        if self.started {
            return;
        }
        self.started = true;
        out.push(Self::event(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": message_id(id), "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": usage_json(self.usage),
            }}),
        ));
        out.push(Self::event("ping", json!({"type": "ping"})));
    }

    fn close_block(&mut self, out: &mut Vec<SseEvent>) {
        if self.open.take().is_some() {
            let index = self.next_index - 1;
            out.push(Self::event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    fn open_block(&mut self, block: Block, content_block: Value, out: &mut Vec<SseEvent>) {
        self.close_block(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some(block);
        out.push(Self::event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": content_block}),
        ));
    }

    fn delta(&self, delta: Value, out: &mut Vec<SseEvent>) {
        let index = self.next_index - 1;
        out.push(Self::event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    /// Handles one chunk (a parsed `data:` payload); returns the events to send.
    pub fn on_chunk(&mut self, chunk: &Value) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if self.finished {
            return out;
        }
        if let Some(u) = usage_of(chunk) {
            self.usage = u;
        }
        self.start(chunk.get("id").and_then(Value::as_str), &mut out);
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
            return out;
        };
        if let Some(delta) = choice.get("delta") {
            if let Some(t) = delta
                .get("reasoning_content")
                .or_else(|| delta.get("reasoning"))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                if self.open != Some(Block::Thinking) {
                    self.open_block(
                        Block::Thinking,
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        &mut out,
                    );
                }
                self.delta(json!({"type": "thinking_delta", "thinking": t}), &mut out);
            }
            if let Some(t) = delta
                .get("content")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                if self.open != Some(Block::Text) {
                    self.open_block(Block::Text, json!({"type": "text", "text": ""}), &mut out);
                }
                self.delta(json!({"type": "text_delta", "text": t}), &mut out);
            }
            for call in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let openai_index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                let f = call.get("function");
                let is_new = call.get("id").is_some_and(|id| !id.is_null())
                    || self.open != Some(Block::Tool { openai_index });
                if is_new {
                    let block = json!({
                        "type": "tool_use",
                        "id": call.get("id").and_then(Value::as_str).unwrap_or(""),
                        "name": f.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or(""),
                        "input": {},
                    });
                    self.open_block(Block::Tool { openai_index }, block, &mut out);
                }
                if let Some(args) = f
                    .and_then(|f| f.get("arguments"))
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                {
                    self.delta(
                        json!({"type": "input_json_delta", "partial_json": args}),
                        &mut out,
                    );
                }
            }
        }
        if let Some(fr) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(fr.to_owned());
            self.vllm_stop = choice.get("stop_reason").cloned();
        }
        out
    }

    /// End of the worker's stream (`[DONE]` or EOF): closes the open block and the message.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if self.finished {
            return out;
        }
        self.start(None, &mut out);
        self.close_block(&mut out);
        self.finished = true;
        let (stop_reason, stop_sequence) =
            map_stop_reason(self.finish_reason.as_deref(), self.vllm_stop.as_ref());
        out.push(Self::event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": usage_json(self.usage)}),
        ));
        out.push(Self::event("message_stop", json!({"type": "message_stop"})));
        out
    }

    /// An `error` event for a stream that broke after it started.
    pub fn error_event(message: &str) -> SseEvent {
        Self::event(
            "error",
            json!({"type": "error", "error": {"type": "api_error", "message": message}}),
        )
    }
}

#[cfg(test)]
#[path = "anthropic_tests.rs"]
mod tests;
