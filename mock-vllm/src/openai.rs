//! The OpenAI-compatible HTTP bodies as vLLM 0.33 reads and writes them: request parameters
//! (tolerant: unknown fields ignored), response and SSE chunk JSON, vLLM-shaped errors. Pure.
//!
//! ```text
//! body bytes --parse_body--> Value --RequestParams::from_value--> params (+ prompt via tokenizer)
//! engine output --completion_json / chunk_json / usage_json--> response or `data: {...}` lines
//! ```

use serde::Deserialize;
use serde_json::{Value, json};

/// A vLLM-shaped error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// The error's `type` (e.g. `BadRequestError`).
    pub kind: &'static str,
    /// The error's `message`.
    pub message: String,
    /// The request field at fault, if any (`param`).
    pub param: Option<String>,
}

impl ApiError {
    /// A 400 `BadRequestError` with this message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            kind: "BadRequestError",
            message: message.into(),
            param: None,
        }
    }

    /// vLLM's 404 for a `model` it does not serve.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: 404,
            kind: "NotFoundError",
            message: format!("The model `{model}` does not exist."),
            param: Some("model".into()),
        }
    }

    /// A 500 `InternalServerError` with this message.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: 500,
            kind: "InternalServerError",
            message: message.into(),
            param: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status,
        }})
    }
}

/// Parses a JSON object body; anything else is vLLM's 400.
pub fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("JSON decode error: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("Input should be a valid dictionary"));
    }
    Ok(v)
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamOptions {
    include_usage: Option<bool>,
    continuous_usage_stats: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawParams {
    model: Option<String>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    ignore_eos: Option<bool>,
    n: Option<i64>,
    cache_salt: Option<String>,
    return_token_ids: Option<bool>,
    echo: Option<bool>,
}

/// The sampling and streaming parameters the mock honours.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestParams {
    /// The requested `model`; `None` means the served one.
    pub model: Option<String>,
    /// `max_completion_tokens`, else `max_tokens`, else what fits in `max_model_len`.
    pub max_tokens: Option<u32>,
    /// `stream`: answer with server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: end the stream with a usage chunk.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats`: usage on every chunk (streams only).
    pub continuous_usage_stats: bool,
    /// `ignore_eos`: generate until the length limit.
    pub ignore_eos: bool,
    /// `cache_salt`: mixed into the first block's hash, as in vLLM.
    pub cache_salt: Option<String>,
    /// `return_token_ids`: put the prompt's and the output's token ids in the response.
    pub return_token_ids: bool,
}

impl RequestParams {
    /// Reads the parameters from a request body (chat or completions).
    pub fn from_value(v: &Value) -> Result<Self, ApiError> {
        let raw: RawParams = serde_json::from_value(v.clone())
            .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
        let max = raw.max_completion_tokens.or(raw.max_tokens);
        let max_tokens = match max {
            None => None,
            Some(m) if m < 1 => {
                return Err(ApiError::bad_request(format!(
                    "max_tokens must be at least 1, got {m}."
                )));
            }
            Some(m) => Some(u32::try_from(m).unwrap_or(u32::MAX)),
        };
        if let Some(n) = raw.n
            && n != 1
        {
            return Err(ApiError::bad_request(format!(
                "n={n} is not supported by this server (only n=1)."
            )));
        }
        if raw.cache_salt.as_deref() == Some("") {
            return Err(ApiError::bad_request(
                "Parameter 'cache_salt' must be a non-empty string if provided.",
            ));
        }
        if raw.echo == Some(true) {
            return Err(ApiError::bad_request(
                "echo is not supported by this server.",
            ));
        }
        let so = raw.stream_options.unwrap_or_default();
        let stream = raw.stream.unwrap_or(false);
        Ok(Self {
            model: raw.model,
            max_tokens,
            stream,
            include_usage: stream && so.include_usage.unwrap_or(false),
            continuous_usage_stats: stream && so.continuous_usage_stats.unwrap_or(false),
            ignore_eos: raw.ignore_eos.unwrap_or(false),
            cache_salt: raw.cache_salt,
            return_token_ids: raw.return_token_ids.unwrap_or(false),
        })
    }

