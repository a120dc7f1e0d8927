"""gemma4 conformance cases (mlx-lm `models/gemma4_text.py`, and `models/gemma4.py` for the
multimodal wrapper).

Dense text models (6 layers: sliding, sliding, full, sliding, sliding, full; window 8): the last
two layers share the keys/values of layers 3 (sliding) and 2 (full) and have double-wide MLPs;
full layers have their own head size (32 against 16) and proportional rope rotating a quarter of
the head; plain-`w` q/k norms, a weightless v norm, softmax scale 1; per-layer inputs (P = 32);
a learned layer scalar; a final logit softcap of 10 (so that it bends the logits).

MoE text models: a dense MLP beside 8 experts (top 2) in every layer, the router with its own
norm scale and per-expert scales, K = V in the full layers (one global KV head), proportional
rope with factor 4 over half the head, no per-layer inputs, no KV sharing, an untied head.

`gemma4_text_defaults_f32` leaves layer_types, rope_parameters, softcap and double-wide MLPs to
mlx-lm's defaults. Prompts of 40 tokens prefilled in chunks of 16 (MoE: 70 in chunks of 32, so
32 tokens x 2 experts = 64 pairs take the sorted expert path) cross the window and the chunks.

`gemma4_*` cases nest the text model in `text_config` and carry vision/audio tensors, which
mlx-lm's sanitize drops and so must the engine: `gemma4_f32` in mlx-lm's own layout
(`language_model.model.*`), `gemma4_moe_hf_f32` in the Hugging Face layout
(`model.language_model.*`, experts as fused `gate_up_proj` / `down_proj` tensors) with MoE, K = V,
per-layer inputs and KV sharing together. `before_save` adds the towers and rewrites the layout
(files only; the oracle reloads them with its unmodified loader).

Gains (`peaky`): every branch is normed after, so norms set the gains: post-attention /
post-feedforward norms ~prof["resid"]·prof["head"] (layers outweigh the embedding, whose rows
have norm prof["head"]), post-per-layer-input norms ~prof["head"], q/k norms ~1 (scale 1 over
unit-RMS heads is sharp already); routers scaled up for clear expert margins; per-expert scales
and layer scalars drawn away from 1 so that an engine ignoring them fails.
"""
import mlx.core as mx

import make_fixtures as mf

S, F = "sliding_attention", "full_attention"
# Cases saved in the Hugging Face layout.
HF_LAYOUT = {"gemma4_moe_hf_f32"}


def text_config(**overrides) -> dict:
    cfg = {
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 6,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 32,
        "rms_norm_eps": 1e-6,
        "vocab_size": mf.VOCAB_SIZE,
        "vocab_size_per_layer_input": mf.VOCAB_SIZE,
        "hidden_size_per_layer_input": 32,
        "num_kv_shared_layers": 2,
        "sliding_window": 8,
        "layer_types": [S, S, F, S, S, F],
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
        },
        "use_double_wide_mlp": True,
        "final_logit_softcapping": 10.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }
    cfg.update(overrides)
    return cfg


def defaults_config() -> dict:
    cfg = text_config(sliding_window_pattern=3)
    for k in ("layer_types", "rope_parameters", "final_logit_softcapping", "use_double_wide_mlp"):
        del cfg[k]
    return cfg


