"""Oracle cases of the hybrid gated delta-net models: qwen3_next, qwen3_5, qwen3_5_moe (mlx-lm
`models/qwen3_next.py`, `models/qwen3_5.py`, `models/qwen3_5_moe.py`, `models/gated_delta.py`).

Four layers, full attention every `full_attention_interval` (2: layers 1 and 3; 4: layer 3 only),
the others gated delta-net linear attention with more value heads than key heads (q/k repeated),
a conv kernel of 4, partial rotary (a quarter of head_dim) and the attention output gate. MoE
cases keep one dense layer (qwen3_next `mlp_only_layers`) beside experts with a sigmoid-gated
shared expert. No dense bf16 MoE cases: MLX's CPU gather_mm runs in float32 only.

The `_long` cases prefill 300 tokens in chunks of 64: the conv window and the recurrent state
must carry over every chunk border. qwen3_5 cases nest the text model in `text_config` (weights
under `language_model.`) and carry a vision-tower tensor, which mlx-lm's sanitize drops and so
must the engine.

Gains (`peaky`): routers x4 (clear expert choices), the linear-attention output projection
scaled like o_proj so the recurrent layers weigh in the residual stream, and the nested
`language_model.lm_head` scaled as make_fixtures scales a top-level head.
"""
import mlx.core as mx

import make_fixtures as mf


def _text(**over):
    cfg = {
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "vocab_size": mf.VOCAB_SIZE,
        "max_position_embeddings": 1024,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "tie_word_embeddings": False,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }
    cfg.update(over)
    return cfg


def qwen3_next(moe=True, **over):
    cfg = _text(
        model_type="qwen3_next",
        rope_theta=10000.0,
        partial_rotary_factor=0.25,
        num_experts=8 if moe else 0,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        norm_topk_prob=True,
    )
    cfg.update(over)
    return cfg


def qwen3_5(moe=False, **over):
    # Key heads of 32 (qwen3_next keeps 16): the smallest our CUDA gated delta kernel takes, so
    # these cases run it on the GPU (tests/oracle/compare_on_device.py).
    text = _text(
        model_type="qwen3_5_moe_text" if moe else "qwen3_5_text",
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25},
    )
    if moe:
        text.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                    shared_expert_intermediate_size=64)
    text.update(over)
    return {
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "text_config": text,
        "vocab_size": mf.VOCAB_SIZE,
        "tie_word_embeddings": False,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }


LONG = {"prompt_len": 300, "prefill_step_size": 64, "max_tokens": 16}


def cases():
    out = []
    for variant in ("f32", "q4g64"):
        out.append({"name": f"qwen3_next_{variant}", "config": qwen3_next(), "variant": variant})
    out.append({"name": "qwen3_next_dense_bf16", "config": qwen3_next(moe=False), "variant": "bf16"})
    out.append({"name": "qwen3_next_long_f32", "config": qwen3_next(full_attention_interval=4), "variant": "f32", **LONG})
    for variant in ("f32", "bf16", "q4g64"):
        out.append({"name": f"qwen3_5_{variant}", "config": qwen3_5(), "variant": variant})
    out.append({"name": "qwen3_5_long_f32", "config": qwen3_5(), "variant": "f32", **LONG})
    for variant in ("f32", "q4g64"):
        out.append({"name": f"qwen3_5_moe_{variant}", "config": qwen3_5(moe=True), "variant": variant})
    out.append({"name": "qwen3_5_moe_long_f32", "config": qwen3_5(moe=True, full_attention_interval=4),
                "variant": "f32", **LONG})
    return out


def peaky(path, p, prof, key):
    if path.endswith("mlp.gate.weight"):
        return p * 4.0
    if path.endswith("linear_attn.out_proj.weight"):
        return p * prof["resid"]
    if path == "language_model.lm_head.weight":
        # make_fixtures scales a top-level `lm_head` only: the same rows of norm prof["head"].
        return p * (prof["head"] / mx.sqrt(mx.mean(p * p) * p.shape[-1]))
    return None


def before_save(name, model):
    """qwen3_5 checkpoints carry a vision tower: a tensor of it, which both engines must drop."""
    if name.startswith("qwen3_5"):
        model["vision_tower"] = {"blocks": {"norm": {"weight": mx.ones((8,))}}}
