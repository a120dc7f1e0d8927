"""deepseek_v3 / deepseek_v2 conformance cases (mlx-lm `models/deepseek_v3.py`, `deepseek_v2.py`).

Multi-head latent attention (MLA): q through a low-rank `q_a_proj` → `q_a_layernorm` → `q_b_proj`
(or one `q_proj` when `q_lora_rank` is null), keys/values from a shared `kv_lora_rank` latent plus
one rotary key of `qk_rope_head_dim` shared by all heads. deepseek_v3 keeps the latent in its cache
and stores the per-head up-projections as `embed_q` / `unembed_out` (mlx-lm's sanitize splits
`kv_b_proj` into them): the prompt expands the latent into keys/values, a decode step absorbs
`embed_q` into the query instead. deepseek_v2 expands through `kv_b_proj` every step. Yarn rope
(traditional layout) with `mscale` != `mscale_all_dim`, so both the rope's input scale and the
softmax scale's mscale correction matter.

MoE: layer 0 dense (`first_k_dense_replace` 1), layers 1-2 with 8 routed experts, 2 per token,
plus one shared expert. deepseek_v3 routes with `noaux_tc` (sigmoid scores,
`e_score_correction_bias` for the choice only, 4 groups scored by their top-2 sum of which
`topk_group` 2 are kept, normalised top-k, `routed_scaling_factor`); deepseek_v2 with softmax
scores, `group_limited_greedy` (2 groups scored by their best expert, 1 kept, so the limit binds)
or `greedy`. The router weights and the correction bias are drawn here (mlx-lm initialises both
to zeros: every expert would tie) with a spread that keeps the choices clear.

`q_lora_rank: null` must reach mlx-lm as None (its default for an absent field is 1536): cases
with null fields set make_fixtures' `keep_nulls`. The `hf_layout` cases are rewritten into the
Hugging Face layout by `after_save`.
"""
import json

import mlx.core as mx

import make_fixtures as mf

HIDDEN = 64
# Router logits' std (the normed hidden state has unit RMS) and the correction bias' std.
GATE_STD = 2.5
BIAS_STD = 0.3


