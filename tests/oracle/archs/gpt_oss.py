"""gpt_oss conformance cases (mlx-lm `models/gpt_oss.py`): attention with biases on q/k/v/o and
learned per-head sinks, layers alternating between a sliding window (rotating cache) and full
attention, yarn rope, and a mixture of experts: a biased router, top-k of its logits then a
softmax over the picked ones, experts with biases and the clamped SwiGLU (alpha 1.702, limit 7).

Weights the shared rules do not cover are set here (`peaky`): the router gets decisive margins
(so a rounding difference cannot flip an expert choice), sinks and expert biases get non-zero
values (an engine that drops them diverges), and the expert gate/up projections are scaled so
that the clamps at +-7 really cut (the down projection scaled back to keep the residual share).

Cases: f32, q4g64 (mlx-lm's quant_predicate keeps each router 8-bit affine: a per-module
override inside a 4-bit checkpoint), mxfp4 (the same 8-bit affine routers beside mxfp4 layers),
and a long-prompt case whose prefill (40 tokens, chunks of 16) crosses sliding windows of 8 and
chunk borders, with k=4 so each chunk has 64 token-expert pairs (mlx-lm's sorted-experts path).
"""
import make_fixtures as mf

HIDDEN = 64
# Gain of the expert gate/up projections (pre-activations of std ~4-5: the +-7 clamps cut), and
# the matching shrink of the down projection.
EXPERT_GAIN = 6.0


def config(**overrides) -> dict:
    cfg = {
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "hidden_size": HIDDEN,
        "num_hidden_layers": 4,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": mf.VOCAB_SIZE,
        "sliding_window": 16,
        "rope_theta": 150000,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }
    cfg.update(overrides)
    return cfg


def cases() -> list[dict]:
    return [
        # No dense bf16 case: MLX's CPU gather_mm (dense experts) runs in float32 only, so mlx-lm
        # cannot run one here; bf16 activations are covered by the quantized cases (gather_qmm).
        {"name": "gpt_oss_f32", "config": config(), "variant": "f32"},
        # Plain rope (no rope_scaling) in one case.
        {"name": "gpt_oss_q4g64", "config": config(rope_scaling=None), "variant": "q4g64"},
        {"name": "gpt_oss_mxfp4", "config": config(), "variant": "mxfp4"},
        # Prefill of 40 tokens in chunks of 16 over windows of 8; an explicit, non-default
        # layer_types pattern; 4 of 8 experts per token (16 x 4 = 64 pairs per chunk).
        {"name": "gpt_oss_long_f32", "variant": "f32", "prompt_len": 40, "prefill_step_size": 16,
         "config": config(
             sliding_window=8,
             num_experts_per_tok=4,
             layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
         )},
    ]


def peaky(path, p, prof, key):
    mx = mf.mx
    if path.endswith("mlp.router.weight"):
        # Router logits of std ~5 over the experts: clear gaps between the k-th and (k+1)-th.
        return p * (5.0 / mx.sqrt(mx.mean(p * p) * p.shape[-1]))
    if path.endswith("mlp.router.bias"):
        return mx.random.normal(p.shape, key=key)
    if path.endswith("self_attn.sinks"):
        return 0.5 + mx.random.normal(p.shape, key=key)
    if path.endswith(("experts.gate_proj.weight", "experts.up_proj.weight")):
        return p * EXPERT_GAIN
    if path.endswith("experts.down_proj.weight"):
        return p * (prof["resid"] / EXPERT_GAIN)
    if path.endswith(("experts.gate_proj.bias", "experts.up_proj.bias", "experts.down_proj.bias")):
        return 0.5 * mx.random.normal(p.shape, key=key)
    return None
