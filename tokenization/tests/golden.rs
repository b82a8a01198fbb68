//! Golden tests: token ids vLLM itself produced (the reference's Qwen3 ids and the real vLLM
//! capture's `/tokenize` answers), plus rendered-prompt checks for the cases vLLM handles
//! specially.

use chrono::{DateTime, FixedOffset};
use kvroute_tokenization::{ChatRequest, PromptInput, TokenizeError, Tokenizer};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::OnceLock;

fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata")
        .join(rel)
}

fn qwen3() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_dir(&testdata("tokenizers/qwen3")).expect("load qwen3"))
}

fn tiny() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_dir(&testdata("vllm-capture/tokenizer")).expect("load tiny"))
}

fn now() -> DateTime<FixedOffset> {
    DateTime::parse_from_rfc3339("2026-11-30T12:00:00+00:00").expect("time")
}

fn chat(body: Value) -> ChatRequest {
    serde_json::from_value(body).expect("chat request")
}

fn render(t: &Tokenizer, body: Value) -> String {
    t.render_chat(&chat(body), now()).expect("render")
}

const GOLDEN_26: [u32; 26] = [
    151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 3838, 374,
    279, 6722, 315, 9625, 30, 151645, 198, 151644, 77091, 198,
];

fn capital_messages() -> Value {
    json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}
    ])
}

#[test]
fn qwen3_reference_ids() {
    let enc = qwen3()
        .encode_chat(&chat(json!({"messages": capital_messages()})), now())
        .expect("encode");
    assert_eq!(
        enc.prompt,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(enc.token_ids, GOLDEN_26);
}

#[test]
fn qwen3_reference_ids_thinking_off() {
    let enc = qwen3()
        .encode_chat(
            &chat(json!({"messages": capital_messages(), "chat_template_kwargs": {"enable_thinking": false}})),
            now(),
        )
        .expect("encode");
    let mut expected = GOLDEN_26.to_vec();
    expected.extend([151667, 271, 151668, 271]);
    assert_eq!(enc.token_ids.len(), 30);
    assert_eq!(enc.token_ids, expected);
}

#[test]
fn reasoning_effort_none_turns_thinking_off() {
    let off = render(
        qwen3(),
        json!({"messages": capital_messages(), "reasoning_effort": "none"}),
    );
    assert!(
        off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{off}"
    );
    let on = render(
        qwen3(),
        json!({"messages": capital_messages(), "reasoning_effort": "high"}),
    );
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on}");
    // An explicit enable_thinking wins over reasoning_effort.
    let explicit = render(
        qwen3(),
        json!({"messages": capital_messages(), "reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": true}}),
    );
    assert!(explicit.ends_with("<|im_start|>assistant\n"), "{explicit}");
}

/// vLLM's own /tokenize answers from the real capture (tiny Llama tokenizer).
#[test]
fn capture_tokenize_ids_match_vllm() {
    let text =
        std::fs::read_to_string(testdata("vllm-capture/requests.jsonl")).expect("requests.jsonl");
    let mut checked = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let rec: Value = serde_json::from_str(line).expect("jsonl");
        let (Some(req), Some(resp)) = (rec.get("tokenize_request"), rec.get("tokenize_response"))
        else {
            continue;
        };
        let expected: Vec<u32> = serde_json::from_value(resp["tokens"].clone()).expect("tokens");
        let got = if req.get("messages").is_some() {
            tiny()
                .encode_chat(&chat(req.clone()), now())
                .expect("chat")
                .token_ids
        } else {
            let prompt: PromptInput =
                serde_json::from_value(req["prompt"].clone()).expect("prompt");
            // /tokenize with a prompt: add_special_tokens defaults to true.
            let add = req
                .get("add_special_tokens")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            tiny().encode_prompt(&prompt, add).expect("prompt")
        };
        assert_eq!(got, expected, "request {}", rec["tag"]);
        assert_eq!(
            rec["prompt_token_ids"],
            json!(expected),
            "request {}",
            rec["tag"]
        );
        checked += 1;
    }
    assert!(checked >= 9, "only {checked} capture requests checked");
}

#[test]
fn tools_render_the_tools_block_with_python_json() {
    let out = render(
        qwen3(),
        json!({
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather — now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        }),
    );
    let expected_tool = r#"{"type": "function", "function": {"name": "get_weather", "description": "Get the weather — now", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#;
    assert!(
        out.starts_with("<|im_start|>system\n# Tools\n\nYou may call one or more functions"),
        "{out}"
    );
    assert!(
        out.contains(&format!("<tools>\n{expected_tool}\n</tools>")),
        "{out}"
    );
    assert!(
        out.ends_with("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"),
        "{out}"
    );
}

