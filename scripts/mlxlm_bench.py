"""mlx-lm's side of a side-by-side benchmark: mlx-lm's own decode loop (generate_step) on one
model, printing one JSON line per run with the same keys as `mlex bench --json`.

  python scripts/mlxlm_bench.py --model DIR
  python scripts/mlxlm_bench.py --shape qwen3-0.6b --bits 4 [--dtype bf16|f32]
  options: --prompt-len 512 --gen 256 --runs 3
           --max-kv-size N --kv-bits B --kv-group-size G --quantized-kv-start N   (generate_step's KV cache options)
  python scripts/mlxlm_bench.py --shape qwen3-0.6b --bits 4 --graph   # ops of one decode step

Shapes are the same configs as `mlex bench --shape` (src/bench.rs)."""
import argparse
import importlib
import json
import time

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step

SHAPES = {
    "qwen3-0.6b": dict(model_type="qwen3", hidden_size=1024, num_hidden_layers=28, intermediate_size=3072,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       vocab_size=151936, max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=True),
    "llama-3.2-3b": dict(model_type="llama", hidden_size=3072, num_hidden_layers=28, intermediate_size=8192,
                         num_attention_heads=24, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
                         vocab_size=128256, max_position_embeddings=131072, rope_theta=5e5, tie_word_embeddings=True),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, intermediate_size=18944,
                       num_attention_heads=28, num_key_value_heads=4, rms_norm_eps=1e-6, vocab_size=152064,
                       max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=False),
    "smollm2-135m": dict(model_type="llama", hidden_size=576, num_hidden_layers=30, intermediate_size=1536,
                         num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, vocab_size=49152,
                         max_position_embeddings=8192, rope_theta=1e5, tie_word_embeddings=True),
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, intermediate_size=6144,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6,
                          vocab_size=151936, max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=False,
                          num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
                          moe_intermediate_size=768, norm_topk_prob=True),
    "gemma3-1b": dict(model_type="gemma3_text", hidden_size=1152, num_hidden_layers=26, intermediate_size=6912,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6,
                      vocab_size=262144, max_position_embeddings=32768, rope_theta=1e6, rope_local_base_freq=10000.0,
                      sliding_window=512, sliding_window_pattern=6, query_pre_attn_scalar=256, rope_scaling=None),
    "qwen3.5-0.8b": dict(model_type="qwen3_5", hidden_size=1024, num_hidden_layers=24, intermediate_size=3584,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=256, rms_norm_eps=1e-6,
                         vocab_size=248320, max_position_embeddings=262144, linear_num_value_heads=16,
                         linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                         linear_conv_kernel_dim=4, full_attention_interval=4, tie_word_embeddings=True,
                         rope_parameters={"type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}),
    "qwen3.5-2b": dict(model_type="qwen3_5", hidden_size=2048, num_hidden_layers=24, intermediate_size=6144,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=256, rms_norm_eps=1e-6,
                       vocab_size=248320, max_position_embeddings=262144, linear_num_value_heads=16,
                       linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                       linear_conv_kernel_dim=4, full_attention_interval=4, tie_word_embeddings=True,
                       rope_parameters={"type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}),
    "qwen3.5-moe-small": dict(model_type="qwen3_5_moe", hidden_size=2048, num_hidden_layers=16,
                              intermediate_size=6144, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                              rms_norm_eps=1e-6, vocab_size=248320, max_position_embeddings=262144,
                              linear_num_value_heads=32, linear_num_key_heads=16, linear_key_head_dim=128,
                              linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
                              tie_word_embeddings=False, num_experts=64, num_experts_per_tok=8,
                              decoder_sparse_step=1, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                              norm_topk_prob=True,
                              rope_parameters={"type": "default", "rope_theta": 10000000,
                                               "partial_rotary_factor": 0.25}),
}


def build(a):
    if a.model:
        # load_model: the weights only (no tokenizer, so no transformers needed).
        from pathlib import Path
        from mlx_lm.utils import load_model
        model, _ = load_model(Path(a.model))
        return model, model.args.vocab_size
    cfg = SHAPES[a.shape]
    mod = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    model = mod.Model(mod.ModelArgs.from_dict(cfg))
    model.set_dtype(mx.bfloat16 if a.dtype == "bf16" else mx.float32)
    if a.bits:
        nn.quantize(model, group_size=a.group_size, bits=a.bits)
    mx.eval(model.parameters())
    return model, cfg["vocab_size"]


def decode_step_census(model):
    """The MLX operations one decode step builds (model forward only), by primitive, as
    `mlex bench --graph` counts them: export the lazy graph to dot and count its operation nodes."""
    import io
    import re
    from collections import Counter
    from mlx_lm.models.cache import make_prompt_cache
    cache = make_prompt_cache(model)
    model(mx.array([[1, 2, 3, 4, 5, 6, 7, 8]]), cache=cache)
    mx.eval([c.keys for c in cache] + [c.values for c in cache])
    logits = model(mx.array([[9]]), cache=cache)
    dot = io.StringIO()
    mx.export_to_dot(dot, [logits] + [c.keys for c in cache] + [c.values for c in cache])
    counts = Counter(re.findall(r'\[label ="([^"]+)", shape=rectangle\]', dot.getvalue()))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def run_concurrent(a, model, vocab):
    """`--concurrency N`: N requests at once through mlx-lm's continuous batching (BatchGenerator),
    each its own random prompt, with the keys `mlex bench --concurrency` prints: the aggregate
    generated tok/s over the wall time, each stream's decode tok/s (median), TTFT p50/p95."""
    from mlx_lm.generate import BatchGenerator
    n = a.concurrency
    pct = lambda v, q: sorted(v)[round((len(v) - 1) * q)]
    for run in range(-1, a.runs):  # run -1: untimed warm-up at the measured shape
        mx.random.seed(1 + run)
        prompts = [mx.random.randint(0, vocab, (a.prompt_len,)).tolist() for _ in range(n)]
        gen = BatchGenerator(model, stop_tokens=[], completion_batch_size=max(32, n), prefill_batch_size=min(8, n))
        t0 = time.perf_counter()
        uids = gen.insert(prompts, [a.gen if run >= 0 else 4] * n)
        first, last, count = {}, {}, {u: 0 for u in uids}
        while responses := gen.next_generated():
            now = time.perf_counter()
            for r in responses:
                first.setdefault(r.uid, now)
                last[r.uid] = now
                count[r.uid] += 1
        wall = time.perf_counter() - t0
        gen.close()
        if run < 0:
            continue
        ttft = [(first[u] - t0) * 1e3 for u in uids]
        per_stream = [(count[u] - 1) / (last[u] - first[u]) for u in uids if count[u] > 1 and last[u] > first[u]]
        print(json.dumps({
            "engine": "mlx-lm", "model": a.model or a.shape, "bits": a.bits, "run": run, "concurrency": n,
            "prompt_tokens": a.prompt_len, "gen_tokens": a.gen,
            "aggregate_tok_s": round(sum(count.values()) / wall, 1),
            "per_stream_decode_tok_s": round(pct(per_stream, 0.5), 1) if per_stream else 0.0,
            "ttft_p50_ms": round(pct(ttft, 0.5), 1), "ttft_p95_ms": round(pct(ttft, 0.95), 1), "wall_s": round(wall, 1),
            "device": str(mx.default_device()),
        }), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--shape", default="qwen3-0.6b")
    p.add_argument("--bits", type=int, default=0)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--new-lengths", action="store_true",
                   help="run r's prompt is --prompt-len + 1 + r tokens: a length the process has not seen")
    p.add_argument("--graph", action="store_true", help="print the ops of one decode step instead of timing")
    p.add_argument("--concurrency", type=int, help="N requests at once through mlx-lm's BatchGenerator")
    p.add_argument("--max-kv-size", type=int)
    p.add_argument("--kv-bits", type=int)
    p.add_argument("--kv-group-size", type=int, default=64)
    p.add_argument("--quantized-kv-start", type=int, default=5000)
    a = p.parse_args()
    kv = dict(max_kv_size=a.max_kv_size, kv_bits=a.kv_bits, kv_group_size=a.kv_group_size,
              quantized_kv_start=a.quantized_kv_start)
    if a.graph:
        model, _ = build(a)
        census = decode_step_census(model)
        print(json.dumps({"engine": "mlx-lm", "model": a.model or a.shape, "bits": a.bits,
                          "ops": sum(c for _, c in census), "by_primitive": census}))
        return
    t0 = time.perf_counter()
    model, vocab = build(a)
    load_s = time.perf_counter() - t0
    if a.concurrency:
        return run_concurrent(a, model, vocab)
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    mx.random.seed(0)
    prompt = mx.random.randint(0, vocab, (a.prompt_len,))
    for _ in generate_step(prompt, model, max_tokens=4):  # warm-up at the measured shape
        pass
    for run in range(a.runs):
        if a.new_lengths:
            prompt = mx.random.randint(0, vocab, (a.prompt_len + 1 + run,))
        mx.clear_cache()
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        t1 = None
        n = 0
        for _tok, _lp in generate_step(prompt, model, max_tokens=a.gen, **kv):
            if t1 is None:
                t1 = time.perf_counter()
            n += 1
        t2 = time.perf_counter()
        print(json.dumps({
            "engine": "mlx-lm", "model": a.model or a.shape, "bits": a.bits, "run": run,
            "prompt_tokens": prompt.size, "gen_tokens": n, "max_kv_size": a.max_kv_size, "kv_bits": a.kv_bits,
            "prefill_tok_s": round(prompt.size / (t1 - t0), 1), "ttft_ms": round((t1 - t0) * 1e3, 2),
            "decode_tok_s": round((n - 1) / (t2 - t1), 2) if n > 1 else 0.0,
            "weights_gib": round(weights / 2**30, 3), "peak_gib": round(mx.get_peak_memory() / 2**30, 3),
            "device": str(mx.default_device()), "load_s": round(load_s, 3),
        }), flush=True)


if __name__ == "__main__":
    main()
