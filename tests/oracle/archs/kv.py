"""KV cache option cases: mlx-lm's generate-time `max_kv_size` (its RotatingKVCache with keep=4)
and `kv_bits` / `kv_group_size` / `quantized_kv_start` (its QuantizedKVCache and quantized
attention), each case's options passed to `generate_step` (the "generate" dict, recorded in
expected.json as "generate_options" for the conformance test to pass the same ones to mlex).

Rotating cases use qwen3 and qwen2: mlx-lm's llama module defines `make_cache` (for its sliding
layers), so `make_prompt_cache` ignores `max_kv_size` there. Quantized cases need a group size
that divides the head dimension: the models here are twice as wide as the core ones.
"""
import make_fixtures as mf


def config(arch: str, hidden: int = 64, **overrides) -> dict:
    cfg = mf.base_config(arch, False)
    cfg.update({"hidden_size": hidden, "intermediate_size": 2 * hidden})
    if arch == "qwen3":
        cfg["head_dim"] = hidden // 2
    elif arch == "llama":
        cfg["head_dim"] = hidden // 4
    cfg.update(overrides)
    return cfg


def cases() -> list[dict]:
    long = {"prompt_len": 40}
    return [
        # A 39-token first prefill chunk larger than the window, then decoding past it.
        {"name": "qwen3_maxkv16_f32", "config": config("qwen3"), "variant": "f32", **long,
         "generate": {"max_kv_size": 16}},
        # Prefill in chunks of 8: every chunk after the second trims the buffer to keep + window.
        {"name": "qwen3_maxkv16_chunked_f32", "config": config("qwen3"), "variant": "f32", **long,
         "prefill_step_size": 8, "generate": {"max_kv_size": 16}},
        # A short prompt: the buffer grows in place up to the window, then rotates while decoding.
        {"name": "qwen3_maxkv20_decode_f32", "config": config("qwen3"), "variant": "f32",
         "generate": {"max_kv_size": 20}},
        # Past the model's context length (32 < 40 + 32): a window within it lifts the limit.
        {"name": "qwen2_maxkv24_past_context_q8g32", "config": config("qwen2", max_position_embeddings=32),
         "variant": "q8g32", **long, "prefill_step_size": 16, "generate": {"max_kv_size": 24}},
        # 8-bit keys/values from the first forward pass on, group 64 (head_dim 64), GQA 4:2.
        {"name": "qwen3_kv8_f32", "config": config("qwen3", hidden=128), "variant": "f32",
         "generate": {"kv_bits": 8, "quantized_kv_start": 0}},
        # 4-bit, group 32, switching after the second prefill chunk (32 >= 20 tokens held): later
        # chunks attend through quantized matmuls with the causal mask.
        {"name": "qwen3_kv4_g32_start20_f32", "config": config("qwen3"), "variant": "f32", **long,
         "prefill_step_size": 16, "generate": {"kv_bits": 4, "kv_group_size": 32, "quantized_kv_start": 20}},
        # llama (head_dim 32), 4-bit, group 32, switching while decoding (12 + 8 tokens).
        {"name": "llama_kv4_g32_start20_f32", "config": config("llama", hidden=128), "variant": "f32",
         "generate": {"kv_bits": 4, "kv_group_size": 32, "quantized_kv_start": 20}},
        # Quantized weights (f32 scales) with an 8-bit cache, group 32.
        {"name": "qwen3_kv8_g32_q8g32", "config": config("qwen3"), "variant": "q8g32",
         "generate": {"kv_bits": 8, "kv_group_size": 32, "quantized_kv_start": 0}},
    ]
