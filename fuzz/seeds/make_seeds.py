#!/usr/bin/env python3
"""Writes the hand-made seed files of fuzz/corpus/ (safetensors_header, gguf, config,
chat_template, serve_request): small, real-looking inputs the fuzzer mutates from (the GGUF seeds also take
tests/fixtures/quant_ref.gguf). Files are rewritten; regress-* files (crashes found and fixed)
are never touched."""
import json
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "fuzz" / "corpus"


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data)


# ---- safetensors -------------------------------------------------------------------------
def safetensors(tensors, metadata=None, pad_to=8):
    """tensors: [(name, dtype, shape, itemsize)] -> file bytes with zero data."""
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, size in tensors:
        n = size
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % pad_to)
    return struct.pack("<Q", len(h)) + h + bytes(off)


put("safetensors_header", "seed-llama-layer", safetensors([
    ("model.embed_tokens.weight", "BF16", [16, 8], 2),
    ("model.layers.0.self_attn.q_proj.weight", "BF16", [8, 8], 2),
    ("model.layers.0.input_layernorm.weight", "F32", [8], 4),
    ("lm_head.weight", "F16", [16, 8], 2),
], {"format": "pt"}))
put("safetensors_header", "seed-quantized", safetensors([
    ("model.layers.0.mlp.up_proj.weight", "U32", [16, 4], 4),
    ("model.layers.0.mlp.up_proj.scales", "BF16", [16, 1], 2),
    ("model.layers.0.mlp.up_proj.biases", "BF16", [16, 1], 2),
    ("model.layers.0.mlp.gate.weight", "U8", [4, 8], 1),
], {"format": "mlx"}))
put("safetensors_header", "seed-all-dtypes", safetensors([
    (f"t.{d}", d, [2, 1], s) for d, s in [("F64", 8), ("I64", 8), ("U64", 8), ("I32", 4), ("U16", 2),
                                          ("I16", 2), ("I8", 1), ("BOOL", 1), ("F32", 4)]
] + [("scalar", "F32", [], 4), ("empty", "F16", [0, 3], 2)]))
put("safetensors_header", "seed-empty", safetensors([]))
put("safetensors_header", "seed-index", json.dumps({
    "metadata": {"total_size": 123456},
    "weight_map": {
        "lm_head.weight": "model-00002-of-00002.safetensors",
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00002-of-00002.safetensors",
    },
}, indent=2))

# ---- GGUF --------------------------------------------------------------------------------
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    fmt = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i", T_F32: "<f",
           T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}
    if t == T_STR:
        return gstr(v)
    if t == T_ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gval(et, x) for x in items)
    return struct.pack(fmt[t], v)


def gguf(kvs, tensors, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, dims innermost first, ggml type id, nbytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gval(t, v)
    off, offs = 0, []
    for name, dims, ty, n in tensors:
        offs.append(off)
        off += n
        off += -off % alignment
    for (name, dims, ty, n), o in zip(tensors, offs):
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ty, o)
    out += bytes(-len(out) % alignment)
    data = bytearray(off)
    for i in range(len(data)):
        data[i] = (i * 37 + 11) & 0x7F  # small values: finite f16/f32 scales
    return out + bytes(data)


GF32, GF16, GQ4_0, GQ4_1, GQ5_0, GQ5_1, GQ8_0 = 0, 1, 2, 3, 6, 7, 8
GQ2_K, GQ3_K, GQ4_K, GQ5_K, GQ6_K, GQ8_K, GBF16 = 10, 11, 12, 13, 14, 15, 30
put("gguf", "seed-llama-tiny", gguf([
    ("general.architecture", T_STR, "llama"),
    ("general.name", T_STR, "tiny"),
    ("llama.block_count", T_U32, 1),
    ("llama.embedding_length", T_U32, 32),
    ("llama.attention.head_count", T_U32, 4),
    ("llama.rope.freq_base", T_F32, 10000.0),
    ("llama.attention.layer_norm_rms_epsilon", T_F32, 1e-5),
    ("tokenizer.ggml.model", T_STR, "gpt2"),
    ("tokenizer.ggml.tokens", T_ARR, (T_STR, ["<s>", "</s>", "a", "b", "ab"])),
    ("tokenizer.ggml.token_type", T_ARR, (T_I32, [3, 3, 1, 1, 1])),
    ("tokenizer.ggml.merges", T_ARR, (T_STR, ["a b"])),
    ("tokenizer.ggml.bos_token_id", T_U32, 0),
    ("tokenizer.ggml.add_bos_token", T_BOOL, True),
    ("general.alignment", T_U32, 32),
], [
    ("token_embd.weight", [32, 5], GF16, 32 * 5 * 2),
    ("blk.0.attn_norm.weight", [32], GF32, 32 * 4),
    ("blk.0.attn_q.weight", [32, 32], GQ8_0, 32 * 34),
    ("blk.0.ffn_up.weight", [32, 2], GQ4_0, 2 * 18),
    ("output.weight", [32, 5], GBF16, 32 * 5 * 2),
]))
put("gguf", "seed-k-quants", gguf([
    ("general.architecture", T_STR, "qwen2"),
    ("general.alignment", T_U32, 64),
    ("nested", T_ARR, (T_ARR, [(T_U8, [1, 2]), (T_F64, [0.5])])),
    ("scalars.i8", T_I8, -3), ("scalars.u16", T_U16, 7), ("scalars.i16", T_I16, -7),
    ("scalars.i64", T_I64, -1), ("scalars.u64", T_U64, 1 << 40), ("scalars.f64", T_F64, 2.5),
], [
    ("q2k", [256], GQ2_K, 84), ("q3k", [256], GQ3_K, 110), ("q4k", [256], GQ4_K, 144),
    ("q5k", [256], GQ5_K, 176), ("q6k", [256], GQ6_K, 210), ("q8k", [256], GQ8_K, 292),
    ("q4_1", [32], GQ4_1, 20), ("q5_0", [32], GQ5_0, 22), ("q5_1", [32, 2], GQ5_1, 48),
], alignment=64))
put("gguf", "seed-metadata-only", gguf([("general.architecture", T_STR, "gemma3"),
                                        ("gemma3.context_length", T_U64, 32768)], []))
