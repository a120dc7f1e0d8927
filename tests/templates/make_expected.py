#!/usr/bin/env python3
"""Writes tests/templates/expected/*.json: what Hugging Face transformers renders for a matrix of
conversations, the reference that tests/tokenizer_real.rs holds our minijinja engine to.

Setup (once):
    python3 -m venv /tmp/tokref && /tmp/tokref/bin/pip install transformers jinja2 tokenizers
    scripts/fetch-test-assets.sh          # real tokenizers under $MLEX_CACHE_DIR/test-assets
Run:
    /tmp/tokref/bin/python tests/templates/make_expected.py [--templates DIR]

--templates DIR: a folder of *.jinja chat templates (llama.cpp's models/templates from the
llama-cpp-python sdist); renders each with fixed special tokens into llama_cpp_templates.json.

Cases are stored with the conversation in OpenAI wire shape (tool-call arguments as JSON
strings), exactly what the Rust test feeds to `parse_messages_json`. The clock is pinned to
FIXED_EPOCH (the Rust side reads it from SOURCE_DATE_EPOCH) for templates that call strftime_now.
"""
import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path

import transformers
import transformers.utils.chat_template_utils as ctu
from transformers import AutoTokenizer

FIXED_EPOCH = 1721995200  # 2024-07-26 12:00:00 UTC
HERE = Path(__file__).resolve().parent
OUT = Path(os.environ.get("MLEX_EXPECTED_DIR", HERE / "expected"))
TOKENIZERS = ["qwen3", "llama3_1", "gemma3"]


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return _dt.datetime.fromtimestamp(FIXED_EPOCH, _dt.timezone.utc).replace(tzinfo=None)


ctu.datetime = _FixedDatetime  # strftime_now() looks the name up at call time

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city (°C or °F).",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "max_results": {"type": "number"}},
                "required": ["query"],
            },
        },
    },
]


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CASES = [
    {"name": "basic", "messages": [SYSTEM, {"role": "user", "content": "Hello!"}]},
    {
        "name": "no_system_no_generation_prompt",
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"}],
        "add_generation_prompt": False,
    },
    {
        "name": "multi_turn",
        "messages": [
            SYSTEM,
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "2+2 = 4."},
            {"role": "user", "content": "  And 3+3?  "},
        ],
    },
    {
        "name": "tools_single_call",
        "tools": TOOLS,
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"})]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
        ],
    },
    {
        "name": "tools_parallel_calls",
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Weather in Paris and Tokyo, then search news."},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    call("call_a", "get_weather", {"city": "Paris", "days": 2}),
                    call("call_b", "get_weather", {"city": "東京"}),
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_b", "name": "get_weather", "content": "rain"},
            {"role": "assistant", "content": "Paris is sunny; Tokyo has rain."},
            {"role": "user", "content": "Thanks!"},
        ],
    },
    {"name": "tools_offered_only", "tools": TOOLS, "messages": [{"role": "user", "content": "Search for MLX."}]},
    {"name": "thinking_off", "enable_thinking": False, "messages": [{"role": "user", "content": "Quick: capital of France?"}]},
    {"name": "thinking_on", "enable_thinking": True, "messages": [{"role": "user", "content": "Think: 17*23?"}]},
    {
        "name": "reasoning_round_trip",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": "The user greets me.\nI greet back."},
            {"role": "user", "content": "Tell me a joke."},
        ],
    },
    {
        "name": "unicode_and_escapes",
        "messages": [{"role": "user", "content": "Ünïcödé 😀 日本語 \"quotes\" <tag> & \\ back\nslash\ttab"}],
    },
    {
        "name": "extra_variables",
        "extra": {"date_string": "01 Jan 2025", "custom_flag": True},
        "messages": [{"role": "user", "content": "What day is it?"}],
    },
]

ENCODE_TEXTS = [
    "Hello world",
    " leading space and  double  spaces",
    "Ünïcödé café naïve — 日本語のテキスト 😀🎉👩‍👩‍👧",
    "code:\n\tfn main() { println!(\"hi\"); }\n",
    "<|im_start|>user\nhi<|im_end|>",
]


def template_message(m):
    """The OpenAI wire message as mlex hands it to the template (see src/tokenizer/template.rs):
    content as a string, tool-call arguments parsed, absent fields left out."""
    out = {"role": m["role"], "content": m.get("content") or ""}
    if m.get("reasoning_content") is not None:
        out["reasoning_content"] = m["reasoning_content"]
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])},
            }
            for c in m["tool_calls"]
        ]
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            out[key] = m[key]
    return out