    /// Resolves `max_tokens` against `max_model_len` the way vLLM does (and its 400s).
    pub fn effective_max_tokens(
        &self,
        prompt_tokens: usize,
        max_model_len: usize,
    ) -> Result<u32, ApiError> {
        if prompt_tokens > max_model_len
            || (self.max_tokens.is_none() && prompt_tokens >= max_model_len)
        {
            return Err(ApiError::bad_request(format!(
                "This model's maximum context length is {max_model_len} tokens. However, your request has {prompt_tokens} input tokens. Please reduce the length of the input messages."
            )));
        }
        let room = max_model_len - prompt_tokens;
        match self.max_tokens {
            None => Ok(u32::try_from(room).unwrap_or(u32::MAX)),
            Some(m) if m as usize > room => Err(ApiError::bad_request(format!(
                "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({prompt_tokens} in the messages, {m} in the completion). Please reduce the length of the messages or completion.",
                prompt_tokens + m as usize
            ))),
            Some(m) => Ok(m),
        }
    }
}

/// Which endpoint a response belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// Token counts for a `usage` object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageCounts {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// The `usage` object; `prompt_tokens_details` only with `--enable-prompt-tokens-details`.
pub fn usage_json(u: UsageCounts, details: bool) -> Value {
    let mut v = json!({
        "prompt_tokens": u.prompt_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "completion_tokens": u.completion_tokens,
    });
    if details {
        v["prompt_tokens_details"] = json!({"cached_tokens": u.cached_tokens});
    }
    v
}

/// What a response needs to know about its request.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    /// The response id (`chatcmpl-…` or `cmpl-…`).
    pub id: String,
    /// The `created` Unix time, in seconds.
    pub created: u64,
    /// The model name the response reports.
    pub model: String,
    /// Which endpoint's shape to answer in.
    pub endpoint: Endpoint,
    /// The prompt's token ids, sent when the request set `return_token_ids`.
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A non-streaming response.
pub fn completion_json(
    meta: &ResponseMeta,
    text: &str,
    token_ids: Option<&[u32]>,
    finish_reason: &str,
    usage: Value,
) -> Value {
    let mut choice = match meta.endpoint {
        Endpoint::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": null,
                        "annotations": null, "audio": null, "function_call": null,
                        "tool_calls": [], "reasoning": null},
            "logprobs": null,
            "finish_reason": finish_reason,
            "stop_reason": null,
        }),
        Endpoint::Completions => json!({
            "index": 0,
            "text": text,
            "logprobs": null,
            "finish_reason": finish_reason,
            "stop_reason": null,
            "prompt_logprobs": null,
        }),
    };
    if let Some(ids) = token_ids {
        choice["token_ids"] = json!(ids);
    }
    let mut v = json!({
        "id": meta.id,
        "object": match meta.endpoint { Endpoint::Chat => "chat.completion", Endpoint::Completions => "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "service_tier": null,
        "system_fingerprint": null,
        "usage": usage,
        "prompt_logprobs": null,
        "kv_transfer_params": null,
    });
    if let Some(ids) = &meta.prompt_token_ids {
        v["prompt_token_ids"] = json!(ids);
    }
    v
}