fixture = ROOT / "tests" / "fixtures" / "quant_ref.gguf"
if fixture.exists():
    put("gguf", "seed-quant-ref", fixture.read_bytes())

# ---- config.json -------------------------------------------------------------------------
llama = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "max_position_embeddings": 131072, "tie_word_embeddings": True, "bos_token_id": 1,
    "eos_token_id": [2, 3],
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
put("config", "seed-llama3", json.dumps(llama, indent=2))
put("config", "seed-qwen3-quantized", json.dumps({
    "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 151936,
    "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 1000000,
    "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                     "model.embed_tokens": {"group_size": 32, "bits": 8}, "lm_head": False},
    "quantization_config": {"group_size": 64, "bits": 4},
}))
put("config", "seed-gpt-oss-mxfp4", json.dumps({
    "model_type": "gpt_oss", "num_hidden_layers": 2, "vocab_size": 201088,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096},
    "quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4",
                     "model.layers.0.mlp.router": {"group_size": 64, "bits": 8}, "lm_head": True},
}))
put("config", "seed-gemma3-text-config", json.dumps({
    "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 2, "vocab_size": 262208,
                    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                    "sliding_window": 512, "max_position_embeddings": 131072},
    "vision_config": {"hidden_size": 32}, "eos_token_id": [1, 106],
}))
put("config", "seed-rope-parameters", json.dumps({
    "model_type": "qwen3_5_text", "num_hidden_layers": 4, "vocab_size": 1000,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4"},
}))
put("config", "seed-dynamic", json.dumps({
    "model_type": "minicpm", "num_hidden_layers": 1, "vocab_size": 10,
    "rope_scaling": {"type": "dynamic", "factor": 2.0}, "quantization": {"mode": "mxfp8"},
}))
put("config", "seed-quant-block", json.dumps(
    {"group_size": 128, "bits": 3, "model.layers.1.mlp": {"mode": "mxfp4"}, "quant_method": "mlx"}))

