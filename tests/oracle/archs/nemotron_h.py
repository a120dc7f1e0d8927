"""nemotron_h conformance cases (mlx-lm `models/nemotron_h.py`, with `ssm.py`'s `ssm_attn`).

A hybrid stack whose `hybrid_override_pattern` picks each layer's kind: `M` a Mamba2 mixer
(in_proj split into gate / conv input / dt, a depthwise causal conv1d whose last `conv_kernel - 1`
inputs are carried in the cache, softplus(dt + dt_bias), A = -exp(A_log), the chunked SSD scan with
groups of B/C shared by several heads, the D skip, a gated RMSNorm per group, out_proj), `*`
attention without rope, `-` a relu² MLP, `E` a mixture of experts (sigmoid router with
`e_score_correction_bias` for the choice, optional expert groups, relu² experts, a shared expert,
optionally a latent projection around the experts).

The long case prefills 300 tokens in chunks of 64: the conv window and the SSM state must carry
over every chunk border; the one-call case prefills them at once (the scan's chunks of 256). The router weights and correction bias are drawn here (mlx-lm
initialises both to zeros: every expert would tie); dt_bias and D are jittered around mlx-lm's
init of ones so that swapping or dropping them cannot pass.
"""
import mlx.core as mx

import make_fixtures as mf

HIDDEN = 64
GATE_STD = 2.5
BIAS_STD = 0.3


def config(**overrides) -> dict:
    cfg = {
        "model_type": "nemotron_h",
        "architectures": ["NemotronHForCausalLM"],
        "vocab_size": mf.VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "max_position_embeddings": 4096,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attention_bias": False,
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "mamba_proj_bias": False,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 2,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
        "hybrid_override_pattern": "M-M*M-",
        "num_hidden_layers": 6,
        "tie_word_embeddings": False,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
    }
    cfg.update(overrides)
    return cfg


def moe_config(**overrides) -> dict:
    cfg = config(
        hybrid_override_pattern="ME*ME",
        num_hidden_layers=5,
        moe_intermediate_size=64,
        moe_shared_expert_intermediate_size=64,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    )
    cfg.update(overrides)
    return cfg


def cases() -> list[dict]:
    # Four groups of two experts, two kept; a latent projection (32 wide) around the experts;
    # a time step limit that binds from below now and then.
    grouped = moe_config(n_group=4, topk_group=2, moe_latent_size=32, time_step_limit=[0.05, 100.0])
    return [
        {"name": "nemotron_h_f32", "config": config(), "variant": "f32"},
        {"name": "nemotron_h_bf16", "config": config(), "variant": "bf16"},
        {"name": "nemotron_h_q4g64", "config": config(), "variant": "q4g64"},
        {"name": "nemotron_h_long_f32", "config": config(), "variant": "f32",
         "prompt_len": 300, "prefill_step_size": 64},
        # The same 300 tokens in one call: the scan's own chunks of 256 carry the state.
        {"name": "nemotron_h_long_onecall_f32", "config": config(), "variant": "f32", "prompt_len": 300},
        {"name": "nemotron_h_moe_f32", "config": moe_config(), "variant": "f32"},
        {"name": "nemotron_h_moe_q4g64", "config": moe_config(), "variant": "q4g64"},
        {"name": "nemotron_h_moe_grouped_f32", "config": grouped, "variant": "f32"},
    ]


def peaky(path, p, prof, key):
    """Router weights and correction bias drawn; dt_bias and D jittered; the mixers' out_proj
    scaled like o_proj (the residual gain)."""
    if path.endswith("mixer.gate.weight"):
        return mx.random.normal(p.shape, key=key) * (GATE_STD / HIDDEN ** 0.5)
    if path.endswith("mixer.gate.e_score_correction_bias"):
        return mx.random.normal(p.shape, key=key) * BIAS_STD
    if path.endswith(("mixer.dt_bias", "mixer.D")):
        return 1.0 + 0.5 * mx.random.normal(p.shape, key=key)
    if path.endswith("out_proj.weight"):
        return p * prof["resid"]
    return None
