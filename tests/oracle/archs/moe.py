"""Oracle cases of the llama-family mixtures of experts: qwen3_moe, qwen2_moe, mixtral.

Routers are scaled up so each token's expert choice has clear margins (a near-tie in routing
would flip an expert, not just a token). mlx-lm's own quant_predicate for qwen3_moe keeps the
router 8-bit affine (an override without a mode): the mxfp4 case checks exactly that layout.
"""
import make_fixtures as mf


def _common():
    return {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": mf.VOCAB_SIZE,
        "max_position_embeddings": 256,
        "bos_token_id": mf.ENDOFTEXT_ID,
        "eos_token_id": mf.IM_END_ID,
        "tie_word_embeddings": False,
    }


def qwen3_moe(**over):
    return {
        **_common(),
        "model_type": "qwen3_moe",
        "num_hidden_layers": 3,
        "intermediate_size": 128,
        "head_dim": 32,
        "rope_theta": 1000000.0,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],  # one dense layer between sparse ones
        "moe_intermediate_size": 64,  # a multiple of every group size: all experts quantize
        "norm_topk_prob": True,
        **over,
    }


def qwen2_moe(**over):
    return {
        **_common(),
        "model_type": "qwen2_moe",
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "rope_theta": 1000000.0,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,  # a multiple of every group size: all experts quantize
        "shared_expert_intermediate_size": 64,
        **over,
    }


def mixtral(**over):
    return {
        **_common(),
        "model_type": "mixtral",
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "rope_theta": 1000000.0,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        **over,
    }


def cases():
    out = []
    # No dense bf16 cases: MLX's CPU gather_mm (dense experts) runs in float32 only; bf16 activations
    # are covered by the quantized cases (gather_qmm).
    for variant in ("f32", "q4g64", "mxfp4", "mxfp8", "nvfp4"):
        out.append({"name": f"qwen3_moe_{variant}", "config": qwen3_moe(), "variant": variant})
    # 70 prompt tokens in chunks of 32: 32 tokens x 2 experts = 64 pairs take the sorted path.
    out.append({"name": "qwen3_moe_long_f32", "config": qwen3_moe(), "variant": "f32",
                "prompt_len": 70, "prefill_step_size": 32})
    out.append({"name": "qwen3_moe_unnormed_f32", "config": qwen3_moe(norm_topk_prob=False), "variant": "f32"})
    for variant in ("f32", "q4g64", "mxfp4"):
        out.append({"name": f"qwen2_moe_{variant}", "config": qwen2_moe(), "variant": variant})
    for variant in ("f32", "q4g64", "nvfp4"):
        out.append({"name": f"mixtral_{variant}", "config": mixtral(), "variant": variant})
    out.append({"name": "mixtral_long_f32", "config": mixtral(), "variant": "f32",
                "prompt_len": 70, "prefill_step_size": 32})
    return out


def peaky(path, p, prof, key):
    if path.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
        return p * 4.0
    return None
