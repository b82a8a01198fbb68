//! OpenAI request and response bodies as the gateway sees them (pure).
//!
//! ```text
//! client bytes --decode_request()--> OpenAiRequest { model, stream, wants_usage, body }
//!                                      --upstream_body(served)--> bytes for the worker
//! worker SSE data --inspect_chunk()--> StreamItem { content?, usage?, usage-only? } | Done
//!                 --inspect_chunk_json()--> the same and the chunk as JSON (translators)
//! worker JSON     --usage_of()------->  Usage { prompt, completion, cached }
//! ```
//!
//! `inspect_chunk` runs once per streamed token, so it does not build the chunk: one pass
//! reads the few fields that matter (`choices[].text`, `choices[].delta.{content,
//! reasoning_content, reasoning, tool_calls}`, `usage`) and skips the rest without
//! allocating. A duplicate key counts once, the last, as in the full parse. Where that pass
//! fails, the full parse decides. Every payload the full parse accepts is classified alike by
//! both (the captured vLLM stream, unit tests, and the `sse_stream` fuzz target check it);
//! only payloads it rejects may differ: the pass does not validate what it skips (a lone
//! surrogate escape, a number out of range there), so such a chunk is metered where the full
//! parse would call it `Other`. Either way the event is passed on untouched.
//!
//! Decoding is tolerant: only the fields the router needs are checked, and the body is kept
//! as the client's JSON object (key order preserved), so every field the client sent reaches
//! the worker untouched. Only `model` is rewritten (aliases) and, for streams,
//! `stream_options.include_usage` is forced on so the router sees the usage chunk; if the
//! client did not ask for it, the proxy strips that chunk again ([`StreamItem::usage_only`]).

use bytes::Bytes;
use serde_json::{Map, Value};

use super::error::GatewayError;

/// The two OpenAI generation endpoints the gateway proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/completions`
    Completions,
}

impl Endpoint {
    /// Path on the worker.
    pub fn path(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
        }
    }

    /// Short label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chat",
            Self::Completions => "completions",
        }
    }
}

/// A decoded OpenAI request: the few fields the router reads plus the whole body.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiRequest {
    /// Which endpoint it came in on.
    pub endpoint: Endpoint,
    /// The model name the client asked for (an alias or a served name).
    pub model: String,
    /// `stream: true`.
    pub stream: bool,
    /// The client set `stream_options.include_usage: true` itself.
    pub wants_usage: bool,
    /// The client's JSON object, unchanged.
    pub body: Map<String, Value>,
}

/// Parses `bytes` as a JSON object. Shared by both wire formats.
pub(crate) fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, GatewayError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(GatewayError::MalformedJson(
            "the body must be a JSON object".into(),
        )),
        Err(e) => Err(GatewayError::MalformedJson(e.to_string())),
    }
}

/// `body[field]` as a string; missing or null is [`GatewayError::MissingField`].
pub(crate) fn required_str<'a>(
    body: &'a Map<String, Value>,
    field: &'static str,
) -> Result<&'a str, GatewayError> {
    match body.get(field) {
        None | Some(Value::Null) => Err(GatewayError::MissingField(field)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(GatewayError::InvalidField {
            field: field.into(),
            reason: "must be a string".into(),
        }),
    }
}

/// `body[field]` as a bool; missing or null is `false`.
pub(crate) fn optional_bool(body: &Map<String, Value>, field: &str) -> Result<bool, GatewayError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(GatewayError::InvalidField {
            field: field.into(),
            reason: "must be a boolean".into(),
        }),
    }
}