#[test]
fn no_tools_means_none_not_empty_list() {
    // With tools absent the Qwen3 template must not print the tools header.
    let out = render(
        qwen3(),
        json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(
        out,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn multi_turn_strips_think_from_history() {
    let out = render(
        qwen3(),
        json!({"messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
            {"role": "user", "content": "and 3+3?"}
        ]}),
    );
    assert_eq!(
        out,
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn tool_calls_and_tool_results() {
    let out = render(
        qwen3(),
        json!({"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}
        ]}),
    );
    let expected = "<|im_start|>user\nWeather in Paris?<|im_end|>\n\
<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call><|im_end|>\n\
<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n\
<|im_start|>assistant\n";
    assert_eq!(out, expected);
}

#[test]
fn assistant_reasoning_after_last_query_is_rendered() {
    let out = render(
        qwen3(),
        json!({"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning_content": "r"}
        ], "add_generation_prompt": false}),
    );
    assert_eq!(
        out,
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n"
    );
}

#[test]
fn multi_part_content_joined_with_newline() {
    let out = render(
        qwen3(),
        json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "first"}, {"type": "text", "text": "second"}
        ]}]}),
    );
    assert_eq!(
        out,
        "<|im_start|>user\nfirst\nsecond<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn developer_role_becomes_system() {
    let out = render(
        qwen3(),
        json!({"messages": [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "hi"}]}),
    );
    assert_eq!(
        out,
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn continue_final_message_leaves_the_message_open() {
    let out = render(
        qwen3(),
        json!({"messages": [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}],
               "add_generation_prompt": false, "continue_final_message": true}),
    );
    // Qwen3 renders the final assistant turn (after the last user query) with an empty think
    // block; continue_final_message then cuts right after the message text.
    assert_eq!(
        out,
        "<|im_start|>user\nCount<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n1, 2,"
    );
    let both = qwen3().render_chat(
        &chat(
            json!({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true}),
        ),
        now(),
    );
    assert!(matches!(both, Err(TokenizeError::InvalidRequest(_))));
}

#[test]
fn completions_prompt_text_and_ids() {
    let ids = qwen3()
        .encode_prompt(&PromptInput::from("What is the capital of France?"), true)
        .expect("encode");
    assert_eq!(ids, vec![3838, 374, 279, 6722, 315, 9625, 30]);
    let passthrough = qwen3()
        .encode_prompt(&PromptInput::TokenIds(vec![1, 2, 151668]), true)
        .expect("ids");
    assert_eq!(passthrough, vec![1, 2, 151668]);
    for bad in [vec![-1], vec![151669], vec![i64::MAX]] {
        assert!(matches!(
            qwen3().encode_prompt(&PromptInput::TokenIds(bad), true),
            Err(TokenizeError::TokenOutOfVocab { .. })
        ));
    }
    let text = qwen3().decode(&GOLDEN_26, false).expect("decode");
    assert!(text.starts_with("<|im_start|>system\nYou are a helpful assistant."));
}

#[test]
fn tokenizer_facts() {
    let q = qwen3();
    assert_eq!(q.eos_token_ids(), &[151645]);
    assert_eq!(q.bos_token_id(), None);
    assert_eq!(q.vocab_size(), 151669);
    let t = tiny();
    assert_eq!(t.eos_token_ids(), &[2]);
    assert_eq!(t.bos_token_id(), Some(1));
    assert_eq!(t.vocab_size(), 1000);
}

