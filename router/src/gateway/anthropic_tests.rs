//! Unit tests of the Anthropic <-> OpenAI translation (golden bodies and streams).

use super::*;

fn decode(v: Value) -> Result<AnthropicRequest, GatewayError> {
    decode_request(v.to_string().as_bytes())
}

#[test]
fn translates_a_full_conversation() {
    let req = decode(json!({
        "model": "claude-alias",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
                {"type": "text", "text": "Thanks"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
            ]}
        ],
        "stop_sequences": ["\n\nHuman:"],
        "temperature": 0.5,
        "top_k": 5,
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object",
            "properties": {"city": {"type": "string"}}}},
            {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "metadata": {"user_id": "u1"},
        "thinking": {"type": "disabled"},
        "ignore_eos": true
    }))
    .expect("decode");
    assert_eq!(req.model, "claude-alias");
    assert!(!req.stream);
    let expected = json!({
        "model": "claude-alias",
        "messages": [
            {"role": "system", "content": "Be brief.\nUse tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "toolu_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
            {"role": "user", "content": [{"type": "text", "text": "Thanks"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}
        ],
        "max_tokens": 64,
        "stop": ["\n\nHuman:"],
        "temperature": 0.5,
        "top_k": 5,
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "user": "u1",
        "chat_template_kwargs": {"enable_thinking": false},
        "ignore_eos": true
    });
    assert_eq!(Value::Object(req.chat), expected);
}

#[test]
fn stream_forces_usage() {
    let req = decode(json!({"model": "m", "max_tokens": 1, "stream": true,
        "messages": [{"role": "user", "content": "x"}]}))
    .expect("decode");
    assert!(req.stream);
    assert_eq!(req.chat["stream_options"], json!({"include_usage": true}));
}

#[test]
fn bad_requests() {
    use GatewayError as E;
    assert!(matches!(decode_request(b"{"), Err(E::MalformedJson(_))));
    let m = json!([{"role": "user", "content": "x"}]);
    assert_eq!(
        decode(json!({"max_tokens": 1, "messages": m})),
        Err(E::MissingField("model"))
    );
    assert_eq!(
        decode(json!({"model": "a", "messages": m})),
        Err(E::MissingField("max_tokens"))
    );
    assert_eq!(
        decode(json!({"model": "a", "max_tokens": 1})),
        Err(E::MissingField("messages"))
    );
    for bad in [
        json!({"model": "a", "max_tokens": -1, "messages": m}),
        json!({"model": "a", "max_tokens": 1, "messages": []}),
        json!({"model": "a", "max_tokens": 1, "messages": [{"role": "system", "content": "x"}]}),
        json!({"model": "a", "max_tokens": 1, "messages": [{"role": "user", "content": 3}]}),
        json!({"model": "a", "max_tokens": 1, "messages": m, "tool_choice": {"type": "tool"}}),
        json!({"model": "a", "max_tokens": 1, "messages": m, "tools": [{}]}),
        json!({"model": "a", "max_tokens": 1, "messages": m, "stop_sequences": "x"}),
        json!({"model": "a", "max_tokens": 1, "messages": m, "system": 5}),
        json!({"model": "a", "max_tokens": 1, "messages": [{"role": "user", "content": []}]}),
        // Passed through to the worker, so held to the chat decoder's rule (found by fuzzing).
        json!({"model": "a", "max_tokens": 1, "messages": m, "stream_options": [1]}),
        json!({"model": "a", "max_tokens": 1, "messages": m, "stream": true, "stream_options": 1}),
    ] {
        assert!(
            matches!(decode(bad.clone()), Err(E::InvalidField { .. })),
            "{bad}"
        );
    }
}

#[test]
fn stop_reasons() {
    assert_eq!(
        map_stop_reason(Some("stop"), None),
        (json!("end_turn"), Value::Null)
    );
    assert_eq!(
        map_stop_reason(Some("stop"), Some(&json!(151645))),
        (json!("end_turn"), Value::Null)
    );
    assert_eq!(
        map_stop_reason(Some("stop"), Some(&json!("END"))),
        (json!("stop_sequence"), json!("END"))
    );
    assert_eq!(map_stop_reason(Some("length"), None).0, json!("max_tokens"));
    assert_eq!(
        map_stop_reason(Some("tool_calls"), None).0,
        json!("tool_use")
    );
    assert_eq!(map_stop_reason(None, None).0, Value::Null);
}

#[test]
fn non_streaming_response() {
    let chat = json!({
        "id": "chatcmpl-abc", "object": "chat.completion", "model": "Qwen/Qwen3-32B",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "stop_reason": null, "message": {
            "role": "assistant", "content": "Let me look.", "reasoning_content": "hmm",
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 9, "total_tokens": 109,
            "prompt_tokens_details": {"cached_tokens": 64}}
    });
    assert_eq!(
        message_from_chat(&chat, "claude-alias"),
        json!({
            "id": "msg_abc", "type": "message", "role": "assistant", "model": "claude-alias",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": ""},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 36, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 64,
                "output_tokens": 9}
        })
    );
}

fn names(events: &[SseEvent]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e.event.as_deref().unwrap_or(""))
        .collect()
}

#[test]
fn streaming_text_then_tool() {
    let mut t = StreamTranslator::new("m");
    let mut events = Vec::new();
    for chunk in [
        json!({"id": "chatcmpl-9", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        json!({"id": "chatcmpl-9", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
        json!({"id": "chatcmpl-9", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1",
            "type": "function", "function": {"name": "f", "arguments": ""}}]}}]}),
        json!({"id": "chatcmpl-9", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
            "function": {"arguments": "{\"a\":1}"}}]}}]}),
        json!({"id": "chatcmpl-9", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        json!({"id": "chatcmpl-9", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 4}}}),
    ] {
        events.extend(t.on_chunk(&chunk));
    }
    events.extend(t.finish());
    assert!(t.finish().is_empty(), "finish is idempotent");
    assert_eq!(
        names(&events),
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let data = |i: usize| serde_json::from_str::<Value>(&events[i].data).expect("json");
    assert_eq!(data(0)["message"]["id"], "msg_9");
    assert_eq!(
        data(3),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}})
    );
    assert_eq!(
        data(5)["content_block"],
        json!({"type": "tool_use", "id": "call_1", "name": "f", "input": {}})
    );
    assert_eq!(
        data(6)["delta"],
        json!({"type": "input_json_delta", "partial_json": "{\"a\":1}"})
    );
    assert_eq!(data(7)["index"], 1);
    assert_eq!(
        data(8),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
            "usage": {"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4,
                "output_tokens": 3}})
    );
}

#[test]
fn empty_stream_still_frames_a_message() {
    let mut t = StreamTranslator::new("m");
    assert_eq!(
        names(&t.finish()),
        ["message_start", "ping", "message_delta", "message_stop"]
    );
}