/// Decodes and validates a request body for `endpoint`.
pub fn decode_request(endpoint: Endpoint, bytes: &[u8]) -> Result<OpenAiRequest, GatewayError> {
    let body = parse_object(bytes)?;
    let model = required_str(&body, "model")?.to_owned();
    match endpoint {
        Endpoint::ChatCompletions => match body.get("messages") {
            None | Some(Value::Null) => return Err(GatewayError::MissingField("messages")),
            Some(Value::Array(m)) if !m.is_empty() => {
                if let Some(i) = m.iter().position(|msg| !msg.is_object()) {
                    return Err(GatewayError::InvalidField {
                        field: format!("messages[{i}]"),
                        reason: "must be an object".into(),
                    });
                }
            }
            Some(_) => {
                return Err(GatewayError::InvalidField {
                    field: "messages".into(),
                    reason: "must be a non-empty array".into(),
                });
            }
        },
        Endpoint::Completions => match body.get("prompt") {
            None | Some(Value::Null) => return Err(GatewayError::MissingField("prompt")),
            Some(Value::String(_) | Value::Array(_)) => {}
            Some(_) => {
                return Err(GatewayError::InvalidField {
                    field: "prompt".into(),
                    reason: "must be a string or an array".into(),
                });
            }
        },
    }
    let stream = optional_bool(&body, "stream")?;
    let wants_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => o
            .get("include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        Some(_) => {
            return Err(GatewayError::InvalidField {
                field: "stream_options".into(),
                reason: "must be an object".into(),
            });
        }
    };
    Ok(OpenAiRequest {
        endpoint,
        model,
        stream,
        wants_usage,
        body,
    })
}

/// `body`, a JSON object, with its `model` set to `model`: the rewrite the gateway, the Pick
/// API and the endpoint picker share when the picked worker serves another name than the
/// body asks for (a policy's model switch, an alias). `None` when `body` is not a JSON object.
pub fn with_model(body: &[u8], model: &str) -> Option<Vec<u8>> {
    let mut obj: Map<String, Value> = serde_json::from_slice(body).ok()?;
    obj.insert("model".into(), Value::String(model.to_string()));
    serde_json::to_vec(&obj).ok()
}

/// The body to send to the worker: the client's object with `model` set to `served_model`
/// and, for streams, `stream_options.include_usage` forced on (other options kept).
pub fn upstream_body(body: &Map<String, Value>, served_model: &str, stream: bool) -> Bytes {
    let mut body = body.clone();
    if let Some(m) = body.get_mut("model") {
        *m = Value::from(served_model);
    } else {
        body.insert("model".into(), Value::from(served_model));
    }
    if stream {
        let opts = body
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Map::new()));
        if !opts.is_object() {
            *opts = Value::Object(Map::new());
        }
        if let Value::Object(o) = opts {
            o.insert("include_usage".into(), Value::Bool(true));
        }
    }
    // Serialising a `Map<String, Value>` cannot fail.
    Bytes::from(serde_json::to_vec(&Value::Object(body)).unwrap_or_default())
}

/// Token counts from a response's `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// `prompt_tokens`.
    pub prompt_tokens: u64,
    /// `completion_tokens`.
    pub completion_tokens: u64,
    /// `prompt_tokens_details.cached_tokens` (0 when the worker does not report it).
    pub cached_tokens: u64,
}

/// Reads `v["usage"]`, if it is an object.
pub fn usage_of(v: &Value) -> Option<Usage> {
    usage_fields(v.get("usage")?)
}

/// The counts of a `usage` value, if it is an object (missing or non-integer counts read 0).
fn usage_fields(u: &Value) -> Option<Usage> {
    let u = u.as_object()?;
    let num = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let cached = u
        .get("prompt_tokens_details")
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Some(Usage {
        prompt_tokens: num("prompt_tokens"),
        completion_tokens: num("completion_tokens"),
        cached_tokens: cached,
    })
}

/// What one `data:` payload of a worker's stream means to the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamItem {
    /// `data: [DONE]`.
    Done,
    /// A JSON chunk.
    Chunk {
        /// It carries generated output (content, reasoning, tool-call or completion text).
        content: bool,
        /// Its `usage`, if any.
        usage: Option<Usage>,
        /// It is the extra usage chunk (`choices` empty, usage present) that
        /// `include_usage` adds.
        usage_only: bool,
    },
    /// Not a JSON object: passed through untouched, ignored for measurement.
    Other,
}

fn non_empty_str(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str).is_some_and(|s| !s.is_empty())
}

/// Whether a chat `delta` or completion `choice` carries generated output.
fn choice_has_content(choice: &Value) -> bool {
    if non_empty_str(choice.get("text")) {
        return true;
    }
    let Some(delta) = choice.get("delta") else {
        return false;
    };
    non_empty_str(delta.get("content"))
        || non_empty_str(delta.get("reasoning_content"))
        || non_empty_str(delta.get("reasoning"))
        || delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
}