#[test]
fn odd_input_is_an_error_not_a_panic() {
    for body in [
        json!({"messages": []}),
        json!({"messages": [{"role": 1}]}),
        json!({"messages": [{"role": "user", "content": {"a": 1}}]}),
        json!({"messages": [{"role": "user", "content": "x"}], "tools": [1]}),
        json!({"messages": [{"role": "user", "content": "x"}], "chat_template": "{% if %}"}),
        json!({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ raise_exception('nope') }}"}),
        json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tokenize": true}}),
    ] {
        assert!(
            qwen3().render_chat(&chat(body.clone()), now()).is_err(),
            "{body}"
        );
    }
    let raised = qwen3().render_chat(
        &chat(json!({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ raise_exception('nope') }}"})),
        now(),
    );
    assert!(matches!(raised, Err(TokenizeError::TemplateRaised(m)) if m == "nope"));
}

/// The segment cache must never change ids: compare it with the plain HF path on text full of
/// special tokens, repeated pieces and odd whitespace, cold and warm.
#[test]
fn segment_cache_is_exact() {
    let q = qwen3();
    let pieces = [
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "\n",
        "  ",
        " word",
        "Ünïcödé 中文 ",
        "1234567",
        "\r\n\r\n",
        "<tool_call>",
        "<|im_start",
        "|>",
        "\u{1F600}",
        "tab\t",
    ];
    let mut x: u64 = 42;
    for round in 0..80 {
        let mut text = String::new();
        for _ in 0..(round % 40) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p = pieces[(x % pieces.len() as u64) as usize];
            text.push_str(p);
            if x.is_multiple_of(5) {
                // A long piece, so the cache path (>= 256 bytes) is exercised.
                text.push_str(&"the router hashes prefix blocks ".repeat((x % 20) as usize));
            }
        }
        for add in [false, true] {
            let plain = q.encode_text_uncached(&text, add).expect("plain");
            assert_eq!(q.encode_text(&text, add).expect("cold"), plain, "{text:?}");
            assert_eq!(q.encode_text(&text, add).expect("warm"), plain, "{text:?}");
        }
    }
    assert!(q.segment_cache_stats().hits > 0);
    let off = Tokenizer::from_dir(&testdata("tokenizers/qwen3"))
        .expect("load")
        .with_segment_cache_bytes(0);
    let enc = off
        .encode_chat(&chat(json!({"messages": capital_messages()})), now())
        .expect("encode");
    assert_eq!(enc.token_ids, GOLDEN_26);
    assert_eq!(
        off.segment_cache_stats().hits + off.segment_cache_stats().misses,
        0
    );
}

/// HF template features the Qwen3 template does not use: `tojson(indent=...)`, `strftime_now`
/// (from the injected now), `{% generation %}` blocks, special-token variables, tools shaped
/// like vLLM's pydantic dump, and a request template overriding the tokenizer's.
#[test]
fn inline_template_features() {
    let template = "{{ strftime_now('%d %b %Y') }}|{{ tools | tojson(indent=2) }}|\
{% for m in messages %}{% generation %}{{ m.role }}:{{ m.content }};{% endgeneration %}{% endfor %}|\
{{ eos_token }}|{{ bos_token is defined }}|{{ 'x' if documents is none else documents | length }}";
    let out = render(
        qwen3(),
        json!({
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"function": {"name": "f"}, "type": "function", "extra": 1}],
            "chat_template": template
        }),
    );
    let expected = "30 Nov 2026|[\n  {\n    \"type\": \"function\",\n    \"function\": {\n      \"name\": \"f\",\n      \"description\": null,\n      \"parameters\": null\n    }\n  }\n]|user:hi;|<|im_end|>|False|x";
    assert_eq!(out, expected);
}

#[test]
fn other_config_files_on_a_loaded_tokenizer_match_loading_them_together() {
    use kvroute_tokenization::TokenizerFiles;
    let dir = testdata("tokenizers/qwen3");
    let read = |f: &str| std::fs::read(dir.join(f)).ok();
    // A config whose template differs from the directory's: the system turn is dropped.
    let config = br#"{"chat_template": "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n", "eos_token": "<|im_end|>"}"#;
    let files = TokenizerFiles {
        tokenizer_json: read("tokenizer.json").expect("tokenizer.json"),
        tokenizer_config_json: Some(config.to_vec()),
        special_tokens_map_json: read("special_tokens_map.json"),
        generation_config_json: read("generation_config.json"),
        ..TokenizerFiles::default()
    };
    let together = Tokenizer::from_files(files.clone()).expect("from_files");
    let swapped = qwen3()
        .with_config_files(&TokenizerFiles {
            tokenizer_json: Vec::new(),
            ..files
        })
        .expect("with_config_files");
    let req = chat(json!({"messages": capital_messages()}));
    let a = together.encode_chat(&req, now()).expect("encode");
    let b = swapped.encode_chat(&req, now()).expect("encode");
    assert_eq!(a.token_ids, b.token_ids);
    assert_ne!(
        b.token_ids,
        qwen3().encode_chat(&req, now()).expect("encode").token_ids,
        "the new template is in force"
    );
    assert_eq!(swapped.eos_token_ids(), together.eos_token_ids());
}
