#!/usr/bin/env python3
"""Golden chat prompts and token ids per model family, from transformers' apply_chat_template.

vLLM 0.33 renders a chat request with the tokenizer's HF chat template (transformers'
`apply_chat_template`) and encodes the text with add_special_tokens=False; this script does the
same on the tokenizer directories under testdata/tokenizers/ and writes families.json, which
tokenization/tests/golden_families.rs compares kvroute's `Tokenizer::encode_chat` with.

Each case is a vLLM request body (what the Rust test feeds to `ChatRequest`). The only part of
vLLM's message rebuild these cases need is done here as vLLM does it: tool-call `arguments`
strings are JSON-parsed, `tools` is None when absent, tools are given in the full shape of
`ChatCompletionToolsParam.model_dump()`. Templates' `strftime_now` sees a fixed instant.

Run offline, no torch needed:
    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install transformers==5.20.2 jinja2
    HF_HUB_OFFLINE=1 /tmp/tfenv/bin/python tokenization/goldens/gen.py
"""

import datetime as _dt
import json
import os
import sys

import tokenizers
import transformers
import transformers.utils.chat_template_utils as ctu
from transformers import AutoTokenizer

NOW = _dt.datetime(2026, 11, 30, 12, 0, 0)


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


# strftime_now in the Jinja environment calls `datetime.now()` from this module.
ctu.datetime = _FixedDatetime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZERS = os.path.join(ROOT, "testdata", "tokenizers")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "families.json")

FAMILIES = ["qwen3", "llama3", "gemma3", "deepseek-v3", "gpt-oss", "mistral-nemo"]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
            },
            "required": ["city"],
        },
    },
}

SYSTEM = "You are a helpful assistant. Answer briefly."


def cases():
    """(name, vLLM request body) pairs; every family renders all of them."""
    capital = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    multi = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 12 + 30?"},
        {"role": "assistant", "content": "12 + 30 = 42."},
        {"role": "user", "content": "And times 2? Show the steps, please."},
    ]
    tool_round = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call12345",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call12345", "content": "18 degrees, sunny"},
    ]
    varied = (
        "Résumé of naïve café owners' talk — 東京で3,141,592人 😀 don't/WON'T/'ll\n"
        "```rust\nfn main() {\n    let x = 1_000_000u64; // 'comment'\n}\n```\n\n\tTabs\u00a0and  spaces   \n"
    )
    return [
        ("system_user", {"messages": capital}),
        ("system_user_no_generation_prompt", {"messages": capital, "add_generation_prompt": False}),
        ("user_only", {"messages": [{"role": "user", "content": "Hi there!"}]}),
        ("multi_turn", {"messages": multi}),
        (
            "multi_turn_final_assistant",
            {"messages": multi + [{"role": "assistant", "content": "42 * 2 = 84."}], "add_generation_prompt": False},
        ),
        ("tools", {"messages": [{"role": "user", "content": "What's the weather in Paris?"}], "tools": [WEATHER_TOOL]}),
        ("tools_with_system", {"messages": capital, "tools": [WEATHER_TOOL]}),
        ("tool_call_round", {"messages": tool_round, "tools": [WEATHER_TOOL]}),
        ("varied_text", {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": varied}]}),
    ]


def vllm_conversation(messages):
    """The parts of vLLM's message rebuild these cases exercise: tool-call arguments parsed."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            if isinstance(fn.get("arguments"), str):
                fn["arguments"] = json.loads(fn["arguments"])
        out.append(m)
    return out


def render(tok, body):
    kwargs = dict(
        tools=body.get("tools"),
        documents=None,
        add_generation_prompt=body.get("add_generation_prompt", True),
        continue_final_message=False,
    )
    conversation = vllm_conversation(body["messages"])
    prompt = tok.apply_chat_template(conversation, tokenize=False, **kwargs)
    ids = tok.apply_chat_template(conversation, tokenize=True, return_dict=False, **kwargs)
    if hasattr(ids, "get") and not isinstance(ids, list):
        ids = ids["input_ids"]
    return prompt, [int(i) for i in ids]


def main():
    families = {}
    for family in FAMILIES:
        path = os.path.join(TOKENIZERS, family)
        tok = AutoTokenizer.from_pretrained(path)
        raw = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        out = []
        for name, body in cases():
            case = {"name": name, "request": body}
            try:
                prompt, ids = render(tok, body)
            except Exception as e:  # the template raised: kvroute must fail too
                case["error"] = f"{type(e).__name__}: {e}"
                out.append(case)
                continue
            case["prompt"] = prompt
            case["ids"] = ids
            # Where transformers replaces the tokenizer.json pipeline (DeepSeek-V3 declared as
            # LlamaTokenizerFast), also record what tokenizer.json itself gives.
            file_ids = raw.encode(prompt, add_special_tokens=False).ids
            if file_ids != ids:
                case["tokenizer_json_ids"] = file_ids
            out.append(case)
        families[family] = {"class": type(tok).__name__, "cases": out}
        print(family, type(tok).__name__, sum("ids" in c for c in out), "rendered", file=sys.stderr)
    doc = {
        "generator": "tokenization/goldens/gen.py",
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "now": NOW.isoformat() + "+00:00",
        "families": families,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