/// Classifies one SSE `data` payload from the worker without building it (see the module
/// docs); the same answer as [`inspect_chunk_json`] wherever that one accepts the payload.
pub fn inspect_chunk(data: &str) -> StreamItem {
    let trimmed = data.trim();
    if trimmed == "[DONE]" {
        return StreamItem::Done;
    }
    if !trimmed.starts_with('{') {
        return StreamItem::Other;
    }
    view::classify(trimmed).unwrap_or_else(|| inspect_chunk_json(trimmed).0)
}

/// Classifies one SSE `data` payload from the worker and returns the chunk itself when it is
/// a JSON object (for the translators that rewrite it).
pub fn inspect_chunk_json(data: &str) -> (StreamItem, Option<Value>) {
    let trimmed = data.trim();
    if trimmed == "[DONE]" {
        return (StreamItem::Done, None);
    }
    let Ok(json) = serde_json::from_str::<Value>(trimmed) else {
        return (StreamItem::Other, None);
    };
    if !json.is_object() {
        return (StreamItem::Other, None);
    }
    let choices = json.get("choices").and_then(Value::as_array);
    let content = choices.is_some_and(|c| c.iter().any(choice_has_content));
    let usage = usage_of(&json);
    let usage_only = usage.is_some() && choices.is_none_or(Vec::is_empty);
    let item = StreamItem::Chunk {
        content,
        usage,
        usage_only,
    };
    (item, Some(json))
}

/// The one-pass reading behind [`inspect_chunk`]. Each object level reads the keys it knows
/// (the last of duplicates) and skips every other value; a value of another type than the
/// full parse's accessors expect reads as they do (`as_array`, `as_str`: absent).
mod view {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::Deserialize;
    use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde_json::Value;

    use super::{StreamItem, usage_fields};