def case_kwargs(case):
    kwargs = dict(case.get("extra", {}))
    if case.get("enable_thinking") is not None:
        kwargs["enable_thinking"] = case["enable_thinking"]
    return kwargs


def case_entry(case):
    return {
        "name": case["name"],
        "messages": case["messages"],
        "tools": case.get("tools"),
        "add_generation_prompt": case.get("add_generation_prompt", True),
        "enable_thinking": case.get("enable_thinking"),
        "extra": case.get("extra", {}),
    }


def record(case, render):
    entry = case_entry(case)
    try:
        entry["expected"] = render([template_message(m) for m in case["messages"]], entry)
    except Exception as e:  # the template refuses this conversation: we must refuse it too
        entry["error"] = str(e)
    return entry


def tokenizer_file(assets, name):
    tok = AutoTokenizer.from_pretrained(str(assets / name))

    def render(messages, entry):
        return tok.apply_chat_template(
            messages,
            tools=entry["tools"],
            add_generation_prompt=entry["add_generation_prompt"],
            tokenize=False,
            **case_kwargs(entry),
        )

    raw = tok.backend_tokenizer if hasattr(tok, "backend_tokenizer") else tok._tokenizer
    encode = []
    for text in ENCODE_TEXTS:
        for special in (False, True):
            ids = raw.encode(text, add_special_tokens=special).ids
            encode.append({"text": text, "add_special_tokens": special, "ids": ids,
                           "decoded": raw.decode(ids, skip_special_tokens=False),
                           "decoded_skip_special": raw.decode(ids, skip_special_tokens=True)})
    return {
        "generator": f"transformers {transformers.__version__}",
        "tokenizer": name,
        "cases": [record(c, render) for c in CASES],
        "encode": encode,
    }


# The llama.cpp set is large (70 templates): a few cases that exercise the most template logic,
# and the whole matrix (system prompt, tool calls and results, thinking on/off, reasoning round
# trip…) for the templates whose output formats mlex parses (tool calls, reasoning spans).
TEMPLATE_SET_CASES = ["multi_turn", "tools_parallel_calls", "reasoning_round_trip"]
FULL_MATRIX_TEMPLATES = [
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "Qwen3-Coder.jinja",
    "Qwen3.5-4B.jinja",
    "google-gemma-4-31B-it.jinja",
    "google-gemma-4-31B-it-interleaved.jinja",
    "HuggingFaceTB-SmolLM3-3B.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
]
if os.environ.get("MLEX_ALL_CASES"):  # a local, wider sweep (not committed: ~600 kB)
    TEMPLATE_SET_CASES = [c["name"] for c in CASES]


def templates_file(folder):
    results = {}
    for path in sorted(Path(folder).glob("*.jinja")):
        source = path.read_text()
        full = path.name in FULL_MATRIX_TEMPLATES
        cases = [c for c in CASES if full or c["name"] in TEMPLATE_SET_CASES]

        def render(messages, entry, source=source):
            out, _ = ctu.render_jinja_template(
                conversations=[messages],
                tools=entry["tools"],
                chat_template=source,
                add_generation_prompt=entry["add_generation_prompt"],
                bos_token="<s>",
                eos_token="</s>",
                **case_kwargs(entry),
            )
            return out[0]

        results[path.name] = {}
        for c in cases:
            entry = record(c, render)
            results[path.name][c["name"]] = {k: entry[k] for k in ("expected", "error") if k in entry}
    return {
        "generator": f"transformers {transformers.__version__}",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "cases": [case_entry(c) for c in CASES],
        "templates": results,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", default=os.environ.get("MLEX_TEST_ASSETS") or
                    str(Path(os.environ.get("MLEX_CACHE_DIR", Path.home() / ".cache/mlex")) / "test-assets"))
    ap.add_argument("--templates", help="folder of *.jinja templates (llama.cpp models/templates)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    assets = Path(args.assets)
    for name in TOKENIZERS:
        if not (assets / name / "tokenizer.json").exists():
            sys.exit(f"missing {assets / name}: run scripts/fetch-test-assets.sh")
        data = tokenizer_file(assets, name)
        (OUT / f"{name}.json").write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
        print(f"{name}: {sum('error' in c for c in data['cases'])} error cases of {len(data['cases'])}")
    if args.templates:
        data = templates_file(args.templates)
        (OUT / "llama_cpp_templates.json").write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
        n = sum(len(r) for r in data["templates"].values())
        errors = sum("error" in x for r in data["templates"].values() for x in r.values())
        print(f"templates: {errors} error cases of {n}")


if __name__ == "__main__":
    main()