# ---- chat templates ------------------------------------------------------------------------
# The whole input is the template (its length picks the options). Real templates are not copied
# here: scripts/fuzz-smoke.sh adds the test assets' 71 (scripts/fetch-test-assets.sh --templates)
# as a second seed directory. These are written for the corpus, in the common shapes.
put("chat_template", "seed-chatml-tools", """{%- if tools %}<|im_start|>system
{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}
# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{%- endif %}
{%- for message in messages %}
  {%- if message.role == 'assistant' and message.tool_calls is defined %}
<|im_start|>assistant
{%- if message.reasoning_content %}<think>{{ message.reasoning_content | trim }}</think>{% endif %}
{{ message.content }}
    {%- for call in message.tool_calls %}
<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>
    {%- endfor %}<|im_end|>
  {%- elif message.role == 'tool' %}
<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
  {%- else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{%- if enable_thinking is defined and not enable_thinking %}<think>

</think>{% endif %}
{%- endif %}""")
put("chat_template", "seed-header-ids", """{{- bos_token }}
{%- set date_string = strftime_now("%d %b %Y") if date_string is not defined else date_string %}
{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}
{%- else %}{%- set system_message = "" %}{%- endif %}
<|start_header_id|>system<|end_header_id|>\n\nToday Date: {{ date_string }}\n{{ system_message }}<|eot_id|>
{%- for message in messages %}
{%- if message.role in ['ipython', 'tool'] %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ message.content | tojson if message.content is mapping else message.content }}<|eot_id|>
{%- elif 'tool_calls' in message %}<|start_header_id|>assistant<|end_header_id|>\n\n{{- '{"name": "' + message.tool_calls[0].function.name + '", "parameters": ' + message.tool_calls[0].function.arguments | tojson + '}' }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>
{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}""")
put("chat_template", "seed-inst", """{%- set ns = namespace(system='', turns=0) %}
{%- for m in messages %}{% if m.role == 'system' %}{% set ns.system = m.content %}{% endif %}{% endfor %}
{{- bos_token }}
{%- for m in messages | rejectattr('role', 'equalto', 'system') %}
  {%- if m.role == 'user' %}{% set ns.turns = ns.turns + 1 %}[INST] {% if loop.last and ns.system %}{{ ns.system }}\n\n{% endif %}{{ m.content }}[/INST]
  {%- elif m.role == 'assistant' %}
    {%- if m.tool_calls is defined %}[TOOL_CALLS]{{ m.tool_calls | map(attribute='function') | list | tojson }}
    {%- else %} {{ m.content }}{{ eos_token }}{% endif %}
  {%- elif m.role == 'tool' %}[TOOL_RESULTS]{"call_id": {{ m.tool_call_id | tojson }}, "content": {{ m.content | tojson }}}[/TOOL_RESULTS]
  {%- else %}{{ raise_exception('Only user, assistant and tool roles are supported, got ' ~ m.role) }}{% endif %}
{%- endfor %}""")
put("chat_template", "seed-turns-macro", """{%- macro render(content) -%}
{%- if content is string %}{{ content | trim }}{% else %}{% for part in content %}{{ part.text }}{% endfor %}{% endif -%}
{%- endmacro -%}
{{ bos_token }}{% for message in messages %}{% if loop.index0 > 0 and (message['role'] == 'user') == (messages[loop.index0 - 1]['role'] == 'user') and message.role != 'tool' %}{% endif %}
<start_of_turn>{{ 'model' if message.role == 'assistant' else message.role }}
{{ render(message.content) }}{% if message.tool_calls %}{% for c in message.tool_calls %}```tool_code\n{{ c.function.name }}(**{{ c.function.arguments }})\n```{% endfor %}{% endif %}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}{{ messages | length }} {{ (messages | last).content[:5] }} {{ "%s-%d" | format("x", 3) }} {{ messages[0].keys() | list }}""")
put("chat_template", "seed-loops", "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}")
put("chat_template", "seed-recursion", "{% macro f(n) %}{{ f(n + 1) }}{{ f(n + 2) }}{% endmacro %}{{ f(0) }}")
put("chat_template", "seed-huge-string", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s * 2 %}{% endfor %}{{ ns.s }}{{ 'x' * 1000000 }}")
put("chat_template", "seed-filters", "{{ messages | map(attribute='role') | join(',') }}{{ messages[2].tool_calls[0].function.arguments | tojson(sort_keys=true, separators=[',', ':']) }}"
    "{{ strftime_now('%Y-%m-%d') }}{{ bos_token ~ eos_token }}{{ messages[0].content.split(' ') | list | length }}"
    "{% if reasoning_effort is defined %}{{ reasoning_effort | upper }}{% endif %}{{ raise_exception('done') if enable_thinking is sameas false }}"
    "{{ messages[4] | string }}{{ (messages | selectattr('role', 'equalto', 'tool') | first).content | trim }}"
    "{% generation %}{{ messages[1].content | tojson(indent=2, ensure_ascii=true) }}{% endgeneration %}")

# ---- server request bodies -----------------------------------------------------------------
# First byte: which endpoint (0 chat/completions, 1 completions, 2 responses, 3 messages).
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
put("serve_request", "seed-chat", b"\x00" + json.dumps({
    "model": "m", "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}],
    "tools": tools, "tool_choice": "auto", "temperature": 0.7, "top_p": 0.9, "max_tokens": 64,
    "stream": True, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2,
    "stop": ["\n\n"], "seed": 7, "response_format": {"type": "json_object"},
}).encode())
put("serve_request", "seed-chat-schema", b"\x00" + json.dumps({
    "model": "m", "messages": [{"role": "user", "content": "JSON please"}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
        {"type": "object", "properties": {"a": {"type": "integer"}}}}},
    "max_completion_tokens": 10, "frequency_penalty": 0.5, "presence_penalty": 0.1,
    "reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False},
}).encode())
put("serve_request", "seed-completions", b"\x01" + json.dumps({
    "model": "m", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "logprobs": 3,
    "echo": False, "stop": "The end", "stream": False, "n": 1,
}).encode())
put("serve_request", "seed-responses", b"\x02" + json.dumps({
    "model": "m", "instructions": "Be terse.",
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
              {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
              {"type": "function_call_output", "call_id": "c1", "output": "cold"},
              {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]}],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    "max_output_tokens": 32, "stream": True, "text": {"format": {"type": "text"}},
    "reasoning": {"effort": "medium"}, "top_logprobs": 1, "include": ["message.output_text.logprobs"],
}).encode())
put("serve_request", "seed-responses-string", b"\x02" + json.dumps({"model": "m", "input": "Hi"}).encode())
put("serve_request", "seed-messages", b"\x03" + json.dumps({
    "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be terse."}],
    "messages": [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "use tool", "signature": "x"},
                                          {"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": [{"type": "text", "text": "hot"}]}]}],
    "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"}, "stop_sequences": ["END"], "temperature": 1.0, "top_k": 40,
    "thinking": {"type": "enabled", "budget_tokens": 1024}, "stream": True,
}).encode())
print("seeds written under", CORPUS)