/// One streaming chunk carrying `text` (the first chat chunk carries the role instead).
pub fn chunk_json(
    meta: &ResponseMeta,
    delta: ChunkDelta<'_>,
    finish_reason: Option<&str>,
    usage: Option<Value>,
) -> Value {
    let mut choice = match (meta.endpoint, &delta) {
        (Endpoint::Chat, ChunkDelta::Role) => json!({
            "index": 0, "delta": {"role": "assistant", "content": ""},
            "logprobs": null, "finish_reason": null,
        }),
        (Endpoint::Chat, ChunkDelta::Text { text, .. }) => json!({
            "index": 0, "delta": {"content": text},
            "logprobs": null, "finish_reason": finish_reason,
        }),
        (Endpoint::Completions, ChunkDelta::Role) => json!({
            "index": 0, "text": "", "logprobs": null, "finish_reason": null, "stop_reason": null,
        }),
        (Endpoint::Completions, ChunkDelta::Text { text, .. }) => json!({
            "index": 0, "text": text, "logprobs": null,
            "finish_reason": finish_reason, "stop_reason": null,
        }),
    };
    if finish_reason.is_some() && meta.endpoint == Endpoint::Chat {
        choice["stop_reason"] = Value::Null;
    }
    if let ChunkDelta::Text {
        token_ids: Some(ids),
        ..
    } = &delta
    {
        choice["token_ids"] = json!(ids);
    }
    let mut v = json!({
        "id": meta.id,
        "object": match meta.endpoint { Endpoint::Chat => "chat.completion.chunk", Endpoint::Completions => "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
    });
    if matches!(delta, ChunkDelta::Role)
        && let Some(ids) = &meta.prompt_token_ids
    {
        v["prompt_token_ids"] = json!(ids);
    }
    if let Some(u) = usage {
        v["usage"] = u;
    }
    v
}

/// The content of a streaming chunk.
#[derive(Clone, Debug)]
pub enum ChunkDelta<'a> {
    /// Chat's opening chunk: `{"role": "assistant", "content": ""}`.
    Role,
    /// New text, with the ids that produced it when `return_token_ids` is set.
    Text {
        /// The new text.
        text: &'a str,
        /// The ids that produced it.
        token_ids: Option<&'a [u32]>,
    },
}

/// The final usage chunk of a stream (`stream_options.include_usage`): `choices` is empty.
pub fn usage_chunk_json(meta: &ResponseMeta, usage: Value) -> Value {
    json!({
        "id": meta.id,
        "object": match meta.endpoint { Endpoint::Chat => "chat.completion.chunk", Endpoint::Completions => "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage,
    })
}

/// One SSE event line pair.
pub fn sse_data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// The stream terminator.
pub const SSE_DONE: &str = "data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_like_vllm() {
        let v = parse_body(
            br#"{"model":"m","messages":[],"max_completion_tokens":5,"max_tokens":9,"stream":true,
                "stream_options":{"include_usage":true,"continuous_usage_stats":true},"ignore_eos":true,"x":1}"#,
        )
        .unwrap();
        let p = RequestParams::from_value(&v).unwrap();
        assert_eq!(p.max_tokens, Some(5));
        assert!(p.stream && p.include_usage && p.continuous_usage_stats && p.ignore_eos);
        assert_eq!(p.effective_max_tokens(10, 100), Ok(5));
        assert!(p.effective_max_tokens(98, 100).is_err());
        assert!(p.effective_max_tokens(101, 100).is_err());
        let none = RequestParams::default();
        assert_eq!(none.effective_max_tokens(10, 100), Ok(90));
    }

    #[test]
    fn bad_bodies_are_400s() {
        assert_eq!(parse_body(b"{").unwrap_err().status, 400);
        assert_eq!(parse_body(b"[1]").unwrap_err().status, 400);
        for body in [
            r#"{"max_tokens":"x"}"#,
            r#"{"max_tokens":0}"#,
            r#"{"n":2}"#,
            r#"{"cache_salt":""}"#,
        ] {
            let v = parse_body(body.as_bytes()).unwrap();
            let e = RequestParams::from_value(&v).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.body()["error"]["type"], "BadRequestError");
            assert_eq!(e.body()["error"]["code"], 400);
        }
    }

    #[test]
    fn chunk_shapes() {
        let meta = ResponseMeta {
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m".into(),
            endpoint: Endpoint::Chat,
            prompt_token_ids: None,
        };
        let first = chunk_json(&meta, ChunkDelta::Role, None, None);
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        let last = chunk_json(
            &meta,
            ChunkDelta::Text {
                text: "x",
                token_ids: Some(&[5]),
            },
            Some("length"),
            None,
        );
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["choices"][0]["token_ids"], json!([5]));
        let u = usage_chunk_json(
            &meta,
            usage_json(
                UsageCounts {
                    prompt_tokens: 3,
                    completion_tokens: 2,
                    cached_tokens: 1,
                },
                true,
            ),
        );
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["total_tokens"], 5);
        assert_eq!(u["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
    }
}