def moe_config(**overrides) -> dict:
    cfg = text_config(
        intermediate_size=64,
        enable_moe_block=True,
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=64,
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        tie_word_embeddings=False,
        final_logit_softcapping=30.0,
        rope_parameters={
            "full_attention": {"partial_rotary_factor": 0.5, "factor": 4.0, "rope_theta": 1000000.0,
                               "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    )
    cfg.update(overrides)
    return cfg


def wrapper_config(text: dict) -> dict:
    text = dict(text)
    text.pop("architectures", None)
    return {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text,
        "vocab_size": mf.VOCAB_SIZE,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }


def cases() -> list[dict]:
    long = {"prompt_len": 40, "prefill_step_size": 16}
    long_moe = {"prompt_len": 70, "prefill_step_size": 32}
    out = [
        {"name": f"gemma4_text_{v}", "config": text_config(), "variant": v, **long}
        for v in ("f32", "bf16", "q4g64", "nvfp4")
    ]
    out.append({"name": "gemma4_text_defaults_f32", "config": defaults_config(), "variant": "f32"})
    # No dense bf16 MoE case: MLX's CPU gather_mm (dense experts) runs in float32 only.
    for v in ("f32", "q4g64", "mxfp8"):
        out.append({"name": f"gemma4_text_moe_{v}", "config": moe_config(), "variant": v, **long_moe})
    out.append({"name": "gemma4_f32", "config": wrapper_config(text_config()), "variant": "f32", **long})
    hf_text = moe_config(hidden_size_per_layer_input=32, num_kv_shared_layers=2, tie_word_embeddings=True)
    out.append({"name": "gemma4_moe_hf_f32", "config": wrapper_config(hf_text), "variant": "f32", **long_moe})
    return out


def peaky(path: str, p: mx.array, prof: dict, key: mx.array):
    jitter = mf.NORM_JITTER * mx.random.normal(p.shape, key=key)
    if path.endswith(("q_norm.weight", "k_norm.weight")):
        return 1.0 + jitter
    if path.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
        return prof["resid"] * prof["head"] * (1.0 + jitter)
    if path.endswith("post_per_layer_input_norm.weight"):
        return prof["head"] * (1.0 + jitter)
    if "norm" in path.rsplit(".", 2)[-2] and path.endswith(".weight"):
        return 1.0 + jitter
    if path.endswith(("embed_tokens.weight", "lm_head.weight")):
        return p * (prof["head"] / mx.sqrt(mx.mean(p * p) * p.shape[-1]))
    if path.endswith("router.proj.weight"):
        return p * 32.0
    if path.endswith("router.scale"):
        return 1.0 + jitter
    if path.endswith(("router.per_expert_scale", "layer_scalar")):
        return mx.random.uniform(0.6, 1.4, p.shape, key=key)
    # Projections: every branch is normed after, so their scale does not matter.
    return p


def _to_hf_layout(model) -> None:
    """mlx-lm's gemma4 wrapper as Hugging Face stores it: `model.language_model.*`, fused experts."""
    text = model["language_model"]
    inner = text["model"]
    for layer in inner["layers"]:
        if "experts" in layer:
            sg = layer["experts"]["switch_glu"]
            layer["experts"] = {
                "gate_up_proj": mx.concatenate([sg["gate_proj"]["weight"], sg["up_proj"]["weight"]], axis=-2),
                "down_proj": sg["down_proj"]["weight"],
            }
    assert "lm_head" not in text, "the Hugging Face layout case is tied"
    # Tensors mlx-lm's sanitize drops: clipping bounds, rotary tables, the k/v side of KV-shared
    # layers (Hugging Face checkpoints store them).
    layers = inner["layers"]
    layers[0]["self_attn"]["q_proj"]["input_max"] = mx.array(8.0)
    layers[0]["mlp"]["down_proj"]["output_min"] = mx.array(-8.0)
    layers[1]["self_attn"]["rotary_emb"] = {"inv_freq": mx.ones((8,))}
    first_shared = len(layers) - 2
    for layer in layers[first_shared:]:
        layer["self_attn"]["k_proj"] = {"weight": mx.zeros((32, 64))}
        layer["self_attn"]["v_proj"] = {"weight": mx.zeros((32, 64))}
        layer["self_attn"]["k_norm"] = {"weight": mx.ones((16,))}
    del model["language_model"]
    model["model"] = {
        "language_model": inner,
        "vision_tower": {"encoder": {"layers": [{"self_attn": {"q_proj": {"linear": {
            "weight": mx.zeros((8, 8)), "input_max": mx.ones(()), "input_min": -mx.ones(())}}}}]}},
        "audio_tower": {"conv": {"weight": mx.zeros((4, 4))}},
        "embed_vision": {"embedding_projection": {"weight": mx.zeros((64, 8))}},
        "embed_audio": {"embedding_projection": {"weight": mx.zeros((64, 4))}},
    }


def before_save(name: str, model) -> None:
    """What a real checkpoint of this case holds: the towers beside a wrapped text model."""
    if "language_model" not in model:
        return
    if name in HF_LAYOUT:
        _to_hf_layout(model)
        return
    model["vision_tower"] = {"patch_embedder": {"input_proj": {"weight": mx.zeros((8, 4))}}}
    model["audio_tower"] = {"conv": {"weight": mx.zeros((4, 4))}}
    model["embed_vision"] = {"embedding_projection": {"weight": mx.zeros((64, 8))}}
    model["multi_modal_projector"] = {"weight": mx.zeros((8, 4))}