def config(model_type: str = "deepseek_v3", **overrides) -> dict:
    cfg = {
        "model_type": model_type,
        "architectures": ["DeepseekV3ForCausalLM" if model_type == "deepseek_v3" else "DeepseekV2ForCausalLM"],
        "vocab_size": mf.VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "moe_intermediate_size": HIDDEN,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 8,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 32,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        # 64 wide, so embed_q (input qk_nope_head_dim) is quantized at group size 64 too.
        "qk_nope_head_dim": 64,
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 2,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        },
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }
    if model_type == "deepseek_v3":
        cfg.update({"topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True})
    else:
        # Groups scored by their best expert: with 2 picks from the top 2 of 4 groups the limit
        # could never bind; 2 groups of 4 with only the best one kept makes it bind often.
        cfg.update({"topk_method": "group_limited_greedy", "routed_scaling_factor": 2.0, "n_group": 2, "topk_group": 1})
    cfg.update(overrides)
    return cfg


def cases() -> list[dict]:
    v2_lite = config(
        "deepseek_v2",
        q_lora_rank=None,
        topk_method="greedy",
        routed_scaling_factor=1.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    )
    # One q_proj instead of the q LoRA; no groups (n_group 1); a dense layer every other layer
    # (moe_layer_freq 2: layer 1 dense, layer 2 MoE); no shared expert (the field left out, as
    # transformers' config class rejects a null there).
    qproj = config(q_lora_rank=None, n_group=1, topk_group=1, moe_layer_freq=2, num_experts_per_tok=3)
    del qproj["n_shared_experts"]
    out = [
        {"name": "deepseek_v3_f32", "config": config(), "variant": "f32"},
        # MLX's CPU gather_mm (dense experts) runs in float32 only, so mlx-lm cannot run a bf16
        # MoE on the CPU: the bf16 case is dense (no routed experts; 2 layers, which give varied
        # tokens without near-ties), bf16 experts are covered quantized (q4g64, nvfp4: bf16
        # activations and scales).
        {"name": "deepseek_v3_bf16", "config": config(n_routed_experts=None, num_hidden_layers=2), "variant": "bf16"},
        {"name": "deepseek_v3_q4g64", "config": config(), "variant": "q4g64"},
        {"name": "deepseek_v3_nvfp4", "config": config(), "variant": "nvfp4"},
        {"name": "deepseek_v3_mxfp8", "config": config(), "variant": "mxfp8"},
        # Prefill in chunks of 16: the prompt path (latent expanded) runs against a cached prefix.
        {"name": "deepseek_v3_long_f32", "config": config(), "variant": "f32",
         "prompt_len": 40, "prefill_step_size": 16},
        {"name": "deepseek_v3_qproj_f32", "config": qproj, "variant": "f32"},
        # Hugging Face layout (kv_b_proj, per-expert tensors, inv_freq, an MTP layer): what
        # mlx-lm's sanitize converts at load, kv_b_proj dense here and 4-bit below (dequantized,
        # split and re-quantized by the sanitize).
        {"name": "deepseek_v3_hf_f32", "config": config(), "variant": "f32", "hf_layout": True},
        {"name": "deepseek_v3_hf_q4g64", "config": config(), "variant": "q4g64", "hf_layout": True,
         "kv_b_quant": (32, 4)},
        {"name": "deepseek_v2_f32", "config": config("deepseek_v2"), "variant": "f32"},
        {"name": "deepseek_v2_lite_f32", "config": v2_lite, "variant": "f32"},
    ]
    for c in out:
        if any(v is None for v in c["config"].values()):
            c["keep_nulls"] = True  # built with the field None and written as `null`
    return out


def peaky(path, p, prof, key):
    """Router weights and correction bias drawn (mlx-lm's init is zeros); q and the per-head key
    projections sharpened like q_proj/k_proj in the shared profile (MLA has neither name)."""
    if path.endswith("mlp.gate.weight"):
        return mx.random.normal(p.shape, key=key) * (GATE_STD / HIDDEN ** 0.5)
    if path.endswith("mlp.gate.e_score_correction_bias"):
        return mx.random.normal(p.shape, key=key) * BIAS_STD
    if path.endswith(("q_b_proj.weight", "embed_q.weight", "kv_a_proj_with_mqa.weight")):
        return p * prof["qk"]
    return None


def _hf_layout(out, kv_b_quant):
    """Rewrites the checkpoint mlx-lm saved in `out` into the Hugging Face layout its sanitize
    converts from: one `kv_b_proj` per layer (`[H·(nope + v), kv_lora_rank]`, rebuilt from
    `embed_q` / `unembed_out`, affine-quantized with `kv_b_quant` = (group, bits) when given),
    one tensor per expert (`mlp.experts.{e}.*` instead of the stacked `switch_mlp`), plus the
    tensors mlx-lm drops (`rotary_emb.inv_freq`, DeepSeek-V3's multi-token-prediction layer 61).
    The oracle then runs mlx-lm on these files, sanitize included."""
    cfg = json.loads((out / "config.json").read_text())
    quant = cfg.get("quantization") or {}
    r = cfg["kv_lora_rank"]
    path = out / "model.safetensors"
    w = mx.load(str(path))

    def dense(prefix):
        if prefix + ".scales" not in w:
            return w[prefix + ".weight"]
        q = quant.get(prefix) if isinstance(quant.get(prefix), dict) else quant
        wt, sc = w[prefix + ".weight"], w[prefix + ".scales"]
        gs = wt.shape[-1] * 32 // q["bits"] // sc.shape[-1]
        return mx.dequantize(wt, sc, w.get(prefix + ".biases"), group_size=gs, bits=q["bits"],
                             mode=q.get("mode", "affine"))

    new = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn"
        wk, wv = dense(p + ".embed_q"), dense(p + ".unembed_out")  # [H, R, nope], [H, v, R]
        kv_b = mx.concatenate([wk.swapaxes(-1, -2), wv], axis=1).reshape(-1, r)
        if kv_b_quant:
            names = ("weight", "scales", "biases")
            new.update({f"{p}.kv_b_proj.{n}": a for n, a in zip(names, mx.quantize(kv_b, *kv_b_quant))})
        else:
            new[f"{p}.kv_b_proj.weight"] = kv_b
        new[f"{p}.rotary_emb.inv_freq"] = mx.ones((cfg["qk_rope_head_dim"] // 2,))
    for k, a in w.items():
        if ".embed_q." in k or ".unembed_out." in k:
            continue
        if ".switch_mlp." in k:
            pre, rest = k.split(".switch_mlp.")
            new.update({f"{pre}.experts.{e}.{rest}": a[e] for e in range(a.shape[0])})
        else:
            new[k] = a
    new["model.layers.61.self_attn.o_proj.weight"] = mx.zeros((4, 4))
    mx.save_safetensors(str(path), new, metadata={"format": "mlx"})


def after_save(case, out):
    """`"hf_layout": True` (optional `"kv_b_quant": (group, bits)`): the saved checkpoint is
    rewritten into the Hugging Face layout before the oracle runs."""
    if case.get("hf_layout"):
        _hf_layout(out, case.get("kv_b_quant"))