    /// A visitor's answer for a scalar it does not read.
    macro_rules! skip_scalars {
        ($none:expr) => {
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok($none)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok($none)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok($none)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok($none)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok($none)
            }
        };
    }

    fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<usize, A::Error> {
        let mut n = 0;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            n += 1;
        }
        Ok(n)
    }

    /// The keys read at any level (a key read at one level is skipped at the others).
    enum Key {
        Choices,
        Usage,
        Text,
        Delta,
        Content,
        ReasoningContent,
        Reasoning,
        ToolCalls,
        Other,
    }

    impl<'de> Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Key;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a key")
                }
                fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                    Ok(match v {
                        "choices" => Key::Choices,
                        "usage" => Key::Usage,
                        "text" => Key::Text,
                        "delta" => Key::Delta,
                        "content" => Key::Content,
                        "reasoning_content" => Key::ReasoningContent,
                        "reasoning" => Key::Reasoning,
                        "tool_calls" => Key::ToolCalls,
                        _ => Key::Other,
                    })
                }
            }
            d.deserialize_identifier(V)
        }
    }

    /// A value read for its shape only.
    #[derive(Clone, Copy, Default)]
    struct Shape {
        non_empty_str: bool,
        non_empty_array: bool,
    }

    impl<'de> Deserialize<'de> for Shape {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Shape;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("any value")
                }
                skip_scalars!(Shape::default());
                fn visit_str<E: de::Error>(self, v: &str) -> Result<Shape, E> {
                    Ok(Shape {
                        non_empty_str: !v.is_empty(),
                        non_empty_array: false,
                    })
                }
                fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Shape, A::Error> {
                    Ok(Shape {
                        non_empty_str: false,
                        non_empty_array: drain_seq(seq)? > 0,
                    })
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
                    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                    Ok(Shape::default())
                }
            }
            d.deserialize_any(V)
        }
    }

    /// What the router reads of one object level.
    trait ReadObject: Default {
        fn read<'de, A: MapAccess<'de>>(map: A) -> Result<Self, A::Error>;
    }

    /// An object read by `T`; any other value is skipped and reads as `T::default()`.
    struct ObjectOr<T>(T);

    impl<'de, T: ReadObject> Deserialize<'de> for ObjectOr<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V<T>(PhantomData<T>);
            impl<'de, T: ReadObject> Visitor<'de> for V<T> {
                type Value = ObjectOr<T>;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("any value")
                }
                skip_scalars!(ObjectOr(T::default()));
                fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                    Ok(ObjectOr(T::default()))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                    drain_seq(seq)?;
                    Ok(ObjectOr(T::default()))
                }
                fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                    T::read(map).map(ObjectOr)
                }
            }
            d.deserialize_any(V(PhantomData))
        }
    }

    /// A chat `delta`: whether it carries output.
    #[derive(Default)]
    struct Delta(bool);

    impl ReadObject for Delta {
        fn read<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
            // content, reasoning_content, reasoning, tool_calls (last of duplicates).
            let mut has = [false; 4];
            while let Some(key) = map.next_key::<Key>()? {
                let slot = match key {
                    Key::Content => 0,
                    Key::ReasoningContent => 1,
                    Key::Reasoning => 2,
                    Key::ToolCalls => 3,
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                };
                let shape = map.next_value::<Shape>()?;
                has[slot] = if slot == 3 {
                    shape.non_empty_array
                } else {
                    shape.non_empty_str
                };
            }
            Ok(Delta(has.contains(&true)))
        }
    }

    /// One element of `choices`: whether it carries output.
    #[derive(Default)]
    struct Choice(bool);

    impl ReadObject for Choice {
        fn read<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
            let (mut text, mut delta) = (false, false);
            while let Some(key) = map.next_key::<Key>()? {
                match key {
                    Key::Text => text = map.next_value::<Shape>()?.non_empty_str,
                    Key::Delta => delta = map.next_value::<ObjectOr<Delta>>()?.0.0,
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(Choice(text || delta))
        }
    }

    /// `choices`: `Some((elements, any carries output))` when it is an array.
    struct Choices(Option<(usize, bool)>);

    impl<'de> Deserialize<'de> for Choices {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Choices;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("any value")
                }
                skip_scalars!(Choices(None));
                fn visit_str<E: de::Error>(self, _: &str) -> Result<Choices, E> {
                    Ok(Choices(None))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Choices, A::Error> {
                    let (mut n, mut content) = (0, false);
                    while let Some(c) = seq.next_element::<ObjectOr<Choice>>()? {
                        n += 1;
                        content |= c.0.0;
                    }
                    Ok(Choices(Some((n, content))))
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Choices, A::Error> {
                    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                    Ok(Choices(None))
                }
            }
            d.deserialize_any(V)
        }
    }

    /// A chunk as the router reads it.
    #[derive(Default)]
    struct Chunk {
        choices: Option<(usize, bool)>,
        /// `usage` in full (small, and only on the last chunk unless the client asked for
        /// continuous usage).
        usage: Option<Value>,
    }

    impl ReadObject for Chunk {
        fn read<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
            let mut chunk = Chunk::default();
            while let Some(key) = map.next_key::<Key>()? {
                match key {
                    Key::Choices => chunk.choices = map.next_value::<Choices>()?.0,
                    Key::Usage => chunk.usage = Some(map.next_value::<Value>()?),
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(chunk)
        }
    }

    /// `data` (a JSON object's text) classified; `None` where this reading fails.
    pub(super) fn classify(data: &str) -> Option<StreamItem> {
        let chunk = serde_json::from_str::<ObjectOr<Chunk>>(data).ok()?.0;
        let usage = chunk.usage.as_ref().and_then(usage_fields);
        Some(StreamItem::Chunk {
            content: chunk.choices.is_some_and(|c| c.1),
            usage,
            usage_only: usage.is_some() && chunk.choices.is_none_or(|c| c.0 == 0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_request_keeps_every_field_and_order() {
        let raw = br#"{"model":"alias","messages":[{"role":"user","content":"hi"}],"ignore_eos":true,"max_completion_tokens":7,"stream":true,"stream_options":{"continuous_usage_stats":true},"x_vendor":{"a":[1,2]}}"#;
        let req = decode_request(Endpoint::ChatCompletions, raw).expect("decode");
        assert_eq!(req.model, "alias");
        assert!(req.stream);
        assert!(!req.wants_usage);
        let out = upstream_body(&req.body, "Qwen/Qwen3-32B", req.stream);
        assert_eq!(
            std::str::from_utf8(&out).expect("utf8"),
            r#"{"model":"Qwen/Qwen3-32B","messages":[{"role":"user","content":"hi"}],"ignore_eos":true,"max_completion_tokens":7,"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true},"x_vendor":{"a":[1,2]}}"#
        );
    }

    #[test]
    fn non_stream_body_is_unchanged_but_model() {
        let raw = br#"{"prompt":[1,2,3],"model":"m","max_tokens":4}"#;
        let req = decode_request(Endpoint::Completions, raw).expect("decode");
        assert!(!req.stream);
        assert_eq!(&upstream_body(&req.body, "m", false)[..], &raw[..]);
    }

    #[test]
    fn client_usage_request_is_seen() {
        let raw = br#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}"#;
        assert!(
            decode_request(Endpoint::ChatCompletions, raw)
                .expect("decode")
                .wants_usage
        );
    }

    #[test]
    fn bad_requests() {
        use GatewayError as E;
        let chat = |b: &[u8]| decode_request(Endpoint::ChatCompletions, b).err();
        assert!(matches!(chat(b"{not json"), Some(E::MalformedJson(_))));
        assert!(matches!(chat(b"[1]"), Some(E::MalformedJson(_))));
        assert!(matches!(chat(b""), Some(E::MalformedJson(_))));
        assert_eq!(
            chat(br#"{"messages":[{"role":"user"}]}"#),
            Some(E::MissingField("model"))
        );
        assert_eq!(chat(br#"{"model":"m"}"#), Some(E::MissingField("messages")));
        assert!(matches!(
            chat(br#"{"model":3,"messages":[]}"#),
            Some(E::InvalidField { .. })
        ));
        assert!(matches!(
            chat(br#"{"model":"m","messages":[]}"#),
            Some(E::InvalidField { .. })
        ));
        assert!(matches!(
            chat(br#"{"model":"m","messages":["x"]}"#),
            Some(E::InvalidField { .. })
        ));
        assert!(matches!(
            chat(br#"{"model":"m","messages":[{}],"stream":"yes"}"#),
            Some(E::InvalidField { .. })
        ));
        let comp = |b: &[u8]| decode_request(Endpoint::Completions, b).err();
        assert_eq!(comp(br#"{"model":"m"}"#), Some(E::MissingField("prompt")));
        assert!(matches!(
            comp(br#"{"model":"m","prompt":5}"#),
            Some(E::InvalidField { .. })
        ));
    }

    #[test]
    fn chunks_are_classified() {
        // Golden chunks in vLLM's shape.
        let role = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#;
        let tok = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Paris"},"logprobs":null,"finish_reason":null}]}"#;
        let usage = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":26,"total_tokens":30,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":16}}}"#;
        let text = r#"{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" the","finish_reason":null}]}"#;
        assert!(matches!(
            inspect_chunk(role),
            StreamItem::Chunk {
                content: false,
                usage: None,
                usage_only: false,
                ..
            }
        ));
        assert!(matches!(
            inspect_chunk(tok),
            StreamItem::Chunk { content: true, .. }
        ));
        assert!(matches!(
            inspect_chunk(text),
            StreamItem::Chunk { content: true, .. }
        ));
        match inspect_chunk(usage) {
            StreamItem::Chunk {
                content,
                usage,
                usage_only,
                ..
            } => {
                assert!(!content && usage_only);
                assert_eq!(
                    usage,
                    Some(Usage {
                        prompt_tokens: 26,
                        completion_tokens: 4,
                        cached_tokens: 16
                    })
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(inspect_chunk("[DONE]"), StreamItem::Done);
        assert_eq!(inspect_chunk("garbage"), StreamItem::Other);
        assert_eq!(inspect_chunk("[1]"), StreamItem::Other);
    }

    #[test]
    fn tool_call_and_continuous_usage_chunks() {
        let tool = json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\""}}]}}],
            "usage":{"prompt_tokens":3,"completion_tokens":1}});
        match inspect_chunk(&tool.to_string()) {
            StreamItem::Chunk {
                content,
                usage,
                usage_only,
                ..
            } => {
                assert!(content && !usage_only);
                assert_eq!(usage.map(|u| u.completion_tokens), Some(1));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    /// Both classifiers on `data`: equal, and the full one's answer.
    fn classify_alike(data: &str) -> StreamItem {
        let (full, _) = inspect_chunk_json(data);
        assert_eq!(inspect_chunk(data), full, "{data}");
        full
    }

    #[test]
    fn the_one_pass_reading_agrees_with_the_full_parse_on_captured_vllm_streams() {
        let capture = include_str!("../../../testdata/vllm-capture/requests.jsonl");
        let (mut events, mut content, mut usage) = (0, 0, 0);
        for line in capture.lines() {
            let r: Value = serde_json::from_str(line).expect("capture line");
            for sse in r["response_sse_lines"].as_array().into_iter().flatten() {
                let Some(data) = sse.as_str().and_then(|l| l.strip_prefix("data: ")) else {
                    continue;
                };
                events += 1;
                match classify_alike(data) {
                    StreamItem::Chunk {
                        content: c,
                        usage: u,
                        ..
                    } => {
                        content += usize::from(c);
                        usage += usize::from(u.is_some());
                    }
                    StreamItem::Done | StreamItem::Other => {}
                }
            }
        }
        // The capture's streams: some content, some usage chunks.
        assert!(
            events > 20 && content > 10 && usage > 0,
            "{events} {content} {usage}"
        );
    }

    #[test]
    fn the_one_pass_reading_agrees_on_odd_shapes() {
        let cases = [
            // Duplicate keys: the last counts, at every level.
            r#"{"choices":[{"delta":{"content":"a"}}],"choices":[]}"#,
            r#"{"choices":[],"choices":[{"delta":{"content":"a"}}]}"#,
            r#"{"choices":[{"text":"a","text":""}]}"#,
            r#"{"choices":[{"delta":{"content":""},"delta":{"content":"x"}}]}"#,
            r#"{"choices":[{"delta":{"content":"x","content":null}}]}"#,
            r#"{"usage":{"prompt_tokens":1},"usage":null,"choices":[]}"#,
            r#"{"usage":null,"usage":{"prompt_tokens":1}}"#,
            // Wrong types read as absent.
            r#"{"choices":{"delta":{"content":"x"}}}"#,
            r#"{"choices":"x","usage":{"completion_tokens":2}}"#,
            r#"{"choices":[1,"a",null,[{"text":"x"}],{"text":5}]}"#,
            r#"{"choices":[{"delta":"content"}]}"#,
            r#"{"choices":[{"delta":{"content":["x"],"tool_calls":{"a":1}}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[ ]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{}]}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"r"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"r"}}]}"#,
            r#"{"usage":{"prompt_tokens":-1,"completion_tokens":1.5,"prompt_tokens_details":{"cached_tokens":"3"}}}"#,
            // Escapes in keys and values, and keys at the wrong level.
            r#"{"ch\u006fices":[{"delta":{"c\u006fntent":"\n"}}]}"#,
            r#"{"choices":[{"delta":{"content":"\u0000"}}]}"#,
            r#"{"choices":[{"delta":{"text":"x"},"content":"y","choices":[]}],"text":"z"}"#,
            r#"{"usage":{},"choices":[]}"#,
            r#" {"choices":[{"text":" the"}]} "#,
            r#"{}"#,
            // Not objects, or not JSON.
            r#"[{"choices":[]}]"#,
            r#""x""#,
            r#"{"choices":[}"#,
            r#"{"choices":[]} trailing"#,
            r#"{"choices":[{"delta":{"content":"\ud800"}}]}"#,
            "",
            " [DONE] ",
        ];
        for data in cases {
            classify_alike(data);
        }
        assert_eq!(
            classify_alike(r#"{"choices":[],"choices":[{"delta":{"content":"a"}}]}"#),
            StreamItem::Chunk {
                content: true,
                usage: None,
                usage_only: false
            }
        );
        assert_eq!(
            classify_alike(r#"{"ch\u006fices":[{"delta":{"c\u006fntent":"\n"}}]}"#),
            StreamItem::Chunk {
                content: true,
                usage: None,
                usage_only: false
            }
        );
    }

    #[test]
    fn payloads_only_the_full_parse_rejects_may_be_metered() {
        // A lone surrogate in a skipped field: the one pass does not decode it.
        let data = r#"{"id":"\ud800","choices":[{"delta":{"content":"x"}}]}"#;
        assert_eq!(inspect_chunk_json(data).0, StreamItem::Other);
        assert!(matches!(
            inspect_chunk(data),
            StreamItem::Chunk { content: true, .. }
        ));
    }
}
